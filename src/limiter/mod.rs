//! The limiter: `check(key, cost) -> Decision`, without HTTP, with the circuit breaker, the
//! exact deny cache and the failure policy (including the local fair share) around the store.

mod breaker;
mod builder;
mod deny_cache;
mod engine;
mod failure;
mod lease;
mod names;
mod rate_limiter;
mod stats;

pub(crate) use self::{breaker::BreakerState, engine::Engine, names::check as check_names};
pub use self::{
    breaker::CircuitBreaker, builder::RateLimiterBuilder, failure::FailurePolicy, lease::UnitLease,
    rate_limiter::RateLimiter, stats::LimiterStats,
};

use std::time::Duration;

/// Default bound on one store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "rl";
/// Default policy name in the headers.
pub const DEFAULT_POLICY_NAME: &str = "default";
/// Default bound on a key's length; longer keys are replaced by a hash.
pub const DEFAULT_MAX_KEY_LEN: usize = 128;
/// Default number of live denials the deny cache holds.
pub const DEFAULT_DENY_CACHE_KEYS: usize = 100_000;
