//! The demo as a user runs it: the `gateway` example binary, its flags and its
//! `listening on` line, with the in-memory store and with `--redis`. The binary is the one
//! `cargo test` builds with the examples (run the whole `cargo test`, or build the examples
//! first when running this file alone).

use std::{io::Write, process::Command, time::Duration};

use crate::servers::{
    command_calls,
    gateway::{
        assert_refused, gateway_bin, get, get_path, send, start_gateway, start_gateway_with_stderr,
        AdminGateway, Gateway,
    },
    RedisCluster, RedisServer,
};
use tower_redis_ratelimit::redis;

#[test]
fn in_memory_by_default() {
    let gw = start_gateway(&["--limit", "3", "--per", "1m"]);
    assert!(
        gw.banner.iter().any(|l| l.contains("in-memory")),
        "{:?}",
        gw.banner
    );
    let statuses: Vec<u16> = (0..5).map(|_| get(gw.addr, "").0).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let (_, head) = get(gw.addr, "");
    assert!(
        head.contains("ratelimit-policy: \"default\";q=3;w=60"),
        "{head}"
    );
    assert!(head.contains("retry-after: "), "{head}");
}

#[test]
fn with_redis_the_limit_is_shared_between_instances() {
    let redis = RedisServer::start();
    let url = redis.url();
    shared_limit(&["--redis", &url]);
    // The same with exact batching on one of the two instances.
    let redis = RedisServer::start();
    let url = redis.url();
    shared_limit(&["--redis", &url, "--batch"]);
}

fn shared_limit(store: &[&str]) {
    shared_limit_of(store, "sliding-window", "60s");
}

/// Two gateways on `store`, running `algorithm` at 4 per `per`: a key's fifth and sixth
/// requests are refused, whichever instance they reach. Returns the first refusal.
fn shared_limit_of(store: &[&str], algorithm: &str, per: &str) -> String {
    let args: Vec<&str> = store
        .iter()
        .copied()
        .chain([
            "--algorithm",
            algorithm,
            "--limit",
            "4",
            "--per",
            per,
            "--key",
            "header:x-api-key",
        ])
        .collect();
    let a = start_gateway(&args);
    let b = start_gateway(
        &args[..2]
            .iter()
            .chain(&args[store.len()..])
            .copied()
            .collect::<Vec<_>>(),
    );
    if store.contains(&"--batch") {
        assert!(
            a.banner.iter().any(|l| l.contains("batching")),
            "{:?}",
            a.banner
        );
    }
    assert!(
        a.banner.iter().any(|l| l.contains("redis")),
        "{:?}",
        a.banner
    );
    let key = "x-api-key: k1\r\n";
    let answers: Vec<(u16, String)> = [&a, &b, &a, &b, &a, &b]
        .iter()
        .map(|gw| get(gw.addr, key))
        .collect();
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429]);
    // Another key has its own quota.
    assert_eq!(get(a.addr, "x-api-key: k2\r\n").0, 200);
    answers[4].1.clone()
}

/// Days since the Unix epoch of a date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = (y - era * 400) as u64;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe as i64 - 719_468) as u64
}

/// The year and month of a day since the Unix epoch (H. Hinnant's `civil_from_days`).
fn year_month(day: u64) -> (i64, u64) {
    let z = day as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = (z - era * 146_097) as u64;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe as i64 + era * 400 + i64::from(m <= 2);
    (y, m)
}

/// The day (since the epoch) the UTC window of `per` holding `now` ends, and the seconds
/// from `now` to that end: a day, a week from Monday, a calendar month, a calendar year.
fn window_end(per: &str, now: u64) -> (u64, u64) {
    let day = now / 86_400;
    let (y, m) = year_month(day);
    let end = match per {
        "1d" => day + 1,
        // 1970-01-01 was a Thursday, 3 days after a Monday.
        "1w" => day + 7 - (day + 3) % 7,
        "1mo" if m == 12 => days_from_civil(y + 1, 1, 1),
        "1mo" => days_from_civil(y, m + 1, 1),
        "1y" => days_from_civil(y + 1, 1, 1),
        _ => unreachable!("{per}"),
    };
    (end, end * 86_400 - now)
}

#[test]
fn window_ends_follow_the_calendar() {
    // 2024-02-10T12:00:00Z, a Saturday in a leap year.
    let now = days_from_civil(2024, 2, 10) * 86_400 + 43_200;
    assert_eq!(window_end("1d", now).1, 43_200);
    assert_eq!(window_end("1w", now).0, days_from_civil(2024, 2, 12));
    assert_eq!(window_end("1mo", now).0, days_from_civil(2024, 3, 1));
    assert_eq!(window_end("1y", now).0, days_from_civil(2025, 1, 1));
    let december = days_from_civil(2024, 12, 31) * 86_400;
    assert_eq!(window_end("1mo", december).0, days_from_civil(2025, 1, 1));
    assert_eq!(year_month(days_from_civil(2024, 2, 29)), (2024, 2));
}

/// A fixed window of a day, a calendar week, month and year, shared by two gateways on one
/// Redis: the count is one, and a refusal waits for the window's end in UTC (midnight, next
/// Monday, the first of next month, January 1st), which `Retry-After` and the `RateLimit`
/// header's `t` both say; the policy states the window's nominal length. A run that crosses
/// a window's end is run again.
#[test]
fn fixed_windows_are_shared_and_end_with_the_utc_calendar() {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    for (per, nominal) in [
        ("1d", 86_400),
        ("1w", 604_800),
        ("1mo", 2_592_000),
        ("1y", 31_536_000),
    ] {
        let mut checked = false;
        for _ in 0..2 {
            let redis = RedisServer::start();
            let url = redis.url();
            let (end, before) = window_end(per, now());
            let refusal = shared_limit_of(&["--redis", &url], "fixed-window", per);
            let (same_end, after) = window_end(per, now());
            if end != same_end {
                continue;
            }
            let field = |name: &str| {
                refusal
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap_or_else(|| panic!("no {name} in {refusal}"))
                    .trim()
                    .to_owned()
            };
            let retry: u64 = field("retry-after:").parse().unwrap();
            assert!(
                (after..=before).contains(&retry),
                "{per}: {after}..={before}: {refusal}"
            );
            let t: u64 = field("ratelimit:")
                .rsplit("t=")
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(
                (after..=before).contains(&t),
                "{per}: {after}..={before}: {refusal}"
            );
            let policy = format!("ratelimit-policy: \"default\";q=4;w={nominal}");
            assert!(refusal.contains(&policy), "{per}: {refusal}");
            checked = true;
            break;
        }
        assert!(checked, "two runs crossed the end of a {per} window");
    }
}

