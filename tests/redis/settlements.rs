//! Settlements: an allowed check's charge (its estimate) settled after the fact to the units
//! its request used, for every algorithm that settles, against a real Redis and in memory:
//! settling down gives units back (at most what the charge still holds), settling up leaves a
//! debt that the next check waits out exactly, settling to the charge changes nothing, hostile
//! figures never panic; and a property test that random interleavings of checks and
//! settlements get the same answers from Redis as from the in-memory twin.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::servers::RedisServer;
use proptest::{prelude::*, test_runner::TestRunner};
use tower_redis_ratelimit::{
    algorithm::{Algorithm, FixedWindow, MultiLimit},
    rate_limit::{Decision, Settled},
    Error, Gcra, MemoryStore, Quota, RateLimiter, RedisStore, SlidingWindow, TokenBucket,
};

/// A time on a boundary of 10 brisk seconds, 10 hours (fixed windows of that length start
/// there: see [`SLOW`]).
const T0: u64 = 1_699_992_000_000_000;

/// How much slower than real time the settlements' simulated time runs: the quota's period
/// and every time step is this many times a brisk test's (a second becomes an hour), so a
/// key's state holds for hours of real time, far longer than the test runs. Redis expires
/// keys on its own clock, not on the explicit times (see `RateLimiter::check_at`): with the
/// brisk 10 units per 10 s, a charge settled to leave 4 s to go was gone once 4 s of real time
/// had passed, and a machine under load that stalled that long between two calls made the
/// later one find the key rested. The decisions are the brisk test's; every time and wait
/// asserted is the brisk one times `SLOW`.
const SLOW: u32 = 3_600;

/// A brisk second of simulated time, in microseconds (see [`SLOW`]).
const SECOND: u64 = 1_000_000 * SLOW as u64;

/// [`SLOW`] for the property test, whose brisk periods are already 10 minutes and an hour: a
/// minute becomes an hour, so a unit's state (75 s brisk at the shortest) holds for more than
/// an hour, and a fixed window's end or a charge settled to end just after the test's time
/// (a key left a moment to live) comes 60 times more rarely. Not more: a debt of `u32::MAX`
/// runs a key's time 101 bursts on (100 full quotas, see `Settled`), which times 3,600 would
/// pass the largest time a store takes (2^52 µs).
const PROPERTY_SLOW: u64 = 60;

type Limiter = RateLimiter<Arc<dyn Algorithm>>;

static CASE_ID: AtomicU64 = AtomicU64::new(0);

/// The same algorithm on Redis and in memory, under a fresh prefix.
fn limiters(redis: &RedisStore, algorithm: &Arc<dyn Algorithm>) -> [Limiter; 2] {
    let prefix = format!("settle{}", CASE_ID.fetch_add(1, Ordering::Relaxed));
    let on = |store: Arc<dyn tower_redis_ratelimit::store::Store>| {
        RateLimiter::builder(store, Arc::clone(algorithm))
            .prefix(&prefix)
            .store_timeout(Duration::from_secs(5))
            .build()
            .unwrap()
    };
    [
        on(Arc::new(redis.clone())),
        on(Arc::new(MemoryStore::new())),
    ]
}

/// 10 units per 10 s (one a second; a burst of 10 for the buckets), by every algorithm that
/// settles; brisk seconds (see [`SLOW`]).
fn ten_per_ten_seconds() -> Vec<(&'static str, Arc<dyn Algorithm>)> {
    let q = Quota::new(10, Duration::from_secs(10) * SLOW);
    vec![
        ("gcra", Arc::new(Gcra::new(q).unwrap())),
        ("token-bucket", Arc::new(TokenBucket::new(q).unwrap())),
        ("sliding-window", Arc::new(SlidingWindow::new(q).unwrap())),
        ("fixed-window", Arc::new(FixedWindow::new(q).unwrap())),
    ]
}

fn is_bucket(name: &str) -> bool {
    matches!(name, "gcra" | "token-bucket")
}

