//! Settling through the layer, as it is built: a layer settles only policies that can settle
//! (a built-in single-quota algorithm, charges not taken from unit leases), refused otherwise
//! with an error naming the method; the `Usage` handle's future is `Send` (a handler may spawn
//! it). The settlements themselves are tested over HTTP in `tests/redis/usage.rs`, on Redis
//! and in memory.

use std::{sync::Arc, time::Duration};

use http::HeaderName;
use tower_redis_ratelimit::{
    algorithm::{Algorithm, MultiLimit},
    rate_limit::{Settled, UnitLease, Usage},
    Error, Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter,
};

fn usage_header() -> HeaderName {
    HeaderName::from_static("x-usage")
}

fn layer<A: Algorithm>(limiter: RateLimiter<A>) -> RateLimitLayer<HeaderKey, A> {
    RateLimitLayer::new(limiter, HeaderKey::new("x-api-key").unwrap())
}

#[test]
fn a_policy_that_cannot_settle_is_refused_naming_the_method() {
    let q = Quota::per_minute(10);
    let multi = MultiLimit::new([("minute", q), ("day", Quota::per_day(100))]).unwrap();
    let multi = RateLimiter::new(MemoryStore::new(), multi).unwrap();
    let e = layer(multi.clone())
        .settle_from_header(usage_header())
        .unwrap_err();
    assert_eq!(e.field(), "settle_from_header");
    assert!(e.to_string().contains("cannot settle"), "{e}");
    let e = layer(multi).settle_from_handle().unwrap_err();
    assert_eq!(e.field(), "settle_from_handle");

    let leased = RateLimiter::builder(MemoryStore::new(), Gcra::new(q).unwrap())
        .lease(UnitLease::up_to(Duration::from_millis(50)))
        .build()
        .unwrap();
    let e = layer(leased)
        .settle_from_header(usage_header())
        .unwrap_err();
    assert!(e.to_string().contains("unit leases"), "{e}");

    // A policy added after the layer settles is held to the same rule.
    let gcra = RateLimiter::new(MemoryStore::new(), Gcra::new(q).unwrap()).unwrap();
    let mut settling = layer(gcra).settle_from_header(usage_header()).unwrap();
    let multi = MultiLimit::new([("minute", q)]).unwrap();
    let multi = RateLimiter::builder(MemoryStore::new(), multi)
        .policy_name("multi")
        .build()
        .unwrap();
    let e = settling.add_policy(multi).unwrap_err();
    assert_eq!(e.field(), "settle_from_header");
    let ok = RateLimiter::builder(MemoryStore::new(), Arc::new(Gcra::new(q).unwrap()))
        .policy_name("other")
        .build()
        .unwrap();
    assert!(settling.add_policy(ok).is_ok());
}

/// Compiles only while a handle's settlement is a `Send + 'static` future.
fn spawn_settlement(usage: Usage) -> tokio::task::JoinHandle<Result<Settled, Error>> {
    tokio::spawn(async move { usage.settle(1).await })
}

#[test]
fn a_handles_settlement_can_be_spawned() {
    let _: fn(Usage) -> _ = spawn_settlement;
}
