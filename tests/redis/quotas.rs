//! Quotas decided per request: `RateLimiter::check_with_quota` and `RateLimitLayer::quota_fn`.
//! Each key admits exactly its own quota across several limiters, on standalone Redis (with
//! and without batching), a cluster and in memory, for every algorithm; a quota changed
//! mid-window does what the README says for each algorithm, the same in Redis and in
//! memory; a bad quota is an error (direct) or the configured quota (layer), never a panic
//! and never unlimited.

use std::{sync::Arc, time::Duration};

use crate::common::{each_algorithm, limiter};
use crate::servers::{each_backend, RedisServer};
use axum::body::Body;
use futures_util::future::join_all;
use http::Request;
use tower::{ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    algorithm::{Algorithm, MultiLimit},
    extract::Key,
    store::memory::ManualClock,
    store::Store,
    Error, Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter, SlidingWindow,
};

const PLANS: [(&str, u32); 3] = [("free", 3), ("team", 7), ("pro", 12)];

/// 20 concurrent checks per key, spread over the limiters: each key admits exactly its own
/// quota.
async fn each_key_admits_its_own_quota(limiters: &[RateLimiter<Arc<dyn Algorithm>>], what: &str) {
    let checks = PLANS
        .iter()
        .flat_map(|&(key, n)| (0..20).map(move |i| (key, n, i)));
    let results = join_all(checks.map(|(key, n, i)| {
        let l = limiters[i % limiters.len()].clone();
        async move {
            (
                key,
                l.check_with_quota(key, 1, Quota::per_hour(n))
                    .await
                    .unwrap(),
            )
        }
    }))
    .await;
    for (key, n) in PLANS {
        let allowed = results
            .iter()
            .filter(|(k, d)| *k == key && d.allowed)
            .count();
        assert_eq!(allowed, n as usize, "{what}: key {key}");
        assert!(results
            .iter()
            .filter(|(k, _)| *k == key)
            .all(|(_, d)| d.capacity == u64::from(n)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_admits_exactly_its_own_quota_everywhere() {
    for backend in each_backend() {
        for (name, algorithm) in each_algorithm(Quota::per_hour(2)) {
            let prefix = format!("quota-{name}");
            let mut limiters = Vec::new();
            for _ in 0..3 {
                limiters.push(limiter(backend.store().await, algorithm.clone(), &prefix));
            }
            each_key_admits_its_own_quota(&limiters, &format!("{} {name}", backend.name())).await;
        }
    }
    for (name, algorithm) in each_algorithm(Quota::per_hour(2)) {
        let store = MemoryStore::new();
        let limiters: Vec<_> = (0..3)
            .map(|_| limiter(store.clone(), algorithm.clone(), "quota"))
            .collect();
        each_key_admits_its_own_quota(&limiters, &format!("memory {name}")).await;
    }
}

/// Spends 5 of a quota of 10 an hour, then asks under `after`: how many more are allowed.
async fn allowed_after_change(l: &RateLimiter<Arc<dyn Algorithm>>, key: &str, after: Quota) -> u32 {
    let before = Quota::per_hour(10);
    for _ in 0..5 {
        assert!(l.check_with_quota(key, 1, before).await.unwrap().allowed);
    }
    let mut allowed = 0;
    for _ in 0..30 {
        if l.check_with_quota(key, 1, after).await.unwrap().allowed {
            allowed += 1;
        }
    }
    allowed
}

/// What an upgrade (to 20 an hour) and a downgrade (to 4 an hour) after spending half of 10
/// does, per algorithm, the same in Redis and in memory:
/// - GCRA keeps its usage as time (half the period used: half the new quota left);
/// - the token bucket keeps its tokens (5 left, at most the new burst);
/// - the sliding window keeps its log (5 spent in the window, counted against the new limit).
#[tokio::test]
async fn a_quota_changed_mid_window_does_what_the_docs_say() {
    let redis = RedisServer::start();
    let expected = [
        ("gcra", 10, 2),
        ("token-bucket", 5, 4),
        ("sliding-window", 15, 0),
    ];
    for (name, algorithm) in each_algorithm(Quota::per_hour(2)) {
        let (_, up, down) = expected.iter().find(|(n, _, _)| *n == name).unwrap();
        let stores: [(&str, Arc<dyn Store>); 2] = [
            ("redis", Arc::new(redis.store().await)),
            (
                "memory",
                Arc::new(
                    MemoryStore::builder()
                        .clock(ManualClock::new())
                        .build()
                        .unwrap(),
                ),
            ),
        ];
        for (store_name, store) in stores {
            let l = limiter(store, algorithm.clone(), &format!("change-{name}"));
            let got_up = allowed_after_change(&l, "up", Quota::per_hour(20)).await;
            let got_down = allowed_after_change(&l, "down", Quota::per_hour(4)).await;
            assert_eq!(
                (got_up, got_down),
                (*up, *down),
                "{name} in {store_name}: (upgrade, downgrade)"
            );
        }
    }
}

/// A denial cached under one quota does not answer for another: an upgrade is allowed at
/// once although the key was just denied (and denials under the old quota stay cached).
#[tokio::test]
async fn a_cached_denial_does_not_outlive_an_upgrade() {
    let redis = RedisServer::start();
    // A sliding window keeps what was spent as such: 3 spent leaves 97 of 100.
    let l = limiter(
        redis.store().await,
        Arc::new(SlidingWindow::new(Quota::per_hour(2)).unwrap()),
        "cache",
    );
    let small = Quota::per_hour(3);
    for _ in 0..3 {
        assert!(l.check_with_quota("k", 1, small).await.unwrap().allowed);
    }
    assert!(!l.check_with_quota("k", 1, small).await.unwrap().allowed);
    assert!(!l.check_with_quota("k", 1, small).await.unwrap().allowed);
    let hits = l.stats().deny_cache_hits;
    assert!(hits >= 1, "the denial was not cached");
    assert!(
        l.check_with_quota("k", 1, Quota::per_hour(100))
            .await
            .unwrap()
            .allowed
    );
}

#[tokio::test]
async fn a_bad_quota_is_an_error_and_spends_nothing() {
    let redis = RedisServer::start();
    let l = limiter(
        redis.store().await,
        Arc::new(SlidingWindow::new(Quota::per_hour(2)).unwrap()),
        "bad",
    );
    for (quota, field) in [
        (Quota::per_hour(0), "quota.limit"),
        (Quota::new(5, Duration::ZERO), "quota.period"),
        (Quota::per_hour(5).burst(9), "quota.burst"),
    ] {
        match l.check_with_quota("k", 1, quota).await {
            Err(Error::Config(e)) => assert_eq!(e.field(), field, "{quota:?}"),
            other => panic!("{quota:?}: {other:?}"),
        }
    }
    // Nothing was spent: the configured quota is whole.
    assert_eq!(l.check("k", 1).await.unwrap().remaining, 1);
    // An algorithm with several quotas takes none per request.
    let multi = RateLimiter::builder(
        MemoryStore::new(),
        MultiLimit::new([("s", Quota::per_second(1)), ("m", Quota::per_minute(10))]).unwrap(),
    )
    .build()
    .unwrap();
    match multi.check_with_quota("k", 1, Quota::per_hour(5)).await {
        Err(Error::Config(e)) => assert_eq!(e.field(), "quota"),
        other => panic!("{other:?}"),
    }
}

/// Through the layer: plans by API key; an unknown key gets the configured quota, and a plan
/// that cannot be used falls back to it too (never unlimited).
#[tokio::test]
async fn the_layer_applies_a_quota_per_request() {
    let redis = RedisServer::start();
    for store in [
        Arc::new(redis.store().await) as Arc<dyn Store>,
        Arc::new(MemoryStore::new()),
    ] {
        let l = RateLimiter::new(store, Gcra::new(Quota::per_hour(2)).unwrap()).unwrap();
        let svc = ServiceBuilder::new()
            .layer(
                RateLimitLayer::new(l, HeaderKey::new("x-api-key").unwrap()).quota_fn(|parts| {
                    match parts.headers.get("x-api-key")?.as_bytes() {
                        b"gold" => Some(Quota::per_hour(5)),
                        b"broken" => Some(Quota::per_hour(0)),
                        _ => None,
                    }
                }),
            )
            .service(crate::common::counting(Default::default()));
        for (key, want, q) in [
            ("gold", 5, "q=5"),
            ("plain", 2, "q=2"),
            ("broken", 2, "q=2"),
        ] {
            let mut allowed = 0;
            for _ in 0..8 {
                let req = Request::get("/")
                    .header("x-api-key", key)
                    .body(Body::empty())
                    .unwrap();
                let res = svc.clone().oneshot(req).await.unwrap();
                let policy = res.headers()["ratelimit-policy"]
                    .to_str()
                    .unwrap()
                    .to_owned();
                assert!(policy.contains(q), "{key}: {policy}");
                allowed += usize::from(res.status() == 200);
            }
            assert_eq!(allowed, want, "{key}");
        }
    }
}

/// No key can spell another key's cached denial under a quota: an unquoted key made of
/// `v`, a NUL, `q` and the quota's tag bytes (the quota's tag written after the key, as a
/// naive cache key would join them) is denied and cached, and `v` under that quota is still
/// allowed.
#[tokio::test]
async fn a_key_cannot_spell_the_cached_denial_of_another_key_and_quota() {
    let redis = RedisServer::start();
    let l = limiter(
        redis.store().await,
        Arc::new(Gcra::new(Quota::per_hour(1)).unwrap()),
        "spell",
    );
    let mut attack = b"v\0q".to_vec();
    for n in [5u64, 1_000_000, 5] {
        attack.extend_from_slice(&n.to_le_bytes());
    }
    assert!(
        l.check(Key::bytes(attack.clone()), 1)
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !l.check(Key::bytes(attack.clone()), 1)
            .await
            .unwrap()
            .allowed
    );
    assert!(!l.check(Key::bytes(attack), 1).await.unwrap().allowed);
    assert!(l.stats().deny_cache_hits >= 1);
    let d = l
        .check_with_quota("v", 1, Quota::per_second(5))
        .await
        .unwrap();
    assert!(d.allowed, "{d:?}");
}
