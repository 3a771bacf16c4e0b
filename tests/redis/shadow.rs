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

use crate::common::{counting, each_algorithm, header};
use crate::servers::{each_backend, RedisServer};
use axum::body::Body;
use futures_util::future::join_all;
use http::{Request, Response};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    algorithm::Algorithm,
    store::Store,
    telemetry::{Source, Verdict},
    FailurePolicy, Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter,
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

/// The rate-limit fields a response may get.
const FIELDS: [&str; 6] = [
    "ratelimit",
    "ratelimit-policy",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
];

/// `REQUESTS` concurrent requests for one key, spread over `limiters` (app instances) in
/// shadow mode: every one reaches the inner service and no response gets a rate-limit field,
/// exactly `REQUESTS - LIMIT` are recorded as would-be denials (counted, and the key's count
/// in the instances' top keys), and the state is what enforcing would have left: an
/// enforcing check on the same counters is denied.
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
    for r in &responses {
        for field in FIELDS {
            assert!(
                r.headers().get(field).is_none(),
                "{what}: {field} on a response of a shadow policy: {:?}",
                r.headers()
            );
        }
    }
    let counted: u64 = limiters.iter().map(|l| l.stats().would_deny).sum();
    assert_eq!(
        counted,
        (REQUESTS - LIMIT as usize) as u64,
        "{what}: would-be denials counted"
    );
    assert_eq!(
        limiters.iter().map(|l| l.stats().denied).sum::<u64>(),
        0,
        "{what}"
    );
    let named: u64 = limiters
        .iter()
        .flat_map(|l| l.top_keys(10))
        .map(|c| {
            assert_eq!((c.key.as_str(), c.denied), ("k", 0), "{what}");
            c.would_deny
        })
        .sum();
    assert_eq!(
        named,
        (REQUESTS - LIMIT as usize) as u64,
        "{what}: top keys"
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

/// A ban is enforced whether or not the limit is in shadow mode: a banned key gets 429 with
/// `Retry-After` (counted `denied`, not `would_deny`), on Redis and in memory, while a key
/// over the shadow limit is still served.
#[tokio::test]
async fn a_ban_is_enforced_in_shadow_mode() {
    let redis = RedisServer::start();
    let stores: Vec<(&str, Arc<dyn Store>)> = vec![
        ("redis", Arc::new(redis.store().await)),
        ("memory", Arc::new(MemoryStore::new())),
    ];
    for (what, store) in stores {
        let gcra: Arc<dyn Algorithm> = Arc::new(Gcra::new(Quota::per_hour(1)).unwrap());
        let limiter = shadow(store, gcra, "shadow-ban");
        let calls = Arc::new(AtomicUsize::new(0));
        let svc = ServiceBuilder::new()
            .layer(RateLimitLayer::new(
                limiter.clone(),
                HeaderKey::new("x-key").unwrap(),
            ))
            .service(counting(calls.clone()));
        let call = |key: &'static str| {
            let svc = svc.clone();
            async move {
                let req = Request::builder()
                    .header("x-key", key)
                    .body(Body::empty())
                    .unwrap();
                svc.oneshot(req).await.unwrap()
            }
        };
        for _ in 0..3 {
            assert_eq!(call("over").await.status(), 200, "{what}: shadow limit");
        }
        limiter
            .ban("banned", Duration::from_secs(600))
            .await
            .unwrap();
        for _ in 0..2 {
            let r = call("banned").await;
            assert_eq!(r.status(), 429, "{what}: a ban in shadow mode");
            let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
            assert!((599..=600).contains(&retry), "{what}: {retry}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3, "{what}");
        let stats = limiter.stats();
        assert_eq!((stats.denied, stats.would_deny), (2, 2), "{what}");
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
                limiter.clone(),
                HeaderKey::new("x-key").unwrap(),
            ))
            .service(counting(calls));
        let req = Request::builder()
            .header("x-key", "k")
            .body(Body::empty())
            .unwrap();
        assert_eq!(svc.oneshot(req).await.unwrap().status(), want);
        // Counted once, as the failure policy's answer.
        let stats = limiter.stats();
        let (verdict, other) = match want {
            200 => (Verdict::Allowed, Verdict::Unavailable),
            _ => (Verdict::Unavailable, Verdict::Allowed),
        };
        assert_eq!(
            stats.decisions(verdict, Source::FailurePolicy),
            1,
            "{stats:?}"
        );
        assert_eq!(
            stats.decisions(other, Source::FailurePolicy),
            0,
            "{stats:?}"
        );
        assert_eq!(
            stats.allowed + stats.denied + stats.unavailable,
            1,
            "{stats:?}"
        );
    }
}

/// A shadow policy changes nothing a response carries: the inner service's own
/// `Retry-After` and rate-limit fields stay as they are, allowed or would-be denied.
#[tokio::test]
async fn a_shadow_policy_leaves_the_inner_services_fields_alone() {
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
                    .header("ratelimit", "\"upstream\";r=3")
                    .body(Body::empty())
                    .unwrap(),
            )
        }));
    for _ in 0..3 {
        let req = Request::builder()
            .header("x-key", "k")
            .body(Body::empty())
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), 503);
        let h = res.headers();
        assert_eq!(h.get_all("retry-after").iter().count(), 1, "{h:?}");
        assert_eq!(h["retry-after"], "7");
        assert_eq!(h.get_all("ratelimit").iter().count(), 1, "{h:?}");
        assert_eq!(h["ratelimit"], "\"upstream\";r=3");
        assert!(h.get("ratelimit-policy").is_none(), "{h:?}");
    }
    assert_eq!(limiter.stats().would_deny, 2);
}

/// With `shadow_headers`, a would-be denial's response gets the denial's fields (`r=0`) but
/// never a `Retry-After` of the limiter's: the inner service's own (say, a 503 of its own) is
/// kept.
#[tokio::test]
async fn shadow_headers_show_the_denial_and_keep_the_inner_services_retry_after() {
    let limiter = RateLimiter::builder(
        MemoryStore::new(),
        Arc::new(Gcra::new(Quota::per_hour(1)).unwrap()) as Arc<dyn Algorithm>,
    )
    .prefix("shadow")
    .shadow(true)
    .shadow_headers(true)
    .build()
    .unwrap();
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
    assert_eq!(limiter.stats().would_deny, 1);
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
    assert_eq!(limiter.stats().would_deny, 2);
}
