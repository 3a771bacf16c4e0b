//! An app that mounts the operators' console (`rate_limit::admin::Admin`) beside its own routes, served by
//! a real axum server on 127.0.0.1 and asked over TCP: the token's guard, top keys, peeks,
//! bans and resets, the limits in force, health, metrics.
#![cfg(feature = "admin")]

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use axum::{routing::get, Router};
use tower_redis_ratelimit::{
    rate_limit::admin::Admin, rate_limit::Limits, Gcra, HeaderKey, MemoryStore, Quota,
    RateLimitLayer, RateLimiter,
};

/// `method path` with `headers` over a fresh connection: the status and the body.
fn ask(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: app\r\nconnection: close\r\n");
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_mounts_the_console_beside_its_own_routes() {
    let quota = Quota::per_hour(2);
    let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(quota).unwrap()).unwrap();
    let layer = RateLimitLayer::new(limiter.clone(), HeaderKey::new("x-api-key").unwrap());
    let (layer, live) = layer
        .live(Limits::new(quota).plan("gold", Quota::per_hour(100)))
        .unwrap();
    let console = Admin::new(limiter.clone())
        .live(live.clone())
        .metrics(|| "app_up 1\n".to_owned())
        .token("t0ken")
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer)
        .nest("/admin", console.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, app).await.unwrap();
    });
    let auth = [("authorization", "Bearer t0ken")];
    tokio::task::spawn_blocking(move || {
        // The app's own route, limited.
        let statuses: Vec<u16> = (0..3)
            .map(|_| ask(addr, "GET", "/", &[("x-api-key", "bob")]).0)
            .collect();
        assert_eq!(statuses, [200, 200, 429]);
        // The console wants its token.
        assert_eq!(ask(addr, "GET", "/admin/top", &[]).0, 401);
        assert_eq!(ask(addr, "GET", "/admin/top", &[("authorization", "Bearer nope")]).0, 401);
        let (status, top) = ask(addr, "GET", "/admin/top", &auth);
        assert_eq!(status, 200, "{top}");
        let top: serde_json::Value = serde_json::from_str(&top).unwrap();
        assert_eq!(top[0]["key"], "bob", "{top}");
        assert_eq!(top[0]["denied"], 1, "{top}");
        // A peek, a reset, a ban, an unban.
        let peek = |key: &str| {
            let (status, body) = ask(addr, "GET", &format!("/admin/keys/{key}"), &auth);
            assert_eq!(status, 200, "{body}");
            serde_json::from_str::<serde_json::Value>(&body).unwrap()
        };
        assert_eq!(peek("bob")["remaining"], 0);
        assert_eq!(peek("gold")["limit"], 100, "a plan's key shows its plan's quota");
        assert_eq!(ask(addr, "DELETE", "/admin/keys/bob", &auth).0, 204);
        assert_eq!(peek("bob")["remaining"], 2);
        assert_eq!(ask(addr, "PUT", "/admin/bans/bob?seconds=60", &auth).0, 204);
        assert_eq!(ask(addr, "GET", "/", &[("x-api-key", "bob")]).0, 429);
        assert!(peek("bob")["banned_ms"].as_u64().unwrap() > 59_000);
        assert_eq!(ask(addr, "PUT", "/admin/bans/bob?seconds=0", &auth).0, 400);
        assert_eq!(ask(addr, "DELETE", "/admin/bans/bob", &auth).0, 204);
        assert_eq!(ask(addr, "GET", "/", &[("x-api-key", "bob")]).0, 200);
        // The limits in force, after a replacement too.
        let limits = || {
            let (status, body) = ask(addr, "GET", "/admin/limits", &auth);
            assert_eq!(status, 200, "{body}");
            serde_json::from_str::<serde_json::Value>(&body).unwrap()
        };
        assert_eq!(
            limits(),
            serde_json::json!({"generation": 0, "policies": [
                {"policy": "default", "algorithm": "gcra", "limit": 2, "per_ms": 3_600_000, "burst": 2, "shadow": false},
                {"policy": "plan:gold", "algorithm": "gcra", "limit": 100, "per_ms": 3_600_000, "burst": 100, "shadow": false},
            ]})
        );
        live.replace(Limits::new(Quota::per_hour(5))).unwrap();
        assert_eq!(limits()["generation"], 1);
        assert_eq!(limits()["policies"][0]["limit"], 5);
        assert_eq!(limits()["policies"].as_array().unwrap().len(), 1);
        // Health, metrics, and what is not there.
        assert_eq!(ask(addr, "GET", "/admin/healthz", &auth), (200, "ok\n".to_owned()));
        assert_eq!(ask(addr, "GET", "/admin/metrics", &auth), (200, "app_up 1\n".to_owned()));
        assert_eq!(ask(addr, "GET", "/admin/region", &auth).0, 404);
        assert_eq!(ask(addr, "GET", "/admin/top?scope=galaxy", &auth).0, 400);
    })
    .await
    .unwrap();
}

#[test]
fn a_token_that_cannot_be_sent_is_refused() {
    let limiter =
        RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(1)).unwrap()).unwrap();
    for bad in ["", "has space", "new\nline"] {
        let e = Admin::new(limiter.clone()).token(bad).unwrap_err();
        assert_eq!(e.field(), "admin.token", "{bad:?}");
    }
}

/// What the limiter reports serializes as the console shows it (feature `serde`, which
/// `admin` turns on): its counters with every verdict and source by name, its top keys.
#[tokio::test]
async fn stats_and_top_keys_serialize() {
    let limiter =
        RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_hour(1)).unwrap()).unwrap();
    for _ in 0..3 {
        limiter.check("k", 1).await.unwrap();
    }
    let stats = serde_json::to_value(limiter.stats()).unwrap();
    assert_eq!(
        (stats["allowed"].clone(), stats["denied"].clone()),
        (1.into(), 2.into())
    );
    assert_eq!(stats["decisions"]["allowed"]["store"], 1, "{stats}");
    let denied = &stats["decisions"]["denied"];
    assert_eq!(
        denied["store"].as_u64().unwrap() + denied["deny_cache"].as_u64().unwrap(),
        2
    );
    let top = serde_json::to_value(limiter.top_keys(1)).unwrap();
    assert_eq!(top[0]["key"], "k", "{top}");
    assert_eq!(top[0]["policy"], "default", "{top}");
    assert_eq!(top[0]["denied"], 2, "{top}");
}
