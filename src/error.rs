//! Errors, and what the layer does when the store fails.

use std::{error::Error as StdError, fmt, time::Duration};

/// A configuration value that cannot work, found when a limiter or layer is built.
///
/// The message names the field, e.g. `invalid quota.limit: must be at least 1`.
///
/// ```
/// use tower_redis_ratelimit::{Gcra, Quota};
///
/// let err = Gcra::new(Quota::per_second(0)).unwrap_err();
/// assert_eq!(err.field(), "quota.limit");
/// assert!(err.to_string().contains("quota.limit"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    reason: String,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }

    /// The configuration field that was rejected, e.g. `"quota.burst"`.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// Why the value was rejected.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {}: {}", self.field, self.reason)
    }
}

impl StdError for ConfigError {}

/// Why a check could not reach a decision.
///
/// The layer never surfaces these to clients as 500s: it applies its [`FailurePolicy`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The store did not answer within the configured timeout.
    Timeout(Duration),
    /// Redis answered with an error or the connection failed.
    Redis(redis::RedisError),
    /// No pooled connection could be had.
    Pool(String),
    /// The store answered, but not in the shape the algorithm expects
    /// (foreign data under the limiter's keys, or a script from another version).
    InvalidReply(String),
    /// The request itself is invalid, e.g. a cost of zero.
    InvalidInput(&'static str),
    /// The store does not support this algorithm.
    Unsupported(&'static str),
    /// The circuit breaker is open after repeated store failures; the store was not called.
    CircuitOpen,
}

impl Error {
    /// True when the error says the store is unreachable or unhealthy (timeouts, connection
    /// failures, a loading or failing-over server), as opposed to an answer about one key
    /// (`WRONGTYPE`, a corrupted value). Only these count towards the circuit breaker and
    /// switch [`FailurePolicy::Local`] to local decisions.
    pub fn is_unavailable(&self) -> bool {
        use redis::{ErrorKind, ServerErrorKind};
        match self {
            Error::Timeout(_) | Error::Pool(_) | Error::CircuitOpen => true,
            Error::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_refusal()
                    || e.is_connection_dropped()
                    || e.is_timeout()
                    || matches!(
                        e.kind(),
                        ErrorKind::ClusterConnectionNotFound
                            | ErrorKind::Server(
                                ServerErrorKind::BusyLoading
                                    | ServerErrorKind::TryAgain
                                    | ServerErrorKind::ClusterDown
                                    | ServerErrorKind::MasterDown
                            )
                    )
            }
            _ => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Timeout(d) => write!(f, "rate-limit store timed out after {d:?}"),
            Error::Redis(e) => write!(f, "redis error: {e}"),
            Error::Pool(e) => write!(f, "redis pool error: {e}"),
            Error::InvalidReply(e) => write!(f, "unexpected reply from the rate-limit store: {e}"),
            Error::InvalidInput(e) => write!(f, "invalid rate-limit check: {e}"),
            Error::Unsupported(e) => write!(f, "unsupported: {e}"),
            Error::CircuitOpen => write!(f, "circuit breaker open: the store is failing"),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}

/// What the layer does with a request when the store fails or times out.
///
/// The default is [`FailurePolicy::Open`]: a rate limiter protects a service, and an outage of the
/// limiter's store should not become an outage of the service. Choose [`FailurePolicy::Closed`]
/// for routes where an unlimited burst is worse than unavailability (log-in, password reset,
/// payments), or [`FailurePolicy::Local`] to keep limiting, approximately, while Redis is away.
/// Failures are logged with `tracing` at `warn` level.
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
    /// [`RateLimitLayer::local_share`](crate::RateLimitLayer::local_share), so that the fleet as
    /// a whole stays near the global limit instead of N times it (fail open) or zero (fail
    /// closed). Such decisions are marked [`Decision::degraded`](crate::Decision::degraded),
    /// logged and counted. Errors that are about one key rather than the store's health
    /// (e.g. `WRONGTYPE`) are handled as [`FailurePolicy::Closed`].
    Local,
}
