//! How much a key may do: a number of units per period, with an optional burst.

use std::{fmt, time::Duration};

use crate::ConfigError;

/// Largest integer every script handles exactly (Lua numbers are doubles).
pub(crate) const MAX_EXACT: u64 = 1 << 52;

/// A quota: `limit` units per `period`, optionally with a `burst` different from `limit`.
///
/// For [`TokenBucket`](crate::TokenBucket) and [`Gcra`](crate::Gcra), `burst` is the bucket
/// capacity (default: `limit`) and the bucket refills at `limit` per `period`. For
/// [`SlidingWindow`](crate::SlidingWindow), at most `limit` units are admitted in any window of
/// length `period`; it has no separate burst.
///
/// A quota is plain data; it is validated when an algorithm is built from it.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::Quota;
///
/// let q = Quota::per_minute(100).burst(20);
/// assert_eq!(q.to_string(), "100 per 60s (burst 20)");
/// assert_eq!(Quota::new(5, Duration::from_millis(250)).to_string(), "5 per 250ms");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    limit: u32,
    period: Duration,
    burst: Option<u32>,
}

impl Quota {
    /// `limit` units per `period`.
    pub const fn new(limit: u32, period: Duration) -> Self {
        Self {
            limit,
            period,
            burst: None,
        }
    }

    /// `limit` units per second.
    pub const fn per_second(limit: u32) -> Self {
        Self::new(limit, Duration::from_secs(1))
    }

    /// `limit` units per minute.
    pub const fn per_minute(limit: u32) -> Self {
        Self::new(limit, Duration::from_secs(60))
    }

    /// `limit` units per hour.
    pub const fn per_hour(limit: u32) -> Self {
        Self::new(limit, Duration::from_secs(3600))
    }

    /// `limit` units per day.
    pub const fn per_day(limit: u32) -> Self {
        Self::new(limit, Duration::from_secs(86_400))
    }

    /// Sets the burst (bucket capacity) for the bucket algorithms.
    pub const fn burst(mut self, burst: u32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Units per period.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// The period.
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// The burst: the explicit one, or `limit`.
    pub const fn burst_size(&self) -> u32 {
        match self.burst {
            Some(b) => b,
            None => self.limit,
        }
    }

    pub(crate) const fn explicit_burst(&self) -> Option<u32> {
        self.burst
    }

    /// Checks limit and period, and returns the period in microseconds.
    pub(crate) fn period_us(&self) -> Result<u64, ConfigError> {
        if self.limit == 0 {
            return Err(ConfigError::new("quota.limit", "must be at least 1"));
        }
        if self.period < Duration::from_millis(1) {
            return Err(ConfigError::new(
                "quota.period",
                format!("must be at least 1ms, got {:?}", self.period),
            ));
        }
        let us = u64::try_from(self.period.as_micros()).unwrap_or(u64::MAX);
        if us > MAX_EXACT {
            return Err(ConfigError::new("quota.period", "must be under 142 years"));
        }
        Ok(us)
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per {:?}", self.limit, self.period)?;
        if let Some(b) = self.burst {
            write!(f, " (burst {b})")?;
        }
        Ok(())
    }
}

/// A validated bucket rate: one unit every `emission_us`, at most `burst` units stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BucketRate {
    pub(crate) emission_us: u64,
    pub(crate) burst: u64,
}

impl BucketRate {
    pub(crate) fn from_quota(q: &Quota) -> Result<Self, ConfigError> {
        let period_us = q.period_us()?;
        let limit = u64::from(q.limit);
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

    /// Time to refill the whole burst from empty.
    pub(crate) fn tolerance_us(&self) -> u64 {
        self.emission_us * self.burst
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
