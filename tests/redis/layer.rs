//! The layer end to end against real Redis: headers, denials, gRPC, custom key, cost and
//! rejection, and axum / ServiceBuilder integration.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::common::counting;
use crate::servers::RedisServer;
use axum::{body::Body, routing::get, Router};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    extract::MissingKey, rate_limit::HeaderStyle, Gcra, GlobalKey, HeaderKey, PeerIp, Quota,
    RateLimitLayer, RateLimiter, RedisStore, SlidingWindow,
};

fn limiter(store: RedisStore, prefix: &str, quota: Quota) -> RateLimiter<Gcra> {
    RateLimiter::builder(store, Gcra::new(quota).unwrap())
        .prefix(prefix)
        .store_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn get_from(ip: &str) -> Request<Body> {
    let mut req = Request::get("/").body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(format!("{ip}:40000").parse::<SocketAddr>().unwrap());
    req
}

fn header<'a, B>(res: &'a Response<B>, name: &str) -> Option<&'a str> {
    res.headers().get(name).map(|v| v.to_str().unwrap())
}

async fn body_text<B: http_body::Body>(res: Response<B>) -> String
where
    B::Error: std::fmt::Debug,
{
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn headers_on_200_and_429_and_inner_not_called_when_denied() {
    let redis = RedisServer::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(
        limiter(redis.store().await, "l1", Quota::per_minute(2)),
        PeerIp,
    );
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(counting(calls.clone()));

    let res = svc.clone().oneshot(get_from("203.0.113.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"default\";q=2;w=60")
    );
    assert_eq!(header(&res, "ratelimit"), Some("\"default\";r=1;t=30"));
    assert_eq!(header(&res, "retry-after"), None);
    assert_eq!(body_text(res).await, "hello");

    let res = svc.clone().oneshot(get_from("203.0.113.1")).await.unwrap();
    assert_eq!(header(&res, "ratelimit"), Some("\"default\";r=0;t=60"));

    let res = svc.clone().oneshot(get_from("203.0.113.1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let t: u64 = header(&res, "ratelimit")
        .unwrap()
        .strip_prefix("\"default\";r=0;t=")
        .unwrap()
        .parse()
        .unwrap();
    let retry: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
    assert!((29..=30).contains(&t), "t={t}");
    assert!(retry >= t, "Retry-After {retry} earlier than t {t}");
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"default\";q=2;w=60")
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the denied request reached the handler"
    );

    // Another client has its own quota.
    let res = svc.clone().oneshot(get_from("203.0.113.2")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn legacy_both_and_no_headers() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (prefix, style, expect_ietf, expect_legacy) in [
        ("st-legacy", HeaderStyle::Legacy, false, true),
        ("st-both", HeaderStyle::Both, true, true),
        ("st-none", HeaderStyle::None, false, false),
    ] {
        let layer = RateLimitLayer::new(
            limiter(store.clone(), prefix, Quota::per_hour(1)),
            GlobalKey,
        )
        .headers(style);
        let svc = ServiceBuilder::new()
            .layer(layer)
            .service(counting(Default::default()));
        let ok = svc.clone().oneshot(get_from("192.0.2.1")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            ok.headers().contains_key("ratelimit"),
            expect_ietf,
            "{style:?}"
        );
        assert_eq!(
            ok.headers().contains_key("x-ratelimit-limit"),
            expect_legacy,
            "{style:?}"
        );
        if expect_legacy {
            assert_eq!(header(&ok, "x-ratelimit-limit"), Some("1"));
            assert_eq!(header(&ok, "x-ratelimit-remaining"), Some("0"));
            assert_eq!(header(&ok, "x-ratelimit-reset"), Some("3600"));
        }
        let denied = svc.clone().oneshot(get_from("192.0.2.1")).await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(denied.headers().contains_key("retry-after"), "{style:?}");
        assert_eq!(
            denied.headers().get_all("ratelimit").iter().count(),
            usize::from(expect_ietf)
        );
    }
}

#[tokio::test]
async fn grpc_requests_are_denied_the_grpc_way() {
    let redis = RedisServer::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(
        limiter(redis.store().await, "grpc", Quota::per_hour(1)),
        GlobalKey,
    );
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(counting(calls.clone()));
    let grpc = || {
        Request::post("/pkg.Greeter/SayHello")
            .header("content-type", "application/grpc+proto")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        svc.clone().oneshot(grpc()).await.unwrap().status(),
        StatusCode::OK
    );
    let res = svc.clone().oneshot(grpc()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "grpc-status"), Some("8"));
    assert_eq!(header(&res, "grpc-message"), Some("rate limit exceeded"));
    assert_eq!(header(&res, "content-type"), Some("application/grpc"));
    assert!(header(&res, "retry-after").is_some());
    assert!(header(&res, "ratelimit").is_some());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn custom_key_cost_and_rejection() {
    let redis = RedisServer::start();
    let calls = Arc::new(AtomicUsize::new(0));
    let window = SlidingWindow::new(Quota::per_minute(10)).unwrap();
    let limiter = RateLimiter::builder(redis.store().await, window)
        .prefix("custom")
        .policy_name("api-key")
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(limiter, |parts: &http::request::Parts| {
        parts
            .headers
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .map(|t| format!("tenant:{t}"))
    })
    .cost(|parts| match parts.uri.path() {
        "/send" => 5,
        "/health" => 0,
        _ => 1,
    })
    .on_limited(|d| {
        Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header("content-type", "application/json")
            .body(format!(
                "{{\"error\":\"quota\",\"remaining\":{},\"cost\":{}}}",
                d.remaining, d.cost
            ))
            .unwrap()
    });
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(counting(calls.clone()));
    let req = |path: &str, tenant: &str| {
        Request::get(path)
            .header("x-tenant", tenant)
            .body(Body::empty())
            .unwrap()
    };

    let res = svc.clone().oneshot(req("/send", "acme")).await.unwrap();
    assert_eq!(header(&res, "ratelimit"), Some("\"api-key\";r=5;t=60"));
    let res = svc.clone().oneshot(req("/read", "acme")).await.unwrap();
    assert_eq!(header(&res, "ratelimit"), Some("\"api-key\";r=4;t=60"));
    // Free requests are not checked and carry no headers.
    let res = svc.clone().oneshot(req("/health", "acme")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "ratelimit"), None);
    // 4 left, a send costs 5: the custom rejection, with the headers added.
    let res = svc.clone().oneshot(req("/send", "acme")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "content-type"), Some("application/json"));
    assert!(header(&res, "retry-after").is_some());
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"api-key\";q=10;w=60")
    );
    assert_eq!(
        body_text(res).await,
        r#"{"error":"quota","remaining":4,"cost":5}"#
    );
    // Other tenants are untouched.
    let res = svc.clone().oneshot(req("/send", "globex")).await.unwrap();
    assert_eq!(header(&res, "ratelimit"), Some("\"api-key\";r=5;t=60"));
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn cost_above_quota_is_denied_as_never() {
    let redis = RedisServer::start();
    let layer = RateLimitLayer::new(
        limiter(redis.store().await, "never", Quota::per_minute(3)),
        GlobalKey,
    )
    .cost(|_| 4);
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(counting(Default::default()));
    let res = svc.oneshot(get_from("192.0.2.9")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), None);
    assert_eq!(header(&res, "ratelimit"), Some("\"default\";r=3"));
    assert!(body_text(res).await.contains("can never be allowed"));
}

