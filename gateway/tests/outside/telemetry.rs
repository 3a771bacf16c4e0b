//! What an SRE runs on, read from outside: `/metrics` as a Prometheus scraper parses it
//! (every family described, the series a dashboard reads present at 0 from the start, the
//! store latency a histogram, the breaker's state, keys near their limit, reloads), and
//! `/limits`, the limits in force.

use std::time::{Duration, Instant};

use prometheus_parse::{Sample, Scrape, Value};

use crate::servers::{
    gateway::{write_file, AdminGateway},
    RedisServer,
};

/// A request to `gw`'s public listener: its status.
fn call(gw: &AdminGateway) -> u16 {
    crate::servers::gateway::send(gw.addr, "GET", "/", &[("x-k", "k")]).status
}

/// `/metrics` from `gw`, parsed as Prometheus parses it.
fn scrape(gw: &AdminGateway) -> (Scrape, String) {
    let reply = crate::servers::gateway::send(gw.admin, "GET", "/metrics", &[]);
    assert_eq!(reply.status, 200, "{}", reply.head);
    let lines = reply.body.lines().map(|l| Ok(l.to_owned()));
    let scrape = Scrape::parse(lines).unwrap_or_else(|e| panic!("{e}: {}", reply.body));
    (scrape, reply.body)
}

/// The samples of `name` whose labels include every pair of `labels`.
fn samples<'s>(scrape: &'s Scrape, name: &str, labels: &[(&str, &str)]) -> Vec<&'s Sample> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect()
}

/// The sum of the counter or gauge samples of `name` with `labels`.
fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(scrape, name, labels)
        .iter()
        .map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            ref other => panic!("{name} is not a counter or gauge: {other:?}"),
        })
        .sum()
}

/// The default policy's store latency histogram: the calls at or under `le` seconds
/// (`f64::INFINITY`: every call); `None` when the histogram is absent.
fn latency_calls(scrape: &Scrape, le: f64) -> Option<f64> {
    samples(
        scrape,
        "ratelimit_store_latency_seconds",
        &[("policy", "default")],
    )
    .iter()
    .find_map(|s| match &s.value {
        Value::Histogram(buckets) => buckets
            .iter()
            .find(|b| b.less_than >= le)
            .or(buckets.last())
            .map(|b| b.count),
        _ => None,
    })
}

/// Every `ratelimit_*` family in `scrape` has its `# HELP`.
fn assert_described(scrape: &Scrape, text: &str) {
    for sample in &scrape.samples {
        let family = sample
            .metric
            .trim_end_matches("_bucket")
            .trim_end_matches("_sum")
            .trim_end_matches("_count");
        if family.starts_with("ratelimit_") {
            assert!(
                scrape.docs.contains_key(family) || scrape.docs.contains_key(&sample.metric),
                "no # HELP for {}: {text}",
                sample.metric
            );
        }
    }
}

