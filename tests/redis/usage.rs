//! Usage settled after the response, through the layer: an axum app on 127.0.0.1 behind a
//! `RateLimitLayer` that admits each request on an estimate and settles it to the figure of
//! the app's response header (`settle_from_header`) or of the handler's `Usage` handle
//! (`settle_from_handle`), asked over HTTP, each test against a real Redis and in memory.
//! The key's next request sees the settlement; a debt is refused with a `Retry-After`
//! covering it; hostile figures keep the estimate, never crash, and are logged once.

use std::{
    convert::Infallible,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use crate::servers::RedisServer;
use axum::{
    body::Body,
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode, Uri},
    response::{IntoResponse, Response},
    routing::get,
    Extension, Router,
};
use bytes::Bytes;
use http::Request;
use http_body::Frame;
use http_body_util::BodyExt;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use tokio::sync::{mpsc, Barrier, Notify};
use tower_redis_ratelimit::{
    algorithm::Algorithm,
    rate_limit::{Settled, Usage},
    store::Store,
    Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter,
};

/// The header the app writes its usage figure in.
const USAGE: &str = "x-usage";

static PREFIX: AtomicU64 = AtomicU64::new(0);

type Limiter = RateLimiter<Arc<dyn Algorithm>>;

/// A limiter of `algorithm` on `store` under a fresh prefix.
fn limiter(store: Arc<dyn Store>, algorithm: Arc<dyn Algorithm>) -> Limiter {
    let prefix = format!("usage{}", PREFIX.fetch_add(1, Ordering::Relaxed));
    RateLimiter::builder(store, algorithm)
        .prefix(&prefix)
        .store_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Redis, then memory: the stores each test runs on.
async fn stores(redis: &RedisServer) -> [(&'static str, Arc<dyn Store>); 2] {
    [
        ("redis", Arc::new(redis.store().await)),
        ("memory", Arc::new(MemoryStore::new())),
    ]
}

/// What the app's handlers share with the test.
#[derive(Clone, Default)]
struct Shared {
    /// Released by the test when a streamed answer may settle and end.
    go: Arc<Notify>,
    /// Held by the burst's requests until all of them are in the handler.
    barrier: Option<Arc<Barrier>>,
    /// What the handles' settlements answered.
    settled: Arc<Mutex<Vec<Settled>>>,
}

/// The figure a handle settles to: `?used=N`.
fn used(uri: &Uri) -> Option<u64> {
    uri.query()?.strip_prefix("used=")?.parse().ok()
}

/// `GET /answer`: `200`, with the usage header holding the request's `x-give` value when it
/// has one (any bytes, hostile ones included), after the burst's barrier when there is one;
/// with `x-status`, that status.
async fn answer(State(shared): State<Shared>, headers: HeaderMap) -> Response {
    if let Some(barrier) = &shared.barrier {
        barrier.wait().await;
    }
    let status = headers
        .get("x-status")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .map_or(StatusCode::OK, |s| StatusCode::from_u16(s).unwrap());
    let mut res = (status, "answered").into_response();
    if let Some(given) = headers.get("x-give") {
        res.headers_mut().insert(USAGE, given.clone());
    }
    res
}

/// `GET /handle?used=N`: settles with the handle before answering, then answers with the
/// header of `x-give` too (the handle came first); without `used`, drops the handle.
async fn handle(
    State(shared): State<Shared>,
    Extension(usage): Extension<Usage>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(used) = used(&uri) {
        for _ in 0..2 {
            let settled = usage.settle(used).await.unwrap();
            shared.settled.lock().unwrap().push(settled);
        }
    } else {
        drop(usage);
    }
    answer(State(Shared::default()), headers).await
}

/// A body fed frame by frame from a channel.
struct Channel(mpsc::Receiver<Bytes>);

impl http_body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|c| c.map(|d| Ok(Frame::data(d))))
    }
}