/// `--per 1w`, `1mo` and `1y` are a fixed window's: refused with another algorithm, as a
/// count other than 1, and in a plan that does not follow `--per` (a 30-day plan is not a
/// calendar month); a plan on calendar months gets its own quota; the start-up lines say
/// what the windows are.
#[test]
fn calendar_periods_are_a_fixed_windows_and_plans_follow_them() {
    assert_refused(
        &["--per", "1mo"],
        "--per 1mo: a calendar window (1w, 1mo, 1y) is counted by --algorithm fixed-window, not gcra",
    );
    assert_refused(
        &["--algorithm", "fixed-window", "--per", "2w"],
        "--per: \"2w\" is not a duration like 1s, 60s, 1m, 1h, or 1w, 1mo, 1y",
    );
    let plans = |plan: &'static str| {
        [
            "--algorithm",
            "fixed-window",
            "--per",
            "1mo",
            "--limit",
            "2",
            "--key",
            "header:x-api-key",
            "--plan",
            plan,
        ]
    };
    assert_refused(
        &plans("gold=5/30d"),
        "--plan gold=5/30d: a plan's period is --per's (1mo)",
    );
    assert_refused(
        &plans("gold=5/1y"),
        "--plan gold=5/1y: a plan's period is --per's (1mo)",
    );
    let gw = start_gateway(&plans("gold=3/1mo"));
    for line in [
        "limit: 2 per calendar month (UTC) per key (fixed-window)",
        "plan: key \"gold\" gets 3 per calendar month (UTC)",
    ] {
        assert!(
            gw.banner.iter().any(|l| l.contains(line)),
            "{line}: {:?}",
            gw.banner
        );
    }
    let calls = |key: &str| -> Vec<u16> {
        (0..4)
            .map(|_| get(gw.addr, format!("x-api-key: {key}\r\n")).0)
            .collect()
    };
    assert_eq!(calls("gold"), [200, 200, 200, 429]);
    assert_eq!(calls("silver"), [200, 200, 429, 429]);
}

/// A limits file may count calendar years; a reload that turns them into windows of a
/// duration (365 days from the epoch are other windows) is refused and the year stays.
#[test]
fn a_reload_cannot_turn_calendar_windows_into_a_duration() {
    let dir = TempDir::new("calendar");
    let file = dir.0.join("limits.toml");
    let text = |per: &str| {
        format!("algorithm = \"fixed-window\"\nkey = \"header:x-k\"\nlimit = 2\nper = \"{per}\"\n")
    };
    rename_into_place(&file, &text("1y"));
    let gw = AdminGateway::start(&["--config", file.to_str().unwrap()]);
    rename_into_place(&file, &text("365d"));
    crate::servers::signal(gw.child.id(), "-HUP");
    let log = gw.wait_lines("config refused", 1, Duration::from_secs(10));
    assert!(
        log.contains("config refused: per cannot change without a restart (1y in force, a duration in the file)"),
        "{log}"
    );
    rename_into_place(&file, &text("1y").replace("limit = 2", "limit = 3"));
    crate::servers::signal(gw.child.id(), "-HUP");
    let log = gw.wait_lines("config reloaded", 1, Duration::from_secs(10));
    assert!(log.contains(": limit 3 per calendar year (UTC)"), "{log}");
    let statuses: Vec<u16> = (0..4)
        .map(|_| send(gw.addr, "GET", "/", &[("x-k", "k")]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429], "3 per calendar year");
}

#[test]
fn trusted_proxy_and_failure_policy_flags() {
    // An unreachable --redis is found at start-up: the demo refuses to start, naming the flag.
    let out = Command::new(gateway_bin())
        .args([
            "--redis",
            &crate::servers::dead_redis_url(),
            "--listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--redis"));

    let gw = start_gateway(&[
        "--limit",
        "1",
        "--per",
        "1h",
        "--trusted-proxy",
        "127.0.0.0/8",
        "--on-redis-error",
        "closed",
    ]);
    // Behind the trusted proxy (the test itself, on 127.0.0.1), clients are told apart by
    // the rightmost untrusted X-Forwarded-For entry; a spoofed left entry changes nothing.
    assert_eq!(get(gw.addr, "x-forwarded-for: 198.51.100.1\r\n").0, 200);
    assert_eq!(
        get(gw.addr, "x-forwarded-for: 1.1.1.1, 198.51.100.1\r\n").0,
        429
    );
    assert_eq!(
        get(gw.addr, "x-forwarded-for: 198.51.100.2, 127.0.0.5\r\n").0,
        200
    );
}

/// A `"` or a non-UTF-8 byte in the client-written part of X-Forwarded-For does not make the
/// whole header count as garbage: the request is still keyed by the client's entry, not by
/// the trusted proxy's address, so a client that spent its quota gets no fresh one.
#[test]
fn garbage_left_of_the_client_entry_does_not_reset_its_quota() {
    let gw = start_gateway(&[
        "--limit",
        "5",
        "--per",
        "1h",
        "--key",
        "ip",
        "--trusted-proxy",
        "127.0.0.1/32",
    ]);
    let client = "x-forwarded-for: 198.51.100.77\r\n";
    let statuses: Vec<u16> = (0..6).map(|_| get(gw.addr, client).0).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    for garbage in [
        &b"x-forwarded-for: \", 198.51.100.77\r\n"[..],
        b"x-forwarded-for: \xff\xfe, 198.51.100.77\r\n",
        b"x-forwarded-for: \"\xc3, 198.51.100.77\r\n",
        b"x-forwarded-for: \xff\r\nx-forwarded-for: 198.51.100.77\r\n",
    ] {
        let statuses: Vec<u16> = (0..5).map(|_| get(gw.addr, garbage).0).collect();
        assert_eq!(
            statuses,
            [429; 5],
            "{:?} escaped the client's quota",
            String::from_utf8_lossy(garbage)
        );
    }
    // The trusted proxy's own bucket (requests without the header) was never touched.
    assert_eq!(get(gw.addr, "").0, 200);
}

