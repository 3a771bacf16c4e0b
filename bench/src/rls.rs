//! Envoy's rate limit service (`ShouldRateLimit` over gRPC) side by side, for
//! scripts/bench-rls: our gateway's `--rls-listen` (fixed window) against `limitador-rls`
//! (limitador's `AsyncRedisStorage`, and its `CachedRedisStorage`, not exact), with a bare
//! `INCRBY` + `PEXPIRE` pipeline per decision as the floor of Redis' work; all on one
//! `redis-server` this process starts on a free 127.0.0.1 port (no persistence) and stops by
//! PID, as every server it starts.
//!
//! ```text
//! cargo build --release --bin gateway
//! cargo build --release -p tower-redis-ratelimit-bench --bin rls --bin limitador-rls
//! BENCH_SECS=5 BENCH_ROUNDS=3 target/release/rls
//! ```
//!
//! For each round, each workload and each contender (interleaved), the server is started
//! afresh on a flushed Redis, driven by `BENCH_TASKS` tasks over `BENCH_CONNS` connections
//! for 1 s of warm-up and `BENCH_SECS` measured, and stopped. The server's and Redis' CPU
//! time (utime + stime from `/proc/PID/stat`) are read right before and after the measured
//! span. The Markdown table goes to stdout, progress to stderr.

#[allow(dead_code)] // only what `redis_server` needs
mod pinning;
mod redis_server;
mod rls_load;
mod rls_report;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    str::FromStr,
    time::Duration,
};

use redis_server::RedisServer;
use rls_load::{Measured, Target, Workload, WORKLOADS};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};
use tower_redis_ratelimit::redis;

/// Every rule's limit per minute: never reached.
const LIMIT: u64 = 1_000_000_000;
const WARMUP: Duration = Duration::from_secs(1);

struct Config {
    secs: u64,
    rounds: usize,
    tasks: usize,
    conns: usize,
}

fn env_or<T: FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Contender {
    Ours,
    Limitador,
    LimitadorCached,
    Bare,
}

const CONTENDERS: [Contender; 4] = [
    Contender::Ours,
    Contender::Limitador,
    Contender::LimitadorCached,
    Contender::Bare,
];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Ours => "ours: gateway --rls-listen, fixed-window",
            Contender::Limitador => "limitador AsyncRedisStorage",
            Contender::LimitadorCached => "limitador CachedRedisStorage (not exact)",
            Contender::Bare => "bare INCRBY+PEXPIRE pipeline (no server)",
        }
    }
}

/// Why `contender` is not run on `workload`, if it is not.
fn skipped(contender: Contender, workload: &Workload) -> Option<&'static str> {
    // Measured with limitador 0.14.0: with 3 counters per request on spread keys and 32 or
    // more requests in flight, both worker threads of the server park for good in
    // `CountersCache::get` (dashmap's `lock_shared_slow`), at 0 CPU; 16 in flight run.
    (contender == Contender::LimitadorCached && workload.keys.len() > 1 && !workload.hot)
        .then_some("not run: limitador 0.14.0 deadlocks here (see the notes)")
}

/// Our gateway's rules (envoyproxy/ratelimit's YAML): one rule per descriptor key.
fn rules_yaml() -> String {
    let mut yaml = "domain: bench\ndescriptors:\n".to_owned();
    for key in ["k", "a", "b", "c"] {
        yaml += &format!(
            "  - key: {key}\n    rate_limit: {{ unit: minute, requests_per_unit: {LIMIT} }}\n"
        );
    }
    yaml
}

/// The same limits for limitador (limitador-server's limits file): namespace = domain, the
/// descriptor's entry as the variable, 60 s. limitador binds the descriptors as a CEL list, so
/// a limit names the descriptor's position: `k` and `a` are the first descriptor's, `b` the
/// second's, `c` the third's; a condition on the list's size keeps `b` and `c` from indexing
/// past the end of a shorter request.
fn limitador_yaml() -> String {
    let limits = [
        ("descriptors[0].k", None),
        ("descriptors[0].a", None),
        ("descriptors[1].b", Some("size(descriptors) > 1")),
        ("descriptors[2].c", Some("size(descriptors) > 2")),
    ];
    let mut yaml = String::new();
    for (variable, condition) in limits {
        let conditions = condition.map_or_else(|| "[]".to_owned(), |c| format!("[\"{c}\"]"));
        yaml += &format!(
            "- namespace: bench\n  max_value: {LIMIT}\n  seconds: 60\n  \
             conditions: {conditions}\n  variables: [\"{variable}\"]\n"
        );
    }
    yaml
}

