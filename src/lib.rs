//! Distributed rate limiting as a [tower] middleware, on Redis.
//!
//! [`RateLimitLayer`] takes a key from each request ([`PeerIp`], [`ClientIp`], [`HeaderKey`],
//! [`GlobalKey`] or any closure), decides it with one atomic Lua script in Redis
//! ([`Gcra`], [`TokenBucket`] or [`SlidingWindow`], with a per-request cost), and answers with
//! IETF `RateLimit` headers, or `429` / gRPC `RESOURCE_EXHAUSTED` when the key is over its
//! limit. Every instance behind a load balancer shares one authoritative counter, so the limit
//! holds however many instances run. Time comes from the Redis server, so skewed app clocks do
//! not matter.
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
//! throttles its own calls to a third-party API. [`MemoryStore`] makes the same decisions in
//! process, for single-instance apps, development and tests.
//!
//! [tower]: https://docs.rs/tower
#![forbid(unsafe_code)]
#![warn(missing_docs, rust_2018_idioms, unreachable_pub)]

mod algorithm;
pub mod concurrency;
mod core;
mod decision;
mod error;
mod extract;
mod http;
mod quota;
mod rate_limit;
mod store;
pub mod telemetry;
pub mod throttle;
mod unique_id;

pub use algorithm::{
    Algorithm, BucketRate, Gcra, MemoryState, MultiLimit, Outcome, PartInfo, PartOutcome, Rule,
    Scripted, SlidingWindow, TokenBucket, WindowRate,
};
pub use concurrency::{
    ConcurrencyLimit, ConcurrencyLimitLayer, ConcurrencyLimiter, ConcurrencyLimiterBuilder, Permit,
};
pub use core::{CircuitBreaker, FailurePolicy, LimiterStats, UnitLease};
pub use decision::{Charge, Decision, LimitState};
pub use error::{ConfigError, ConnectError, ConnectErrorKind, Error, ErrorScope};
pub use extract::{
    key_fn, ClientIp, GlobalKey, HeaderKey, Key, KeyExtractor, KeyFn, MissingKey, Or, PeerIp,
    ProxyHeader,
};
pub use http::{BoxError, HeaderStyle, ResponseBody};
pub use quota::Quota;
pub use rate_limit::{
    headers, Class, PolicyId, RateLimit, RateLimitLayer, RateLimiter, RateLimiterBuilder,
    ResponseFuture, StatusSet,
};
pub use store::{
    redis::{Batching, RedisStore, RedisStoreBuilder, DEFAULT_CONNECT_TIMEOUT},
    Learned, ManualClock, MemoryStore, MemoryStoreBuilder, Store,
};
pub use throttle::{Throttle, ThrottleError, ThrottleLayer};

// The crates whose types appear in this API, so users can name matching versions.
pub use bb8;
pub use bb8_redis;

pub use redis;