/// `GET /stream?used=N`: starts the answer at once with a first chunk; once the test says
/// so (it has the head and that chunk), settles with the handle, then sends the last chunk
/// and ends.
async fn stream(
    State(shared): State<Shared>,
    Extension(usage): Extension<Usage>,
    uri: Uri,
) -> Response {
    let used = used(&uri).unwrap();
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        tx.send(Bytes::from_static(b"first ")).await.unwrap();
        shared.go.notified().await;
        let settled = usage.settle(used).await.unwrap();
        shared.settled.lock().unwrap().push(settled);
        tx.send(Bytes::from_static(b"last")).await.unwrap();
    });
    Response::new(Body::new(Channel(rx)))
}

/// A body of one chunk, then trailers with the usage figure.
struct Trailed(Option<Frame<Bytes>>, Option<&'static str>);

impl http_body::Body for Trailed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.0.take() {
            return Poll::Ready(Some(Ok(data)));
        }
        let trailers = self.1.take().map(|figure| {
            let mut trailers = HeaderMap::new();
            trailers.insert(USAGE, HeaderValue::from_static(figure));
            Ok(Frame::trailers(trailers))
        });
        Poll::Ready(trailers)
    }
}

/// `GET /trailer`: a streamed answer whose usage comes in its trailers, the figure of the
/// request's `x-give` (one of a few).
async fn trailer(headers: HeaderMap) -> Response {
    let figure = match headers.get("x-give").map(HeaderValue::as_bytes) {
        Some(b"600") => "600",
        Some(b"-500") => "-500",
        _ => "abc",
    };
    let first = Frame::data(Bytes::from_static(b"streamed"));
    let mut res = Response::new(Body::new(Trailed(Some(first), Some(figure))));
    res.headers_mut()
        .insert("trailer", HeaderValue::from_static(USAGE));
    res
}

/// The app on 127.0.0.1 behind `layer`; its address.
async fn serve<A: Algorithm>(
    layer: RateLimitLayer<HeaderKey, A>,
    shared: Shared,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let app = Router::new()
        .route("/answer", get(answer))
        .route("/handle", get(handle))
        .route("/stream", get(stream))
        .route("/trailer", get(trailer))
        .with_state(shared)
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, server)
}

/// A client of the app, as key `key`.
struct Caller {
    client: Client<HttpConnector, Body>,
    addr: SocketAddr,
}

impl Caller {
    fn new(addr: SocketAddr) -> Self {
        let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        Self { client, addr }
    }

    /// `GET path` as `key`, with these request headers.
    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut req = Request::get(format!("http://{}{path}", self.addr)).header("x-api-key", "k");
        for (name, value) in headers {
            req = req.header(*name, HeaderValue::from_str(value).unwrap());
        }
        let req = req.body(Body::empty()).unwrap();
        tokio::time::timeout(Duration::from_secs(20), self.client.request(req))
            .await
            .expect("the app answers")
            .unwrap()
            .map(Body::new)
    }

    /// `GET /answer` settling to `give` (raw), read whole: its status.
    async fn answer(&self, give: Option<&str>) -> StatusCode {
        let headers: Vec<_> = give.map(|g| ("x-give", g)).into_iter().collect();
        let res = self.get("/answer", &headers).await;
        let status = res.status();
        res.into_body().collect().await.unwrap();
        status
    }
}

/// A layer over `limiter` charging each request `estimate` units, settled from the usage
/// header, the handle and the usage trailer.
fn layer(limiter: Limiter, estimate: u32) -> RateLimitLayer<HeaderKey, Arc<dyn Algorithm>> {
    RateLimitLayer::new(limiter, HeaderKey::new("x-api-key").unwrap())
        .cost(move |_| estimate)
        .settle_from_header(http::HeaderName::from_static(USAGE))
        .unwrap()
        .settle_from_handle()
        .unwrap()
        .settle_from_trailer(http::HeaderName::from_static(USAGE))
        .unwrap()
}

fn gcra(quota: Quota) -> Arc<dyn Algorithm> {
    Arc::new(Gcra::new(quota).unwrap())
}

