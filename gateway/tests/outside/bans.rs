//! `--ban-after N --ban-within DURATION --ban-for DURATION --ban-escalate F`: automatic bans,
//! from outside, on two gateways sharing one Redis.

use std::time::{Duration, Instant};

use crate::servers::{
    gateway::{assert_refused, send, AdminGateway},
    RedisServer,
};

const DEADLINE: Duration = Duration::from_secs(30);

/// `GET /keys/{key}`'s `banned_ms` (0: none).
fn banned_ms(gw: &AdminGateway, key: &str) -> u64 {
    let r = send(gw.admin, "GET", &format!("/keys/{key}"), &[]);
    assert_eq!(r.status, 200, "{}", r.head);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    v["banned_ms"].as_u64().unwrap_or(0)
}

fn status(gw: &AdminGateway) -> (u16, Option<u64>) {
    let r = send(gw.addr, "GET", "/", &[("x-key", "k")]);
    (
        r.status,
        r.header("retry-after").map(|v| v.parse().unwrap()),
    )
}

/// Polls until `f` holds, or fails saying `what`.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let started = Instant::now();
    while !f() {
        assert!(started.elapsed() < DEADLINE, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A gateway on `redis`: one request an hour per `x-key`, banned after `after` refusals, with
/// `more` flags.
fn banning(redis: &RedisServer, after: &str, more: &[&str]) -> AdminGateway {
    let url = redis.url();
    let mut args = vec![
        "--redis",
        &url,
        "--key",
        "header:x-key",
        "--limit",
        "1",
        "--per",
        "1h",
        "--ban-after",
        after,
    ];
    args.extend_from_slice(more);
    AdminGateway::start(&args)
}

/// Refused 3 times within the window: banned on both gateways (429, Retry-After its time
/// left, `banned_ms`), then served again; a second offence is banned twice as long; an
/// operator's `DELETE /bans/{key}` lifts it.
#[test]
fn a_key_refused_too_often_is_banned_on_every_gateway_then_served_again() {
    let redis = RedisServer::start();
    let more = ["--ban-for", "2s"];
    let gws = [banning(&redis, "3", &more), banning(&redis, "3", &more)];
    assert_eq!(status(&gws[0]).0, 200);
    for gw in [&gws[0], &gws[1], &gws[0]] {
        assert_eq!(status(gw).0, 429);
    }
    for gw in &gws {
        until("banned on each gateway", || {
            let ms = banned_ms(gw, "k");
            assert!(ms <= 2_000, "{ms}");
            ms > 0
        });
        until("answered as banned", || {
            let (code, retry) = status(gw);
            code == 429 && retry.is_some_and(|s| s <= 2)
        });
    }
    // The ban ends: the key is not banned any more (its hourly quota still refuses it).
    until("the ban ends", || banned_ms(&gws[1], "k") == 0);
    // A second offence: twice as long.
    for gw in [&gws[1], &gws[0], &gws[1]] {
        until("a refusal counted", || status(gw).0 == 429);
    }
    until("banned again, twice as long", || {
        banned_ms(&gws[0], "k") > 2_000
    });
    assert!(banned_ms(&gws[1], "k") <= 4_000);
    // An operator lifts it.
    let r = send(gws[0].admin, "DELETE", "/bans/k", &[]);
    assert_eq!(r.status, 204, "{}", r.head);
    for gw in &gws {
        assert_eq!(banned_ms(gw, "k"), 0);
    }
}

#[test]
fn ban_flags_that_cannot_work_are_refused_at_start_up() {
    assert_refused(
        &["--ban-for", "10s"],
        "--ban-for is a setting of automatic bans: give --ban-after N",
    );
    assert_refused(
        &["--ban-after", "0"],
        "--ban-after: \"0\" is not a whole number of refusals",
    );
    assert_refused(
        &["--ban-after", "3", "--ban-escalate", "0.5"],
        "--ban-escalate",
    );
    assert_refused(
        &["--ban-after", "3", "--ban-for", "2d"],
        "ban_after.duration",
    );
}

/// In shadow mode a key refused too often is served all the same and never banned: the
/// gateway logs the ban it would set.
#[test]
fn shadow_mode_logs_the_ban_it_would_set_and_never_bans() {
    let redis = RedisServer::start();
    let gw = banning(&redis, "2", &["--shadow"]);
    for _ in 0..4 {
        assert_eq!(status(&gw).0, 200, "shadow mode serves every request");
    }
    let log = gw.wait_lines("would ban the key", 1, DEADLINE);
    assert!(log.contains("shadow mode"), "{log}");
    assert_eq!(banned_ms(&gw, "k"), 0);
    assert_eq!(status(&gw).0, 200);
}

/// Refusals of a banned key do not count: a key kept knocking during its ban is not banned
/// again over it (a second ban would be twice as long, above the first's 2 s).
#[test]
fn refusals_while_banned_do_not_count() {
    let redis = RedisServer::start();
    let gw = banning(&redis, "2", &["--ban-for", "2s"]);
    assert_eq!(status(&gw).0, 200);
    for _ in 0..2 {
        assert_eq!(status(&gw).0, 429);
    }
    until("banned", || banned_ms(&gw, "k") > 0);
    // Refused while banned, ten times: none of them counts toward another ban.
    for _ in 0..10 {
        assert_eq!(status(&gw).0, 429);
        let ms = banned_ms(&gw, "k");
        assert!(ms <= 2_000, "banned again during the ban: {ms} ms");
    }
    until("the ban ends", || banned_ms(&gw, "k") == 0);
}
