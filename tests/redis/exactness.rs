//! Exactness under concurrency, on standalone Redis and on Redis Cluster: 8 independent stores (own pools, like 8 gateway instances)
//! x 64 tasks each x 2,000 checks per task on one key with negligible refill admit exactly the burst.
//!
//! `EXACTNESS_CHECKS_PER_TASK` lowers the per-task count for quick local runs.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::servers::{each_backend, Backend};
use tower_redis_ratelimit::{
    algorithm::{Algorithm, MultiLimit},
    Gcra, Quota, RateLimiter, SlidingWindow, TokenBucket,
};

const INSTANCES: usize = 8;
const TASKS_PER_INSTANCE: usize = 64;
const BURST: u32 = 100;

/// 2,000 per task on standalone Redis; 500 on the cluster, whose client is slower per check
/// on these 2-core machines (still 256,000 checks, 2,560 times the burst, per algorithm).
/// `EXACTNESS_CHECKS_PER_TASK` sets both.
fn checks_per_task(backend: &Backend) -> u64 {
    std::env::var("EXACTNESS_CHECKS_PER_TASK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(match backend {
            Backend::Standalone(_) | Backend::Batched(_) => 2_000,
            Backend::Cluster(_) => 500,
        })
}

/// Runs the flood and returns one of the limiters, for a final look at the state.
async fn exactly_burst<A: Algorithm + Clone>(
    redis: &Backend,
    name: &str,
    algorithm: A,
) -> RateLimiter<A> {
    eprintln!("{name} on {}", redis.name());
    let allowed = Arc::new(AtomicU64::new(0));
    let denied = Arc::new(AtomicU64::new(0));
    let checks = checks_per_task(redis);
    let mut tasks = Vec::new();
    let mut last = None;
    for _ in 0..INSTANCES {
        let limiter = RateLimiter::builder(redis.store().await, algorithm.clone())
            .prefix(name)
            .store_timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        last = Some(limiter.clone());
        for _ in 0..TASKS_PER_INSTANCE {
            let (limiter, allowed, denied) = (limiter.clone(), allowed.clone(), denied.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..checks {
                    let d = limiter.check("hot-key", 1).await.expect("check failed");
                    let counter = if d.allowed { &allowed } else { &denied };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = (INSTANCES * TASKS_PER_INSTANCE) as u64 * checks;
    assert_eq!(
        allowed.load(Ordering::Relaxed),
        u64::from(BURST),
        "{name} on {}: allowed count",
        redis.name()
    );
    assert_eq!(
        allowed.load(Ordering::Relaxed) + denied.load(Ordering::Relaxed),
        total
    );
    last.unwrap()
}

// One unit a day: the refill during the test is nil.
fn quota() -> Quota {
    Quota::per_day(1).burst(BURST)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_admits_exactly_the_burst() {
    for backend in each_backend() {
        exactly_burst(&backend, "ex-gcra", Gcra::new(quota()).unwrap()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_admits_exactly_the_burst() {
    for backend in each_backend() {
        exactly_burst(&backend, "ex-tb", TokenBucket::new(quota()).unwrap()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_admits_exactly_the_limit() {
    for backend in each_backend() {
        exactly_burst(
            &backend,
            "ex-sw",
            SlidingWindow::new(Quota::per_day(BURST)).unwrap(),
        )
        .await;
    }
}

/// Two limits decided together: the tighter one admits exactly its burst, and the denials
/// took nothing from the looser one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_limit_admits_exactly_the_tighter_burst_and_denials_take_nothing() {
    let limits = MultiLimit::new([
        ("tight", quota()),
        ("loose", Quota::per_day(1).burst(BURST + 50)),
    ])
    .unwrap();
    for backend in each_backend() {
        let limiter = exactly_burst(&backend, "ex-multi", limits.clone()).await;
        let d = limiter.check("hot-key", 1).await.unwrap();
        assert!(!d.allowed);
        assert_eq!(
            d.limits[1].remaining, 50,
            "denied checks consumed from the looser limit"
        );
    }
}