#[tokio::test]
async fn ten_answers_settling_100_units_exhaust_a_1000_unit_budget_admitted_at_10() {
    let redis = RedisServer::start();
    for (store_name, store) in stores(&redis).await {
        for (name, algorithm) in crate::common::each_algorithm(Quota::per_day(1_000)) {
            let label = format!("{name} on {store_name}");
            let limiter = limiter(Arc::clone(&store), algorithm);
            let (addr, server) = serve(layer(limiter.clone(), 10), Shared::default()).await;
            let caller = Caller::new(addr);
            for i in 0..10 {
                let status = caller.answer(Some("100")).await;
                assert_eq!(status, StatusCode::OK, "{label}: answer {i} refused");
            }
            // Admitted at 10 each, 100 would be spent; settled at 100 each, all 1,000 are.
            assert_eq!(limiter.peek("k").await.unwrap().remaining, 0, "{label}");
            let status = caller.answer(None).await;
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{label}");
            server.abort();
        }
    }
}

#[tokio::test]
async fn a_hundred_answers_settling_1_unit_pass_a_budget_their_estimates_would_exhaust() {
    let redis = RedisServer::start();
    for (store_name, store) in stores(&redis).await {
        for (name, algorithm) in crate::common::each_algorithm(Quota::per_day(1_000)) {
            let label = format!("{name} on {store_name}");
            let limiter = limiter(Arc::clone(&store), algorithm);
            let (addr, server) = serve(layer(limiter.clone(), 50), Shared::default()).await;
            let caller = Caller::new(addr);
            // Estimates of 50 would exhaust 1,000 units after 20 answers.
            for i in 0..100 {
                let status = caller.answer(Some("1")).await;
                assert_eq!(status, StatusCode::OK, "{label}: answer {i} refused");
            }
            let left = limiter.peek("k").await.unwrap().remaining;
            assert_eq!(left, 900, "{label}: 100 units spent of 1,000");
            server.abort();
        }
    }
}

#[tokio::test]
async fn a_burst_settled_past_the_limit_leaves_the_key_refused_with_a_retry_after_covering_the_debt(
) {
    let redis = RedisServer::start();
    for (store_name, store) in stores(&redis).await {
        // 100 units a minute (one each 0.6 s); ten requests at once, each admitted at 10.
        let limiter = limiter(store, gcra(Quota::per_minute(100)));
        let shared = Shared {
            barrier: Some(Arc::new(Barrier::new(10))),
            ..Shared::default()
        };
        let (addr, server) = serve(layer(limiter.clone(), 10), shared).await;
        let caller = Arc::new(Caller::new(addr));
        // All ten are admitted (the barrier holds each until all are in the app), then each
        // answer settles to 50: 500 units spent of a 100-unit budget.
        let burst: Vec<_> = (0..10)
            .map(|_| {
                let caller = Arc::clone(&caller);
                tokio::spawn(async move { caller.answer(Some("50")).await })
            })
            .collect();
        for request in burst {
            assert_eq!(request.await.unwrap(), StatusCode::OK, "{store_name}");
        }
        // The debt is 400 units past the limit: 240 s before 10 more fit (246 s exactly).
        let res = caller.get("/answer", &[]).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{store_name}");
        let retry_after: u64 = res.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (240..=247).contains(&retry_after),
            "{store_name}: Retry-After {retry_after} s does not cover the debt"
        );
        server.abort();
    }
}

/// What `tracing` writes, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines_with(&self, text: &str) -> usize {
        let out = self.0.lock().unwrap();
        String::from_utf8_lossy(&out)
            .lines()
            .filter(|l| l.contains(text))
            .count()
    }
}

