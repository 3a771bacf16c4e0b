//! The outbound examples as users run them, built by `cargo test`: three copies of
//! `outbound` sharing one Redis stay under an upstream's limit with `--adaptive`, its last line
//! is always printed, bad flags exit with the usage; `backfill` keeps interactive calls flowing
//! while a back-fill job shares the quota.

use std::{process::Command, time::Duration};

use crate::servers::{
    upstream::{Kind, Limits, Style, Telling, Told, Upstream},
    RedisServer,
};

/// The upstream's windows, as in the throttle's tests.
const WINDOW: Duration = Duration::from_secs(1);

/// The last line: `sent N, ok X, limited Y, failed Z in S s`.
fn last_line(out: &std::process::Output) -> (u64, u64, u64, u64, f64) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default().to_owned();
    let parse = || -> Option<(u64, u64, u64, u64, f64)> {
        let rest = line.strip_prefix("sent ")?;
        let (n, rest) = rest.split_once(", ok ")?;
        let (x, rest) = rest.split_once(", limited ")?;
        let (y, rest) = rest.split_once(", failed ")?;
        let (z, rest) = rest.split_once(" in ")?;
        let s = rest.strip_suffix(" s")?;
        let (_, decimals) = s.split_once('.')?;
        if decimals.len() != 1 {
            return None;
        }
        Some((
            n.parse().ok()?,
            x.parse().ok()?,
            y.parse().ok()?,
            z.parse().ok()?,
            s.parse().ok()?,
        ))
    };
    parse().unwrap_or_else(|| panic!("last line {line:?} of {stdout}"))
}

/// The second-to-last line: `waits p50 X ms, p99 Y ms, max Z ms`.
fn waits_line(out: &std::process::Output) -> (u64, u64, u64) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().nth(1).unwrap_or_default().to_owned();
    let parse = || -> Option<(u64, u64, u64)> {
        let rest = line.strip_prefix("waits p50 ")?;
        let (p50, rest) = rest.split_once(" ms, p99 ")?;
        let (p99, rest) = rest.split_once(" ms, max ")?;
        let max = rest.strip_suffix(" ms")?;
        Some((p50.parse().ok()?, p99.parse().ok()?, max.parse().ok()?))
    };
    parse().unwrap_or_else(|| panic!("second-to-last line {line:?} of {stdout}"))
}

/// Three copies of the example at once, sharing one Redis and the key `shared`.
fn run_copies(url: &str, redis_url: &str, extra: &[&str]) -> Vec<std::process::Output> {
    run_copies_of(url, redis_url, 30, 3, extra)
}

/// Three copies of the example at once, `requests` each with `concurrency` in flight.
fn run_copies_of(
    url: &str,
    redis_url: &str,
    requests: u64,
    concurrency: u64,
    extra: &[&str],
) -> Vec<std::process::Output> {
    let (requests, concurrency) = (requests.to_string(), concurrency.to_string());
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(crate::servers::example_bin("outbound"))
                .args(["--upstream", url, "--requests", &requests])
                .args(["--concurrency", &concurrency])
                .args(["--redis", redis_url, "--key", "shared"])
                .args(extra)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

/// The example as a user runs it: three copies sharing one Redis with `--adaptive` stay
/// under the upstream's limit; without it, at a configured limit too high, many are refused;
/// bad flags exit with the usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbound_example_as_written() {
    let redis = RedisServer::start();
    let up = Upstream::start(Style::XEpoch, 20, WINDOW).await;
    let (url, redis_url) = (up.url(), redis.url());
    let copies = move |extra: &'static [&'static str]| {
        let (url, redis_url) = (url.clone(), redis_url.clone());
        tokio::task::spawn_blocking(move || run_copies(&url, &redis_url, extra))
    };
    up.until_next_window().await;
    let limited0 = up.limited();
    let outs = copies(&["--adaptive"]).await.unwrap();
    let mut ok = 0;
    for out in &outs {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (n, x, y, z, _) = last_line(out);
        assert_eq!((n, x + y + z), (30, 30));
        ok += x;
    }
    // Each call answered 200 to its caller (a 429 is sent again after its pause), the
    // upstream's 429s few.
    let adaptive_limited = up.limited() - limited0;
    assert_eq!(ok, 90);
    assert!(
        adaptive_limited <= 2,
        "adaptive copies got {adaptive_limited} 429s"
    );

    let limited0 = up.limited();
    let outs = copies(&["--limit", "100", "--per", "1s"]).await.unwrap();
    let limited: u64 = outs.iter().map(|o| last_line(o).2).sum();
    assert_eq!(limited, up.limited() - limited0);
    assert!(
        limited > 20,
        "a throttle configured too high, not adaptive: {limited} 429s"
    );

    for bad in [
        vec!["--requests", "3"],
        vec![
            "--upstream",
            "ftp://x",
            "--requests",
            "1",
            "--concurrency",
            "1",
        ],
    ] {
        let out = Command::new(crate::servers::example_bin("outbound"))
            .args(&bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("usage: outbound"));
    }
}

