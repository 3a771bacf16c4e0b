//! Budgets: requests per minute and tokens per minute on one key, decided together
//! (`MultiLimit::budgets`), against a real Redis and in memory. A request costs the requests
//! budget one unit and the tokens budget its estimate; it is admitted only when both have
//! room, and a request refused by either spends neither. A settlement moves the tokens alone:
//! below the estimate at most what the charge still holds comes back, above it the excess is
//! a debt the next request waits out while the requests budget still has room. A property
//! test checks that random checks, settlements and refunds get the same answers from Redis as
//! from the in-memory twin; an axum model proxy settles each answer from its usage header.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::servers::RedisServer;
use axum::{
    body::Body,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Extension, Router,
};
use http::{HeaderName, Request};
use http_body_util::BodyExt;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use proptest::{prelude::*, test_runner::TestRunner};
use tower_redis_ratelimit::{
    algorithm::{Algorithm, LimitCost, MultiLimit},
    rate_limit::{Decision, Settled, Usage},
    store::{memory::ManualClock, Store},
    Error, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter, RedisStore,
};

const T0: u64 = 1_700_000_000_000_000;

/// How much slower than real time the simulated time of the tests at explicit times runs:
/// every quota's period and every time step is this many times a brisk test's (a second
/// becomes an hour), so a key's state holds for minutes to hours of real time, far longer
/// than the test runs. Redis expires keys on its own clock, not on the explicit times (see
/// `RateLimiter::check_at`): with the brisk quotas, a charge of 100 tokens of 1,000 a minute
/// lived 6 s (one token of 100 a minute in the property test, 600 ms), and a machine under
/// load that stalled that long between two calls made the later one find the key rested.
/// The decisions are the brisk test's; every time and wait asserted is the brisk one times
/// `SLOW`. The proxy over HTTP, on the real clock, keeps the brisk quotas.
const SLOW: u32 = 3_600;

/// A brisk millisecond of simulated time, in microseconds (see [`SLOW`]).
const MS: u64 = 1_000 * SLOW as u64;
/// A brisk second of simulated time, in microseconds (see [`SLOW`]).
const SECOND: u64 = 1_000 * MS;

/// [`SLOW`] for the property test: a brisk second becomes 10 minutes, so its shortest state
/// (one token of 100 a minute, 600 ms brisk) holds for 6 minutes. Not more: a debt of
/// `u32::MAX` tokens runs a key's time 101 bursts on (100 full quotas, see `Settled`), which
/// times 3,600 would come within two years of the largest time a store takes (2^52 µs).
const PROPERTY_SLOW: u64 = 600;

/// `n` brisk seconds (see [`SLOW`]).
fn secs(n: u64) -> Duration {
    Duration::from_secs(n) * SLOW
}

type Limiter = RateLimiter<Arc<dyn Algorithm>>;

static CASE_ID: AtomicU64 = AtomicU64::new(0);

/// 3 requests and 1,000 tokens a minute: a request every 20 s, a token every 60 ms.
fn model_budgets() -> Arc<dyn Algorithm> {
    budgets_per(Duration::from_secs(60))
}

/// [`model_budgets`] in brisk minutes, for the tests at explicit times (see [`SLOW`]).
fn slow_model_budgets() -> Arc<dyn Algorithm> {
    budgets_per(Duration::from_secs(60) * SLOW)
}

/// 3 requests and 1,000 tokens per `minute`.
fn budgets_per(minute: Duration) -> Arc<dyn Algorithm> {
    Arc::new(
        MultiLimit::budgets([
            ("requests", Quota::new(3, minute), LimitCost::Fixed(1)),
            ("tokens", Quota::new(1_000, minute), LimitCost::Request),
        ])
        .unwrap(),
    )
}

