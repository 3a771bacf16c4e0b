//! Several regions: latency, use of the limit and overshoot with two regions (two instances
//! each, one `redis-server` per region, this program starts them on free loopback ports) whose
//! Redis servers are 0, 50 and 150 ms apart (a proxy delaying every byte half of that each
//! way, `tests/servers/link.rs`), and under a partition; beside one Redis shared by both
//! regions (every check of the far region crossing the link).
//!
//! ```text
//! cargo bench --bench regions            # about two minutes
//! cargo bench --bench regions -- quick   # shorter runs, for a look
//! cargo build --release --examples --all-features && cargo bench --bench regions -- gateways
//! ```
//!
//! `gateways`: the gateway demo's contract from outside instead: two gateway processes in each
//! of two regions 50 ms apart (`--region --regions --limit N --per P --key header:NAME`), one
//! key hammered over HTTP; each region's p99 after 20 warm-up requests per gateway, the
//! admissions against `N + N/P × T`, one region alone, a cut and the link back.
//!
//! Every instance offers far more than the limit (two tasks, a check every millisecond each).
//! "use" is the admissions over `B + ρ·T`; "worst 1 s" the most admitted in any one-second
//! window over `B + ρ·1 s`, the overshoot a client could see.

#[path = "../tests/servers/mod.rs"]
mod servers;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use servers::{
    gateway::{send, AdminGateway},
    link::RegionLink,
    RedisServer,
};
use tower_redis_ratelimit::{store::redis::RegionalStore, Gcra, Quota, RateLimiter, RedisStore};

const LIMIT: u32 = 100; // per second
const BURST: u32 = 100;

struct Run {
    /// Per region: admission times (since the start), check latencies in µs.
    admitted: Vec<Vec<Duration>>,
    latency: Vec<Histogram<u64>>,
    elapsed: Duration,
}

