//! Headers and rejections: what a client sees.
//!
//! # The `RateLimit` fields
//!
//! By default ([`HeaderStyle::Ietf`](crate::rate_limit::HeaderStyle::Ietf),
//! draft-ietf-httpapi-ratelimit-headers-10) every response of a limited request carries:
//!
//! ```text
//! RateLimit-Policy: "default";q=100;w=60
//! RateLimit: "default";r=42;t=18
//! ```
//!
//! `q` is the quota (the units a rested key has), `w` the seconds in which the whole quota is
//! restored, `r` the units left, and `t` the seconds until the quota is full again (on an
//! allowed response) or until the denied request can succeed (on a `429`, equal to
//! `Retry-After`). Seconds round up. The item's name is the policy name
//! ([`RateLimiterBuilder::policy_name`](crate::rate_limit::RateLimiterBuilder::policy_name));
//! a [`MultiLimit`](crate::algorithm::MultiLimit) writes one item per limit, and several
//! limiting layers on one route each append theirs.
//! [`HeaderStyle::Legacy`](crate::rate_limit::HeaderStyle::Legacy) sends
//! `X-RateLimit-Limit` / `-Remaining` / `-Reset` (seconds from now) instead,
//! [`Both`](crate::rate_limit::HeaderStyle::Both) both,
//! [`None`](crate::rate_limit::HeaderStyle::None) neither
//! ([`RateLimitLayer::headers`](crate::RateLimitLayer::headers)).
//!
//! A denied request always gets `Retry-After` (whole seconds, at least 1), whatever the
//! style, unless it can never succeed (its cost exceeds the quota: no `t`, no `Retry-After`).
//! [`RateLimitLayer::partition_key`](crate::RateLimitLayer::partition_key) adds the IETF `pk`
//! parameter: a keyed hash of the request's key, so clients sharing an address can tell their
//! quotas apart without the key being revealed.
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_redis_ratelimit::{Gcra, GlobalKey, MemoryStore, Quota, RateLimitLayer, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_minute(2))?)
//!     .policy_name("api")
//!     .build()?;
//! let handler = service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new("ok")) });
//! let app = RateLimitLayer::new(limiter, GlobalKey).layer(handler);
//!
//! let res = app.clone().oneshot(Request::new(())).await?;
//! assert_eq!(res.headers()["ratelimit-policy"], r#""api";q=2;w=60"#);
//! assert_eq!(res.headers()["ratelimit"], r#""api";r=1;t=30"#); // full again in 30 s
//! app.clone().oneshot(Request::new(())).await?;
//! let res = app.clone().oneshot(Request::new(())).await?;
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(res.headers()["ratelimit"], r#""api";r=0;t=30"#); // one unit back in 30 s
//! assert_eq!(res.headers()["retry-after"], "30");
//! # Ok(()) }
//! ```
//!
//! The header names are constants in [`rate_limit::headers`](crate::rate_limit::headers), and
//! [`render`](crate::rate_limit::headers::render) writes a [`Decision`](crate::rate_limit::Decision)'s
//! fields into any header map (for a decision made with `RateLimiter::check`).
//!
//! # Rejections
//!
//! A denied request never reaches the inner service. It gets `429 Too Many Requests` with a
//! plain-text body (`rate limit exceeded`), the rate-limit headers and `Retry-After`; or:
//!
//! - with [`RateLimitLayer::on_limited`](crate::RateLimitLayer::on_limited)`(|decision| response)`,
//!   a response you build, with any body (an axum `IntoResponse`, a `String`,
//!   `Full<Bytes>`…); the rate-limit headers and `Retry-After` are added unless it already
//!   has them;
//! - with [`RateLimitLayer::problem_details`](crate::RateLimitLayer::problem_details), an RFC
//!   9457 `application/problem+json` body of type
//!   [`quota-exceeded`](crate::rate_limit::headers::QUOTA_EXCEEDED) listing the
//!   `violated-policies`;
//! - for gRPC requests (`content-type: application/grpc…`), HTTP 200 with
//!   `grpc-status: 8` (`RESOURCE_EXHAUSTED`) and a `grpc-message`, so tonic clients see
//!   `Code::ResourceExhausted`; the rate-limit fields and `retry-after` are in the
//!   metadata (see *gRPC clients* below).
//!
//! ```
//! use axum::{http::StatusCode, response::IntoResponse};
//! use tower_redis_ratelimit::{Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(60))?)?;
//! let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-api-key")?).on_limited(|d| {
//!     let body = format!(r#"{{"error":"rate_limited","policy":"{}"}}"#, d.policy);
//!     (StatusCode::TOO_MANY_REQUESTS, [("content-type", "application/json")], body)
//!         .into_response()
//! });
//! # let _ = layer;
//! # Ok(()) }
//! ```
//!
//! **gRPC clients.** A gRPC request over its limit is answered `RESOURCE_EXHAUSTED` (HTTP 200,
//! trailers-only) with the wait in three forms: `google.rpc.RetryInfo` in
//! `grpc-status-details-bin`, the standard richer-error detail (tonic:
//! `status.get_details_retry_info()` from `tonic_types::StatusExt`; Go: `status.Details()`;
//! Java: `StatusProto.fromThrowable`), precise to below a millisecond;
//! `grpc-retry-pushback-ms`, which gRPC's built-in retry policies read, in whole milliseconds
//! rounded up; and `retry-after` in seconds with the `RateLimit` fields. A request whose cost
//! exceeds the whole quota gets a pushback of `-1`, which tells retry policies not to retry,
//! and no `RetryInfo`. A concurrency limit's refusal carries no wait (when a permit frees
//! depends on the requests in flight), so the client's own backoff applies. Built-in retries
//! only wait on the pushback when `RESOURCE_EXHAUSTED` is in the service config's
//! `retryableStatusCodes`. `cargo run --example tonic -- --listen 127.0.0.1:50051` serves the
//! example's greeter to try any client against.
//!
//! When the store fails and the policy's [failure policy](super::failure_modes) is
//! `Closed`, the answer is `503 Service Unavailable` with `Retry-After: 1` (gRPC:
//! `UNAVAILABLE`); under `Open`, the request goes through without rate-limit headers.
//!
//! A [concurrency limit](super::operating#concurrency-limits) answers in the same styles,
//! with the IETF quota unit for requests in flight (`RateLimit-Policy:
//! "exports";q=2;qu="concurrent-requests"`, `RateLimit: "exports";r=0`) and no
//! `Retry-After`: a permit frees when one of the key's requests ends, which nothing can
//! predict.
