//! Shadow (dry-run) mode: a policy that decides and reports everything but never rejects.
//! Exact across several limiters on one store (standalone Redis, batched, a cluster, and in
//! memory), for every algorithm; store failures never reject; the headers say what would
//! have happened without a `Retry-After`.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::common::{counting, each_algorithm};
use crate::servers::{each_backend, RedisServer};
use axum::body::Body;
use futures_util::future::join_all;
use http::{Request, Response};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    algorithm::Algorithm, store::Store, FailurePolicy, Gcra, HeaderKey, MemoryStore, Quota,
    RateLimitLayer, RateLimiter,
};

const LIMIT: u32 = 5;
const REQUESTS: usize = 40;

fn shadow(
    store: impl Store,
    algorithm: Arc<dyn Algorithm>,
    prefix: &str,
) -> RateLimiter<Arc<dyn Algorithm>> {
    RateLimiter::builder(store, algorithm)
        .prefix(prefix)
        .store_timeout(Duration::from_secs(5))
        .shadow(true)
        .build()
        .unwrap()
}

/// `REQUESTS` concurrent requests for one key, spread over `limiters` (app instances) in
/// shadow mode: every one reaches the inner service, exactly `REQUESTS - LIMIT` are recorded
/// as would-be denials (counted and with `r=0` in their headers, no `Retry-After`), and the
/// state is what enforcing would have left: an enforcing check on the same counters is
/// denied.
async fn exact(
    limiters: Vec<RateLimiter<Arc<dyn Algorithm>>>,
    enforcing: RateLimiter<Arc<dyn Algorithm>>,
    what: &str,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let services: Vec<_> = limiters
        .iter()
        .map(|l| {
            ServiceBuilder::new()
                .layer(RateLimitLayer::new(
                    l.clone(),
                    HeaderKey::new("x-key").unwrap(),
                ))
                .service(counting(calls.clone()))
        })
        .collect();
    let responses = join_all((0..REQUESTS).map(|i| {
        let svc = services[i % services.len()].clone();
        async move {
            let req = Request::builder()
                .header("x-key", "k")
                .body(Body::empty())
                .unwrap();
            svc.oneshot(req).await.unwrap()
        }
    }))
    .await;
    assert!(
        responses.iter().all(|r| r.status() == 200),
        "{what}: a shadow policy rejected"
    );
    assert_eq!(calls.load(Ordering::SeqCst), REQUESTS, "{what}");
    let would_deny = responses
        .iter()
        .filter(|r| {
            let h = r.headers().get("ratelimit").unwrap().to_str().unwrap();
            h.contains(";r=0;")
        })
        .count();
    assert!(
        responses
            .iter()
            .all(|r| r.headers().get("retry-after").is_none()),
        "{what}: Retry-After on a served response"
    );
    let counted: u64 = limiters.iter().map(|l| l.stats().shadow_denials).sum();
    assert_eq!(
        counted,
        (REQUESTS - LIMIT as usize) as u64,
        "{what}: would-be denials counted"
    );
    // A would-be denial spends nothing, so its headers say r=0; the last allowed one too.
    assert!(
        would_deny >= REQUESTS - LIMIT as usize,
        "{what}: {would_deny} responses with r=0"
    );
    let d = enforcing.check("k", 1).await.unwrap();
    assert!(
        !d.allowed,
        "{what}: shadow mode did not spend what enforcing would have"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_is_exact_and_never_rejects_on_every_store_and_algorithm() {
    for backend in each_backend() {
        for (name, algorithm) in each_algorithm(Quota::per_hour(LIMIT)) {
            let prefix = format!("shadow-{name}");
            let mut limiters = Vec::new();
            for _ in 0..3 {
                limiters.push(shadow(backend.store().await, algorithm.clone(), &prefix));
            }
            let enforcing = RateLimiter::builder(backend.store().await, algorithm.clone())
                .prefix(&prefix)
                .deny_cache(0)
                .build()
                .unwrap();
            exact(limiters, enforcing, &format!("{} {name}", backend.name())).await;
        }
    }
    for (name, algorithm) in each_algorithm(Quota::per_hour(LIMIT)) {
        let store = MemoryStore::new();
        let limiters = (0..3)
            .map(|_| shadow(store.clone(), algorithm.clone(), "shadow"))
            .collect();
        let enforcing = RateLimiter::builder(store, algorithm)
            .prefix("shadow")
            .build()
            .unwrap();
        exact(limiters, enforcing, &format!("memory {name}")).await;
    }
}

/// A shadow policy whose store is gone lets requests through even under `Closed`; the same
/// policy enforcing answers 503.
#[tokio::test]
async fn store_failures_never_reject_in_shadow_mode() {
    let mut redis = RedisServer::start();
    let store = redis.store().await;
    let quota = Quota::per_minute(100);
    let build = |shadow: bool, name: &str| {
        RateLimiter::builder(store.clone(), Gcra::new(quota).unwrap())
            .policy_name(name)
            .store_timeout(Duration::from_millis(200))
            .on_store_error(FailurePolicy::Closed)
            .shadow(shadow)
            .build()
            .unwrap()
    };
    let (trial, enforced) = (build(true, "trial"), build(false, "enforced"));
    redis.kill();
    for (limiter, want) in [(trial, 200), (enforced, 503)] {
        let calls = Arc::new(AtomicUsize::new(0));
        let svc = ServiceBuilder::new()
            .layer(RateLimitLayer::new(
                limiter,
                HeaderKey::new("x-key").unwrap(),
            ))
            .service(counting(calls));
        let req = Request::builder()
            .header("x-key", "k")
            .body(Body::empty())
            .unwrap();
        assert_eq!(svc.oneshot(req).await.unwrap().status(), want);
    }
}

/// The inner service's own `Retry-After` (say, a 503 of its own) is kept on a response a
/// shadow denial let through.
#[tokio::test]
async fn the_inner_services_retry_after_is_kept() {
    let limiter = shadow(
        MemoryStore::new(),
        Arc::new(Gcra::new(Quota::per_hour(1)).unwrap()),
        "shadow",
    );
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            limiter.clone(),
            HeaderKey::new("x-key").unwrap(),
        ))
        .service(service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(503)
                    .header("retry-after", "7")
                    .body(Body::empty())
                    .unwrap(),
            )
        }));
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let req = Request::builder()
            .header("x-key", "k")
            .body(Body::empty())
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        statuses.push((
            res.status().as_u16(),
            res.headers()["retry-after"].to_str().unwrap().to_owned(),
            res.headers()["ratelimit"].to_str().unwrap().to_owned(),
        ));
    }
    assert_eq!(statuses[0].1, "7");
    assert_eq!(statuses[1].1, "7", "{statuses:?}");
    assert!(statuses[1].2.contains(";r=0;"), "{statuses:?}");
    assert_eq!(limiter.stats().shadow_denials, 1);
}

/// A `ThrottleLayer` on a shadow limiter never waits nor fails: each denial is counted and
/// the call goes out at once (an enforcing throttle with this `max_wait` fails the second
/// call).
#[tokio::test]
async fn a_throttle_in_shadow_mode_never_waits() {
    let limiter = shadow(
        MemoryStore::new(),
        Arc::new(Gcra::new(Quota::per_hour(1)).unwrap()),
        "throttle",
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(
            tower_redis_ratelimit::throttle::ThrottleLayer::new(
                limiter.clone(),
                HeaderKey::new("x-key").unwrap(),
            )
            .max_wait(Duration::from_millis(1))
            .unwrap(),
        )
        .service(counting(calls.clone()));
    for _ in 0..3 {
        let req = Request::builder()
            .header("x-key", "k")
            .body(Body::empty())
            .unwrap();
        svc.clone().oneshot(req).await.unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(limiter.stats().shadow_denials, 2);
}
