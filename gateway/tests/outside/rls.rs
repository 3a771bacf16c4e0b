//! `--rls-listen`: Envoy's rate limit service, asked over gRPC the way Envoy asks it and over
//! `POST /json`, by several gateways on one Redis; its rules reloaded and refused; its flags.

use std::{
    net::SocketAddr,
    process::{Child, Command},
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::servers::{
    dead_redis_url,
    gateway::{assert_refused, gateway_bin, send, spawn_logged, wait_lines},
    RedisServer,
};
use tower_redis_ratelimit::{
    rate_limit::rls::{proto::*, SHOULD_RATE_LIMIT},
    redis,
};

const RULES: &str = "
domain: edge
descriptors:
  - key: api_key
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: path
    value: /admin*
    rate_limit: { unit: hour, requests_per_unit: 1 }
";

/// A gateway serving the rate limit service, its stderr kept.
struct Rls {
    child: Child,
    rls: SocketAddr,
    /// With `--admin-listen`: the operators' listener.
    admin: Option<SocketAddr>,
    log: Arc<Mutex<String>>,
}

impl Drop for Rls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Rls {
    fn start(args: &[&str]) -> Rls {
        let mut command = Command::new(gateway_bin());
        command.args(["--listen", "127.0.0.1:0", "--rls-listen", "127.0.0.1:0"]);
        let (child, log, rx) = spawn_logged(command.args(args));
        let mut gw = Rls {
            child,
            rls: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: None,
            log,
        };
        let mut seen = Vec::new();
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no `rls listening on` line: {seen:?}"));
            if let Some(addr) = line.strip_prefix("rls listening on http://") {
                // After the gateway's own listener.
                assert!(
                    seen.iter()
                        .any(|l: &String| l.starts_with("listening on http://")),
                    "{seen:?}"
                );
                gw.rls = addr.trim().parse().unwrap();
                return gw;
            }
            if let Some(addr) = line.strip_prefix("admin listening on http://") {
                gw.admin = Some(addr.trim().parse().unwrap());
            }
            seen.push(line);
        }
    }

    fn wait_lines(&self, what: &str, n: usize) -> String {
        wait_lines(&self.log, what, n, Duration::from_secs(30))
    }
}

