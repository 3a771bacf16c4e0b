//! Side-by-side benchmark of tower-redis-ratelimit against peer crates
//! (tower-rate-limit-redis on Redis, tower_governor in memory), on a `redis-server` this
//! program starts on a free 127.0.0.1 port and stops by PID.
//!
//! ```text
//! cargo run --release -p tower-redis-ratelimit-bench --bin compare
//! BENCH_SECS=2 BENCH_ROUNDS=3 BENCH_TASKS=64 BENCH_FILTER=gcra,governor cargo run --release -p tower-redis-ratelimit-bench --bin compare
//! ```
//!
//! Writes the Markdown table to stdout and `bench/results/compare.md`, and a bar chart to
//! `bench/results/compare.svg`. See `bench/README.md`.

mod chart;
mod contenders;
mod hot_allowed;
mod machine;
mod pinning;
mod redis_server;
mod report;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use tower_redis_ratelimit::{redis, RedisStore};

use contenders::{CheckFn, Contender, Contenders, ALL_ALGS};

pub const GOVERNOR: &str = "tower_governor layer";
pub const GOVERNOR_CHECK: &str = "tower_governor limiter check_key";
pub const TRLR: &str = "tower-rate-limit-redis layer";

struct Config {
    secs: u64,
    rounds: u64,
    tasks: u64,
    filter: Vec<String>,
    /// `BENCH_PIN=1`: Redis on one CPU, this process on the others (see `pinning.rs`).
    pin: Option<pinning::Pinning>,
}

impl Config {
    fn from_env() -> Self {
        fn num(name: &str, default: u64) -> u64 {
            match std::env::var(name) {
                Ok(v) => v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .unwrap_or_else(|| panic!("{name}={v:?}: expected a positive integer")),
                Err(_) => default,
            }
        }
        Self {
            secs: num("BENCH_SECS", 3),
            rounds: num("BENCH_ROUNDS", 3),
            tasks: num("BENCH_TASKS", 64),
            filter: std::env::var("BENCH_FILTER")
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            pin: pinning::Pinning::from_env(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// One key, far over its limit.
    Hot,
    /// Keys drawn from 100,000 ids: nearly all allowed.
    Spread,
    /// One key far below its limit, over four instances (its own contenders and table: see
    /// `hot_allowed.rs`).
    HotAllowed,
}

pub const WORKLOADS: [Workload; 2] = [Workload::Hot, Workload::Spread];

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Hot => "hot",
            Workload::Spread => "spread",
            Workload::HotAllowed => "hot-allowed",
        }
    }
}

/// One round of one contender.
struct Round {
    checks: u64,
    checks_per_sec: f64,
    allowed: u64,
    p50_us: u64,
    p99_us: u64,
    redis_commands: u64,
    /// Redis server CPU time (user + system), µs.
    redis_cpu_us: f64,
    /// This process' CPU time (user + system), µs.
    client_cpu_us: f64,
    inner_calls: u64,
}

/// The median round (by checks/s) of one contender on one workload, with the range.
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub allowed_fraction: f64,
    /// Redis contenders only.
    pub commands_per_check: Option<f64>,
    /// Redis contenders only: Redis server CPU time per check, µs.
    pub redis_cpu_us_per_check: Option<f64>,
    /// Layers only.
    pub inner_calls_per_check: Option<f64>,
    /// This process' CPU time per check, µs.
    pub client_cpu_us_per_check: f64,
}

fn summarize(mut rounds: Vec<Round>, c: &Contender) -> Summary {
    rounds.sort_by(|a, b| a.checks_per_sec.total_cmp(&b.checks_per_sec));
    let mid = &rounds[rounds.len() / 2];
    let per_check = |n: u64| n as f64 / mid.checks.max(1) as f64;
    Summary {
        median: mid.checks_per_sec,
        min: rounds[0].checks_per_sec,
        max: rounds[rounds.len() - 1].checks_per_sec,
        p50_us: mid.p50_us,
        p99_us: mid.p99_us,
        allowed_fraction: per_check(mid.allowed),
        commands_per_check: c.uses_redis.then(|| per_check(mid.redis_commands)),
        redis_cpu_us_per_check: c
            .uses_redis
            .then(|| mid.redis_cpu_us / mid.checks.max(1) as f64),
        inner_calls_per_check: c.inner_calls.as_ref().map(|_| per_check(mid.inner_calls)),
        client_cpu_us_per_check: mid.client_cpu_us / mid.checks.max(1) as f64,
    }
}

