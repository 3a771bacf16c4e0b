//! What a limiter counts.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of a [`RateLimiter`](crate::RateLimiter), for health checks and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimiterStats {
    /// Checks that failed in the store (errors and timeouts).
    pub store_errors: u64,
    /// Checks refused without calling the store because the circuit breaker was open.
    pub short_circuited: u64,
    /// Decisions made locally at the local share while the store was unavailable.
    pub degraded: u64,
    /// How often the circuit breaker opened.
    pub breaker_opened: u64,
    /// Checks denied by the local deny cache without a store call.
    pub deny_cache_hits: u64,
    /// Requests a layer let through in shadow mode although they were denied (see
    /// [`RateLimiterBuilder::shadow`](crate::RateLimiterBuilder::shadow)).
    pub shadow_denials: u64,
    /// Refunds that gave units back (see [`RateLimiter::refund`](crate::RateLimiter::refund)
    /// and [`RateLimitLayer::count_if`](crate::RateLimitLayer::count_if)).
    pub refunds: u64,
    /// Refunds that failed in the store (errors, timeouts, an open circuit breaker): those
    /// units stay spent.
    pub refund_errors: u64,
}

/// The live counters behind [`LimiterStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) store_errors: AtomicU64,
    pub(crate) short_circuited: AtomicU64,
    pub(crate) degraded: AtomicU64,
    pub(crate) deny_cache_hits: AtomicU64,
    pub(crate) shadow_denials: AtomicU64,
    pub(crate) refunds: AtomicU64,
    pub(crate) refund_errors: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self, breaker_opened: u64) -> LimiterStats {
        LimiterStats {
            store_errors: self.store_errors.load(Ordering::Relaxed),
            short_circuited: self.short_circuited.load(Ordering::Relaxed),
            degraded: self.degraded.load(Ordering::Relaxed),
            breaker_opened,
            deny_cache_hits: self.deny_cache_hits.load(Ordering::Relaxed),
            shadow_denials: self.shadow_denials.load(Ordering::Relaxed),
            refunds: self.refunds.load(Ordering::Relaxed),
            refund_errors: self.refund_errors.load(Ordering::Relaxed),
        }
    }
}