fn rules_file(dir: &tempdir::Dir, text: &str) -> String {
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

mod tempdir {
    /// A directory of its own under the system's temporary directory, removed when dropped.
    pub struct Dir(std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            let p = std::env::temp_dir().join(format!(
                "rls-test-{}-{}",
                std::process::id(),
                crate::servers::free_port()
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
        pub fn path(&self) -> &std::path::Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn request(descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// `ShouldRateLimit` over gRPC (HTTP/2 cleartext), as Envoy calls it.
async fn ask(
    addr: SocketAddr,
    request: RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<RateLimitRequest, RateLimitResponse>::default();
    grpc.unary(
        tonic::Request::new(request),
        http::uri::PathAndQuery::from_static(SHOULD_RATE_LIMIT),
        codec,
    )
    .await
    .map(tonic::Response::into_inner)
}

/// On a Cluster a request's descriptors live in different slots (each rule's keys under a
/// hash tag of their own), so they are checked one script per descriptor and a refused
/// request's units are given back slot by slot: two gateways, 20 requests at once on a
/// pair of rules of which one admits a single request, exactly one admitted, and the other
/// rule's key charged for it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_a_refused_request_spends_nothing_in_any_slot() {
    let cluster = crate::servers::RedisCluster::start(3, 0);
    let nodes = cluster.urls().join(",");
    let dir = tempdir::Dir::new();
    let path = rules_file(
        &dir,
        &RULES.replace("requests_per_unit: 10", "requests_per_unit: 100"),
    );
    let args = ["--redis-cluster", &nodes, "--rls-config", &path];
    let (a, b) = (Rls::start(&args), Rls::start(&args));
    let both = request(&[&[("api_key", "pair")], &[("path", "/admin/users")]]);
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let addr = if i % 2 == 0 { a.rls } else { b.rls };
            tokio::spawn(ask(addr, both.clone()))
        })
        .collect();
    let mut ok = 0;
    for call in calls {
        if call.await.unwrap().unwrap().overall_code() == Code::Ok {
            ok += 1;
        }
    }
    assert_eq!(ok, 1, "/admin* admits one an hour");
    let r = ask(b.rls, request(&[&[("api_key", "pair")]]))
        .await
        .unwrap();
    assert_eq!(
        r.statuses[0].limit_remaining, 98,
        "100 - the one admitted - this one: the 19 refused gave theirs back"
    );
    // The two rules' keys are in different slots.
    let mut slots = Vec::new();
    for url in cluster.urls() {
        let mut node = redis::Client::open(url).unwrap().get_connection().unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut node).unwrap();
        for key in keys {
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&key)
                .query(&mut node)
                .unwrap();
            slots.push((key, slot));
        }
    }
    let slot_of = |what: &str| {
        slots
            .iter()
            .find(|(k, _)| k.contains(what))
            .unwrap_or_else(|| panic!("no key with {what}: {slots:?}"))
            .1
    };
    assert_ne!(slot_of("api_key=pair"), slot_of("path=/admin"), "{slots:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gateways_on_one_redis_count_each_key_exactly_over_grpc() {
    let redis = RedisServer::start();
    let dir = tempdir::Dir::new();
    let path = rules_file(&dir, RULES);
    let url = redis.url();
    let a = Rls::start(&["--redis", &url, "--rls-config", &path]);
    let b = Rls::start(&["--redis", &url, "--rls-config", &path]);
    let mut calls = Vec::new();
    for i in 0..40 {
        let addr = if i % 2 == 0 { a.rls } else { b.rls };
        calls.push(tokio::spawn(ask(addr, request(&[&[("api_key", "k")]]))));
    }
    let mut ok = 0;
    for call in calls {
        let r = call.await.unwrap().unwrap();
        assert_eq!(r.statuses.len(), 1);
        if r.overall_code() == Code::Ok {
            ok += 1;
        }
    }
    assert_eq!(ok, 10, "10 a minute across both gateways");
    // Another key has its own count.
    let r = ask(b.rls, request(&[&[("api_key", "other")]]))
        .await
        .unwrap();
    assert_eq!(
        (r.overall_code(), r.statuses[0].limit_remaining),
        (Code::Ok, 9)
    );
    let limit = r.statuses[0].current_limit.clone().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit()), (10, Unit::Minute));
    // A refused request spends nothing: /admin* is 1 an hour, and the key beside it keeps
    // its units whichever gateway refuses.
    let both = request(&[&[("api_key", "pair")], &[("path", "/admin/users")]]);
    assert_eq!(
        ask(a.rls, both.clone()).await.unwrap().overall_code(),
        Code::Ok
    );
    for gw in [&a, &b, &a, &b] {
        let r = ask(gw.rls, both.clone()).await.unwrap();
        assert_eq!(r.overall_code(), Code::OverLimit);
        assert_eq!(r.statuses[0].code(), Code::Ok);
        assert_eq!(r.statuses[1].code(), Code::OverLimit);
    }
    let alone = request(&[&[("api_key", "pair")]]);
    let r = ask(b.rls, alone).await.unwrap();
    assert_eq!(
        r.statuses[0].limit_remaining, 8,
        "10 - the one admitted - this one"
    );
    // An unknown domain is answered OK with no limits.
    let mut unknown = request(&[&[("api_key", "k")]]);
    unknown.domain = "nowhere".into();
    let r = ask(a.rls, unknown).await.unwrap();
    assert_eq!(r.overall_code(), Code::Ok);
    assert!(r.statuses[0].current_limit.is_none());
}

