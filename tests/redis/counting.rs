//! Counting by response status through the layer: only the responses the layer counts spend
//! quota, exactly, under concurrency, on real Redis (standalone, batched, cluster) and in
//! memory, for every algorithm; what happens to a request that never completes; refunds under
//! the local share, with the deny cache, and under a quota given per request.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::common::each_algorithm;
use crate::servers::{dead_redis_url, each_backend};
use axum::body::Body;
use http::{Request, Response, StatusCode};
use tokio::sync::Notify;
use tower::{service_fn, util::BoxCloneService, ServiceExt};
use tower_redis_ratelimit::{
    algorithm::Algorithm, rate_limit::ResponseBody, store::Store, FailurePolicy, Gcra, HeaderKey,
    MemoryStore, Quota, RateLimitLayer, RateLimiter, RedisStore,
};

/// The app under the layer: `401` for requests marked `x-fail`, `200` otherwise, after a
/// short pause so that concurrent requests overlap. Counts the `401`s it gave.
fn app(failures: Arc<AtomicUsize>) -> BoxCloneService<Request<Body>, Response<Body>, Infallible> {
    BoxCloneService::new(service_fn(move |req: Request<Body>| {
        let failures = failures.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let status = if req.headers().contains_key("x-fail") {
                failures.fetch_add(1, Ordering::SeqCst);
                StatusCode::UNAUTHORIZED
            } else {
                StatusCode::OK
            };
            let mut res = Response::new(Body::empty());
            *res.status_mut() = status;
            Ok::<_, Infallible>(res)
        }
    }))
}

type Svc<E> = BoxCloneService<Request<Body>, Response<ResponseBody<Body>>, E>;

fn request(fail: bool) -> Request<Body> {
    let mut req = Request::get("/login").header("x-account", "alice");
    if fail {
        req = req.header("x-fail", "1");
    }
    req.body(Body::empty()).unwrap()
}

/// A parameter of the `RateLimit` field: `r` (remaining) or `t` (reset, seconds).
fn field<B>(res: &Response<B>, param: &str) -> Option<u64> {
    let v = res.headers().get("ratelimit")?.to_str().ok()?;
    let r = v
        .split(';')
        .find_map(|p| p.trim().strip_prefix(param)?.strip_prefix('='))?;
    r.parse().ok()
}

fn remaining<B>(res: &Response<B>) -> Option<u64> {
    field(res, "r")
}

const LIMIT: u32 = 10;

/// Three instances (layers over their own limiters) on `stores`, counting only 401s, with
/// `LIMIT` per hour; returns their services and the count of 401s the app gave.
fn instances(
    stores: Vec<Arc<dyn Store>>,
    algorithm: &Arc<dyn Algorithm>,
    prefix: &str,
) -> (Vec<Svc<Infallible>>, Arc<AtomicUsize>) {
    let failures = Arc::new(AtomicUsize::new(0));
    let services = stores
        .into_iter()
        .map(|store| {
            let limiter = RateLimiter::builder(store, Arc::clone(algorithm))
                .prefix(prefix)
                .store_timeout(Duration::from_secs(5))
                .build()
                .unwrap();
            let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-account").unwrap())
                .count_only("401".parse().unwrap())
                .unwrap();
            BoxCloneService::new(tower::Layer::layer(&layer, app(Arc::clone(&failures))))
        })
        .collect();
    (services, failures)
}