#[tokio::test]
async fn settling_down_gives_back_what_the_charge_still_holds() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (name, algorithm) in ten_per_ten_seconds() {
        for limiter in limiters(&store, &algorithm) {
            // Admitted on 6, used 2: 4 back at once, so 8 more fit and a ninth does not.
            let mut d = limiter.check_at("a", 6, T0).await.unwrap();
            let settled = limiter.settle_at("a", &mut d, 2, T0).await.unwrap();
            assert_eq!(
                settled,
                Settled::GaveBack {
                    units: 4,
                    given: true
                },
                "{name}"
            );
            assert_eq!(d.charge(), None, "{name}: the charge is used up");
            assert!(
                limiter.check_at("a", 8, T0).await.unwrap().allowed,
                "{name}"
            );
            assert!(
                !limiter.check_at("a", 1, T0).await.unwrap().allowed,
                "{name}"
            );

            // A charge that drained (a bucket) or left its window holds nothing to give back.
            let mut d = limiter.check_at("b", 6, T0).await.unwrap();
            let later = T0 + 10 * SECOND;
            let settled = limiter.settle_at("b", &mut d, 0, later).await.unwrap();
            assert_eq!(
                settled,
                Settled::GaveBack {
                    units: 6,
                    given: false
                },
                "{name}"
            );

            if is_bucket(name) {
                // Half drained: 5 s after a charge of 6 took [T0, T0 + 6 s], it holds 1 s of
                // it, one unit: 10 fit then, where 9 would without the settlement.
                let mut d = limiter.check_at("c", 6, T0).await.unwrap();
                let at = T0 + 5 * SECOND;
                let settled = limiter.settle_at("c", &mut d, 0, at).await.unwrap();
                assert_eq!(
                    settled,
                    Settled::GaveBack {
                        units: 6,
                        given: true
                    },
                    "{name}"
                );
                assert!(
                    limiter.check_at("c", 10, at).await.unwrap().allowed,
                    "{name}"
                );
                // At most the difference: settled to 5 of 6, 1 s of it back (not 5).
                let mut d = limiter.check_at("d", 6, T0).await.unwrap();
                limiter
                    .settle_at("d", &mut d, 5, T0 + SECOND)
                    .await
                    .unwrap();
                let next = limiter.check_at("d", 6, T0 + SECOND).await.unwrap();
                assert_eq!((next.allowed, next.remaining), (true, 0), "{name}");
            }
        }
    }
}

#[tokio::test]
async fn settling_up_leaves_a_debt_the_next_check_waits_out_exactly() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (name, algorithm) in ten_per_ten_seconds() {
        for limiter in limiters(&store, &algorithm) {
            // Admitted on 4, used 25: 21 more charged at once, past the limit.
            let mut d = limiter.check_at("k", 4, T0).await.unwrap();
            let settled = limiter.settle_at("k", &mut d, 25, T0).await.unwrap();
            assert_eq!(settled, Settled::Charged { units: 21 }, "{name}");
            // Buckets: 25 units take 25 s, so one more unit fits once 16 s have passed (the
            // burst of 10 s covers the rest). Windows: the debt ends with the window, 10 s.
            let wait = if is_bucket(name) { 16 } else { 10 } * SECOND;
            let denied = limiter.check_at("k", 1, T0).await.unwrap();
            assert!(!denied.allowed, "{name}");
            assert_eq!(
                denied.retry_after,
                Some(Duration::from_micros(wait)),
                "{name}"
            );
            let just_before = limiter.check_at("k", 1, T0 + wait - 1).await.unwrap();
            assert!(!just_before.allowed, "{name}");
            assert_eq!(
                just_before.retry_after,
                Some(Duration::from_micros(1)),
                "{name}"
            );
            assert!(
                limiter.check_at("k", 1, T0 + wait).await.unwrap().allowed,
                "{name}"
            );
        }
    }
}

#[tokio::test]
async fn settling_to_the_charge_changes_nothing() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (name, algorithm) in ten_per_ten_seconds() {
        for limiter in limiters(&store, &algorithm) {
            let mut d = limiter.check_at("k", 6, T0).await.unwrap();
            let settled = limiter.settle_at("k", &mut d, 6, T0).await.unwrap();
            assert_eq!(settled, Settled::AsCharged, "{name}");
            let again = limiter.settle_at("k", &mut d, 1, T0).await.unwrap();
            assert_eq!(again, Settled::NoCharge, "{name}: settled once");
            let next = limiter.check_at("k", 4, T0).await.unwrap();
            assert_eq!((next.allowed, next.remaining), (true, 0), "{name}");
            // A denial holds no charge: nothing to settle.
            let mut denied = limiter.check_at("k", 1, T0).await.unwrap();
            let settled = limiter.settle_at("k", &mut denied, 9, T0).await.unwrap();
            assert_eq!(settled, Settled::NoCharge, "{name}");
        }
    }
}

