//! Checks per second, latency and Redis commands per check, against a `redis-server` this
//! program starts on a free loopback port (and stops by PID). Contenders: the raw GCRA script
//! through redis-rs (the ceiling), `RateLimiter::check` and the full layer on the default
//! multiplexed connection, the same check through a bb8 pool with and without its check-out
//! `PING`, the other algorithms, a check followed by the refund of what it took, and
//! `MemoryStore`; and a concurrency limit's acquire + release pair (`ConcurrencyLimiter`), on
//! Redis and in memory (a "check" there is one pair, or one refused acquire).
//!
//! ```text
//! cargo bench --bench throughput                      # 3 rounds x 3 s per contender, 64 tasks
//! BENCH_SECS=5 BENCH_ROUNDS=5 BENCH_TASKS=64 cargo bench --bench throughput
//! ```
//!
//! Contenders are interleaved round by round so that machine noise hits them alike; the table
//! gives the median round and the min-max range. Workloads: `hot` (one key, far over its limit)
//! and `spread` (keys drawn from 100,000 ids, nearly all allowed); then `hot-allowed` (one key
//! far below its limit, four limiters sharing this Redis, with unit leases and without).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/servers/mod.rs"]
mod servers;

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
    algorithm::{Algorithm, MultiLimit},
    concurrency::ConcurrencyLimiter,
    rate_limit::UnitLease,
    redis,
    store::redis::Batching,
    Gcra, MemoryStore, Quota, RateLimitLayer, RateLimiter, RedisStore, SlidingWindow, TokenBucket,
};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Round {
    checks: u64,
    redis_commands: u64,
    checks_per_sec: f64,
    allowed_fraction: f64,
    p50_us: u64,
    p99_us: u64,
}

#[derive(Clone, Copy)]
enum Workload {
    Hot,
    Spread,
    /// One key far below its limit (its own contenders).
    HotAllowed,
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// One check: allowed or not.
type CheckFn = Arc<dyn Fn(String) -> BoxFuture<'static, bool> + Send + Sync>;

async fn round(check: &CheckFn, workload: Workload, tasks: u64, secs: u64) -> Round {
    let stop = Arc::new(AtomicBool::new(false));
    let allowed = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (check, stop, allowed) = (check.clone(), stop.clone(), allowed.clone());
        handles.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new(3).unwrap();
            let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ t;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                if n.is_multiple_of(64) {
                    // An in-memory check never suspends: let the timer and the other tasks run.
                    tokio::task::yield_now().await;
                }
                let key = match workload {
                    Workload::Hot => "hot".to_owned(),
                    Workload::HotAllowed => "tenant".to_owned(),
                    Workload::Spread => {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        format!("id{}", rng % 100_000)
                    }
                };
                let started = Instant::now();
                let ok = check(key).await;
                hist.record(started.elapsed().as_micros() as u64).unwrap();
                if ok {
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
        checks: hist.len(),
        checks_per_sec: hist.len() as f64 / elapsed,
        allowed_fraction: allowed.load(Ordering::Relaxed) as f64 / hist.len().max(1) as f64,
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        redis_commands: 0,
    }
}

/// `RateLimiter::check`.
fn via_limiter<A: Algorithm>(limiter: RateLimiter<A>) -> CheckFn {
    Arc::new(move |key| {
        let l = limiter.clone();
        Box::pin(async move { l.check(&key, 1).await.expect("check failed").allowed })
    })
}

/// `RateLimiter::check`, then, when allowed, `RateLimiter::refund` of that decision: the
/// cost of a request whose response is not counted.
fn check_and_refund<A: Algorithm>(limiter: RateLimiter<A>) -> CheckFn {
    Arc::new(move |key| {
        let l = limiter.clone();
        Box::pin(async move {
            let mut d = l.check(&key, 1).await.expect("check failed");
            if d.allowed {
                l.refund(&key, &mut d).await.expect("refund failed");
            }
            d.allowed
        })
    })
}

/// A concurrency limit: `acquire`, then `release` of the permit at once (true when admitted).
fn via_permit(limiter: ConcurrencyLimiter) -> CheckFn {
    Arc::new(move |key| {
        let l = limiter.clone();
        Box::pin(async move {
            match l.acquire(&key).await.expect("acquire failed") {
                Some(permit) => {
                    permit.release().await.expect("release failed");
                    true
                }
                None => false,
            }
        })
    })
}

/// The whole layer: `ready().call()` on a trivial inner service.
fn via_layer<A: Algorithm>(limiter: RateLimiter<A>) -> CheckFn {
    use tower::{Service, ServiceExt};
    let svc = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            limiter,
            |parts: &http::request::Parts| {
                parts
                    .headers
                    .get("k")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            },
        ))
        .service(tower::service_fn(|_req: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<
                bytes::Bytes,
            >::new()))
        }));
    Arc::new(move |key| {
        let mut svc = svc.clone();
        Box::pin(async move {
            let req = http::Request::get("/").header("k", key).body(()).unwrap();
            let res = svc.ready().await.unwrap().call(req).await.unwrap();
            res.status() == 200
        })
    })
}

