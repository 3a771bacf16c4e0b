//! The limiter inside an axum stack of tower-http layers (`TraceLayer`, `TimeoutLayer`,
//! `SetResponseHeaderLayer`): headers survive the outer layers, and the order of the limiter
//! and a timeout decides what a slow handler or a hung Redis produces.

use std::time::{Duration, Instant};

use crate::servers::RedisServer;
use axum::{body::Body, routing::get, Router};
use http::{HeaderValue, Request, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_http::{set_header::SetResponseHeaderLayer, timeout::TimeoutLayer, trace::TraceLayer};
use tower_redis_ratelimit::{
    FailurePolicy, Gcra, GlobalKey, Quota, RateLimitLayer, RateLimiter, RedisStore,
};

fn routes() -> Router {
    Router::new().route("/", get(|| async { "fast" })).route(
        "/slow",
        get(|| async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            "slow"
        }),
    )
}

fn rate_limit(
    store: RedisStore,
    prefix: &str,
    store_timeout: Duration,
) -> RateLimitLayer<GlobalKey, Gcra> {
    let l: RateLimiter<Gcra> = RateLimiter::builder(store, Gcra::new(Quota::per_hour(5)).unwrap())
        .prefix(prefix)
        .store_timeout(store_timeout)
        .on_store_error(FailurePolicy::Closed)
        .build()
        .unwrap();
    RateLimitLayer::new(l, GlobalKey)
}

fn timeout() -> TimeoutLayer {
    TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, Duration::from_millis(150))
}

async fn send(app: &Router, path: &str) -> (http::Response<Body>, Duration) {
    let started = Instant::now();
    let res = app
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    (res, started.elapsed())
}

/// Timeout outside the limiter: it bounds the limiter's store call too, and its own 408 has
/// no rate-limit headers (the limiter never finished).
fn timeout_outside(store: RedisStore) -> Router {
    routes().layer(
        ServiceBuilder::new()
            .layer(TraceLayer::new_for_http())
            .layer(SetResponseHeaderLayer::overriding(
                http::header::SERVER,
                HeaderValue::from_static("demo"),
            ))
            .layer(timeout())
            .layer(rate_limit(store, "outside", Duration::from_secs(2))),
    )
}

/// Limiter outside the timeout: the timeout bounds only the handler, and the limiter adds its
/// headers to whatever the inner stack answers, the timeout's 408 included.
fn limiter_outside(store: RedisStore) -> Router {
    routes().layer(
        ServiceBuilder::new()
            .layer(TraceLayer::new_for_http())
            .layer(rate_limit(store, "inside", Duration::from_millis(400)))
            .layer(timeout()),
    )
}

#[tokio::test]
async fn headers_survive_and_order_decides_what_a_slow_handler_gets() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    let a = timeout_outside(store.clone());
    let b = limiter_outside(store);

    for app in [&a, &b] {
        let (res, _) = send(app, "/").await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["ratelimit"], "\"default\";r=4;t=720");
        assert!(res.headers().contains_key("ratelimit-policy"));
    }
    assert_eq!(send(&a, "/").await.0.headers()["server"], "demo");

    // A slow handler: both answer 408, but only with the limiter outside does the 408 carry
    // the rate-limit headers; either way the request spent its unit.
    let (res, _) = send(&a, "/slow").await;
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(!res.headers().contains_key("ratelimit"));
    let (res, _) = send(&b, "/slow").await;
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(res.headers()["ratelimit"], "\"default\";r=3;t=1440");
    // The two stacks use separate prefixes, so separate quotas: `a` has spent 3 units so far.
    assert_eq!(
        send(&a, "/").await.0.headers()["ratelimit"],
        "\"default\";r=1;t=2880"
    );
}

#[tokio::test]
async fn order_decides_what_a_hung_redis_gets() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    let a = timeout_outside(store.clone());
    let b = limiter_outside(store);
    assert_eq!(send(&a, "/").await.0.status(), StatusCode::OK);

    redis.signal("-STOP");
    let (res_a, took_a) = send(&a, "/").await;
    let (res_b, took_b) = send(&b, "/").await;
    redis.signal("-CONT");

    // Outer timeout (150 ms) cut the limiter's 2 s store wait short.
    assert_eq!(res_a.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(took_a < Duration::from_secs(2), "{took_a:?}");
    // The inner timeout did not cover the limiter: its own store timeout (400 ms) and
    // failure policy (closed) answered.
    assert_eq!(res_b.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(took_b >= Duration::from_millis(400), "{took_b:?}");
}
