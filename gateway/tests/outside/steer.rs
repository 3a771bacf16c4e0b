//! Steering the limiter at run time: a key's state read without spending, a reset, a ban and
//! its end; the gateway demo's admin endpoints (`/keys/{key}`, `/bans/{key}`) and their guard,
//! checked from outside on several instances sharing one Redis.

use std::{
    net::SocketAddr,
    process::Command,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::common::header;
use crate::servers::{
    gateway::{assert_refused, gateway_bin, send, write_file, AdminGateway, Reply},
    RedisServer,
};

impl AdminGateway {
    /// A request to the public listener with key `k` (header `x-k`).
    fn call(&self, k: &str) -> Reply {
        send(self.addr, "GET", "/", &[("x-k", k)])
    }

    /// An admin request, with the token when given.
    fn admin(&self, method: &str, path: &str, token: Option<&str>) -> Reply {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", &**a)).collect();
        send(self.admin, method, path, &headers)
    }

    /// `GET /keys/{key}` (no token), as JSON.
    fn peek(&self, key: &str) -> serde_json::Value {
        let r = self.admin("GET", &format!("/keys/{key}"), None);
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.head.contains("content-type: application/json"), "{r:?}");
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {r:?}"))
    }
}

/// Asks every gateway for key `k` until each answers `want`, and returns how long the slowest
/// took from `since`. Each gateway is asked at most once every 20 ms, for at most 10 s.
fn until_all(gws: &[AdminGateway], k: &str, want: u16, since: Instant) -> Duration {
    let mut slowest = Duration::ZERO;
    for (i, gw) in gws.iter().enumerate() {
        loop {
            let r = gw.call(k);
            if r.status == want {
                slowest = slowest.max(since.elapsed());
                break;
            }
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "gateway {i} still answers {} for {k:?}: {r:?}",
                r.status
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    slowest
}

/// What the demo states: every gateway sees a reset, a ban or an unban within 1 s (a cached
/// denial answers for at most 1 s before Redis is asked again). The margin is for a loaded
/// machine, not for the limiter.
const BOUND: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_millis(1_500);

fn three(redis: &RedisServer, extra: &[&str]) -> Vec<AdminGateway> {
    let url = redis.url();
    let mut args = vec!["--redis", &url, "--key", "header:x-k"];
    args.extend_from_slice(extra);
    (0..3).map(|_| AdminGateway::start(&args)).collect()
}

#[test]
fn a_peek_spends_nothing_and_shows_what_a_check_would() {
    let redis = RedisServer::start();
    let gws = three(
        &redis,
        &[
            "--algorithm",
            "sliding-window",
            "--limit",
            "3",
            "--per",
            "1h",
        ],
    );
    let fresh = gws[0].peek("alice");
    assert_eq!(fresh["key"], "alice");
    assert_eq!(fresh["policy"], "default");
    assert_eq!(
        (
            &fresh["limit"],
            &fresh["remaining"],
            &fresh["reset_ms"],
            &fresh["banned_ms"]
        ),
        (&3.into(), &3.into(), &0.into(), &0.into()),
        "{fresh}"
    );
    for _ in 0..5 {
        assert_eq!(gws[1].peek("alice")["remaining"], 3, "a peek spent a unit");
    }
    assert_eq!(gws[2].call("alice").status, 200);
    let after = gws[0].peek("alice");
    assert_eq!(after["remaining"], 2, "{after}");
    let reset = after["reset_ms"].as_u64().unwrap();
    assert!((3_599_000..=3_600_000).contains(&reset), "{after}");
    // What the check's headers say, the peek says.
    let r = gws[1].call("alice");
    assert!(r.head.contains("ratelimit: \"default\";r=1;"), "{r:?}");
    assert_eq!(gws[2].peek("alice")["remaining"], 1);
}

#[test]
fn a_reset_frees_a_key_blocked_for_an_hour_on_every_instance_within_a_second() {
    let redis = RedisServer::start();
    let gws = three(
        &redis,
        &[
            "--algorithm",
            "sliding-window",
            "--limit",
            "3",
            "--per",
            "1h",
            "--concurrency",
            "5",
        ],
    );
    for gw in &gws {
        assert_eq!(gw.call("bob").status, 200);
    }
    // Every instance has now had the store deny bob, and caches the denial.
    for gw in &gws {
        for _ in 0..3 {
            let r = gw.call("bob");
            assert_eq!(r.status, 429, "{r:?}");
            let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
            assert!(retry > 3_500, "{r:?}");
        }
    }
    // A reset of a key never seen is a 204 too.
    assert_eq!(gws[2].admin("DELETE", "/keys/nobody", None).status, 204);
    let since = Instant::now();
    let r = gws[1].admin("DELETE", "/keys/bob", None);
    assert_eq!(r.status, 204, "{r:?}");
    let took = until_all(&gws, "bob", 200, since);
    assert!(
        took < BOUND + MARGIN,
        "a reset took {took:?} to reach every instance"
    );
    // Each instance took one unit since: the quota is bob's again, not more.
    assert_eq!(gws[0].peek("bob")["remaining"], 0);
    assert_eq!(gws[0].call("bob").status, 429);
    let logged = gws[1].log();
    assert_eq!(
        logged.matches("admin: key reset").count(),
        1,
        "one line per change: {logged}"
    );
    let line = logged
        .lines()
        .find(|l| l.contains("admin: key reset"))
        .unwrap();
    assert!(
        line.contains("key_sha1=") && !line.contains("bob") && line.contains("peer=127.0.0.1:"),
        "{line}"
    );
    assert!(
        !gws[0].log().contains("admin:"),
        "only the instance asked logs it"
    );
}

#[test]
fn a_ban_holds_on_every_instance_until_it_ends_and_an_unban_lifts_it() {
    let redis = RedisServer::start();
    // A quota the polls below cannot spend within the bound (one unit back every 86 s): only
    // the ban can answer 429 in time.
    let gws = three(&redis, &["--limit", "1000", "--per", "1d"]);
    assert_eq!(gws[0].call("eve").status, 200);
    let since = Instant::now();
    let r = gws[0].admin("PUT", "/bans/eve?seconds=2", None);
    assert_eq!(r.status, 204, "{r:?}");
    let took = until_all(&gws, "eve", 429, since);
    assert!(
        took < BOUND + MARGIN,
        "a ban took {took:?} to reach every instance"
    );
    for gw in &gws {
        let r = gw.call("eve");
        assert_eq!(r.status, 429, "{r:?}");
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=2).contains(&retry), "{r:?}");
    }
    let state = gws[1].peek("eve");
    let banned = state["banned_ms"].as_u64().unwrap();
    assert!(banned > 0 && banned <= 2_000, "{state}");
    assert_eq!(state["remaining"], 999, "a ban takes nothing: {state}");
    // The ban ends on time, everywhere.
    let ends = since + Duration::from_secs(2);
    std::thread::sleep(ends.saturating_duration_since(Instant::now()));
    let took = until_all(&gws, "eve", 200, ends);
    assert!(took < BOUND + MARGIN, "a ban ended {took:?} late");
    assert_eq!(gws[2].peek("eve")["banned_ms"], 0);

    // An hour-long ban, lifted.
    assert_eq!(
        gws[2]
            .admin("PUT", "/bans/mallory?seconds=3600", None)
            .status,
        204
    );
    until_all(&gws, "mallory", 429, Instant::now());
    let r = gws[0].call("mallory");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(retry > 3_590, "{r:?}");
    let since = Instant::now();
    assert_eq!(gws[1].admin("DELETE", "/bans/mallory", None).status, 204);
    let took = until_all(&gws, "mallory", 200, since);
    assert!(
        took < BOUND + MARGIN,
        "an unban took {took:?} to reach every instance"
    );
    let logged = gws[2].log();
    let line = logged
        .lines()
        .find(|l| l.contains("admin: key banned"))
        .unwrap_or_else(|| panic!("{logged}"));
    assert!(
        line.contains("key_sha1=") && !line.contains("mallory") && line.contains("seconds=3600"),
        "{line}"
    );
    assert!(gws[1].log().contains("admin: ban lifted"));

    // Bans take 1 to 86,400 seconds.
    for bad in [
        "?seconds=0",
        "?seconds=86401",
        "?seconds=x",
        "",
        "?seconds=-1",
    ] {
        let r = gws[0].admin("PUT", &format!("/bans/eve{bad}"), None);
        assert_eq!(r.status, 400, "{bad}: {r:?}");
    }
    assert_eq!(gws[0].call("eve").status, 200, "a refused ban bans nothing");
}

