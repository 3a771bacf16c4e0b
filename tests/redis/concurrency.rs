//! Per-key concurrency limits (`ConcurrencyLimiter`, `ConcurrencyLimitLayer`) on real Redis
//! servers (standalone, batched, cluster) and on `MemoryStore`: never more than N in flight
//! across limiters, also across repeated Redis restarts; slots given back on every way a
//! request can end, also when Redis stalls at the release; leases that expire when their
//! holder dies and stay while it lives; failure policies; and composition with the rate
//! limit.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::servers::proxy::Proxy;
use crate::servers::{dead_redis_url, each_backend, RedisServer};
use axum::{body::Body, routing::get, Router};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter, Permit},
    redis,
    store::memory::ManualClock,
    store::SlotStore,
    FailurePolicy, Gcra, GlobalKey, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter,
    RedisStore,
};

/// Generous: a bound that catches a hang or a leaked slot, not a benchmark.
const EVENTUALLY: Duration = Duration::from_secs(5);

fn limiter(store: impl SlotStore, n: u32, prefix: &str) -> ConcurrencyLimiter {
    ConcurrencyLimiter::builder(store, n)
        .prefix(prefix)
        .store_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn short_ttl(store: impl SlotStore, n: u32, prefix: &str, ttl: Duration) -> ConcurrencyLimiter {
    ConcurrencyLimiter::builder(store, n)
        .prefix(prefix)
        .permit_ttl(ttl)
        .store_timeout(ttl / 4)
        .build()
        .unwrap()
}

/// True once `limiter` admits `key` (the permit is given back at once), within
/// [`EVENTUALLY`]: Redis releases are sent in the background.
async fn eventually_free(limiter: &ConcurrencyLimiter, key: &str) -> bool {
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        if let Some(p) = limiter.acquire(key).await.unwrap() {
            p.release().await.unwrap();
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The keys under `pattern` but the epoch markers (which live a day after the last call).
fn holders_left(conn: &mut redis::Connection, pattern: &str) -> Vec<(String, i64)> {
    let mut keys = crate::servers::keys_with_pttl(conn, pattern);
    keys.retain(|(k, _)| !k.contains(":#epoch"));
    keys
}

/// An inner service that counts the requests inside it and records the most at once.
#[derive(Clone, Default)]
struct Gauge {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

impl Gauge {
    fn service(
        &self,
    ) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future = impl Send>
           + Clone {
        let g = self.clone();
        service_fn(move |_req: Request<Body>| {
            let g = g.clone();
            async move {
                let n = g.now.fetch_add(1, Ordering::SeqCst) + 1;
                g.max.fetch_max(n, Ordering::SeqCst);
                g.calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                g.now.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Infallible>(Response::new(Body::from("ok")))
            }
        })
    }
}

/// 64 tasks, 8 requests each, on one key, spread over `limiters` (one layer each, like one
/// instance each): the inner service never sees more than `n` at once, and does see `n`.
async fn exactly_n_in_flight(limiters: Vec<ConcurrencyLimiter>, n: u32, what: &str) {
    let gauge = Gauge::default();
    let services: Vec<_> = limiters
        .iter()
        .map(|l| {
            ServiceBuilder::new()
                .layer(ConcurrencyLimitLayer::new(l.clone(), GlobalKey))
                .service(gauge.service())
        })
        .collect();
    let refused = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..64 {
        let svc = services[t % services.len()].clone();
        let refused = refused.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..8 {
                let res = svc
                    .clone()
                    .oneshot(Request::get("/").body(Body::empty()).unwrap())
                    .await
                    .unwrap();
                match res.status() {
                    StatusCode::OK => {
                        res.into_body().collect().await.unwrap();
                    }
                    StatusCode::TOO_MANY_REQUESTS => {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    other => panic!("unexpected status {other}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let max = gauge.max.load(Ordering::SeqCst);
    let calls = gauge.calls.load(Ordering::SeqCst);
    let refused = refused.load(Ordering::SeqCst);
    assert!(
        max <= n as usize,
        "{what}: {max} in flight at once, limit {n}"
    );
    assert_eq!(max, n as usize, "{what}: the limit was never reached");
    assert_eq!(calls + refused, 64 * 8, "{what}");
    assert!(refused > 0, "{what}: 64 concurrent tasks, none refused");
    // Every slot comes back once the responses are over.
    for l in &limiters {
        let mut held = Vec::new();
        let deadline = Instant::now() + EVENTUALLY;
        while held.len() < n as usize {
            match l.acquire("global").await.unwrap() {
                Some(p) => held.push(p),
                None if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                None => panic!("{what}: {} of {n} slots came back", held.len()),
            }
        }
        assert!(l.acquire("global").await.unwrap().is_none(), "{what}");
        for p in held {
            p.release().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_than_n_in_flight_in_memory() {
    let store = MemoryStore::new();
    let limiters = (0..3).map(|_| limiter(store.clone(), 4, "x-mem")).collect();
    exactly_n_in_flight(limiters, 4, "memory").await;
    assert_eq!(store.lease_holders(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_than_n_in_flight_on_every_backend() {
    for backend in each_backend() {
        let what = backend.name();
        let mut limiters = Vec::new();
        for _ in 0..3 {
            limiters.push(limiter(backend.store().await, 4, "x-redis"));
        }
        // The holders live under the rate limit's hash tag, expiring with their lease.
        let permit = limiters[0].acquire("k").await.unwrap().unwrap();
        let (mut keys, epochs): (Vec<_>, Vec<_>) = backend
            .keys_with_pttl("{x-redis:*")
            .into_iter()
            .partition(|(k, _)| !k.contains(":#epoch"));
        assert_eq!(keys.len(), 1, "{what}: {keys:?}");
        assert_eq!(keys[0].0, "{x-redis:concurrency:k}:c", "{what}");
        assert_eq!(keys[0].0, limiters[0].storage_key("k"));
        assert!(
            keys[0].1 > 0 && keys[0].1 <= 10_000,
            "{what}: PTTL {}",
            keys[0].1
        );
        // The epoch marker: of the server, or of the key's hash slot on a cluster; it lives a
        // day after the last call.
        assert_eq!(epochs.len(), 1, "{what}: {epochs:?}");
        let marker = &epochs[0].0;
        match backend {
            crate::servers::Backend::Cluster(_) => assert!(
                marker.starts_with("{x-redis:concurrency:#epoch:") && marker.ends_with("}:c"),
                "{what}: {marker}"
            ),
            _ => assert_eq!(marker, "{x-redis:concurrency:#epoch}:c", "{what}"),
        }
        assert!(epochs[0].1 > 86_000_000, "{what}: {epochs:?}");
        permit.release().await.unwrap();
        keys = backend.keys_with_pttl("{x-redis:*");
        assert!(
            keys.iter().all(|(k, _)| k.contains(":#epoch")),
            "{what}: {keys:?}"
        );

        exactly_n_in_flight(limiters, 4, what).await;
        let deadline = Instant::now() + EVENTUALLY;
        while backend
            .keys_with_pttl("{x-redis:*")
            .iter()
            .any(|(k, _)| !k.contains(":#epoch"))
        {
            assert!(Instant::now() < deadline, "{what}: holders left behind");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Acquires `n` slots of `key` on a runtime of its own, leaks the permits, and shuts the
/// runtime down: like an instance that crashed holding them (no renewal, no release).
async fn crash_holding(n: u32, key: &'static str, source: ConcurrencyLimiterSource) {
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let limiter = source.build().await;
            for _ in 0..n {
                let permit = limiter.acquire(key).await.unwrap().expect("a free slot");
                std::mem::forget(permit);
            }
        });
        drop(rt);
    })
    .await
    .unwrap();
}

/// How the crashed instance builds its limiter (on its own runtime).
enum ConcurrencyLimiterSource {
    Redis(String, u32, &'static str, Duration),
    Memory(MemoryStore, u32, &'static str, Duration),
}

impl ConcurrencyLimiterSource {
    async fn build(self) -> ConcurrencyLimiter {
        match self {
            Self::Redis(url, n, prefix, lease) => {
                short_ttl(RedisStore::connect(&url).await.unwrap(), n, prefix, lease)
            }
            Self::Memory(store, n, prefix, lease) => short_ttl(store, n, prefix, lease),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_instances_slots_come_back_within_the_permit_ttl_on_redis() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(800);
    let survivor = short_ttl(redis.store().await, 3, "crash", lease);
    // A live holder keeps renewing, so the key outlives the crashed holders: their slots must
    // be swept one by one, not merely expire with the key.
    let live = survivor.acquire("k").await.unwrap().unwrap();
    let url = redis.url();
    crash_holding(
        2,
        "k",
        ConcurrencyLimiterSource::Redis(url, 3, "crash", lease),
    )
    .await;
    let crashed_at = Instant::now();
    assert!(
        survivor.acquire("k").await.unwrap().is_none(),
        "the crashed instance's slots are still held"
    );
    tokio::time::sleep(lease.saturating_sub(crashed_at.elapsed()) + Duration::from_millis(100))
        .await;
    let a = survivor.acquire("k").await.unwrap();
    let b = survivor.acquire("k").await.unwrap();
    assert!(
        a.is_some() && b.is_some(),
        "slots not back one lease after the crash"
    );
    assert!(!live.is_lost());
    assert!(survivor.acquire("k").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_instances_slots_come_back_at_the_permit_ttl_on_a_manual_clock() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let lease = Duration::from_secs(30);
    let crashed = store.clone();
    crash_holding(
        3,
        "k",
        ConcurrencyLimiterSource::Memory(crashed, 3, "crash", lease),
    )
    .await;
    let survivor = short_ttl(store.clone(), 3, "crash", lease);
    assert!(survivor.acquire("k").await.unwrap().is_none());
    clock.advance(lease - Duration::from_millis(1));
    assert!(
        survivor.acquire("k").await.unwrap().is_none(),
        "given back before the lease ended"
    );
    clock.advance(Duration::from_millis(1));
    let back: Vec<_> = futures_util::future::join_all((0..3).map(|_| survivor.acquire("k")))
        .await
        .into_iter()
        .map(|r| r.unwrap().expect("a slot back at the lease's end"))
        .collect();
    assert_eq!(back.iter().map(|p| p.in_flight()).max(), Some(3));
    assert!(survivor.acquire("k").await.unwrap().is_none());
}

/// A service whose response body comes in two frames.
fn two_frames() -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone
{
    service_fn(|_req: Request<Body>| async {
        let frames = futures_util::stream::iter([Ok::<_, Infallible>("a"), Ok("b")]);
        Ok::<_, Infallible>(Response::new(Body::from_stream(frames)))
    })
}

/// Each way a request can end gives its slot back: body read to its end (before the body is
/// dropped), body dropped unread, response future dropped while the inner service works,
/// inner service error. With one slot, the next acquire tells.
async fn every_ending_gives_the_slot_back(l: &ConcurrencyLimiter, what: &str) {
    let layer = ConcurrencyLimitLayer::new(l.clone(), GlobalKey);
    let get = || Request::get("/").body(Body::empty()).unwrap();

    // Body read to its end.
    let res = layer.layer(two_frames()).oneshot(get()).await.unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "a");
    assert!(
        l.acquire("global").await.unwrap().is_none(),
        "{what}: not held while streaming"
    );
    while let Some(frame) = body.frame().await {
        frame.unwrap();
    }
    assert!(
        eventually_free(l, "global").await,
        "{what}: not given back at the body's end"
    );
    drop(body);

    // Body dropped unread.
    let res = layer.layer(two_frames()).oneshot(get()).await.unwrap();
    assert!(l.acquire("global").await.unwrap().is_none(), "{what}");
    drop(res);
    assert!(
        eventually_free(l, "global").await,
        "{what}: not given back when the body was dropped"
    );

    // Response future dropped while the inner service works (the client went away).
    let hang = service_fn(|_req: Request<Body>| async {
        std::future::pending::<Result<Response<Body>, Infallible>>().await
    });
    let mut svc = layer.layer(hang);
    let mut fut = Box::pin(svc.ready().await.unwrap().call(get()));
    assert!(tokio::time::timeout(Duration::from_millis(100), &mut fut)
        .await
        .is_err());
    assert!(
        l.acquire("global").await.unwrap().is_none(),
        "{what}: not held while in the inner service"
    );
    drop(fut);
    assert!(
        eventually_free(l, "global").await,
        "{what}: not given back when the future was dropped"
    );

    // Inner service error.
    let failing = service_fn(|_req: Request<Body>| async { Err::<Response<Body>, _>("boom") });
    let err = layer.layer(failing).oneshot(get()).await.unwrap_err();
    assert_eq!(err, "boom");
    assert!(
        eventually_free(l, "global").await,
        "{what}: not given back after an inner error"
    );
}

#[tokio::test]
async fn every_ending_gives_the_slot_back_in_memory_at_once() {
    let store = MemoryStore::new();
    let l = limiter(store.clone(), 1, "end");
    every_ending_gives_the_slot_back(&l, "memory").await;
    assert_eq!(store.lease_holders(), 0);
    // In memory the slot is back before the drop returns: no waiting at all.
    let res = ConcurrencyLimitLayer::new(l.clone(), GlobalKey)
        .layer(two_frames())
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    drop(res);
    assert!(l.acquire("global").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn every_ending_gives_the_slot_back_on_redis() {
    let redis = RedisServer::start();
    let l = limiter(redis.store().await, 1, "end");
    every_ending_gives_the_slot_back(&l, "redis").await;
    assert!(holders_left(&mut redis.conn(), "{end:*").is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn renewal_keeps_a_slot_for_a_request_longer_than_its_permit_ttl() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(600);
    for (what, a, b) in [
        (
            "redis",
            short_ttl(redis.store().await, 1, "renew", lease),
            short_ttl(redis.store().await, 1, "renew", lease),
        ),
        {
            let store = MemoryStore::new();
            (
                "memory",
                short_ttl(store.clone(), 1, "renew", lease),
                short_ttl(store, 1, "renew", lease),
            )
        },
    ] {
        let permit = a.acquire("k").await.unwrap().unwrap();
        let started = Instant::now();
        while started.elapsed() < lease * 3 {
            tokio::time::sleep(lease / 4).await;
            assert!(
                b.acquire("k").await.unwrap().is_none(),
                "{what}: the slot was lost after {:?} (lease {lease:?})",
                started.elapsed()
            );
        }
        assert!(!permit.is_lost(), "{what}");
        drop(permit);
        assert!(eventually_free(&b, "k").await, "{what}");
    }
}

/// A holder missing from the store while its request runs (deleted here; a failover to a
/// replica that had not received it): another request may take its slot meanwhile, and the
/// next renewal reports the loss and puts the holder back, counted over the limit, so no
/// further request gets in until enough end.
#[tokio::test(flavor = "multi_thread")]
async fn a_permit_lost_in_the_store_is_reported_and_put_back_at_the_next_renewal() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(600);
    let l = short_ttl(redis.store().await, 1, "lost", lease);
    let permit = l.acquire("k").await.unwrap().unwrap();
    let _: () = redis::cmd("DEL")
        .arg(l.storage_key("k"))
        .query(&mut redis.conn())
        .unwrap();
    let other = l
        .acquire("k")
        .await
        .unwrap()
        .expect("the slot is free in the store");
    let deadline = Instant::now() + EVENTUALLY;
    while !permit.is_lost() {
        assert!(Instant::now() < deadline, "the loss was never noticed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut members = holders(&redis, &l, "k");
    members.sort();
    assert_eq!(members.len(), 2, "put back: {members:?}");
    assert!(!other.is_lost());
    assert!(
        l.acquire("k").await.unwrap().is_none(),
        "2 in flight, limit 1"
    );
    other.release().await.unwrap();
    assert!(
        l.acquire("k").await.unwrap().is_none(),
        "1 in flight, limit 1"
    );
    // It stays held across renewals, and its release gives the slot back.
    tokio::time::sleep(lease).await;
    assert_eq!(holders(&redis, &l, "k").len(), 1);
    permit.release().await.unwrap();
    assert!(l.acquire("k").await.unwrap().is_some());
}

/// The limiter counts every acquire once: admitted, refused (through the layer or directly),
/// and refused or admitted at the local share while Redis is away.
#[tokio::test(flavor = "multi_thread")]
async fn the_concurrency_limit_counts_its_decisions() {
    let l = ConcurrencyLimiter::builder(MemoryStore::new(), 2)
        .build()
        .unwrap();
    let a = l.acquire("k").await.unwrap().unwrap();
    let svc =
        ConcurrencyLimitLayer::new(l.clone(), HeaderKey::new("x-k").unwrap()).layer(service_fn(
            |_req: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::from("ok"))) },
        ));
    let req = || {
        Request::get("/")
            .header("x-k", "k")
            .body(Body::empty())
            .unwrap()
    };
    let res = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    drop(res);
    let b = l.acquire("k").await.unwrap();
    assert!(
        b.is_some(),
        "the layer's permit was given back with its body"
    );
    let res = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(l.acquire("k").await.unwrap().is_none());
    let stats = l.stats();
    assert_eq!((stats.allowed, stats.denied), (3, 2), "{stats:?}");
    assert_eq!(stats.store_errors, 0);
    drop((a, b));

    // Redis away: the local share decides, and each acquire is counted once, degraded.
    let local =
        ConcurrencyLimiter::builder(RedisStore::connect_lazy(&dead_redis_url()).unwrap(), 2)
            .on_store_error(FailurePolicy::Local)
            .local_share(2)
            .store_timeout(Duration::from_millis(200))
            .build()
            .unwrap();
    let held = local
        .acquire("k")
        .await
        .unwrap()
        .expect("one at the local share");
    assert!(held.is_degraded());
    assert!(
        local.acquire("k").await.unwrap().is_none(),
        "the share is 1"
    );
    let stats = local.stats();
    assert_eq!((stats.allowed, stats.denied), (1, 1), "{stats:?}");
    assert_eq!(stats.degraded, 2, "{stats:?}");
    assert!(stats.store_errors >= 2, "{stats:?}");
}

#[tokio::test]
async fn failure_policies_with_redis_down() {
    let store = || RedisStore::connect_lazy(&dead_redis_url()).unwrap();
    let with = |policy: FailurePolicy| {
        ConcurrencyLimiter::builder(store(), 4)
            .store_timeout(Duration::from_millis(200))
            .on_store_error(policy)
            .local_share(2)
            .build()
            .unwrap()
    };
    let ok = service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::from("ok")))
    });
    let get = || Request::get("/").body(Body::empty()).unwrap();

    let open = with(FailurePolicy::Open);
    let e = open.acquire("k").await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    let res = ConcurrencyLimitLayer::new(open, GlobalKey)
        .layer(ok)
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers().get("ratelimit").is_none());

    let closed = with(FailurePolicy::Closed);
    let res = ConcurrencyLimitLayer::new(closed, GlobalKey)
        .layer(ok)
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "1");

    // Local: 4 / 2 instances = 2 per key in this process.
    let local = with(FailurePolicy::Local);
    let a = local.acquire("k").await.unwrap().expect("local slot");
    let b = local.acquire("k").await.unwrap().expect("local slot");
    assert!(a.is_degraded() && b.is_degraded());
    assert_eq!((b.in_flight(), b.max_in_flight()), (2, 2));
    assert!(local.acquire("k").await.unwrap().is_none());
    let svc = ConcurrencyLimitLayer::new(local.clone(), GlobalKey).layer(ok);
    let held = svc.clone().oneshot(get()).await.unwrap();
    let held2 = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(
        (held.status(), held2.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    assert_eq!(held2.headers()["ratelimit"], r#""concurrency";r=0"#);
    let res = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    drop((a, held));
    assert!(local.acquire("global").await.unwrap().is_some());
    assert!(local.acquire("k").await.unwrap().is_some());
}

/// An axum app with a handler that takes 300 ms, limited to 2 in flight and 5 an hour per API
/// key, the concurrency layer outside (`concurrency_first`) or inside the rate limit.
fn app(store: RedisStore, prefix: &str, concurrency_first: bool) -> Router {
    let rate = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_hour(5)).unwrap())
        .prefix(prefix)
        .policy_name("api")
        .store_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let slots = ConcurrencyLimiter::builder(store, 2)
        .prefix(prefix)
        .policy_name("api")
        .store_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let key = || HeaderKey::new("x-api-key").unwrap();
    let routes = Router::new().route(
        "/",
        get(|| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            "ok"
        }),
    );
    if concurrency_first {
        routes.layer(
            ServiceBuilder::new()
                .layer(ConcurrencyLimitLayer::new(slots, key()))
                .layer(RateLimitLayer::new(rate, key())),
        )
    } else {
        routes.layer(
            ServiceBuilder::new()
                .layer(RateLimitLayer::new(rate, key()))
                .layer(ConcurrencyLimitLayer::new(slots, key())),
        )
    }
}

async fn send(app: &Router) -> Response<Body> {
    let req = Request::get("/")
        .header("x-api-key", "k")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    Response::from_parts(parts, Body::from(bytes))
}

#[tokio::test(flavor = "multi_thread")]
async fn composes_with_the_rate_limit_in_either_order() {
    let redis = RedisServer::start();
    for (concurrency_first, prefix, admitted_in_all) in [(true, "outside", 5), (false, "inside", 4)]
    {
        let app = app(redis.store().await, prefix, concurrency_first);
        let burst = futures_util::future::join_all((0..3).map(|_| send(&app))).await;
        let mut statuses: Vec<u16> = burst.iter().map(|r| r.status().as_u16()).collect();
        statuses.sort();
        assert_eq!(statuses, [200, 200, 429], "{prefix}");
        let refused = burst.iter().find(|r| r.status() == 429).unwrap();
        assert!(
            refused.headers()["ratelimit-policy"]
                .to_str()
                .unwrap()
                .contains("concurrent-requests"),
            "{prefix}: refused by the concurrency limit"
        );
        let admitted = burst.iter().find(|r| r.status() == 200).unwrap();
        let items: Vec<_> = admitted
            .headers()
            .get_all("ratelimit-policy")
            .iter()
            .collect();
        assert_eq!(items.len(), 2, "{prefix}: both limits report: {items:?}");
        // The two policies share a name and a hash tag, under their own keys.
        let keys: Vec<String> =
            crate::servers::keys_with_pttl(&mut redis.conn(), &format!("{{{prefix}:*"))
                .into_iter()
                .map(|k| k.0)
                .collect();
        let (g, c, epoch) = (
            format!("{{{prefix}:api:k}}:g"),
            format!("{{{prefix}:api:k}}:c"),
            format!("{{{prefix}:api:#epoch}}:c"),
        );
        assert!(keys.contains(&g), "{prefix}: {keys:?}");
        assert!(keys.contains(&epoch), "{prefix}: {keys:?}");
        assert!(
            keys.iter().all(|k| *k == g || *k == c || *k == epoch),
            "{prefix}: {keys:?}"
        );

        // The burst's slots are given back one round trip after their bodies ended (see
        // `ConcurrencyLimitLayer`): wait for that, then one at a time, the rate limit has the
        // last word.
        let deadline = Instant::now() + EVENTUALLY;
        while !crate::servers::keys_with_pttl(&mut redis.conn(), &c).is_empty() {
            assert!(Instant::now() < deadline, "{prefix}: slots not given back");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut ok = 2;
        loop {
            let res = send(&app).await;
            if res.status() != 200 {
                assert_eq!(res.status(), 429, "{prefix}");
                assert!(
                    res.headers().get("retry-after").is_some(),
                    "{prefix}: rate refusal"
                );
                break;
            }
            ok += 1;
            assert!(ok <= 5, "{prefix}: more than the rate quota");
        }
        // Outside, the concurrency refusal spent no rate unit; inside, it did.
        assert_eq!(ok, admitted_in_all, "{prefix}");
    }
}

/// An acquire whose answer never arrives (its future dropped, or timed out, while Redis was
/// paused) may still be admitted when Redis resumes: the slot is given back in the background
/// instead of staying taken for a whole lease (10 s here).
#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_abandoned_in_flight_gives_its_slot_back() {
    let redis = RedisServer::start();
    let l = ConcurrencyLimiter::builder(redis.store().await, 1)
        .prefix("abandon")
        .store_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(eventually_free(&l, "k").await, "warm-up");
    for how in ["dropped", "timed out"] {
        redis.signal("-STOP");
        let mut acquire = Box::pin(l.acquire("k"));
        let polled = tokio::time::timeout(Duration::from_millis(100), &mut acquire).await;
        assert!(polled.is_err(), "{how}: answered while Redis was paused");
        if how == "dropped" {
            drop(acquire);
        } else {
            let e = acquire.await.unwrap_err();
            assert!(matches!(e, tower_redis_ratelimit::Error::Timeout(_)), "{e}");
        }
        redis.signal("-CONT");
        assert!(
            eventually_free(&l, "k").await,
            "{how}: the slot stayed taken"
        );
    }
}

/// A connection cut after the acquire ran (the answer never came): the slot Redis gave
/// is released, not held until its lease ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_cut_connection_after_the_acquire_ran_does_not_leak_the_slot() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", redis.port).parse().unwrap()).await;
    let limiter = ConcurrencyLimiter::builder(RedisStore::connect(&proxy.url()).await.unwrap(), 1)
        .permit_ttl(Duration::from_secs(60))
        .store_timeout(Duration::from_secs(2))
        .on_store_error(FailurePolicy::Closed)
        .build()
        .unwrap();
    limiter
        .acquire("warm")
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.cut_next_answer();
    let err = limiter.acquire("k").await.unwrap_err();
    let err = crate::common::chain(&err);
    assert!(!err.contains("timed out"), "{err}");
    let mut statuses = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let p = limiter.acquire("k").await.unwrap();
        statuses.push(p.is_some());
        if p.is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot leaked after {err}: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The acquire script run twice for one holder (a cluster client resends after a cut
/// connection): admitted both times, one slot held (not "full" for the second run while the
/// holder keeps its slot).
#[test]
fn an_acquire_resent_for_the_same_holder_is_admitted_once() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let acquire = redis::Script::new(concat!(
        include_str!("../../lua/prelude.lua"),
        include_str!("../../lua/semaphore_epoch.lua"),
        include_str!("../../lua/semaphore_acquire.lua")
    ));
    let run = |c: &mut redis::Connection, holder: &str| -> Vec<i64> {
        let reply: Vec<i64> = acquire
            .key("{rl:concurrency:k}:c")
            .key("{rl:concurrency:#epoch}:c")
            .arg("")
            .arg(1)
            .arg(60_000_000u64)
            .arg(holder)
            .arg(0)
            .arg(1_000_000)
            .invoke(c)
            .unwrap();
        vec![reply[0], reply[1]]
    };
    assert_eq!(run(&mut c, "holder-1"), [1, 1]);
    assert_eq!(run(&mut c, "holder-1"), [1, 1], "resent");
    assert_eq!(run(&mut c, "holder-2"), [0, 1], "still one slot");
    let held: Vec<String> = redis::cmd("ZRANGE")
        .arg("{rl:concurrency:k}:c")
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    assert_eq!(held, ["holder-1"]);
}

/// The in-memory key cap never forgets a key whose slots are held: a flood of other keys
/// is refused instead, and the held key never admits more than its limit.
#[tokio::test]
async fn the_memory_key_cap_never_evicts_live_holders() {
    let limiter =
        ConcurrencyLimiter::builder(MemoryStore::builder().max_keys(16).build().unwrap(), 1)
            .build()
            .unwrap();
    let victim = limiter.acquire("victim").await.unwrap().expect("free");
    let mut flood = Vec::new();
    for i in 0..200 {
        flood.extend(limiter.acquire(format!("attacker-{i}")).await.unwrap());
    }
    assert!(flood.len() < 200, "the cap held no key back");
    assert!(
        limiter.acquire("victim").await.unwrap().is_none(),
        "2 in flight, max 1"
    );
    drop((victim, flood));
}

/// An inner service whose requests stay in it until [`end_all`](Self::end_all), counting how
/// many are inside at once and the most ever.
#[derive(Clone)]
struct Holding {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
    end: tokio::sync::watch::Sender<bool>,
}

impl Holding {
    fn new() -> Self {
        Self {
            now: Arc::default(),
            max: Arc::default(),
            end: tokio::sync::watch::Sender::new(false),
        }
    }

    fn service(
        &self,
    ) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future = impl Send>
           + Clone {
        let h = self.clone();
        service_fn(move |_req: Request<Body>| {
            let h = h.clone();
            async move {
                let n = h.now.fetch_add(1, Ordering::SeqCst) + 1;
                h.max.fetch_max(n, Ordering::SeqCst);
                let mut end = h.end.subscribe();
                let _ = end.wait_for(|end| *end).await;
                h.now.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Infallible>(Response::new(Body::from("done")))
            }
        })
    }

    fn end_all(&self) {
        self.end.send_replace(true);
    }
}

/// The holders of `limiter`'s `key` in Redis.
fn holders(redis: &RedisServer, limiter: &ConcurrencyLimiter, key: &str) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(limiter.storage_key(key))
        .arg(0)
        .arg(-1)
        .query(&mut redis.conn())
        .unwrap()
}

/// A request ends while Redis is stalled (here stopped with SIGSTOP) on a connection idle for
/// over a second, so the release waits on the connection's probe past the store timeout and
/// never reaches Redis. The release is kept and sent again: the slot is free within seconds of
/// Redis answering again, not at the end of the lease (60 s here).
#[tokio::test(flavor = "multi_thread")]
async fn a_release_that_fails_while_redis_stalls_is_sent_again_until_it_succeeds() {
    let redis = RedisServer::start();
    let limiter = ConcurrencyLimiter::builder(redis.store().await, 1)
        .prefix("stalled-release")
        .permit_ttl(Duration::from_secs(60))
        .store_timeout(Duration::from_millis(200))
        .on_store_error(FailurePolicy::Closed)
        .build()
        .unwrap();
    let holding = Holding::new();
    let svc = ConcurrencyLimitLayer::new(limiter.clone(), GlobalKey).layer(holding.service());
    let request = tokio::spawn(
        svc.clone()
            .oneshot(Request::get("/").body(Body::empty()).unwrap()),
    );
    let deadline = Instant::now() + EVENTUALLY;
    while holding.now.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the request never got in");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(holders(&redis, &limiter, "global").len(), 1);
    // A long request: the store's connection stays idle for more than a second.
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    redis.signal("-STOP");
    holding.end_all();
    let res = request.await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // The body's end gives the slot back: the release goes out and waits on stopped Redis.
    res.into_body().collect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.signal("-CONT");

    let deadline = Instant::now() + EVENTUALLY;
    loop {
        let held = holders(&redis, &limiter, "global");
        if held.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot is still held {EVENTUALLY:?} after Redis answered again: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(limiter.acquire("global").await.unwrap().is_some());
}

/// Sends a request through each of `services` in turn every 20 ms for `period`; admitted ones
/// stay in `holding` (their tasks are pushed to `tasks`).
async fn keep_sending<S>(
    services: &[S],
    period: Duration,
    tasks: &mut Vec<tokio::task::JoinHandle<StatusCode>>,
) where
    S: Service<
            Request<Body>,
            Response = Response<tower_redis_ratelimit::rate_limit::ResponseBody<Body>>,
        > + Clone
        + Send
        + 'static,
    S::Error: std::fmt::Debug,
    S::Future: Send,
{
    let started = Instant::now();
    while started.elapsed() < period {
        let svc = services[tasks.len() % services.len()].clone();
        tasks.push(tokio::spawn(async move {
            let res = svc
                .oneshot(Request::get("/").body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = res.status();
            res.into_body().collect().await.unwrap();
            status
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Long requests stay in flight while Redis is restarted (without persistence) again and
/// again, some restarts closer together than the renewal interval, with new requests arriving
/// all the time on two instances: the inner service never sees more than the limit at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_redis_restarts_never_let_more_than_the_limit_run() {
    let mut redis = RedisServer::start();
    let n = 3;
    let lease = Duration::from_millis(2_400);
    let holding = Holding::new();
    let mut services = Vec::new();
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let limiter = ConcurrencyLimiter::builder(redis.store().await, n)
            .prefix("restarts")
            .permit_ttl(lease)
            .store_timeout(Duration::from_millis(300))
            .on_store_error(FailurePolicy::Closed)
            .build()
            .unwrap();
        services
            .push(ConcurrencyLimitLayer::new(limiter.clone(), GlobalKey).layer(holding.service()));
        limiters.push(limiter);
    }
    let mut tasks = Vec::new();
    keep_sending(&services, Duration::from_millis(500), &mut tasks).await;
    assert_eq!(holding.now.load(Ordering::SeqCst), n as usize, "not full");
    // Restarts a renewal interval and more apart, and in quick succession.
    for wait in [
        lease,
        Duration::from_millis(300),
        Duration::from_millis(100),
        lease,
    ] {
        tokio::task::block_in_place(|| redis.restart());
        keep_sending(&services, wait, &mut tasks).await;
    }
    let most = holding.max.load(Ordering::SeqCst);
    holding.end_all();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for task in tasks {
        *statuses.entry(task.await.unwrap().as_u16()).or_default() += 1;
    }
    println!("most in flight: {most} (limit {n}); statuses {statuses:?}");
    assert!(
        most <= n as usize,
        "{most} requests in flight at once, limit {n}"
    );
    for limiter in &limiters {
        assert!(eventually_free(limiter, "global").await);
    }
}

/// Redis loses its slots (`FLUSHALL`) while an instance holds two of them, and a new instance
/// that never used this Redis is the first to call: it cannot tell a loss from a first use
/// and is admitted (2N in flight). As soon as the instance that saw the old epoch calls,
/// admissions pause from the new epoch's start, until its running requests have put their
/// slots back; then the limit holds again.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_loss_a_new_instance_may_admit_until_one_that_knew_the_old_epoch_calls() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(3_000);
    let build = |store: RedisStore| {
        ConcurrencyLimiter::builder(store, 2)
            .prefix("new-instance")
            .permit_ttl(lease)
            .store_timeout(Duration::from_millis(200))
            .build()
            .unwrap()
    };
    let old = build(redis.store().await);
    let running = [
        old.acquire("k").await.unwrap().unwrap(),
        old.acquire("k").await.unwrap().unwrap(),
    ];
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    let new = build(redis.store().await);
    let first = [
        new.acquire("k")
            .await
            .unwrap()
            .expect("a first use, as far as it knows"),
        new.acquire("k")
            .await
            .unwrap()
            .expect("a first use, as far as it knows"),
    ];
    // The old instance calls (another key): the loss is news to it, admissions pause.
    assert!(old.acquire("other").await.unwrap().is_none(), "paused");
    for p in first {
        p.release().await.unwrap();
    }
    assert!(
        new.acquire("k").await.unwrap().is_none(),
        "paused, although no slot of k is held in Redis"
    );
    // The running requests renew (a third of the lease): counted again, the key is full, and
    // each permit says it was lost (once its renewal's reply is read: after Redis shows it).
    let deadline = Instant::now() + EVENTUALLY;
    while holders(&redis, &old, "k").len() < 2 || !running.iter().all(Permit::is_lost) {
        assert!(
            Instant::now() < deadline,
            "the running requests were not put back, or not told they were lost"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(lease).await;
    assert!(
        new.acquire("k").await.unwrap().is_none(),
        "2 in flight, limit 2"
    );
    assert!(
        new.acquire("other").await.unwrap().is_some(),
        "the pause is over"
    );
    drop(running);
    assert!(eventually_free(&new, "k").await);
}

/// On a cluster the epoch is kept per hash slot: every primary flushed while requests of a
/// key run, the next acquire of that key by the instance that saw the slot's epoch is paused
/// (nothing is held in Redis), the running requests are counted again at their renewal, and
/// the key stays full until they end.
#[tokio::test(flavor = "multi_thread")]
async fn a_flushed_cluster_pauses_the_slots_admissions_until_running_requests_count_again() {
    let cluster = crate::servers::RedisCluster::start(3, 0);
    let lease = Duration::from_millis(3_000);
    let limiter = ConcurrencyLimiter::builder(cluster.store().await, 2)
        .prefix("cluster-loss")
        .permit_ttl(lease)
        .store_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let running = [
        limiter.acquire("k").await.unwrap().unwrap(),
        limiter.acquire("k").await.unwrap().unwrap(),
    ];
    for (port, reply) in cluster.on_each(&["FLUSHALL"]) {
        assert_eq!(reply, redis::Value::Okay, "{port}");
    }
    let held = || cluster.keys_with_pttl("{cluster-loss:concurrency:k}:c");
    assert!(held().is_empty(), "flushed");
    assert!(limiter.acquire("k").await.unwrap().is_none(), "paused");
    let deadline = Instant::now() + EVENTUALLY;
    while running.iter().any(|p| !p.is_lost()) {
        assert!(
            Instant::now() < deadline,
            "the running requests were not put back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(lease).await;
    assert!(
        limiter.acquire("k").await.unwrap().is_none(),
        "2 in flight, limit 2"
    );
    drop(running);
    assert!(eventually_free(&limiter, "k").await);
}

/// A renewal that got no answer may reach Redis after the holder's release (another
/// connection, a stalled one): the release then remembers the holder as released for a
/// lease, and that renewal does not take the slot again. Without that guard, a renewal puts a
/// missing holder back.
#[test]
fn a_renewal_arriving_after_a_guarded_release_does_not_put_the_holder_back() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let script = |file: &str| {
        let body = match file {
            "renew" => include_str!("../../lua/semaphore_renew.lua"),
            _ => include_str!("../../lua/semaphore_release.lua"),
        };
        redis::Script::new(&format!(
            "{}{}{}",
            include_str!("../../lua/prelude.lua"),
            include_str!("../../lua/semaphore_epoch.lua"),
            body
        ))
    };
    let (renew, release) = (script("renew"), script("release"));
    let (holders, marker, released) = (
        "{rl:concurrency:k}:c",
        "{rl:concurrency:#epoch}:c",
        "{rl:concurrency:k}:cx",
    );
    let renew = |c: &mut redis::Connection, holder: &str| -> i64 {
        let reply: Vec<i64> = renew
            .key(holders)
            .key(marker)
            .key(released)
            .arg("")
            .arg(60_000_000u64)
            .arg(holder)
            .arg(0)
            .arg(1_000_000)
            .invoke(c)
            .unwrap();
        reply[0]
    };
    let members = |c: &mut redis::Connection| -> Vec<String> {
        let mut m: Vec<String> = redis::cmd("ZRANGE")
            .arg(holders)
            .arg(0)
            .arg(-1)
            .query(c)
            .unwrap();
        m.sort();
        m
    };
    assert_eq!(renew(&mut c, "a"), 0, "not held: put back");
    assert_eq!(renew(&mut c, "a"), 1, "renewed");
    assert_eq!(renew(&mut c, "b"), 0);
    // `a` released plainly: a renewal arriving later puts it back.
    let plain: i64 = release
        .key(holders)
        .arg("")
        .arg("a")
        .invoke(&mut c)
        .unwrap();
    assert_eq!(plain, 1);
    assert_eq!(renew(&mut c, "a"), 0);
    assert_eq!(members(&mut c), ["a", "b"]);
    // `b` released with the guard: the late renewal finds it released.
    let guarded: i64 = release
        .key(holders)
        .key(released)
        .arg("")
        .arg("b")
        .arg(60_000_000u64)
        .invoke(&mut c)
        .unwrap();
    assert_eq!(guarded, 1);
    assert_eq!(renew(&mut c, "b"), 2, "released: not put back");
    assert_eq!(members(&mut c), ["a"]);
    let ttl: i64 = redis::cmd("PTTL").arg(released).query(&mut c).unwrap();
    assert!(ttl > 59_000 && ttl <= 60_000, "{ttl}");
    // Sending the guarded release again changes nothing.
    let again: i64 = release
        .key(holders)
        .key(released)
        .arg("")
        .arg("b")
        .arg(60_000_000u64)
        .invoke(&mut c)
        .unwrap();
    assert_eq!(again, 0);
    assert_eq!(members(&mut c), ["a"]);
}

/// A runtime shut down while a failed release waits to be sent again, and a permit dropped
/// after its runtime is gone: nothing panics (the slots come back when their leases end).
#[test]
fn a_runtime_shut_down_with_releases_kept_does_not_panic() {
    const THREADS: &str = "kept-releases";
    static PANICS: AtomicUsize = AtomicUsize::new(0);
    let test_thread = std::thread::current().name().map(str::to_owned);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let name = std::thread::current().name().map(str::to_owned);
        if name.as_deref() == Some(THREADS) || name == test_thread {
            PANICS.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
    let redis = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(THREADS)
        .enable_all()
        .build()
        .unwrap();
    let late = rt.block_on(async {
        let limiter = ConcurrencyLimiter::builder(redis.store().await, 2)
            .prefix("shutdown")
            .permit_ttl(Duration::from_secs(60))
            .store_timeout(Duration::from_millis(100))
            .build()
            .unwrap();
        let kept = limiter.acquire("k").await.unwrap().unwrap();
        let late = limiter.acquire("k").await.unwrap().unwrap();
        redis.signal("-STOP");
        assert!(kept.release().await.is_err(), "Redis is stopped");
        late
    });
    drop(rt);
    drop(late);
    redis.signal("-CONT");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
}