#[tokio::test]
async fn hostile_usage_figures_keep_the_estimate_never_crash_and_are_logged_once() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // This test's runtime has one thread: the app, the client and the store run on it.
    let _guard = tracing::subscriber::set_default(subscriber);
    let redis = RedisServer::start();
    let hostile = [
        "-500",
        "abc",
        "1e9",
        "12345678901234567890",
        "",
        "4294967296",
        "1.5",
        "+7",
    ];
    for (store_name, store) in stores(&redis).await {
        let before = captured.lines_with("does not read");
        let started = Instant::now();
        let limiter = limiter(store, gcra(Quota::per_day(1_000)));
        let (addr, server) = serve(layer(limiter.clone(), 10), Shared::default()).await;
        let caller = Caller::new(addr);
        for _ in 0..3 {
            for value in hostile {
                let res = caller.get("/answer", &[("x-give", value)]).await;
                assert_eq!(res.status(), StatusCode::OK, "{store_name}: {value:?}");
                // The header stays on the response.
                assert_eq!(res.headers()[USAGE], value, "{store_name}");
                res.into_body().collect().await.unwrap();
            }
        }
        let answers = 3 * hostile.len() as u64;
        // Each kept its estimate of 10 (a day's quota: no unit comes back in the test's time).
        let left = limiter.peek("k").await.unwrap().remaining;
        assert_eq!(left, 1_000 - 10 * answers, "{store_name}");
        // One line for them all, not one per answer (one more a second at most).
        let lines = captured.lines_with("does not read") - before;
        let most = 1 + started.elapsed().as_secs() as usize;
        assert!(
            (1..=most).contains(&lines),
            "{store_name}: {lines} lines for {answers} unreadable figures"
        );
        // The layer still settles a figure that reads.
        assert_eq!(caller.answer(Some("400")).await, StatusCode::OK);
        let left_after = limiter.peek("k").await.unwrap().remaining;
        assert_eq!(left_after, left - 400, "{store_name}");
        server.abort();
    }
}

#[tokio::test]
async fn the_handle_settles_after_the_response_has_started_streaming() {
    let redis = RedisServer::start();
    for (store_name, store) in stores(&redis).await {
        let limiter = limiter(store, gcra(Quota::per_day(1_000)));
        let shared = Shared::default();
        let (addr, server) = serve(layer(limiter.clone(), 10), shared.clone()).await;
        let caller = Caller::new(addr);
        let res = caller.get("/stream?used=700", &[]).await;
        assert_eq!(res.status(), StatusCode::OK, "{store_name}");
        let mut body = res.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"first ");
        // The response has started: the charge is still the estimate.
        assert_eq!(
            limiter.peek("k").await.unwrap().remaining,
            990,
            "{store_name}"
        );
        shared.go.notify_one();
        let rest = body.collect().await.unwrap().to_bytes();
        assert_eq!(&rest[..], b"last");
        // Settled mid-stream, before the last chunk: the next request sees the 700.
        let settled = shared.settled.lock().unwrap().clone();
        assert_eq!(settled, [Settled::Charged { units: 690 }], "{store_name}");
        assert_eq!(
            limiter.peek("k").await.unwrap().remaining,
            300,
            "{store_name}"
        );
        assert_eq!(caller.answer(None).await, StatusCode::OK);
        assert_eq!(
            limiter.peek("k").await.unwrap().remaining,
            290,
            "{store_name}"
        );
        server.abort();
    }
}

#[tokio::test]
async fn a_dropped_handle_keeps_the_first_charge_and_a_handle_settles_once_and_first() {
    let redis = RedisServer::start();
    for (store_name, store) in stores(&redis).await {
        let limiter = limiter(store, gcra(Quota::per_day(1_000)));
        let shared = Shared::default();
        let (addr, server) = serve(layer(limiter.clone(), 10), shared.clone()).await;
        let caller = Caller::new(addr);
        // Dropped without settling: the estimate stands.
        let res = caller.get("/handle", &[]).await;
        assert_eq!(res.status(), StatusCode::OK);
        res.into_body().collect().await.unwrap();
        assert_eq!(
            limiter.peek("k").await.unwrap().remaining,
            990,
            "{store_name}"
        );
        // Settled by the handle to 100 (its second settlement does nothing), then the
        // response's header says 5: the handle came first, the header settles nothing.
        let res = caller.get("/handle?used=100", &[("x-give", "5")]).await;
        assert_eq!(res.status(), StatusCode::OK);
        res.into_body().collect().await.unwrap();
        let settled = shared.settled.lock().unwrap().clone();
        assert_eq!(
            settled,
            [Settled::Charged { units: 90 }, Settled::NoCharge],
            "{store_name}"
        );
        assert_eq!(
            limiter.peek("k").await.unwrap().remaining,
            890,
            "{store_name}"
        );
        server.abort();
    }
}

