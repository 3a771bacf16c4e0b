//! Store failures: script cache loss, a dead Redis, a paused Redis, foreign data. The layer
//! applies its failure policy within the store timeout and never answers 500.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::common::counting;
use crate::servers::{dead_redis_url, RedisServer};
use axum::body::Body;
use http::{Request, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    redis, store::redis::ConnectErrorKind, Error, FailurePolicy, Gcra, GlobalKey, Quota,
    RateLimitLayer, RateLimiter, RedisStore, SlidingWindow, TokenBucket,
};

const TIMEOUT: Duration = Duration::from_millis(200);
/// Generous: a bound that catches a hang, not a benchmark.
const MARGIN: Duration = Duration::from_secs(2);

#[tokio::test]
async fn script_flush_between_checks_changes_nothing() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    let mut conn = redis.conn();
    let q = Quota::per_hour(3);
    let g = RateLimiter::builder(store.clone(), Gcra::new(q).unwrap())
        .prefix("f1")
        .build()
        .unwrap();
    let tb = RateLimiter::builder(store.clone(), TokenBucket::new(q).unwrap())
        .prefix("f2")
        .build()
        .unwrap();
    let sw = RateLimiter::builder(store, SlidingWindow::new(q).unwrap())
        .prefix("f3")
        .build()
        .unwrap();
    for round in 0..4 {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
        let expect_allowed = round < 3;
        assert_eq!(g.check("k", 1).await.unwrap().allowed, expect_allowed);
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
        assert_eq!(tb.check("k", 1).await.unwrap().allowed, expect_allowed);
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
        assert_eq!(sw.check("k", 1).await.unwrap().allowed, expect_allowed);
    }
}

fn limiter(store: RedisStore, policy: FailurePolicy) -> RateLimiter<Gcra> {
    RateLimiter::builder(store, Gcra::new(Quota::per_second(1)).unwrap())
        .store_timeout(TIMEOUT)
        .on_store_error(policy)
        .build()
        .unwrap()
}

/// Sends one request through a layer with `policy`; returns status, grpc-status and time taken.
async fn one_request(
    store: RedisStore,
    policy: FailurePolicy,
    grpc: bool,
) -> (StatusCode, Option<String>, bool, Duration) {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter(store, policy), GlobalKey))
        .service(counting(calls.clone()));
    let mut req = Request::get("/").body(Body::empty()).unwrap();
    if grpc {
        req.headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
    }
    let started = Instant::now();
    let res = svc.oneshot(req).await.unwrap();
    let elapsed = started.elapsed();
    assert!(
        !res.headers().contains_key("ratelimit"),
        "a failed check must not invent rate-limit numbers"
    );
    let grpc_status = res
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    (
        res.status(),
        grpc_status,
        calls.load(Ordering::SeqCst) == 1,
        elapsed,
    )
}

#[tokio::test]
async fn dead_redis_follows_the_failure_policy_within_the_timeout() {
    let url = dead_redis_url();
    // `connect` fails loudly at start-up...
    let err = RedisStore::connect(&url).await.unwrap_err();
    assert!(
        matches!(&err, Error::Connect(e) if e.kind() == ConnectErrorKind::Unreachable),
        "{err:?}"
    );
    // ...while a lazily connected store meets the dead server on each request.
    let store = RedisStore::connect_lazy(&url).unwrap();

    let (status, _, called, elapsed) = one_request(store.clone(), FailurePolicy::Open, false).await;
    assert_eq!((status, called), (StatusCode::OK, true));
    assert!(elapsed < TIMEOUT + MARGIN, "{elapsed:?}");

    let (status, _, called, elapsed) =
        one_request(store.clone(), FailurePolicy::Closed, false).await;
    assert_eq!((status, called), (StatusCode::SERVICE_UNAVAILABLE, false));
    assert!(elapsed < TIMEOUT + MARGIN, "{elapsed:?}");

    let (status, grpc, called, _) = one_request(store, FailurePolicy::Closed, true).await;
    assert_eq!(
        (status, grpc.as_deref(), called),
        (StatusCode::OK, Some("14"), false)
    );
}

#[tokio::test]
async fn paused_redis_times_out_and_then_recovers() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    let l = limiter(store.clone(), FailurePolicy::Open);
    assert!(l.check("k", 1).await.unwrap().allowed);

    let signal = |sig: &str| redis.signal(sig);
    signal("-STOP");
    let started = Instant::now();
    let result = l.check("k2", 1).await;
    let elapsed = started.elapsed();
    let open = one_request(store.clone(), FailurePolicy::Open, false).await;
    let closed = one_request(store.clone(), FailurePolicy::Closed, false).await;
    signal("-CONT");

    assert!(
        matches!(result, Err(Error::Timeout(t)) if t == TIMEOUT),
        "{result:?}"
    );
    assert!(
        elapsed >= TIMEOUT && elapsed < TIMEOUT + MARGIN,
        "{elapsed:?}"
    );
    assert_eq!((open.0, open.2), (StatusCode::OK, true));
    assert_eq!(
        (closed.0, closed.2),
        (StatusCode::SERVICE_UNAVAILABLE, false)
    );
    assert!(open.3 < TIMEOUT + MARGIN && closed.3 < TIMEOUT + MARGIN);

    // Once Redis runs again, checks decide again (k2's queued check may have landed).
    let d = l.check("k3", 1).await.expect("no recovery after SIGCONT");
    assert!(d.allowed);
    assert!(!l.check("k3", 1).await.unwrap().allowed);
}

#[tokio::test]
async fn foreign_data_under_a_key_follows_the_policy() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    let mut conn = redis.conn();
    // The global key's GCRA state replaced by a list: WRONGTYPE.
    let _: () = redis::cmd("RPUSH")
        .arg("{rl:default:global}:g")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let (status, _, called, _) = one_request(store.clone(), FailurePolicy::Closed, false).await;
    assert_eq!((status, called), (StatusCode::SERVICE_UNAVAILABLE, false));
    let (status, _, called, _) = one_request(store.clone(), FailurePolicy::Open, false).await;
    assert_eq!((status, called), (StatusCode::OK, true));
    // Redis is up: deciding locally would hide the problem, so `Local` rejects like `Closed`.
    let (status, _, called, _) = one_request(store, FailurePolicy::Local, false).await;
    assert_eq!((status, called), (StatusCode::SERVICE_UNAVAILABLE, false));
}
