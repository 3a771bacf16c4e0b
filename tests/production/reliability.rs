//! Redis killed, restarted, paused and reloaded under traffic: bounded latency, recovery,
//! the circuit breaker, and each failure policy (open, closed, local share).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::common::counting;
use crate::servers::RedisServer;
use axum::body::Body;
use http::Request;
use tower::{ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    rate_limit::RateLimiterBuilder, redis, store::CircuitBreaker, Error, FailurePolicy, Gcra,
    GlobalKey, Quota, RateLimitLayer, RateLimiter, RedisStore, SlidingWindow, TokenBucket,
};

const TIMEOUT: Duration = Duration::from_millis(150);
/// Generous: it catches a hang, it is not a benchmark.
const MARGIN: Duration = Duration::from_secs(2);

fn limiter(store: RedisStore, quota: Quota, breaker: CircuitBreaker) -> RateLimiter<Gcra> {
    builder(store, quota, breaker).build().unwrap()
}

fn builder(store: RedisStore, quota: Quota, breaker: CircuitBreaker) -> RateLimiterBuilder<Gcra> {
    RateLimiter::builder(store, Gcra::new(quota).unwrap())
        .store_timeout(TIMEOUT)
        .circuit_breaker(breaker)
}

/// Polls `check` until it succeeds; returns how long that took.
async fn time_to_recover(l: &RateLimiter<Gcra>, key: &str) -> Duration {
    let started = Instant::now();
    loop {
        if l.check(key, 1).await.is_ok() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no recovery in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_on_the_same_port_resumes_limiting() {
    let mut redis = RedisServer::start();
    let l = limiter(
        redis.store().await,
        Quota::per_hour(3),
        CircuitBreaker::new(3, Duration::from_millis(200)),
    );
    assert!(l.check("k", 1).await.unwrap().allowed);
    // The same through a bb8 pool (with bb8's check-out PING, which replaces dead connections).
    let pooled = limiter(
        redis.store_with_pool(2).await,
        Quota::per_hour(3),
        CircuitBreaker::disabled(),
    );
    assert!(pooled.check("pooled", 1).await.unwrap().allowed);

    redis.kill();
    assert!(pooled.check("pooled", 1).await.is_err());
    for _ in 0..10 {
        let started = Instant::now();
        let r = l.check("k", 1).await;
        assert!(r.is_err(), "{r:?}");
        assert!(
            started.elapsed() < TIMEOUT + MARGIN,
            "{:?}",
            started.elapsed()
        );
    }
    assert!(l.stats().breaker_opened >= 1, "{:?}", l.stats());

    redis.restart();
    let took = time_to_recover(&l, "probe").await;
    println!("checks resumed {took:?} after Redis accepted connections again");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let took_pooled = time_to_recover(&pooled, "pooled-probe").await;
    println!("bb8 pool: checks resumed after {took_pooled:?}");
    assert!(took_pooled < Duration::from_secs(5), "{took_pooled:?}");
    // The restarted Redis kept no data: the key starts afresh and is limited again.
    for _ in 0..3 {
        assert!(l.check("k", 1).await.unwrap().allowed);
    }
    let d = l.check("k", 1).await.unwrap();
    assert!(!d.allowed, "limiting did not resume: {d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_spares_timeouts_while_redis_hangs() {
    let redis = RedisServer::start();
    let cool_down = Duration::from_millis(300);
    let l = limiter(
        redis.store().await,
        Quota::per_hour(100),
        CircuitBreaker::new(3, cool_down),
    );
    assert!(l.check("k", 1).await.unwrap().allowed);

    redis.signal("-STOP");
    let mut timings = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let r = l.check("k", 1).await;
        timings.push((started.elapsed(), r));
    }
    let stats = l.stats();
    redis.signal("-CONT");

    // The first three wait for the timeout; then the breaker answers at once.
    for (t, r) in &timings[..3] {
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
        assert!(*t >= TIMEOUT && *t < TIMEOUT + MARGIN, "{t:?}");
    }
    for (t, r) in &timings[3..] {
        assert!(matches!(r, Err(Error::CircuitOpen)), "{r:?}");
        assert!(*t < Duration::from_millis(50), "{t:?}");
    }
    assert_eq!(stats.short_circuited, 17);
    assert_eq!(stats.breaker_opened, 1);

    // After the cool-down a probe goes through, succeeds and closes the breaker.
    tokio::time::sleep(cool_down + Duration::from_millis(50)).await;
    let took = time_to_recover(&l, "k2").await;
    assert!(took < Duration::from_secs(5));
    assert!(l.check("k2", 1).await.is_ok());
}

/// Sends `tasks x per_task` requests for one key through `svc` concurrently; returns the
/// status counts and the slowest request.
async fn flood<S>(svc: S, tasks: usize, per_task: usize) -> (Vec<(u16, u64)>, Duration)
where
    S: tower::Service<
            Request<Body>,
            Response = http::Response<tower_redis_ratelimit::rate_limit::ResponseBody<Body>>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let counts: Arc<[AtomicU64; 600]> = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));
    let slowest = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (svc, counts, slowest) = (svc.clone(), counts.clone(), slowest.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..per_task {
                let started = Instant::now();
                let res = svc
                    .clone()
                    .oneshot(Request::get("/").body(Body::empty()).unwrap())
                    .await
                    .unwrap();
                slowest.fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                counts[usize::from(res.status().as_u16())].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let statuses = counts
        .iter()
        .enumerate()
        .filter_map(|(s, n)| {
            let n = n.load(Ordering::Relaxed);
            (n > 0).then_some((s as u16, n))
        })
        .collect();
    (
        statuses,
        Duration::from_micros(slowest.load(Ordering::Relaxed)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_under_load_follows_each_policy() {
    let mut redis = RedisServer::start();
    let store = redis.store().await;
    // 40 a day on one global key, shared by 4 instances: 10 each while Redis is away.
    let quota = Quota::per_day(40);
    let layer = |policy, name| {
        let limiter = builder(
            store.clone(),
            quota,
            CircuitBreaker::new(5, Duration::from_millis(500)),
        )
        .policy_name(name)
        .on_store_error(policy)
        .local_share(4)
        .build()
        .unwrap();
        RateLimitLayer::new(limiter, GlobalKey)
    };
    let open = ServiceBuilder::new()
        .layer(layer(FailurePolicy::Open, "open"))
        .service(counting(Default::default()));
    let closed = ServiceBuilder::new()
        .layer(layer(FailurePolicy::Closed, "closed"))
        .service(counting(Default::default()));
    let local_layer = layer(FailurePolicy::Local, "local");
    let local_limiter = local_layer.limiter().clone();
    let local = ServiceBuilder::new()
        .layer(local_layer)
        .service(counting(Default::default()));

    redis.kill();
    let (s, slowest_open) = flood(open, 16, 20).await;
    assert_eq!(s, [(200, 320)], "open");
    let (s, slowest_closed) = flood(closed, 16, 20).await;
    assert_eq!(s, [(503, 320)], "closed");
    let (s, slowest_local) = flood(local, 16, 20).await;
    assert_eq!(s, [(200, 10), (429, 310)], "local share of 40/4");
    assert_eq!(local_limiter.stats().degraded, 320);
    for slowest in [slowest_open, slowest_closed, slowest_local] {
        assert!(slowest < TIMEOUT + MARGIN, "{slowest:?}");
    }
    println!("slowest request while Redis was down: open {slowest_open:?}, closed {slowest_closed:?}, local {slowest_local:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_and_debug_reload_mid_traffic_cause_no_errors() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    let q = Quota::per_hour(1_000_000);
    let make = |prefix: &str| (prefix.to_owned(), store.clone());
    let errors = Arc::new(AtomicU64::new(0));
    let checks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handles = Vec::new();
    for i in 0..12 {
        let (prefix, store) = make(&format!("mid{}", i % 3));
        let (errors, checks, stop) = (errors.clone(), checks.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            let t = Duration::from_secs(3); // DEBUG RELOAD blocks Redis briefly
            let g = RateLimiter::builder(store.clone(), Gcra::new(q).unwrap())
                .prefix(&prefix)
                .store_timeout(t)
                .build()
                .unwrap();
            let tb = RateLimiter::builder(store.clone(), TokenBucket::new(q).unwrap())
                .prefix(&prefix)
                .store_timeout(t)
                .build()
                .unwrap();
            let sw = RateLimiter::builder(store, SlidingWindow::new(q).unwrap())
                .prefix(&prefix)
                .store_timeout(t)
                .build()
                .unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let key = format!("k{}", n % 50);
                for r in [
                    g.check(&key, 1).await,
                    tb.check(&key, 1).await,
                    sw.check(&key, 1).await,
                ] {
                    checks.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = r {
                        eprintln!("check failed: {e}");
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let mut conn = redis.conn();
    for round in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let cmd = if round % 2 == 0 {
            ("SCRIPT", "FLUSH")
        } else {
            ("DEBUG", "RELOAD")
        };
        let _: () = redis::cmd(cmd.0).arg(cmd.1).query(&mut conn).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.unwrap();
    }
    assert!(
        checks.load(Ordering::Relaxed) > 300,
        "too little traffic to mean anything"
    );
    assert_eq!(errors.load(Ordering::Relaxed), 0);
}

/// More concurrent checks than pooled connections while Redis hangs: the pool is exhausted
/// (each check-out PINGs a stopped server), and still no check waits past the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_pool_with_a_hung_redis_stays_bounded() {
    let redis = RedisServer::start();
    let l = limiter(
        redis.store_with_pool(2).await,
        Quota::per_hour(1_000),
        CircuitBreaker::disabled(),
    );
    assert!(l.check("k", 1).await.unwrap().allowed);
    redis.signal("-STOP");
    let mut handles = Vec::new();
    for i in 0..64 {
        let l = l.clone();
        handles.push(tokio::spawn(async move {
            let started = Instant::now();
            let r = l.check(&format!("k{i}"), 1).await;
            (started.elapsed(), r)
        }));
    }
    let mut slowest = Duration::ZERO;
    for h in handles {
        let (t, r) = h.await.unwrap();
        assert!(r.is_err(), "{r:?}");
        slowest = slowest.max(t);
    }
    redis.signal("-CONT");
    println!("slowest check with an exhausted pool and a hung Redis: {slowest:?}");
    assert!(slowest < TIMEOUT + MARGIN, "{slowest:?}");
    let took = time_to_recover(&l, "after").await;
    assert!(took < Duration::from_secs(5), "{took:?}");
}