/// The same algorithm on `store` under a fresh prefix.
fn limiter_on(store: Arc<dyn Store>, algorithm: &Arc<dyn Algorithm>) -> Limiter {
    let prefix = format!("budgets{}", CASE_ID.fetch_add(1, Ordering::Relaxed));
    RateLimiter::builder(store, Arc::clone(algorithm))
        .prefix(&prefix)
        .store_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// The same algorithm on Redis and in memory, each under a fresh prefix.
fn limiters(redis: &RedisStore, algorithm: &Arc<dyn Algorithm>) -> [(&'static str, Limiter); 2] {
    [
        ("redis", limiter_on(Arc::new(redis.clone()), algorithm)),
        (
            "memory",
            limiter_on(Arc::new(MemoryStore::new()), algorithm),
        ),
    ]
}

/// The requests and tokens `key` has left at `now`, read by a check no budget can admit (its
/// estimate is past the tokens' burst), which spends nothing.
async fn left(limiter: &Limiter, key: &str, now: u64) -> (u64, u64) {
    let d = limiter.check_at(key, 1_001, now).await.unwrap();
    assert!(!d.allowed, "a check past the burst is refused");
    (d.limits[0].remaining, d.limits[1].remaining)
}

#[tokio::test]
async fn a_request_refused_by_the_requests_budget_spends_no_tokens() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (name, l) in limiters(&store, &slow_model_budgets()) {
        for _ in 0..3 {
            assert!(l.check_at("k", 100, T0).await.unwrap().allowed, "{name}");
        }
        let d = l.check_at("k", 100, T0).await.unwrap();
        assert!(!d.allowed, "{name}: a fourth request in the minute");
        assert_eq!(d.retry_after, Some(secs(20)), "{name}");
        assert_eq!(&*d.binding().unwrap().name, "requests", "{name}");
        assert_eq!(left(&l, "k", T0).await, (0, 700), "{name}: no tokens spent");
    }
}

#[tokio::test]
async fn a_request_refused_by_the_tokens_budget_spends_no_request() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (name, l) in limiters(&store, &slow_model_budgets()) {
        assert!(l.check_at("k", 600, T0).await.unwrap().allowed, "{name}");
        let d = l.check_at("k", 500, T0).await.unwrap();
        assert!(!d.allowed, "{name}: 500 tokens of 400 left");
        // 100 more tokens come in 6 s.
        assert_eq!(d.retry_after, Some(secs(6)), "{name}");
        assert_eq!(&*d.binding().unwrap().name, "tokens", "{name}");
        assert_eq!(
            left(&l, "k", T0).await,
            (2, 400),
            "{name}: no request spent"
        );
        assert!(l.check_at("k", 500, T0 + 6 * SECOND).await.unwrap().allowed);
    }
}

#[tokio::test]
async fn an_admitted_request_takes_one_request_and_its_estimate_in_tokens() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (name, l) in limiters(&store, &slow_model_budgets()) {
        let d = l.check_at("k", 100, T0).await.unwrap();
        assert!(d.allowed, "{name}");
        assert_eq!(d.charge().unwrap().cost(), 100, "{name}");
        let left_now: Vec<_> = d.limits.iter().map(|p| p.remaining).collect();
        assert_eq!(left_now, [2, 900], "{name}");
        let d = l.check_at("k", 250, T0).await.unwrap();
        let left_now: Vec<_> = d.limits.iter().map(|p| p.remaining).collect();
        assert_eq!(left_now, [1, 650], "{name}");
        assert_eq!(
            left(&l, "other", T0).await,
            (3, 1_000),
            "{name}: keys apart"
        );
    }
}

#[tokio::test]
async fn a_settlement_moves_the_tokens_alone() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (name, l) in limiters(&store, &slow_model_budgets()) {
        // Down: admitted on 300, used 100: 200 tokens back, the request stays spent.
        let mut d = l.check_at("k", 300, T0).await.unwrap();
        let settled = l.settle_at("k", &mut d, 100, T0).await.unwrap();
        let back = Settled::GaveBack {
            units: 200,
            given: true,
        };
        assert_eq!(settled, back, "{name}");
        assert_eq!(left(&l, "k", T0).await, (2, 900), "{name}");
        // Up: admitted on 300, used 800: 500 more tokens, still one request.
        let mut d = l.check_at("k", 300, T0).await.unwrap();
        let settled = l.settle_at("k", &mut d, 800, T0).await.unwrap();
        assert_eq!(settled, Settled::Charged { units: 500 }, "{name}");
        assert_eq!(left(&l, "k", T0).await, (1, 100), "{name}");
        // As charged: nothing moves.
        let mut d = l.check_at("k", 50, T0).await.unwrap();
        let settled = l.settle_at("k", &mut d, 50, T0).await.unwrap();
        assert_eq!(settled, Settled::AsCharged, "{name}");
        assert_eq!(left(&l, "k", T0).await, (0, 50), "{name}");
    }
}

