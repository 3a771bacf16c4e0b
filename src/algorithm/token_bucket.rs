//! Token bucket: whole tokens and the time of the last credit, in one hash per key.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use super::{
    bucket::BucketQuota,
    held::{self, GivenBack, Ledger, Placed},
    outcome::{Outcome, Position},
    rate::BucketRate,
    settle::{bucket_charged, Change},
    state::{Bucket, MemoryState},
    Algorithm, Kind, Reset, Rule, Twin, NEVER,
};
use crate::{
    decision::Charge,
    error::{ConfigError, Error},
    quota::Quota,
    store::{Pace, Scheduled},
};

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
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the quota's field (`quota.limit`, `quota.period`,
    /// `quota.burst`) when the quota cannot be run exactly (see [`Quota`](crate::Quota)).
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        BucketQuota::new(quota).map(Self)
    }

    /// The quota this was built from.
    pub fn quota_config(&self) -> Quota {
        self.0.quota
    }

    /// The validated rate the stores run.
    pub(crate) fn rate(&self) -> BucketRate {
        self.0.rate
    }
}

impl Twin for TokenBucket {
    fn peek(&self, state: &mut MemoryState, now_us: u64) -> Result<Outcome, Error> {
        Ok(decide(self.0.rate, state.bucket()?, now_us, NEVER).0)
    }

    fn reset(&self) -> Reset {
        Reset::Floors(vec![self.0.rate.tolerance_us()])
    }
}

/// A bucket credited up to `now`: whole tokens, the time the last whole token was credited,
/// and the time waits are measured from (`now`, or the stored time if the clock went back).
struct Credited {
    tokens: u64,
    ts: u64,
    t_eff: u64,
}