/// A server under test, killed (SIGKILL to its PID) and reaped by [`Server::stop`], or
/// killed on drop on any other path.
struct Server {
    child: Child,
    pid: u32,
    addr: SocketAddr,
}

impl Server {
    async fn start(contender: Contender, dir: &Path, redis_url: &str) -> Server {
        let bins = std::env::current_exe()
            .expect("current_exe")
            .parent()
            .expect("the binary's directory")
            .to_path_buf();
        let (mut command, ready) = match contender {
            Contender::Ours => {
                let mut c = Command::new(bins.join("gateway"));
                c.args(["--listen", "127.0.0.1:0", "--rls-listen", "127.0.0.1:0"])
                    .arg("--rls-config")
                    .arg(dir.join("rules.yaml"))
                    .args(["--redis", redis_url, "--log", "error"])
                    // Every decision from Redis: a slow call fails loudly, never answered
                    // by the failure policy.
                    .args(["--on-redis-error", "closed", "--timeout-ms", "10000"]);
                (c, "rls listening on http://")
            }
            Contender::Limitador | Contender::LimitadorCached => {
                let mut c = Command::new(bins.join("limitador-rls"));
                c.args(["--listen", "127.0.0.1:0", "--redis", redis_url])
                    .arg("--limits")
                    .arg(dir.join("limits.yaml"));
                if contender == Contender::LimitadorCached {
                    c.args(["--storage", "redis-cached"]);
                }
                (c, "listening on http://")
            }
            Contender::Bare => unreachable!("the bare pipeline has no server"),
        };
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", contender.name()));
        let pid = child.id().expect("a running child has a PID");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.expect("reading its stdout") {
                if let Some(addr) = line.strip_prefix(ready) {
                    return addr.trim().parse().expect("its address");
                }
            }
            panic!("{} exited before listening", contender.name());
        })
        .await
        .unwrap_or_else(|_| panic!("{} printed no `{ready}` within 30 s", contender.name()));
        // Drains the rest of its stdout so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Server { child, pid, addr }
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// utime + stime of process `pid`, in clock ticks (`/proc/PID/stat`, fields 14 and 15:
/// every thread of the process).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/stat: {e}"));
    let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 1..]
        .split_whitespace()
        .collect();
    // After the command's name: field 3 (state) is fields[0], so 14 and 15 are 11 and 12.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// `total_commands_processed` from `INFO stats`.
fn commands_processed(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("stats").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_commands_processed")
}

fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// One run's numbers.
struct Run {
    measured: Measured,
    /// CPU seconds of the server (None for the bare pipeline) and of Redis over the span.
    server_cpu: Option<f64>,
    redis_cpu: f64,
    /// Commands Redis ran over the span (`total_commands_processed`: an `EVALSHA` and each
    /// command its script calls, less the second snapshot's `INFO`).
    redis_commands: u64,
}

async fn run_one(
    contender: Contender,
    workload: &'static Workload,
    config: &Config,
    dir: &Path,
    redis: &RedisServer,
    tick: f64,
) -> Run {
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut redis.conn())
        .expect("FLUSHALL");
    let server = match contender {
        Contender::Bare => None,
        c => Some(Server::start(c, dir, &redis.url()).await),
    };
    let targets = match &server {
        Some(s) => Target::grpc(s.addr, config.conns).await,
        None => Target::bare(&redis.url(), config.conns).await,
    };
    let server_pid = server.as_ref().map(|s| s.pid);
    let mut marks = Vec::new();
    // Opened before the span: the snapshots only send `INFO stats` (one command each).
    let mut info = redis.conn();
    if std::env::var_os("BENCH_COMMANDSTATS").is_some() {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut info)
            .unwrap();
    }
    let measured = rls_load::drive(
        targets,
        config.tasks,
        workload,
        WARMUP,
        Duration::from_secs(config.secs),
        || {
            marks.push((
                server_pid.map(cpu_ticks),
                cpu_ticks(redis.pid()),
                commands_processed(&mut info),
            ))
        },
    )
    .await;
    if let Some(server) = server {
        server.stop().await;
    }
    if std::env::var_os("BENCH_COMMANDSTATS").is_some() {
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut info)
            .unwrap();
        eprintln!("{}", stats.trim());
    }
    let [(s0, r0, c0), (s1, r1, c1)] = marks[..] else {
        unreachable!("two snapshots")
    };
    Run {
        measured,
        server_cpu: s0.zip(s1).map(|(a, b)| (b - a) as f64 / tick),
        redis_cpu: (r1 - r0) as f64 / tick,
        redis_commands: c1 - c0 - 1,
    }
}

