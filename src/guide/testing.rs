//! Testing with the manual clock: tests of your own limits that never sleep.
//!
//! A [`MemoryStore`](crate::MemoryStore) on a [`ManualClock`](crate::store::memory::ManualClock)
//! decides on a time that moves only when the test says, with the same decisions as Redis.
//! The clock starts at the wall-clock time it was made (so reset times look real) and stands
//! still until [`advance`](crate::store::memory::ManualClock::advance) moves it; clones share
//! one time. Here is the whole test of an axum app's limit, headers included:
//!
//! ```
//! use std::time::Duration;
//! use axum::{body::Body, http::{Request, StatusCode}, routing::get, Router};
//! use tower::ServiceExt;
//! use tower_redis_ratelimit::{
//!     store::memory::ManualClock, Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new();
//! let store = MemoryStore::builder().clock(clock.clone()).build()?;
//! let limiter = RateLimiter::new(store, Gcra::new(Quota::per_minute(3))?)?;
//! let app = Router::new()
//!     .route("/", get(|| async { "ok" }))
//!     .layer(RateLimitLayer::new(limiter, HeaderKey::new("x-api-key")?));
//! let get = |app: Router| async move {
//!     let req = Request::get("/").header("x-api-key", "k-1").body(Body::empty()).unwrap();
//!     app.oneshot(req).await.unwrap()
//! };
//!
//! for _ in 0..3 {
//!     assert_eq!(get(app.clone()).await.status(), StatusCode::OK);
//! }
//! let denied = get(app.clone()).await;
//! assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(denied.headers()["retry-after"], "20"); // one unit every 20 s
//! clock.advance(Duration::from_secs(20)); // one unit back
//! assert_eq!(get(app.clone()).await.status(), StatusCode::OK);
//! assert_eq!(get(app).await.status(), StatusCode::TOO_MANY_REQUESTS);
//! # Ok(()) }
//! ```
//!
//! - Limiters built on such a store keep no [deny cache](super::operating#the-deny-cache):
//!   its deadlines are in real time.
//! - [Concurrency permits](super::operating#concurrency-limits) expire on the manual clock:
//!   advance it by the time to live to see a crashed holder's permits come back.
//! - The clock is the store's, not tokio's: `tokio::time::pause` does not move it. A
//!   [`ThrottleLayer`](crate::throttle::ThrottleLayer) on such a store (its limiter's, or the
//!   adaptive one) waits on the manual clock, its maximum wait counted on it:
//!   [`ManualClock::sleepers`](crate::store::memory::ManualClock::sleepers) says how many
//!   calls wait, so a test advances the clock once they all do (see the
//!   [outbound guide](super::throttle#testing-without-waiting)).
//! - A [`ManualClock::starting_at`](crate::store::memory::ManualClock::starting_at) a fixed
//!   time makes every reset time in a test reproducible.
//!
//! # Explicit times against Redis
//!
//! [`RateLimiter::check_at`](crate::RateLimiter::check_at) and
//! [`refund_at`](crate::RateLimiter::refund_at) decide at an explicit time (microseconds since
//! the Unix epoch) instead of the store's clock, in Redis too: for simulations and for tests
//! that replay a sequence of arrivals against a real server. They skip the deny cache, unit
//! leases and the local share. Redis still expires keys on its own clock, so keep simulated
//! periods far longer than the test's real run time; and never use them in production, where
//! every instance must use the store's clock.
//!
//! ```
//! use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(1))?)?;
//! let t0 = 1_700_000_000_000_000; // µs since the epoch
//! assert!(limiter.check_at("k", 1, t0).await?.allowed);
//! assert!(!limiter.check_at("k", 1, t0 + 500_000).await?.allowed);
//! assert!(limiter.check_at("k", 1, t0 + 1_000_000).await?.allowed);
//! # Ok(()) }
//! ```
//!
//! To test against a real Redis, start a `redis-server` on a free loopback port for the
//! test and give each test its own [prefix](crate::rate_limit::RateLimiterBuilder::prefix),
//! so tests running at once never share counters and none needs `FLUSHDB`.
