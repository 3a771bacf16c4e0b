//! Testing your own limits without sleeping: an axum app on a `MemoryStore` whose time is a
//! `ManualClock`, driven with `tower::ServiceExt::oneshot`. This is the example the README
//! points to.

use std::time::Duration;

use axum::{body::Body, routing::get, Router};
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_redis_ratelimit::{
    store::memory::ManualClock, Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter,
    SlidingWindow, TokenBucket,
};

/// The app under test: 3 requests a minute per API key.
fn app(store: MemoryStore) -> Router {
    let limiter = RateLimiter::new(store, Gcra::new(Quota::per_minute(3)).unwrap()).unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(
            limiter,
            HeaderKey::new("x-api-key").unwrap(),
        ))
}

async fn status(app: &Router, key: &str) -> StatusCode {
    let req = Request::get("/")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

#[tokio::test]
async fn a_limit_is_tested_without_sleeping() {
    let clock = ManualClock::new();
    let app = app(MemoryStore::builder().clock(clock.clone()).build().unwrap());

    for _ in 0..3 {
        assert_eq!(status(&app, "alice").await, StatusCode::OK);
    }
    assert_eq!(status(&app, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    // Still denied a hair before one unit comes back (every 20 s)...
    clock.advance(Duration::from_millis(19_999));
    assert_eq!(status(&app, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    // ...and allowed once it has, though no real time passed (no deny cache in the way).
    clock.advance(Duration::from_millis(1));
    assert_eq!(status(&app, "alice").await, StatusCode::OK);
    assert_eq!(status(&app, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    // A minute later the whole quota is back.
    clock.advance(Duration::from_secs(60));
    for _ in 0..3 {
        assert_eq!(status(&app, "alice").await, StatusCode::OK);
    }
}

/// The headers count on the manual clock too: `t` is the seconds left on it.
#[tokio::test]
async fn headers_follow_the_manual_clock() {
    let clock = ManualClock::new();
    let app = app(MemoryStore::builder().clock(clock.clone()).build().unwrap());
    for _ in 0..3 {
        status(&app, "bob").await;
    }
    let req = Request::get("/")
        .header("x-api-key", "bob")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.headers()["retry-after"], "20");
    clock.advance(Duration::from_secs(15));
    let req = Request::get("/")
        .header("x-api-key", "bob")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.headers()["retry-after"], "5");
}

/// Every algorithm runs on the manual clock: a sliding window forgets a request exactly one
/// window later, a token bucket refills at its rate.
#[tokio::test]
async fn every_algorithm_follows_the_manual_clock() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let window = RateLimiter::builder(
        store.clone(),
        SlidingWindow::new(Quota::per_minute(2)).unwrap(),
    )
    .policy_name("window")
    .build()
    .unwrap();
    let bucket = RateLimiter::builder(store, TokenBucket::new(Quota::per_minute(2)).unwrap())
        .policy_name("bucket")
        .build()
        .unwrap();
    for l in [&window] {
        assert!(l.check("k", 1).await.unwrap().allowed);
        clock.advance(Duration::from_secs(10));
        assert!(l.check("k", 1).await.unwrap().allowed);
        assert!(!l.check("k", 1).await.unwrap().allowed);
        // The first request leaves the window 60 s after it was made.
        clock.advance(Duration::from_secs(49));
        assert!(!l.check("k", 1).await.unwrap().allowed);
        clock.advance(Duration::from_secs(1));
        assert!(l.check("k", 1).await.unwrap().allowed);
    }
    assert!(bucket.check("k", 2).await.unwrap().allowed);
    assert!(!bucket.check("k", 1).await.unwrap().allowed);
    clock.advance(Duration::from_secs(30));
    assert!(bucket.check("k", 1).await.unwrap().allowed);
    assert!(!bucket.check("k", 1).await.unwrap().allowed);
}