/// The operators' listener steers the service's rules on every gateway: each rule a policy
/// named by its path (`edge.api_key`), each descriptor a key written `key=value`. A peek, a
/// reset, a ban and its lifting made on one gateway hold on the other; `/top`, `/limits` and
/// the metrics name the rule; a policy nobody has is 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_routes_steer_rls_keys_on_every_gateway() {
    let redis = RedisServer::start();
    let dir = tempdir::Dir::new();
    let path = rules_file(&dir, RULES);
    let url = redis.url();
    let args = [
        "--redis",
        &url,
        "--rls-config",
        &path,
        "--admin-listen",
        "127.0.0.1:0",
    ];
    let (a, b) = (Rls::start(&args), Rls::start(&args));
    let (admin_a, admin_b) = (a.admin.unwrap(), b.admin.unwrap());
    let k1 = || request(&[&[("api_key", "k1")]]);
    // The rule counts calendar minutes: its counts below hold within one.
    clear_of_a_minute_boundary();
    for gw in [&a, &b].repeat(5) {
        assert_eq!(ask(gw.rls, k1()).await.unwrap().overall_code(), Code::Ok);
    }
    assert_eq!(
        ask(b.rls, k1()).await.unwrap().overall_code(),
        Code::OverLimit
    );
    let admin = |addr, method: &str, path: &str| send(addr, method, path, &[]);
    let peek = |addr| {
        let r = admin(addr, "GET", "/keys/api_key=k1?policy=edge.api_key");
        assert_eq!(r.status, 200, "{}", r.body);
        serde_json::from_str::<serde_json::Value>(&r.body).unwrap()
    };
    let state = peek(admin_a);
    assert_eq!(
        (
            &state["key"],
            &state["policy"],
            &state["limit"],
            &state["remaining"]
        ),
        (
            &serde_json::json!("api_key=k1"),
            &serde_json::json!("edge.api_key"),
            &serde_json::json!(10),
            &serde_json::json!(0)
        ),
        "{state}"
    );
    let top = admin(admin_b, "GET", "/top");
    let top: serde_json::Value = serde_json::from_str(&top.body).unwrap();
    assert_eq!(
        (&top[0]["key"], &top[0]["policy"], &top[0]["denied"]),
        (
            &serde_json::json!("api_key=k1"),
            &serde_json::json!("edge.api_key"),
            &serde_json::json!(1)
        ),
        "{top}"
    );
    // A reset on one gateway frees the key on the other (which may answer from its deny
    // cache for at most a second more; a refused request spends nothing).
    let reset = admin(admin_a, "DELETE", "/keys/api_key=k1?policy=edge.api_key");
    assert_eq!(reset.status, 204, "{}", reset.body);
    let r = first_ok(b.rls, k1()).await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    // A ban set on one holds on the other, shows in a peek, and is lifted on either.
    let ban = admin(
        admin_b,
        "PUT",
        "/bans/api_key=k1?policy=edge.api_key&seconds=60",
    );
    assert_eq!(ban.status, 204, "{}", ban.body);
    assert_eq!(
        ask(a.rls, k1()).await.unwrap().overall_code(),
        Code::OverLimit
    );
    assert!(peek(admin_a)["banned_ms"].as_u64().unwrap() > 0);
    let unban = admin(admin_a, "DELETE", "/bans/api_key=k1?policy=edge.api_key");
    assert_eq!(unban.status, 204, "{}", unban.body);
    let r = first_ok(b.rls, k1()).await;
    assert_eq!(r.statuses[0].limit_remaining, 8, "the ban took nothing");
    // The fleet's view adds up both gateways' denials of the rule's key, each gateway
    // publishing its own every 2 s.
    let denied = |addr| {
        let top = admin(addr, "GET", "/top");
        serde_json::from_str::<serde_json::Value>(&top.body).unwrap()[0]["denied"]
            .as_u64()
            .unwrap()
    };
    let (on_a, on_b) = (denied(admin_a), denied(admin_b));
    assert!(on_a >= 1 && on_b >= 1, "{on_a} {on_b}");
    let since = std::time::Instant::now();
    loop {
        let fleet = admin(admin_a, "GET", "/top?scope=fleet");
        let fleet: serde_json::Value = serde_json::from_str(&fleet.body).unwrap();
        if fleet[0]["denied"] == on_a + on_b {
            assert_eq!(fleet[0]["policy"], "edge.api_key", "{fleet}");
            break;
        }
        assert!(since.elapsed() < Duration::from_secs(30), "{fleet}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A policy nobody has.
    let none = admin(admin_a, "GET", "/keys/api_key=k1?policy=edge.nope");
    assert_eq!(none.status, 404, "{}", none.body);
    let limits = admin(admin_a, "GET", "/limits");
    assert!(
        limits.body.contains("\"policy\":\"edge.api_key\""),
        "{}",
        limits.body
    );
    let metrics = admin(admin_b, "GET", "/metrics").body;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("ratelimit_decisions_total")
                && l.contains("policy=\"edge.api_key\"")
                && l.contains("decision=\"denied\"")),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_form_and_reloads_on_sighup_and_on_change() {
    let dir = tempdir::Dir::new();
    let path = rules_file(&dir, RULES);
    let gw = Rls::start(&["--rls-config", &path]);
    let body =
        r#"{"domain": "edge", "descriptors": [{"entries": [{"key": "path", "value": "/admin"}]}]}"#;
    let post = |body: &str| {
        let r = send_body(gw.rls, "/json", body);
        (r.0, r.1)
    };
    let (status, answer) = post(body);
    assert_eq!(status, 200, "{answer}");
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "HOUR");
    let (status, answer) = post(body);
    assert_eq!(status, 429, "{answer}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&answer).unwrap()["overallCode"],
        "OVER_LIMIT"
    );
    assert_eq!(post("{").0, 400);
    // SIGHUP: a line every time, even when nothing changed.
    let hup = || {
        assert!(Command::new("kill")
            .args(["-HUP", &gw.child.id().to_string()])
            .status()
            .unwrap()
            .success());
    };
    hup();
    gw.wait_lines("rls config reloaded: ", 1);
    hup();
    gw.wait_lines("rls config reloaded: ", 2);
    // A file that does not read is refused, the rules in force stay.
    std::fs::write(
        &path,
        "domain: edge\ndescriptors:\n  - key: api_key\n    bogus: 1\n",
    )
    .unwrap();
    let log = gw.wait_lines("rls config refused: ", 1);
    assert!(log.contains("bogus"), "{log}");
    assert_eq!(post(body).0, 429, "the old rules stay");
    // A change is read once it has settled: /admin* now unlimited.
    std::fs::write(
        &path,
        RULES.replace(
            "rate_limit: { unit: hour, requests_per_unit: 1 }",
            "rate_limit: { unlimited: true }",
        ),
    )
    .unwrap();
    gw.wait_lines("rls config reloaded: ", 3);
    let (status, answer) = post(body);
    assert_eq!(status, 200, "{answer}");
    // gRPC on the same port.
    let r = ask(gw.rls, request(&[&[("api_key", "k")]])).await.unwrap();
    assert_eq!(r.overall_code(), Code::Ok);
}

