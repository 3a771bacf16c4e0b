//! Unit leases (`RateLimiterBuilder::lease`) against a real Redis shared by several limiters:
//! the bound on admissions in any window, the return of unused units, the Redis calls per
//! check on a hot key, and what a lease does on other stores and algorithms.

mod common;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::{command_calls, RedisServer};
use tower_redis_ratelimit::{
    Algorithm, Gcra, MemoryStore, MultiLimit, Quota, RateLimiter, SlidingWindow, TokenBucket,
    UnitLease,
};

/// `n` limiters (each on its own connection, as separate instances would be) leasing one
/// Redis under `prefix`.
async fn instances<A: Algorithm + Clone>(
    redis: &RedisServer,
    algorithm: &A,
    prefix: &str,
    lease: Option<UnitLease>,
    n: usize,
) -> Vec<RateLimiter<A>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut b = RateLimiter::builder(redis.store().await, algorithm.clone())
            .prefix(prefix)
            .store_timeout(Duration::from_secs(5));
        if let Some(lease) = lease {
            b = b.lease(lease);
        }
        out.push(b.build().unwrap());
    }
    out
}

/// Script calls Redis ran so far.
fn script_calls(redis: &RedisServer) -> u64 {
    command_calls(&mut redis.conn(), |name| name.starts_with("eval"))
}

/// Runs `tasks` tasks per limiter, each checking `key` until `until` (or `per_task` allowed
/// checks), and returns the time of every admission.
async fn hammer<A: Algorithm + Clone>(
    limiters: &[RateLimiter<A>],
    key: &'static str,
    tasks: usize,
    per_task: usize,
    until: Instant,
) -> Vec<Instant> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for l in limiters {
        for _ in 0..tasks {
            let (l, log) = (l.clone(), Arc::clone(&log));
            handles.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                while mine.len() < per_task && Instant::now() < until {
                    let d = l.check(key, 1).await.unwrap();
                    if d.allowed {
                        mine.push(Instant::now());
                    } else {
                        tokio::task::yield_now().await;
                    }
                }
                log.lock().unwrap().extend(mine);
            }));
        }
    }
    for h in handles {
        h.await.unwrap();
    }
    Arc::try_unwrap(log).unwrap().into_inner().unwrap()
}

