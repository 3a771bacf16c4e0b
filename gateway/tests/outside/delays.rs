//! `--delay-up-to DURATION`: a request over the limit served late, in time with the limit,
//! instead of refused, from outside, on two gateways sharing one Redis.
//!
//! Times are read as lower bounds only (a request is never served before its units come);
//! how late a loaded machine serves it is not asserted.

use std::{
    io::Write,
    net::TcpStream,
    time::{Duration, Instant},
};

use crate::gateway::{rename_into_place, TempDir};
use crate::servers::{
    gateway::{assert_refused, send, AdminGateway},
    RedisServer,
};

/// Clock granularity between Redis's `TIME` and this process's `Instant`.
const SLACK: Duration = Duration::from_millis(50);

/// A gateway on `redis`: 5 requests per 5 s per `x-key` (GCRA, one unit a second), delayed
/// up to 5.5 s, with `more` flags.
fn delaying(redis: &RedisServer, more: &[&str]) -> AdminGateway {
    let url = redis.url();
    let mut args = vec![
        "--redis",
        &url,
        "--key",
        "header:x-key",
        "--algorithm",
        "gcra",
        "--limit",
        "5",
        "--per",
        "5s",
        "--delay-up-to",
        "5500ms",
    ];
    args.extend_from_slice(more);
    AdminGateway::start(&args)
}

/// `n` requests of key `k` sent at once, alternately to each gateway: each one's status and
/// how long after the start it was answered, in the order answered.
fn at_once(gws: &[&AdminGateway], n: usize, key: &str) -> Vec<(u16, Duration, Option<String>)> {
    let started = Instant::now();
    let barrier = std::sync::Barrier::new(n);
    let mut answers: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let addr = gws[i % gws.len()].addr;
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let r = send(addr, "GET", "/", &[("x-key", key)]);
                    let retry = r.header("retry-after").map(str::to_owned);
                    (r.status, started.elapsed(), retry)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    answers.sort_by_key(|a| a.1);
    answers
}

/// 5 per 5 s and `--delay-up-to 5500ms`: 10 simultaneous requests across two gateways are all
/// served, the first 5 at once and the others one a second (each not before its unit comes),
/// so the last about 5 s after the first.
#[test]
fn ten_simultaneous_requests_are_all_served_spread_over_five_seconds() {
    let redis = RedisServer::start();
    let gws = [delaying(&redis, &[]), delaying(&redis, &[])];
    let answers = at_once(&[&gws[0], &gws[1]], 10, "k");
    assert!(answers.iter().all(|a| a.0 == 200), "{answers:?}");
    for (i, a) in answers.iter().enumerate().skip(5) {
        let due = Duration::from_secs(i as u64 - 4);
        assert!(
            a.1 + SLACK >= due,
            "request {i} served before its unit: {answers:?}"
        );
    }
    let spread = answers[9].1 - answers[0].1;
    assert!(spread + SLACK >= Duration::from_secs(5), "{answers:?}");
    // The gateways counted the 5 late ones between them, each its own (which gateway's
    // requests came first to the store is the store's order).
    let served = "ratelimit_delayed_total{policy=\"default\",outcome=\"served\"} ";
    let counted: u64 = gws
        .iter()
        .map(|gw| {
            let metrics = send(gw.admin, "GET", "/metrics", &[]).body;
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(served))
                .map_or(0, |n| n.parse().unwrap())
        })
        .sum();
    assert_eq!(counted, 5);
}

/// 15 simultaneous requests: 10 served (5 at once, 5 late) and 5 refused, with a
/// `Retry-After`, since their units would come after 5.5 s.
#[test]
fn fifteen_simultaneous_requests_are_ten_served_and_five_refused() {
    let redis = RedisServer::start();
    let gws = [delaying(&redis, &[]), delaying(&redis, &[])];
    let answers = at_once(&[&gws[0], &gws[1]], 15, "k");
    let served = answers.iter().filter(|a| a.0 == 200).count();
    let refused: Vec<_> = answers.iter().filter(|a| a.0 == 429).collect();
    assert_eq!((served, refused.len()), (10, 5), "{answers:?}");
    assert!(refused.iter().all(|a| a.2.is_some()), "{answers:?}");
}