/// Asks `request` until it is answered OK (for at most 30 s, a refusal each 50 ms at most):
/// the first OK answer.
/// Waits, when a UTC minute ends within 20 s, for the next one to begin: a test that counts
/// a per-minute fixed window for a few seconds then runs within one window.
fn clear_of_a_minute_boundary() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = Duration::from_millis((now.as_millis() % 60_000) as u64);
    if into >= Duration::from_secs(40) {
        std::thread::sleep(Duration::from_secs(60) - into + Duration::from_millis(100));
    }
}

async fn first_ok(addr: SocketAddr, request: RateLimitRequest) -> RateLimitResponse {
    let since = std::time::Instant::now();
    loop {
        let r = ask(addr, request.clone()).await.unwrap();
        if r.overall_code() == Code::Ok {
            return r;
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "still refused: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// POST `body` to `path` over a fresh connection: (status, body).
fn send_body(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_fails_answers_by_the_failure_policy() {
    let dir = tempdir::Dir::new();
    let path = rules_file(&dir, RULES);
    let dead = dead_redis_url();
    let open = Rls::start(&["--redis", &dead, "--lazy-connect", "--rls-config", &path]);
    let r = ask(open.rls, request(&[&[("api_key", "k")]]))
        .await
        .unwrap();
    assert_eq!(r.overall_code(), Code::Ok, "open: let through");
    let closed = Rls::start(&[
        "--redis",
        &dead,
        "--lazy-connect",
        "--on-redis-error",
        "closed",
        "--rls-config",
        &path,
    ]);
    let e = ask(closed.rls, request(&[&[("api_key", "k")]]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
}

#[test]
fn rls_flags_are_refused_where_they_cannot_work() {
    let dir = tempdir::Dir::new();
    let path = rules_file(&dir, RULES);
    assert_refused(
        &["--rls-listen", "127.0.0.1:0"],
        "--rls-listen needs --rls-config",
    );
    assert_refused(
        &["--rls-config", &path],
        "--rls-config goes with --rls-listen",
    );
    assert_refused(
        &[
            "--rls-listen",
            "127.0.0.1:0",
            "--rls-config",
            &path,
            "--rls-algorithm",
            "leaky",
        ],
        "--rls-algorithm",
    );
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight }\n",
    )
    .unwrap();
    assert_refused(
        &[
            "--rls-listen",
            "127.0.0.1:0",
            "--rls-config",
            bad.to_str().unwrap(),
        ],
        "fortnight",
    );
    assert_refused(
        &[
            "--rls-listen",
            "127.0.0.1:0",
            "--rls-config",
            &path,
            "--regions",
            "a=redis://127.0.0.1:1",
            "--region",
            "a",
        ],
        "--rls-listen does not work with --regions",
    );
    assert_refused(
        &[
            "--algorithm",
            "fixed-window",
            "--regions",
            "a=redis://127.0.0.1:1",
            "--region",
            "a",
        ],
        "--algorithm fixed-window",
    );
}
