//! The recipe example (`examples/recipe.rs`) as its users meet it: its `app` served on a real
//! axum server on 127.0.0.1, asked over HTTP by clients on loopback addresses of their own
//! (127.0.0.1, 127.0.0.2, ...), with the in-memory store and with a real `redis-server`.

#[allow(dead_code)]
#[path = "../../examples/recipe.rs"]
mod example;

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use tokio::task::JoinHandle;

use crate::servers::RedisServer;
use example::{BROWSE, LOGIN};
use tower_redis_ratelimit::{redis, store::Store, MemoryStore, Quota};

const IP_1: &str = "127.0.0.1";
const IP_2: &str = "127.0.0.2";

/// The recipe's app on a free port; the server stops on drop.
struct App {
    addr: SocketAddr,
    server: JoinHandle<std::io::Result<()>>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn start(store: impl Store + Clone) -> App {
    let app = example::app(store).expect("the recipe's configuration is valid");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(example::serve(listener, app));
    App { addr, server }
}

#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: impl header::AsHeaderName) -> &str {
        self.headers
            .get(name)
            .map_or("", |v| v.to_str().expect("an ASCII header"))
    }
}

impl App {
    /// `GET /` (browsing) or `POST /login`, from the loopback address `from`, with the
    /// `x-api-key` header when `api_key` is given.
    async fn send(&self, from: &str, path: &str, api_key: Option<&str>) -> Reply {
        let mut connector = HttpConnector::new();
        connector.set_local_address(Some(from.parse::<IpAddr>().unwrap()));
        let client = Client::builder(TokioExecutor::new()).build(connector);
        let method = if path == "/login" {
            Method::POST
        } else {
            Method::GET
        };
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        if let Some(key) = api_key {
            req = req.header("x-api-key", key);
        }
        let res = tokio::time::timeout(
            Duration::from_secs(10),
            client.request(req.body(Empty::<Bytes>::new()).unwrap()),
        )
        .await
        .expect("no answer within 10 s")
        .expect("HTTP request failed");
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }

    /// Sends the same request until the first 429 and returns it. The first `left` requests
    /// (what the client has not spent yet of `quota`) must pass, and no more than time can
    /// have refilled (one unit per `period / limit`) may pass after them.
    async fn spend(&self, from: &str, path: &str, api_key: Option<&str>, left: Left) -> Reply {
        let Left(left, quota) = left;
        let interval = quota.period() / quota.limit();
        let started = Instant::now();
        let mut allowed = 0u32;
        loop {
            let reply = self.send(from, path, api_key).await;
            match reply.status {
                StatusCode::OK => allowed += 1,
                StatusCode::TOO_MANY_REQUESTS => {
                    let refilled = started.elapsed().as_micros().div_ceil(interval.as_micros());
                    assert!(
                        allowed >= left && u128::from(allowed - left) <= refilled,
                        "{path} from {from} (key {api_key:?}): {allowed} allowed, expected \
                         {left} (+{refilled} refilled)"
                    );
                    return reply;
                }
                other => panic!("{path} from {from}: unexpected {other}: {reply:?}"),
            }
            assert!(allowed <= left + 100, "{path} from {from}: never limited");
        }
    }
}

/// `n` units not spent yet of a quota.
struct Left(u32, Quota);

/// Asserts `reply` is the recipe's 429: the JSON body naming `policy`, `Retry-After` and
/// the IETF `RateLimit` fields of `policy`, whose quota is `q` units restored in `w` s.
fn assert_limited(reply: &Reply, policy: &str, q: u32, w: u32) {
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
    assert_eq!(reply.header(header::CONTENT_TYPE), "application/json");
    let prefix = format!(r#"{{"error":"rate_limited","policy":"{policy}","retry_after_ms":"#);
    let retry_ms: u64 = reply
        .body
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix("}\n"))
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("not the recipe's JSON body: {:?}", reply.body));
    assert!((1..=u64::from(w) * 1000).contains(&retry_ms), "{retry_ms}");
    assert_eq!(
        reply.header("ratelimit-policy"),
        format!("\"{policy}\";q={q};w={w}")
    );
    // `t` and `Retry-After` are the wait in whole seconds, rounded up.
    let retry_after = reply.header(header::RETRY_AFTER);
    assert_eq!(
        retry_after,
        retry_ms.div_ceil(1000).to_string(),
        "{reply:?}"
    );
    assert_eq!(
        reply.header("ratelimit"),
        format!("\"{policy}\";r=0;t={retry_after}")
    );
}