/// Before the first request, a gateway on Redis shows every family it has described, with the
/// decisions a dashboard reads at 0; after a few, the counts, the keys left near their limit
/// and the store's latency as a histogram counting every store call.
#[test]
fn metrics_are_described_start_at_zero_and_parse() {
    let redis = RedisServer::start();
    let url = redis.url();
    let gw = AdminGateway::start(&[
        "--redis", &url, "--key", "global", "--limit", "5", "--per", "1h",
    ]);
    let (before, text) = scrape(&gw);
    assert_described(&before, &text);
    let zero = [
        ("policy", "default"),
        ("decision", "allowed"),
        ("source", "store"),
    ];
    let allowed = samples(&before, "ratelimit_decisions_total", &zero);
    assert_eq!(allowed.len(), 1, "{text}");
    assert_eq!(
        value(&before, "ratelimit_decisions_total", &zero),
        0.0,
        "{text}"
    );
    assert_eq!(
        value(&before, "ratelimit_breaker_open", &[("policy", "default")]),
        0.0,
        "{text}"
    );
    assert_eq!(
        value(
            &before,
            "ratelimit_near_limit_total",
            &[("policy", "default")]
        ),
        0.0,
        "{text}"
    );
    // Sources that cannot answer this gateway (no unit leases, no local share) have no series.
    assert!(
        samples(
            &before,
            "ratelimit_decisions_total",
            &[("source", "unit_lease")]
        )
        .is_empty(),
        "{text}"
    );
    assert!(
        samples(&before, "ratelimit_decisions_total", &[("source", "local")]).is_empty(),
        "{text}"
    );

    let statuses: Vec<u16> = (0..8).map(|_| call(&gw)).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    let (after, text) = scrape(&gw);
    assert_described(&after, &text);
    assert_eq!(
        value(
            &after,
            "ratelimit_decisions_total",
            &[("decision", "allowed")]
        ),
        5.0,
        "{text}"
    );
    assert_eq!(
        value(
            &after,
            "ratelimit_decisions_total",
            &[("decision", "denied")]
        ),
        3.0,
        "{text}"
    );
    // Capacity 5: the allowed decisions leaving 1 and 0 units are at or under a fifth.
    assert_eq!(
        value(
            &after,
            "ratelimit_near_limit_total",
            &[("policy", "default")]
        ),
        2.0,
        "{text}"
    );
    // The histogram counts every decision the store made (the deny cache's are not calls).
    let from_store = value(&after, "ratelimit_decisions_total", &[("source", "store")]);
    let count = latency_calls(&after, f64::INFINITY)
        .unwrap_or_else(|| panic!("ratelimit_store_latency_seconds is not a histogram: {text}"));
    assert_eq!(count, from_store, "{text}");
    assert!(
        text.contains("ratelimit_store_latency_seconds_bucket{"),
        "{text}"
    );
    assert!(
        text.contains("ratelimit_store_latency_seconds_count{"),
        "{text}"
    );
}

