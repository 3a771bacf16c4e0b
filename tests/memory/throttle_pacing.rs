//! The outbound throttle against each kind of upstream limit and each way of telling it, on a
//! test's clock: three throttles that only learn (three instances, each with its own callers'
//! lines) share one `MemoryStore` on a [`ManualClock`], eight calls in flight each, against an
//! axum upstream on loopback that reads the same clock. The clock moves only when every call
//! waits on it, so what is measured (the upstream's use, its 429s, each call's wait, each
//! instance's share) is the throttle's doing, never the machine's speed.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::{Duration, UNIX_EPOCH},
};

use axum::{response::IntoResponse, routing::any, Router};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, StatusCode};
use http_body_util::Empty;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tower::{util::BoxCloneService, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{store::memory::ManualClock, throttle::ThrottleLayer, MemoryStore};

use crate::upstream_limits::{Kind, Limits, Style};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Svc = BoxCloneService<Request<Empty<Bytes>>, StatusCode, BoxError>;

/// A whole second, so that fixed windows align with the clock's start.
const START: Duration = Duration::from_secs(1_700_000_000);
/// The upstream's rate: 40 calls a second (1 s windows), as the targets say.
const QUOTA: u64 = 40;
const INSTANCES: usize = 3;
/// The upstream's window: calls that asked within it are not held to the waiting target.
const WARM_UP: Duration = Duration::from_secs(1);
const IN_FLIGHT: usize = 8;

/// An upstream on loopback answering by `limits` at the time of `clock`, with its `Date`.
struct Upstream {
    addr: SocketAddr,
    limits: Arc<Mutex<Limits>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    async fn start(clock: ManualClock, limits: Limits) -> Self {
        let limits = Arc::new(Mutex::new(limits));
        let l = limits.clone();
        let app = Router::new().route(
            "/",
            any(move || {
                let (clock, limits) = (clock.clone(), l.clone());
                async move {
                    let now = clock.now();
                    let answer = limits.lock().unwrap().call(now);
                    let mut h = HeaderMap::new();
                    for (name, value) in answer.headers {
                        h.insert(HeaderName::from_static(name), value.parse().unwrap());
                    }
                    let date = httpdate::fmt_http_date(UNIX_EPOCH + now);
                    h.insert("date", date.parse().unwrap());
                    let status = if answer.allowed {
                        StatusCode::OK
                    } else {
                        StatusCode::TOO_MANY_REQUESTS
                    };
                    (status, h).into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, limits, task }
    }
}

/// When a call asked to go and when its request was first sent, on the test's clock.
#[derive(Clone)]
struct Asked(Duration, Arc<OnceLock<Duration>>);

/// Calls of every instance that asked to go and were not sent yet: a call's ideal wait is
/// its place among them (itself included) over the upstream's rate.
#[derive(Clone, Default)]
struct Waiting(Arc<AtomicU64>);

/// One instance: a throttle that only learns, on the shared store, noting when each call's
/// request is first sent.
fn instance(store: &MemoryStore, clock: &ManualClock, waiting: &Waiting) -> Svc {
    let (clock, waiting) = (clock.clone(), waiting.clone());
    let http = ServiceBuilder::new()
        .map_request(move |req: Request<Empty<Bytes>>| {
            if let Some(Asked(_, sent)) = req.extensions().get::<Asked>() {
                if sent.set(clock.now()).is_ok() {
                    waiting.0.fetch_sub(1, Ordering::AcqRel);
                }
            }
            req
        })
        .service(Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>());
    let layer = ThrottleLayer::learning(store.clone(), "up", |_: &http::request::Parts| {
        Some("api".to_owned())
    })
    .unwrap()
    .max_wait(Duration::from_secs(30))
    .unwrap()
    .retry_rate_limited();
    let svc = ServiceBuilder::new().layer(layer).service(http);
    BoxCloneService::new(svc.map_response(|r| r.status()))
}

/// What a run measured.
#[derive(Debug)]
struct Run {
    /// Calls the upstream answered 200, and 429.
    upstream_ok: u64,
    upstream_limited: u64,
    /// Per instance: calls answered 200 to their caller, 429 to their caller, failed.
    ok: Vec<u64>,
    limited: Vec<u64>,
    failed: Vec<u64>,
    /// Every sent call's wait, from asking to going, and its ideal (see [`Waiting`]), for the
    /// calls that asked after the first window: before the first answers the throttle
    /// knows nothing of the upstream.
    waits: Vec<(Duration, Duration)>,
    /// Per instance, when its last call was answered.
    finished: Vec<Duration>,
    /// On the test's clock, from the first call asking to the last answer.
    took: Duration,
}

impl Run {
    /// Calls answered 200 over what the upstream's rate allows in the run's time.
    fn use_of_rate(&self) -> f64 {
        self.upstream_ok as f64 / (self.took.as_secs_f64() * QUOTA as f64)
    }

    fn limited_share(&self) -> f64 {
        self.upstream_limited as f64 / (self.upstream_ok + self.upstream_limited) as f64
    }

    /// Calls that waited more than twice their ideal (and a step of the clock).
    fn waited_too_long(&self) -> usize {
        self.waits
            .iter()
            .filter(|(wait, ideal)| *wait > 2 * *ideal + STEP)
            .count()
    }

    fn p99_wait(&self) -> Duration {
        let mut w: Vec<_> = self.waits.iter().map(|w| w.0).collect();
        w.sort();
        w[(w.len() * 99).div_ceil(100) - 1]
    }
}

/// Three instances of eight callers each send `per_instance` calls to an upstream of `kind`
/// telling its limit in `style`, the clock advanced whenever every caller waits on it.
async fn run(kind: Kind, style: Style, per_instance: u64) -> Run {
    let clock = ManualClock::starting_at(START);
    let up = Upstream::start(
        clock.clone(),
        Limits::new(kind, style, QUOTA, Duration::from_secs(1)),
    )
    .await;
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let url = format!("http://{}/", up.addr);
    let done = Arc::new(AtomicUsize::new(0));
    let waits = Arc::new(Mutex::new(Vec::new()));
    let waiting = Waiting::default();
    let mut tallies = Vec::new();
    let mut finished = Vec::new();
    let workers = INSTANCES * IN_FLIGHT;
    for _ in 0..INSTANCES {
        let svc = instance(&store, &clock, &waiting);
        let last_answer = Arc::new(Mutex::new(START));
        finished.push(last_answer.clone());
        let next = Arc::new(AtomicU64::new(0));
        let tally = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
        tallies.push(tally.clone());
        for _ in 0..IN_FLIGHT {
            let (svc, next, tally, url) = (svc.clone(), next.clone(), tally.clone(), url.clone());
            let (clock, done, waits, last) = (
                clock.clone(),
                done.clone(),
                waits.clone(),
                last_answer.clone(),
            );
            let waiting = waiting.clone();
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < per_instance {
                    let place = waiting.0.fetch_add(1, Ordering::AcqRel) + 1;
                    let ideal = Duration::from_secs(place) / QUOTA as u32;
                    let asked = Asked(clock.now(), Arc::default());
                    let req = Request::get(&url)
                        .extension(asked.clone())
                        .body(Empty::new())
                        .unwrap();
                    let slot = match svc.clone().oneshot(req).await {
                        Ok(StatusCode::OK) => 0,
                        Ok(StatusCode::TOO_MANY_REQUESTS) => 1,
                        _ => 2,
                    };
                    tally[slot].fetch_add(1, Ordering::Relaxed);
                    match asked.1.get() {
                        Some(sent) if asked.0 >= START + WARM_UP => {
                            waits.lock().unwrap().push((*sent - asked.0, ideal));
                        }
                        Some(_) => {}
                        None => {
                            waiting.0.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                    let mut last = last.lock().unwrap();
                    *last = (*last).max(clock.now());
                }
                done.fetch_add(1, Ordering::AcqRel);
            });
        }
    }
    drive(&clock, &done, workers).await;
    let (upstream_ok, upstream_limited) = {
        let l = up.limits.lock().unwrap();
        (l.ok, l.limited)
    };
    let get = |i: usize| {
        tallies
            .iter()
            .map(|t| t[i].load(Ordering::Relaxed))
            .collect()
    };
    let finished: Vec<Duration> = finished
        .iter()
        .map(|f| *f.lock().unwrap() - START)
        .collect();
    let took = finished.iter().copied().max().unwrap();
    let waits = std::mem::take(&mut *waits.lock().unwrap());
    Run {
        upstream_ok,
        upstream_limited,
        ok: get(0),
        limited: get(1),
        failed: get(2),
        waits,
        finished,
        took,
    }
}

/// How far the clock moves at a time.
const STEP: Duration = Duration::from_millis(10);

/// Advances `clock` by [`STEP`] whenever each of `workers` has ended or waits on it (seen twice
/// 1 ms apart, so that a call between two steps is not missed), until all have ended. Fails
/// when they neither end nor wait for 10 s of real time.
async fn drive(clock: &ManualClock, done: &AtomicUsize, workers: usize) {
    let mut stuck = 0;
    loop {
        let d = done.load(Ordering::Acquire);
        if d == workers {
            return;
        }
        if d + clock.sleepers() == workers {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if done.load(Ordering::Acquire) == d && d + clock.sleepers() == workers {
                clock.advance(STEP);
                stuck = 0;
                continue;
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        stuck += 1;
        assert!(
            stuck < 10_000,
            "calls neither ended nor waited on the clock: {d} of {workers} done, {} waiting",
            clock.sleepers()
        );
    }
}

/// The targets for an upstream that tells its limit: at least `min_use` of its rate used, at
/// most 1% of calls answered 429 by it and none passed on to a caller, at most 1% of calls
/// waiting more than twice their ideal, each instance done within 25% of the others' time
/// (each sends as many calls: equal shares of the upstream's rate finish together).
fn assert_targets(kind: Kind, style: Style, r: &Run, min_use: f64) {
    let summary = format!(
        "{} / {}: use {:.3}, 429 share {:.4}, p99 wait {:?}, waited over twice the ideal {}, finished {:?}",
        kind.name(),
        style.name(),
        r.use_of_rate(),
        r.limited_share(),
        r.p99_wait(),
        r.waited_too_long(),
        r.finished
    );
    eprintln!("{summary}");
    if std::env::var_os("PACING_DEBUG").is_some() {
        let over: Vec<_> = r.waits.iter().filter(|(w, i)| *w > 2 * *i + STEP).collect();
        eprintln!("over: {over:?}");
    }
    let row = format!("{summary}; {:?} {:?} {:?}", r.ok, r.limited, r.failed);
    assert_eq!(
        r.ok.iter().sum::<u64>(),
        INSTANCES as u64 * PER_INSTANCE,
        "{row}"
    );
    assert!(r.use_of_rate() >= min_use, "{row}");
    assert!(r.limited_share() <= 0.01, "{row}");
    assert_eq!(r.limited.iter().sum::<u64>(), 0, "{row}");
    assert_eq!(r.failed.iter().sum::<u64>(), 0, "{row}");
    assert!(r.waited_too_long() * 100 <= r.waits.len(), "{row}");
    let (first, last) = (
        r.finished.iter().min().unwrap(),
        r.finished.iter().max().unwrap(),
    );
    assert!(first.as_secs_f64() >= 0.75 * last.as_secs_f64(), "{row}");
}

/// Calls per instance: 600 in all, as in the targets.
const PER_INSTANCE: u64 = 200;

async fn told(kind: Kind, style: Style) {
    let r = run(kind, style, PER_INSTANCE).await;
    assert_targets(kind, style, &r, 0.90);
}

macro_rules! rows {
    ($($name:ident: $kind:ident, $style:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            told(Kind::$kind, Style::$style).await;
        }
    )*};
}

rows! {
    a_rolling_window_telling_its_policy_is_used_at_its_rate: Rolling, Ietf;
    a_fixed_window_telling_its_policy_is_used_at_its_rate: Fixed, Ietf;
    a_token_bucket_telling_its_policy_is_used_at_its_rate: TokenBucket, Ietf;
    a_rolling_window_telling_ratelimit_remaining_is_used_at_its_rate: Rolling, Draft;
    a_fixed_window_telling_ratelimit_remaining_is_used_at_its_rate: Fixed, Draft;
    a_token_bucket_telling_ratelimit_remaining_is_used_at_its_rate: TokenBucket, Draft;
    a_rolling_window_telling_x_ratelimit_unix_is_used_at_its_rate: Rolling, XUnix;
    a_fixed_window_telling_x_ratelimit_unix_is_used_at_its_rate: Fixed, XUnix;
    a_token_bucket_telling_x_ratelimit_unix_is_used_at_its_rate: TokenBucket, XUnix;
    a_rolling_window_telling_x_ratelimit_delta_is_used_at_its_rate: Rolling, XDelta;
    a_fixed_window_telling_x_ratelimit_delta_is_used_at_its_rate: Fixed, XDelta;
    a_token_bucket_telling_x_ratelimit_delta_is_used_at_its_rate: TokenBucket, XDelta;
}

/// An upstream that tells nothing but `Retry-After` on its 429s: the throttle learns its rate
/// from the first refused burst (what it answered without a word until its first pause, over
/// the time until the pause ends) and paces at it. That burst's refusals (at most the calls in
/// flight when the limit is first hit) are sent again after the pause, so no caller sees a
/// 429; after it, none. At least 70% of the rate is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_telling_only_retry_after_is_used_at_most_of_its_rate() {
    let (kind, style) = (Kind::RetryAfterOnly, Style::Ietf);
    let r = run(kind, style, PER_INSTANCE).await;
    let row = format!("{r:?}");
    assert_eq!(
        r.ok.iter().sum::<u64>(),
        INSTANCES as u64 * PER_INSTANCE,
        "{row}"
    );
    assert_eq!(
        r.limited.iter().sum::<u64>() + r.failed.iter().sum::<u64>(),
        0,
        "{row}"
    );
    assert!(r.use_of_rate() >= 0.70, "use {}: {row}", r.use_of_rate());
    let in_flight = (INSTANCES * IN_FLIGHT) as u64;
    assert!(r.upstream_limited <= in_flight, "{row}");
    assert!(r.waited_too_long() * 100 <= 3 * r.waits.len(), "{row}");
}
