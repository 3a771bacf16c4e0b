//! GCRA: the generic cell rate algorithm, one integer per key.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use super::{
    bucket::BucketQuota,
    held::{self, GivenBack, Ledger, Placed},
    outcome::{Outcome, Position},
    rate::BucketRate,
    settle::{bucket_charged, Change},
    Algorithm, Kind, MemoryState, Reset, Rule, Twin, NEVER,
};
use crate::{
    decision::Charge,
    error::{ConfigError, Error},
    quota::Quota,
};

/// GCRA (generic cell rate algorithm): a token bucket stored as one integer per key, the
/// "theoretical arrival time". Capacity `quota.burst_size()`, refilled at `quota.limit()` per
/// `quota.period()`; exactly the same decisions as [`TokenBucket`](crate::TokenBucket) with the
/// same quota, at about half the cost in Redis.
///
/// ```
/// use tower_redis_ratelimit::{Gcra, Quota};
///
/// // 100 requests a minute sustained, at most 20 at once.
/// let gcra = Gcra::new(Quota::per_minute(100).burst(20))?;
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Gcra(BucketQuota);

impl Gcra {
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

impl Twin for Gcra {
    fn peek(&self, state: &mut MemoryState, now_us: u64) -> Result<Outcome, Error> {
        Ok(decide(self.0.rate, state.tat()?, now_us, NEVER).0)
    }

    fn reset(&self) -> Reset {
        Reset::Floors(vec![self.0.rate.tolerance_us()])
    }
}

/// The decision for one check on a stored TAT (`None`: a rested key): the outcome, and the
/// TAT to store when the check was allowed. The in-memory twin of `lua/gcra.lua`, integer for
/// integer the same maths.
#[inline]
pub(crate) fn decide(
    rate: BucketRate,
    stored_tat: Option<u64>,
    now: u64,
    cost: u64,
) -> (Outcome, Option<u64>) {
    let emission = rate.emission_us;
    let tolerance = rate.tolerance_us();
    let tat = stored_tat.map_or(now, |t| t.max(now));
    let units_left = |t: u64| (now + tolerance).saturating_sub(t) / emission;
    if cost > rate.burst {
        let o = Outcome::single(false, units_left(tat), None, tat - now);
        return (o, None);
    }
    let new_tat = tat + cost * emission;
    let allow_at = new_tat - tolerance.min(new_tat);
    if allow_at > now {
        let o = Outcome::single(false, units_left(tat), Some(allow_at - now), tat - now);
        return (o, None);
    }
    let mut o = Outcome::single(true, units_left(new_tat), Some(0), new_tat - now);
    o.position = Position::Placed(Placed::new(now, &[new_tat]));
    (o, Some(new_tat))
}

/// In-memory twin of `lua/gcra_refund.lua` for one limit (`back` = `cost`) and of settling
/// down (`back` below it): gives back at most `back` of what a charge of `cost` admitted at
/// `at` that left the TAT at `end` still holds at `now` (see `held.rs`), never moving the TAT
/// before `now`. `None` when there is nothing to give back (no TAT, or one already in the
/// past).
pub(crate) fn refund_part(
    rate: BucketRate,
    stored_tat: Option<u64>,
    ledger: &mut Ledger,
    now: u64,
    (cost, back): (u64, u64),
    (at, end): (u64, u64),
) -> Option<GivenBack> {
    let tat = stored_tat.filter(|&t| t > now)?;
    let span = cost.min(rate.burst) * rate.emission_us;
    let most = back.min(rate.burst) * rate.emission_us;
    Some(held::give_back_part(
        tat,
        ledger,
        now,
        (at, end, span),
        most,
    ))
}

impl Gcra {
    /// Gives back on `state` at most `back` units of what `charge` still holds (all of it for
    /// a refund): the twin of `lua/gcra_refund.lua` and of `lua/gcra_settle.lua` settling
    /// down.
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
        let tat = state.tat()?;
        let mut ledgers = state.take_ledgers(1, now_us);
        let cost = (u64::from(charge.cost()), back);
        let given = refund_part(self.0.rate, tat, &mut ledgers[0], now_us, cost, (at, end));
        match given {
            Some(GivenBack { tat: None, .. }) => state.clear(),
            Some(GivenBack {
                tat: Some(tat),
                given: true,
                ..
            }) => state.put_tat(tat, now_us, tat - now_us),
            _ => {}
        }
        state.put_ledgers(ledgers, now_us);
        Ok(given.is_some_and(|g| g.given))
    }
}

impl Algorithm for Gcra {
    fn name(&self) -> &'static str {
        "gcra"
    }

    fn quota(&self) -> u64 {
        self.0.quota()
    }

    fn window(&self) -> Duration {
        self.0.window()
    }

    fn rule(&self) -> Rule<'_> {
        Rule::builtin(Kind::Gcra(self))
    }

    fn decide(&self, state: &mut MemoryState, now_us: u64, cost: u32) -> Result<Outcome, Error> {
        let (outcome, write) = decide(self.0.rate, state.tat()?, now_us, u64::from(cost));
        if let Some(tat) = write {
            state.put_tat(tat, now_us, tat - now_us);
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
                let base = state.tat()?.map_or(now_us, |t| t.max(now_us));
                let tat = bucket_charged(self.0.rate, base, now_us, excess);
                state.put_tat(tat, now_us, tat - now_us);
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