/// The same GCRA script through redis-rs on one multiplexed connection, no limiter around it:
/// the ceiling for this connection kind.
fn raw_script<C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static>(
    conn: C,
    gcra: Gcra,
) -> CheckFn {
    // The script the store runs for GCRA's check, with the same arguments: the step (one
    // unit), the tolerance, a rested key's lifetime in ms; no time (the script reads TIME).
    static SCRIPT: std::sync::LazyLock<redis::Script> =
        std::sync::LazyLock::new(|| redis::Script::new(include_str!("../lua/gcra.lua")));
    // The emission interval (the period over the limit, rounded up) and the tolerance (the
    // emission interval times the burst), as the crate validates them.
    let q = gcra.quota_config();
    let step = (q.period().as_micros() as u64).div_ceil(u64::from(q.limit()));
    let tolerance = step * u64::from(q.burst_size());
    Arc::new(move |key| {
        let mut conn = conn.clone();
        Box::pin(async move {
            let mut inv = SCRIPT.prepare_invoke();
            inv.key(format!("{{raw:{key}}}:g"));
            inv.arg(step).arg(tolerance).arg(step.div_ceil(1_000));
            // Admitted: the string `TAT SECS USECS`; denied: an integer (banned: an array).
            let reply: redis::Value = inv.invoke_async(&mut conn).await.expect("script failed");
            matches!(reply, redis::Value::BulkString(_))
        })
    })
}

/// Calls of every Redis command so far, from `INFO commandstats` (minus the INFO calls).
fn redis_calls(conn: &mut redis::Connection) -> u64 {
    servers::command_calls(conn, |name| name != "info")
}

