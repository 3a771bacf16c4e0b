//! What a limiter counts.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of a limit ([`RateLimiter::stats`](crate::RateLimiter::stats),
/// [`ConcurrencyLimiter::stats`](crate::concurrency::ConcurrencyLimiter::stats)), for health checks and
/// tests. A concurrency limit counts its acquires as decisions; it has no deny cache, shadow
/// mode nor refunds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimiterStats {
    /// Checks allowed (for a concurrency limit: requests admitted), wherever decided.
    pub allowed: u64,
    /// Checks denied (for a concurrency limit: requests refused because every permit of
    /// their key was held), wherever decided, the deny cache included.
    pub denied: u64,
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
    /// [`RateLimiterBuilder::shadow`](crate::rate_limit::RateLimiterBuilder::shadow)).
    pub shadow_denials: u64,
    /// Refunds that gave units back (see [`RateLimiter::refund`](crate::RateLimiter::refund)
    /// and [`RateLimitLayer::count_if`](crate::RateLimitLayer::count_if)).
    pub refunds: u64,
    /// Refunds that failed in the store (errors, timeouts, an open circuit breaker): those
    /// units stay spent.
    pub refund_errors: u64,
}

/// One live counter.
#[derive(Debug, Default)]
pub(crate) struct Count(AtomicU64);

impl Count {
    pub(crate) fn increment(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The live counters behind [`LimiterStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) allowed: Count,
    pub(crate) denied: Count,
    pub(crate) store_errors: Count,
    pub(crate) short_circuited: Count,
    pub(crate) degraded: Count,
    pub(crate) deny_cache_hits: Count,
    pub(crate) shadow_denials: Count,
    pub(crate) refunds: Count,
    pub(crate) refund_errors: Count,
}

impl Counters {
    pub(crate) fn snapshot(&self, breaker_opened: u64) -> LimiterStats {
        LimiterStats {
            allowed: self.allowed.get(),
            denied: self.denied.get(),
            store_errors: self.store_errors.get(),
            short_circuited: self.short_circuited.get(),
            degraded: self.degraded.get(),
            breaker_opened,
            deny_cache_hits: self.deny_cache_hits.get(),
            shadow_denials: self.shadow_denials.get(),
            refunds: self.refunds.get(),
            refund_errors: self.refund_errors.get(),
        }
    }
}
