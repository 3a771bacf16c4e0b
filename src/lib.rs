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

pub mod algorithm;
pub mod concurrency;
mod core;
mod decision;
mod error;
pub mod extract;
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