#[tokio::test]
async fn requests_without_a_key_share_one_quota_or_pass() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    let no_conn_info = || Request::get("/").body(Body::empty()).unwrap();

    let shared = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            limiter(store.clone(), "nokey1", Quota::per_hour(2)),
            PeerIp,
        ))
        .service(counting(Default::default()));
    let statuses: Vec<_> = futures_statuses(&shared, no_conn_info, 3).await;
    assert_eq!(statuses, [200, 200, 429]);

    // A client cannot spend the keyless quota by naming it as its key.
    let by_header = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            limiter(store.clone(), "nokey3", Quota::per_hour(1)),
            HeaderKey::new("x-api-key").unwrap(),
        ))
        .service(counting(Default::default()));
    for key in ["#unkeyed", "#", "#bin:00", "{nokey3:#}"] {
        let req = Request::get("/")
            .header("x-api-key", key)
            .body(Body::empty())
            .unwrap();
        assert_eq!(
            by_header.clone().oneshot(req).await.unwrap().status(),
            200,
            "{key}"
        );
    }
    let statuses: Vec<_> = futures_statuses(&by_header, no_conn_info, 2).await;
    assert_eq!(statuses, [200, 429]);

    let allow = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter(store, "nokey2", Quota::per_hour(2)), PeerIp)
                .on_missing_key(MissingKey::Allow),
        )
        .service(counting(Default::default()));
    let statuses: Vec<_> = futures_statuses(&allow, no_conn_info, 3).await;
    assert_eq!(statuses, [200, 200, 200]);
}