/// Successes (never counted) at a concurrency under the limit, then 64 tasks mixing failures
/// and successes, then failures one by one until refused: the app gives exactly `LIMIT`
/// 401s in all, and no success is ever refused while nothing else is in flight.
async fn exact(services: Vec<Svc<Infallible>>, failures: Arc<AtomicUsize>, label: &str) {
    // 1. Uncounted responses spend nothing: 100 successes, 4 at a time, all served.
    let mut tasks = Vec::new();
    for t in 0..4 {
        let svc = services[t % services.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..25 {
                statuses.push(svc.clone().oneshot(request(false)).await.unwrap().status());
            }
            statuses
        }));
    }
    for t in tasks {
        for s in t.await.unwrap() {
            assert_eq!(s, StatusCode::OK, "{label}: a success was refused");
        }
    }
    // 2. 64 tasks, failures and successes mixed: the counted responses stay within the limit.
    let mut tasks = Vec::new();
    for t in 0..64 {
        let svc = services[t % services.len()].clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..4 {
                let _ = svc
                    .clone()
                    .oneshot(request((t + i) % 2 == 0))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let counted = failures.load(Ordering::SeqCst);
    assert!(
        counted <= LIMIT as usize,
        "{label}: {counted} counted responses under 64 tasks, limit {LIMIT}"
    );
    // 3. Then failures one by one: the rest of the quota, and not one more.
    for i in 0.. {
        let svc = services[i % services.len()].clone();
        let status = svc.oneshot(request(true)).await.unwrap().status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(i < 2 * LIMIT as usize, "{label}: never refused");
    }
    assert_eq!(
        failures.load(Ordering::SeqCst),
        LIMIT as usize,
        "{label}: counted responses in all"
    );
}

#[tokio::test]
async fn only_counted_responses_spend_exactly_on_every_backend_and_algorithm() {
    let quota = Quota::per_hour(LIMIT);
    for backend in each_backend() {
        for (name, algorithm) in each_algorithm(quota) {
            let mut stores: Vec<Arc<dyn Store>> = Vec::new();
            for _ in 0..3 {
                stores.push(Arc::new(backend.store().await));
            }
            let label = format!("{}, {name}", backend.name());
            let (services, failures) = instances(stores, &algorithm, &format!("cnt-{name}"));
            exact(services, failures, &label).await;
        }
    }
}

#[tokio::test]
async fn only_counted_responses_spend_exactly_in_memory() {
    for (name, algorithm) in each_algorithm(Quota::per_hour(LIMIT)) {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let stores = vec![Arc::clone(&store), Arc::clone(&store), store];
        let (services, failures) = instances(stores, &algorithm, "cnt-mem");
        exact(services, failures, &format!("memory, {name}")).await;
    }
}

/// A layer over an app that answers `200` after `delay`, or fails, counting only 401s.
fn slow_layer(limiter: RateLimiter<Gcra>, delay: Duration, fail: bool) -> Svc<&'static str> {
    let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-account").unwrap())
        .count_only("401".parse().unwrap())
        .unwrap();
    BoxCloneService::new(tower::Layer::layer(
        &layer,
        service_fn(move |_req: Request<Body>| async move {
            tokio::time::sleep(delay).await;
            if fail {
                return Err("the app failed");
            }
            Ok(Response::new(Body::empty()))
        }),
    ))
}

/// The same layer over an app that says when a request is inside it (`inside`) and answers
/// `200` once told to (`release`).
fn held_layer(
    limiter: RateLimiter<Gcra>,
    inside: Arc<Notify>,
    release: Arc<Notify>,
) -> Svc<&'static str> {
    let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-account").unwrap())
        .count_only("401".parse().unwrap())
        .unwrap();
    BoxCloneService::new(tower::Layer::layer(
        &layer,
        service_fn(move |_req: Request<Body>| {
            let (inside, release) = (Arc::clone(&inside), Arc::clone(&release));
            async move {
                inside.notify_one();
                release.notified().await;
                Ok(Response::new(Body::empty()))
            }
        }),
    ))
}