/// The most admissions in any window of `window` in `log`.
fn most_in_any_window(mut log: Vec<Instant>, window: Duration) -> usize {
    log.sort();
    let (mut most, mut start) = (0, 0);
    for end in 0..log.len() {
        while log[end].duration_since(log[start]) >= window {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// In every window of the quota's period, the admissions of four leasing limiters stay within
/// what the algorithm admits in period + lifetime: `burst + (period + lifetime) / emission`.
/// The load leaves units in the leases (a first phase below the limit), waits for the key to
/// rest, then floods it: a lease handed out after its lifetime would add its units on top of
/// a rested key's whole burst.
async fn overshoot_is_bounded<A: Algorithm + Clone>(name: &str, algorithm: A) {
    const PERIOD: Duration = Duration::from_millis(200);
    const LIFETIME: Duration = Duration::from_millis(20);
    const BURST: u64 = 400;
    let redis = RedisServer::start();
    let lease = UnitLease::up_to(LIFETIME);
    let limiters = instances(&redis, &algorithm, &format!("bound-{name}"), Some(lease), 4).await;
    let before = script_calls(&redis);
    // Phase 1: 4 x 60 checks, below the burst of 400: each lease is left with units.
    let mut log = hammer(&limiters, "hot", 6, 10, Instant::now() + PERIOD).await;
    assert_eq!(
        log.len(),
        240,
        "{name}: below the limit, every check is allowed"
    );
    assert!(
        script_calls(&redis) - before < 200,
        "{name}: phase 1 was served from leases"
    );
    // The key rests (its state full again), then every limiter floods it for two periods.
    tokio::time::sleep(PERIOD + PERIOD / 2).await;
    let flood = hammer(
        &limiters,
        "hot",
        16,
        usize::MAX,
        Instant::now() + 2 * PERIOD,
    )
    .await;
    log.extend(flood);
    let emission_us = PERIOD.as_micros() as u64 / BURST;
    let bound = BURST + (PERIOD + LIFETIME).as_micros() as u64 / emission_us;
    let most = most_in_any_window(log, PERIOD) as u64;
    eprintln!("{name}: at most {most} admissions in a window of {PERIOD:?}, bound {bound}");
    assert!(
        most <= bound,
        "{name}: {most} admissions in one window of {PERIOD:?}, more than the bound {bound}"
    );
    // The limit bound: the flood was limited, not let through.
    assert!(most > BURST, "{name}: the flood reached the limit ({most})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_in_any_window_stay_within_the_stated_bound_gcra() {
    let quota = Quota::new(400, Duration::from_millis(200));
    overshoot_is_bounded("gcra", Gcra::new(quota).unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_in_any_window_stay_within_the_stated_bound_token_bucket() {
    let quota = Quota::new(400, Duration::from_millis(200));
    overshoot_is_bounded("token-bucket", TokenBucket::new(quota).unwrap()).await;
}

/// What a lease did not hand out goes back to Redis when its lifetime ends: another instance
/// (without leases, so exact) then finds every unit the leasing one did not use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_units_go_back_when_the_lease_ends() {
    const LIFETIME: Duration = Duration::from_millis(100);
    let redis = RedisServer::start();
    // 1,000 an hour: nothing refills during the test (one unit per 3.6 s).
    let gcra = Gcra::new(Quota::per_hour(1_000)).unwrap();
    let leasing = instances(&redis, &gcra, "back", Some(UnitLease::up_to(LIFETIME)), 1).await;
    let exact = instances(&redis, &gcra, "back", None, 1).await;
    let before = script_calls(&redis);
    let used = hammer(
        &leasing,
        "k",
        8,
        25,
        Instant::now() + Duration::from_secs(5),
    )
    .await;
    assert_eq!(used.len(), 200);
    let calls = script_calls(&redis) - before;
    assert!(
        calls < 100,
        "the leasing instance used leases ({calls} calls)"
    );
    tokio::time::sleep(LIFETIME + Duration::from_millis(150)).await;
    let mut found = 0;
    while exact[0].check("k", 1).await.unwrap().allowed {
        found += 1;
    }
    // 1,000 - 200 (plus at most one unit refilled meanwhile).
    assert!(
        (800..=801).contains(&found),
        "the other instance found {found} units, not the 800 left"
    );
}

/// On one hot key far below its limit, four leasing limiters make fewer than 1,000 Redis
/// script calls for 10,000 allowed checks (at most 0.1 per check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_allowed_key_costs_under_a_tenth_of_a_call_per_check() {
    let redis = RedisServer::start();
    let gcra = Gcra::new(Quota::per_second(1_000_000)).unwrap();
    let lease = UnitLease::up_to(Duration::from_millis(50));
    let limiters = instances(&redis, &gcra, "calls", Some(lease), 4).await;
    let before = script_calls(&redis);
    let allowed = hammer(
        &limiters,
        "hot",
        16,
        157,
        Instant::now() + Duration::from_secs(30),
    )
    .await;
    assert_eq!(allowed.len(), 4 * 16 * 157);
    let calls = script_calls(&redis) - before;
    eprintln!("{calls} script calls for {} checks", allowed.len());
    assert!(calls < 1_000, "{calls} script calls for 10,048 checks");
}

/// A cold key (a check now and then) is checked in Redis exactly, one call per check, with
/// nothing reserved beyond its cost: a lease does not change what it sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_key_is_checked_exactly() {
    let redis = RedisServer::start();
    // Leases of up to 125 units could be had: the key is cold, so none is taken.
    let gcra = Gcra::new(Quota::per_hour(1_000)).unwrap();
    let lease = UnitLease::up_to(Duration::from_millis(20));
    let limiters = instances(&redis, &gcra, "cold", Some(lease), 1).await;
    let l = &limiters[0];
    // Loads the script (a first EVALSHA answers NOSCRIPT, then EVAL), so calls count checks.
    l.check("warm-up", 1).await.unwrap();
    let before = script_calls(&redis);
    for i in 0..10u64 {
        let d = l.check("k", 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, 999 - i, "exact remaining for a cold key");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // One call per check: no reservation beyond the cost, nothing to give back.
    assert_eq!(script_calls(&redis) - before, 10);
}

/// On a MemoryStore a lease changes nothing: the same decisions as without.
#[tokio::test]
async fn a_lease_on_a_memory_store_changes_nothing() {
    let gcra = Gcra::new(Quota::per_hour(5)).unwrap();
    let leased = RateLimiter::builder(MemoryStore::new(), gcra.clone())
        .lease(UnitLease::up_to(Duration::from_millis(50)))
        .build()
        .unwrap();
    let plain = RateLimiter::new(MemoryStore::new(), gcra);
    for _ in 0..8 {
        let (a, b) = (
            leased.check("k", 1).await.unwrap(),
            plain.check("k", 1).await.unwrap(),
        );
        assert_eq!((a.allowed, a.remaining), (b.allowed, b.remaining));
    }
}

#[test]
fn lease_options_are_validated_naming_the_field() {
    let quota = Quota::per_second(100);
    let field = |lease: UnitLease, algorithm: Arc<dyn Algorithm>| {
        RateLimiter::builder(MemoryStore::new(), algorithm)
            .lease(lease)
            .build()
            .unwrap_err()
            .field()
            .to_owned()
    };
    let ok = UnitLease::up_to(Duration::from_millis(50));
    let gcra: Arc<dyn Algorithm> = Arc::new(Gcra::new(quota).unwrap());
    assert_eq!(
        field(UnitLease::up_to(Duration::ZERO), gcra.clone()),
        "lease.lifetime"
    );
    assert_eq!(
        field(UnitLease::up_to(Duration::from_secs(11)), gcra.clone()),
        "lease.lifetime"
    );
    assert_eq!(field(ok.max_units(0), gcra.clone()), "lease.max_units");
    assert_eq!(field(ok.max_keys(0), gcra.clone()), "lease.max_keys");
    let window: Arc<dyn Algorithm> = Arc::new(SlidingWindow::new(quota).unwrap());
    assert_eq!(field(ok, window), "lease");
    let multi: Arc<dyn Algorithm> = Arc::new(
        MultiLimit::new([("second", quota), ("minute", Quota::per_minute(1_000))]).unwrap(),
    );
    assert_eq!(field(ok, multi), "lease");
    let bucket: Arc<dyn Algorithm> = Arc::new(TokenBucket::new(quota).unwrap());
    assert!(RateLimiter::builder(MemoryStore::new(), bucket)
        .lease(ok)
        .build()
        .is_ok());
}

/// A reservation cut short by the store timeout (Redis stopped) is a timeout for its check
/// and for those waiting on it, never an admission; once Redis answers again the key is
/// leased again (nothing is left waiting on the reservation that never landed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_cut_by_the_timeout_leaves_nothing_waiting() {
    let redis = RedisServer::start();
    let limiter = RateLimiter::builder(
        redis.store().await,
        Gcra::new(Quota::per_hour(1_000)).unwrap(),
    )
    .prefix("cut")
    .store_timeout(Duration::from_millis(200))
    .circuit_breaker(tower_redis_ratelimit::CircuitBreaker::disabled())
    .lease(UnitLease::up_to(Duration::from_millis(50)))
    .build()
    .unwrap();
    redis.signal("-STOP");
    let mut handles = Vec::new();
    for _ in 0..8 {
        let l = limiter.clone();
        handles.push(tokio::spawn(async move { l.check("k", 1).await }));
    }
    for h in handles {
        let result = h.await.unwrap();
        assert!(
            matches!(&result, Err(e) if e.is_unavailable()),
            "Redis stopped: an error, never an admission: {result:?}"
        );
    }
    redis.signal("-CONT");
    let d = limiter.check("k", 1).await.unwrap();
    assert!(d.allowed, "{d:?}");
}

/// A corrupted stored state makes the reservation fail (an error for the failure policy),
/// never a panic nor a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_state_is_an_error_not_a_lease() {
    let redis = RedisServer::start();
    let gcra = Gcra::new(Quota::per_hour(1_000)).unwrap();
    let limiters = instances(
        &redis,
        &gcra,
        "corrupt",
        Some(UnitLease::up_to(Duration::from_millis(50))),
        1,
    )
    .await;
    let l = &limiters[0];
    let key = format!("{}:g", l.storage_key("k"));
    let _: () = tower_redis_ratelimit::redis::cmd("SET")
        .arg(&key)
        .arg("not a number")
        .query(&mut redis.conn())
        .unwrap();
    for _ in 0..3 {
        let result = l.check("k", 1).await;
        assert!(result.is_err(), "{result:?}");
    }
    assert_eq!(l.stats().store_errors, 3);
}