async fn futures_statuses<S>(svc: &S, req: impl Fn() -> Request<Body>, n: usize) -> Vec<u16>
where
    S: tower::Service<Request<Body>, Error = Infallible> + Clone,
    S::Response: HasStatus,
{
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(svc.clone().oneshot(req()).await.unwrap().status_code());
    }
    out
}

trait HasStatus {
    fn status_code(&self) -> u16;
}

impl<B> HasStatus for Response<B> {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}

#[tokio::test]
async fn api_key_header_extractor() {
    let redis = RedisServer::start();
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            limiter(redis.store().await, "apikey", Quota::per_hour(1)),
            HeaderKey::new("x-api-key").unwrap(),
        ))
        .service(counting(Default::default()));
    let with_key = |k: &'static [u8]| {
        Request::get("/")
            .header("x-api-key", http::HeaderValue::from_bytes(k).unwrap())
            .body(Body::empty())
            .unwrap()
    };
    let huge = Box::leak(vec![b'a'; 64 * 1024].into_boxed_slice());
    for key in [&b"k1"[..], &[0xff, 0x80][..], huge] {
        assert_eq!(
            svc.clone().oneshot(with_key(key)).await.unwrap().status(),
            200
        );
        assert_eq!(
            svc.clone().oneshot(with_key(key)).await.unwrap().status(),
            429
        );
    }
    // The 64 KiB key is stored under a short hash.
    let keys: Vec<String> = tower_redis_ratelimit::redis::cmd("KEYS")
        .arg("{apikey:*")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|k| k.len() < 64), "{keys:?}");
}

/// `.layer()` on an axum Router, served over a real loopback TCP connection.
#[tokio::test]
async fn axum_router_over_tcp() {
    let redis = RedisServer::start();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(
            limiter(redis.store().await, "axum", Quota::per_hour(2)),
            PeerIp,
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(raw_get(addr).await);
    }
    server.abort();
    assert!(statuses[0].starts_with("HTTP/1.1 200"), "{}", statuses[0]);
    assert!(statuses[0]
        .to_ascii_lowercase()
        .contains("ratelimit: \"default\";r=1;t=1800"));
    assert!(statuses[1].starts_with("HTTP/1.1 200"));
    assert!(statuses[2].starts_with("HTTP/1.1 429"), "{}", statuses[2]);
    assert!(statuses[2].to_ascii_lowercase().contains("retry-after: "));
}

/// A minimal HTTP/1.1 GET over loopback; returns the whole response text.
async fn raw_get(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    out
}

