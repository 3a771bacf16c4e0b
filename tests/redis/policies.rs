//! Policies that cannot trap: each counts apart unless asked to share, one layer mixes
//! algorithms and failure policies, and a configuration that cannot work fails when built,
//! naming the field, instead of panicking, logging or silently falling back.

use std::{
    sync::{atomic::AtomicUsize, Arc},
    time::Duration,
};

use crate::common::counting;
use crate::servers::RedisServer;
use axum::body::Body;
use http::Request;
use tower::{ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    algorithm::{Algorithm, Rule, Scripted},
    rate_limit::Class,
    store::Store,
    FailurePolicy, Gcra, GlobalKey, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter,
    RedisStore, SlidingWindow,
};

/// A general limit and a stricter log-in limit on one store: the log-in limit is not spent by
/// browsing (it was: both counted under `{rl:KEY}`).
async fn policies_count_apart(store: impl Store + Clone) {
    let general = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_minute(100)).unwrap())
        .policy_name("general")
        .build()
        .unwrap();
    let login = RateLimiter::builder(store, Gcra::new(Quota::per_minute(4)).unwrap())
        .policy_name("login")
        .build()
        .unwrap();
    for _ in 0..50 {
        assert!(general.check("203.0.113.7", 1).await.unwrap().allowed);
    }
    let d = login.check("203.0.113.7", 1).await.unwrap();
    assert_eq!((d.allowed, d.remaining, d.capacity), (true, 3, 4));
}

#[tokio::test]
async fn policies_count_apart_in_redis_and_in_memory() {
    let redis = RedisServer::start();
    policies_count_apart(redis.store().await).await;
    policies_count_apart(MemoryStore::new()).await;
}

/// Two limiters left with the default policy name but different quotas would share counters:
/// building the second fails and names the field, on every store kind.
#[tokio::test]
async fn the_same_namespace_with_another_quota_is_a_config_error() {
    let redis = RedisServer::start();
    let stores: [Arc<dyn Store>; 2] = [Arc::new(redis.store().await), Arc::new(MemoryStore::new())];
    for store in stores {
        let _general =
            RateLimiter::new(store.clone(), Gcra::new(Quota::per_minute(100)).unwrap()).unwrap();
        let err = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_minute(4)).unwrap())
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "policy_name");
        assert!(err.reason().contains("rl:default"), "{err}");
        // The same quota is the same policy (e.g. one limiter per layer): fine.
        RateLimiter::builder(store.clone(), Gcra::new(Quota::per_minute(100)).unwrap())
            .build()
            .unwrap();
        // Sharing on purpose: both say so.
        let window = |n| SlidingWindow::new(Quota::per_minute(n)).unwrap();
        let _interactive = RateLimiter::builder(store.clone(), window(300))
            .policy_name("calendar")
            .common_counters()
            .build()
            .unwrap();
        let backfill = RateLimiter::builder(store.clone(), window(150))
            .policy_name("calendar")
            .common_counters()
            .build()
            .unwrap();
        drop(backfill);
        assert!(RateLimiter::builder(store.clone(), window(100))
            .policy_name("calendar")
            .build()
            .is_err());
    }
}

/// A store shared by the app's instances is the point: limiters in other processes (here:
/// other stores on the same Redis) with the same namespace count together.
#[tokio::test]
async fn instances_share_their_policy_through_the_store() {
    let redis = RedisServer::start();
    let a = RateLimiter::new(redis.store().await, Gcra::new(Quota::per_hour(3)).unwrap()).unwrap();
    let b = RateLimiter::new(redis.store().await, Gcra::new(Quota::per_hour(3)).unwrap()).unwrap();
    assert!(a.check("k", 2).await.unwrap().allowed);
    assert_eq!(b.check("k", 1).await.unwrap().remaining, 0);
}

