//! What happens to a check when the store fails.

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
    /// [`RateLimiterBuilder::local_share`](crate::RateLimiterBuilder::local_share), so that the fleet as
    /// a whole stays near the global limit instead of N times it (fail open) or zero (fail
    /// closed). Such decisions are marked [`Decision::degraded`](crate::Decision::degraded),
    /// logged and counted. Errors that are about one key rather than the store's health
    /// (e.g. `WRONGTYPE`) are handled as [`FailurePolicy::Closed`].
    Local,
}
