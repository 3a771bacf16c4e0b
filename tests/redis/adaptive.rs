//! The adaptive outbound throttle against a real upstream (an axum server on loopback with
//! its own limit, which its clients are not told), three client instances sharing one real
//! Redis: few 429s and most of what the upstream allows, for each header style; next to a
//! throttle configured too high and no throttle at all. Also: the upstream lowering its
//! limit mid-run, hostile headers, and the `outbound` example run as a user runs it.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use crate::servers::{
    upstream::{Fixed, Style, Upstream},
    RedisServer,
};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tower::{util::BoxCloneService, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    throttle::AdaptiveStats, throttle::ThrottleLayer, Gcra, Quota, RateLimiter, RedisStore,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Svc = BoxCloneService<Request<Empty<Bytes>>, StatusCode, BoxError>;

/// The upstream's limit: 30 a second, in windows of one second.
const LIMIT: u32 = 30;
const WINDOW: Duration = Duration::from_secs(1);

fn http() -> Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>()
}

/// One client instance: its own Redis connection, a configured limit `per_second`, and
/// learning from the upstream when `adaptive`. All instances share the key `upstream`.
async fn instance(
    redis: &RedisServer,
    prefix: &str,
    per_second: u32,
    adaptive: bool,
) -> (
    Svc,
    ThrottleLayer<impl tower_redis_ratelimit::KeyExtractor, Gcra>,
) {
    let store: RedisStore = redis.store().await;
    let limiter = RateLimiter::builder(
        store.clone(),
        Gcra::new(Quota::per_second(per_second)).unwrap(),
    )
    .prefix(prefix)
    .store_timeout(Duration::from_secs(2))
    .build()
    .unwrap();
    let mut layer = ThrottleLayer::new(limiter, |_: &http::request::Parts| {
        Some("upstream".to_owned())
    })
    .max_wait(Duration::from_secs(10))
    .unwrap();
    if adaptive {
        layer = layer.adaptive(store);
    }
    let svc = ServiceBuilder::new().layer(layer.clone()).service(http());
    (
        BoxCloneService::new(svc.map_response(|r| r.status())),
        layer,
    )
}

fn plain() -> Svc {
    BoxCloneService::new(http().map_response(|r| r.status()).map_err(BoxError::from))
}

/// What a run gave, at the upstream.
#[derive(Debug)]
struct Run {
    ok: u64,
    limited: u64,
    failed: u64,
    /// Fraction of the upstream's answers that were 429.
    limited_fraction: f64,
    /// 200s as a fraction of what the upstream allowed, per window, over the windows between
    /// the run's first and its last.
    throughput: f64,
    secs: f64,
}