#[test]
fn keys_are_named_as_the_extractor_writes_them_percent_encoded() {
    let redis = RedisServer::start();
    let gws = three(&redis, &["--limit", "5", "--per", "1m"]);
    // A header value with a space and a slash.
    assert_eq!(gws[0].call("a b/c").status, 200);
    assert_eq!(gws[1].peek("a%20b%2Fc")["remaining"], 4);
    assert_eq!(gws[1].peek("a%20b%2Fc")["key"], "a b/c");
    drop(gws);

    // --key ip behind a trusted proxy: IPv6 clients by their /64, IPv4 clients by address.
    let url = redis.url();
    let args = [
        "--redis",
        &url,
        "--key",
        "ip",
        "--trusted-proxy",
        "127.0.0.1/32",
        "--limit",
        "5",
        "--per",
        "1m",
        "--prefix",
        "ipkeys",
    ];
    let gw = AdminGateway::start(&args);
    let from = |ip: &str| send(gw.addr, "GET", "/", &[("x-forwarded-for", ip)]);
    assert_eq!(
        gw.admin("PUT", "/bans/2001:db8:1:2::%2F64?seconds=60", None)
            .status,
        204
    );
    assert_eq!(from("2001:db8:1:2::77").status, 429);
    assert_eq!(from("2001:db8:1:3::77").status, 200);
    assert_eq!(from("203.0.113.9").status, 200);
    let state = gw.peek("203.0.113.9");
    assert_eq!(
        (&state["remaining"], &state["banned_ms"]),
        (&4.into(), &0.into())
    );
    // A whole IPv6 address names its network, as the extractor keys the client.
    assert!(gw.peek("2001:db8:1:2::1")["banned_ms"].as_u64().unwrap() > 0);
    assert_eq!(
        gw.admin("DELETE", "/bans/2001:db8:1:2::1", None).status,
        204
    );
    assert_eq!(from("2001:db8:1:2::77").status, 200);
    assert_eq!(gw.admin("GET", "/keys/not-an-address", None).status, 400);
}

