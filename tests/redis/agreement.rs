//! MemoryStore and RedisStore make the same decisions for the same random sequences of
//! (time step, cost, refund), for every algorithm (a property test against real Redis): each
//! algorithm's check script alone and in its batch form (a batching store), and its refund
//! script; and the places delayed checks keep (with the bound they hold). (Reservations, which no public call makes at an explicit time, are held to the
//! in-memory twin in `src/store/redis/reserve.rs`.)

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use crate::servers::RedisServer;
use proptest::{prelude::*, test_runner::TestRunner};
use tower_redis_ratelimit::algorithm::FixedWindow;
use tower_redis_ratelimit::{
    algorithm::Algorithm,
    rate_limit::{Decision, Delay},
    store::redis::Batching,
    Gcra, MemoryStore, Quota, RateLimiter, RedisStore, SlidingWindow, TokenBucket,
};

const T0: u64 = 1_700_000_000_000_000;

/// How much slower than real time the simulated time of the cases compared on Redis runs:
/// their periods and steps are this many times the brisk cases' (a minute becomes an hour),
/// so a unit's state (55 s brisk at the shortest) holds for most of an hour of Redis's real
/// time, and a key left a moment to live (a fixed window about to end, a charge given back
/// to end just after the case's time) comes 60 times more rarely: Redis expires keys on its
/// own clock, not on the explicit times (see `RateLimiter::check_at`), so a stall of the
/// machine before the next call makes Redis, not the twin, find such a key rested. Not
/// more: the delayed cases wait at most an hour (the longest delay a limiter takes), and
/// 3,600 times the slowest cases' times would come within years of 2^52 µs.
const SLOW: u64 = 60;

#[derive(Debug, Clone)]
struct Case {
    limit: u32,
    burst: u32,
    period_s: u64,
    /// (time step in µs, cost, before the check: the refund of the allowed decision this many
    /// back, if any)
    steps: Vec<(u64, u32, Option<usize>)>,
}

fn cases() -> impl Strategy<Value = Case> {
    cases_slowed(1)
}

/// [`cases`] with periods and steps `slow` times as long (see [`SLOW`]).
fn cases_slowed(slow: u64) -> impl Strategy<Value = Case> {
    // Periods of minutes: Redis expires keys on its own (real) clock, so the TTLs must outlast
    // a test case even though the explicit timeline moves faster.
    (
        1u32..12,
        1u32..16,
        prop::sample::select(vec![600 * slow, 3_600 * slow]),
    )
        .prop_flat_map(|(limit, burst, period_s)| {
            let interval = period_s * 1_000_000 / u64::from(limit);
            let step = prop_oneof![
                3 => Just(0u64),
                5 => 0..interval,
                2 => 0..3 * interval,
                1 => Just(period_s * 1_000_000),
            ];
            let max_cost = limit.max(burst) + 2;
            let refund = prop_oneof![3 => Just(None), 1 => (0usize..4).prop_map(Some)];
            let steps = prop::collection::vec((step, 1..=max_cost, refund), 1..60);
            steps.prop_map(move |steps| Case {
                limit,
                burst,
                period_s,
                steps,
            })
        })
}

static CASE_ID: AtomicU64 = AtomicU64::new(0);

/// The stores of a run: one Redis store sending each call alone, one batching (a check on it
/// runs the batch form of its algorithm's script).
struct Stores {
    single: RedisStore,
    batched: RedisStore,
}

async fn agree<A: Algorithm>(redis: &Stores, make: impl Fn() -> A, case: &Case) {
    agree_from(T0, redis, make, case).await;
}

/// [`agree`] with the case's timeline starting at `t0`.
async fn agree_from<A: Algorithm>(t0: u64, redis: &Stores, make: impl Fn() -> A, case: &Case) {
    let prefix = format!("agree{}", CASE_ID.fetch_add(1, Ordering::Relaxed));
    let on = |store: &RedisStore, prefix: &str| {
        RateLimiter::builder(store.clone(), make())
            .prefix(prefix)
            .store_timeout(Duration::from_secs(5))
            .build()
            .unwrap()
    };
    let on_redis = on(&redis.single, &prefix);
    let batched = on(&redis.batched, &format!("{prefix}b"));
    let in_memory = RateLimiter::builder(MemoryStore::new(), make())
        .prefix(&prefix)
        .build()
        .unwrap();
    let mut now = t0;
    // Allowed decisions not given back yet: (Redis, batched, in memory).
    let mut held: Vec<[Decision; 3]> = Vec::new();
    for (i, &(step, cost, refund)) in case.steps.iter().enumerate() {
        now += step;
        if let Some(back) = refund.filter(|&b| b < held.len()) {
            let [mut r, mut b, mut m] = held.remove(held.len() - 1 - back);
            let r = on_redis.refund_at("k", &mut r, now).await.unwrap();
            let b = batched.refund_at("k", &mut b, now).await.unwrap();
            let m = in_memory.refund_at("k", &mut m, now).await.unwrap();
            assert_eq!(
                (r, b),
                (m, m),
                "refund before step {i} of {case:?} from {t0}"
            );
        }
        let r = on_redis.check_at("k", cost, now).await.unwrap();
        let b = batched.check_at("k", cost, now).await.unwrap();
        let m = in_memory.check_at("k", cost, now).await.unwrap();
        assert_eq!(r, m, "step {i} of {case:?} from {t0}");
        assert_eq!(b, m, "step {i} of {case:?} from {t0}, batched");
        if m.allowed {
            held.push([r, b, m]);
        }
    }
}