/// The breaker's gauge is 1 while it is open and 0 once the store answers again; checks it
/// refused without calling the store are not store errors.
#[test]
fn the_breaker_gauge_follows_the_breaker_and_refusals_are_not_store_errors() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let gw = AdminGateway::start(&["--redis", &url, "--key", "global", "--limit", "100000"]);
    assert_eq!(call(&gw), 200);
    redis.kill();
    // Fail-open: every request is served while the store is down.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert_eq!(call(&gw), 200);
        let (now, text) = scrape(&gw);
        if value(&now, "ratelimit_breaker_open", &[("policy", "default")]) == 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the breaker never opened: {text}"
        );
    }
    let (open, text) = scrape(&gw);
    assert_eq!(
        value(&open, "ratelimit_store_connected", &[]),
        0.0,
        "{text}"
    );
    assert!(
        value(
            &open,
            "ratelimit_store_connects_total",
            &[("result", "failed")]
        ) >= 1.0,
        "{text}"
    );
    assert!(
        open.docs.contains_key("ratelimit_store_connected"),
        "{text}"
    );
    let errors = value(&open, "ratelimit_store_errors_total", &[]);
    let unchecked = value(
        &open,
        "ratelimit_decisions_total",
        &[("source", "failure_policy")],
    );
    for _ in 0..20 {
        assert_eq!(call(&gw), 200);
    }
    let (later, text) = scrape(&gw);
    let unchecked_later = value(
        &later,
        "ratelimit_decisions_total",
        &[("source", "failure_policy")],
    );
    assert_eq!(unchecked_later - unchecked, 20.0, "{text}");
    // Only the half-open probes (one per second of cool-down) call the store.
    let more_errors = value(&later, "ratelimit_store_errors_total", &[]) - errors;
    assert!(
        more_errors <= 3.0,
        "{more_errors} store errors for 20 refusals: {text}"
    );
    assert!(
        samples(
            &later,
            "ratelimit_store_errors_total",
            &[("kind", "circuit_open")]
        )
        .is_empty(),
        "{text}"
    );
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert_eq!(call(&gw), 200);
        let (now, text) = scrape(&gw);
        // The new connection is installed by a task of its own, which may run after the
        // check that used it closed the breaker: both are waited for.
        let closed = value(&now, "ratelimit_breaker_open", &[("policy", "default")]) == 0.0;
        if closed && value(&now, "ratelimit_store_connected", &[]) == 1.0 {
            let connects = value(&now, "ratelimit_store_connects_total", &[("result", "ok")]);
            assert!(
                connects >= 2.0,
                "the first connection and the one after: {text}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the breaker never closed, or no connection was installed: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn limits(gw: &AdminGateway) -> serde_json::Value {
    let reply = crate::servers::gateway::send(gw.admin, "GET", "/limits", &[]);
    assert_eq!(reply.status, 200, "{}", reply.head);
    assert!(
        reply.head.contains("content-type: application/json"),
        "{}",
        reply.head
    );
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{e}: {}", reply.body))
}

/// `GET /limits` shows the limits in force, plans as policies of their own, and follows the
/// reloads it counts (`generation`, `ratelimit_config_reloads_total`); a refused file changes
/// neither the limits nor the generation. The reload line says when shadow mode is on.
#[test]
fn limits_show_what_is_in_force_across_reloads() {
    let dir = std::env::temp_dir().join(format!("telemetry-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("limits.toml");
    let text = |limit: u32, shadow: bool| {
        format!("limit = {limit}\nper = \"1m\"\nburst = 7\nkey = \"header:x-k\"\nshadow = {shadow}\n[plans]\ngold = \"100/1s\"\n")
    };
    write_file(&file, &text(5, false));
    let gw = AdminGateway::start(&["--config", file.to_str().unwrap()]);
    let expected = |generation: u64, limit: u32, shadow: bool| {
        serde_json::json!({
            "generation": generation,
            "policies": [
                {"policy": "default", "algorithm": "gcra", "limit": limit, "per_ms": 60_000, "burst": 7, "shadow": shadow},
                {"policy": "plan:gold", "algorithm": "gcra", "limit": 100, "per_ms": 1_000, "burst": 100, "shadow": shadow},
            ]
        })
    };
    assert_eq!(limits(&gw), expected(0, 5, false));
    let (scraped, body) = scrape(&gw);
    assert_eq!(
        value(
            &scraped,
            "ratelimit_config_reloads_total",
            &[("result", "ok")]
        ),
        0.0,
        "{body}"
    );
    assert!(
        scraped.docs.contains_key("ratelimit_config_reloads_total"),
        "{body}"
    );
    let default = [("policy", "default")];
    assert_eq!(
        value(&scraped, "ratelimit_policy_capacity", &default),
        7.0,
        "{body}"
    );
    assert_eq!(
        value(&scraped, "ratelimit_policy_window_seconds", &default),
        84.0,
        "{body}"
    );
    assert_eq!(
        value(&scraped, "ratelimit_policy_shadow", &default),
        0.0,
        "{body}"
    );

    write_file(&file, &text(9, true));
    let log = gw.wait_lines("config reloaded", 1, Duration::from_secs(30));
    assert!(
        log.contains(": limit 9 per 1m (burst 7), shadow on") || log.contains(", shadow on"),
        "{log}"
    );
    assert_eq!(limits(&gw), expected(1, 9, true));
    write_file(&file, "limit = \"many\"\n");
    gw.wait_lines("config refused", 1, Duration::from_secs(30));
    assert_eq!(limits(&gw), expected(1, 9, true));
    let (scraped, body) = scrape(&gw);
    assert_eq!(
        value(
            &scraped,
            "ratelimit_config_reloads_total",
            &[("result", "ok")]
        ),
        1.0,
        "{body}"
    );
    assert_eq!(
        value(
            &scraped,
            "ratelimit_config_reloads_total",
            &[("result", "refused")]
        ),
        1.0,
        "{body}"
    );
    // The limit in force: 7 units restored in 7 x 60 s / 9, shadow mode on.
    let window = value(&scraped, "ratelimit_policy_window_seconds", &default);
    assert!((window - 420.0 / 9.0).abs() < 0.001, "{window}: {body}");
    assert_eq!(
        value(&scraped, "ratelimit_policy_shadow", &default),
        1.0,
        "{body}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A key's state on `gw`, through the admin listener (spending nothing).
fn peek(gw: &AdminGateway, key: &str) -> serde_json::Value {
    let reply = crate::servers::gateway::send(gw.admin, "GET", &format!("/keys/{key}"), &[]);
    assert_eq!(reply.status, 200, "{}", reply.head);
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{e}: {}", reply.body))
}

/// A ban set on one of three gateways outlives a Redis that restarts empty: each gateway
/// notices the loss (`ratelimit_store_resets_total`, one log line), the bans they know are
/// written back with the time they have left, and every gateway answers the key 429 again.
#[test]
fn a_ban_outlives_a_store_that_restarts_empty() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let gws: Vec<AdminGateway> = (0..3)
        .map(|_| AdminGateway::start(&["--redis", &url, "--key", "header:x-k", "--limit", "100"]))
        .collect();
    let banned = |gw: &AdminGateway| peek(gw, "k")["banned_ms"].as_u64().unwrap_or(0);
    let status = |gw: &AdminGateway| {
        crate::servers::gateway::send(gw.addr, "GET", "/", &[("x-k", "k")]).status
    };
    // Each gateway takes the store's marker in (its first look, within a second of start).
    std::thread::sleep(Duration::from_millis(1_500));
    let ban = crate::servers::gateway::send(gws[0].admin, "PUT", "/bans/k?seconds=300", &[]);
    assert_eq!(ban.status, 204, "{}", ban.head);
    for gw in &gws {
        assert_eq!(status(gw), 429);
        assert!(banned(gw) > 290_000);
    }
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    for (i, gw) in gws.iter().enumerate() {
        loop {
            let (scraped, text) = scrape(gw);
            let resets = value(
                &scraped,
                "ratelimit_store_resets_total",
                &[("policy", "default")],
            );
            let left = std::panic::catch_unwind(|| banned(gw)).unwrap_or(0);
            if resets == 1.0 && left > 0 {
                assert!(left <= 300_000, "{left}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "gateway {i}: resets {resets}, banned_ms {left}: {text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(status(gw), 429, "gateway {i}");
    }
    // The loss is one line on each gateway, not one per look.
    std::thread::sleep(Duration::from_millis(1_500));
    for gw in &gws {
        let (scraped, _) = scrape(gw);
        assert_eq!(value(&scraped, "ratelimit_store_resets_total", &[]), 1.0);
        assert_eq!(
            gw.log()
                .matches("the store lost this limit's state")
                .count(),
            1,
            "{}",
            gw.log()
        );
    }
}

/// While the store is down under 50 requests a second, the gateway writes at most 15 lines
/// in 5 s: a store outage is one cause (a line a second at most), the breaker's opening one
/// change of state, and its failed half-open probes no change at all.
#[test]
fn a_store_outage_under_load_writes_few_lines() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let gw = AdminGateway::start(&["--redis", &url, "--key", "global", "--limit", "100000"]);
    assert_eq!(call(&gw), 200);
    redis.kill();
    let before = gw.log().lines().count();
    let started = Instant::now();
    let mut sent = 0u32;
    while started.elapsed() < Duration::from_secs(5) {
        assert_eq!(call(&gw), 200, "fail-open serves every request");
        sent += 1;
        // 50 a second at most.
        let due = started + Duration::from_millis(20) * sent;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let log = gw.log();
    let lines: Vec<&str> = log.lines().skip(before).collect();
    assert!(
        lines.len() <= 15,
        "{} lines for {sent} requests in 5 s:\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert!(
        lines.iter().any(|l| l.contains("circuit breaker open")),
        "the outage is told: {lines:?}"
    );
}

/// `/top` as JSON, with `query`.
fn top(gw: &AdminGateway, query: &str) -> (u16, serde_json::Value) {
    let reply = crate::servers::gateway::send(gw.admin, "GET", &format!("/top{query}"), &[]);
    let json = serde_json::from_str(&reply.body).unwrap_or(serde_json::Value::Null);
    (reply.status, json)
}

/// `/top?scope=fleet` sums the keys denied on every gateway sharing the store; without a
/// scope (or `scope=instance`), a gateway's own.
#[test]
fn the_fleets_top_keys_sum_every_gateway() {
    let redis = RedisServer::start();
    let url = redis.url();
    let gws: Vec<AdminGateway> = (0..3)
        .map(|_| {
            AdminGateway::start(&[
                "--redis",
                &url,
                "--key",
                "header:x-k",
                "--limit",
                "1",
                "--per",
                "1h",
            ])
        })
        .collect();
    let hit = |gw: &AdminGateway, key: &str, times: usize| {
        for _ in 0..times {
            crate::servers::gateway::send(gw.addr, "GET", "/", &[("x-k", key)]);
        }
    };
    hit(&gws[0], "k", 3); // 1 allowed, 2 denied
    hit(&gws[1], "k", 4);
    hit(&gws[2], "k", 5);
    hit(&gws[2], "only-2", 3); // 1 allowed, 2 denied
    let denied = |json: &serde_json::Value, key: &str| {
        json.as_array()
            .into_iter()
            .flatten()
            .find(|item| item["key"] == key)
            .map_or(0, |item| item["denied"].as_u64().unwrap())
    };
    let (status, own) = top(&gws[0], "");
    assert_eq!(status, 200);
    assert_eq!((denied(&own, "k"), denied(&own, "only-2")), (2, 0), "{own}");
    assert_eq!(top(&gws[0], "?scope=instance").1, own);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, fleet) = top(&gws[0], "?scope=fleet&n=5");
        assert_eq!(status, 200, "{fleet}");
        if (denied(&fleet, "k"), denied(&fleet, "only-2")) == (11, 2) {
            assert_eq!(fleet[0]["key"], "k", "the most denied first: {fleet}");
            assert_eq!(fleet[0]["policy"], "default", "{fleet}");
            break;
        }
        assert!(Instant::now() < deadline, "the fleet's view: {fleet}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(top(&gws[1], "?scope=elsewhere").0, 400);
}

/// A store that stalls (its process stopped) times out every check: each one is observed in
/// `ratelimit_store_latency_seconds` at its duration, and counted as a timeout.
#[test]
fn checks_that_time_out_are_observed_in_the_latency_histogram() {
    let redis = RedisServer::start();
    let url = redis.url();
    let gw = AdminGateway::start(&[
        "--redis",
        &url,
        "--key",
        "global",
        "--limit",
        "100000",
        "--timeout-ms",
        "100",
    ]);
    assert_eq!(call(&gw), 200);
    let histogram = |scrape: &Scrape| latency_calls(scrape, f64::INFINITY).unwrap_or(0.0);
    let (before, _) = scrape(&gw);
    let counted = histogram(&before);
    assert!(counted >= 1.0);
    redis.signal("-STOP");
    // Two checks (under the breaker's five failures in a row, the marker's looks included).
    assert_eq!(call(&gw), 200, "fail-open");
    assert_eq!(call(&gw), 200, "fail-open");
    let (stalled, text) = scrape(&gw);
    redis.signal("-CONT");
    assert_eq!(histogram(&stalled), counted + 2.0, "{text}");
    let timeouts = value(
        &stalled,
        "ratelimit_store_errors_total",
        &[("kind", "timeout")],
    );
    assert!(timeouts >= 2.0, "{text}");
    // The slow bucket got them: nothing at or under 50 ms.
    let fast = latency_calls(&stalled, 0.05).unwrap();
    assert_eq!(fast, counted, "{text}");
}