/// 0 gives the whole charge back; `u64::MAX` is refused and the charge stands, kept for a
/// settlement that fits; `u32::MAX` is a debt capped at 100 full quotas for the buckets,
/// the window's end for the windows. Redis and the twin agree on all of it.
#[tokio::test]
async fn hostile_figures_never_panic_and_debts_are_capped() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (name, algorithm) in ten_per_ten_seconds() {
        let [on_redis, in_memory] = limiters(&store, &algorithm);
        let mut seen = Vec::new();
        for limiter in [on_redis, in_memory] {
            let mut d = limiter.check_at("k", 3, T0).await.unwrap();
            let zero = limiter.settle_at("k", &mut d, 0, T0).await.unwrap();
            assert_eq!(
                zero,
                Settled::GaveBack {
                    units: 3,
                    given: true
                },
                "{name}"
            );
            let mut d = limiter.check_at("k", 3, T0).await.unwrap();
            let huge = limiter.settle_at("k", &mut d, u64::MAX, T0).await;
            assert!(
                matches!(huge, Err(Error::InvalidInput(_))),
                "{name}: {huge:?}"
            );
            assert!(
                d.charge().is_some(),
                "{name}: a refused figure keeps the charge"
            );
            let most = Settled::MAX_ACTUAL;
            let settled = limiter.settle_at("k", &mut d, most, T0).await.unwrap();
            assert_eq!(settled, Settled::Charged { units: most - 3 }, "{name}");
            // Again on a key deep in debt: still capped, never overflowing.
            let mut d = limiter.check_at("other", 1, T0).await.unwrap();
            limiter.settle_at("other", &mut d, most, T0).await.unwrap();
            let denied = limiter.check_at("k", 1, T0).await.unwrap();
            let wait = if is_bucket(name) {
                // 101 bursts of 10 s owed, less the burst a check may borrow, plus a unit.
                1_000 * SECOND + SECOND
            } else {
                10 * SECOND
            };
            assert_eq!(
                denied.retry_after,
                Some(Duration::from_micros(wait)),
                "{name}"
            );
            seen.push(denied);
        }
        assert_eq!(seen[0], seen[1], "{name}: Redis and memory");
    }
}

/// A key's ban stays whatever its charges settle to; the debt is there when it is lifted.
#[tokio::test]
async fn a_ban_stays_through_a_settlement() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    for (name, algorithm) in ten_per_ten_seconds() {
        for limiter in limiters(&store, &algorithm) {
            let mut d = limiter.check_at("k", 2, T0).await.unwrap();
            let mut e = limiter.check_at("k", 2, T0).await.unwrap();
            limiter.ban("k", Duration::from_secs(600)).await.unwrap();
            limiter.settle_at("k", &mut d, 0, T0).await.unwrap();
            let settled = limiter.settle_at("k", &mut e, 30, T0).await.unwrap();
            assert_eq!(settled, Settled::Charged { units: 28 }, "{name}");
            assert!(limiter.check_at("k", 1, T0).await.unwrap().banned, "{name}");
            limiter.unban("k").await.unwrap();
            let after = limiter.check_at("k", 1, T0).await.unwrap();
            assert!(
                !after.allowed && !after.banned,
                "{name}: the debt is still owed"
            );
        }
    }
}

