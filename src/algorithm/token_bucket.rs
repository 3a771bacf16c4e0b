//! Token bucket: whole tokens and the time of the last credit, in one hash per key.

use std::time::Duration;

use redis::Script;

use super::{Algorithm, MemoryState};
use crate::{quota::BucketRate, ConfigError, Error, Outcome, Quota};

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
pub struct TokenBucket {
    quota: Quota,
    rate: BucketRate,
}

impl TokenBucket {
    /// Validates the quota (see [`ConfigError`] for the fields named).
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        Ok(Self {
            quota,
            rate: BucketRate::from_quota(&quota)?,
        })
    }

    /// The quota this was built from.
    pub fn quota_config(&self) -> Quota {
        self.quota
    }
}

/// Bucket state: whole tokens, and the time the last whole token was credited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub(crate) tokens: u64,
    pub(crate) ts: u64,
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
        self.rate.burst
    }

    fn window(&self) -> Duration {
        Duration::from_micros(self.rate.tolerance_us())
    }

    fn script(&self) -> &Script {
        lua_script!("token_bucket.lua")
    }

    fn batch_script(&self) -> Option<&'static Script> {
        lua_batch_script!("token_bucket.lua")
    }

    fn redis_keys(&self, base: &str) -> Vec<String> {
        vec![format!("{base}:b")]
    }

    fn script_args(&self, cost: u32) -> Vec<u64> {
        vec![self.rate.emission_us, self.rate.burst, u64::from(cost)]
    }

    fn local_share(&self, instances: std::num::NonZeroU32) -> Option<Self> {
        Self::new(super::divided(self.quota, instances)).ok()
    }

    fn check_in_memory(
        &self,
        state: &mut MemoryState,
        now_us: u64,
        cost: u32,
    ) -> Result<Outcome, Error> {
        let stored = state.get_mut::<Bucket>()?.copied();
        let (outcome, write) = decide(self.rate, stored, now_us, u64::from(cost));
        if let Some((bucket, ttl)) = write {
            state.put(bucket, now_us, ttl);
        }
        Ok(outcome)
    }
}