/// `tasks` tasks calling `check` in a loop for `secs` seconds.
async fn round(check: &CheckFn, workload: Workload, tasks: u64, secs: u64) -> Round {
    let stop = Arc::new(AtomicBool::new(false));
    let allowed = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (check, stop, allowed) = (check.clone(), stop.clone(), allowed.clone());
            tokio::spawn(async move {
                let mut hist = Histogram::<u64>::new(3).unwrap();
                let mut rng = 0x2545_F491_4F6C_DD1D_u64 ^ (t + 1).wrapping_mul(0x9E37_79B9);
                let mut n = 0u64;
                let mut mine = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    if n.is_multiple_of(64) {
                        // In-memory checks never suspend: let the timer and other tasks run.
                        tokio::task::yield_now().await;
                    }
                    let key = match workload {
                        Workload::Hot => "hot".to_owned(),
                        Workload::HotAllowed => "tenant".to_owned(),
                        Workload::Spread => {
                            // xorshift64
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            format!("id{}", rng % 100_000)
                        }
                    };
                    let started = Instant::now();
                    let ok = check(key).await;
                    hist.record(started.elapsed().as_micros() as u64).unwrap();
                    mine += u64::from(ok);
                }
                allowed.fetch_add(mine, Ordering::Relaxed);
                hist
            })
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::<u64>::new(3).unwrap();
    for h in handles {
        hist.add(h.await.expect("a benchmark task panicked"))
            .unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    Round {
        checks: hist.len(),
        checks_per_sec: hist.len() as f64 / elapsed,
        allowed: allowed.load(Ordering::Relaxed),
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        redis_commands: 0,
        redis_cpu_us: 0.0,
        client_cpu_us: 0.0,
        inner_calls: 0,
    }
}

/// This process' CPU time so far (user + system, all threads), µs, from `/proc/self/stat`
/// (in clock ticks, 100 a second on Linux); 0 where that file does not exist.
fn process_cpu_us() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (in parentheses, which may hold spaces): utime and
    // stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after_name
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    ticks as f64 * 10_000.0
}

/// Calls of every Redis command so far, from `INFO commandstats` (minus the INFO calls),
/// and the server's CPU time so far (user + system, µs), from `INFO cpu`.
fn redis_stats(conn: &mut redis::Connection) -> (u64, f64) {
    let mut info = |section: &str| -> String {
        redis::cmd("INFO")
            .arg(section)
            .query(&mut *conn)
            .expect("INFO")
    };
    let calls = info("commandstats")
        .lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    let cpu_secs: f64 = info("cpu")
        .lines()
        .filter_map(|l| {
            let v = l
                .strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))?;
            v.trim().parse::<f64>().ok()
        })
        .sum();
    (calls, cpu_secs * 1e6)
}

fn main() {
    let config = Config::from_env();
    // Pinned before the runtime starts, so that its threads inherit the CPU set; one worker
    // per CPU this process may use.
    if let Some(pin) = &config.pin {
        pin.pin_this_process();
    }
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("cannot start the tokio runtime")
        .block_on(run(config));
}