/// A key with a plan is peeked under its plan, as its checks are decided; with `--config`,
/// under the limits in force after a reload.
#[test]
fn a_peek_shows_the_quota_of_the_keys_plan_and_of_the_limits_in_force() {
    let redis = RedisServer::start();
    let gws = three(
        &redis,
        &["--limit", "1", "--per", "1h", "--plan", "silver=5/1h"],
    );
    let fresh = gws[0].peek("silver");
    assert_eq!(
        (&fresh["limit"], &fresh["remaining"]),
        (&5.into(), &5.into()),
        "{fresh}"
    );
    let r = gws[1].call("silver");
    assert!(r.head.contains(";q=5;"), "{r:?}");
    let after = gws[2].peek("silver");
    assert_eq!(
        (&after["limit"], &after["remaining"]),
        (&5.into(), &4.into()),
        "{after}"
    );
    let other = gws[0].peek("bronze");
    assert_eq!(
        (&other["limit"], &other["remaining"]),
        (&1.into(), &1.into()),
        "{other}"
    );

    let dir = std::env::temp_dir().join(format!("steer-peek-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("limits.toml");
    let text = |limit: u32, gold: &str| {
        format!("limit = {limit}\nper = \"1h\"\nkey = \"header:x-k\"\n[plans]\ngold = \"{gold}\"\n")
    };
    write_file(&file, &text(3, "7/1h"));
    let url = redis.url();
    let gw = AdminGateway::start(&[
        "--redis",
        &url,
        "--prefix",
        "peek-live",
        "--config",
        file.to_str().unwrap(),
    ]);
    assert_eq!(gw.peek("gold")["limit"], 7);
    assert_eq!(gw.peek("fresh")["limit"], 3);
    write_file(&file, &text(6, "9/1h"));
    wait_lines(&gw, "config reloaded", 1);
    assert_eq!(gw.call("gold").status, 200);
    let gold = gw.peek("gold");
    assert_eq!(
        (&gold["limit"], &gold["remaining"]),
        (&9.into(), &8.into()),
        "{gold}"
    );
    let fresh = gw.peek("fresh");
    assert_eq!(
        (&fresh["limit"], &fresh["remaining"]),
        (&6.into(), &6.into()),
        "{fresh}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_admin_listener_is_guarded() {
    // Not on a loopback address: refused at start-up without a token, in one line.
    let stderr = assert_refused(
        &["--admin-listen", "0.0.0.0:0"],
        "--admin-listen 0.0.0.0:0 is not a loopback address",
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert_refused(&["--admin-token", "t0k3n"], "give --admin-listen ADDR");
    assert_refused(
        &[
            "--admin-listen",
            "127.0.0.1:0",
            "--admin-token",
            "a",
            "--admin-token-file",
            "/dev/null",
        ],
        "give one of --admin-token and --admin-token-file",
    );
    assert_refused(
        &[
            "--admin-listen",
            "127.0.0.1:0",
            "--admin-token-file",
            "/dev/null",
        ],
        "the admin token must be",
    );

    let dir = std::env::temp_dir().join(format!("steer-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, "s3cr3t-from-a-file\n").unwrap();
    let by_flag =
        AdminGateway::start(&["--admin-token", "s3cr3t-on-the-line", "--key", "header:x-k"]);
    let by_file = AdminGateway::start(&[
        "--admin-token-file",
        file.to_str().unwrap(),
        "--key",
        "header:x-k",
    ]);
    for (gw, token) in [
        (&by_flag, "s3cr3t-on-the-line"),
        (&by_file, "s3cr3t-from-a-file"),
    ] {
        for (method, path) in [
            ("GET", "/keys/k"),
            ("DELETE", "/keys/k"),
            ("PUT", "/bans/k?seconds=60"),
            ("DELETE", "/bans/k"),
            ("GET", "/metrics"),
            ("GET", "/top"),
        ] {
            let r = gw.admin(method, path, None);
            assert_eq!(r.status, 401, "{method} {path} without a token: {r:?}");
            let r = gw.admin(method, path, Some("wrong"));
            assert_eq!(r.status, 401, "{method} {path} with a wrong token: {r:?}");
            let r = gw.admin(method, path, Some(&token[..token.len() - 1]));
            assert_eq!(r.status, 401, "{method} {path} with a prefix of it: {r:?}");
        }
        assert_eq!(gw.call("k").status, 200, "nothing was banned");
        let r = gw.admin("PUT", "/bans/k?seconds=60", Some(token));
        assert_eq!(r.status, 204, "{r:?}");
        assert_eq!(gw.call("k").status, 429);
        assert_eq!(gw.admin("GET", "/keys/k", Some(token)).status, 200);
        assert_eq!(gw.admin("GET", "/metrics", Some(token)).status, 200);
        // The scheme is case-insensitive, as HTTP says; the token is not.
        let lower = format!("bearer {token}");
        let r = send(gw.admin, "GET", "/top", &[("authorization", &lower)]);
        assert_eq!(r.status, 200, "{r:?}");
        let upper = format!("Bearer {}", token.to_uppercase());
        let r = send(gw.admin, "GET", "/top", &[("authorization", &upper)]);
        assert_eq!(r.status, 401, "{r:?}");
        assert!(!gw.log().contains(token), "the token is never logged");
    }
    std::fs::remove_dir_all(&dir).unwrap();

    // Without --admin-listen nothing of this is on the public listener.
    let gw = crate::servers::gateway::start_gateway(&["--key", "header:x-k"]);
    for (method, path) in [
        ("GET", "/keys/k"),
        ("DELETE", "/keys/k"),
        ("PUT", "/bans/k?seconds=60"),
    ] {
        let r = send(gw.addr, method, path, &[("x-k", "k")]);
        assert_eq!(r.status, 404, "{method} {path}: {r:?}");
    }
    let gw2 = AdminGateway::start(&["--key", "header:x-k"]);
    let r = send(gw2.addr, "PUT", "/bans/k?seconds=60", &[("x-k", "k")]);
    assert_eq!(
        r.status, 404,
        "the public listener is not the admin one: {r:?}"
    );
    assert_eq!(gw2.call("k").status, 200);
}

/// A request from `ip` with key `k` (header `x-k`).
fn request_from(ip: &str, k: &str) -> http::Request<axum::body::Body> {
    let mut req = http::Request::get("/")
        .header("x-k", k)
        .body(axum::body::Body::empty())
        .unwrap();
    let ip: std::net::IpAddr = ip.parse().unwrap();
    req.extensions_mut().insert(SocketAddr::new(ip, 40000));
    req
}

/// The allow list skips every limit with no store call (a store that cannot answer, under a
/// closed failure policy, would refuse); the deny list refuses first; a ban comes after both.
#[tokio::test]
async fn allow_and_deny_lists_come_before_bans_and_limits() {
    use tower::{service_fn, ServiceBuilder, ServiceExt};
    use tower_redis_ratelimit::{
        rate_limit::AccessList, ClientIp, FailurePolicy, Gcra, HeaderKey, MemoryStore, Quota,
        RateLimitLayer, RateLimiter, RedisStore,
    };
    let ok = service_fn(|_req: http::Request<axum::body::Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::from("ok")))
    });
    // Nothing answers at this address: every store call fails, and is refused (503).
    let dead = RedisStore::connect_lazy(&crate::servers::dead_redis_url()).unwrap();
    let limiter = RateLimiter::builder(dead, Gcra::new(Quota::per_minute(1)).unwrap())
        .on_store_error(FailurePolicy::Closed)
        .store_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let lists = |layer: RateLimitLayer<HeaderKey, Gcra>| {
        layer
            .allow(AccessList::parse(["vip", "both", "10.0.0.0/8", "2001:db8::/32"]).unwrap())
            .deny(AccessList::parse(["evil", "both", "10.6.6.0/24"]).unwrap())
    };
    let layer = lists(RateLimitLayer::new(limiter, HeaderKey::new("x-k").unwrap()));
    let svc = ServiceBuilder::new().layer(layer).service(ok);
    for (ip, k) in [
        ("198.51.100.1", "vip"),
        ("10.1.2.3", "anyone"),
        ("2001:db8::9", "x"),
    ] {
        let res = svc.clone().oneshot(request_from(ip, k)).await.unwrap();
        assert_eq!(res.status(), 200, "{ip} {k}");
        assert!(
            res.headers()
                .keys()
                .all(|h| !h.as_str().contains("ratelimit")),
            "{ip} {k}: {:?}",
            res.headers()
        );
    }
    let res = svc
        .clone()
        .oneshot(request_from("198.51.100.1", "other"))
        .await
        .unwrap();
    assert_eq!(res.status(), 503, "an unlisted key asks the store");
    for (ip, k) in [
        ("198.51.100.1", "evil"),
        ("198.51.100.1", "both"),
        ("10.6.6.6", "vip"),
    ] {
        let res = svc.clone().oneshot(request_from(ip, k)).await.unwrap();
        assert_eq!(res.status(), 403, "{ip} {k}: deny wins");
        assert_eq!(res.headers()["content-type"], "text/plain; charset=utf-8");
    }

    // Allow beats a ban; a ban beats the limit; problem+json for a denial when asked.
    let limiter = RateLimiter::new(
        MemoryStore::new(),
        Gcra::new(Quota::per_minute(100)).unwrap(),
    )
    .unwrap();
    let admin = limiter.clone();
    let layer = lists(RateLimitLayer::new(limiter, HeaderKey::new("x-k").unwrap()))
        .problem_details()
        .list_addresses(ClientIp::new().trust("127.0.0.1/32").unwrap());
    let svc = ServiceBuilder::new().layer(layer).service(ok);
    for k in ["vip", "banned"] {
        admin.ban(k, Duration::from_secs(60)).await.unwrap();
    }
    let res = svc
        .clone()
        .oneshot(request_from("198.51.100.1", "vip"))
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "allow wins over a ban");
    let res = svc
        .clone()
        .oneshot(request_from("198.51.100.1", "banned"))
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    let retry: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
    assert!((59..=60).contains(&retry), "{retry}");
    let res = svc
        .clone()
        .oneshot(request_from("198.51.100.1", "evil"))
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    // Behind a trusted proxy, the forwarded client address is the one listed.
    let mut req = request_from("127.0.0.1", "nobody");
    req.headers_mut()
        .insert("x-forwarded-for", "10.6.6.1".parse().unwrap());
    assert_eq!(svc.clone().oneshot(req).await.unwrap().status(), 403);
    let mut req = request_from("127.0.0.1", "nobody");
    req.headers_mut()
        .insert("x-forwarded-for", "10.9.9.9".parse().unwrap());
    let res = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        res.headers().get("ratelimit").is_none(),
        "allowed by address"
    );
    assert_eq!(admin.peek("nobody").await.unwrap().remaining, 100);
}

#[test]
fn the_gateway_lists_keys_and_networks() {
    let redis = RedisServer::start();
    let url = redis.url();
    let gw = AdminGateway::start(&[
        "--redis",
        &url,
        "--key",
        "header:x-k",
        "--trusted-proxy",
        "127.0.0.1/32",
        "--limit",
        "1",
        "--per",
        "1h",
        "--allow",
        "vip,10.0.0.0/8,2001:db8:aa::/48",
        "--deny",
        "evil,203.0.113.0/24,2001:db8:bad::/48",
    ]);
    let call =
        |k: &str, ip: &str| send(gw.addr, "GET", "/", &[("x-k", k), ("x-forwarded-for", ip)]);
    for _ in 0..3 {
        for (k, ip) in [
            ("vip", "198.51.100.1"),
            ("x", "10.0.0.7"),
            ("y", "2001:db8:aa:1::1"),
        ] {
            let r = call(k, ip);
            assert_eq!(r.status, 200, "{k} {ip}: {r:?}");
            assert!(!r.head.contains("ratelimit"), "{k} {ip}: {r:?}");
        }
        for (k, ip) in [
            ("evil", "198.51.100.1"),
            ("vip", "203.0.113.5"),
            ("z", "2001:db8:bad::2"),
        ] {
            let r = call(k, ip);
            assert_eq!(r.status, 403, "{k} {ip}: {r:?}");
            assert!(!r.head.contains("ratelimit"), "{k} {ip}: {r:?}");
        }
    }
    // Nothing of the listed keys reached Redis (the limit's own marker and published top
    // keys, under `#epoch`, are no client's); an unlisted key is limited as before.
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    let clients: Vec<&String> = keys.iter().filter(|k| !k.contains(":#epoch}")).collect();
    assert!(clients.is_empty(), "{keys:?}");
    assert_eq!(call("plain", "198.51.100.1").status, 200);
    assert_eq!(call("plain", "198.51.100.1").status, 429);
    assert_refused(
        &["--allow", "10.0.0.0/33"],
        "--allow 10.0.0.0/33: invalid list: \"10.0.0.0/33\" is not a CIDR",
    );
    assert_refused(
        &["--deny", "x", "--concurrency", "2"],
        "--allow and --deny cover the rate limit only",
    );
}

/// Two instances on one Redis, each with unit leases: a ban made on one is seen by the other
/// once the lease it holds of the key has ended (at most the lease's lifetime), and at once
/// by the instance that made it; a reset is seen by both at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_reaches_an_instance_holding_a_unit_lease_within_the_lease_lifetime() {
    use tower_redis_ratelimit::{rate_limit::UnitLease, Gcra, Quota, RateLimiter, RedisStore};
    let redis = RedisServer::start();
    let lifetime = Duration::from_millis(400);
    let instance = |store: RedisStore| {
        RateLimiter::builder(store, Gcra::new(Quota::per_second(10_000)).unwrap())
            .lease(UnitLease::up_to(lifetime))
            .build()
            .unwrap()
    };
    let a = instance(RedisStore::connect(&redis.url()).await.unwrap());
    let b = instance(RedisStore::connect(&redis.url()).await.unwrap());
    // The key turns hot on b: b reserves blocks of its units.
    for _ in 0..50 {
        assert!(b.check("hot", 1).await.unwrap().allowed);
    }
    let leased = b.stats().decisions(
        tower_redis_ratelimit::telemetry::Verdict::Allowed,
        tower_redis_ratelimit::telemetry::Source::UnitLease,
    );
    assert!(leased > 0, "b answers the hot key from a lease");
    let since = Instant::now();
    a.ban("hot", Duration::from_secs(30)).await.unwrap();
    assert!(
        a.check("hot", 1).await.unwrap().banned,
        "at once where it was made"
    );
    loop {
        let d = b.check("hot", 1).await.unwrap();
        if !d.allowed {
            assert!(d.banned, "{d:?}");
            break;
        }
        assert!(
            since.elapsed() < lifetime + MARGIN,
            "b still admits the banned key after {:?}",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = since.elapsed();
    assert!(took < lifetime + MARGIN, "{took:?}");
    // The ban holds on b from then on, and an unban and a reset are seen at once.
    for _ in 0..20 {
        assert!(b.check("hot", 1).await.unwrap().banned);
    }
    b.unban("hot").await.unwrap();
    assert!(b.check("hot", 1).await.unwrap().allowed);
    b.reset("hot").await.unwrap();
    assert_eq!(a.peek("hot").await.unwrap().remaining, 10_000);
}

/// On a Redis Cluster, keys of every slot: a peek, a ban, a reset and an unban each reach the
/// node that holds the key (every key of one key's state shares its hash slot).
#[tokio::test]
async fn peeks_bans_and_resets_work_on_a_cluster() {
    use tower_redis_ratelimit::{Quota, RateLimiter, RedisStore, SlidingWindow};
    let cluster = crate::servers::RedisCluster::start(3, 0);
    let store = RedisStore::connect_cluster(&cluster.urls()).await.unwrap();
    let limiter = RateLimiter::new(store, SlidingWindow::new(Quota::per_hour(2)).unwrap()).unwrap();
    for i in 0..24 {
        let key = format!("tenant-{i}");
        for _ in 0..2 {
            assert!(limiter.check(key.as_str(), 1).await.unwrap().allowed);
        }
        assert!(!limiter.check(key.as_str(), 1).await.unwrap().allowed);
        assert_eq!(limiter.peek(key.as_str()).await.unwrap().remaining, 0);
        limiter.reset(key.as_str()).await.unwrap();
        assert_eq!(
            limiter.peek(key.as_str()).await.unwrap().remaining,
            2,
            "{key}"
        );
        limiter
            .ban(key.as_str(), Duration::from_secs(60))
            .await
            .unwrap();
        let state = limiter.peek(key.as_str()).await.unwrap();
        assert!(state.banned_for.unwrap() > Duration::from_secs(59), "{key}");
        assert!(limiter.check(key.as_str(), 1).await.unwrap().banned);
        limiter.unban(key.as_str()).await.unwrap();
        assert!(
            limiter.check(key.as_str(), 1).await.unwrap().allowed,
            "{key}"
        );
    }
    // Nothing but the bans' keys were deleted: each key holds its one admitted check.
    let logs = cluster.keys_with_pttl("*:l2");
    assert_eq!(logs.len(), 24, "{logs:?}");
    assert!(cluster.keys_with_pttl("*:x").is_empty());
}

/// Live limits: a new quota, plans, lists and shadow mode take effect for the next request,
/// counters carried over; a replacement that cannot work changes nothing.
#[tokio::test]
async fn live_limits_are_replaced_whole_and_keep_counters() {
    use tower::{service_fn, ServiceBuilder, ServiceExt};
    use tower_redis_ratelimit::{
        rate_limit::{AccessList, Limits},
        HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter, SlidingWindow,
    };
    let ok = service_fn(|_req: http::Request<axum::body::Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::from("ok")))
    });
    let hour = Duration::from_secs(3600);
    // A sliding window carries a key's spent units over to a new quota (see the guide's
    // table of quotas per request).
    let window = SlidingWindow::new(Quota::new(3, hour)).unwrap();
    let limiter = RateLimiter::new(MemoryStore::new(), window).unwrap();
    let (layer, live) = RateLimitLayer::new(limiter, HeaderKey::new("x-k").unwrap())
        .live(Limits::new(Quota::new(3, hour)).plan("gold", Quota::new(5, hour)))
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service(ok);
    let call = |k: &'static str| {
        let svc = svc.clone();
        async move {
            let res = svc.oneshot(request_from("198.51.100.1", k)).await.unwrap();
            let policy = res
                .headers()
                .get("ratelimit-policy")
                .map(|v| v.to_str().unwrap().to_owned());
            (res.status().as_u16(), policy)
        }
    };
    for _ in 0..3 {
        assert_eq!(call("k").await.0, 200);
    }
    assert_eq!(call("k").await.0, 429);
    for _ in 0..5 {
        assert_eq!(call("gold").await.0, 200);
    }
    let (status, policy) = call("gold").await;
    assert_eq!(status, 429);
    assert!(
        policy.unwrap().contains("q=5"),
        "a plan's quota in the headers"
    );

    // A replacement that cannot work is refused whole: the plan's bad quota too.
    let bad = Limits::new(Quota::new(6, hour)).plan("gold", Quota::new(0, hour));
    let err = live.replace(bad).unwrap_err();
    assert_eq!(err.field(), "plans", "{err}");
    assert_eq!(live.limits().quota(), Quota::new(3, hour));
    assert_eq!(call("k").await.0, 429, "the old limits still hold");

    // Raised to 6: k has 3 more, not 6 (its 3 spent units carry over).
    live.replace(Limits::new(Quota::new(6, hour)).deny(AccessList::parse(["evil"]).unwrap()))
        .unwrap();
    let statuses: Vec<u16> = futures_statuses(&call, "k", 5).await;
    assert_eq!(statuses, [200, 200, 200, 429, 429], "counters carried over");
    assert_eq!(call("evil").await.0, 403);
    // gold has no plan any more: the default quota, with its 5 spent units.
    assert_eq!(call("gold").await.0, 200);
    assert_eq!(call("gold").await.0, 429);
    // Shadow mode on: served, and no rate-limit field.
    live.replace(Limits::new(Quota::new(6, hour)).shadow(true))
        .unwrap();
    assert_eq!(call("k").await, (200, None));
    assert_eq!(call("evil").await.0, 200, "the deny list is gone");
    live.replace(Limits::new(Quota::new(6, hour))).unwrap();
    assert_eq!(call("k").await.0, 429);
}

