//! The outbound throttle on a test's clock: a [`ManualClock`] drives the limiter's store, the
//! adaptive store and an axum upstream on loopback alike, so that every wait ends when the test
//! advances the clock, never in real time.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, UNIX_EPOCH},
};

use axum::{response::IntoResponse, routing::any, Router};
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::Empty;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tower::{util::BoxCloneService, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    store::memory::ManualClock, throttle::ThrottleLayer, Gcra, MemoryStore, Quota, RateLimiter,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Svc = BoxCloneService<Request<Empty<Bytes>>, StatusCode, BoxError>;

/// Where the test clocks start: a whole second, so the upstream's windows align with it.
const START: Duration = Duration::from_secs(1_700_000_000);

/// How the test upstream tells its reset.
#[derive(Debug, Clone, Copy)]
enum Reset {
    /// `X-RateLimit-Reset`: whole seconds from now, rounded up.
    Delta,
    /// `X-RateLimit-Reset`: the Unix time of the window's end, on an upstream clock `skew`
    /// seconds off the test's (its `Date` says so).
    Unix { skew: i64 },
}

/// An upstream on loopback allowing `limit` calls per one-second window of `clock`, telling
/// `X-RateLimit-Remaining` and `X-RateLimit-Reset` as `reset` says, and its `Date`.
struct Upstream {
    addr: SocketAddr,
    ok: Arc<AtomicU64>,
    limited: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    async fn fixed_window(clock: ManualClock, limit: u64) -> Self {
        Self::start(clock, limit, Reset::Delta).await
    }

    async fn start(clock: ManualClock, limit: u64, style: Reset) -> Self {
        let ok = Arc::new(AtomicU64::new(0));
        let limited = Arc::new(AtomicU64::new(0));
        // (window index, calls in it)
        let state = Arc::new(Mutex::new((0u64, 0u64)));
        let (o, l) = (ok.clone(), limited.clone());
        let app = Router::new().route(
            "/",
            any(move || {
                let (clock, ok, limited, state) =
                    (clock.clone(), o.clone(), l.clone(), state.clone());
                async move {
                    let now = clock.now();
                    let index = now.as_secs();
                    let mut s = state.lock().unwrap();
                    if s.0 != index {
                        *s = (index, 0);
                    }
                    let delta = Duration::from_secs(index + 1) - now;
                    let delta = delta.as_secs() + u64::from(delta.subsec_nanos() > 0);
                    let skew = match style {
                        Reset::Delta => 0,
                        Reset::Unix { skew } => skew,
                    };
                    let theirs = now.as_secs().saturating_add_signed(skew);
                    let reset = match style {
                        Reset::Delta => delta,
                        Reset::Unix { .. } => theirs + 1,
                    };
                    let mut h = HeaderMap::new();
                    let date = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(theirs));
                    h.insert("date", date.parse().unwrap());
                    let status = if s.1 < limit {
                        s.1 += 1;
                        ok.fetch_add(1, Ordering::Relaxed);
                        StatusCode::OK
                    } else {
                        limited.fetch_add(1, Ordering::Relaxed);
                        h.insert("retry-after", delta.into());
                        StatusCode::TOO_MANY_REQUESTS
                    };
                    h.insert("x-ratelimit-remaining", (limit - s.1).into());
                    h.insert("x-ratelimit-reset", reset.into());
                    (status, h).into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            ok,
            limited,
            task,
        }
    }

    fn get(&self) -> Request<Empty<Bytes>> {
        Request::get(format!("http://{}/", self.addr))
            .body(Empty::new())
            .unwrap()
    }
}

fn client<K, A>(layer: ThrottleLayer<K, A>) -> Svc
where
    K: tower_redis_ratelimit::KeyExtractor,
    A: tower_redis_ratelimit::algorithm::Algorithm,
{
    let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let svc = ServiceBuilder::new().layer(layer).service(http);
    BoxCloneService::new(svc.map_response(|r| r.status()))
}

fn one_key(_: &http::request::Parts) -> Option<String> {
    Some("upstream".to_owned())
}

/// Calls in flight on a manual clock, each counted when it ends.
struct Calls {
    clock: ManualClock,
    total: usize,
    done: Arc<AtomicUsize>,
    results: Arc<Mutex<Vec<Result<StatusCode, String>>>>,
}

impl Calls {
    fn start(clock: &ManualClock, svc: &Svc, up: &Upstream, n: usize) -> Self {
        let done = Arc::new(AtomicUsize::new(0));
        let results = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..n {
            let (svc, req) = (svc.clone(), up.get());
            let (done, results) = (done.clone(), results.clone());
            tokio::spawn(async move {
                let r = svc.oneshot(req).await.map_err(|e| e.to_string());
                results.lock().unwrap().push(r);
                done.fetch_add(1, Ordering::AcqRel);
            });
        }
        Self {
            clock: clock.clone(),
            total: n,
            done,
            results,
        }
    }

    fn done(&self) -> usize {
        self.done.load(Ordering::Acquire)
    }

    /// Waits (in real time, at most 10 s, failing beyond) until every call has ended or waits
    /// on the clock; then how many have ended.
    async fn settle(&self) -> usize {
        for _ in 0..10_000 {
            let done = self.done();
            if done + self.clock.sleepers() == self.total {
                // Seen twice apart, so that a call between two steps is not missed.
                tokio::time::sleep(Duration::from_millis(1)).await;
                if self.done() == done && done + self.clock.sleepers() == self.total {
                    return done;
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!(
            "calls neither ended nor waited on the clock: {} done, {} waiting of {}",
            self.done(),
            self.clock.sleepers(),
            self.total
        );
    }

    /// Advances the clock by `step` whenever every call that has not ended waits on it, until
    /// all have ended; the clock time that took.
    async fn drive(&self, step: Duration) -> Duration {
        let from = self.clock.now();
        while self.settle().await < self.total {
            self.clock.advance(step);
        }
        self.clock.now() - from
    }

    fn statuses(&self) -> Vec<Result<StatusCode, String>> {
        self.results.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttle_on_a_manual_clock_waits_until_the_test_advances_it() {
    let clock = ManualClock::starting_at(START);
    let up = Upstream::fixed_window(clock.clone(), 1_000).await;
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    // One call every 500 ms, no burst beyond one.
    let limiter = RateLimiter::new(store, Gcra::new(Quota::per_second(2)).unwrap()).unwrap();
    let layer = ThrottleLayer::new(limiter, one_key)
        .max_wait(Duration::from_secs(60))
        .unwrap();
    let calls = Calls::start(&clock, &client(layer), &up, 6);
    let first = calls.settle().await;
    assert!((1..6).contains(&first), "{first} went at once");
    // Each 500 ms of the test's clock lets exactly one more go.
    for n in first + 1..=6 {
        clock.advance(Duration::from_millis(500));
        assert_eq!(calls.settle().await, n);
    }
    assert!(calls.statuses().iter().all(|r| r == &Ok(StatusCode::OK)));
    assert_eq!(up.ok.load(Ordering::Relaxed), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_maximum_wait_is_counted_on_the_manual_clock() {
    let clock = ManualClock::starting_at(START);
    let up = Upstream::fixed_window(clock.clone(), 1_000).await;
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let limiter = RateLimiter::new(store, Gcra::new(Quota::per_second(1)).unwrap()).unwrap();
    let layer = ThrottleLayer::new(limiter, one_key)
        .max_wait(Duration::from_millis(1_500))
        .unwrap();
    let svc = client(layer);
    assert_eq!(svc.clone().oneshot(up.get()).await.unwrap(), StatusCode::OK);
    // Two more: the first keeps the place 1 s away, within the maximum wait, and waits for
    // the clock; the second's place is 2 s away, beyond the maximum wait on the test's clock
    // (while next to no real time has passed): it fails at once, without waiting.
    let calls = Calls::start(&clock, &svc, &up, 2);
    assert_eq!(calls.settle().await, 1);
    assert_eq!(clock.sleepers(), 1);
    let statuses = calls.statuses();
    assert!(
        statuses
            .iter()
            .any(|r| r.as_ref().is_err_and(|e| e.contains("maximum wait"))),
        "{statuses:?}"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(calls.settle().await, 2);
    let statuses = calls.statuses();
    assert!(statuses.contains(&Ok(StatusCode::OK)), "{statuses:?}");
    assert_eq!(up.ok.load(Ordering::Relaxed), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_throttle_on_a_manual_clock_learns_and_waits_on_it() {
    let clock = ManualClock::starting_at(START);
    let up = Upstream::fixed_window(clock.clone(), 3).await;
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let limiter =
        RateLimiter::new(store.clone(), Gcra::new(Quota::per_second(1_000)).unwrap()).unwrap();
    let layer = ThrottleLayer::new(limiter, one_key)
        .max_wait(Duration::from_secs(60))
        .unwrap()
        .adaptive(store);
    let svc = client(layer.clone());
    // The first call learns the window: 2 left until the next whole second.
    assert_eq!(svc.clone().oneshot(up.get()).await.unwrap(), StatusCode::OK);
    let calls = Calls::start(&clock, &svc, &up, 8);
    let took = calls.drive(Duration::from_millis(10)).await;
    assert!(calls.statuses().iter().all(|r| r == &Ok(StatusCode::OK)));
    assert_eq!(up.limited.load(Ordering::Relaxed), 0);
    assert_eq!(up.ok.load(Ordering::Relaxed), 9);
    // 9 calls at 3 a window: the third window, on the test's clock.
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(layer.adaptive_stats().unwrap().exhausted >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_resets_are_read_against_an_upstream_clock_an_hour_off() {
    for skew in [3_600, -3_600] {
        let clock = ManualClock::starting_at(START);
        let up = Upstream::start(clock.clone(), 3, Reset::Unix { skew }).await;
        let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let limiter =
            RateLimiter::new(store.clone(), Gcra::new(Quota::per_second(1_000)).unwrap()).unwrap();
        let layer = ThrottleLayer::new(limiter, one_key)
            .max_wait(Duration::from_secs(120))
            .unwrap()
            .adaptive(store);
        let svc = client(layer);
        assert_eq!(svc.clone().oneshot(up.get()).await.unwrap(), StatusCode::OK);
        let calls = Calls::start(&clock, &svc, &up, 8);
        let took = calls.drive(Duration::from_millis(10)).await;
        // Ahead, its resets read an hour away would pause every call for `max_pause`; behind,
        // in our past, the exhausted window would be ignored and the calls refused.
        assert_eq!(up.limited.load(Ordering::Relaxed), 0, "skew {skew}");
        assert_eq!(up.ok.load(Ordering::Relaxed), 9, "skew {skew}");
        assert!(took < Duration::from_secs(3), "skew {skew}: {took:?}");
    }
}

/// Eight callers in one process share 20 calls a second (one at a time): each waits its turn
/// in the order it asked, about 8 / 20 = 0.4 s, never overtaken by callers that came later.
/// With a maximum wait too short for the line, the calls at its back fail saying how long they
/// waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_of_one_key_wait_their_turn_in_the_order_they_asked() {
    let clock = ManualClock::starting_at(START);
    let up = Upstream::fixed_window(clock.clone(), 1_000).await;
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let limiter =
        RateLimiter::new(store, Gcra::new(Quota::per_second(20).burst(1)).unwrap()).unwrap();
    let layer = ThrottleLayer::new(limiter, one_key)
        .max_wait(Duration::from_secs(60))
        .unwrap();
    let svc = client(layer);
    let waits = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicUsize::new(0));
    for _ in 0..8 {
        let (svc, clock, waits, done) = (svc.clone(), clock.clone(), waits.clone(), done.clone());
        let url = up.get().uri().clone();
        tokio::spawn(async move {
            for _ in 0..10 {
                let asked = clock.now();
                let req = Request::get(url.clone()).body(Empty::new()).unwrap();
                assert_eq!(svc.clone().oneshot(req).await.unwrap(), StatusCode::OK);
                waits.lock().unwrap().push(clock.now() - asked);
            }
            done.fetch_add(1, Ordering::AcqRel);
        });
    }
    let calls = Calls {
        clock: clock.clone(),
        total: 8,
        done,
        results: Arc::default(),
    };
    calls.drive(Duration::from_millis(10)).await;
    let waits = waits.lock().unwrap().clone();
    assert_eq!(waits.len(), 80);
    // Past the first round, every call waits for the seven ahead of it: 8 x 50 ms.
    let longest = waits.iter().max().unwrap();
    assert!(*longest <= Duration::from_millis(400 + 20), "{waits:?}");
    assert_eq!(up.ok.load(Ordering::Relaxed), 80);

    // Twelve callers at once with 250 ms to wait: the first (at once) and the five behind it
    // (50 ms apart) go; the others fail, saying they waited.
    let layer = ThrottleLayer::new(
        RateLimiter::new(
            MemoryStore::builder().clock(clock.clone()).build().unwrap(),
            Gcra::new(Quota::per_second(20).burst(1)).unwrap(),
        )
        .unwrap(),
        one_key,
    )
    .max_wait(Duration::from_millis(250))
    .unwrap();
    let calls = Calls::start(&clock, &client(layer), &up, 12);
    calls.drive(Duration::from_millis(10)).await;
    let statuses = calls.statuses();
    let ok = statuses
        .iter()
        .filter(|r| r == &&Ok(StatusCode::OK))
        .count();
    assert_eq!(ok, 6, "{statuses:?}");
    for failed in statuses.iter().filter_map(|r| r.as_ref().err()) {
        assert!(failed.contains("rate limit: waited "), "{failed}");
    }
}