fn run(name: &str, check: impl Fn(&Stores, &Case) + Send) {
    let redis = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(async {
        Stores {
            single: redis.store().await,
            batched: redis.store().await.with_batching(Batching::new()).unwrap(),
        }
    });
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let _guard = rt.enter();
    runner
        .run(&cases_slowed(SLOW), |case| {
            check(&store, &case);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
}

#[test]
fn gcra_memory_matches_redis() {
    run("gcra", |store, case| {
        let q = Quota::new(case.limit, Duration::from_secs(case.period_s)).burst(case.burst);
        tokio::runtime::Handle::current().block_on(agree(store, || Gcra::new(q).unwrap(), case));
    });
}

#[test]
fn token_bucket_memory_matches_redis() {
    run("token bucket", |store, case| {
        let q = Quota::new(case.limit, Duration::from_secs(case.period_s)).burst(case.burst);
        tokio::runtime::Handle::current().block_on(agree(
            store,
            || TokenBucket::new(q).unwrap(),
            case,
        ));
    });
}

#[test]
fn sliding_window_memory_matches_redis() {
    run("sliding window", |store, case| {
        let q = Quota::new(case.limit, Duration::from_secs(case.period_s));
        tokio::runtime::Handle::current().block_on(agree(
            store,
            || SlidingWindow::new(q).unwrap(),
            case,
        ));
    });
}

#[test]
fn fixed_window_memory_matches_redis() {
    run("fixed window", |store, case| {
        let q = Quota::new(case.limit, Duration::from_secs(case.period_s));
        tokio::runtime::Handle::current().block_on(agree(
            store,
            || FixedWindow::new(q).unwrap(),
            case,
        ));
    });
}

/// Calendar windows cut where the scripts cut them: weeks, months and years over two
/// centuries, each case starting on a random day (often near a month's end) and stepping by
/// up to 40 days, so that checks cross week, month and year ends (leap years included).
#[test]
fn calendar_windows_in_memory_match_redis() {
    use tower_redis_ratelimit::algorithm::Calendar;
    const DAY: u64 = 86_400_000_000;
    let redis = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stores = rt.block_on(async {
        Stores {
            single: redis.store().await,
            batched: redis.store().await.with_batching(Batching::new()).unwrap(),
        }
    });
    // From 1970 to 2099; a start in the last days of a month half of the time.
    let start = prop_oneof![
        (0u64..47_000).prop_map(|d| d * DAY),
        (0u64..1_550, 27u64..32, 0..DAY).prop_map(|(m, d, t)| (m * 30 + d) * DAY + t),
    ];
    let step = prop_oneof![
        2 => Just(0u64),
        3 => 0..DAY,
        3 => 0..40 * DAY,
        1 => Just(366 * DAY),
    ];
    let steps = prop::collection::vec(
        (
            step,
            1u32..8,
            prop_oneof![3 => Just(None), 1 => (0usize..4).prop_map(Some)],
        ),
        1..30,
    );
    let calendars = prop::sample::select(vec![Calendar::Week, Calendar::Month, Calendar::Year]);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(start, calendars, 1u32..6, steps),
            |(t0, calendar, limit, steps)| {
                let case = Case {
                    limit,
                    burst: limit,
                    period_s: 0,
                    steps,
                };
                let make = || FixedWindow::calendar(calendar, limit).unwrap();
                rt.block_on(agree_from(t0, &stores, make, &case));
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn multi_limit_memory_matches_redis() {
    use tower_redis_ratelimit::algorithm::MultiLimit;
    run("multi-limit", |store, case| {
        let fast = Quota::new(case.limit, Duration::from_secs(case.period_s)).burst(case.burst);
        // A slower second limit, so either can bind.
        let slow = Quota::new(case.limit * 3, Duration::from_secs(case.period_s * 6))
            .burst(case.burst + case.limit);
        let make = || MultiLimit::new([("fast", fast), ("slow", slow)]).unwrap();
        tokio::runtime::Handle::current().block_on(agree(store, make, case));
    });
}

/// GCRA and the token bucket are the same limiter in two representations.
#[test]
fn gcra_matches_token_bucket() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&cases(), |case| {
            let q = Quota::new(case.limit, Duration::from_secs(case.period_s)).burst(case.burst);
            let g = RateLimiter::new(MemoryStore::new(), Gcra::new(q).unwrap()).unwrap();
            let tb = RateLimiter::new(MemoryStore::new(), TokenBucket::new(q).unwrap()).unwrap();
            rt.block_on(async {
                let mut now = T0;
                for &(step, cost, _) in &case.steps {
                    now += step;
                    let a = g.check_at("k", cost, now).await.unwrap();
                    let b = tb.check_at("k", cost, now).await.unwrap();
                    assert_eq!(a, b, "{case:?}");
                }
            });
            Ok(())
        })
        .unwrap();
}

/// Admissions that waited, over every case.
static DELAYED: AtomicU64 = AtomicU64::new(0);

/// A case of delayed checks: its limit and steps, and the longest wait in emission intervals.
fn delayed_cases() -> impl Strategy<Value = (Case, u64)> {
    (cases(), 1u64..12)
}

/// Checks `case` under a delay of `intervals` emission intervals (at explicit times: each
/// request's place kept, not waited for) on Redis and in memory, for GCRA and the token
/// bucket: the four agree on every decision and every wait, and the admissions, each at its
/// time (`now + delayed`), never exceed the bound of the limit in any window: the burst plus
/// the units its rate brings in the window.
async fn delayed_agree(redis: &RedisStore, case: &Case, intervals: u64) {
    let q = Quota::new(case.limit, Duration::from_secs(case.period_s)).burst(case.burst);
    let period_us = case.period_s * 1_000_000;
    // At most an hour, the longest delay.
    let delay_us = (intervals * period_us / u64::from(case.limit) / 2).min(3_600_000_000);
    let delay = Duration::from_micros(delay_us);
    let prefix = format!("delay{}", CASE_ID.fetch_add(1, Ordering::Relaxed));
    let redis_gcra = RateLimiter::builder(redis.clone(), Gcra::new(q).unwrap())
        .prefix(&prefix)
        .store_timeout(Duration::from_secs(5))
        .delay(Delay::up_to(delay))
        .build()
        .unwrap();
    let redis_bucket = RateLimiter::builder(redis.clone(), TokenBucket::new(q).unwrap())
        .prefix(&prefix)
        .store_timeout(Duration::from_secs(5))
        .delay(Delay::up_to(delay))
        .build()
        .unwrap();
    let memory_gcra = RateLimiter::builder(MemoryStore::new(), Gcra::new(q).unwrap())
        .delay(Delay::up_to(delay))
        .build()
        .unwrap();
    let memory_bucket = RateLimiter::builder(MemoryStore::new(), TokenBucket::new(q).unwrap())
        .delay(Delay::up_to(delay))
        .build()
        .unwrap();
    let mut now = T0;
    let mut admitted: Vec<(u64, u32)> = Vec::new();
    for (i, &(step, cost, _)) in case.steps.iter().enumerate() {
        now += step;
        let m = memory_gcra.check_at("k", cost, now).await.unwrap();
        let r = redis_gcra.check_at("k", cost, now).await.unwrap();
        let rb = redis_bucket.check_at("k", cost, now).await.unwrap();
        let mb = memory_bucket.check_at("k", cost, now).await.unwrap();
        let what = format!("step {i} of {case:?} delayed up to {delay:?}");
        assert_eq!(r, m, "GCRA, Redis and memory: {what}");
        assert_eq!(
            (rb.allowed, rb.delayed, rb.retry_after),
            (m.allowed, m.delayed, m.retry_after),
            "the token bucket and GCRA, in Redis: {what}"
        );
        assert_eq!(rb, mb, "token bucket, Redis and memory: {what}");
        assert!(m.delayed <= delay, "waits beyond the delay: {what}");
        if m.allowed {
            if m.delayed > Duration::ZERO {
                DELAYED.fetch_add(1, Ordering::Relaxed);
            }
            admitted.push((now + m.delayed.as_micros() as u64, cost));
        } else if let Some(retry) = m.retry_after {
            // Retried then, the request waits no longer than the delay.
            assert!(retry > Duration::ZERO, "{what}");
        }
    }
    for (i, &(from, _)) in admitted.iter().enumerate() {
        let mut units = 0u64;
        for &(at, cost) in &admitted[i..] {
            assert!(at >= from, "admissions out of order: {admitted:?}");
            units += u64::from(cost);
            let brought = (at - from) * u64::from(case.limit) / period_us;
            assert!(
                units <= u64::from(case.burst) + brought,
                "{units} units admitted in [{from}, {at}] under {case:?} delayed up to {delay:?}: {admitted:?}"
            );
        }
    }
}

#[test]
fn delayed_admissions_agree_and_hold_the_bound() {
    let redis = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(redis.store());
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&delayed_cases(), |(case, intervals)| {
            rt.block_on(delayed_agree(&store, &case, intervals));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("delays: {e}"));
    let delayed = DELAYED.load(Ordering::Relaxed);
    assert!(
        delayed >= 50,
        "only {delayed} admissions waited in all the cases"
    );
}
