//! The exact local deny cache: same decisions as asking Redis every time, far fewer calls.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::servers::RedisServer;
use tower_redis_ratelimit::{Gcra, Quota, RateLimiter, RedisStore, SlidingWindow};

fn build<A: tower_redis_ratelimit::algorithm::Algorithm>(
    store: RedisStore,
    a: A,
    prefix: &str,
    cache: usize,
) -> RateLimiter<A> {
    RateLimiter::builder(store, a)
        .prefix(prefix)
        .store_timeout(Duration::from_secs(5))
        .deny_cache(cache)
        .build()
        .unwrap()
}

/// Floods one key from 16 tasks for `secs`; returns (allowed, elapsed).
async fn flood<A: tower_redis_ratelimit::algorithm::Algorithm>(
    l: &RateLimiter<A>,
    secs: u64,
) -> (u64, Duration) {
    let allowed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut handles = Vec::new();
    for _ in 0..16 {
        let (l, allowed) = (l.clone(), allowed.clone());
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                if n.is_multiple_of(32) {
                    tokio::task::yield_now().await; // cached denials never suspend
                }
                if l.check("hot", 1).await.unwrap().allowed {
                    allowed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    (allowed.load(Ordering::Relaxed), started.elapsed())
}

/// With and without the cache, a flooded key admits exactly what the algorithm allows over
/// the same time: the burst plus the refill. The cache never admits more (it only denies) and
/// never fewer (it never denies past the moment Redis would admit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_admissions_with_and_without_the_cache() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    // Burst 5, one unit every 50 ms.
    let q = Quota::per_second(20).burst(5);
    for (name, cached, plain) in [(
        "gcra",
        build(store.clone(), Gcra::new(q).unwrap(), "dc-g", 1_000),
        build(store.clone(), Gcra::new(q).unwrap(), "nc-g", 0),
    )] {
        let (with_cache, t1) = flood(&cached, 2).await;
        let (without, t2) = flood(&plain, 2).await;
        let bound = |t: Duration| 5 + (t.as_secs_f64() * 20.0).floor() as u64;
        println!(
            "{name}: {with_cache} admitted with the cache ({} hits), {without} without; bounds {} and {}",
            cached.stats().deny_cache_hits,
            bound(t1),
            bound(t2)
        );
        assert!(
            with_cache <= bound(t1) + 1,
            "cache admitted too many: {with_cache}"
        );
        assert!(
            with_cache + 2 >= bound(t1),
            "cache denied what Redis would admit: {with_cache}"
        );
        assert!(
            without <= bound(t2) + 1 && without + 2 >= bound(t2),
            "{without}"
        );
        assert!(
            cached.stats().deny_cache_hits > 1_000,
            "the cache was not used"
        );
        assert_eq!(plain.stats().deny_cache_hits, 0);
    }

    // The sliding window too (it only caches a cost-1 denial with nothing left).
    let sw = build(
        store.clone(),
        SlidingWindow::new(Quota::new(10, Duration::from_millis(500))).unwrap(),
        "dc-sw",
        1_000,
    );
    let (admitted, t) = flood(&sw, 2).await;
    let windows = (t.as_millis() as u64).div_ceil(500);
    assert!(admitted <= 10 * windows, "{admitted} in {windows} windows");
    assert!(
        admitted >= 10 * (windows - 1),
        "{admitted} in {windows} windows"
    );
    assert!(sw.stats().deny_cache_hits > 1_000);
}

#[tokio::test]
async fn cached_denials_carry_the_headers_numbers_and_other_costs_ask_redis() {
    let redis = RedisServer::start();
    let l = build(
        redis.store().await,
        Gcra::new(Quota::per_minute(1)).unwrap(),
        "dc-h",
        1_000,
    );
    assert!(l.check("k", 1).await.unwrap().allowed);
    let from_redis = l.check("k", 1).await.unwrap();
    assert!(!from_redis.allowed);
    assert_eq!(l.stats().deny_cache_hits, 0);
    let from_cache = l.check("k", 1).await.unwrap();
    assert_eq!(l.stats().deny_cache_hits, 1);
    assert!(!from_cache.allowed);
    assert_eq!(
        (from_cache.remaining, from_cache.capacity, from_cache.cost),
        (0, 1, 1)
    );
    assert_eq!(from_cache.window, from_redis.window);
    let (r1, r2) = (
        from_redis.retry_after.unwrap(),
        from_cache.retry_after.unwrap(),
    );
    assert!(
        r2 <= r1 && r1 - r2 < Duration::from_secs(1),
        "{r1:?} {r2:?}"
    );
    assert!(from_cache.reset_after <= from_redis.reset_after);
    // Another cost goes to Redis.
    let d = l.check("k", 2).await.unwrap();
    assert!(d.is_never());
    assert_eq!(l.stats().deny_cache_hits, 1);
    // Explicit-time checks never use the cache.
    let _ = l.check_at("k", 1, 1_700_000_000_000_000).await.unwrap();
    assert_eq!(l.stats().deny_cache_hits, 1);
}

/// A tight loop of checks answered without waiting (deny cache, MemoryStore) still lets the
/// runtime run other tasks: on a single-threaded runtime, a timer fires while the loop spins.
#[tokio::test(flavor = "current_thread")]
async fn tight_loops_of_instant_answers_do_not_starve_the_runtime() {
    use std::sync::atomic::AtomicBool;
    let redis = RedisServer::start();
    let cached = build(
        redis.store().await,
        Gcra::new(Quota::per_hour(1)).unwrap(),
        "dc-loop",
        1_000,
    );
    let memory = RateLimiter::new(
        tower_redis_ratelimit::MemoryStore::new(),
        Gcra::new(Quota::per_hour(1)).unwrap(),
    )
    .unwrap();
    for (name, spin) in [("deny cache", cached), ("memory store", memory)] {
        // Through the limiter, then through the layer (which decides such checks in `call`).
        let mut svc = tower::ServiceBuilder::new()
            .layer(tower_redis_ratelimit::RateLimitLayer::new(
                spin.clone(),
                tower_redis_ratelimit::GlobalKey,
            ))
            .service(tower::service_fn(|_req: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
            }));
        for via_layer in [false, true] {
            let fired = Arc::new(AtomicBool::new(false));
            let timer = {
                let fired = fired.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    fired.store(true, Ordering::Relaxed);
                })
            };
            let mut spins = 0u64;
            while !fired.load(Ordering::Relaxed) && spins < 20_000_000 {
                if via_layer {
                    use tower::{Service, ServiceExt};
                    let req = http::Request::new(());
                    let res = svc.ready().await.unwrap().call(req).await.unwrap();
                    // The global key's first request is allowed; the rest are denied.
                    assert!(res.status() == 429 || spins == 0, "{}", res.status());
                } else {
                    spin.check("k", 1).await.unwrap();
                }
                spins += 1;
            }
            assert!(
                fired.load(Ordering::Relaxed),
                "{name} (layer: {via_layer}): the timer never ran in {spins} checks"
            );
            timer.await.unwrap();
        }
    }
}