/// The recipe's limits, whatever the store.
async fn recipe_limits(app: &App) {
    // (a) Browsing, per client IP: BROWSE's burst, then the JSON 429 with the IETF fields.
    let limited = app
        .spend(IP_1, "/", None, Left(BROWSE.burst_size(), BROWSE))
        .await;
    assert_limited(&limited, "browse", 20, 12);
    // Per IP: another client address has its whole quota.
    let other = app.send(IP_2, "/", None).await;
    assert_eq!(other.status, StatusCode::OK, "{other:?}");
    assert_eq!(other.body, "hello\n");
    assert_eq!(other.header("ratelimit-policy"), "\"browse\";q=20;w=12");
    assert!(
        other.header("ratelimit").starts_with("\"browse\";r=19;t="),
        "{other:?}"
    );

    // (b) Browsing spent none of the log-in quota: LOGIN's 5 attempts, then its own 429.
    let limited = app
        .spend(IP_1, "/login", None, Left(LOGIN.limit(), LOGIN))
        .await;
    assert_limited(&limited, "login", 5, 60);
    // ... and logging in spends none of the browsing quota: IP_2's second browse, moments
    // after its first, has 18 left (one unit refills every 600 ms).
    let other = app.send(IP_2, "/login", None).await;
    assert_eq!(other.status, StatusCode::OK, "{other:?}");
    assert_eq!(other.body, "welcome\n");
    assert!(other.header("ratelimit").starts_with("\"login\";r=4;"));
    let other = app.send(IP_2, "/", None).await;
    assert!(other.header("ratelimit").starts_with("\"browse\";r=18;"));

    // (c) An API key has its own quota, whatever its IP has spent...
    let keyed = app.send(IP_1, "/", Some("k-1")).await;
    assert_eq!(keyed.status, StatusCode::OK, "{keyed:?}");
    assert!(keyed.header("ratelimit").starts_with("\"browse\";r=19;"));
    // ... and follows the key, not the IP: spent from one address, limited from another.
    let limited = app
        .spend(
            IP_1,
            "/",
            Some("k-1"),
            Left(BROWSE.burst_size() - 1, BROWSE),
        )
        .await;
    assert_limited(&limited, "browse", 20, 12);
    let limited = app.send(IP_2, "/", Some("k-1")).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS, "{limited:?}");
    // The exhausted key spent nothing of its IPs' quotas, nor of other keys'.
    let ip = app.send(IP_2, "/", None).await;
    assert_eq!(ip.status, StatusCode::OK, "{ip:?}");
    let other_key = app.send(IP_1, "/", Some("k-2")).await;
    assert_eq!(other_key.status, StatusCode::OK, "{other_key:?}");
    // An API key that reads like an address is not that address' quota.
    let lookalike = app.send(IP_1, "/", Some(IP_1)).await;
    assert_eq!(lookalike.status, StatusCode::OK, "{lookalike:?}");
}

#[tokio::test]
async fn recipe_with_the_memory_store() {
    let app = start(MemoryStore::new()).await;
    recipe_limits(&app).await;
}

#[tokio::test]
async fn recipe_with_redis() {
    let mut server = RedisServer::start();
    let store = tower_redis_ratelimit::RedisStore::connect(&server.url())
        .await
        .unwrap();
    let app = start(store).await;
    recipe_limits(&app).await;

    // The counters in Redis: one per policy and client, the browsing and log-in policies apart.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.conn())
        .unwrap();
    for base in [
        "{rl:browse:#ip:127.0.0.1}",
        "{rl:browse:#ip:127.0.0.2}",
        "{rl:login:#ip:127.0.0.1}",
        "{rl:login:#ip:127.0.0.2}",
        "{rl:browse:k-1}",
        "{rl:browse:k-2}",
    ] {
        assert!(keys.iter().any(|k| k.starts_with(base)), "{base}: {keys:?}");
    }

    // (b) With Redis gone, browsing fails open and log-in fails closed.
    server.kill();
    let browse = app.send("127.0.0.3", "/", None).await;
    assert_eq!(browse.status, StatusCode::OK, "{browse:?}");
    assert_eq!(browse.header("ratelimit"), "", "{browse:?}");
    let login = app.send("127.0.0.3", "/login", None).await;
    assert_eq!(login.status, StatusCode::SERVICE_UNAVAILABLE, "{login:?}");
    assert_eq!(login.header(header::RETRY_AFTER), "1", "{login:?}");
}