/// `per_instance` GET requests from each instance, `concurrency` in flight each, starting at
/// a window's start.
async fn run(up: &Upstream, instances: &[Svc], per_instance: u64, concurrency: u64) -> Run {
    up.until_next_window().await;
    let (ok0, limited0) = (up.ok(), up.limited());
    let windows_before = up.windows().len();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for svc in instances {
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        for _ in 0..concurrency {
            let (svc, next, url) = (svc.clone(), next.clone(), up.url());
            tasks.push(tokio::spawn(async move {
                let mut failed = 0;
                while next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < per_instance {
                    let req = Request::get(&url).body(Empty::new()).unwrap();
                    if svc.clone().oneshot(req).await.is_err() {
                        failed += 1;
                    }
                }
                failed
            }));
        }
    }
    let mut failed = 0;
    for t in tasks {
        failed += t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    let (ok, limited) = (up.ok() - ok0, up.limited() - limited0);
    // The windows the run spanned, but its first (before anything was learned) and its
    // last (what was left over): the steady state, in 200s per window of the limit.
    let windows = up.windows();
    let run_windows = &windows[windows_before.min(windows.len())..];
    let inner = if run_windows.len() >= 3 {
        &run_windows[1..run_windows.len() - 1]
    } else {
        run_windows
    };
    let inner_ok: u64 = inner.iter().map(|w| w.1).sum();
    let limit = f64::from(up.limit.load(std::sync::atomic::Ordering::SeqCst));
    let throughput = inner_ok as f64 / (limit * inner.len().max(1) as f64);
    Run {
        ok,
        limited,
        failed,
        limited_fraction: limited as f64 / (ok + limited).max(1) as f64,
        throughput,
        secs,
    }
}

fn total(stats: &[Option<AdaptiveStats>], f: impl Fn(&AdaptiveStats) -> u64) -> u64 {
    stats.iter().flatten().map(f).sum()
}

/// Three instances learning from each header style: under 2% of the answers are 429, and
/// at least 85% of what the upstream allows gets through. The same against a throttle
/// configured at 100 a second without adaptation, and against no throttle, for the table in
/// BENCHMARKS.md (printed with `--nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_learn_the_upstreams_limit_in_each_header_style() {
    let redis = RedisServer::start();
    println!("| client setup | upstream headers | answers 429 | throughput of allowed | 200s | 429s | s |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (i, style) in [Style::Ietf, Style::Draft, Style::XEpoch]
        .into_iter()
        .enumerate()
    {
        let up = Upstream::start(style, LIMIT, WINDOW).await;
        let mut svcs = Vec::new();
        let mut layers = Vec::new();
        for _ in 0..3 {
            // Configured far above the upstream's limit: only what is learned holds.
            let (svc, layer) = instance(&redis, &format!("ad{i}"), 10_000, true).await;
            svcs.push(svc);
            layers.push(layer);
        }
        let r = run(&up, &svcs, 60, 4).await;
        let stats: Vec<_> = layers.iter().map(|l| l.adaptive_stats()).collect();
        println!(
            "| 3 instances, adaptive | {style:?} | {:.1}% | {:.0}% | {} | {} | {:.1} |",
            100.0 * r.limited_fraction,
            100.0 * r.throughput,
            r.ok,
            r.limited,
            r.secs
        );
        assert_eq!(r.failed, 0, "{style:?}: {r:?}");
        assert_eq!(r.ok + r.limited, 180, "{style:?}: {r:?}");
        assert!(r.limited_fraction < 0.02, "{style:?}: {r:?}");
        assert!(r.throughput >= 0.85, "{style:?}: {r:?}");
        // Every answer taught something; the calls are paced below the upstream's rate, so its
        // window need never run out.
        assert!(total(&stats, |s| s.learned) > 100, "{style:?}: {stats:?}");
    }
    // The same upstream, without adaptation: configured too high, and no throttle.
    let up = Upstream::start(Style::Ietf, LIMIT, WINDOW).await;
    let mut too_high = Vec::new();
    for _ in 0..3 {
        too_high.push(instance(&redis, "high", 100, false).await.0);
    }
    let high = run(&up, &too_high, 60, 4).await;
    let none = run(&up, &[plain(), plain(), plain()], 60, 4).await;
    for (name, r) in [
        ("3 instances, 100/s configured, not adaptive", &high),
        ("no throttle", &none),
    ] {
        println!(
            "| {name} | Ietf | {:.1}% | {:.0}% | {} | {} | {:.1} |",
            100.0 * r.limited_fraction,
            100.0 * r.throughput,
            r.ok,
            r.limited,
            r.secs
        );
    }
    assert!(high.limited_fraction > 0.3, "{high:?}");
    assert!(none.limited_fraction > 0.5, "{none:?}");
}

/// The upstream lowers its limit mid-run: the clients follow within one window (no 429 in
/// the windows after the one where it changed). The limit is lowered 100 ms into a window,
/// so that answers telling it come back within that window: lowered in its last
/// milliseconds, no answer may come before the next window starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_follow_a_lower_limit_within_one_window() {
    let redis = RedisServer::start();
    let up = Upstream::start(Style::Ietf, LIMIT, WINDOW).await;
    let mut svcs = Vec::new();
    for _ in 0..3 {
        svcs.push(instance(&redis, "lower", 10_000, true).await.0);
    }
    let limit = Arc::clone(&up.limit);
    let lowered_at = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        // The upstream's windows are whole seconds of the wall clock.
        let into = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_micros();
        let to_next = u64::from(1_000_000 - into);
        tokio::time::sleep(Duration::from_micros(to_next + 100_000)).await;
        limit.store(LIMIT / 3, std::sync::atomic::Ordering::SeqCst);
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    });
    let r = run(&up, &svcs, 50, 4).await;
    let changed = lowered_at.await.unwrap();
    let after: Vec<_> = up.windows().into_iter().filter(|w| w.0 > changed).collect();
    assert!(
        after.len() >= 2,
        "the run ended too soon after the change: {after:?}"
    );
    assert!(
        after
            .iter()
            .all(|w| w.2 == 0 && w.1 <= u64::from(LIMIT / 3)),
        "429s or more than the new limit after the change window: {after:?} ({r:?})"
    );
}

