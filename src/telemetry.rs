//! What the limiter reports: `tracing` events, and with the `metrics` feature, metrics.
//!
//! Every decision is counted once, whatever answered it, under its [`Verdict`] (`allowed`,
//! `denied`, `would_deny`, `unavailable`) and its [`Source`] (`store`, `deny_cache`,
//! `unit_lease`, `local`, `failure_policy`): in [`LimiterStats`], in the `tracing` event and in
//! the metrics. The `denied` decisions of a rate limit are the `429`s (gRPC
//! `RESOURCE_EXHAUSTED`) its layer served; a store failure answered `503` under
//! [`FailurePolicy::Closed`](crate::FailurePolicy::Closed) is `unavailable`; a denial under a
//! policy in shadow mode is `would_deny`. Recording a decision allocates nothing.
//!
//! Events (target `tower_redis_ratelimit`): each decision at `debug` (`policy`, `decision`,
//! `source`, `limit`: the part of a multi-limit the decision describes, `remaining`, `cost`,
//! store latency), a would-be denial at `info`, store failures at `warn`, circuit-breaker
//! changes at `warn` / `info`, refunds at `debug` (failed ones at `warn`). Raw keys are never
//! logged above `trace`; [`RateLimiter::top_keys`](crate::RateLimiter::top_keys) names the
//! keys denied most.
//!
//! A decision that does not simply let its request go on also records `rate_limit.policy`,
//! `rate_limit.decision`, `rate_limit.source` and `rate_limit.limit` on the current span: a
//! request span that declares them (as `tracing::field::Empty`) carries which rule fired.
//!
//! ```
//! // In tower-http's `TraceLayer::make_span_with`, or any request span:
//! let span = tracing::info_span!(
//!     "request",
//!     rate_limit.policy = tracing::field::Empty,
//!     rate_limit.decision = tracing::field::Empty,
//!     rate_limit.source = tracing::field::Empty,
//!     rate_limit.limit = tracing::field::Empty,
//! );
//! # drop(span);
//! ```
//!
//! Metrics (feature `metrics`, through the [`metrics`](https://docs.rs/metrics) facade; install
//! any recorder, e.g. a Prometheus exporter):
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `ratelimit_decisions_total` | counter | `policy`, `decision` = `allowed` / `denied` / `would_deny` / `unavailable`, `source` = `store` / `deny_cache` / `unit_lease` / `local` / `failure_policy` |
//! | `ratelimit_key_decisions_total` | counter | `policy`, `key`, `decision`: only the keys listed with [`metric_keys`](crate::rate_limit::RateLimiterBuilder::metric_keys) |
//! | `ratelimit_store_errors_total` | counter | `policy`, `kind` = `timeout` / `redis` / `other`: store calls that failed (a check refused by the open breaker made no call) |
//! | `ratelimit_breaker_open` | gauge | `policy`: 1 while the circuit breaker is open, else 0 |
//! | `ratelimit_near_limit_total` | counter | `policy`: allowed decisions that left the key at or under 20% of its capacity |
//! | `ratelimit_policy_capacity`, `ratelimit_policy_window_seconds`, `ratelimit_policy_shadow` | gauge | `policy`: the limit in force (`q` and `w` of `RateLimit-Policy`) and shadow mode, set when the limiter is built and when live limits are replaced |
//! | `ratelimit_store_connected` | gauge | none: 1 while the store's connection to Redis is open, else 0 (standalone and Sentinel) |
//! | `ratelimit_store_connects_total` | counter | `result` = `ok` / `failed`: attempts to connect to Redis, the first included (standalone and Sentinel) |
//! | `ratelimit_store_resets_total` | counter | `policy`: stores found to have lost the policy's state by [`RateLimiter::notice_reset`](crate::RateLimiter::notice_reset) |
//! | `ratelimit_bans_total` | counter | `policy`, `reason` (`automatic`: refused too often under [`RateLimiterBuilder::ban_after`](crate::rate_limit::RateLimiterBuilder::ban_after), counted by the instance that set the ban; `operator`: [`RateLimiter::ban`](crate::RateLimiter::ban), `PUT /bans`): keys banned |
//! | `ratelimit_delayed_total` | counter | `policy`, `outcome` (`served`: waited for its units, then went on; `abandoned`: went away first, its units given back) | requests over the limit that waited instead of being refused ([`RateLimiterBuilder::delay`](crate::rate_limit::RateLimiterBuilder::delay)) |
//! | `ratelimit_waiting` | gauge | `policy` | requests waiting for their units on this instance now |
//! | `ratelimit_refunds_total` | counter | `policy`, `outcome` = `given` / `nothing` / `failed` |
//! | `ratelimit_upstream_learned_total` | counter | `policy`, `source` = `ratelimit` / `ratelimit-remaining` / `x-ratelimit` / `retry-after` / `429` |
//! | `ratelimit_upstream_waits_total` | counter | `policy` |
//! | `ratelimit_store_latency_seconds` | histogram | `policy` |
//!
//! The latency histogram times the checks that waited for the store, a check that failed or
//! timed out included (at its duration); a store that decides without waiting
//! (`MemoryStore`), the deny cache and unit leases are not timed.
//!
//! Building a limit describes every family to the recorder (`# HELP`) and registers at 0 the
//! series a dashboard reads before anything happened: `allowed` and `denied` (`would_deny`
//! in shadow mode) answered by the store, and by the deny cache and unit leases when they
//! are on, the near-limit counter and the breaker's gauge; the other combinations of
//! `decision` and `source` appear on their first decision. Metric handles are taken from
//! the recorder on a limit's first decision. Install the recorder (e.g.
//! `metrics-exporter-prometheus`) before building the limits: a recorder installed later
//! gets the decisions' counts, but not the descriptions, the series at 0 nor the gauges set
//! at build.

pub use crate::core::{
    report::{
        BANS, BREAKER_OPEN, DECISIONS, DELAYED, KEY_DECISIONS, NEAR_LIMIT, POLICY_CAPACITY,
        POLICY_SHADOW, POLICY_WINDOW, REFUNDS, STORE_ERRORS, STORE_LATENCY, STORE_RESETS,
        UPSTREAM_LEARNED, UPSTREAM_WAITS, WAITING,
    },
    KeyCount, LimiterStats,
};
pub use crate::decision::{Source, Verdict};

/// Metric names: 1 while the store's connection to Redis is open, else 0 (standalone and
/// Sentinel; a Cluster's connections are redis-rs'). One series per process: with several
/// stores (several regions), the last change of any of them.
pub const STORE_CONNECTED: &str = "ratelimit_store_connected";
/// Metric names: attempts to connect to Redis, by `result` (`ok`, `failed`).
pub const STORE_CONNECTS: &str = "ratelimit_store_connects_total";
pub use crate::error::ErrorChain;