#[tokio::test]
async fn a_request_that_never_completes_uncounted_counts() {
    let redis = crate::servers::RedisServer::start();
    let limiter = crate::common::limiter(
        redis.store().await,
        Gcra::new(Quota::per_hour(3)).unwrap(),
        "cnt-drop",
    );
    // Completed with 200: given back.
    let res = slow_layer(limiter.clone(), Duration::ZERO, false)
        .oneshot(request(false))
        .await
        .unwrap();
    assert_eq!(remaining(&res), Some(3), "the header shows the units back");
    assert_eq!(field(&res, "t"), Some(0), "a full quota resets now");
    assert_eq!(limiter.check("alice", 1).await.unwrap().remaining, 2);
    limiter
        .refund("alice", &mut limiter.check("alice", 1).await.unwrap())
        .await
        .unwrap();
    // The client went away while the app worked: counted.
    let call = slow_layer(limiter.clone(), Duration::from_secs(5), false).oneshot(request(false));
    assert!(tokio::time::timeout(Duration::from_millis(200), call)
        .await
        .is_err());
    // The app failed: counted.
    let failed = slow_layer(limiter.clone(), Duration::ZERO, true)
        .oneshot(request(false))
        .await;
    assert!(failed.is_err());
    let d = limiter.check("alice", 1).await.unwrap();
    assert_eq!(
        d.remaining, 0,
        "a dropped request and a failed one count (3 - 1 remaining after the first)"
    );
    assert_eq!(limiter.stats().refunds, 2);
}

#[tokio::test]
async fn a_refund_clears_the_cached_denial_of_its_key() {
    // One unit: a success held in the app holds it; a request meanwhile is denied, and the
    // denial cached; the success is given back, and the next request must not meet the
    // cached denial.
    let redis = crate::servers::RedisServer::start();
    let limiter = RateLimiter::builder(redis.store().await, Gcra::new(Quota::per_hour(1)).unwrap())
        .prefix("cnt-deny")
        .store_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let (inside, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let held = held_layer(limiter.clone(), Arc::clone(&inside), Arc::clone(&release));
    let fast = slow_layer(limiter.clone(), Duration::ZERO, false);
    let holder = tokio::spawn(held.oneshot(request(false)));
    // The holder is in the app: its unit is taken.
    inside.notified().await;
    let denied = fast.clone().oneshot(request(false)).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    release.notify_one();
    assert_eq!(holder.await.unwrap().unwrap().status(), StatusCode::OK);
    let next = fast.oneshot(request(false)).await.unwrap();
    assert_eq!(
        next.status(),
        StatusCode::OK,
        "the cached denial outlived the refund"
    );
    assert!(limiter.stats().deny_cache_hits <= 1);
}

#[tokio::test]
async fn under_the_local_share_units_go_back_to_the_local_share() {
    let store = RedisStore::connect_lazy(&dead_redis_url()).unwrap();
    let limiter = RateLimiter::builder(store, Gcra::new(Quota::per_hour(2)).unwrap())
        .prefix("cnt-local")
        .store_timeout(Duration::from_millis(200))
        .on_store_error(FailurePolicy::Local)
        .build()
        .unwrap();
    let failures = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(limiter.clone(), HeaderKey::new("x-account").unwrap())
        .count_only("401".parse().unwrap())
        .unwrap();
    let svc = tower::Layer::layer(&layer, app(Arc::clone(&failures)));
    for _ in 0..5 {
        let res = svc.clone().oneshot(request(false)).await.unwrap();
        assert_eq!(
            res.status(),
            StatusCode::OK,
            "successes are given back locally"
        );
    }
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            svc.clone()
                .oneshot(request(true))
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [401, 401, 429, 429]);
    assert!(limiter.stats().degraded >= 9);
}

#[tokio::test]
async fn a_quota_given_per_request_is_the_one_refunded() {
    let redis = crate::servers::RedisServer::start();
    let limiter = crate::common::limiter(
        redis.store().await,
        Gcra::new(Quota::per_hour(100)).unwrap(),
        "cnt-quota",
    );
    let failures = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-account").unwrap())
        .quota_fn(|_| Some(Quota::per_hour(3)))
        .count_only("401".parse().unwrap())
        .unwrap();
    let svc = tower::Layer::layer(&layer, app(Arc::clone(&failures)));
    for _ in 0..10 {
        let res = svc.clone().oneshot(request(false)).await.unwrap();
        assert_eq!((res.status(), remaining(&res)), (StatusCode::OK, Some(3)));
    }
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(
            svc.clone()
                .oneshot(request(true))
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [401, 401, 401, 429, 429]);
}