/// The example prints its last line for no requests, an unreachable Redis (calls failed)
/// and an upstream that never answers (calls failed after the maximum wait and 5 s).
#[test]
fn the_example_always_ends_with_its_line() {
    let bin = crate::servers::example_bin("outbound");
    let hang = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hang_url = format!("http://{}/", hang.local_addr().unwrap());
    for (args, want) in [
        (
            vec![
                "--upstream",
                "http://127.0.0.1:9/",
                "--requests",
                "0",
                "--concurrency",
                "2",
            ],
            (0, 0, 0, 0),
        ),
        (
            vec![
                "--upstream",
                "http://127.0.0.1:9/",
                "--requests",
                "3",
                "--concurrency",
                "2",
                "--redis",
                "redis://127.0.0.1:9",
                "--limit",
                "5",
            ],
            (3, 0, 0, 3),
        ),
        (
            vec![
                "--upstream",
                &hang_url,
                "--requests",
                "1",
                "--concurrency",
                "1",
                "--max-wait-ms",
                "100",
            ],
            (1, 0, 0, 1),
        ),
    ] {
        let out = Command::new(&bin).args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (n, x, y, z, _) = last_line(&out);
        assert_eq!((n, x, y, z), want, "{args:?}");
    }
    drop(hang);
}

fn number_after(text: &str, label: &str) -> u64 {
    let rest = &text[text
        .find(label)
        .unwrap_or_else(|| panic!("{label:?} missing in {text}"))
        + label.len()..];
    rest.trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn outbound_example_keeps_interactive_calls_flowing() {
    let redis = RedisServer::start();
    let secs = 3;
    let out = Command::new(crate::servers::example_bin("backfill"))
        .args(["--redis", &redis.url(), "--secs", &secs.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        number_after(&text, "sent,"),
        0,
        "interactive calls failed: {text}"
    );
    assert!(number_after(&text, "interactive:") >= 10, "{text}");
    assert!(number_after(&text, "slowest") < 1_000, "{text}");
    // The API was never charged more than the quota allows: 30 units a second.
    assert!(
        number_after(&text, "api charged") <= 30 * (secs + 1),
        "{text}"
    );
}

/// Three copies that only learn (`--adaptive` without `--limit`), eight calls in flight each,
/// against an upstream of 40 a rolling second telling `RateLimit-Policy` and `RateLimit` with
/// whole-second resets: every call answered 200 to its caller, next to no 429 from the
/// upstream, and the waits line before the last line, in order (p50 ≤ p99 ≤ max).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_learning_copies_pace_a_rolling_window_and_print_their_waits() {
    let redis = RedisServer::start();
    let limits = Limits::new(Kind::Rolling, Telling::Ietf, 40, WINDOW);
    let up = Told::start(limits).await;
    let (url, redis_url) = (up.url(), redis.url());
    let outs = tokio::task::spawn_blocking(move || {
        run_copies_of(&url, &redis_url, 60, 8, &["--adaptive"])
    })
    .await
    .unwrap();
    for out in &outs {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("limit: none, adaptive: on"), "{stdout}");
        let (n, x, y, z, _) = last_line(out);
        assert_eq!((n, x, y, z), (60, 60, 0, 0), "{stdout}");
        let (p50, p99, max) = waits_line(out);
        assert!(p50 <= p99 && p99 <= max, "{stdout}");
    }
    let (ok, limited) = up.counts();
    assert!(
        ok >= 180 && limited * 100 <= ok + limited,
        "{ok} 200s, {limited} 429s"
    );
}
