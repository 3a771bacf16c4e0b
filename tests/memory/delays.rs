//! Delay instead of refusal (`RateLimiterBuilder::delay`) in memory: waits on a `ManualClock`
//! and Tokio's paused time, the bounds of the requests waiting, shadow mode, and the
//! settings that cannot work.

use std::{sync::Arc, time::Duration};

use tower_redis_ratelimit::{
    algorithm::MultiLimit,
    rate_limit::{Delay, Limits, UnitLease},
    store::memory::ManualClock,
    Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter, SlidingWindow, TokenBucket,
};

const SECOND: Duration = Duration::from_secs(1);

/// A limiter of one unit a second, burst 2, delayed up to 10 s, on a store whose time moves
/// only when told.
fn limiter(delay: Delay) -> RateLimiter<Gcra> {
    let store = MemoryStore::builder()
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let gcra = Gcra::new(Quota::per_second(1).burst(2)).unwrap();
    RateLimiter::builder(store, gcra)
        .delay(delay)
        .build()
        .unwrap()
}

/// `n` checks of `key` started at once, each in its own task: their decisions as
/// (allowed, delayed), in the order started.
async fn at_once(
    limiter: &Arc<RateLimiter<Gcra>>,
    key: &'static str,
    n: usize,
) -> Vec<(bool, Duration)> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let limiter = Arc::clone(limiter);
            tokio::spawn(async move { limiter.check(key, 1).await.unwrap() })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        let d = t.await.unwrap();
        out.push((d.allowed, d.delayed));
    }
    out
}

/// Within the burst, at once; beyond it, one unit a second later each, as the key's units
/// come; beyond the delay, refused with the time until a request would wait no longer than
/// the delay.
#[tokio::test(start_paused = true)]
async fn requests_beyond_the_burst_wait_for_their_units_up_to_the_delay() {
    let limiter = Arc::new(limiter(Delay::up_to(Duration::from_millis(2_500))));
    let got = at_once(&limiter, "k", 2).await;
    assert_eq!(got, [(true, Duration::ZERO), (true, Duration::ZERO)]);
    let got = at_once(&limiter, "k", 2).await;
    assert_eq!(got, [(true, SECOND), (true, 2 * SECOND)]);
    // The next unit comes in 3 s: beyond the delay, refused; retried in 0.5 s it would wait
    // 2.5 s.
    let refused = limiter.check("k", 1).await.unwrap();
    assert!(!refused.allowed && refused.delayed.is_zero(), "{refused:?}");
    assert_eq!(refused.retry_after, Some(Duration::from_millis(500)));
}

/// At most the key's burst wait at once on an instance: the others are refused and take
/// nothing (the key's next units stay where they were).
#[tokio::test(start_paused = true)]
async fn the_requests_waiting_for_a_key_are_at_most_its_burst() {
    let limiter = Arc::new(limiter(Delay::up_to(Duration::from_secs(10))));
    at_once(&limiter, "k", 2).await;
    let got = at_once(&limiter, "k", 5).await;
    let waited: Vec<_> = got.iter().filter(|d| d.0).map(|d| d.1).collect();
    assert_eq!(waited, [SECOND, 2 * SECOND], "{got:?}");
    assert_eq!(got.iter().filter(|d| !d.0).count(), 3, "{got:?}");
    // Nothing was taken by the refused: the next request waits 3 s, as the third would have.
    assert_eq!(limiter.check("k", 1).await.unwrap().delayed, 3 * SECOND);
}

/// `waiting_at_most(1)`: one request waits on the instance, whatever its key; another key's
/// request over its limit is refused meanwhile, and waits once the first is served.
#[tokio::test(start_paused = true)]
async fn the_requests_waiting_on_an_instance_are_bounded_in_all() {
    let limiter = Arc::new(limiter(
        Delay::up_to(Duration::from_secs(10)).waiting_at_most(1),
    ));
    at_once(&limiter, "a", 2).await;
    at_once(&limiter, "b", 2).await;
    let first = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move { limiter.check("a", 1).await.unwrap() })
    };
    tokio::task::yield_now().await; // the first waits
    let refused = limiter.check("b", 1).await.unwrap();
    assert!(!refused.allowed, "{refused:?}");
    assert_eq!(first.await.unwrap().delayed, SECOND);
    assert_eq!(limiter.check("b", 1).await.unwrap().delayed, SECOND);
}

