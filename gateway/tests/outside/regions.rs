//! The gateway demo in several regions, run as processes exactly as the contract says:
//! `--region NAME --regions NAME=URL,NAME=URL,...`, `--region-share F`, `--limit N --per P
//! --key header:NAME`, GCRA (burst N). Two gateways in each of two regions whose Redis servers
//! are 50 ms apart (a delaying link each way, 25 ms each direction); one key hammered.
//!
//! Time is real; every bound is computed from the time the test measured. Latency is measured
//! by the benchmark (`bench/regions.sh`), not here.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::servers::{
    gateway::{assert_refused, send, AdminGateway},
    link::RegionLink,
    RedisServer,
};

const N: u64 = 40;
const PER_S: u64 = 2;
/// N / P, per second.
const RATE: f64 = N as f64 / PER_S as f64;

struct World {
    _a: RedisServer,
    _b: RedisServer,
    a_to_b: RegionLink,
    b_to_a: RegionLink,
    /// Region a's gateways, then region b's.
    gateways: Vec<AdminGateway>,
}

impl World {
    async fn start() -> World {
        let (a, b) = (RedisServer::start(), RedisServer::start());
        let addr = |r: &RedisServer| format!("127.0.0.1:{}", r.port).parse().unwrap();
        let a_to_b = RegionLink::start(addr(&b), Duration::from_millis(25)).await;
        let b_to_a = RegionLink::start(addr(&a), Duration::from_millis(25)).await;
        // Each region reaches its own Redis directly and the other's through the link.
        let seen_from_a = format!("a={},b={}", a.url(), a_to_b.url());
        let seen_from_b = format!("a={},b={}", b_to_a.url(), b.url());
        let (limit, per) = (N.to_string(), format!("{PER_S}s"));
        let mut gateways = Vec::new();
        for (region, regions) in [
            ("a", &seen_from_a),
            ("a", &seen_from_a),
            ("b", &seen_from_b),
            ("b", &seen_from_b),
        ] {
            let args = [
                "--region",
                region,
                "--regions",
                regions,
                "--limit",
                &limit,
                "--per",
                &per,
                "--key",
                "header:x-customer",
                "--log",
                "warn",
            ];
            let gw = tokio::task::block_in_place(|| AdminGateway::start(&args));
            gateways.push(gw);
        }
        World {
            _a: a,
            _b: b,
            a_to_b,
            b_to_a,
            gateways,
        }
    }

    fn addrs(&self, region: &str) -> Vec<SocketAddr> {
        let range = match region {
            "a" => 0..2,
            "b" => 2..4,
            _ => 0..4,
        };
        self.gateways[range].iter().map(|g| g.addr).collect()
    }