#[tokio::test]
async fn settling_down_gives_back_at_most_what_the_tokens_charge_still_holds() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (name, l) in limiters(&store, &slow_model_budgets()) {
        // Two charges of 300 at T0 lie on the tokens' time at [0, 18 s] and [18 s, 36 s].
        let mut first = l.check_at("k", 300, T0).await.unwrap();
        assert!(l.check_at("k", 300, T0).await.unwrap().allowed, "{name}");
        // 12 s later the first holds its last 6 s (100 tokens) only: 100 back, not 300.
        let settled = l.settle_at("k", &mut first, 0, T0 + 12 * SECOND).await;
        let back = Settled::GaveBack {
            units: 300,
            given: true,
        };
        assert_eq!(settled.unwrap(), back, "{name}");
        // Tokens: the time at 30 s, 700 left at 12 s; requests: 1 (the second comes at 20 s).
        assert_eq!(left(&l, "k", T0 + 12 * SECOND).await, (1, 700), "{name}");
    }
}

#[tokio::test]
async fn a_tokens_debt_makes_the_next_request_wait_while_requests_have_room() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (name, l) in limiters(&store, &slow_model_budgets()) {
        let mut d = l.check_at("k", 100, T0).await.unwrap();
        let settled = l.settle_at("k", &mut d, 1_500, T0).await.unwrap();
        assert_eq!(settled, Settled::Charged { units: 1_400 }, "{name}");
        // The tokens' time is 90 s on: a token of the next request fits at 30.06 s.
        let d = l.check_at("k", 1, T0).await.unwrap();
        assert!(!d.allowed, "{name}: in debt");
        assert_eq!(
            d.retry_after,
            Some(Duration::from_micros(30_060 * MS)),
            "{name}"
        );
        assert_eq!(&*d.binding().unwrap().name, "tokens", "{name}");
        assert_eq!(d.limits[0].remaining, 2, "{name}: the requests have room");
        assert_eq!(d.limits[0].retry_after, Some(Duration::ZERO), "{name}");
        let before = l.check_at("k", 1, T0 + 30_059 * MS).await.unwrap();
        assert!(!before.allowed, "{name}");
        let paid = l.check_at("k", 1, T0 + 30_060 * MS).await.unwrap();
        assert!(paid.allowed, "{name}: the debt is paid back");
        assert_eq!(
            paid.limits[0].remaining, 2,
            "{name}: one request came back at 20 s"
        );
    }
}

#[tokio::test]
async fn a_refund_gives_each_budget_its_own_cost_back() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (name, l) in limiters(&store, &slow_model_budgets()) {
        let mut d = l.check_at("k", 400, T0).await.unwrap();
        assert_eq!(left(&l, "k", T0).await, (2, 600), "{name}");
        assert!(l.refund_at("k", &mut d, T0).await.unwrap(), "{name}");
        assert_eq!(left(&l, "k", T0).await, (3, 1_000), "{name}");
    }
}

#[tokio::test]
async fn budgets_are_checked_when_built_and_multi_limits_still_do_not_settle() {
    let q = Quota::per_minute(3);
    for bad in [LimitCost::Fixed(0), LimitCost::Fixed(4)] {
        let e = MultiLimit::budgets([("requests", q, bad)]).unwrap_err();
        assert_eq!(e.field(), "limits.cost", "{bad:?}");
    }
    let redis = RedisServer::start();
    let store = redis.store().await;
    let plain: Arc<dyn Algorithm> =
        Arc::new(MultiLimit::new([("a", q), ("b", Quota::per_hour(100))]).unwrap());
    for (name, l) in limiters(&store, &plain) {
        let mut d = l.check_at("k", 1, T0).await.unwrap();
        let settled = l.settle_at("k", &mut d, 2, T0).await;
        assert!(matches!(settled, Err(Error::Unsupported(_))), "{name}");
    }
}

// ---------------------------------------------------------------------------------------
// Property test: Redis and the twin agree on random checks, settlements and refunds.

#[derive(Debug, Clone)]
enum Op {
    Check(u32),
    Settle(usize, u64),
    Refund(usize),
}

#[derive(Debug, Clone)]
struct Case {
    requests: u32,
    fixed: u32,
    tokens: u32,
    burst: u32,
    period_s: u64,
    steps: Vec<(u64, Op)>,
}

