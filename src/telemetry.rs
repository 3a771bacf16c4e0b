//! What the limiter reports: `tracing` events, and with the `metrics` feature, metrics.
//!
//! Events (target `tower_redis_ratelimit`): each decision at `debug` (policy, allowed,
//! remaining, store latency), store failures at `warn`, circuit-breaker changes at `warn` /
//! `info`, denials let through in shadow mode at `info`, refunds at `debug` (failed ones at
//! `warn`). Raw keys are never logged above `trace`.
//!
//! Metrics (feature `metrics`, through the [`metrics`](https://docs.rs/metrics) facade; install
//! any recorder, e.g. a Prometheus exporter):
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `ratelimit_decisions_total` | counter | `policy`, `decision` = `allowed` / `denied` |
//! | `ratelimit_store_errors_total` | counter | `policy`, `kind` = `timeout` / `circuit_open` / `redis` / `other` |
//! | `ratelimit_degraded_total` | counter | `policy` |
//! | `ratelimit_shadow_denials_total` | counter | `policy` |
//! | `ratelimit_refunds_total` | counter | `policy`, `outcome` = `given` / `nothing` / `failed` |
//! | `ratelimit_upstream_learned_total` | counter | `policy`, `source` = `ratelimit` / `ratelimit-remaining` / `x-ratelimit` / `retry-after` / `429` |
//! | `ratelimit_upstream_waits_total` | counter | `policy` |
//! | `ratelimit_store_latency_seconds` | histogram | `policy` |
//!
//! A store that decides without waiting (`MemoryStore`) is not timed: its decisions report a
//! store latency of zero.

pub use crate::core::LimiterStats;

use std::time::{Duration, Instant};

use crate::{decision::Decision, error::Error};

/// Metric names.
pub const DECISIONS: &str = "ratelimit_decisions_total";
/// Metric names.
pub const STORE_ERRORS: &str = "ratelimit_store_errors_total";
/// Metric names.
pub const DEGRADED: &str = "ratelimit_degraded_total";
/// Metric names.
pub const SHADOW_DENIALS: &str = "ratelimit_shadow_denials_total";
/// Metric names.
pub const UPSTREAM_LEARNED: &str = "ratelimit_upstream_learned_total";
/// Metric names.
pub const UPSTREAM_WAITS: &str = "ratelimit_upstream_waits_total";
/// Metric names.
pub const REFUNDS: &str = "ratelimit_refunds_total";
/// Metric names.
pub const STORE_LATENCY: &str = "ratelimit_store_latency_seconds";

/// A decision; `started` is when the store was asked (`None`: decided without waiting). The
/// clock is read only if something records the latency.
pub(crate) fn decided(d: &Decision, started: Option<Instant>) {
    let latency = || started.map_or(Duration::ZERO, |s| s.elapsed());
    if tracing::enabled!(tracing::Level::DEBUG) {
        tracing::debug!(
            policy = %d.policy,
            allowed = d.allowed,
            remaining = d.remaining,
            cost = d.cost,
            latency_us = latency().as_micros() as u64,
            "rate limit: decided"
        );
    }
    #[cfg(feature = "metrics")]
    {
        let decision = if d.allowed { "allowed" } else { "denied" };
        metrics::counter!(DECISIONS, "policy" => d.policy.to_string(), "decision" => decision)
            .increment(1);
        metrics::histogram!(STORE_LATENCY, "policy" => d.policy.to_string())
            .record(latency().as_secs_f64());
    }
}

pub(crate) fn store_failed(policy: &str, e: &Error) {
    tracing::debug!(policy, error = %crate::error::Chain(&e), "rate limit: store check failed");
    #[cfg(feature = "metrics")]
    {
        let kind = match e {
            Error::Timeout(_) => "timeout",
            Error::CircuitOpen => "circuit_open",
            Error::Redis(_) | Error::Pool(_) | Error::Connect(_) => "redis",
            _ => "other",
        };
        metrics::counter!(STORE_ERRORS, "policy" => policy.to_owned(), "kind" => kind).increment(1);
    }
}

/// A denial a layer let through because its policy is in shadow mode.
pub(crate) fn shadow_denied(d: &Decision) {
    tracing::info!(
        policy = %d.policy,
        cost = d.cost,
        remaining = d.remaining,
        retry_after_ms = d.retry_after.map(|r| r.as_millis() as u64),
        "rate limit: would deny (shadow mode)"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!(SHADOW_DENIALS, "policy" => d.policy.to_string()).increment(1);
}

/// A refund: `Ok(given)` or the store's error.
pub(crate) fn refunded(policy: &str, cost: u32, result: &Result<bool, Error>) {
    match result {
        Ok(given) => tracing::debug!(policy, cost, given, "rate limit: refund"),
        Err(e) => {
            tracing::warn!(policy, cost, error = %crate::error::Chain(&e), "rate limit: refund failed; the units stay spent")
        }
    }
    #[cfg(feature = "metrics")]
    {
        let outcome = match result {
            Ok(true) => "given",
            Ok(false) => "nothing",
            Err(_) => "failed",
        };
        metrics::counter!(REFUNDS, "policy" => policy.to_owned(), "outcome" => outcome)
            .increment(1);
    }
}

/// A concurrency limit's acquire: a permit given (`admitted`) or refused.
pub(crate) fn acquired(policy: &str, admitted: bool) {
    tracing::debug!(policy, admitted, "concurrency limit: decided");
    #[cfg(feature = "metrics")]
    {
        let decision = if admitted { "allowed" } else { "denied" };
        metrics::counter!(DECISIONS, "policy" => policy.to_owned(), "decision" => decision)
            .increment(1);
    }
}

pub(crate) fn degraded(d: &Decision) {
    #[cfg(feature = "metrics")]
    metrics::counter!(DEGRADED, "policy" => d.policy.to_string()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = d;
}