/// State lost in Redis (here a restart without persistence) frees capacity early; the cache
/// notices within its one-second maximum entry age.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_is_noticed_within_a_second() {
    let mut redis = RedisServer::start();
    let l = build(
        redis.store().await,
        Gcra::new(Quota::per_day(1)).unwrap(),
        "dc-restart",
        1_000,
    );
    assert!(l.check("k", 1).await.unwrap().allowed);
    assert!(!l.check("k", 1).await.unwrap().allowed); // from Redis: a day to wait
    assert!(!l.check("k", 1).await.unwrap().allowed); // from the cache
    redis.restart();
    let started = Instant::now();
    loop {
        if let Ok(d) = l.check("k", 1).await {
            if d.allowed {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still denied after the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        started.elapsed() <= Duration::from_millis(1_500),
        "{:?}",
        started.elapsed()
    );
}

/// Under a delay, a refusal is cached only until a request would wait no longer than the
/// delay (its `retry_after`, the store's wait less the delay): a request then is served late
/// by the store, not refused by the cache, and one before then is refused by the cache.
#[tokio::test]
async fn under_a_delay_a_denial_is_cached_until_its_wait_fits_the_delay() {
    use tower_redis_ratelimit::{rate_limit::Delay, telemetry::Source};
    let redis = RedisServer::start();
    let gcra = Gcra::new(Quota::new(1, Duration::from_secs(2))).unwrap();
    let limiter = RateLimiter::builder(redis.store().await, gcra)
        .store_timeout(Duration::from_secs(5))
        .delay(Delay::up_to(Duration::from_secs(1)))
        .build()
        .unwrap();
    assert!(limiter.check("k", 1).await.unwrap().allowed);
    let refused = limiter.check("k", 1).await.unwrap();
    assert!(!refused.allowed, "{refused:?}");
    let retry = refused.retry_after.unwrap();
    assert!(retry <= Duration::from_secs(1), "{refused:?}");
    let cached = limiter.check("k", 1).await.unwrap();
    assert!(
        !cached.allowed && cached.source == Source::DenyCache,
        "{cached:?}"
    );
    tokio::time::sleep(retry).await;
    let late = limiter.check("k", 1).await.unwrap();
    assert!(late.allowed && late.source == Source::Store, "{late:?}");
    assert!(late.delayed <= Duration::from_secs(1), "{late:?}");
}