fn cases() -> impl Strategy<Value = Case> {
    // Limits that divide the periods' microseconds (see `settlements.rs`).
    (
        prop::sample::select(vec![2u32, 3, 4, 5, 8]),
        1u32..3,
        prop::sample::select(vec![10u32, 20, 40, 50, 100]),
        1u32..120,
        // Brisk minutes and ten minutes (see [`PROPERTY_SLOW`]).
        prop::sample::select(vec![60 * PROPERTY_SLOW, 600 * PROPERTY_SLOW]),
    )
        .prop_flat_map(|(requests, fixed, tokens, burst, period_s)| {
            let interval = period_s * 1_000_000 / u64::from(requests);
            let step = prop_oneof![
                3 => Just(0u64),
                5 => 0..interval,
                2 => 0..3 * interval,
                1 => Just(period_s * 1_000_000),
            ];
            let max_cost = tokens.max(burst) + 1;
            let figure = prop_oneof![
                6 => 0..=u64::from(3 * max_cost),
                1 => Just(u64::from(u32::MAX)),
                1 => Just(u64::MAX),
            ];
            let op = prop_oneof![
                4 => (1..=max_cost).prop_map(Op::Check),
                3 => (any::<usize>(), figure).prop_map(|(i, f)| Op::Settle(i, f)),
                1 => any::<usize>().prop_map(Op::Refund),
            ];
            prop::collection::vec((step, op), 1..50).prop_map(move |steps| Case {
                requests,
                fixed,
                tokens,
                burst,
                period_s,
                steps,
            })
        })
}

fn budgets_of(case: &Case) -> Arc<dyn Algorithm> {
    let period = Duration::from_secs(case.period_s);
    Arc::new(
        MultiLimit::budgets([
            (
                "requests",
                Quota::new(case.requests, period).burst(case.requests.max(case.fixed)),
                LimitCost::Fixed(case.fixed),
            ),
            (
                "tokens",
                Quota::new(case.tokens, period).burst(case.burst),
                LimitCost::Request,
            ),
        ])
        .unwrap(),
    )
}

async fn interleaved_agree(redis: &RedisStore, case: &Case) {
    let [(_, on_redis), (_, in_memory)] = limiters(redis, &budgets_of(case));
    let mut allowed: Vec<(Decision, Decision)> = Vec::new();
    let mut now = T0;
    for (i, (step, op)) in case.steps.iter().enumerate() {
        now += step;
        match op {
            Op::Check(cost) => {
                let r = on_redis.check_at("k", *cost, now).await.unwrap();
                let m = in_memory.check_at("k", *cost, now).await.unwrap();
                assert_eq!(r, m, "check at step {i} of {case:?}");
                if r.allowed {
                    allowed.push((r, m));
                }
            }
            Op::Settle(pick, figure) if !allowed.is_empty() => {
                // A copy each time: the stores also meet the same charge twice.
                let (mut r, mut m) = allowed[pick % allowed.len()].clone();
                let by_redis = on_redis.settle_at("k", &mut r, *figure, now).await;
                let by_memory = in_memory.settle_at("k", &mut m, *figure, now).await;
                match (by_redis, by_memory) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "settlement at step {i} of {case:?}"),
                    (Err(Error::InvalidInput(_)), Err(Error::InvalidInput(_))) => {}
                    other => panic!("settlement at step {i} of {case:?}: {other:?}"),
                }
            }
            Op::Refund(pick) if !allowed.is_empty() => {
                let (mut r, mut m) = allowed[pick % allowed.len()].clone();
                let by_redis = on_redis.refund_at("k", &mut r, now).await.unwrap();
                let by_memory = in_memory.refund_at("k", &mut m, now).await.unwrap();
                assert_eq!(by_redis, by_memory, "refund at step {i} of {case:?}");
            }
            Op::Settle(..) | Op::Refund(_) => {}
        }
    }
}

#[test]
fn budget_settlements_in_memory_match_redis() {
    let redis = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(redis.store());
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let _guard = rt.enter();
    runner
        .run(&cases(), |case| {
            rt.block_on(interleaved_agree(&store, &case));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("budgets: {e}"));
}

// ---------------------------------------------------------------------------------------
// Over HTTP: a model proxy with 3 requests and 1,000 tokens a minute per API key.

/// The header the model's answer states its tokens in.
const TOKENS: &str = "x-usage-tokens";

/// `GET /complete`: answers with the tokens of the request's `x-used` in the usage header.
async fn complete(headers: HeaderMap) -> Response {
    let mut res = (StatusCode::OK, "completion").into_response();
    if let Some(used) = headers.get("x-used") {
        res.headers_mut().insert(TOKENS, used.clone());
    }
    res
}

/// `GET /handled`: settles through the request's `Usage` handle to `x-used` before
/// answering (no usage header).
async fn handled(
    State(()): State<()>,
    Extension(usage): Extension<Usage>,
    headers: HeaderMap,
) -> Response {
    let used = headers
        .get("x-used")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    usage.settle(used).await.unwrap();
    (StatusCode::OK, "completion").into_response()
}

/// The proxy on 127.0.0.1: estimates 100 tokens a request, settled from the usage header or
/// the handle.
async fn proxy(limiter: Limiter) -> (String, tokio::task::JoinHandle<()>) {
    let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-api-key").unwrap())
        .cost(|_| 100)
        .settle_from_header(HeaderName::from_static(TOKENS))
        .unwrap()
        .settle_from_handle()
        .unwrap();
    let app = Router::new()
        .route("/complete", get(complete))
        .route("/handled", get(handled))
        .with_state(())
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), server)
}