/// The token bucket delays as GCRA does.
#[tokio::test(start_paused = true)]
async fn the_token_bucket_delays_as_gcra() {
    let store = MemoryStore::builder()
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let bucket = TokenBucket::new(Quota::per_second(1).burst(2)).unwrap();
    let limiter = RateLimiter::builder(store, bucket)
        .delay(Delay::up_to(Duration::from_secs(2)))
        .build()
        .unwrap();
    let mut waits = Vec::new();
    for _ in 0..5 {
        let d = limiter.check("k", 1).await.unwrap();
        waits.push(d.allowed.then_some(d.delayed));
    }
    // The clock stands still: each wait is counted from the same moment.
    assert_eq!(
        waits,
        [
            Some(Duration::ZERO),
            Some(Duration::ZERO),
            Some(SECOND),
            Some(2 * SECOND),
            None
        ]
    );
}

/// In shadow mode a request over the limit goes on at once: shadow mode never delays.
#[tokio::test(start_paused = true)]
async fn shadow_mode_never_delays() {
    let gcra = Gcra::new(Quota::per_second(1).burst(1)).unwrap();
    let limiter = RateLimiter::builder(MemoryStore::new(), gcra)
        .delay(Delay::up_to(Duration::from_secs(10)))
        .shadow(true)
        .build()
        .unwrap();
    assert!(limiter.check("k", 1).await.unwrap().allowed);
    let over = limiter.check("k", 1).await.unwrap();
    assert!(
        !over.allowed && over.shadow && over.delayed.is_zero(),
        "{over:?}"
    );
}

/// The field a refused setting names.
fn field<T>(built: Result<T, tower_redis_ratelimit::ConfigError>) -> &'static str {
    match built {
        Ok(_) => panic!("accepted"),
        Err(e) => e.field(),
    }
}

#[test]
fn delays_that_cannot_work_are_refused_naming_the_field() {
    let delay = Delay::up_to(SECOND);
    let window = SlidingWindow::new(Quota::per_second(1)).unwrap();
    let built = RateLimiter::builder(MemoryStore::new(), window)
        .delay(delay)
        .build();
    assert_eq!(field(built), "delay");
    let multi = MultiLimit::new([("a", Quota::per_second(1))]).unwrap();
    let built = RateLimiter::builder(MemoryStore::new(), multi)
        .delay(delay)
        .build();
    assert_eq!(field(built), "delay");
    let gcra = || Gcra::new(Quota::per_second(100)).unwrap();
    let leased = RateLimiter::builder(MemoryStore::new(), gcra())
        .lease(UnitLease::up_to(Duration::from_millis(50)))
        .delay(delay)
        .build();
    assert_eq!(field(leased), "delay");
    for (bad, name) in [
        (Delay::up_to(Duration::ZERO), "delay.up_to"),
        (Delay::up_to(Duration::from_secs(3_601)), "delay.up_to"),
        (delay.waiting_at_most(0), "delay.waiting"),
    ] {
        let built = RateLimiter::builder(MemoryStore::new(), gcra())
            .delay(bad)
            .build();
        assert_eq!(field(built), name);
    }
    // Live limits: a window's limits cannot take a delay either.
    let window = SlidingWindow::new(Quota::per_second(1)).unwrap();
    let limiter = RateLimiter::new(MemoryStore::new(), window).unwrap();
    let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-key").unwrap());
    let live = layer.live(Limits::new(Quota::per_second(1)).delay_up_to(SECOND));
    assert_eq!(field(live), "delay");
}

/// Live limits set, change and lift the delay of a running limit.
#[tokio::test(start_paused = true)]
async fn live_limits_set_and_lift_the_delay() {
    let store = MemoryStore::builder()
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let quota = Quota::per_second(1).burst(1);
    let limiter = RateLimiter::new(store, Gcra::new(quota).unwrap()).unwrap();
    let layer = RateLimitLayer::new(limiter.clone(), HeaderKey::new("x-key").unwrap());
    let (_layer, live) = layer.live(Limits::new(quota)).unwrap();
    assert!(limiter.check("k", 1).await.unwrap().allowed);
    assert!(!limiter.check("k", 1).await.unwrap().allowed, "no delay");
    live.replace(Limits::new(quota).delay_up_to(2 * SECOND))
        .unwrap();
    assert_eq!(live.limits().delay(), Some(2 * SECOND));
    assert_eq!(limiter.check("k", 1).await.unwrap().delayed, SECOND);
    live.replace(Limits::new(quota).delay_up_to(Duration::ZERO))
        .unwrap();
    assert!(
        !limiter.check("k", 1).await.unwrap().allowed,
        "the delay lifted"
    );
}
