//! Checks per second and latency of `RateLimiter::check`, per algorithm and store, against a
//! `redis-server` this program starts on a free loopback port (and stops by PID).
//!
//! ```text
//! cargo bench --bench throughput                      # 3 rounds x 3 s per contender, 64 tasks
//! BENCH_SECS=5 BENCH_ROUNDS=5 BENCH_TASKS=64 cargo bench --bench throughput
//! ```
//!
//! Contenders are interleaved round by round so that machine noise hits them alike; the table
//! gives the median round and the min-max range. Workloads: `hot` (one key, far over its limit)
//! and `spread` (keys drawn from 100,000 ids, nearly all allowed).

#[path = "../tests/common/mod.rs"]
mod common;

use common::limiter;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use tower_redis_ratelimit::{
    Algorithm, Gcra, MemoryStore, Quota, RateLimiter, SlidingWindow, TokenBucket,
};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Round {
    checks_per_sec: f64,
    allowed_fraction: f64,
    p50_us: u64,
    p99_us: u64,
}

#[derive(Clone, Copy)]
enum Workload {
    Hot,
    Spread,
}

async fn round<A: Algorithm>(
    limiter: &RateLimiter<A>,
    workload: Workload,
    tasks: u64,
    secs: u64,
) -> Round {
    let stop = Arc::new(AtomicBool::new(false));
    let allowed = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (limiter, stop, allowed) = (limiter.clone(), stop.clone(), allowed.clone());
        handles.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new(3).unwrap();
            let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ t;
            let mut key = String::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                if n.is_multiple_of(64) {
                    // An in-memory check never suspends: let the timer and the other tasks run.
                    tokio::task::yield_now().await;
                }
                key.clear();
                match workload {
                    Workload::Hot => key.push_str("hot"),
                    Workload::Spread => {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        key.push_str(&format!("id{}", rng % 100_000));
                    }
                }
                let started = Instant::now();
                let d = limiter.check(&key, 1).await.expect("check failed");
                hist.record(started.elapsed().as_micros() as u64).unwrap();
                if d.allowed {
                    allowed.fetch_add(1, Ordering::Relaxed);
                }
            }
            hist
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::<u64>::new(3).unwrap();
    for h in handles {
        hist.add(h.await.unwrap()).unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    Round {
        checks_per_sec: hist.len() as f64 / elapsed,
        allowed_fraction: allowed.load(Ordering::Relaxed) as f64 / hist.len().max(1) as f64,
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
    }
}

type Contender = (String, Box<dyn Fn(Workload, u64, u64) -> RoundFuture>);
type RoundFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Round>>>;

fn contender<A: Algorithm>(name: &str, limiter: RateLimiter<A>) -> Contender {
    (
        name.to_owned(),
        Box::new(move |w, tasks, secs| {
            let limiter = limiter.clone();
            Box::pin(async move { round(&limiter, w, tasks, secs).await })
        }),
    )
}

#[tokio::main]
async fn main() {
    let secs = env("BENCH_SECS", 3);
    let rounds = env("BENCH_ROUNDS", 3);
    let tasks = env("BENCH_TASKS", 64);
    let redis = common::RedisServer::start();
    let version: String = tower_redis_ratelimit::redis::cmd("INFO")
        .arg("server")
        .query::<String>(&mut redis.conn())
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:").map(str::to_owned))
        .unwrap_or_default();
    let store = redis.store().await;
    // 100 per second per key, burst 100: the hot key is far over its limit, spread keys are not.
    let q = Quota::per_second(100);
    let contenders = [
        contender(
            "redis gcra",
            limiter(store.clone(), Gcra::new(q).unwrap(), "b-g"),
        ),
        contender(
            "redis token-bucket",
            limiter(store.clone(), TokenBucket::new(q).unwrap(), "b-tb"),
        ),
        contender(
            "redis sliding-window",
            limiter(store.clone(), SlidingWindow::new(q).unwrap(), "b-sw"),
        ),
        contender(
            "memory gcra",
            limiter(MemoryStore::new(), Gcra::new(q).unwrap(), "m-g"),
        ),
        contender(
            "memory sliding-window",
            limiter(MemoryStore::new(), SlidingWindow::new(q).unwrap(), "m-sw"),
        ),
    ];
    println!(
        "redis {version}, {tasks} tasks, {rounds} rounds x {secs} s, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("| contender | workload | checks/s median (min-max) | p50 µs | p99 µs | allowed |");
    println!("|---|---|---:|---:|---:|---:|");
    for (wname, workload) in [("hot", Workload::Hot), ("spread", Workload::Spread)] {
        let mut results: Vec<Vec<Round>> = contenders.iter().map(|_| Vec::new()).collect();
        for _ in 0..rounds {
            for (i, (_, run)) in contenders.iter().enumerate() {
                results[i].push(run(workload, tasks, secs).await);
            }
        }
        for ((name, _), mut rs) in contenders.iter().zip(results) {
            rs.sort_by(|a, b| a.checks_per_sec.total_cmp(&b.checks_per_sec));
            let mid = &rs[rs.len() / 2];
            println!(
                "| {name} | {wname} | {:.0} ({:.0}-{:.0}) | {} | {} | {:.3} |",
                mid.checks_per_sec,
                rs[0].checks_per_sec,
                rs[rs.len() - 1].checks_per_sec,
                mid.p50_us,
                mid.p99_us,
                mid.allowed_fraction
            );
        }
    }
}