/// An upstream sending hostile values (negative counts, a reset years away, a `Retry-After`
/// in the year 9999): they are ignored or cut to `max_pause`, counted, and never pause the
/// clients for longer than that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_headers_are_ignored_or_capped() {
    let redis = RedisServer::start();
    let up = Upstream::start(Style::Hostile, 5, WINDOW).await;
    let store = redis.store().await;
    let limiter =
        RateLimiter::builder(store.clone(), Gcra::new(Quota::per_second(10_000)).unwrap())
            .prefix("hostile")
            .build()
            .unwrap();
    let layer = ThrottleLayer::new(limiter, |_: &http::request::Parts| Some("up".to_owned()))
        .adaptive(store)
        .max_pause(Duration::from_millis(300))
        .unwrap()
        .max_wait(Duration::from_secs(5))
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(http());
    let started = Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let req = Request::get(up.url()).body(Empty::new()).unwrap();
        statuses.push(svc.clone().oneshot(req).await.unwrap().status().as_u16());
    }
    let elapsed = started.elapsed();
    let stats = layer.adaptive_stats().unwrap();
    assert!(stats.ignored >= 12, "{stats:?}");
    assert!(stats.capped >= 1, "{stats:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    // Each 429 pauses at most max_pause (300 ms): 12 calls end well within 12 x 300 ms + slack.
    assert!(elapsed < Duration::from_secs(8), "{elapsed:?} {statuses:?}");
}

/// With `retry_rate_limited`, a GET the upstream answered 429 is sent again after the pause
/// its `Retry-After` said (and every instance pauses); a POST is not sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_get_is_sent_again_after_the_pause() {
    let redis = RedisServer::start();
    let up = Upstream::start(Style::Silent, 2, WINDOW).await;
    let store = redis.store().await;
    let limiter =
        RateLimiter::builder(store.clone(), Gcra::new(Quota::per_second(10_000)).unwrap())
            .prefix("retry")
            .build()
            .unwrap();
    let layer = ThrottleLayer::new(limiter, |_: &http::request::Parts| Some("up".to_owned()))
        .adaptive(store.clone())
        .max_wait(Duration::from_secs(5))
        .unwrap()
        .retry_rate_limited();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(http());
    up.until_next_window().await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let req = Request::get(up.url()).body(Empty::new()).unwrap();
        statuses.push(svc.clone().oneshot(req).await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200]);
    let stats = layer.adaptive_stats().unwrap();
    assert!(stats.retried >= 1 && stats.rate_limited >= 1, "{stats:?}");
    assert_eq!(up.ok(), 4);
    // A POST answered 429 comes back as it is: not sent twice. (Under a key of its own: the
    // first one learned the upstream's rate from its 429 and paces its calls below it.)
    let limiter =
        RateLimiter::builder(store.clone(), Gcra::new(Quota::per_second(10_000)).unwrap())
            .prefix("retry-post")
            .build()
            .unwrap();
    let layer = ThrottleLayer::new(limiter, |_: &http::request::Parts| Some("up".to_owned()))
        .adaptive(store)
        .max_wait(Duration::from_secs(5))
        .unwrap()
        .retry_rate_limited();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(http());
    up.until_next_window().await;
    let mut posts = Vec::new();
    for _ in 0..3 {
        let req = Request::post(up.url()).body(Empty::new()).unwrap();
        posts.push(svc.clone().oneshot(req).await.unwrap().status().as_u16());
    }
    assert_eq!(posts, [200, 200, 429]);
    assert_eq!(layer.adaptive_stats().unwrap().retried, 0);
}

