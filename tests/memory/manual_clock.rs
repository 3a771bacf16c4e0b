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

/// A fixed window counts from the window of the clock a request falls in and answers with its
/// end: a calendar month's requests come back on the first of the next month (UTC), and the
/// headers count down to it.
#[tokio::test]
async fn a_calendar_month_ends_on_the_first_of_the_next() {
    use tower_redis_ratelimit::algorithm::{Calendar, FixedWindow};
    // 2024-02-28T12:00:00Z: February of a leap year has a day left and a half.
    const FEB_28_NOON: u64 = 1_709_121_600;
    let clock = ManualClock::starting_at(Duration::from_secs(FEB_28_NOON));
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let monthly = FixedWindow::calendar(Calendar::Month, 2).unwrap();
    let limiter = RateLimiter::new(store, monthly).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(
            limiter,
            HeaderKey::new("x-api-key").unwrap(),
        ));
    let get = || {
        Request::get("/")
            .header("x-api-key", "carol")
            .body(Body::empty())
            .unwrap()
    };
    let first = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // 36 hours to March 1st, 00:00 UTC; the policy states a 30-day month.
    assert_eq!(first.headers()["ratelimit"], "\"default\";r=1;t=129600");
    assert_eq!(
        first.headers()["ratelimit-policy"],
        "\"default\";q=2;w=2592000"
    );
    assert_eq!(
        app.clone().oneshot(get()).await.unwrap().status(),
        StatusCode::OK
    );
    let refused = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "129600");
    // A second before midnight: still February.
    clock.advance(Duration::from_secs(129_599));
    let refused = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    // March: a fresh window of 31 days.
    clock.advance(Duration::from_secs(1));
    let march = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(march.status(), StatusCode::OK);
    assert_eq!(march.headers()["ratelimit"], "\"default\";r=1;t=2678400");
}