    /// Waits (at most 15 s) until every gateway's `GET /region` says `"cut_off": CUT`.
    fn until_cut(&self, cut: bool) {
        let want = format!("\"cut_off\":{cut}");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let states: Vec<String> = self
                .gateways
                .iter()
                .map(|g| send(g.admin, "GET", "/region", &[]).body)
                .collect();
            if states.iter().all(|s| s.contains(&want)) {
                return;
            }
            assert!(Instant::now() < deadline, "never {want}: {states:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Every gateway of `addrs` sent the key for `how_long`, two clients each, one request every
/// 2 ms per client: the 200s per gateway, and the time it took. Any answer other than 200 or
/// 429 fails the test.
fn hammer(addrs: &[SocketAddr], how_long: Duration) -> (Vec<u64>, Duration) {
    let started = Instant::now();
    let counts: Vec<Arc<AtomicU64>> = addrs.iter().map(|_| Arc::default()).collect();
    let other = Arc::new(AtomicBool::new(false));
    std::thread::scope(|scope| {
        for (addr, count) in addrs.iter().zip(&counts) {
            for _ in 0..2 {
                let (count, other) = (count.clone(), other.clone());
                scope.spawn(move || {
                    while started.elapsed() < how_long {
                        match send(*addr, "GET", "/", &[("x-customer", "acme")]).status {
                            200 => {
                                count.fetch_add(1, Ordering::SeqCst);
                            }
                            429 => {}
                            status => {
                                eprintln!("{addr} answered {status}");
                                other.store(true, Ordering::SeqCst);
                            }
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                });
            }
        }
    });
    assert!(
        !other.load(Ordering::SeqCst),
        "an answer other than 200 or 429"
    );
    let elapsed = started.elapsed();
    (
        counts.iter().map(|c| c.load(Ordering::SeqCst)).collect(),
        elapsed,
    )
}

/// `N + N/P × T`.
fn limit_over(elapsed: Duration) -> f64 {
    N as f64 + RATE * elapsed.as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_in_two_regions_hold_one_limit_together() {
    let world = World::start().await;
    let (counts, elapsed) =
        tokio::task::block_in_place(|| hammer(&world.addrs("all"), Duration::from_secs(6)));
    let total: u64 = counts.iter().sum();
    let most = 1.10 * limit_over(elapsed);
    assert!(
        total as f64 <= most,
        "{total} admitted ({counts:?}) in {elapsed:?}: over 1.10 × (N + N/P × T) = {most}"
    );
    assert!(
        counts.iter().all(|&c| c > 0),
        "every gateway served: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_the_traffic_in_one_region_gets_nearly_the_whole_limit() {
    let world = World::start().await;
    // Region b, whose home is the other region.
    let (counts, elapsed) =
        tokio::task::block_in_place(|| hammer(&world.addrs("b"), Duration::from_secs(6)));
    let total: u64 = counts.iter().sum();
    let limit = limit_over(elapsed);
    assert!(
        total as f64 >= 0.9 * limit,
        "region b admitted {total} ({counts:?}) of N + N/P × T = {limit}"
    );
    assert!(total as f64 <= 1.10 * limit, "{total} of {limit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_regions_keep_serving_within_their_share_and_the_link_back_restores_the_limit() {
    let world = World::start().await;
    tokio::task::block_in_place(|| {
        hammer(&world.addrs("all"), Duration::from_millis(500));
        world.a_to_b.cut();
        world.b_to_a.cut();
        world.until_cut(true);
        // Logged, and on every gateway's metrics.
        for g in &world.gateways {
            let metrics = send(g.admin, "GET", "/metrics", &[]).body;
            assert!(
                metrics
                    .lines()
                    .any(|l| l.starts_with("ratelimit_region_cut_off{") && l.ends_with(" 1")),
                "{metrics}"
            );
            assert!(
                g.log().contains("cut off from the other regions"),
                "{}",
                g.log()
            );
        }
        let (counts, elapsed) = hammer(&world.addrs("all"), Duration::from_secs(6));
        // The other region's Redis, away for the whole cut, is told once, not on every
        // attempt to reach it (a few a second).
        for g in &world.gateways {
            let log = g.log();
            let told = log
                .lines()
                .filter(|l| l.contains("WARN") && l.contains("cannot connect to redis"))
                .count();
            assert!(told <= 2, "{told} warnings while cut off:\n{log}");
        }
        // The default share: 1/2 of each limit per region.
        let share = 0.5 * limit_over(elapsed);
        for (region, admitted) in [("a", counts[0] + counts[1]), ("b", counts[2] + counts[3])] {
            let admitted = admitted as f64;
            assert!(
                admitted >= 0.5 * share && admitted <= 1.10 * share,
                "region {region} admitted {admitted} while cut off ({counts:?}); its share F × (N + N/P × T) is {share}"
            );
        }

        world.a_to_b.restore();
        world.b_to_a.restore();
        world.until_cut(false);
        // One limit again, the first window included: what the regions admitted while cut off
        // is charged at the home, so no fresh burst follows.
        let (counts, elapsed) = hammer(&world.addrs("all"), Duration::from_secs(4));
        let total: u64 = counts.iter().sum();
        let most = 1.10 * limit_over(elapsed);
        assert!(
            total as f64 <= most,
            "{total} admitted ({counts:?}) in {elapsed:?} after the link came back: over {most}"
        );
    });
}

#[test]
fn regions_flags_that_cannot_work_are_refused_at_start_up() {
    let regions = "a=redis://127.0.0.1:1,b=redis://127.0.0.1:2";
    for (args, says) in [
        (
            vec!["--region", "a", "--regions", regions, "--redis", "redis://127.0.0.1:1"],
            "--regions replaces --redis",
        ),
        (vec!["--regions", regions], "--regions needs --region NAME"),
        (vec!["--region", "c", "--regions", regions], "--region c is not one of --regions (a, b)"),
        (vec!["--region", "a"], "--region and --region-share go with --regions"),
        (vec!["--region", "a", "--regions", "a"], "--regions: \"a\" is not a list NAME=URL"),
        (vec!["--region", "a", "--regions", regions, "--region-share", "0"], "--region-share: \"0\" is not a decimal F with 0 < F <= 1"),
        (vec!["--region", "a", "--regions", regions, "--region-share", "1.5"], "--region-share: \"1.5\""),
        (vec!["--region", "a", "--regions", regions, "--algorithm", "sliding-window"], "--algorithm sliding-window (GCRA and the token bucket run across regions) does not work across regions yet"),
        (vec!["--region", "a", "--regions", regions, "--unit-lease-ms", "100"], "--unit-lease-ms"),
        (vec!["--region", "a", "--regions", regions, "--count-only", "5xx"], "--count-only (refunds)"),
        (vec!["--region", "a", "--regions", regions, "--concurrency", "3"], "--concurrency does not work across regions"),
        (vec!["--region", "a", "--regions", regions, "--batch"], "--batch does not work across regions"),
    ] {
        assert_refused(&args, says);
    }
    // A file's settings that cannot work across regions are refused by --check-config as at
    // start-up, by their line and field.
    let dir = std::env::temp_dir().join(format!("regions-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("limits.toml");
    std::fs::write(&file, "limit = 5\ncount_only = \"5xx\"\n").unwrap();
    let out = std::process::Command::new(crate::servers::gateway::gateway_bin())
        .args(["--region", "a", "--regions", regions, "--check-config"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "line 2, field `count_only`: --count-only (refunds) does not work across regions"
        ),
        "{stderr}"
    );
    // TLS material and a lazy start go with --regions as with --redis.
    let stderr = assert_refused(
        &[
            "--region",
            "a",
            "--regions",
            regions,
            "--redis-ca",
            "/nonexistent/ca.pem",
        ],
        "--redis-ca /nonexistent/ca.pem",
    );
    assert!(!stderr.contains("are for Redis"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