#[test]
fn ipv6_prefix_groups_clients() {
    let args = [
        "--limit",
        "1",
        "--per",
        "1h",
        "--trusted-proxy",
        "127.0.0.1/32",
    ];
    // Two clients in 2001:db8:1::/48, in different /64s.
    let a = "x-forwarded-for: 2001:db8:1:a::1\r\n";
    let b = "x-forwarded-for: [2001:db8:1:b::2]:443\r\n";
    let by48 = start_gateway(&[&args[..], &["--ipv6-prefix", "48"]].concat());
    assert_eq!(get(by48.addr, a).0, 200);
    assert_eq!(get(by48.addr, b).0, 429, "same /48: one quota");
    let by64 = start_gateway(&args);
    assert_eq!(get(by64.addr, a).0, 200);
    assert_eq!(get(by64.addr, b).0, 200, "different /64s: two quotas");
    assert_eq!(
        get(by64.addr, "x-forwarded-for: 2001:db8:1:a::9\r\n").0,
        429
    );

    for bad in ["0", "129", "-1", "x", ""] {
        let out = Command::new(gateway_bin())
            .args(["--ipv6-prefix", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--ipv6-prefix {bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--ipv6-prefix"), "{err}");
        assert!(err.contains("usage:"), "{err}");
    }
}

#[test]
fn bad_flags_exit_with_a_clear_error() {
    for (args, needle) in [
        (&["--limit", "0"][..], "quota.limit"),
        (&["--per", "2x"][..], "--per"),
        (&["--algorithm", "leaky"][..], "--algorithm"),
        (&["--key", "cookie"][..], "--key"),
        (&["--trusted-proxy", "10.0.0.0/99"][..], "trusted_proxy"),
        (&["--sliding"][..], "unknown flag"),
        (&["--redis-cluster", ","][..], "--redis-cluster"),
        (
            &[
                "--redis",
                "redis://127.0.0.1:1",
                "--redis-cluster",
                "redis://127.0.0.1:2",
            ][..],
            "give one of",
        ),
        (
            &["--on-redis-error", "local", "--local-share", "0"][..],
            "--local-share",
        ),
        (&["--batch"][..], "--batch"),
        (&["--unit-lease-ms", "0"][..], "--unit-lease-ms"),
        (&["--unit-lease-ms", "20000"][..], "lease.lifetime"),
        (
            &["--algorithm", "sliding-window", "--unit-lease-ms", "50"][..],
            "not the sliding window",
        ),
    ] {
        assert_refused(args, needle);
    }
}

#[test]
fn redis_down_follows_on_redis_error() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let common_args = [
        "--redis", &url, "--limit", "4", "--per", "1h", "--key", "global",
    ];
    let local = start_gateway(
        &[
            &common_args[..],
            &["--on-redis-error", "local", "--local-share", "2"],
        ]
        .concat(),
    );
    let closed = start_gateway(&[&common_args[..], &["--on-redis-error", "closed"]].concat());
    let open = start_gateway(&[&common_args[..], &["--timeout-ms", "50"]].concat());
    assert!(
        local.banner.iter().any(|l| l.contains("1/2 of the quota")),
        "{:?}",
        local.banner
    );
    assert_eq!(get(local.addr, "").0, 200);
    redis.kill();
    // Local share: 4 / 2 = 2 per instance while Redis is away.
    let statuses: Vec<u16> = (0..4).map(|_| get(local.addr, "").0).collect();
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert_eq!(get(closed.addr, "").0, 503);
    let (status, head) = get(open.addr, "");
    assert_eq!(status, 200);
    assert!(!head.contains("ratelimit:"), "{head}");
}

#[test]
fn with_redis_cluster_the_limit_is_shared_between_instances() {
    let cluster = RedisCluster::start(3, 0);
    let nodes = cluster.urls().join(",");
    let args = [
        "--redis-cluster",
        &nodes,
        "--limit",
        "3",
        "--per",
        "1h",
        "--key",
        "header:x-api-key",
    ];
    let a = start_gateway(&args);
    let b = start_gateway(&args);
    assert!(
        a.banner.iter().any(|l| l.contains("redis cluster")),
        "{:?}",
        a.banner
    );
    // Keys of different users land on different primaries; each is limited exactly.
    for user in ["u1", "u2", "u3", "u4"] {
        let key = format!("x-api-key: {user}\r\n");
        let statuses: Vec<u16> = [&a, &b, &a, &b]
            .iter()
            .map(|gw| get(gw.addr, &key).0)
            .collect();
        assert_eq!(statuses, [200, 200, 200, 429], "{user}");
    }
}

#[test]
fn no_limit_serves_without_the_layer() {
    let gw = start_gateway(&["--no-limit", "--limit", "1", "--per", "1h"]);
    for _ in 0..3 {
        let (status, head) = get(gw.addr, "");
        assert_eq!(status, 200);
        assert!(!head.contains("ratelimit"), "{head}");
    }
}

/// Redis closes idle connections after a second: an endpoint called more sparsely than that
/// does not fail (no 503 under `closed`).
#[test]
fn sparse_traffic_survives_redis_closing_idle_connections() {
    let redis = RedisServer::start_with(&["--timeout", "1"]);
    let url = redis.url();
    let gw = start_gateway(&[
        "--redis",
        &url,
        "--key",
        "header:x-key",
        "--on-redis-error",
        "closed",
    ]);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(get(gw.addr, "x-key: a\r\n").0);
        std::thread::sleep(Duration::from_millis(1_600));
    }
    statuses.push(get(gw.addr, "x-key: a\r\n").0);
    assert_eq!(statuses, [200, 200, 200, 200]);
}

/// A primary demoted to a replica answers READONLY to every key: under
/// `--on-redis-error local` requests are decided at the local share, not 503.
#[test]
fn a_demoted_primary_is_an_unavailable_store_for_the_local_policy() {
    let redis = RedisServer::start();
    let other = RedisServer::start();
    let url = redis.url();
    let gw = start_gateway(&[
        "--redis",
        &url,
        "--key",
        "header:x-key",
        "--limit",
        "4",
        "--per",
        "1h",
        "--on-redis-error",
        "local",
        "--local-share",
        "2",
    ]);
    assert_eq!(get(gw.addr, "x-key: warm\r\n").0, 200);
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(other.port)
        .query(&mut redis.conn())
        .unwrap();
    // 4 / 2 = 2 for a fresh key, decided in the gateway.
    let statuses: Vec<u16> = (0..3).map(|_| get(gw.addr, "x-key: fresh\r\n").0).collect();
    assert_eq!(statuses, [200, 200, 429]);
}

/// `--timeout-ms` is the timeout in force, also above redis-rs' own 500 ms response timeout:
/// with Redis hung, a request waits out the timeout given, above and below 500 ms, and then
/// gets the closed policy's 503.
#[test]
fn timeout_ms_is_the_timeout_in_force() {
    let redis = RedisServer::start();
    let url = redis.url();
    let gateways: Vec<(u64, Gateway)> = [300u64, 1_500]
        .into_iter()
        .map(|ms| {
            let ms_arg = ms.to_string();
            let gw = start_gateway(&[
                "--redis",
                &url,
                "--timeout-ms",
                &ms_arg,
                "--on-redis-error",
                "closed",
            ]);
            assert_eq!(get(gw.addr, "").0, 200);
            (ms, gw)
        })
        .collect();
    redis.signal("-STOP");
    for (ms, gw) in &gateways {
        let started = std::time::Instant::now();
        let (status, _) = get(gw.addr, "");
        let took = started.elapsed();
        println!("--timeout-ms {ms}: {status} after {took:?}");
        assert_eq!(status, 503);
        assert!(
            took >= Duration::from_millis(*ms),
            "--timeout-ms {ms}: {took:?}"
        );
        assert!(
            took < Duration::from_millis(*ms + 2_000),
            "--timeout-ms {ms}: {took:?}"
        );
    }
    redis.signal("-CONT");
}

#[test]
fn status_and_sleep_routes() {
    let gw = start_gateway(&["--limit", "1000"]);
    for (path, want) in [
        ("/status/404", 404),
        ("/status/201", 201),
        ("/status/599", 599),
        ("/status/503", 503),
        ("/status/600", 400),
        ("/status/99", 400),
        ("/status/abc", 400),
        ("/sleep/60001", 400),
        ("/sleep/x", 400),
        ("/", 200),
    ] {
        assert_eq!(get_path(gw.addr, path, "").0, want, "{path}");
    }
    let started = std::time::Instant::now();
    assert_eq!(get_path(gw.addr, "/sleep/300", "").0, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
}

/// `--shadow` never rejects, adds no rate-limit field to any response, and logs each
/// would-be denial; with each algorithm, in memory, on Redis and on a cluster.
#[test]
fn shadow_never_rejects_and_logs_would_be_denials_without_their_key() {
    let redis = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    let stores: [Vec<String>; 3] = [
        vec![],
        vec!["--redis".into(), redis.url()],
        vec!["--redis-cluster".into(), cluster.urls().join(",")],
    ];
    let dir = std::env::temp_dir().join(format!("shadow-gw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for store in &stores {
        for algorithm in ["gcra", "token-bucket", "sliding-window"] {
            let what = format!("{store:?} {algorithm}");
            let log = dir.join(format!("{algorithm}-{}.log", store.len()));
            let file = std::fs::File::create(&log).unwrap();
            let mut args: Vec<&str> = store.iter().map(String::as_str).collect();
            let prefix = format!("shadow-{algorithm}");
            args.extend([
                "--algorithm",
                algorithm,
                "--limit",
                "3",
                "--per",
                "1h",
                "--key",
                "header:x-key",
                "--prefix",
                &prefix,
                "--shadow",
            ]);
            let gw = start_gateway_with_stderr(&args, file);
            assert!(
                gw.banner.iter().any(|l| l.contains("shadow")),
                "{:?}",
                gw.banner
            );
            let responses: Vec<(u16, String)> = (0..6)
                .map(|_| get(gw.addr, "x-key: s3cr3t-api-key\r\n"))
                .collect();
            assert!(
                responses.iter().all(|r| r.0 == 200),
                "{what}: {responses:?}"
            );
            // Shadow mode shows clients nothing: no rate-limit field on any response, the
            // would-be denials (the fourth request on) included.
            for (status, head) in &responses {
                for field in ["ratelimit", "x-ratelimit-", "retry-after"] {
                    assert!(!head.contains(field), "{what}: {status} {head}");
                }
            }
            drop(gw);
            let logged = std::fs::read_to_string(&log).unwrap();
            // The three would-be denials come within ten seconds: one line says so, and the
            // next would count those it left out.
            assert_eq!(
                logged.matches("would deny").count(),
                1,
                "{what}: log {logged}"
            );
            assert!(logged.contains("would_deny=1"), "{what}: log {logged}");
            // A key can be a credential: no line at `info` names it.
            assert!(!logged.contains("s3cr3t"), "{what}: log {logged}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The gateway never prints a Redis password, on stdout or on stderr (logs at `trace`
/// included), whether it connects, is refused, starts lazily and fails later, or is given a
/// URL it cannot parse; for `--redis`, `--redis-sentinel` and `--redis-cluster`. Where it shows
/// a URL, the password is `***`.
#[test]
fn the_gateway_never_prints_a_redis_password() {
    const SECRETS: [&str; 3] = ["gw-secret-1", "gw-secret-2", "gw-wrong-3"];
    let redis = RedisServer::start_with(&[
        "--requirepass",
        SECRETS[0],
        "--user",
        "limiter",
        "on",
        &format!(">{}", SECRETS[1]),
        "~*",
        "&*",
        "+@all",
    ]);
    let port = redis.port;
    let dead = crate::servers::free_port();
    let stderr_file = std::env::temp_dir().join(format!("trr-gateway-stderr-{port}"));
    let leaks = |what: &str, out: &str| {
        for secret in SECRETS {
            assert!(!out.contains(secret), "{what} shows {secret}: {out}");
        }
    };

    // Connected, as the default user and as an ACL user: the banner shows the URL without its
    // password, and checks (logged at trace) run on Redis.
    for (user, url, want) in [
        (
            "default",
            format!("redis://:{}@127.0.0.1:{port}", SECRETS[0]),
            format!("store: redis at redis://:***@127.0.0.1:{port} "),
        ),
        (
            "limiter",
            format!("redis://limiter:{}@127.0.0.1:{port}/0", SECRETS[1]),
            format!("store: redis at redis://limiter:***@127.0.0.1:{port}/0 "),
        ),
    ] {
        let stderr = std::fs::File::create(&stderr_file).unwrap();
        let gw = start_gateway_with_stderr(
            &[
                "--redis", &url, "--log", "trace", "--limit", "2", "--per", "1h", "--prefix", user,
            ],
            stderr,
        );
        let statuses: Vec<u16> = (0..3).map(|_| get(gw.addr, "").0).collect();
        assert_eq!(statuses, [200, 200, 429], "{url}");
        let stdout = gw.banner.join("\n");
        drop(gw);
        let stderr = std::fs::read_to_string(&stderr_file).unwrap();
        assert!(stdout.contains(&want), "{want}: {stdout}");
        assert!(stderr.contains("rate limit: decided"), "no log: {stderr}");
        leaks("stdout", &stdout);
        leaks("stderr", &stderr);
    }

    // Refused (a wrong password), unreachable, unparsable: the one error line shows no
    // password.
    let wrong = format!("redis://:{}@127.0.0.1:{port}", SECRETS[2]);
    let dead_url = format!("redis://:{}@127.0.0.1:{dead}", SECRETS[0]);
    let dead_user_url = format!("rediss://limiter:{}@127.0.0.1:{dead}", SECRETS[1]);
    let no_scheme = format!(":{}@127.0.0.1:{port}", SECRETS[0]);
    let bad_sentinel = format!("redis://:{}@127.0.0.1:{dead}/x", SECRETS[0]);
    for args in [
        vec!["--redis", &wrong],
        vec!["--redis", &dead_url],
        vec!["--redis", &no_scheme],
        vec!["--redis-sentinel", &dead_url, "--sentinel-master", "m"],
        vec![
            "--redis-sentinel",
            &format!("{dead_user_url},{dead_url}"),
            "--sentinel-master",
            "m",
        ],
        vec!["--redis-sentinel", &bad_sentinel, "--sentinel-master", "m"],
        vec!["--redis-cluster", &dead_url],
        vec!["--redis-cluster", &format!("{dead_url},{wrong}")],
        vec!["--redis-cluster", &dead_url, "--lazy-connect"],
    ] {
        let out = Command::new(gateway_bin())
            .args(["--listen", "127.0.0.1:0", "--connect-timeout-ms", "500"])
            .args(["--log", "trace"])
            .args(&args)
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(!out.status.success(), "{args:?} started: {stdout}");
        assert!(stderr.contains("error: --redis"), "{args:?}: {stderr}");
        assert!(stderr.contains(":***@"), "{args:?}: {stderr}");
        leaks("stdout", &stdout);
        leaks("stderr", &stderr);
    }

    // Lazy: started with a wrong password, then failing on each check (logged).
    for args in [
        vec!["--redis", &wrong],
        vec!["--redis-sentinel", &dead_url, "--sentinel-master", "m"],
    ] {
        let stderr = std::fs::File::create(&stderr_file).unwrap();
        let mut all = args.clone();
        all.extend([
            "--lazy-connect",
            "--log",
            "trace",
            "--on-redis-error",
            "closed",
        ]);
        let gw = start_gateway_with_stderr(&all, stderr);
        assert_eq!(get(gw.addr, "").0, 503, "{args:?}");
        let stdout = gw.banner.join("\n");
        drop(gw);
        let stderr = std::fs::read_to_string(&stderr_file).unwrap();
        assert!(stdout.contains(":***@"), "{args:?}: {stdout}");
        assert!(
            stderr.contains("cannot connect to redis"),
            "{args:?}: {stderr}"
        );
        leaks("stdout", &stdout);
        leaks("stderr", &stderr);
    }
    let _ = std::fs::remove_file(&stderr_file);
}

/// `--plan KEY=N/PERIOD` gives a key its own quota, with each algorithm, in memory, on
/// Redis and on a cluster; a plan that cannot work (one the limiter would refuse on each
/// request included), a key given two plans, or a plan without `--key header:NAME`, stops the
/// gateway at start-up.
#[test]
fn plans_give_keys_their_own_quota() {
    let redis = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    let url = redis.url();
    let nodes = cluster.urls().join(",");
    for store in [
        vec![],
        vec!["--redis", url.as_str()],
        vec!["--redis-cluster", nodes.as_str()],
    ] {
        for algorithm in ["gcra", "token-bucket", "sliding-window"] {
            let mut args = store.clone();
            let prefix = format!("plan-{algorithm}");
            args.extend([
                "--algorithm",
                algorithm,
                "--key",
                "header:x-key",
                "--limit",
                "2",
                "--per",
                "1h",
                "--plan",
                "gold=5/1h",
                "--plan",
                "silver=3/1h",
                "--prefix",
                &prefix,
            ]);
            let gw = start_gateway(&args);
            for (key, want) in [("gold", 5), ("silver", 3), ("plain", 2)] {
                let allowed = (0..8)
                    .filter(|_| get(gw.addr, format!("x-key: {key}\r\n")).0 == 200)
                    .count();
                assert_eq!(allowed, want, "{store:?} {algorithm} {key}");
            }
        }
    }
    for (args, says) in [
        (
            vec!["--plan", "gold=0/1h", "--key", "header:x-key"],
            "quota.limit",
        ),
        (
            vec!["--plan", "gold=5", "--key", "header:x-key"],
            "KEY=N/PERIOD",
        ),
        (vec!["--plan", "gold=5/1h"], "--key header:NAME"),
    ] {
        assert_refused(&args, says);
    }

    // A plan the limiter would refuse on each request (a sliding window takes only quotas of
    // its own period), and a key given a second plan: refused at start-up, in one line that
    // names the plan.
    for (args, says) in [
        (
            vec![
                "--algorithm",
                "sliding-window",
                "--per",
                "60s",
                "--plan",
                "gold=100/1s",
            ],
            "error: --plan gold=100/1s: invalid quota.period",
        ),
        (
            vec![
                "--plan",
                "gold=5/1h",
                "--plan",
                "silver=3/1h",
                "--plan",
                "gold=6/1h",
            ],
            "error: --plan gold=6/1h: the key \"gold\" has a plan already (--plan gold=5/1h)",
        ),
    ] {
        let args = [&args[..], &["--key", "header:x-key"]].concat();
        let stderr = assert_refused(&args, says);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
    // A sliding window's plan of its own period, however written, is in force.
    let gw = start_gateway(&[
        "--algorithm",
        "sliding-window",
        "--per",
        "60s",
        "--limit",
        "2",
        "--key",
        "header:x-key",
        "--plan",
        "gold=3/1m",
    ]);
    let allowed = (0..5)
        .filter(|_| get(gw.addr, "x-key: gold\r\n").0 == 200)
        .count();
    assert_eq!(allowed, 3, "{:?}", gw.banner);
}

/// `--count-only LIST`: only responses whose status is in LIST spend quota, on the in-memory
/// store, one Redis and a cluster, with each algorithm; a LIST that is not one stops the
/// gateway at start-up.
#[test]
fn count_only_spends_quota_on_the_listed_statuses_only() {
    let redis = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    let url = redis.url();
    let nodes = cluster.urls().join(",");
    let stores = [
        vec![],
        vec!["--redis", url.as_str()],
        vec!["--redis-cluster", nodes.as_str()],
    ];
    for store in &stores {
        for algorithm in ["gcra", "token-bucket", "sliding-window"] {
            let mut args = store.clone();
            let prefix = format!("count-{algorithm}");
            args.extend([
                "--algorithm",
                algorithm,
                "--limit",
                "3",
                "--per",
                "1h",
                "--count-only",
                "401,403,5xx",
                "--prefix",
                &prefix,
            ]);
            let gw = start_gateway(&args);
            let mut statuses = Vec::new();
            for path in [
                "/status/200",
                "/status/200",
                "/status/404",
                "/status/200",
                "/",
                "/status/503",
                "/status/200",
                "/status/403",
                "/status/401",
                "/status/401",
                "/status/200",
            ] {
                statuses.push(get_path(gw.addr, path, "").0);
            }
            assert_eq!(
                statuses,
                [200, 200, 404, 200, 200, 503, 200, 403, 401, 429, 429],
                "{store:?} {algorithm}"
            );
        }
    }
    for bad in ["6xx", "", "401,abc"] {
        assert_refused(&["--count-only", bad], "--count-only");
    }
}

/// `--concurrency N`: at most N requests of one key in flight across the gateways sharing a
/// store (two gateways on one Redis, two on a cluster; one in memory), on top of the rate
/// limit, with each algorithm; other keys are not held up, and the slots come back when the
/// requests end. A bad `--concurrency` or `--lease-ms` stops the gateway at start-up.
#[test]
fn concurrency_caps_the_requests_of_a_key_in_flight() {
    let redis = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    let url = redis.url();
    let nodes = cluster.urls().join(",");
    let stores = [
        vec![],
        vec!["--redis", url.as_str()],
        vec!["--redis-cluster", nodes.as_str()],
    ];
    for store in &stores {
        for algorithm in ["gcra", "token-bucket", "sliding-window"] {
            let prefix = format!("conc-{algorithm}");
            let mut args = store.clone();
            args.extend([
                "--algorithm",
                algorithm,
                "--key",
                "header:x-key",
                "--limit",
                "1000",
                "--per",
                "1s",
                "--concurrency",
                "2",
                "--prefix",
                &prefix,
            ]);
            let a = start_gateway(&args);
            // In memory each gateway has its own slots: both sleepers go through one.
            let b = if store.is_empty() {
                None
            } else {
                Some(start_gateway(&args))
            };
            let b_addr = b.as_ref().map_or(a.addr, |b| b.addr);
            assert!(
                a.banner
                    .iter()
                    .any(|l| l.contains("concurrency: at most 2")),
                "{:?}",
                a.banner
            );
            let sleepers: Vec<_> = [a.addr, b_addr]
                .into_iter()
                .map(|addr| {
                    std::thread::spawn(move || get_path(addr, "/sleep/1500", "x-key: k\r\n").0)
                })
                .collect();
            std::thread::sleep(Duration::from_millis(500));
            let label = format!("{store:?} {algorithm}");
            assert_eq!(get_path(a.addr, "/", "x-key: k\r\n").0, 429, "{label}");
            assert_eq!(get_path(b_addr, "/", "x-key: k\r\n").0, 429, "{label}");
            assert_eq!(get_path(a.addr, "/", "x-key: other\r\n").0, 200, "{label}");
            for s in sleepers {
                assert_eq!(s.join().unwrap(), 200, "{label}");
            }
            // Released when the responses end (on Redis, one round trip later).
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(get_path(a.addr, "/", "x-key: k\r\n").0, 200, "{label}");
        }
    }
    for (args, says) in [
        (vec!["--concurrency", "0"], "--concurrency"),
        (vec!["--concurrency", "2", "--lease-ms", "5"], "lease"),
        (vec!["--lease-ms", "5000"], "--concurrency"),
        // --shadow promises never to reject, which a concurrency limit would.
        (vec!["--concurrency", "1", "--shadow"], "--shadow"),
    ] {
        assert_refused(&args, says);
    }
}

/// A gateway killed while its requests hold slots: another gateway on the same Redis finds
/// them taken, and free again within the lease (`--lease-ms 1000`).
#[test]
fn a_killed_gateway_gives_its_slots_back_within_the_lease() {
    let redis = RedisServer::start();
    let url = redis.url();
    let args = [
        "--redis",
        url.as_str(),
        "--key",
        "header:x-key",
        "--limit",
        "1000",
        "--concurrency",
        "1",
        "--lease-ms",
        "1000",
        "--prefix",
        "conc-kill",
    ];
    let a = start_gateway(&args);
    let b = start_gateway(&args);
    let a_addr = a.addr;
    // Held until the gateway dies (the read then fails: the thread's result is ignored).
    let _holder = std::thread::spawn(move || {
        let _ = std::panic::catch_unwind(|| get_path(a_addr, "/sleep/30000", "x-key: k\r\n"));
    });
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(get_path(b.addr, "/", "x-key: k\r\n").0, 429);
    crate::servers::signal(a.child.id(), "-KILL");
    let killed = std::time::Instant::now();
    // Renewed leases outlive the kill by at most one lease.
    let mut statuses = Vec::new();
    loop {
        let status = get_path(b.addr, "/", "x-key: k\r\n").0;
        statuses.push(status);
        if status == 200 {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_millis(2_500),
            "the slot was not back 2.5 s after the kill (lease 1 s): {statuses:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        statuses.len() > 1,
        "the slot was free at once after the kill: {statuses:?}"
    );
    drop(a);
}

/// `threads` clients, each sending GETs to its gateway (round robin over `gateways`) until
/// `requests` in all were answered; the number answered 200 and the time it took.
fn flood(gateways: &[&Gateway], threads: usize, requests: usize) -> (usize, Duration) {
    let started = std::time::Instant::now();
    let ok = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let addr = gateways[t % gateways.len()].addr;
            let ok = &ok;
            s.spawn(move || {
                for _ in 0..requests / threads {
                    let (status, _) = get(addr, "");
                    assert!(status == 200 || status == 429, "status {status}");
                    if status == 200 {
                        ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    (ok.into_inner(), started.elapsed())
}

#[test]
fn unit_leases_answer_a_hot_allowed_key_with_few_store_calls_and_keep_its_limit() {
    let redis = RedisServer::start();
    let url = redis.url();
    let scripts = || command_calls(&mut redis.conn(), |name| name.starts_with("eval"));
    // A key far below its limit, served by two gateways: leased, a handful of script calls.
    let hot = [
        "--redis",
        &url,
        "--key",
        "global",
        "--limit",
        "1000000",
        "--per",
        "1s",
        "--unit-lease-ms",
        "50",
        "--prefix",
        "hot",
    ];
    let (a, b) = (start_gateway(&hot), start_gateway(&hot));
    assert!(
        a.banner.iter().any(|l| l.contains("unit leases")),
        "{:?}",
        a.banner
    );
    let before = scripts();
    let (ok, _) = flood(&[&a, &b], 8, 4_000);
    let calls = scripts() - before;
    assert_eq!(ok, 4_000, "every request is allowed");
    assert!(
        calls < 1_000,
        "{calls} script calls for 4,000 requests: the hot key was not leased"
    );
    let (_, head) = get(a.addr, "");
    assert!(head.contains("ratelimit: \"default\";r="), "{head}");
    drop((a, b));

    // A limit that binds: 50 a minute (burst 50) over two leasing gateways. In the flood's
    // time T, the key admits at most burst + (T + lifetime) / emission (1.2 s).
    let tight = [
        "--redis",
        &url,
        "--key",
        "global",
        "--limit",
        "50",
        "--per",
        "1m",
        "--unit-lease-ms",
        "50",
        "--prefix",
        "tight",
    ];
    let (a, b) = (start_gateway(&tight), start_gateway(&tight));
    let (ok, took) = flood(&[&a, &b], 8, 1_600);
    let bound = 50 + ((took.as_secs_f64() + 0.05) / 1.2).floor() as usize;
    assert!(ok <= bound, "{ok} admitted in {took:?}, bound {bound}");
    assert!(ok >= 40, "only {ok} of the burst of 50 admitted");
}

/// The gateway demo as a user runs it with `--count-only 401`: `burst` slow uncounted
/// requests (`/sleep`) are admitted, stay in flight longer than their charges take to drain,
/// and end (200, refunded) after counted 401s took the key's units. Their refunds give back
/// nothing then: all the 401s, before and after they end, are at most what GCRA admits in
/// the time they took, `burst + elapsed / emission`. Returns the statuses seen.
fn slow_uncounted_requests_give_back_nothing_drained(
    args: &[&str],
    burst: usize,
    emission: Duration,
    sleep: Duration,
) -> (Vec<u16>, usize) {
    use crate::servers::gateway::{get_path, start_gateway};
    use std::time::Instant;
    let mut all = vec![
        "--per",
        "2s",
        "--count-only",
        "401",
        "--key",
        "header:x-user",
    ];
    all.extend_from_slice(args);
    let gw = start_gateway(&all);
    let addr = gw.addr;
    let header = "x-user: eve\r\n";
    let start = Instant::now();
    let path = format!("/sleep/{}", sleep.as_millis());
    let sleepers: Vec<_> = (0..burst)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || get_path(addr, &path, header).0)
        })
        .collect();
    // Every sleeper's charge has drained (the whole burst takes 2 s to drain) while they are
    // still in flight.
    std::thread::sleep(
        (start + Duration::from_millis(2_100)).saturating_duration_since(Instant::now()),
    );
    let first = Instant::now();
    let mut statuses: Vec<u16> = (0..10)
        .map(|_| get_path(addr, "/status/401", header).0)
        .collect();
    for s in sleepers {
        assert_eq!(
            s.join().unwrap(),
            200,
            "{args:?}: a slow request was refused"
        );
    }
    statuses.extend((0..10).map(|_| get_path(addr, "/status/401", header).0));
    let elapsed = first.elapsed();
    let counted = statuses.iter().filter(|&&s| s == 401).count();
    let bound = burst + (elapsed.as_micros() / emission.as_micros()) as usize;
    assert!(
        counted <= bound,
        "{args:?}: {counted} counted 401s in {elapsed:?}, at most {bound}: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|&s| s == 401 || s == 429),
        "{args:?}: {statuses:?}"
    );
    (statuses, bound)
}

/// Slow uncounted requests against counted ones, through the gateway, time-scaled (a quota
/// per 2 s): GCRA on Redis and
/// in memory, the token bucket with a larger burst on Redis and in memory, each on its own
/// gateway at once. The first 401s take the burst; the slow requests' refunds give none of
/// it back (were each to give back its unit, the key would serve about twice its burst).
#[test]
fn slow_uncounted_requests_do_not_hand_out_counted_units_through_the_gateway() {
    let redis = RedisServer::start();
    let url = redis.url();
    let configs: Vec<(Vec<String>, usize, Duration)> = vec![
        (
            vec!["--algorithm", "gcra", "--limit", "5", "--redis", &url],
            5,
            400,
        ),
        (vec!["--algorithm", "gcra", "--limit", "5"], 5, 400),
        (
            vec![
                "--algorithm",
                "token-bucket",
                "--limit",
                "8",
                "--burst",
                "8",
                "--redis",
                &url,
            ],
            8,
            250,
        ),
        (
            vec![
                "--algorithm",
                "token-bucket",
                "--limit",
                "8",
                "--burst",
                "8",
            ],
            8,
            250,
        ),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (args, burst, emission_ms))| {
        let mut args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        args.extend(["--prefix".to_owned(), format!("slow{i}")]);
        (args, burst, Duration::from_millis(emission_ms))
    })
    .collect();
    let runs: Vec<_> = configs
        .into_iter()
        .map(|(args, burst, emission)| {
            std::thread::spawn(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                // The sleepers end a little after the first 401s, well before those drain.
                slow_uncounted_requests_give_back_nothing_drained(
                    &args,
                    burst,
                    emission,
                    Duration::from_millis(2_500),
                )
            })
        })
        .collect();
    for run in runs {
        run.join().unwrap();
    }
}

/// A directory of its own under the system's temporary directory, removed when dropped.
pub(crate) struct TempDir(pub(crate) std::path::PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("gateway-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Replaces the file at `path` at once, as a writer that renames into place does.
pub(crate) fn rename_into_place(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// An emptied file (truncated for writing, and left so) is refused with a clear error, on
/// SIGHUP too; the limits in force stay, deny list included.
#[test]
fn an_emptied_config_file_is_refused_and_the_limits_in_force_stay() {
    let dir = TempDir::new("empty");
    let file = dir.0.join("limits.toml");
    rename_into_place(
        &file,
        "key = \"header:x-k\"\nlimit = 3\nper = \"1h\"\ndeny = [\"evil\"]\n",
    );
    let gw = AdminGateway::start(&["--config", file.to_str().unwrap()]);
    let within = Duration::from_secs(10);
    std::fs::write(&file, "").unwrap();
    let log = gw.wait_lines("config refused", 1, within);
    assert!(
        log.contains("config refused: --config ") && log.contains(": the file is empty"),
        "{log}"
    );
    crate::servers::signal(gw.child.id(), "-HUP");
    let log = gw.wait_lines("config refused", 2, within);
    assert!(!log.contains("config reloaded"), "{log}");
    let call = |k: &str| send(gw.addr, "GET", "/", &[("x-k", k)]).status;
    assert_eq!(call("evil"), 403, "the deny list stays");
    let statuses: Vec<u16> = (0..4).map(|_| call("k")).collect();
    assert_eq!(statuses, [200, 200, 200, 429], "3 per hour stays");
}

/// A file written in place in two parts, the first of which parses (`limit = N` without its
/// `per`), with SIGHUP sent between them: what is put in force is the whole file, once it has
/// stopped changing, within 1 s of its last write (3 s given here). The writer pauses 30 ms
/// between the parts, against the 100 ms the file must stay unchanged.
#[test]
fn a_config_file_being_written_is_read_once_it_has_settled() {
    let dir = TempDir::new("settle");
    let file = dir.0.join("limits.toml");
    let whole = |n: u32| format!("key = \"header:x-k\"\nlimit = {n}\nper = \"1m\"\n");
    rename_into_place(&file, &whole(5));
    let gw = AdminGateway::start(&["--config", file.to_str().unwrap()]);
    for (round, n) in [6, 7, 8].into_iter().enumerate() {
        let text = whole(n);
        let (first, rest) = text.split_at(text.find("per").unwrap());
        let mut writer = std::fs::File::create(&file).unwrap();
        writer.write_all(first.as_bytes()).unwrap();
        crate::servers::signal(gw.child.id(), "-HUP");
        std::thread::sleep(Duration::from_millis(30));
        writer.write_all(rest.as_bytes()).unwrap();
        drop(writer);
        let log = gw.wait_lines("config reloaded", round + 1, Duration::from_secs(3));
        let reloads: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("config reloaded"))
            .collect();
        assert!(
            reloads.iter().all(|l| l.ends_with(" per 60s")),
            "half a file in force: {log}"
        );
        assert!(
            reloads[round].ends_with(&format!(": limit {n} per 60s")),
            "{log}"
        );
    }
    let statuses: Vec<u16> = (0..9)
        .map(|_| send(gw.addr, "GET", "/", &[("x-k", "k")]).status)
        .collect();
    assert_eq!(statuses[7..], [200, 429], "8 per minute in force");
}

/// A config file that is not a regular file (a FIFO with no writer, `/dev/zero`) or is longer
/// than 8 MiB is refused, each once, without being read whole; requests are answered
/// meanwhile, and a good file is read again after them.
#[test]
fn a_config_that_is_a_fifo_a_device_or_too_long_is_refused_and_requests_go_on() {
    let dir = TempDir::new("kinds");
    let file = dir.0.join("limits.toml");
    let good = |n: u32| format!("key = \"header:x-k\"\nlimit = {n}\nper = \"1h\"\n");
    rename_into_place(&file, &good(3));
    let gw = AdminGateway::start(&["--config", file.to_str().unwrap()]);
    let within = Duration::from_secs(10);
    let fifo = dir.0.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let link = dir.0.join("link");
    let point_at = |target: &std::path::Path| {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(target, &link).unwrap();
        std::fs::rename(&link, &file).unwrap();
    };
    point_at(&fifo);
    let log = gw.wait_lines("config refused", 1, within);
    assert!(log.contains("not a regular file (a FIFO)"), "{log}");
    assert_eq!(send(gw.addr, "GET", "/", &[("x-k", "a")]).status, 200);
    point_at(std::path::Path::new("/dev/zero"));
    let log = gw.wait_lines("config refused", 2, within);
    assert!(
        log.contains("not a regular file (a character device)"),
        "{log}"
    );
    assert_eq!(send(gw.addr, "GET", "/", &[("x-k", "b")]).status, 200);
    let mut long = good(4);
    long.push_str(&"#".repeat(9 << 20));
    rename_into_place(&file, &long);
    let log = gw.wait_lines("config refused", 3, within);
    assert!(
        log.contains("a file is at most 8388608 bytes (8 MiB)"),
        "{log}"
    );
    rename_into_place(&file, &good(4));
    let log = gw.wait_lines("config reloaded", 1, within);
    assert!(log.contains(": limit 4 per 3600s"), "{log}");
    assert_eq!(
        log.lines().filter(|l| l.contains("config refused")).count(),
        3,
        "each refused once: {log}"
    );
}

/// A reload of a file of 100,000 plans runs off the threads that serve requests: requests
/// sent while it runs are answered (each given 30 s, where a reload that held the runtime for
/// its quadratic duplicate check held them for over a minute), and the plans are in force
/// after it.
#[test]
fn a_reload_of_100_000_plans_keeps_requests_answered() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = TempDir::new("plans");
    let file = dir.0.join("limits.toml");
    let head = "key = \"header:x-k\"\nlimit = 5\nper = \"1h\"\n";
    rename_into_place(&file, head);
    let gw = AdminGateway::start(&["--config", file.to_str().unwrap()]);
    let mut text = format!("{head}[plans]\n");
    for i in 0..100_000 {
        text.push_str(&format!("plan-{i} = \"{}/1h\"\n", i % 50 + 1));
    }
    let (done, answered) = (AtomicBool::new(false), AtomicUsize::new(0));
    std::thread::scope(|s| {
        let asking = s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let r = send(gw.addr, "GET", "/", &[("x-k", "someone")]);
                assert!(r.status == 200 || r.status == 429, "{r:?}");
                answered.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        rename_into_place(&file, &text);
        let reloaded = std::panic::catch_unwind(|| {
            gw.wait_lines("config reloaded", 1, Duration::from_secs(60))
        });
        done.store(true, Ordering::Relaxed);
        let asked = asking.join();
        let log = reloaded.unwrap_or_else(|_| panic!("no reload: {}", gw.log()));
        assert!(asked.is_ok(), "a request went unanswered during the reload");
        assert!(log.contains(": limit 5 per 3600s"), "{log}");
    });
    assert!(answered.load(Ordering::Relaxed) > 0);
    // plan-6 has 7 per hour.
    let statuses: Vec<u16> = (0..8)
        .map(|_| send(gw.addr, "GET", "/", &[("x-k", "plan-6")]).status)
        .collect();
    assert_eq!(statuses[6..], [200, 429], "the plans are in force");
}

/// Connections that send part of a request's headers and wait: each listener holds a bounded
/// number of them (the admin one 64, the public one 512), closes each after its header-read
/// timeout (10 s; 30 s given here), and a flood of them on one listener leaves the other
/// serving, the gateway allowed 768 descriptors.
#[test]
fn half_open_connections_on_one_listener_starve_neither() {
    use std::net::{SocketAddr, TcpStream};
    const PART: &[u8] = b"GET /metrics HTTP/1.1\r\nhost: flood\r\n";
    let gw = AdminGateway::start_with_descriptors(768, &[]);
    // One half-open connection, made first so that the listener takes it first, then `n`
    // more at once; those the kernel's accept queue has no room for are given up after 2 s
    // (they hold no descriptor of the gateway's).
    let half_open = |addr: SocketAddr, n: usize| -> (TcpStream, Vec<TcpStream>) {
        let mut first = TcpStream::connect(addr).unwrap();
        first.write_all(PART).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let rest = rt.block_on(async {
            let mut tries = tokio::task::JoinSet::new();
            for _ in 0..n {
                tries.spawn(async move {
                    let connect = tokio::net::TcpStream::connect(addr);
                    let mut s = tokio::time::timeout(Duration::from_secs(2), connect)
                        .await
                        .ok()?
                        .ok()?;
                    tokio::io::AsyncWriteExt::write_all(&mut s, PART)
                        .await
                        .ok()?;
                    s.into_std().ok()
                });
            }
            tries.join_all().await.into_iter().flatten().collect()
        });
        (first, rest)
    };
    // The first connection of a flood is closed by the gateway within its header-read
    // timeout (10 s; 30 s given here).
    let closed_in_time = |mut first: &TcpStream, which: &str| {
        first
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut buf = [0u8; 512];
        if let Err(e) = std::io::Read::read(&mut first, &mut buf) {
            assert!(
                !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "a half-open {which} connection still open after 30 s: {e}"
            );
        }
    };
    // Past the gateway's descriptors, on the admin listener.
    let (first, flood) = half_open(gw.admin, 800);
    let r = send(gw.addr, "GET", "/", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    closed_in_time(&first, "admin");
    drop((first, flood));
    // Past the public listener's bound: the admin listener serves.
    let (first, flood) = half_open(gw.addr, 600);
    let r = send(gw.admin, "GET", "/metrics", &[]);
    assert_eq!(r.status, 200, "{r:?}");
    closed_in_time(&first, "public");
    drop((first, flood));
    let r = send(gw.addr, "GET", "/", &[]);
    assert_eq!(r.status, 200, "{r:?}");
}

/// A store that fails every request is one cause: the gateway logs it at most once a second
/// (with how many failures it left out), not once a request.
#[test]
fn a_failing_store_is_logged_once_a_second_not_once_a_request() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let dir = std::env::temp_dir().join(format!("quiet-gw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("stderr.log");
    let gw = start_gateway_with_stderr(
        // No breaker: every request goes to the dead store and fails.
        &["--redis", &url, "--key", "global", "--timeout-ms", "50"],
        std::fs::File::create(&log).unwrap(),
    );
    redis.kill();
    let started = std::time::Instant::now();
    for _ in 0..60 {
        assert_eq!(get(gw.addr, "").0, 200, "open: let through");
    }
    let seconds = started.elapsed().as_secs();
    drop(gw);
    let logged = std::fs::read_to_string(&log).unwrap();
    let lines = logged.matches("rate limit: store failed").count();
    assert!(lines >= 1, "the failure was not logged: {logged}");
    // One a second at most, over the seconds the 60 requests took (and the one they began in).
    assert!(
        lines as u64 <= seconds + 1,
        "{lines} lines in {seconds} s for 60 failed requests: {logged}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
