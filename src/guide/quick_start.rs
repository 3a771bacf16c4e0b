//! Quick start: an axum app limited per client, other frameworks, the limiter without HTTP.
//!
//! ```toml
//! [dependencies]
//! tower-redis-ratelimit = "0.1"
//! ```
//!
//! # An axum app
//!
//! ```no_run
//! use std::{net::SocketAddr, time::Duration};
//! use axum::{routing::get, Router};
//! use tower_redis_ratelimit::{
//!     FailurePolicy, Gcra, PeerIp, Quota, RateLimitLayer, RateLimiter, RedisStore,
//! };
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Fails here, at start-up, if Redis is unreachable, wants a password or fails TLS.
//!     let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//!     // 100 requests a minute per client, bursts of 20. A zero limit, a zero period or a
//!     // zero burst is refused here with an error naming the field.
//!     let limiter = RateLimiter::builder(store, Gcra::new(Quota::per_minute(100).burst(20))?)
//!         .store_timeout(Duration::from_millis(50))
//!         .on_store_error(FailurePolicy::Open)
//!         .build()?;
//!     let app = Router::new()
//!         .route("/", get(|| async { "ok" }))
//!         .layer(RateLimitLayer::new(limiter, PeerIp));
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     // PeerIp reads the peer address axum records with `ConnectInfo`.
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//!     Ok(())
//! }
//! ```
//!
//! A client over its quota gets `429 Too Many Requests` with `Retry-After`; every response
//! carries the IETF `RateLimit-Policy` and `RateLimit` fields (see
//! [Headers and rejections](super::responses)).
//!
//! The pieces:
//! - a **store** holds the counters: [`RedisStore`](crate::RedisStore), shared by every
//!   instance of the app, or [`MemoryStore`](crate::MemoryStore), in this process only;
//! - a **limiter** ([`RateLimiter`](crate::RateLimiter)) decides a key and a cost with an
//!   [algorithm](super::algorithms) in that store. Everything about the store is set on its
//!   builder: the store timeout, the [failure policy](super::failure_modes), the local share,
//!   the prefix and the policy name (which keeps its counters apart from other limiters');
//! - a **layer** ([`RateLimitLayer`](crate::RateLimitLayer)) adds what is about HTTP: the
//!   [key](super::keys) of each request, its cost, the headers, the rejections, and which
//!   [policy](super::operating#several-policies-on-one-layer) a request falls under.
//!
//! # Anywhere a tower service lives
//!
//! The layer wraps any `Service<http::Request<B>>`: `Router::layer`, `tower::ServiceBuilder`,
//! next to tower-http layers, and in front of tonic services. It is `Clone` (its
//! configuration is shared in an `Arc`), its `poll_ready` only forwards to the inner
//! service (the limit depends on the request's key, so the decision is made in `call`), it
//! calls the inner service only for allowed requests, and it never turns a limiter problem
//! into a `500`: its error type is the inner service's.
//!
//! **Order matters** with other layers. A tower-http `TimeoutLayer` *outside* the limiter also
//! bounds the limiter's store call, and its own `408` carries no rate-limit headers; *inside*
//! it bounds only the handler, and the limiter adds its headers to the `408`. Layers outside
//! the limiter (`TraceLayer`, `SetResponseHeaderLayer`, …) see its headers like any others.
//! A request that timed out has still spent its units.
//!
//! ```no_run
//! use std::{net::SocketAddr, time::Duration};
//! use axum::{http::StatusCode, routing::get, Router};
//! use tower::ServiceBuilder;
//! use tower_http::{timeout::TimeoutLayer, trace::TraceLayer};
//! use tower_redis_ratelimit::{Gcra, PeerIp, Quota, RateLimitLayer, RateLimiter, RedisStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let limiter = RateLimiter::new(store, Gcra::new(Quota::per_second(10))?)?;
//! let app = Router::new().route("/", get(|| async { "ok" })).layer(
//!     ServiceBuilder::new()
//!         .layer(TraceLayer::new_for_http())
//!         .layer(RateLimitLayer::new(limiter, PeerIp))
//!         // Inside the limiter: bounds the handler only, and its 408 gets the headers.
//!         .layer(TimeoutLayer::with_status_code(
//!             StatusCode::REQUEST_TIMEOUT,
//!             Duration::from_secs(5),
//!         )),
//! );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! **gRPC.** `tonic::transport::Server::builder().layer(RateLimitLayer::new(limiter, key))`
//! limits a tonic server; a client over its quota gets `Code::ResourceExhausted`, with
//! `retry-after` and the `ratelimit` fields in the response metadata. With the `tonic`
//! feature, [`PeerIp`](crate::PeerIp) reads the peer address tonic records, so a gRPC server
//! can be limited per client IP. The repository's `examples/tonic.rs` is a whole server and
//! client (`cargo run --example tonic`).
//!
//! # The set-up most apps want
//!
//! The repository's `examples/recipe.rs` is one tested file: every route limited per client,
//! by the `x-api-key` header when there is one and else by the client IP
//! (`HeaderKey::new("x-api-key")?.or(ClientIp::new())`), 100 requests a minute in bursts of 20
//! (GCRA, policy `browse`); `POST /login` under a policy of its own, 5 attempts in any minute
//! (a sliding window, policy `login`) that answers `503` rather than let a password-guessing
//! burst through when Redis is away ([`FailurePolicy::Closed`](crate::FailurePolicy::Closed));
//! a JSON `429` body; a `RedisStore` when `REDIS_URL` is set, else a `MemoryStore`
//! (`cargo run --example recipe`). Other examples: `examples/axum.rs` (per IP),
//! `examples/custom_key.rs` (an API-key header, a cost per route, a JSON rejection body),
//! the gateway (`gateway/` in the repository, whose `src/main.rs` doc header lists every flag).
//!
//! # Without HTTP
//!
//! The same limiter decides a key and a cost directly, e.g. for a background job that
//! throttles its own calls to a third-party API. `check` takes text (`&str`, `String`), an
//! `IpAddr`, a `u64` or a [`Key`](crate::extract::Key).
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{MemoryStore, Quota, RateLimiter, SlidingWindow};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new(); // a RedisStore to share the quota between processes
//! let backfill = RateLimiter::builder(store, SlidingWindow::new(Quota::per_minute(150))?)
//!     .policy_name("gmail-backfill")
//!     .build()?;
//! let d = backfill.check("user-7f3a", 5).await?; // this operation costs 5 units
//! assert!(d.allowed);
//! assert_eq!((d.capacity, d.remaining), (150, 145));
//! if !d.allowed {
//!     // `retry_after`: when the same call can succeed; `None` if the cost can never fit.
//!     tokio::time::sleep(d.retry_after.unwrap_or(Duration::from_secs(60))).await;
//! }
//! # Ok(()) }
//! ```
//!
//! A client that should *wait* for its quota rather than be refused is the
//! [outbound throttle](super::throttle).
//!
//! # Which store
//!
//! - [`RedisStore`](crate::RedisStore) whenever more than one process serves the same
//!   clients: every instance shares one counter per key, so the limit holds however many
//!   run. One server, a Sentinel-managed primary or a Cluster, over TLS or not (see
//!   [Production Redis](super::production_redis)). Redis 5 or later.
//! - [`MemoryStore`](crate::MemoryStore) for a single instance, development and tests: the
//!   same decisions, integer for integer, as the Redis scripts, in this process. Its memory
//!   is bounded (see [Failure modes](super::failure_modes#bounded-memory)).
//!
//! A store is passed to a builder by value (`impl Store`), or shared and chosen at run time
//! as an `Arc<dyn Store>` (see [`Store`](crate::store::Store)); clones of a store share its
//! counters. A concurrency limiter takes a [`SlotStore`](crate::store::SlotStore) and an
//! adaptive throttle an [`UpstreamStore`](crate::store::UpstreamStore): a `RedisStore`, a
//! `MemoryStore`, or an `Arc<dyn SlotStore>` / `Arc<dyn UpstreamStore>` when chosen at run
//! time.