#[tokio::test]
async fn problem_details_and_partition_key() {
    let redis = RedisServer::start();
    let short = RateLimitLayer::new(
        limiter(redis.store().await, "pd-short", Quota::per_hour(1)),
        HeaderKey::new("x-api-key").unwrap(),
    )
    .partition_key("s3cret");
    assert_eq!(short.unwrap_err().field(), "partition_key");
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(
                limiter(redis.store().await, "pd", Quota::per_hour(1)),
                HeaderKey::new("x-api-key").unwrap(),
            )
            .problem_details()
            .partition_key("s3cret-of-16-bytes")
            .unwrap(),
        )
        .service(counting(Default::default()));
    let req = |k: &str| {
        Request::get("/")
            .header("x-api-key", k)
            .body(Body::empty())
            .unwrap()
    };
    let pk = |res: &Response<_>| {
        let v = header(res, "ratelimit").unwrap();
        let pk = v.split(";pk=").nth(1).unwrap().to_owned();
        assert!(header(res, "ratelimit-policy")
            .unwrap()
            .ends_with(&format!(";pk={pk}")));
        pk
    };
    let first = svc.clone().oneshot(req("alice")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let alice = pk(&first);
    assert!(
        alice.starts_with(':') && alice.ends_with(':') && alice.len() == 18,
        "{alice}"
    );
    assert!(!alice.contains("alice"));
    let bob = pk(&svc.clone().oneshot(req("bob")).await.unwrap());
    assert_ne!(alice, bob);

    let denied = svc.clone().oneshot(req("alice")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(pk(&denied), alice, "pk must be stable for a key");
    assert_eq!(
        header(&denied, "content-type"),
        Some("application/problem+json")
    );
    let body = body_text(denied).await;
    assert!(body.starts_with('{') && body.ends_with('}'), "{body}");
    for part in [
        r#""type":"https://iana.org/assignments/http-problem-types#quota-exceeded""#,
        r#""status":429"#,
        r#""violated-policies":["default"]"#,
    ] {
        assert!(body.contains(part), "{part} missing from {body}");
    }
}

/// Requests classified into tiers get their tier's quota and policy name; health checks
/// bypass the limiter.
#[tokio::test]
async fn tiers_and_bypass() {
    use tower_redis_ratelimit::rate_limit::Class;
    #[derive(Clone)]
    struct Plan(&'static str);

    let redis = RedisServer::start();
    let store = redis.store().await;
    let tier = |prefix: &str, n: u32| {
        RateLimiter::builder(store.clone(), Gcra::new(Quota::per_hour(n)).unwrap())
            .prefix(prefix)
            .policy_name(prefix)
            .build()
            .unwrap()
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let mut layer = RateLimitLayer::new(tier("free", 1), HeaderKey::new("x-api-key").unwrap());
    let paid = layer.add_policy(tier("paid", 3)).unwrap();
    let layer =
        layer.classify(
            move |parts| match (parts.uri.path(), parts.extensions.get::<Plan>()) {
                ("/health", _) => Class::Bypass,
                (_, Some(Plan("paid"))) => Class::Policy(paid),
                _ => Class::Default,
            },
        );
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(counting(calls.clone()));
    let req = |path: &str, key: &str, plan: Option<&'static str>| {
        let mut r = Request::get(path)
            .header("x-api-key", key)
            .body(Body::empty())
            .unwrap();
        if let Some(p) = plan {
            r.extensions_mut().insert(Plan(p));
        }
        r
    };
    let status = |res: &Response<_>| res.status().as_u16();

    // Free: 1 an hour, headers named "free".
    let res = svc.clone().oneshot(req("/", "k1", None)).await.unwrap();
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"free\";q=1;w=3600")
    );
    assert_eq!(
        status(&svc.clone().oneshot(req("/", "k1", None)).await.unwrap()),
        429
    );
    // Paid: 3 an hour for the same key, counted apart.
    for left in [2, 1, 0] {
        let res = svc
            .clone()
            .oneshot(req("/", "k1", Some("paid")))
            .await
            .unwrap();
        assert_eq!(
            header(&res, "ratelimit"),
            Some(format!("\"paid\";r={left};t={}", (3 - left) * 1200).as_str())
        );
    }
    assert_eq!(
        status(
            &svc.clone()
                .oneshot(req("/", "k1", Some("paid")))
                .await
                .unwrap()
        ),
        429
    );
    // Bypass: never limited, no headers.
    for _ in 0..3 {
        let res = svc
            .clone()
            .oneshot(req("/health", "k1", None))
            .await
            .unwrap();
        assert_eq!(status(&res), 200);
        assert_eq!(header(&res, "ratelimit"), None);
    }
    // An unknown plan: the default policy.
    let res = svc
        .clone()
        .oneshot(req("/", "k2", Some("gold")))
        .await
        .unwrap();
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"free\";q=1;w=3600")
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1 + 3 + 3 + 1);
}

/// Several limits on one key: each is its own header item; a denial names the violated limit
/// and `Retry-After` covers the longest wait.
#[tokio::test]
async fn multi_limit_headers_and_problem_details() {
    use tower_redis_ratelimit::algorithm::MultiLimit;
    let redis = RedisServer::start();
    let limits = MultiLimit::new([
        ("per-minute", Quota::per_minute(2)),
        ("per-hour", Quota::per_hour(3)),
    ])
    .unwrap();
    let l = RateLimiter::builder(redis.store().await, limits)
        .prefix("mlh")
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(l, GlobalKey).problem_details())
        .service(counting(Default::default()));
    let get = || Request::get("/").body(Body::empty()).unwrap();
    let all = |res: &Response<_>, name: &str| -> Vec<String> {
        res.headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };

    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(
        all(&res, "ratelimit-policy"),
        ["\"per-minute\";q=2;w=60", "\"per-hour\";q=3;w=3600"]
    );
    assert_eq!(
        all(&res, "ratelimit"),
        ["\"per-minute\";r=1;t=30", "\"per-hour\";r=2;t=1200"]
    );
    assert_eq!(svc.clone().oneshot(get()).await.unwrap().status(), 200);
    // The minute's two are spent: denied by it, with the hour untouched by the denial.
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(all(&res, "ratelimit")[0], "\"per-minute\";r=0;t=30");
    assert_eq!(all(&res, "ratelimit")[1], "\"per-hour\";r=1;t=2400");
    assert_eq!(header(&res, "retry-after"), Some("30"));
    let body = body_text(res).await;
    assert!(
        body.contains(r#""violated-policies":["per-minute"]"#),
        "{body}"
    );
}