/// What cannot be settled says so: a multi-limit (in memory, and in Redis).
#[tokio::test]
async fn an_algorithm_that_cannot_settle_says_so() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    let q = Quota::per_minute(10);
    let multi: Arc<dyn Algorithm> =
        Arc::new(MultiLimit::new([("a", q), ("b", Quota::per_hour(100))]).unwrap());
    for limiter in limiters(&store, &multi) {
        let mut d = limiter.check_at("k", 2, T0).await.unwrap();
        let settled = limiter.settle_at("k", &mut d, 5, T0).await;
        assert!(matches!(settled, Err(Error::Unsupported(_))), "{settled:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Property test: Redis and the twin agree on random interleavings of checks and settlements.

/// One step: a check of some cost, or a settlement of an earlier allowed check (picked by
/// index, modulo the number there are) to some figure.
#[derive(Debug, Clone)]
enum Op {
    Check(u32),
    Settle(usize, u64),
}

#[derive(Debug, Clone)]
struct Case {
    limit: u32,
    burst: u32,
    period_s: u64,
    steps: Vec<(u64, Op)>,
}

fn cases() -> impl Strategy<Value = Case> {
    // Limits that divide both periods' microseconds (see `refunds.rs`: keys stored with a few
    // microseconds to go would expire in Redis, on its real clock, before the twin's).
    (
        prop::sample::select(vec![1u32, 2, 3, 4, 5, 6, 8]),
        1u32..12,
        // Brisk 10 minutes and an hour (see [`PROPERTY_SLOW`]).
        prop::sample::select(vec![600 * PROPERTY_SLOW, 3_600 * PROPERTY_SLOW]),
    )
        .prop_flat_map(|(limit, burst, period_s)| {
            let interval = period_s * 1_000_000 / u64::from(limit);
            let step = prop_oneof![
                3 => Just(0u64),
                5 => 0..interval,
                2 => 0..3 * interval,
                1 => Just(period_s * 1_000_000),
            ];
            let max_cost = limit.max(burst) + 1;
            let figure = prop_oneof![
                6 => 0..=u64::from(3 * max_cost),
                1 => Just(u64::from(u32::MAX)),
                1 => Just(u64::MAX),
            ];
            let op = prop_oneof![
                3 => (1..=max_cost).prop_map(Op::Check),
                2 => (any::<usize>(), figure).prop_map(|(i, f)| Op::Settle(i, f)),
            ];
            prop::collection::vec((step, op), 1..50).prop_map(move |steps| Case {
                limit,
                burst,
                period_s,
                steps,
            })
        })
}

fn every_algorithm(case: &Case) -> Vec<Arc<dyn Algorithm>> {
    let period = Duration::from_secs(case.period_s);
    let q = Quota::new(case.limit, period).burst(case.burst);
    let window = Quota::new(case.limit, period);
    vec![
        Arc::new(Gcra::new(q).unwrap()),
        Arc::new(TokenBucket::new(q).unwrap()),
        Arc::new(SlidingWindow::new(window).unwrap()),
        Arc::new(FixedWindow::new(window).unwrap()),
    ]
}

async fn interleaved_agree(redis: &RedisStore, algorithm: &Arc<dyn Algorithm>, case: &Case) {
    let [on_redis, in_memory] = limiters(redis, algorithm);
    let mut allowed: Vec<(Decision, Decision)> = Vec::new();
    let mut now = T0;
    for (i, (step, op)) in case.steps.iter().enumerate() {
        now += step;
        match op {
            Op::Check(cost) => {
                let r = on_redis.check_at("k", *cost, now).await.unwrap();
                let m = in_memory.check_at("k", *cost, now).await.unwrap();
                assert_eq!(r, m, "{}: step {i} of {case:?}", algorithm.name());
                if r.allowed {
                    allowed.push((r, m));
                }
            }
            Op::Settle(pick, figure) if !allowed.is_empty() => {
                // A copy each time: the stores also meet the same charge twice.
                let (mut r, mut m) = allowed[pick % allowed.len()].clone();
                let by_redis = on_redis.settle_at("k", &mut r, *figure, now).await;
                let by_memory = in_memory.settle_at("k", &mut m, *figure, now).await;
                let name = algorithm.name();
                match (by_redis, by_memory) {
                    (Ok(a), Ok(b)) => {
                        assert_eq!(a, b, "{name}: settlement at step {i} of {case:?}")
                    }
                    (Err(Error::InvalidInput(_)), Err(Error::InvalidInput(_))) => {}
                    other => panic!("{name}: settlement at step {i} of {case:?}: {other:?}"),
                }
            }
            Op::Settle(..) => {}
        }
    }
}

#[test]
fn settlements_in_memory_match_redis() {
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
            for algorithm in every_algorithm(&case) {
                rt.block_on(interleaved_agree(&store, &algorithm, &case));
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("settlements: {e}"));
}