async fn run(config: Config) {
    let server = redis_server::RedisServer::start(config.pin.as_ref());
    let url = server.url();
    let mut info = server.conn();
    let redis_version = machine::redis_version(&mut info);

    // ---- The contenders (same quota everywhere: 100 per second, burst 100) ----
    let mut c = Contenders::new(config.filter.clone());

    // Ours on the default store: one self-reconnecting multiplexed connection.
    let store = RedisStore::connect(&url)
        .await
        .expect("cannot connect to the benchmark redis");
    let raw_multiplexed = contenders::multiplexed(&url).await;
    contenders::ours_redis(
        &mut c,
        "multiplexed",
        &store,
        Some(&raw_multiplexed),
        "multiplexed",
        &ALL_ALGS,
    );

    // Ours on a bb8 pool without the check-out PING (the raw script uses the same pool).
    let pool = contenders::pool(&url).await;
    let raw_pool = contenders::RawConn::Pool(pool.clone());
    contenders::ours_redis(
        &mut c,
        "bb8",
        &RedisStore::from_pool(pool),
        Some(&raw_pool),
        "bb8",
        &ALL_ALGS,
    );

    // Ours with exact batching on the same multiplexed connection: concurrent checks share
    // one script call. No raw ceiling of its own (compared with the one-call-per-check script).
    let batched = store
        .clone()
        .with_batching(tower_redis_ratelimit::store::redis::Batching::new())
        .expect("batching");
    contenders::ours_redis(&mut c, "batched", &batched, None, "multiplexed", &ALL_ALGS);

    // Peer on Redis.
    contenders::tower_rate_limit_redis(&mut c, &url, Some("raw gcra script (multiplexed)".into()))
        .await;

    // In memory: ours (MemoryStore) against tower_governor.
    contenders::tower_governor(&mut c, GOVERNOR);
    contenders::governor_check_key(&mut c, GOVERNOR_CHECK);
    contenders::ours_memory(&mut c, GOVERNOR_CHECK, GOVERNOR);

    // The hot-allowed workload's own contenders (four instances each).
    let mut ha = Contenders::new(config.filter.clone());
    contenders::hot_allowed(&mut ha, &url).await;
    let hot_allowed = ha.into_vec();

    let contenders = c.into_vec();
    assert!(
        !contenders.is_empty() || !hot_allowed.is_empty(),
        "BENCH_FILTER={:?} selects no contender",
        config.filter
    );

    let machine = machine::describe(&redis_version, &config);
    eprintln!("{machine}");
    eprintln!(
        "{} contenders x 2 workloads + {} on hot-allowed, x {} rounds x {} s: about {} s",
        contenders.len(),
        hot_allowed.len(),
        config.rounds,
        config.secs,
        (contenders.len() as u64 * 2 + hot_allowed.len() as u64) * config.rounds * config.secs
    );

    // ---- Rounds, interleaved so that machine noise hits every contender alike ----
    let mut results: Vec<Vec<Summary>> = contenders.iter().map(|_| Vec::new()).collect();
    for workload in WORKLOADS {
        let mut rounds: Vec<Vec<Round>> = contenders.iter().map(|_| Vec::new()).collect();
        for r in 0..config.rounds {
            for (i, contender) in contenders.iter().enumerate() {
                let (commands_before, cpu_before) = redis_stats(&mut info);
                let client_before = process_cpu_us();
                let inner_before = contender
                    .inner_calls
                    .as_ref()
                    .map_or(0, |n| n.load(Ordering::Relaxed));
                let mut round = round(&contender.check, workload, config.tasks, config.secs).await;
                round.client_cpu_us = process_cpu_us() - client_before;
                let (commands_after, cpu_after) = redis_stats(&mut info);
                round.redis_commands = commands_after - commands_before;
                round.redis_cpu_us = cpu_after - cpu_before;
                round.inner_calls = contender
                    .inner_calls
                    .as_ref()
                    .map_or(0, |n| n.load(Ordering::Relaxed))
                    - inner_before;
                eprintln!(
                    "{} round {}/{}: {:>10.0} checks/s  {}",
                    workload.name(),
                    r + 1,
                    config.rounds,
                    round.checks_per_sec,
                    contender.name
                );
                rounds[i].push(round);
            }
        }
        for (i, rs) in rounds.into_iter().enumerate() {
            results[i].push(summarize(rs, &contenders[i]));
        }
    }

    let hot_allowed_md = hot_allowed::run(&config, &mut info, &hot_allowed).await;

    // ---- Report ----
    let mut markdown = report::markdown(&machine, &config, &contenders, &results);
    if !hot_allowed.is_empty() {
        markdown.push_str(&hot_allowed_md);
    }
    println!("{markdown}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    std::fs::create_dir_all(&dir).expect("cannot create bench/results");
    std::fs::write(dir.join("compare.md"), &markdown).expect("cannot write compare.md");
    let bars: Vec<(String, [f64; 2])> = contenders
        .iter()
        .zip(&results)
        .map(|(c, s)| (c.name.clone(), [s[0].median, s[1].median]))
        .collect();
    chart::write_svg(
        &dir.join("compare.svg"),
        &format!(
            "Checks per second, median of {} rounds x {} s, {} tasks (log scale)",
            config.rounds, config.secs, config.tasks
        ),
        &bars,
    )
    .expect("cannot write compare.svg");
    eprintln!(
        "wrote {} and {}",
        dir.join("compare.md").display(),
        dir.join("compare.svg").display()
    );
    // `server` is dropped here: redis-server is stopped by PID.
}