/// Script calls Redis took in, run or refused (`INFO commandstats`: `calls`, and
/// `rejected_calls` for those refused before running).
fn script_calls_taken(redis: &RedisServer) -> u64 {
    let info: String = tower_redis_ratelimit::redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.conn())
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .flat_map(|l| l.split([':', ',']))
        .filter_map(|field| {
            let (name, n) = field.split_once('=')?;
            matches!(name, "calls" | "rejected_calls").then(|| n.parse::<u64>().unwrap())
        })
        .sum()
}

/// A store that refuses every check (Redis out of memory): under `FailurePolicy::Local` the
/// layer asks it once per request, then decides with its local share, marked degraded.
#[tokio::test]
async fn a_down_store_is_asked_once_then_the_local_share_decides() {
    use tower_redis_ratelimit::{redis, FailurePolicy};

    let redis = RedisServer::start();
    let store = redis.store().await;
    // The script is loaded (a first call of a lost script is sent twice: NOSCRIPT, then again).
    limiter(store.clone(), "warm", Quota::per_hour(4))
        .check("k", 1)
        .await
        .unwrap();
    let mut conn = redis.conn();
    for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut conn)
            .unwrap();
    }
    let limiter = RateLimiter::builder(store, Gcra::new(Quota::per_hour(4)).unwrap())
        .prefix("down")
        .store_timeout(Duration::from_secs(5))
        .on_store_error(FailurePolicy::Local)
        .local_share(2)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter.clone(), GlobalKey))
        .service(counting(calls.clone()));
    let before = script_calls_taken(&redis);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let res = svc
            .clone()
            .oneshot(Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    // A share of 4 / 2 instances: 2 allowed, then denied, all decided locally.
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert_eq!(
        script_calls_taken(&redis) - before,
        4,
        "the store was asked more or less than once per request"
    );
    assert_eq!(limiter.stats().degraded, 4);
    assert_eq!(limiter.stats().store_errors, 4);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// An inner service that must be driven to readiness before each call, and counts its clones
/// (like a `tower::buffer::Buffer` or a connection-limited client).
struct Strict {
    ready: bool,
    clones: Arc<AtomicUsize>,
}

impl Clone for Strict {
    fn clone(&self) -> Self {
        self.clones.fetch_add(1, Ordering::Relaxed);
        Self {
            ready: false,
            clones: self.clones.clone(),
        }
    }
}

impl tower::Service<Request<()>> for Strict {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        self.ready = true;
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        assert!(self.ready, "called without poll_ready");
        self.ready = false;
        std::future::ready(Ok(Response::new(String::new())))
    }
}

/// The inner service called is the one driven to readiness, whether the decision is made in
/// `call` (in memory) or comes later (Redis); a decision made in `call` clones no service.
#[tokio::test]
async fn the_ready_inner_service_is_called_and_cloned_only_to_wait() {
    use tower::Service;
    let redis = RedisServer::start();
    let memory = RateLimiter::new(
        tower_redis_ratelimit::MemoryStore::new(),
        Gcra::new(Quota::per_minute(3)).unwrap(),
    )
    .unwrap();
    let remote = limiter(redis.store().await, "strict", Quota::per_minute(3));
    // Redis decides the first four; the deny cache answers the fifth in `call`.
    for (store, limiter, expected_clones) in [("memory", memory, 0), ("redis", remote, 4)] {
        let clones = Arc::new(AtomicUsize::new(0));
        let mut svc = ServiceBuilder::new()
            .layer(RateLimitLayer::new(limiter, GlobalKey))
            .service(Strict {
                ready: false,
                clones: clones.clone(),
            });
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let res = svc
                .ready()
                .await
                .unwrap()
                .call(Request::new(()))
                .await
                .unwrap();
            statuses.push(res.status().as_u16());
        }
        assert_eq!(statuses, [200, 200, 200, 429, 429], "{store}");
        assert_eq!(clones.load(Ordering::Relaxed), expected_clones, "{store}");
    }
}
