//! GCRA: the generic cell rate algorithm, one integer per key.

use std::time::Duration;

use redis::Script;

use super::{Algorithm, MemoryState};
use crate::{quota::BucketRate, ConfigError, Error, Outcome, Quota};

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
pub struct Gcra {
    quota: Quota,
    rate: BucketRate,
}

impl Gcra {
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

/// In-memory twin of `lua/gcra.lua`; integer for integer the same maths.
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
    let o = Outcome::single(true, units_left(new_tat), Some(0), new_tat - now);
    (o, Some(new_tat))
}

#[derive(Debug)]
struct Tat(u64);

impl Algorithm for Gcra {
    fn name(&self) -> &'static str {
        "gcra"
    }

    fn quota(&self) -> u64 {
        self.rate.burst
    }

    fn window(&self) -> Duration {
        Duration::from_micros(self.rate.tolerance_us())
    }

    fn script(&self) -> &Script {
        lua_script!("gcra.lua", standalone)
    }

    fn batch_script(&self) -> Option<&'static Script> {
        lua_batch_script!("gcra.lua", standalone)
    }

    fn redis_keys(&self, base: &str) -> Vec<String> {
        vec![format!("{base}:g")]
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
        let stored = state.get_mut::<Tat>()?.map(|t| t.0);
        let (outcome, write) = decide(self.rate, stored, now_us, u64::from(cost));
        if let Some(tat) = write {
            state.put(Tat(tat), now_us, tat - now_us);
        }
        Ok(outcome)
    }
}
