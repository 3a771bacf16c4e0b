//! Distributed rate limiting as a [tower] middleware, on Redis.
//!
//! [`RateLimitLayer`] takes a key from each request ([`PeerIp`], [`ClientIp`], [`HeaderKey`],
//! [`GlobalKey`] or any closure), decides it with one atomic Lua script in Redis
//! ([`Gcra`], [`TokenBucket`] or [`SlidingWindow`], with a per-request cost), and answers with
//! IETF `RateLimit` headers, or `429` / gRPC `RESOURCE_EXHAUSTED` when the key is over its
//! limit. Every instance behind a load balancer shares one authoritative counter, so the limit
//! holds however many instances run. Time comes from the Redis server, so skewed app clocks do
//! not matter. Redis can be one server, a Sentinel-managed primary or a Cluster, over TLS or
//! not; without Redis, [`MemoryStore`] makes the same decisions in this process.
//!
//! ```no_run
//! use std::{net::SocketAddr, time::Duration};
//! use axum::{routing::get, Router};
//! use tower_redis_ratelimit::{
//!     FailurePolicy, Gcra, PeerIp, Quota, RateLimitLayer, RateLimiter, RedisStore,
//! };
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let limiter = RateLimiter::builder(store, Gcra::new(Quota::per_minute(100).burst(20))?)
//!     .store_timeout(Duration::from_millis(50))
//!     .on_store_error(FailurePolicy::Open)
//!     .build()?;
//! let app = Router::new()
//!     .route("/", get(|| async { "ok" }))
//!     .layer(RateLimitLayer::new(limiter, PeerIp));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! Without HTTP, [`RateLimiter::check`] decides a key and cost directly, e.g. for a job that
//! throttles its own calls to a third-party API:
//!
//! ```
//! use tower_redis_ratelimit::{MemoryStore, Quota, RateLimiter, SlidingWindow};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = RateLimiter::new(MemoryStore::new(), SlidingWindow::new(Quota::per_minute(150))?)?;
//! let d = limiter.check("mailbox-7f3a", 5).await?; // this call costs 5 units
//! assert!(d.allowed && d.remaining == 145);
//! # Ok(()) }
//! ```
//!
//! # The guide
//!
//! The [`guide`] holds the long form, chapter by chapter:
//! [quick start](guide::quick_start), [choosing an algorithm](guide::algorithms),
//! [keys](guide::keys), [headers and rejections](guide::responses),
//! [failure modes](guide::failure_modes), [production Redis](guide::production_redis),
//! [operating the limiter](guide::operating), [the outbound throttle](guide::throttle) and
//! [testing with the manual clock](guide::testing).
//!
//! # Where things are
//!
//! | module | holds |
//! |---|---|
//! | [`rate_limit`] | [`RateLimiter`] and its builder, [`RateLimitLayer`] and its service, [`Decision`](rate_limit::Decision), policies and classes, counting by status, unit leases, header styles and the header constants, the operators' console (`admin`, feature `admin`) |
//! | [`concurrency`] | per-key limits of requests in flight: [`ConcurrencyLimiter`](concurrency::ConcurrencyLimiter), [`ConcurrencyLimitLayer`](concurrency::ConcurrencyLimitLayer), [`Permit`](concurrency::Permit) |
//! | [`throttle`] | the outbound throttle, [`ThrottleLayer`](throttle::ThrottleLayer), and reading an upstream's limits |
//! | [`store`] | [`RedisStore`] (connecting, TLS, Sentinel, Cluster, batching, connect errors), [`MemoryStore`] and its manual clock, [`FailurePolicy`], the circuit breaker, error scopes |
//! | [`extract`] | [`KeyExtractor`], [`Key`](extract::Key), the built-in extractors and combinators |
//! | [`algorithm`] | [`Quota`], the algorithms, several limits at once, custom algorithms |
//! | [`telemetry`] | [`LimiterStats`](telemetry::LimiterStats) and the metric names |
//!
//! Errors: a configuration that cannot work is a [`ConfigError`] naming the field, found when
//! a limiter, layer or store is built; a check that could not be decided is an [`Error`],
//! whose [scope](Error::scope) says whether the whole store, the key or the check is at fault.
//! [`redis`] is re-exported so that connections you build yourself match the crate's version.
//!
//! # Cargo features
//!
//! | feature | default | adds |
//! |---|---|---|
//! | `tls` | yes | `rediss://` for standalone, Sentinel and Cluster, with rustls and its `ring` provider chosen by the crate; a private CA and client certificates as [`RedisStoreBuilder`](store::redis::RedisStoreBuilder) options |
//! | `axum` | yes | [`PeerIp`] reads axum's `ConnectInfo<SocketAddr>` |
//! | `tonic` | no | [`PeerIp`] reads tonic's `TcpConnectInfo` |
//! | `config` | no | `rate_limit::file`: limits from a TOML file for [live limits](RateLimitLayer::live), errors naming the line and the field |
//! | `metrics` | yes | counters and a store-latency histogram through the `metrics` facade (see [the guide](guide::operating#what-the-limiter-reports)) |
//! | `serde` | no | `Serialize` on [`LimiterStats`](telemetry::LimiterStats) and [`KeyCount`](telemetry::KeyCount) |
//! | `admin` | no | `rate_limit::admin::Admin`: the operators' console as an axum router to mount beside an app's routes (turns on `axum` and `serde`) |
//!
//! A feature only adds behaviour: every item and trait has the same shape with any set of
//! features. Without `tls`, a `rediss://` URL is a [`ConfigError`] naming `url`. Rust 1.88 or
//! later; Redis 5.0 or later, or Valkey: `scripts/compat` runs the Redis-backed suites on
//! Redis 5.0.7, 6.2.14 and Valkey 9.1.2, CI on Redis 7.0; TLS needs a server built with it
//! (Redis 6.0 or later; checked on 7.0).
//!
//! [tower]: https://docs.rs/tower
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, rust_2018_idioms, unreachable_pub)]
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc)]

pub mod algorithm;
pub mod concurrency;
mod core;
mod decision;
mod error;
pub mod extract;
pub mod guide;
mod http;
mod quota;
pub mod rate_limit;
pub mod store;
pub mod telemetry;
pub mod throttle;
mod unique_id;

pub use algorithm::{Gcra, Quota, SlidingWindow, TokenBucket};
pub use error::{ConfigError, Error};
pub use extract::{ClientIp, GlobalKey, HeaderKey, KeyExtractor, PeerIp};
pub use rate_limit::{RateLimitLayer, RateLimiter};
pub use store::{memory::MemoryStore, redis::RedisStore, FailurePolicy};

/// The Redis client this crate is built on, so that connections you build yourself
/// ([`RedisStore::from_connection`], [`RedisStore::from_cluster`]) match its version.
pub use redis;