impl Credited {
    /// Credits `stored` (`None`: a rested key) with the whole tokens earned by `now`.
    fn new(rate: BucketRate, stored: Option<Bucket>, now: u64) -> Self {
        let BucketRate { emission_us, burst } = rate;
        let (mut tokens, mut ts) = match stored {
            Some(b) => (b.tokens.min(burst), b.ts),
            None => (burst, now),
        };
        // If the clock went backwards, credit nothing and measure waits from the stored time.
        let t_eff = now.max(ts);
        let elapsed = t_eff - ts;
        if elapsed >= rate.tolerance_us() {
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
        Self { tokens, ts, t_eff }
    }

    /// Time from `now` until `want` whole tokens are in the bucket.
    fn wait_for(&self, rate: BucketRate, now: u64, want: u64) -> u64 {
        if self.tokens >= want {
            0
        } else {
            (want - self.tokens) * rate.emission_us - (self.t_eff - self.ts) + (self.t_eff - now)
        }
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
    let burst = rate.burst;
    let mut b = Credited::new(rate, stored, now);
    if cost > burst || b.tokens < cost {
        let o = Outcome::single(
            false,
            b.tokens,
            (cost <= burst).then(|| b.wait_for(rate, now, cost)),
            b.wait_for(rate, now, burst),
        );
        return (o, None);
    }
    b.tokens -= cost;
    let full_in = b.wait_for(rate, now, burst);
    let mut o = Outcome::single(true, b.tokens, Some(0), full_in);
    // The bucket is full again at now + full_in: its GCRA time.
    o.position = Position::Placed(Placed::new(now, &[now + full_in]));
    let bucket = Bucket {
        tokens: b.tokens,
        ts: b.ts,
    };
    (o, Some((bucket, full_in)))
}

/// In-memory twin of `lua/token_bucket_schedule.lua`: a place for a call of `cost` at `now`
/// paced by `pace` (see [`Pace`]) that may wait `budget_us`, on the bucket's equivalent of
/// GCRA's time. The call goes when the bucket holds `want` tokens (`cost`, or under
/// [`Pace::Steady`] a full bucket) and takes its cost then: at once as a check takes it, or
/// later with the credit time moved to that moment (ahead of now: the bucket owes the tokens
/// until then). Returns the answer, and the bucket to write with its time to live when the
/// place is kept.
pub(crate) fn schedule(
    rate: BucketRate,
    stored: Option<Bucket>,
    now: u64,
    (cost, budget_us): (u64, u64),
    pace: Pace,
) -> (Scheduled, Option<(Bucket, u64)>) {
    let burst = rate.burst;
    let b = Credited::new(rate, stored, now);
    let refused = |retry| {
        let o = Outcome::single(false, b.tokens, retry, b.wait_for(rate, now, burst));
        (
            Scheduled {
                outcome: o,
                wait_us: 0,
            },
            None,
        )
    };
    if cost > burst {
        return refused(None);
    }
    let want = match pace {
        Pace::Steady => burst,
        Pace::Burst => cost,
    };
    let wait = b.wait_for(rate, now, want);
    if wait > budget_us {
        return refused(Some(wait));
    }
    let bucket = match wait {
        0 => Bucket {
            tokens: b.tokens - cost,
            ts: b.ts,
        },
        _ => Bucket {
            tokens: want - cost,
            ts: now + wait,
        },
    };
    let full_in = bucket.ts + (burst - bucket.tokens) * rate.emission_us - now;
    let mut o = Outcome::single(true, bucket.tokens, Some(0), full_in);
    o.position = Position::Placed(Placed::new(now, &[now + full_in]));
    let scheduled = Scheduled {
        outcome: o,
        wait_us: wait,
    };
    (scheduled, Some((bucket, full_in)))
}

/// In-memory twin of `lua/token_bucket_refund.lua`: gives back what a charge of `cost`
/// admitted at `at` that left the bucket full again at `end` still holds (see `held.rs`),
/// on the bucket's equivalent of GCRA's time (when it would be full again), as GCRA's refund
/// does: the tokens of the time given back, and the credit time moved with it. `None` when
/// there is nothing to give back (a missing key or a full bucket); otherwise the bucket to
/// write with its time to live, `None` when it is full again (the key goes away), and what
/// the ledger was told.
///
/// Settling down gives back at most `back` of its units (the twin of
/// `lua/token_bucket_settle.lua` settling down); a refund, all `cost` of them.
pub(crate) fn refund(
    rate: BucketRate,
    stored: Option<Bucket>,
    ledger: &mut Ledger,
    now: u64,
    (cost, back): (u64, u64),
    (at, end): (u64, u64),
) -> Option<(Option<(Bucket, u64)>, GivenBack)> {
    stored?;
    let BucketRate { emission_us, burst } = rate;
    let b = Credited::new(rate, stored, now);
    if b.tokens >= burst {
        return None;
    }
    // Measured from `t_eff`: now, or the stored time if the clock went backwards.
    let full_at = b.ts + (burst - b.tokens) * emission_us;
    let charge = (at, end, cost.min(burst) * emission_us);
    let most = back.min(burst) * emission_us;
    let given = held::give_back_part(full_at, ledger, b.t_eff, charge, most);
    let bucket = given.tat.map(|full_at| {
        let missing = (full_at - b.t_eff).div_ceil(emission_us);
        let bucket = Bucket {
            tokens: burst - missing,
            ts: full_at - missing * emission_us,
        };
        (bucket, full_at - now)
    });
    Some((bucket, given))
}

/// The twin of `lua/token_bucket_settle.lua` settling up: `excess` more tokens taken at `now`,
/// whatever the bucket holds. Tokens it has are taken as a check takes them; beyond them the
/// bucket owes the rest: it holds no token and its credit time moves ahead of now, so that it
/// is full again `excess` emission intervals later than it would have been (within the
/// [debt's cap](super::settle::DEBT_QUOTAS)). The bucket to write, with its time to live.
pub(crate) fn charge_more(
    rate: BucketRate,
    stored: Option<Bucket>,
    now: u64,
    excess: u64,
) -> (Bucket, u64) {
    let BucketRate { emission_us, burst } = rate;
    let b = Credited::new(rate, stored, now);
    if b.tokens >= excess {
        let tokens = b.tokens - excess;
        let full_at = b.ts + (burst - tokens) * emission_us;
        return (Bucket { tokens, ts: b.ts }, full_at - now);
    }
    let full_at = b.ts + (burst - b.tokens) * emission_us;
    let full_at = bucket_charged(rate, full_at, now, excess);
    let ts = full_at.saturating_sub(rate.tolerance_us());
    (Bucket { tokens: 0, ts }, full_at - now)
}

impl TokenBucket {
    /// Gives back on `state` at most `back` units of what `charge` still holds (all of it for
    /// a refund).
    fn give_back(
        &self,
        state: &mut MemoryState,
        now_us: u64,
        charge: &Charge,
        back: u64,
    ) -> Result<bool, Error> {
        let Some((at, &[end])) = charge.position.placed().map(|p| (p.at_us, p.ends())) else {
            return Ok(false); // not placed on this key's time: nothing it provably holds
        };
        let stored = state.bucket()?;
        let mut ledgers = state.take_ledgers(1, now_us);
        let cost = (u64::from(charge.cost()), back);
        let given = refund(
            self.0.rate,
            stored,
            &mut ledgers[0],
            now_us,
            cost,
            (at, end),
        );
        match given {
            Some((None, _)) => state.clear(),
            Some((Some((bucket, ttl)), GivenBack { given: true, .. })) => {
                state.put_bucket(bucket, now_us, ttl)
            }
            _ => {}
        }
        state.put_ledgers(ledgers, now_us);
        Ok(given.is_some_and(|(_, g)| g.given))
    }
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
        Rule::builtin(Kind::TokenBucket(self))
    }

    fn decide(&self, state: &mut MemoryState, now_us: u64, cost: u32) -> Result<Outcome, Error> {
        let (outcome, write) = decide(self.0.rate, state.bucket()?, now_us, u64::from(cost));
        if let Some((bucket, ttl)) = write {
            state.put_bucket(bucket, now_us, ttl);
        }
        Ok(outcome)
    }

    fn refund(&self, state: &mut MemoryState, now_us: u64, charge: &Charge) -> Result<bool, Error> {
        self.give_back(state, now_us, charge, u64::from(charge.cost()))
    }

    fn settle(
        &self,
        state: &mut MemoryState,
        now_us: u64,
        charge: &Charge,
        actual: u32,
    ) -> Result<bool, Error> {
        match Change::of(charge.cost(), actual) {
            Change::None => Ok(false),
            Change::Down(back) => self.give_back(state, now_us, charge, back),
            Change::Up(excess) => {
                let (bucket, ttl) = charge_more(self.0.rate, state.bucket()?, now_us, excess);
                state.put_bucket(bucket, now_us, ttl);
                Ok(true)
            }
        }
    }

    fn local_share(&self, instances: NonZeroU32) -> Option<Arc<dyn Algorithm>> {
        Some(Arc::new(Self(self.0.divided(instances)?)))
    }

    fn with_quota(&self, quota: Quota) -> Result<Box<dyn Algorithm>, ConfigError> {
        Ok(Box::new(Self::new(quota)?))
    }
}