async fn hammer(
    limiters: &[(usize, RateLimiter<Gcra>)],
    regions: usize,
    how_long: Duration,
) -> Run {
    let started = Instant::now();
    let admitted = Arc::new(Mutex::new(vec![Vec::new(); regions]));
    let latency = Arc::new(Mutex::new(vec![
        Histogram::<u64>::new_with_bounds(
            1, 60_000_000, 3
        )
        .unwrap();
        regions
    ]));
    let mut tasks = Vec::new();
    for (region, limiter) in limiters {
        for _ in 0..2 {
            let (region, limiter) = (*region, limiter.clone());
            let (admitted, latency) = (admitted.clone(), latency.clone());
            tasks.push(tokio::spawn(async move {
                let (mut mine, mut hist) = (Vec::new(), Histogram::<u64>::new(3).unwrap());
                while started.elapsed() < how_long {
                    let sent = Instant::now();
                    let d = limiter.check("customer", 1).await.expect("answered");
                    hist.record(sent.elapsed().as_micros() as u64).unwrap();
                    if d.allowed {
                        mine.push(started.elapsed());
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                admitted.lock().unwrap()[region].extend(mine);
                latency.lock().unwrap()[region].add(hist).unwrap();
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    let admitted = std::mem::take(&mut *admitted.lock().unwrap());
    let latency = std::mem::take(&mut *latency.lock().unwrap());
    Run {
        admitted,
        latency,
        elapsed,
    }
}

/// The most admissions of all regions in any window of `window`.
fn worst_window(run: &Run, window: Duration) -> usize {
    let mut all: Vec<Duration> = run.admitted.iter().flatten().copied().collect();
    all.sort();
    let (mut best, mut start) = (0, 0);
    for end in 0..all.len() {
        while all[end] - all[start] > window {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

fn limit_over(t: Duration) -> f64 {
    f64::from(BURST) + f64::from(LIMIT) * t.as_secs_f64()
}

fn ms(h: &Histogram<u64>, q: f64) -> String {
    format!("{:.2}", h.value_at_quantile(q) as f64 / 1000.0)
}

struct World {
    a: RedisServer,
    b: RedisServer,
    a_to_b: RegionLink,
    b_to_a: RegionLink,
}

impl World {
    async fn start(rtt: Duration) -> World {
        let (a, b) = (RedisServer::start(), RedisServer::start());
        let addr = |r: &RedisServer| format!("127.0.0.1:{}", r.port).parse().unwrap();
        let a_to_b = RegionLink::start(addr(&b), rtt / 2).await;
        let b_to_a = RegionLink::start(addr(&a), rtt / 2).await;
        World {
            a,
            b,
            a_to_b,
            b_to_a,
        }
    }

    async fn regional(&self, region: &str, prefix: &str) -> RateLimiter<Gcra> {
        let connect = |url: String| async move { RedisStore::connect(&url).await.unwrap() };
        let (home, other) = match region {
            "a" => (
                connect(self.a.url()).await,
                connect(self.a_to_b.url()).await,
            ),
            _ => (
                connect(self.b_to_a.url()).await,
                connect(self.b.url()).await,
            ),
        };
        let store = RegionalStore::builder(region)
            .region("a", home)
            .region("b", other)
            .build()
            .unwrap();
        limiter(store, prefix)
    }

    /// One Redis for both regions: region b's checks cross the link.
    async fn shared(&self, region: &str, prefix: &str) -> RateLimiter<Gcra> {
        let url = match region {
            "a" => self.a.url(),
            _ => self.b_to_a.url(),
        };
        limiter(RedisStore::connect(&url).await.unwrap(), prefix)
    }
}

fn limiter(store: impl tower_redis_ratelimit::store::Store, prefix: &str) -> RateLimiter<Gcra> {
    let q = Quota::per_second(LIMIT).burst(BURST);
    RateLimiter::builder(store, Gcra::new(q).unwrap())
        .prefix(prefix)
        .store_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn row(setup: &str, rtt: Duration, run: &Run) {
    let counts: Vec<usize> = run.admitted.iter().map(Vec::len).collect();
    let total: usize = counts.iter().sum();
    let worst = worst_window(run, Duration::from_secs(1));
    let lat = |r: usize| match run.latency.get(r) {
        Some(h) if !h.is_empty() => format!("{} / {}", ms(h, 0.5), ms(h, 0.99)),
        _ => "-".into(),
    };
    println!(
        "| {setup} | {} ms | {} | {} | {counts:?} | {:.2} | {:.2} |",
        rtt.as_millis(),
        lat(0),
        lat(1),
        total as f64 / limit_over(run.elapsed),
        worst as f64 / limit_over(Duration::from_secs(1)),
    );
}

/// Every gateway of `gateways` sent the key for `how_long`, two clients each (a request every
/// 2 ms per client, each on a fresh connection): per gateway the 200s and the latencies (µs)
/// of every answer, and whether any answer was neither 200 nor 429.
fn http_hammer(
    gateways: &[&AdminGateway],
    how_long: Duration,
) -> (Vec<u64>, Vec<Histogram<u64>>, bool, Duration) {
    let started = Instant::now();
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for (i, gw) in gateways.iter().enumerate() {
            for _ in 0..2 {
                let (addr, results) = (gw.addr, &results);
                scope.spawn(move || {
                    let (mut ok, mut other) = (0, false);
                    let mut hist = Histogram::<u64>::new(3).unwrap();
                    while started.elapsed() < how_long {
                        let sent = Instant::now();
                        match send(addr, "GET", "/", &[("x-customer", "acme")]).status {
                            200 => ok += 1,
                            429 => {}
                            _ => other = true,
                        }
                        hist.record(sent.elapsed().as_micros() as u64).unwrap();
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    results.lock().unwrap().push((i, ok, hist, other));
                });
            }
        }
    });
    let mut ok = vec![0; gateways.len()];
    let mut hists = vec![Histogram::<u64>::new(3).unwrap(); gateways.len()];
    let mut other = false;
    for (i, n, h, o) in results.into_inner().unwrap() {
        ok[i] += n;
        hists[i].add(h).unwrap();
        other |= o;
    }
    (ok, hists, other, started.elapsed())
}

async fn gateways(t: Duration) {
    const N: u64 = 100;
    const PER_S: u64 = 2;
    let limit = |t: Duration| N as f64 + (N / PER_S) as f64 * t.as_secs_f64();
    let world = World::start(Duration::from_millis(50)).await;
    let from_a = format!("a={},b={}", world.a.url(), world.a_to_b.url());
    let from_b = format!("a={},b={}", world.b_to_a.url(), world.b.url());
    let mut gws = Vec::new();
    for (region, list) in [
        ("a", &from_a),
        ("a", &from_a),
        ("b", &from_b),
        ("b", &from_b),
    ] {
        let args = [
            "--region",
            region,
            "--regions",
            list,
            "--limit",
            &N.to_string(),
            "--per",
            &format!("{PER_S}s"),
            "--key",
            "header:x-customer",
            "--log",
            "warn",
        ];
        gws.push(tokio::task::block_in_place(|| AdminGateway::start(&args)));
    }
    let all: Vec<&AdminGateway> = gws.iter().collect();
    println!("gateway demo, two gateways per region, RTT 50 ms, GCRA N = {N} per {PER_S} s (burst N), T = {t:?}");
    println!();
    println!("| run | region a p99 ms | region b p99 ms | 200s per gateway | admitted / (N + N/P × T) | only 200 and 429 |");
    println!("|---|---|---|---|---|---|");
    let show = |name: &str,
                (ok, hists, other, elapsed): (Vec<u64>, Vec<Histogram<u64>>, bool, Duration),
                of: f64| {
        let p99 = |r: std::ops::Range<usize>| {
            let mut h = Histogram::<u64>::new(3).unwrap();
            for i in r {
                if let Some(x) = hists.get(i) {
                    h.add(x).unwrap();
                }
            }
            if h.is_empty() {
                "-".to_owned()
            } else {
                ms(&h, 0.99)
            }
        };
        let total: u64 = ok.iter().sum();
        println!(
            "| {name} | {} | {} | {ok:?} | {:.2} | {} |",
            p99(0..2),
            p99(2..4),
            total as f64 / (of * limit(elapsed)),
            if other { "no" } else { "yes" }
        );
    };
    tokio::task::block_in_place(|| {
        // Warm-up: 20 requests per gateway on another key.
        for gw in &all {
            for _ in 0..20 {
                send(gw.addr, "GET", "/", &[("x-customer", "warm-up")]);
            }
        }
        show("all four gateways", http_hammer(&all, t), 1.0);
        std::thread::sleep(Duration::from_secs(3));
        let r = http_hammer(&all[2..], t);
        let r = (
            vec![0, 0].into_iter().chain(r.0).collect(),
            vec![Histogram::new(3).unwrap(), Histogram::new(3).unwrap()]
                .into_iter()
                .chain(r.1)
                .collect(),
            r.2,
            r.3,
        );
        show("region b alone (home remote)", r, 1.0);
        world.a_to_b.cut();
        world.b_to_a.cut();
        let deadline = Instant::now() + Duration::from_secs(15);
        while !all.iter().all(|g| {
            send(g.admin, "GET", "/region", &[])
                .body
                .contains("\"cut_off\":true")
        }) {
            assert!(Instant::now() < deadline, "never cut off");
            std::thread::sleep(Duration::from_millis(50));
        }
        show(
            "cut, once detected (against each region's F = 1/2: [a, a, b, b])",
            http_hammer(&all, t),
            1.0,
        );
        world.a_to_b.restore();
        world.b_to_a.restore();
        let deadline = Instant::now() + Duration::from_secs(15);
        while !all.iter().all(|g| {
            send(g.admin, "GET", "/region", &[])
                .body
                .contains("\"cut_off\":false")
        }) {
            assert!(Instant::now() < deadline, "never back");
            std::thread::sleep(Duration::from_millis(50));
        }
        show("link back, once detected", http_hammer(&all, t), 1.0);
    });
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    if std::env::args().any(|a| a == "gateways") {
        return gateways(Duration::from_secs(if quick { 3 } else { 10 })).await;
    }
    let t = Duration::from_secs(if quick { 3 } else { 10 });
    println!("limit {LIMIT}/s, burst {BURST}, GCRA; T = {t:?} per run; two instances per region, two tasks each, a check every ms per task");
    println!();
    println!("| setup | RTT between regions | a (home): p50 / p99 ms | b: p50 / p99 ms | admitted [a, b] | use: admitted / (B + ρT) | worst 1 s / (B + ρ·1 s) |");
    println!("|---|---|---|---|---|---|---|");
    for rtt_ms in [0u64, 50, 150] {
        let rtt = Duration::from_millis(rtt_ms);
        let world = World::start(rtt).await;
        let mut both = Vec::new();
        for (i, region) in ["a", "a", "b", "b"].iter().enumerate() {
            let r = if i < 2 { 0 } else { 1 };
            both.push((r, world.regional(region, "both").await));
        }
        // Warm-up: 20 checks per instance (connections, scripts loaded, the key's first grant).
        for (_, l) in &both {
            for _ in 0..20 {
                l.check("warm", 1).await.unwrap();
            }
        }
        row(
            "regional, both regions busy",
            rtt,
            &hammer(&both, 2, t).await,
        );
        let mut far = Vec::new();
        for _ in 0..2 {
            far.push((1, world.regional("b", "far").await));
        }
        row(
            "regional, only region b busy",
            rtt,
            &hammer(&far, 2, t).await,
        );
        let mut shared = Vec::new();
        for (i, region) in ["a", "a", "b", "b"].iter().enumerate() {
            let r = if i < 2 { 0 } else { 1 };
            shared.push((r, world.shared(region, "shared").await));
        }
        row(
            "one Redis for both, both busy",
            rtt,
            &hammer(&shared, 2, t).await,
        );
    }

    // A partition at 50 ms: the share (1/2 each) while cut, then the link back.
    let rtt = Duration::from_millis(50);
    let world = World::start(rtt).await;
    let mut both = Vec::new();
    for (i, region) in ["a", "a", "b", "b"].iter().enumerate() {
        let r = if i < 2 { 0 } else { 1 };
        both.push((r, world.regional(region, "cut").await));
    }
    hammer(&both, 2, Duration::from_secs(1)).await;
    world.a_to_b.cut();
    world.b_to_a.cut();
    let cut_at = Instant::now();
    let during = hammer(&both, 2, t).await;
    row(
        "regional, cut (from the cut on, detection included)",
        rtt,
        &during,
    );
    world.a_to_b.restore();
    world.b_to_a.restore();
    let back_at = Instant::now();
    let after = hammer(&both, 2, t).await;
    row("regional, link back (from the restore on)", rtt, &after);
    println!();
    println!(
        "cut for {:?}; share F = 1/2: each region's F·(B + ρT) = {:.0}",
        back_at - cut_at,
        0.5 * limit_over(during.elapsed)
    );
}
