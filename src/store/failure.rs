//! What happens to a check when the store fails: the failure policy, and the circuit breaker
//! that stops calling a failing store.

use std::time::Duration;

use crate::error::ConfigError;

/// What the layer does with a request when the store fails or times out.
///
/// The default is [`FailurePolicy::Open`]: a rate limiter protects a service, and an outage of the
/// limiter's store should not become an outage of the service. Choose [`FailurePolicy::Closed`]
/// for routes where an unlimited burst is worse than unavailability (log-in, password reset,
/// payments), or [`FailurePolicy::Local`] to keep limiting, approximately, while Redis is away.
/// A failure a layer answers by letting the request through or refusing it is logged with
/// `tracing` at `warn`; a decision at the local share at `debug` (and counted). See
/// [Failure modes](crate::guide::failure_modes) in the guide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through, without rate-limit headers.
    #[default]
    Open,
    /// Reject the request with `503 Service Unavailable` and `Retry-After: 1`
    /// (gRPC: `UNAVAILABLE`).
    Closed,
    /// Decide in this process with the in-memory twin of the same algorithm, at the quota
    /// divided by the number of instances set with
    /// [`RateLimiterBuilder::local_share`](crate::rate_limit::RateLimiterBuilder::local_share), so that the fleet as
    /// a whole stays near the global limit instead of N times it (fail open) or zero (fail
    /// closed). Such decisions are marked [`Decision::degraded`](crate::rate_limit::Decision::degraded),
    /// logged and counted. Errors that are about one key rather than the store's health
    /// (e.g. `WRONGTYPE`) are handled as [`FailurePolicy::Closed`].
    Local,
}

/// When the limiter stops calling a failing store.
///
/// After `failures` consecutive failures of the store as a whole
/// ([`ErrorScope::Store`](crate::store::ErrorScope::Store): timeouts, connection errors, and
/// server-wide refusals such as `OOM`, `READONLY`, `NOAUTH`, `BUSY`, `LOADING`), the
/// breaker opens: checks fail at once with [`Error::CircuitOpen`](crate::Error::CircuitOpen)
/// (and the layer applies its failure policy) for `cool_down`. Then one check is let through as
/// a probe: success closes the breaker, failure opens it for another `cool_down`. State changes
/// are logged with `tracing` (`warn` when opening, `info` when closing).
///
/// Errors that show the store is up (a `WRONGTYPE` under one key, a corrupted value) do not
/// count.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::store::CircuitBreaker;
///
/// let breaker = CircuitBreaker::new(3, Duration::from_millis(500));
/// let off = CircuitBreaker::disabled();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreaker {
    pub(crate) failures: u32,
    pub(crate) cool_down: Duration,
}

impl Default for CircuitBreaker {
    /// 5 failures in a row, 1 s cool-down.
    fn default() -> Self {
        Self::new(5, Duration::from_secs(1))
    }
}

impl CircuitBreaker {
    /// Opens after `failures` consecutive failures, for `cool_down`.
    pub const fn new(failures: u32, cool_down: Duration) -> Self {
        Self {
            failures,
            cool_down,
        }
    }

    /// Never opens: every check calls the store.
    pub const fn disabled() -> Self {
        Self {
            failures: 0,
            cool_down: Duration::ZERO,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.failures > 0 && self.cool_down.is_zero() {
            return Err(ConfigError::new(
                "circuit_breaker.cool_down",
                "must be more than zero (use CircuitBreaker::disabled() to turn it off)",
            ));
        }
        if self.cool_down > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "circuit_breaker.cool_down",
                "must be at most one hour",
            ));
        }
        Ok(())
    }
}