async fn futures_statuses<F, Fut>(call: &F, k: &'static str, n: usize) -> Vec<u16>
where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = (u16, Option<String>)>,
{
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(call(k).await.0);
    }
    out
}

/// Waits until the gateway's stderr holds `n` lines containing `what` (at most 10 s).
fn wait_lines(gw: &AdminGateway, what: &str, n: usize) -> String {
    let since = Instant::now();
    loop {
        let log = gw.log();
        if log.lines().filter(|l| l.contains(what)).count() >= n {
            return log;
        }
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "no {n} `{what}` lines: {log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Replaces the file at `path` at once (as an editor that renames does).
#[test]
fn a_reload_under_load_changes_the_limit_keeps_counters_and_refuses_a_broken_file() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("steer-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("limits.toml");
    let limits = |limit: u32| {
        format!(
            "algorithm = \"sliding-window\"\nlimit = {limit}\nper = \"1h\"\nkey = \"header:x-k\"\n"
        )
    };
    write_file(&file, &limits(3));
    let url = redis.url();
    let gw = AdminGateway::start(&["--redis", &url, "--config", file.to_str().unwrap()]);
    for _ in 0..2 {
        assert_eq!(gw.call("k").status, 200);
    }
    // Clients keep coming while the file changes: none may fail.
    let stop = AtomicBool::new(false);
    let (served, failed) = (AtomicU64::new(0), Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        for t in 0..2 {
            let (stop, served, failed, addr) = (&stop, &served, &failed, gw.addr);
            s.spawn(move || {
                for i in 0..5_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let key = format!("load-{t}-{}", i % 7);
                    let r = std::panic::catch_unwind(|| send(addr, "GET", "/", &[("x-k", &key)]));
                    match r {
                        Ok(r) if r.status == 200 || r.status == 429 => {
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => failed.lock().unwrap().push(format!("{r:?}")),
                        Err(_) => failed.lock().unwrap().push("no answer".to_owned()),
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
        }
        // Raised to 5: k has 3 more, not 5: its counter was kept.
        write_file(&file, &limits(5));
        wait_lines(&gw, "config reloaded", 1);
        let statuses: Vec<u16> = (0..4).map(|_| gw.call("k").status).collect();
        assert_eq!(statuses, [200, 200, 200, 429], "{}", gw.log());
        let r = gw.call("fresh");
        assert!(
            r.head.contains("ratelimit-policy: \"default\";q=5;"),
            "{r:?}"
        );
        // A half-written file is refused; the limits in force stay.
        write_file(&file, "algorithm = \"sliding-window\"\nlimit = ");
        let log = wait_lines(&gw, "config refused", 1);
        let refused = log.lines().find(|l| l.contains("config refused")).unwrap();
        assert!(refused.contains("line 2"), "{refused}");
        assert_eq!(gw.call("k").status, 429);
        for _ in 0..4 {
            assert_eq!(gw.call("fresh").status, 200, "the limit of 5 holds");
        }
        assert_eq!(gw.call("fresh").status, 429);
        // The algorithm cannot change without a restart, even on SIGHUP.
        write_file(&file, &limits(5).replace("sliding-window", "gcra"));
        let log = wait_lines(&gw, "config refused", 2);
        assert!(
            log.contains("config refused: algorithm cannot change"),
            "{log}"
        );
        crate::servers::signal(gw.child.id(), "-HUP");
        wait_lines(&gw, "config refused", 3);
        // A good file again, read on SIGHUP too.
        write_file(&file, &limits(6));
        wait_lines(&gw, "config reloaded", 2);
        crate::servers::signal(gw.child.id(), "-HUP");
        wait_lines(&gw, "config reloaded", 3);
        assert_eq!(gw.call("k").status, 200, "one more under 6");
        assert_eq!(gw.call("k").status, 429);
        stop.store(true, Ordering::Relaxed);
    });
    let failed = failed.into_inner().unwrap();
    assert!(failed.is_empty(), "{failed:?}");
    assert!(served.load(Ordering::Relaxed) > 20);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_config_file_is_checked_and_its_flags_given_once() {
    let dir = std::env::temp_dir().join(format!("steer-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let check = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let out = Command::new(gateway_bin())
            .args(["--check-config", path.to_str().unwrap()])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let good = "algorithm = \"gcra\"\nlimit = 3\nper = \"1h\"\nburst = 3\nkey = \"header:x-k\"\nshadow = false\nallow = [\"vip\", \"10.0.0.0/8\"]\ndeny = [\"evil\"]\n\n[plans]\ngold = \"100/1m\"\n";
    assert_eq!(
        check("good.toml", good),
        (Some(0), "ok\n".to_owned(), String::new())
    );
    for (text, line, field) in [
        ("limit = 3\nper = \"soon\"\n", 2, "per"),
        ("limit = \"x\"\n", 1, "limit"),
        ("limit = 3\nlisten = \"127.0.0.1:1\"\n", 2, "listen"),
        ("limit = 3\nallow = [\"10.0.0.0/33\"]\n", 2, "allow"),
        ("key = \"ip\"\n[plans]\ngold = \"100/1m\"\n", 2, "plans"),
        ("limit = 3\nper = \"1", 2, "per"),
        // Settings that read well but cannot work are named by their line and field too.
        ("limit = 0\n", 1, "limit"),
        ("limit = 3\nburst = 0\n", 2, "burst"),
        ("unit_lease_ms = 0\n", 1, "unit_lease_ms"),
        ("lease_ms = 100\n", 1, "lease_ms"),
        ("shadow = true\nconcurrency = 2\n", 1, "shadow"),
        (
            "algorithm = \"sliding-window\"\nper = \"1m\"\nkey = \"header:x\"\n[plans]\nsilver = \"5/1m\"\ngold = \"100/1s\"\n",
            6,
            "plans.gold",
        ),
    ] {
        let (code, stdout, stderr) = check("bad.toml", text);
        assert_eq!((code, stdout.as_str()), (Some(1), ""), "{text:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&format!("line {line}, field `{field}`")),
            "{text:?}: {stderr}"
        );
    }
    let path = dir.join("good.toml");
    assert_refused(
        &["--config", path.to_str().unwrap(), "--limit", "4"],
        "field `limit`: --limit is given on the command line too",
    );
    // A limit setting the file leaves to its default is the file's too: a flag cannot set it.
    let only_limit = dir.join("only-limit.toml");
    std::fs::write(&only_limit, "limit = 3\n").unwrap();
    for flags in [
        &["--per", "1m"][..],
        &["--shadow"],
        &["--plan", "gold=5/1m"],
    ] {
        let mut args = vec!["--config", only_limit.to_str().unwrap()];
        args.extend_from_slice(flags);
        assert_refused(
            &args,
            &format!(
                "{} is a limit setting: with --config, give it in the file",
                flags[0]
            ),
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One request to `addr` whose `x-k` header is `key`'s bytes, whatever they are; its status.
fn call_bytes(addr: SocketAddr, key: &[u8]) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut request = b"GET / HTTP/1.1\r\nhost: gw\r\nconnection: close\r\nx-k: ".to_vec();
    request.extend_from_slice(key);
    request.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
    s.write_all(&request).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let head = String::from_utf8_lossy(&out);
    head.get(9..12)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP reply: {head:?}"))
}

/// Calls `key` (bytes) on every gateway until each answers `want`, each asked at most once
/// every 20 ms for at most 10 s (the bound is 1 s; the rest is for a loaded machine).
fn until_all_bytes(gws: &[AdminGateway], key: &[u8], want: u16) {
    let since = Instant::now();
    for (i, gw) in gws.iter().enumerate() {
        loop {
            let status = call_bytes(gw.addr, key);
            if status == want {
                break;
            }
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "gateway {i} still answers {status} for {key:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The bytes 0xFF 0xFE then `abuser`: not UTF-8.
const NOT_UTF8: &[u8] = b"\xff\xfeabuser";
/// What a lossy reading of `NOT_UTF8` shows (U+FFFD twice): another key, which is UTF-8.
const LOOKALIKE: &str = "\u{fffd}\u{fffd}abuser";

#[test]
fn a_key_that_is_not_utf8_is_listed_peeked_reset_banned_and_unbanned_on_every_instance() {
    let redis = RedisServer::start();
    let gws = three(&redis, &["--limit", "3", "--per", "1h"]);
    for want in [200, 200, 200, 429] {
        assert_eq!(call_bytes(gws[0].addr, NOT_UTF8), want);
    }
    // `/top` shows the key percent-encoded, and says so; a UTF-8 key as text. The lookalike
    // is a key of its own.
    for want in [200, 200, 200, 429] {
        assert_eq!(gws[0].call(LOOKALIKE).status, want);
    }
    let r = gws[0].admin("GET", "/top", None);
    assert_eq!(r.status, 200, "{r:?}");
    let top: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let entry = |key: &str| {
        top.as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == key)
            .unwrap_or_else(|| panic!("{key} not in {top}"))
            .clone()
    };
    assert_eq!(entry("%FF%FEabuser")["encoding"], "percent", "{top}");
    assert_eq!(entry(LOOKALIKE)["encoding"], "utf8", "{top}");

    // The name `/top` shows is the name the admin API takes.
    let state = gws[1].peek("%FF%FEabuser");
    assert_eq!(
        (&state["key"], &state["encoding"], &state["remaining"]),
        (&"%FF%FEabuser".into(), &"percent".into(), &0.into()),
        "{state}"
    );
    assert_eq!(
        gws[2].admin("DELETE", "/keys/%FF%FEabuser", None).status,
        204
    );
    // Three units again: one for each instance.
    until_all_bytes(&gws, NOT_UTF8, 200);
    assert_eq!(gws[1].call(LOOKALIKE).status, 429, "a reset of another key");

    assert_eq!(
        gws[1]
            .admin("PUT", "/bans/%FF%FEabuser?seconds=3600", None)
            .status,
        204
    );
    until_all_bytes(&gws, NOT_UTF8, 429);
    assert!(gws[2].peek("%FF%FEabuser")["banned_ms"].as_u64().unwrap() > 3_000_000);
    let other = gws[2].peek("%EF%BF%BD%EF%BF%BDabuser");
    assert_eq!(
        (&other["key"], &other["encoding"], &other["banned_ms"]),
        (&LOOKALIKE.into(), &"utf8".into(), &0.into()),
        "the ban fell on the lookalike: {other}"
    );
    assert_eq!(
        gws[0].admin("DELETE", "/bans/%FF%FEabuser", None).status,
        204
    );
    assert_eq!(gws[0].peek("%FF%FEabuser")["banned_ms"], 0);
}

#[test]
fn a_list_argument_that_is_not_utf8_names_those_bytes_and_no_argument_panics() {
    use std::{ffi::OsStr, os::unix::ffi::OsStrExt};
    let mut deny = Command::new(gateway_bin());
    deny.arg("--deny")
        .arg(OsStr::from_bytes(b"someone,\xff\xfeabuser"));
    let gw = AdminGateway::start_command(deny, &["--key", "header:x-k"]);
    assert_eq!(call_bytes(gw.addr, NOT_UTF8), 403);
    assert_eq!(gw.call("someone").status, 403);
    assert_eq!(gw.call(LOOKALIKE).status, 200);
    drop(gw);

    // Any other flag or value that is not UTF-8: a clear refusal.
    for args in [
        vec![&b"--limit"[..], b"\xff"],
        vec![b"--\xff"],
        vec![b"--key", b"header:\xff"],
    ] {
        let out = Command::new(gateway_bin())
            .args(args.iter().map(|a| OsStr::from_bytes(a)))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn an_audit_line_holds_one_key_whatever_its_bytes() {
    let gw = AdminGateway::start(&["--key", "header:x-k"]);
    // A key holding a newline, a forged line after it and an ANSI escape.
    let path = "/bans/victim%0Aadmin:%20ban%20lifted%20key=victim%1B%5B31m?seconds=60";
    assert_eq!(gw.admin("PUT", path, None).status, 204);
    let log = gw.wait_lines("admin:", 1, Duration::from_secs(10));
    let audit: Vec<&str> = log.lines().filter(|l| l.contains("admin:")).collect();
    assert_eq!(audit.len(), 1, "{log}");
    assert!(audit[0].contains("admin: key banned"), "{log}");
    // The key's digest, never the key: it can be a credential.
    assert!(audit[0].contains("key_sha1="), "{log}");
    assert!(!log.contains("victim"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "an escape reached the log: {log:?}"
    );
}