/// A client that hangs up while its request waits gives its unit back: the key's time goes
/// back by one unit at once (the admin's `reset_ms`: full again within 5 s, not 6), and the
/// next request is served one unit after the burst, on time.
#[test]
fn a_client_that_hangs_up_while_delayed_gives_its_units_back() {
    let redis = RedisServer::start();
    let gw = delaying(&redis, &[]);
    let burst = Instant::now();
    for _ in 0..5 {
        assert_eq!(send(gw.addr, "GET", "/", &[("x-key", "k")]).status, 200);
    }
    let mut hung = TcpStream::connect(gw.addr).unwrap();
    hung.write_all(b"GET / HTTP/1.1\r\nhost: gw\r\nx-key: k\r\ncontent-length: 0\r\n\r\n")
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let waiting = |gw: &AdminGateway| {
        let metrics = send(gw.admin, "GET", "/metrics", &[]).body;
        metrics
            .lines()
            .any(|l| l == "ratelimit_waiting{policy=\"default\"} 1")
    };
    while !waiting(&gw) {
        assert!(Instant::now() < deadline, "the request never waited");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(hung);
    let abandoned = "ratelimit_delayed_total{policy=\"default\",outcome=\"abandoned\"} 1";
    while !send(gw.admin, "GET", "/metrics", &[])
        .body
        .contains(abandoned)
    {
        assert!(Instant::now() < deadline, "the hang-up was never seen");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Given back (by a store call after the hang-up is counted): the burst's 5 units end
    // within 5 s of the burst, where without the refund they end 6 s after it, whenever
    // looked at.
    let given_back = Instant::now() + Duration::from_secs(3);
    loop {
        let peek = send(gw.admin, "GET", "/keys/k", &[]);
        let state: serde_json::Value = serde_json::from_str(&peek.body).unwrap();
        let reset = Duration::from_millis(state["reset_ms"].as_u64().unwrap());
        if reset + burst.elapsed() <= Duration::from_secs(5) + SLACK {
            break;
        }
        assert!(
            Instant::now() < given_back,
            "{state} {:?} after the burst",
            burst.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = send(gw.addr, "GET", "/", &[("x-key", "k")]);
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(burst.elapsed() + SLACK >= Duration::from_secs(1));
}

/// A reload may set, change and lift the delay (`delay_up_to` in the file): a request over
/// the limit is then served late, or refused.
#[test]
fn a_reload_sets_and_lifts_the_delay() {
    let dir = TempDir::new("delay");
    let file = dir.0.join("limits.toml");
    let text = |delay: &str| {
        format!("algorithm = \"token-bucket\"\nkey = \"header:x-key\"\nlimit = 2\nper = \"400ms\"\n{delay}")
    };
    rename_into_place(&file, &text(""));
    let gw = AdminGateway::start(&["--config", file.to_str().unwrap()]);
    let statuses = |key: &str| -> Vec<u16> {
        let answers = at_once(&[&gw], 3, key);
        let mut statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
        statuses.sort();
        statuses
    };
    assert_eq!(statuses("a"), [200, 200, 429], "no delay");
    rename_into_place(&file, &text("delay_up_to = \"1s\"\n"));
    crate::servers::signal(gw.child.id(), "-HUP");
    let log = gw.wait_lines("config reloaded", 1, Duration::from_secs(10));
    assert!(log.contains(", delay up to 1s"), "{log}");
    assert_eq!(statuses("b"), [200, 200, 200], "delayed");
    rename_into_place(&file, &text(""));
    crate::servers::signal(gw.child.id(), "-HUP");
    gw.wait_lines("config reloaded", 2, Duration::from_secs(10));
    assert_eq!(statuses("c"), [200, 200, 429], "the delay lifted");
    // A window cannot delay: the reload is refused and the limits stay.
    let window = text("delay_up_to = \"1s\"\n").replace("token-bucket", "sliding-window");
    rename_into_place(&file, &window);
    crate::servers::signal(gw.child.id(), "-HUP");
    let log = gw.wait_lines("config refused", 1, Duration::from_secs(10));
    assert!(log.contains("config refused"), "{log}");
}

#[test]
fn delay_flags_that_cannot_work_are_refused_at_start_up() {
    for algorithm in ["sliding-window", "fixed-window"] {
        assert_refused(
            &["--algorithm", algorithm, "--delay-up-to", "1s"],
            &format!(
                "--delay-up-to 1s (--algorithm {algorithm}): {algorithm} cannot delay requests"
            ),
        );
    }
    assert_refused(
        &["--delay-up-to", "0s"],
        "--delay-up-to: \"0s\" is not a duration like 500ms, 10s, 5m, 1h",
    );
    assert_refused(
        &["--delay-up-to", "2h"],
        "--delay-up-to 7200s (--algorithm gcra): must be above 0 and at most 3600s",
    );
    assert_refused(
        &["--delay-up-to", "1s", "--unit-lease-ms", "50"],
        "cannot take units from unit leases",
    );
    assert_refused(
        &[
            "--delay-up-to",
            "1s",
            "--region",
            "a",
            "--regions",
            "a=redis://127.0.0.1:1,b=redis://127.0.0.1:2",
        ],
        "--delay-up-to does not work across --regions",
    );
}
