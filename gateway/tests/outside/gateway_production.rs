//! The gateway demo's flags for production Redis, run as a user runs it: TLS and mutual TLS,
//! failing fast and clearly at start unless `--redis-lazy`, and `--redis-sentinel`.

use std::{
    net::TcpListener,
    process::Command,
    time::{Duration, Instant},
};

use crate::servers::{
    gateway::{gateway_bin, get, start_gateway},
    keys_with_pttl,
    sentinel::{SentinelSetup, MASTER},
    tls::{Certs, TlsRedis},
    RedisServer,
};

#[test]
fn gateway_with_redis_sentinel() {
    let setup = SentinelSetup::start();
    let sentinels = setup.sentinel_urls().join(",");
    let gw = start_gateway(&[
        "--redis-sentinel",
        &sentinels,
        "--sentinel-master",
        MASTER,
        "--key",
        "header:x-key",
        "--limit",
        "3",
        "--per",
        "60s",
    ]);
    assert!(
        gw.banner.iter().any(|l| l.contains("sentinel")),
        "{:?}",
        gw.banner
    );
    let statuses: Vec<u16> = (0..4).map(|_| get(gw.addr, "x-key: k1\r\n").0).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    // Another key has its own quota; the counters are on the primary.
    assert_eq!(get(gw.addr, "x-key: k2\r\n").0, 200);
    assert!(!keys_with_pttl(&mut setup.primary.conn(), "*").is_empty());
}

/// The gateway's TLS flags as a user types them.
#[test]
fn gateway_speaks_tls_and_mutual_tls() {
    let certs = Certs::make("test CA");
    let redis = TlsRedis::start(&certs, true, &[]);
    let url = redis.url();
    let gw = start_gateway(&[
        "--redis",
        &url,
        "--redis-ca",
        certs.ca.to_str().unwrap(),
        "--redis-cert",
        certs.client_cert.to_str().unwrap(),
        "--redis-key",
        certs.client_key.to_str().unwrap(),
        "--key",
        "header:x-key",
        "--limit",
        "3",
        "--per",
        "60s",
    ]);
    let statuses: Vec<u16> = (0..4).map(|_| get(gw.addr, "x-key: t\r\n").0).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
}

/// Without `--lazy-connect`, a gateway that cannot connect, authenticate or verify the server
/// exits non-zero within the connect timeout plus a second, with one line on stderr naming
/// the cause, and never listens; with it, it starts.
#[test]
fn gateway_fails_fast_and_clearly_unless_lazy() {
    let certs = Certs::make("test CA");
    let tls = TlsRedis::start(&certs, false, &[]);
    let auth = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("redis://{}", silent.local_addr().unwrap());
    let tls_url = tls.url();
    let auth_url = auth.url();
    let wrong = format!("redis://:nope@127.0.0.1:{}", auth.port);
    let dead = crate::servers::dead_redis_url();
    for (args, needle) in [
        (vec!["--redis", &silent_url], "timed out"),
        (vec!["--redis", &dead], "unreachable"),
        (vec!["--redis", &auth_url], "authentication required"),
        (vec!["--redis", &wrong], "authentication failed"),
        (vec!["--redis", &tls_url], "TLS"),
    ] {
        let args = [&args[..], &["--connect-timeout-ms", "500"]].concat();
        let (stderr, _, elapsed) = failing_gateway(&args);
        assert_eq!(stderr.len(), 1, "{args:?}: {stderr:?}");
        assert!(stderr[0].contains(needle), "{args:?}: {stderr:?}");
        assert!(
            elapsed < Duration::from_millis(1_500),
            "{args:?}: {elapsed:?}"
        );
    }
    // The same failure with --lazy-connect starts, and applies the failure policy.
    let gw = start_gateway(&[
        "--redis",
        &dead,
        "--lazy-connect",
        "--on-redis-error",
        "closed",
    ]);
    assert_eq!(get(gw.addr, "").0, 503);
}

/// Runs the gateway with `args` (it must fail); returns its stderr lines and the time it took.
fn failing_gateway(args: &[&str]) -> (Vec<String>, String, Duration) {
    let started = Instant::now();
    let out = Command::new(gateway_bin())
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    assert!(!out.status.success(), "{args:?} started");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!stdout.contains("listening on"), "{stdout}");
    let stderr: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_owned)
        .collect();
    (stderr, stdout, elapsed)
}