/// An upstream that refuses every call (429 or 503) but says to come back at once, in each
/// way a header can say it: `Retry-After: 0` or a date in the past, a `RateLimit` window of
/// none left resetting now, the earlier drafts' and the `X-RateLimit-*` headers with a reset
/// of 0 or in the past. Each answer still pauses every instance for `DEFAULT_429_PAUSE`, as a
/// retry waits: the pause is in the shared state (exactly, on the in-memory store's stopped
/// clock; most of it still ahead on Redis), and the calls made meanwhile never reach the
/// upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_saying_to_come_back_at_once_still_pauses_every_instance() {
    use std::time::{SystemTime, UNIX_EPOCH};
    use tower_redis_ratelimit::{
        store::memory::ManualClock, store::UpstreamStore, throttle::ThrottleError,
        throttle::DEFAULT_429_PAUSE, MemoryStore,
    };

    let redis = RedisServer::start();
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3_600);
    let past_date = httpdate::fmt_http_date(an_hour_ago);
    let past_unix = an_hour_ago
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let (too_many, unavailable) = (
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::SERVICE_UNAVAILABLE,
    );
    let forms: Vec<(StatusCode, Vec<(&str, &str)>)> = vec![
        (too_many, vec![("retry-after", "0")]),
        (too_many, vec![("retry-after", &past_date)]),
        (unavailable, vec![("retry-after", "0")]),
        (unavailable, vec![("retry-after", &past_date)]),
        (too_many, vec![("ratelimit", "\"x\";r=0;t=0")]),
        (
            too_many,
            vec![("ratelimit", "\"x\";r=0;t=0"), ("retry-after", "0")],
        ),
        (
            too_many,
            vec![("ratelimit-remaining", "0"), ("ratelimit-reset", "0")],
        ),
        (
            too_many,
            vec![("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "0")],
        ),
        (
            too_many,
            vec![
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", &past_unix),
            ],
        ),
    ];
    let mut problems = Vec::new();
    for (form, (status, headers)) in forms.iter().enumerate() {
        for on_redis in [false, true] {
            let label = format!(
                "{status} {headers:?} on {}",
                if on_redis { "redis" } else { "memory" }
            );
            let up = Fixed::start(*status, headers).await;
            // The in-memory store's clock stands still: the pause it records is exact.
            let store: Arc<dyn UpstreamStore> = if on_redis {
                Arc::new(redis.store().await)
            } else {
                Arc::new(
                    MemoryStore::builder()
                        .clock(ManualClock::new())
                        .build()
                        .unwrap(),
                )
            };
            // Learning only: the pause is the upstream's alone.
            let name = format!("zero{form}-{}", u8::from(on_redis));
            let layer =
                ThrottleLayer::learning(Arc::clone(&store), &name, |_: &http::request::Parts| {
                    Some("up".to_owned())
                })
                .unwrap()
                // A call that would have to wait fails at once.
                .max_wait(Duration::ZERO)
                .unwrap();
            let svc = ServiceBuilder::new().layer(layer).service(http());

            let req = Request::get(up.url()).body(Empty::new()).unwrap();
            let first = svc.clone().oneshot(req).await.unwrap();
            assert_eq!(first.status(), *status, "{label}");

            // The pause each held-back call was told (the shared state's wait).
            let mut waits = Vec::new();
            let mut not_paused = Vec::new();
            for _ in 0..5 {
                let req = Request::get(up.url()).body(Empty::new()).unwrap();
                match svc.clone().oneshot(req).await {
                    Err(e) => match e.downcast_ref::<ThrottleError>() {
                        Some(ThrottleError::UpstreamPaused { wait, .. }) => waits.push(*wait),
                        _ => not_paused.push(format!("{e}")),
                    },
                    Ok(res) => not_paused.push(format!("{:?}", res.status())),
                }
            }
            let paused = waits.len() == 5
                && waits.iter().all(|&wait| {
                    if on_redis {
                        wait > DEFAULT_429_PAUSE / 2 && wait <= DEFAULT_429_PAUSE
                    } else {
                        wait == DEFAULT_429_PAUSE
                    }
                });
            if !paused || !not_paused.is_empty() || up.calls() != 1 {
                problems.push(format!(
                    "{label}: paused for {waits:?}; {} calls reached the upstream; \
                     calls not held back by the pause: {not_paused:?}",
                    up.calls()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// While the shared store fails, a throttle goes by what this process learned meanwhile: a
/// learn-only throttle (no configured limit to fall back on) whose Redis is gone still holds
/// calls back for the pause the upstream's 429 asked for, instead of letting them all out.
#[tokio::test]
async fn a_learning_throttle_keeps_the_upstreams_pause_while_its_store_fails() {
    use tower_redis_ratelimit::{store::UpstreamStore, throttle::ThrottleError};

    let mut redis = RedisServer::start();
    let store = RedisStore::builder()
        .lazy(true)
        .connect(&redis.url())
        .await
        .unwrap();
    let store: Arc<dyn UpstreamStore> = Arc::new(store);
    redis.kill();
    let up = Fixed::start(StatusCode::TOO_MANY_REQUESTS, &[("retry-after", "30")]).await;
    let layer = ThrottleLayer::learning(Arc::clone(&store), "up", |_: &http::request::Parts| {
        Some("up".to_owned())
    })
    .unwrap()
    .max_wait(Duration::ZERO)
    .unwrap();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(http());
    let req = Request::get(up.url()).body(Empty::new()).unwrap();
    let first = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(first.status(), StatusCode::TOO_MANY_REQUESTS);
    let mut held = 0;
    for _ in 0..5 {
        let req = Request::get(up.url()).body(Empty::new()).unwrap();
        match svc.clone().oneshot(req).await {
            Err(e) => match e.downcast_ref::<ThrottleError>() {
                Some(ThrottleError::UpstreamPaused { wait, .. })
                    if *wait > Duration::from_secs(25) =>
                {
                    held += 1
                }
                _ => panic!("not held back by the upstream's pause: {e}"),
            },
            Ok(res) => panic!("sent while the upstream asked to pause: {}", res.status()),
        }
    }
    assert_eq!((held, up.calls()), (5, 1));
    assert!(layer.adaptive_stats().unwrap().store_errors >= 6);
}

fn retrying(
    store: RedisStore,
    prefix: &str,
    max_pause: Duration,
) -> (
    Svc,
    ThrottleLayer<
        impl tower_redis_ratelimit::KeyExtractor,
        Gcra,
        tower_redis_ratelimit::throttle::RetryIdempotent,
    >,
) {
    let limiter =
        RateLimiter::builder(store.clone(), Gcra::new(Quota::per_second(10_000)).unwrap())
            .prefix(prefix)
            .build()
            .unwrap();
    let layer = ThrottleLayer::new(limiter, |_: &http::request::Parts| Some("up".to_owned()))
        .adaptive(store)
        .max_pause(max_pause)
        .unwrap()
        .max_wait(Duration::from_secs(5))
        .unwrap()
        .retry_rate_limited();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(http());
    (
        BoxCloneService::new(svc.map_response(|r| r.status())),
        layer,
    )
}

/// `Retry-After: 0` on every 429: a request is sent at most three times, a pause apart, not
/// again and again as fast as the upstream answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_retry_after_does_not_make_a_retry_storm() {
    let redis = RedisServer::start();
    let up = Fixed::start(StatusCode::TOO_MANY_REQUESTS, &[("retry-after", "0")]).await;
    let (svc, _) = retrying(redis.store().await, "storm", Duration::from_secs(60));
    let req = Request::get(up.url()).body(Empty::new()).unwrap();
    assert_eq!(
        svc.oneshot(req).await.unwrap(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(up.calls(), 3);
}

/// A 429 whose window outlasts the maximum wait is the answer, not an error (before the
/// fix the retry failed with `UpstreamPaused` and the 429 was lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_that_cannot_be_retried_is_the_answer() {
    let redis = RedisServer::start();
    let up = Fixed::start(
        StatusCode::TOO_MANY_REQUESTS,
        &[("retry-after", "1"), ("ratelimit", "\"a\";r=0;t=30")],
    )
    .await;
    let (svc, _) = retrying(redis.store().await, "kept", Duration::from_secs(60));
    let req = Request::get(up.url()).body(Empty::new()).unwrap();
    assert_eq!(
        svc.oneshot(req).await.unwrap(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(up.calls(), 1);
}

/// The largest `max_pause` (a day) and a `Retry-After` of 19 digits: no panic, and the
/// state in Redis stays readable; a `max_pause` beyond a day is refused when set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_pause_under_the_largest_cap_neither_panics_nor_corrupts() {
    let redis = RedisServer::start();
    let up = Fixed::start(
        StatusCode::TOO_MANY_REQUESTS,
        &[("retry-after", "9999999999999999999")],
    )
    .await;
    let (svc, layer) = retrying(redis.store().await, "huge", Duration::from_secs(86_400));
    for _ in 0..2 {
        let req = Request::get(up.url()).body(Empty::new()).unwrap();
        let _ = svc.clone().oneshot(req).await;
    }
    let stats = layer.adaptive_stats().unwrap();
    assert_eq!(stats.store_errors, 0, "{stats:?}");
    assert!(stats.capped >= 1, "{stats:?}");
}
