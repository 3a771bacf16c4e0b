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
    gateway::{assert_refused, gateway_bin, spawn_logged, wait_lines},
    RedisServer,
};
use tower_redis_ratelimit::rate_limit::rls::{proto::*, SHOULD_RATE_LIMIT};

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