/// One layer: a GCRA default policy (open on Redis errors) and a sliding-window log-in policy
/// (closed on Redis errors). Different algorithms and failure policies per policy; with Redis
/// gone, browsing goes on and log-in is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_layer_mixes_algorithms_and_failure_policies() {
    let mut redis = RedisServer::start();
    let store = redis.store().await;
    let general = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_minute(100)).unwrap())
        .store_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let login = RateLimiter::builder(store, SlidingWindow::new(Quota::per_minute(2)).unwrap())
        .policy_name("login")
        .store_timeout(Duration::from_millis(300))
        .on_store_error(FailurePolicy::Closed)
        .build()
        .unwrap();
    let mut layer = RateLimitLayer::new(general, HeaderKey::new("x-user").unwrap());
    let login = layer.add_policy(login).unwrap();
    let layer = layer.classify(move |parts| match parts.uri.path() {
        "/login" => Class::Policy(login),
        _ => Class::Default,
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(counting(calls.clone()));
    let send_as = |user: &'static str, path: &'static str| {
        let svc = svc.clone();
        async move {
            let req = Request::get(path).header("x-user", user);
            let res = svc.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
            let policy = res
                .headers()
                .get("ratelimit-policy")
                .map(|v| v.to_str().unwrap().to_owned());
            (res.status().as_u16(), policy)
        }
    };
    let send = |path| send_as("a", path);
    assert_eq!(
        send("/").await,
        (200, Some("\"default\";q=100;w=60".to_owned()))
    );
    let statuses = [
        send("/login").await,
        send("/login").await,
        send("/login").await,
    ];
    assert_eq!(
        statuses.clone().map(|(s, _)| s),
        [200, 200, 429],
        "the log-in policy's sliding window"
    );
    assert_eq!(statuses[0].1.as_deref(), Some("\"login\";q=2;w=60"));

    redis.kill();
    // Another user (user a's log-in denial is known to the deny cache, rightly).
    assert_eq!(
        send_as("b", "/").await,
        (200, None),
        "open: through, no headers"
    );
    assert_eq!(send_as("b", "/login").await.0, 503, "closed: refused");
}

/// A custom algorithm with a Lua implementation only: it cannot be divided among instances.
struct Unsplittable;

impl Scripted for Unsplittable {
    fn source(&self) -> &'static str {
        "return { 1, 0, 0, 0 }"
    }
    fn key_suffixes(&self) -> &[&'static str] {
        &[":unsplittable"]
    }
    fn args(&self, cost: u32) -> Vec<u64> {
        vec![u64::from(cost)]
    }
}

impl Algorithm for Unsplittable {
    fn name(&self) -> &'static str {
        "unsplittable"
    }
    fn quota(&self) -> u64 {
        1
    }
    fn window(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn rule(&self) -> Rule<'_> {
        Rule::script(self)
    }
}

/// Configuration that cannot work is an error naming the field when built: no panic
/// (`local_share(0)` panicked), no log line (`Local` on an algorithm without a local share
/// only logged), no shadowing (a duplicate policy name in one layer).
#[tokio::test]
async fn invalid_combinations_are_config_errors() {
    let gcra = || Gcra::new(Quota::per_minute(10)).unwrap();
    let err = RateLimiter::builder(MemoryStore::new(), gcra())
        .on_store_error(FailurePolicy::Local)
        .local_share(0)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "local_share");
    let err = RateLimiter::builder(MemoryStore::new(), Unsplittable)
        .on_store_error(FailurePolicy::Local)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "on_store_error");
    assert!(err.reason().contains("unsplittable"), "{err}");
    // The custom algorithm itself is fine where no local share is needed.
    let redis = RedisServer::start();
    let store: RedisStore = redis.store().await;
    let custom = RateLimiter::builder(store, Unsplittable).build().unwrap();
    assert!(custom.check("k", 1).await.unwrap().allowed);

    let mut layer = RateLimitLayer::new(
        RateLimiter::new(MemoryStore::new(), gcra()).unwrap(),
        GlobalKey,
    );
    let err = layer
        .add_policy(RateLimiter::new(MemoryStore::new(), gcra()).unwrap())
        .unwrap_err();
    assert_eq!(err.field(), "policy_name");
}
