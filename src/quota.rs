//! How much a key may do: a number of units per period, with an optional burst.

use std::{fmt, time::Duration};

use crate::error::ConfigError;

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

    /// Time a key takes to earn its whole burst back: `burst × period / limit`, rounded up to
    /// the microsecond. The window a `RateLimit-Policy` announces: worked out from the quota
    /// itself, not from the emission interval the stores use (rounded up to a whole
    /// microsecond, 6 per second would earn 6 units in 1,000,002 µs and be announced as 2 s).
    pub(crate) fn burst_window(&self) -> Duration {
        let nanos = u128::from(self.burst_size()) * self.period.as_nanos();
        let us = nanos.div_ceil(u128::from(self.limit.max(1)) * 1_000);
        Duration::from_micros(u64::try_from(us).unwrap_or(u64::MAX))
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
