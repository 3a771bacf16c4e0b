//! The options of a unit lease.

use std::time::Duration;

use crate::{
    algorithm::{Kind, Rule},
    error::ConfigError,
};

/// Unit leases for hot keys that are allowed: a limiter reserves a block of units of a key
/// from the store in one call and hands them out in this process, within `lifetime` of
/// sending the reservation; what is left then goes back to the store. See
/// [the bound](UnitLease#the-bound) it keeps below, and
/// [`RateLimiterBuilder::lease`](crate::rate_limit::RateLimiterBuilder::lease).
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::rate_limit::UnitLease;
///
/// let lease = UnitLease::up_to(Duration::from_millis(50)).max_units(500);
/// assert_eq!(lease.lifetime(), Duration::from_millis(50));
/// ```
///
/// # The bound
///
/// Redis counts every unit of a lease when it grants the reservation, so the units admitted
/// by all instances together never exceed what the algorithm grants. A leased unit is handed
/// out at most `lifetime` after the reservation was sent (however slow the reply), so the
/// only inexactness is in time: an admission may come up to `lifetime` after Redis counted
/// it. In any window of the quota's period, the admissions of every instance together are at
/// most what the algorithm admits in a window of period + `lifetime`; for GCRA and the token
/// bucket, `burst + (period + lifetime) / emission interval`, that is at most
/// `limit × lifetime / period` units more than without leases (e.g. 50 ms on 1,000 a second:
/// 50 units).
///
/// Decisions answered from a lease are `allowed`, with approximate numbers: `remaining` is
/// what the store said was left at the reservation plus what the lease still holds, and the
/// reset time is the one at the reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitLease {
    lifetime: Duration,
    max_units: Option<u32>,
    max_keys: usize,
}

impl UnitLease {
    /// Default bound on the keys a limiter tracks for leases.
    pub const DEFAULT_MAX_KEYS: usize = 10_000;

    /// Longest lifetime accepted: a lease is a short-lived block, not a local quota.
    pub const MAX_LIFETIME: Duration = Duration::from_secs(10);

    /// Leases handed out for at most `lifetime` after their reservation was sent (more than
    /// zero, at most [`MAX_LIFETIME`](Self::MAX_LIFETIME)). Each lease holds at most an
    /// eighth of the key's burst (see [`max_units`](Self::max_units)), and at most
    /// [`DEFAULT_MAX_KEYS`](Self::DEFAULT_MAX_KEYS) keys are tracked.
    pub const fn up_to(lifetime: Duration) -> Self {
        Self {
            lifetime,
            max_units: None,
            max_keys: Self::DEFAULT_MAX_KEYS,
        }
    }

    /// The most units one lease holds: at least 1 and at most the default, an eighth of the
    /// key's burst (at least one unit), so that one instance never takes more than an eighth
    /// of what a rested key has and others sharing the key still find units. A value outside
    /// is a [`ConfigError`] naming `lease.max_units` when the limiter is built.
    pub const fn max_units(mut self, units: u32) -> Self {
        self.max_units = Some(units);
        self
    }

    /// The most keys this limiter tracks for leases (at least 1; default
    /// [`DEFAULT_MAX_KEYS`](Self::DEFAULT_MAX_KEYS)). Keys beyond it are checked in the store
    /// one request at a time, as without leases, until idle keys make room.
    pub const fn max_keys(mut self, keys: usize) -> Self {
        self.max_keys = keys;
        self
    }

    /// How long after its reservation was sent a lease's units may be handed out.
    pub const fn lifetime(&self) -> Duration {
        self.lifetime
    }

    pub(crate) const fn tracked_keys(&self) -> usize {
        self.max_keys
    }

    /// Checks the options and that `rule` can be leased; the error names the field. The
    /// units one lease may hold for a key of this rule.
    pub(crate) fn validate(&self, rule: Rule<'_>) -> Result<u32, ConfigError> {
        if self.lifetime.is_zero() || self.lifetime > Self::MAX_LIFETIME {
            return Err(ConfigError::new(
                "lease.lifetime",
                "must be more than zero and at most 10 s",
            ));
        }
        if self.max_keys == 0 {
            return Err(ConfigError::new("lease.max_keys", "must be at least 1"));
        }
        let burst = match rule.kind() {
            Kind::Gcra(g) => g.rate().burst(),
            Kind::TokenBucket(t) => t.rate().burst(),
            Kind::SlidingWindow(_) => return Err(not_leased("the sliding window")),
            Kind::FixedWindow(_) => return Err(not_leased("a fixed window")),
            Kind::Multi(_) => return Err(not_leased("a multi-limit")),
            Kind::Script(_) => return Err(not_leased("a custom script")),
        };
        let share = u32::try_from((burst / 8).max(1)).unwrap_or(u32::MAX);
        match self.max_units {
            Some(0) => Err(ConfigError::new("lease.max_units", "must be at least 1")),
            Some(units) if units > share => Err(ConfigError::new(
                "lease.max_units",
                format!(
                    "must be at most an eighth of the burst ({share} for a burst of {burst}), so that one instance never takes more of a rested key"
                ),
            )),
            Some(units) => Ok(units),
            None => Ok(share),
        }
    }
}

fn not_leased(what: &str) -> ConfigError {
    ConfigError::new(
        "lease",
        format!("only GCRA and the token bucket can be leased, not {what}"),
    )
}
