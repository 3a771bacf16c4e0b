//! What GCRA and the token bucket share: a quota validated into a bucket rate.

use std::{num::NonZeroU32, time::Duration};

use super::rate::BucketRate;
use crate::{error::ConfigError, quota::Quota};

/// A quota and the bucket rate it validates to: capacity `burst`, refilled at `limit` per
/// `period`.
#[derive(Debug, Clone)]
pub(crate) struct BucketQuota {
    pub(crate) quota: Quota,
    pub(crate) rate: BucketRate,
    /// [`Quota::burst_window`], computed once: every admission's fields show it.
    window: Duration,
}

impl BucketQuota {
    pub(crate) fn new(quota: Quota) -> Result<Self, ConfigError> {
        Ok(Self {
            quota,
            rate: BucketRate::from_quota(&quota)?,
            window: quota.burst_window(),
        })
    }

    /// Units a rested key has.
    pub(crate) fn quota(&self) -> u64 {
        self.rate.burst
    }

    /// Time to refill the whole burst, from the quota (see [`Quota::burst_window`]).
    pub(crate) fn window(&self) -> Duration {
        self.window
    }

    /// The same bucket with limit and burst divided among `instances`.
    pub(crate) fn divided(&self, instances: NonZeroU32) -> Option<Self> {
        Self::new(divided(self.quota, instances)).ok()
    }
}

/// `quota` with its limit and burst divided by `instances`, rounded down, at least 1.
pub(crate) fn divided(quota: Quota, instances: NonZeroU32) -> Quota {
    let share = |units: u32| (units / instances.get()).max(1);
    let q = Quota::new(share(quota.limit()), quota.period());
    match quota.explicit_burst() {
        Some(b) => q.burst(share(b)),
        None => q,
    }
}