fn main() {
    let config = Config {
        secs: env_or("BENCH_SECS", 5),
        rounds: env_or("BENCH_ROUNDS", 3),
        tasks: env_or("BENCH_TASKS", 64),
        conns: env_or("BENCH_CONNS", 4),
    };
    assert!(config.secs > 0 && config.rounds > 0 && config.tasks > 0 && config.conns > 0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = runtime.block_on(async {
        let mut interrupt =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).unwrap();
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        // On a signal the benchmark's future is dropped as `select!` ends: every server it
        // started is killed by PID on the way (`kill_on_drop`, `RedisServer`'s drop).
        tokio::select! {
            () = bench(&config) => 0,
            _ = interrupt.recv() => 130,
            _ = terminate.recv() => 143,
        }
    });
    if code != 0 {
        eprintln!("stopped by a signal: every process started was killed");
        std::process::exit(code);
    }
}

/// A temporary directory of this run's files, removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn bench(config: &Config) {
    let tick = clock_ticks_per_second();
    let dir = TempDir(std::env::temp_dir().join(format!("trr-bench-rls-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temporary directory");
    std::fs::write(dir.0.join("rules.yaml"), rules_yaml()).unwrap();
    std::fs::write(dir.0.join("limits.yaml"), limitador_yaml()).unwrap();
    let redis = RedisServer::start(None);
    let mut runs: Vec<Vec<Vec<Run>>> = WORKLOADS
        .iter()
        .map(|_| CONTENDERS.iter().map(|_| Vec::new()).collect())
        .collect();
    for round in 1..=config.rounds {
        for (w, workload) in WORKLOADS.iter().enumerate() {
            for (c, &contender) in CONTENDERS.iter().enumerate() {
                if skipped(contender, workload).is_some() {
                    continue;
                }
                let run = run_one(contender, workload, config, &dir.0, &redis, tick).await;
                eprintln!(
                    "round {round}/{}, {}, {}: {}",
                    config.rounds,
                    workload.name,
                    contender.name(),
                    progress(&run)
                );
                runs[w][c].push(run);
            }
        }
    }
    let version = redis_version(&mut redis.conn());
    drop(redis);
    print!("{}", rls_report::table(config, &version, &runs));
}

fn progress(run: &Run) -> String {
    let m = &run.measured;
    let per = |cpu: f64| cpu * 1e6 / m.decisions.max(1) as f64;
    format!(
        "{:.0} decisions/s, server {} µs, redis {:.1} µs per decision, {} over limit, {} failed",
        m.decisions as f64 / m.secs,
        run.server_cpu
            .map_or_else(|| "-".to_owned(), |c| format!("{:.1}", per(c))),
        per(run.redis_cpu),
        m.over,
        m.failed
    )
}

/// Date, cores, CPU, OS, rustc, the versions measured and the load's shape.
fn machine_line(config: &Config, redis_version: &str) -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map_or("unknown CPU", |(_, v)| v.trim());
    let os = read("/etc/os-release");
    let os = os
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map_or(std::env::consts::OS, |v| v.trim_matches('"'));
    let output = |cmd: &str, arg: &str| {
        std::process::Command::new(cmd)
            .arg(arg)
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let lock = read(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock"));
    let version = |name: &str| {
        let wanted = format!("name = \"{name}\"");
        let mut lines = lock.lines();
        let mut found = Vec::new();
        while let Some(line) = lines.next() {
            if line.trim() == wanted {
                if let Some(v) = lines
                    .next()
                    .and_then(|l| l.trim().strip_prefix("version = "))
                {
                    found.push(v.trim_matches('"').to_owned());
                }
            }
        }
        found.join(" / ")
    };
    let profile = if cfg!(debug_assertions) {
        "DEBUG build (numbers meaningless)"
    } else {
        "release build"
    };
    format!(
        "{date}; {cores} cores, {cpu}, {os}, {rustc}, {profile}; redis-server {redis_version}; \
         tower-redis-ratelimit {ours}, limitador {lim}, tonic {tonic}, redis-rs {redis} (1.x: ours \
         and the bare pipeline; 0.27: limitador); \
         {tasks} tasks over {conns} connections per contender, {rounds} rounds x ({secs} s measured \
         after 1 s of warm-up), contenders interleaved; not pinned (servers, Redis and the load \
         generator share every core).",
        date = output("date", "+%F"),
        rustc = output("rustc", "--version"),
        ours = version("tower-redis-ratelimit"),
        lim = version("limitador"),
        tonic = version("tonic"),
        redis = version("redis"),
        tasks = config.tasks,
        conns = config.conns,
        rounds = config.rounds,
        secs = config.secs,
    )
}

fn redis_version(conn: &mut redis::Connection) -> String {
    let info: String = redis::cmd("INFO").arg("server").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned()
}