/// `GET path` as API key `key`, the answer using `used` tokens: its status and its
/// `Retry-After`, read whole.
async fn ask(base: &str, path: &str, key: &str, used: u64) -> (StatusCode, Option<u64>) {
    let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let req = Request::get(format!("{base}{path}"))
        .header("x-api-key", key)
        .header("x-used", used.to_string())
        .body(Body::empty())
        .unwrap();
    let res = tokio::time::timeout(Duration::from_secs(20), client.request(req))
        .await
        .expect("the proxy answers")
        .unwrap();
    let retry = res
        .headers()
        .get(http::header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let status = res.status();
    res.into_body().collect().await.unwrap();
    (status, retry)
}

/// The exact admissions of the proxy, on Redis (whose clock runs: a token comes back every
/// 60 ms, so the tokens read are bounded, not exact) and in memory on a clock that stands
/// still (exact).
#[tokio::test]
async fn a_model_proxy_admits_requests_and_tokens_per_minute_per_api_key() {
    let redis = RedisServer::start();
    let memory = MemoryStore::builder()
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let stores: [(&str, Arc<dyn Store>); 2] = [
        ("redis", Arc::new(redis.store().await)),
        ("memory", Arc::new(memory)),
    ];
    for (name, store) in stores {
        let exact = name == "memory";
        let limiter = limiter_on(store, &model_budgets());
        let (base, server) = proxy(limiter.clone()).await;
        let tokens_left = |key: &'static str| {
            let limiter = limiter.clone();
            async move { limiter.peek(key).await.unwrap().limits[1].remaining }
        };
        let requests_left = |key: &'static str| {
            let limiter = limiter.clone();
            async move { limiter.peek(key).await.unwrap().limits[0].remaining }
        };

        // Small answers: the requests budget binds; the fourth spends no tokens.
        for used in [10, 20, 30] {
            assert_eq!(
                ask(&base, "/complete", "small", used).await.0,
                StatusCode::OK
            );
        }
        let (status, retry) = ask(&base, "/complete", "small", 10).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{name}");
        assert!(
            retry.is_some_and(|r| (1..=20).contains(&r)),
            "{name}: {retry:?}"
        );
        let left = tokens_left("small").await;
        assert!(left >= 940, "{name}: 60 tokens spent, not 160: {left} left");
        if exact {
            assert_eq!(left, 940, "{name}");
        }

        // A large answer: settled up to 850, the tokens bind while requests have room; the
        // refused request spends no request.
        assert_eq!(
            ask(&base, "/complete", "large", 100).await.0,
            StatusCode::OK
        );
        assert_eq!(
            ask(&base, "/complete", "large", 850).await.0,
            StatusCode::OK
        );
        let (status, retry) = ask(&base, "/complete", "large", 100).await;
        assert_eq!(
            status,
            StatusCode::TOO_MANY_REQUESTS,
            "{name}: 50 tokens left"
        );
        assert!(retry.is_some_and(|r| r >= 1), "{name}: {retry:?}");
        assert_eq!(requests_left("large").await, 1, "{name}");
        if exact {
            assert_eq!(tokens_left("large").await, 50, "{name}");
            assert_eq!(retry, Some(3), "{name}: 50 more tokens in 3 s");
        }

        // A debt: 1,500 tokens used of an estimate of 100; the next is refused for the time
        // the debt takes to pay back (about 36 s), far past the request budget's 20 s.
        assert_eq!(
            ask(&base, "/handled", "debt", 1_500).await.0,
            StatusCode::OK
        );
        let (status, retry) = ask(&base, "/complete", "debt", 100).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{name}");
        assert!(
            retry.is_some_and(|r| r > 20 && r <= 36),
            "{name}: {retry:?}"
        );
        assert_eq!(requests_left("debt").await, 2, "{name}: one request spent");
        if exact {
            assert_eq!(retry, Some(36), "{name}");
        }
        // Another API key is untouched.
        assert_eq!(
            ask(&base, "/complete", "other", 100).await.0,
            StatusCode::OK
        );
        server.abort();
    }
}
