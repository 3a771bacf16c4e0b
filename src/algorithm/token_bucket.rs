//! Token bucket: whole tokens and the time of the last credit, in one hash per key.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use super::{
    bucket::BucketQuota,
    rate::BucketRate,
    state::{Bucket, MemoryState},
    Algorithm, Rule,
};
use crate::{ConfigError, Error, Outcome, Quota};

/// Token bucket: capacity `quota.burst_size()` tokens, refilled at `quota.limit()` per
/// `quota.period()`; each request takes `cost` tokens. A key that was never seen, or rested long
/// enough, is a full bucket.
///
/// Tokens are credited whole, one per emission interval (`period / limit`, rounded up to a
/// microsecond), so decisions equal [`Gcra`](crate::Gcra)'s for the same quota.
///
/// ```
/// use tower_redis_ratelimit::{Quota, TokenBucket};
///
/// // Capacity 50, refilled at 100 a minute.
/// let bucket = TokenBucket::new(Quota::per_minute(100).burst(50))?;
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct TokenBucket(BucketQuota);

impl TokenBucket {
    /// Validates the quota (see [`ConfigError`] for the fields named).
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        BucketQuota::new(quota).map(Self)
    }

    /// The quota this was built from.
    pub fn quota_config(&self) -> Quota {
        self.0.quota
    }
}

/// In-memory twin of `lua/token_bucket.lua`. Returns the outcome, and the state to write with
/// its time to live when the check was allowed.
pub(crate) fn decide(
    rate: BucketRate,
    stored: Option<Bucket>,
    now: u64,
    cost: u64,
) -> (Outcome, Option<(Bucket, u64)>) {
    let BucketRate { emission_us, burst } = rate;
    let tolerance = rate.tolerance_us();
    let (mut tokens, mut ts) = match stored {
        Some(b) => (b.tokens.min(burst), b.ts),
        None => (burst, now),
    };
    let t_eff = now.max(ts);
    let elapsed = t_eff - ts;
    if elapsed >= tolerance {
        tokens = burst;
        ts = t_eff;
    } else {
        let add = elapsed / emission_us;
        tokens += add;
        if tokens >= burst {
            tokens = burst;
            ts = t_eff;
        } else {
            ts += add * emission_us;
        }
    }
    let wait_for = |tokens: u64, want: u64| {
        if tokens >= want {
            0
        } else {
            (want - tokens) * emission_us - (t_eff - ts) + (t_eff - now)
        }
    };
    if cost > burst || tokens < cost {
        let o = Outcome::single(
            false,
            tokens,
            (cost <= burst).then(|| wait_for(tokens, cost)),
            wait_for(tokens, burst),
        );
        return (o, None);
    }
    tokens -= cost;
    let full_in = wait_for(tokens, burst);
    let o = Outcome::single(true, tokens, Some(0), full_in);
    (o, Some((Bucket { tokens, ts }, full_in)))
}

impl Algorithm for TokenBucket {
    fn name(&self) -> &'static str {
        "token-bucket"
    }

    fn quota(&self) -> u64 {
        self.0.quota()
    }

    fn window(&self) -> Duration {
        self.0.window()
    }

    fn rule(&self) -> Rule<'_> {
        Rule::TokenBucket(self.0.rate)
    }

    fn decide(&self, state: &mut MemoryState, now_us: u64, cost: u32) -> Result<Outcome, Error> {
        let (outcome, write) = decide(self.0.rate, state.bucket()?, now_us, u64::from(cost));
        if let Some((bucket, ttl)) = write {
            state.put_bucket(bucket, now_us, ttl);
        }
        Ok(outcome)
    }

    fn local_share(&self, instances: NonZeroU32) -> Option<Arc<dyn Algorithm>> {
        Some(Arc::new(Self(self.0.divided(instances)?)))
    }

    fn with_quota(&self, quota: Quota) -> Result<Box<dyn Algorithm>, ConfigError> {
        Ok(Box::new(Self::new(quota)?))
    }
}
