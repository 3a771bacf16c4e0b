//! Validated rates: what the stores run, in integer microseconds.

use crate::{
    error::ConfigError,
    quota::{Quota, MAX_EXACT},
};

/// A validated bucket rate (GCRA, token bucket): one unit every `emission_us` microseconds,
/// at most `burst` units stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BucketRate {
    pub(crate) emission_us: u64,
    pub(crate) burst: u64,
}

impl BucketRate {
    pub(crate) fn from_quota(q: &Quota) -> Result<Self, ConfigError> {
        let period_us = q.period_us()?;
        let limit = u64::from(q.limit());
        if limit > period_us {
            return Err(ConfigError::new(
                "quota.limit",
                "more than one unit per microsecond is not supported",
            ));
        }
        // Rounded up: the limiter may be a hair stricter than asked, never looser.
        let emission_us = period_us.div_ceil(limit);
        let burst = u64::from(q.burst_size());
        if burst == 0 {
            return Err(ConfigError::new("quota.burst", "must be at least 1"));
        }
        if emission_us.saturating_mul(burst) > MAX_EXACT {
            return Err(ConfigError::new(
                "quota.burst",
                "burst x (period / limit) must be under 142 years",
            ));
        }
        Ok(Self { emission_us, burst })
    }

    /// Microseconds between two units (the period divided by the limit, rounded up).
    pub(crate) const fn emission_us(&self) -> u64 {
        self.emission_us
    }

    /// Units a rested key holds.
    pub(crate) const fn burst(&self) -> u64 {
        self.burst
    }

    /// Time to refill the whole burst from empty.
    pub(crate) const fn tolerance_us(&self) -> u64 {
        self.emission_us * self.burst
    }
}

/// A validated sliding window: at most `limit` units in any `window_us` microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowRate {
    pub(crate) window_us: u64,
    pub(crate) limit: u64,
}

impl WindowRate {
    /// The window's length in microseconds.
    pub(crate) const fn window_us(&self) -> u64 {
        self.window_us
    }

    /// The most units any window admits.
    pub(crate) const fn limit(&self) -> u64 {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rejects_bad_quotas_naming_the_field() {
        let field = |q: Quota| BucketRate::from_quota(&q).unwrap_err().field();
        assert_eq!(field(Quota::per_second(0)), "quota.limit");
        assert_eq!(field(Quota::new(1, Duration::ZERO)), "quota.period");
        assert_eq!(
            field(Quota::new(1, Duration::from_micros(999))),
            "quota.period"
        );
        assert_eq!(field(Quota::per_second(1).burst(0)), "quota.burst");
        assert_eq!(
            field(Quota::new(2000, Duration::from_millis(1))),
            "quota.limit"
        );
        assert_eq!(field(Quota::per_day(1).burst(u32::MAX)), "quota.burst");
        assert_eq!(
            field(Quota::new(1, Duration::from_secs(u64::MAX))),
            "quota.period"
        );
    }

    #[test]
    fn emission_interval_rounds_up() {
        let r = BucketRate::from_quota(&Quota::per_second(7)).unwrap();
        assert_eq!(r.emission_us, 142_858);
        assert_eq!(r.burst, 7);
        let r = BucketRate::from_quota(&Quota::per_minute(100).burst(20)).unwrap();
        assert_eq!((r.emission_us, r.burst), (600_000, 20));
    }
}