#[tokio::test]
async fn counting_by_status_gives_an_uncounted_charge_back_and_settles_a_counted_one() {
    let redis = RedisServer::start();
    for (store_name, store) in stores(&redis).await {
        let limiter = limiter(store, gcra(Quota::per_day(1_000)));
        let layer = layer(limiter.clone(), 10)
            .count_if(|status, _| status.is_success())
            .unwrap();
        let (addr, server) = serve(layer, Shared::default()).await;
        let caller = Caller::new(addr);
        // A 503 does not count: its whole charge comes back, whatever its header says.
        let res = caller
            .get("/answer", &[("x-give", "300"), ("x-status", "503")])
            .await;
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        res.into_body().collect().await.unwrap();
        assert_eq!(
            limiter.peek("k").await.unwrap().remaining,
            1_000,
            "{store_name}"
        );
        // A 200 counts, and is settled to its figure.
        assert_eq!(caller.answer(Some("300")).await, StatusCode::OK);
        assert_eq!(
            limiter.peek("k").await.unwrap().remaining,
            700,
            "{store_name}"
        );
        server.abort();
    }
}

#[tokio::test]
async fn a_store_failing_while_settling_still_returns_the_response_and_the_charge_stands() {
    let server = RedisServer::start();
    let store = server.store().await;
    let redis = Arc::new(Mutex::new(server));
    let limiter = limiter(Arc::new(store), gcra(Quota::per_day(1_000)));
    let layer = layer(limiter.clone(), 10);
    // The handler kills the Redis the check was just made on, then answers with a figure.
    let killed = Arc::clone(&redis);
    let app = Router::new()
        .route(
            "/answer",
            get(move || {
                let killed = Arc::clone(&killed);
                async move {
                    killed.lock().unwrap().kill();
                    ([(USAGE, "500")], "answered")
                }
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let res = Caller::new(addr).get("/answer", &[]).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()[USAGE], "500");
    // The settlement failed: the response's field shows the estimate standing (settled, it
    // would show 500 left).
    let field = res.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert!(field.contains(";r=990;"), "{field}");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"answered");
    server.abort();
}

#[tokio::test]
async fn a_streamed_body_is_settled_by_its_trailer_before_it_ends() {
    let redis = RedisServer::start();
    for (store_name, store) in stores(&redis).await {
        let limiter = limiter(store, gcra(Quota::per_day(1_000)));
        let (addr, server) = serve(layer(limiter.clone(), 10), Shared::default()).await;
        let caller = Caller::new(addr);
        // Trailers that do not read keep the estimate.
        for hostile in ["abc", "-500"] {
            let res = caller.get("/trailer", &[("x-give", hostile)]).await;
            res.into_body().collect().await.unwrap();
        }
        assert_eq!(
            limiter.peek("k").await.unwrap().remaining,
            980,
            "{store_name}"
        );
        // Asked with `TE: trailers`, the client gets them; the body's end comes after the
        // settlement.
        let res = caller
            .get("/trailer", &[("x-give", "600"), ("te", "trailers")])
            .await;
        assert_eq!(res.status(), StatusCode::OK);
        let body = res.into_body().collect().await.unwrap();
        assert_eq!(
            body.trailers().map(|t| &t[USAGE]),
            Some(&HeaderValue::from_static("600"))
        );
        assert_eq!(&body.to_bytes()[..], b"streamed");
        assert_eq!(
            limiter.peek("k").await.unwrap().remaining,
            380,
            "{store_name}"
        );
        assert_eq!(caller.answer(None).await, StatusCode::OK);
        assert_eq!(
            limiter.peek("k").await.unwrap().remaining,
            370,
            "{store_name}"
        );
        server.abort();
    }
}