#[tokio::main]
async fn main() {
    let secs = env("BENCH_SECS", 3);
    let rounds = env("BENCH_ROUNDS", 3);
    let tasks = env("BENCH_TASKS", 64);
    // One server, plain text on its port and TLS on another (certificates made here), so the
    // TLS row differs from the plain one by TLS alone.
    let certs = servers::tls::Certs::make("bench CA");
    let tls = servers::tls::TlsRedis::start(&certs, false, &[]);
    let redis = &tls.server;
    let tls_store = RedisStore::builder()
        .ca_pem(servers::tls::Certs::read(&certs.ca))
        .connect(&tls.url())
        .await
        .unwrap();
    let version: String = tower_redis_ratelimit::redis::cmd("INFO")
        .arg("server")
        .query::<String>(&mut redis.conn())
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:").map(str::to_owned))
        .unwrap_or_default();
    let store = redis.store().await;
    let pool = |ping: bool| {
        let url = redis.url();
        async move {
            let manager =
                tower_redis_ratelimit::store::redis::bb8_redis::RedisConnectionManager::new(url)
                    .unwrap();
            let pool = tower_redis_ratelimit::store::redis::bb8::Pool::builder()
                .max_size(8)
                .test_on_check_out(ping)
                .build(manager)
                .await
                .unwrap();
            RedisStore::from_pool(pool)
        }
    };
    let batched = |b: Batching| store.clone().with_batching(b).unwrap();
    let raw_conn = redis::aio::ConnectionManager::new(redis::Client::open(redis.url()).unwrap())
        .await
        .unwrap();
    // 100 per second per key, burst 100: the hot key is far over its limit, spread keys are not.
    let q = Quota::per_second(100);
    let g = || Gcra::new(q).unwrap();
    let mut contenders: Vec<(&str, bool, CheckFn)> = vec![
        (
            "raw GCRA script (multiplexed)",
            true,
            raw_script(raw_conn, g()),
        ),
        (
            "raw GCRA script (plain MultiplexedConnection)",
            true,
            raw_script(
                redis::Client::open(redis.url())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap(),
                g(),
            ),
        ),
        (
            "gcra check (multiplexed)",
            true,
            via_limiter(limiter(store.clone(), g(), "b-g")),
        ),
        (
            "gcra check, deny cache off (multiplexed)",
            true,
            via_limiter(
                RateLimiter::builder(store.clone(), g())
                    .prefix("b-gnc")
                    .deny_cache(0)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "gcra check, deny cache off, TLS",
            true,
            via_limiter(
                RateLimiter::builder(tls_store.clone(), g())
                    .prefix("b-gtls")
                    .deny_cache(0)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "gcra check, batched (64 per call, 2 in flight)",
            true,
            via_limiter(limiter(batched(Batching::new()), g(), "b-gb")),
        ),
        (
            "gcra check, batched, deny cache off",
            true,
            via_limiter(
                RateLimiter::builder(batched(Batching::new()), g())
                    .prefix("b-gbnc")
                    .deny_cache(0)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "gcra check, batched 1 in flight, deny cache off",
            true,
            via_limiter(
                RateLimiter::builder(batched(Batching::new().max_in_flight(1)), g())
                    .prefix("b-gb1")
                    .deny_cache(0)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "gcra check, batched 4 in flight, deny cache off",
            true,
            via_limiter(
                RateLimiter::builder(batched(Batching::new().max_in_flight(4)), g())
                    .prefix("b-gb4")
                    .deny_cache(0)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "gcra layer, batched",
            true,
            via_layer(limiter(batched(Batching::new()), g(), "b-glb")),
        ),
        (
            "gcra check, deny cache off",
            true,
            via_limiter(
                RateLimiter::builder(store.clone(), g())
                    .prefix("b-gnc")
                    .deny_cache(0)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "gcra layer (multiplexed)",
            true,
            via_layer(limiter(store.clone(), g(), "b-gl")),
        ),
        (
            "gcra layer, deny cache off",
            true,
            via_layer(
                RateLimiter::builder(store.clone(), g())
                    .prefix("b-glnc")
                    .deny_cache(0)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "gcra check (bb8, check-out PING)",
            true,
            via_limiter(limiter(pool(true).await, g(), "b-gp")),
        ),
        (
            "gcra check (bb8, no PING)",
            true,
            via_limiter(limiter(pool(false).await, g(), "b-gn")),
        ),
        (
            "token-bucket check",
            true,
            via_limiter(limiter(store.clone(), TokenBucket::new(q).unwrap(), "b-tb")),
        ),
        (
            "sliding-window check",
            true,
            via_limiter(limiter(
                store.clone(),
                SlidingWindow::new(q).unwrap(),
                "b-sw",
            )),
        ),
        (
            "token-bucket check, batched",
            true,
            via_limiter(limiter(
                batched(Batching::new()),
                TokenBucket::new(q).unwrap(),
                "b-tbb",
            )),
        ),
        (
            "sliding-window check, deny cache off",
            true,
            via_limiter(
                RateLimiter::builder(store.clone(), SlidingWindow::new(q).unwrap())
                    .prefix("b-swnc")
                    .deny_cache(0)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "sliding-window check, batched",
            true,
            via_limiter(limiter(
                batched(Batching::new()),
                SlidingWindow::new(q).unwrap(),
                "b-swb",
            )),
        ),
        (
            "multi-limit check (2 limits)",
            true,
            via_limiter(limiter(
                store.clone(),
                MultiLimit::new([("s", q), ("h", Quota::per_hour(100_000))]).unwrap(),
                "b-ml",
            )),
        ),
        (
            "gcra check + refund",
            true,
            check_and_refund(
                RateLimiter::builder(store.clone(), g())
                    .prefix("b-gr")
                    .deny_cache(0)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "token-bucket check + refund",
            true,
            check_and_refund(
                RateLimiter::builder(store.clone(), TokenBucket::new(q).unwrap())
                    .prefix("b-tbr")
                    .deny_cache(0)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "sliding-window check + refund",
            true,
            check_and_refund(
                RateLimiter::builder(store.clone(), SlidingWindow::new(q).unwrap())
                    .prefix("b-swr")
                    .deny_cache(0)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "memory gcra check + refund",
            false,
            check_and_refund(limiter(MemoryStore::new(), g(), "m-gr")),
        ),
        (
            "concurrency acquire+release, 32 per key (multiplexed)",
            true,
            via_permit(
                ConcurrencyLimiter::builder(store.clone(), 32)
                    .prefix("b-c")
                    .store_timeout(Duration::from_secs(1))
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "concurrency acquire+release, 32 per key (batched store: sent alone)",
            true,
            via_permit(
                ConcurrencyLimiter::builder(batched(Batching::new()), 32)
                    .prefix("b-cb")
                    .store_timeout(Duration::from_secs(1))
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "memory concurrency acquire+release, 32 per key",
            false,
            via_permit(
                ConcurrencyLimiter::builder(MemoryStore::new(), 32)
                    .prefix("m-c")
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "memory gcra check",
            false,
            via_limiter(limiter(MemoryStore::new(), g(), "m-g")),
        ),
        (
            "memory gcra layer",
            false,
            via_layer(limiter(MemoryStore::new(), g(), "m-gl")),
        ),
        (
            "memory gcra layer, deny cache off",
            false,
            via_layer(
                RateLimiter::builder(MemoryStore::new(), g())
                    .prefix("m-glnc")
                    .deny_cache(0)
                    .build()
                    .unwrap(),
            ),
        ),
        (
            "memory sliding-window check",
            false,
            via_limiter(limiter(
                MemoryStore::new(),
                SlidingWindow::new(q).unwrap(),
                "m-sw",
            )),
        ),
    ];
    // BENCH_FILTER=word[|word...]: only the contenders whose name contains one of them.
    if let Ok(filter) = std::env::var("BENCH_FILTER") {
        contenders.retain(|(name, _, _)| filter.split('|').any(|f| name.contains(f)));
    }
    let mut info = redis.conn();
    println!(
        "redis {version}, {tasks} tasks, {rounds} rounds x {secs} s, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("| contender | workload | checks/s median (min-max) | p50 µs | p99 µs | allowed | Redis cmds/check |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    let workloads = [("hot", Workload::Hot), ("spread", Workload::Spread)];
    let shape = (rounds, tasks, secs);
    table(&contenders, &workloads, &mut info, shape).await;

    // hot-allowed: one key far below its limit (1,000,000 a second, a burst of over an hour
    // of it), four instances sharing this Redis, checks spread over them round-robin; with
    // unit leases and without.
    let hot_allowed = Quota::per_second(1_000_000).burst(4_000_000_000);
    let lease = UnitLease::up_to(Duration::from_millis(50));
    let mut instances = Vec::new();
    for _ in 0..4 {
        instances.push(redis.store().await);
    }
    let four = |prefix: &str, leased: bool, layer: bool| {
        let checks = instances
            .iter()
            .map(|store| {
                let b = RateLimiter::builder(store.clone(), Gcra::new(hot_allowed).unwrap())
                    .prefix(prefix)
                    .store_timeout(Duration::from_secs(5));
                let l = if leased { b.lease(lease) } else { b }.build().unwrap();
                if layer {
                    via_layer(l)
                } else {
                    via_limiter(l)
                }
            })
            .collect();
        round_robin(checks)
    };
    let mut contenders: Vec<(&str, bool, CheckFn)> = vec![
        (
            "gcra check, 4 instances, leased 50 ms",
            true,
            four("ha-cl", true, false),
        ),
        ("gcra check, 4 instances", true, four("ha-c", false, false)),
        (
            "gcra layer, 4 instances, leased 50 ms",
            true,
            four("ha-ll", true, true),
        ),
        ("gcra layer, 4 instances", true, four("ha-l", false, true)),
    ];
    if let Ok(filter) = std::env::var("BENCH_FILTER") {
        contenders.retain(|(name, _, _)| filter.split('|').any(|f| name.contains(f)));
    }
    table(
        &contenders,
        &[("hot-allowed", Workload::HotAllowed)],
        &mut info,
        shape,
    )
    .await;
}

/// A check spread round-robin over `instances`, as a load balancer would.
fn round_robin(instances: Vec<CheckFn>) -> CheckFn {
    let next = Arc::new(AtomicU64::new(0));
    Arc::new(move |key| {
        let i = next.fetch_add(1, Ordering::Relaxed) as usize % instances.len();
        instances[i](key)
    })
}

/// Runs every contender on every workload, `rounds` rounds of `tasks` tasks for `secs` each,
/// interleaved, and prints a row per contender and workload (the median round).
async fn table(
    contenders: &[(&str, bool, CheckFn)],
    workloads: &[(&str, Workload)],
    info: &mut redis::Connection,
    (rounds, tasks, secs): (u64, u64, u64),
) {
    for &(wname, workload) in workloads {
        let mut results: Vec<Vec<Round>> = contenders.iter().map(|_| Vec::new()).collect();
        for _ in 0..rounds {
            for (i, (_, uses_redis, check)) in contenders.iter().enumerate() {
                let before = redis_calls(info);
                let mut r = round(check, workload, tasks, secs).await;
                if *uses_redis {
                    r.redis_commands = redis_calls(info) - before;
                }
                results[i].push(r);
            }
        }
        for ((name, _, _), mut rs) in contenders.iter().zip(results) {
            rs.sort_by(|a, b| a.checks_per_sec.total_cmp(&b.checks_per_sec));
            let mid = &rs[rs.len() / 2];
            println!(
                "| {name} | {wname} | {:.0} ({:.0}-{:.0}) | {} | {} | {:.3} | {:.2} |",
                mid.checks_per_sec,
                rs[0].checks_per_sec,
                rs[rs.len() - 1].checks_per_sec,
                mid.p50_us,
                mid.p99_us,
                mid.allowed_fraction,
                mid.redis_commands as f64 / mid.checks.max(1) as f64
            );
        }
    }
}
