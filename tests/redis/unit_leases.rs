//! Unit leases (`RateLimiterBuilder::lease`) against a real Redis shared by several limiters:
//! the bound on admissions in any window, the return of unused units, the Redis calls per
//! check on a hot key, and what a lease does on other stores and algorithms.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::servers::{command_calls, RedisServer};
use tower_redis_ratelimit::store::redis::Batching;
use tower_redis_ratelimit::{
    algorithm::Algorithm, rate_limit::UnitLease, Gcra, Quota, RateLimiter, TokenBucket,
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

/// Tasks alive on this test's runtime (a limiter's connections; the leases' returns while
/// they wait or run).
fn tasks_alive() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Lets `d` pass on tokio's clock, the one unit leases run on, without waiting for it: on
/// this test's current-thread runtime, with no Redis call in flight, the clock is paused,
/// moved on and resumed. Then waits (in real time, bounded) until no more than `idle` tasks
/// are alive: the leases' returns that the time woke have made their Redis calls.
async fn let_time_pass(d: Duration, idle: usize) {
    tokio::time::pause();
    tokio::time::advance(d).await;
    tokio::time::resume();
    let deadline = Instant::now() + Duration::from_secs(5);
    while tasks_alive() > idle {
        assert!(
            Instant::now() < deadline,
            "{} tasks still alive, {idle} when idle",
            tasks_alive()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
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

/// The units a lease did not hand out, returned after their share of the key's time has
/// drained (the reservation's units lie on the key's time, the unused ones last), give
/// nothing back: another instance that took the key's whole burst meanwhile then gets no
/// more than the algorithm grants in the time since, `burst + elapsed / emission` (a return
/// of every unused unit would hand out that many of the other instance's). GCRA and the token
/// bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_units_whose_time_has_drained_give_nothing_back() {
    const LIFETIME: Duration = Duration::from_millis(400);
    const EMISSION: Duration = Duration::from_millis(10);
    let redis = RedisServer::start();
    // 100 a second, burst 100: leases of up to 12 units.
    let quota = Quota::per_second(100);
    let algorithms: [(&str, Arc<dyn Algorithm>); 2] = [
        ("gcra", Arc::new(Gcra::new(quota).unwrap())),
        ("token-bucket", Arc::new(TokenBucket::new(quota).unwrap())),
    ];
    for (name, algorithm) in algorithms {
        let leasing = instances(
            &redis,
            &algorithm,
            name,
            Some(UnitLease::up_to(LIFETIME)),
            1,
        )
        .await
        .remove(0);
        let other = instances(&redis, &algorithm, name, None, 1).await.remove(0);
        // Four exact checks heat the key; the fifth reserves a lease of 12 units, of which it
        // hands out one. The key's time is then about 160 ms ahead: 16 units.
        let reserved = Instant::now();
        for _ in 0..5 {
            assert!(leasing.check("k", 1).await.unwrap().allowed, "{name}");
        }
        // Once those units have drained, the other instance takes the whole burst...
        tokio::time::sleep_until((reserved + Duration::from_millis(250)).into()).await;
        let start = Instant::now();
        assert!(other.check("k", 100).await.unwrap().allowed, "{name}");
        // ... and after the lease's rest went back, whatever the key has again.
        tokio::time::sleep_until((reserved + LIFETIME + Duration::from_millis(200)).into()).await;
        let mut admitted = 100;
        while other.check("k", 1).await.unwrap().allowed {
            admitted += 1;
        }
        let elapsed = start.elapsed();
        let bound = 100 + (elapsed.as_micros() / EMISSION.as_micros()) as usize;
        assert!(
            admitted <= bound,
            "{name}: {admitted} admitted in {elapsed:?}, the algorithm grants at most {bound}"
        );
    }
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
#[tokio::test]
async fn a_cold_key_is_checked_exactly() {
    let redis = RedisServer::start();
    // Leases of up to 125 units could be had: the key is cold, so none is taken.
    let gcra = Gcra::new(Quota::per_hour(1_000)).unwrap();
    let lease = UnitLease::up_to(Duration::from_millis(20));
    let limiters = instances(&redis, &gcra, "cold", Some(lease), 1).await;
    let l = &limiters[0];
    // Loads the script (a first EVALSHA answers NOSCRIPT, then EVAL), so calls count checks.
    let idle = tasks_alive();
    l.check("warm-up", 1).await.unwrap();
    let before = script_calls(&redis);
    for i in 0..10u64 {
        let d = l.check("k", 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, 999 - i, "exact remaining for a cold key");
        let_time_pass(Duration::from_millis(30), idle).await;
    }
    // One call per check: no reservation beyond the cost, nothing to give back.
    assert_eq!(script_calls(&redis) - before, 10);
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
    .circuit_breaker(tower_redis_ratelimit::store::CircuitBreaker::disabled())
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

async fn limiter(
    redis: &RedisServer,
    gcra: &Gcra,
    prefix: &str,
    lease: Option<UnitLease>,
) -> RateLimiter<Gcra> {
    let mut b = RateLimiter::builder(redis.store().await, gcra.clone())
        .prefix(prefix)
        .store_timeout(Duration::from_secs(5));
    if let Some(lease) = lease {
        b = b.lease(lease);
    }
    b.build().unwrap()
}

/// A key checked once, ever, is cold (fewer than 4 checks per lifetime): even with a cost of
/// 8, its first check takes only its cost from Redis, not a lease (the table counts checks,
/// not units, and a new slot has no past demand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_check_of_cost_8_on_a_fresh_key_takes_only_its_cost() {
    let redis = RedisServer::start();
    // Burst 1,000, one unit back per 3.6 s: leases of up to 125 units could be had.
    let gcra = Gcra::new(Quota::per_hour(1_000)).unwrap();
    // A long lifetime, so the lease (if any) is still held when the other instance looks.
    let leasing = limiter(
        &redis,
        &gcra,
        "cost8",
        Some(UnitLease::up_to(Duration::from_secs(10))),
    )
    .await;
    let exact = limiter(&redis, &gcra, "cost8", None).await;
    let d = leasing.check("k", 8).await.unwrap();
    assert!(d.allowed);
    // Exact: 1,000 - 8 - 1 = 991 left after the other instance's check.
    let seen = exact.check("k", 1).await.unwrap().remaining;
    assert!(
        seen >= 991,
        "one check of cost 8 took {} units from Redis",
        1_000 - 1 - seen
    );
}

/// A key that was hot and then rests for 6 lifetimes (an hour would do the same) is cold
/// again: the one check after the rest takes its cost from Redis, not a block of the key's
/// units held away from the other instances for a lifetime (a key is hot only while its last
/// 4 checks fall within one lifetime, and a cold key's past demand is forgotten). The
/// lifetimes pass on a paused clock.
#[tokio::test]
async fn a_key_that_rested_is_cold_again() {
    const LIFETIME: Duration = Duration::from_secs(1);
    let redis = RedisServer::start();
    let gcra = Gcra::new(Quota::per_hour(1_000)).unwrap();
    let leasing = limiter(&redis, &gcra, "rest", Some(UnitLease::up_to(LIFETIME))).await;
    let exact = limiter(&redis, &gcra, "rest", None).await;
    let idle = tasks_alive();
    // Hot: 300 checks in a row.
    for _ in 0..300 {
        assert!(leasing.check("k", 1).await.unwrap().allowed);
    }
    // Every lease ends and goes back; the key then rests.
    let_time_pass(LIFETIME * 2, idle).await;
    let before = exact.check("k", 1).await.unwrap().remaining;
    let_time_pass(LIFETIME * 6, idle).await;
    // One check after the rest.
    assert!(leasing.check("k", 1).await.unwrap().allowed);
    let after = exact.check("k", 1).await.unwrap().remaining;
    // Exact: this check's unit and the other instance's (refills only add).
    assert!(
        after + 2 >= before,
        "one check after a rest took {} units from Redis",
        before - after - 1
    );
}

/// With batching on, concurrent checks of many cold keys share script calls, with a lease as
/// without: a cold key's check is an ordinary (batched) check, not a reservation (which is
/// never batched, one call per check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_keys_keep_the_stores_batching() {
    let redis = RedisServer::start();
    let gcra = Gcra::new(Quota::per_hour(1_000)).unwrap();
    let mut calls = Vec::new();
    for (prefix, lease) in [
        ("plain", None),
        ("leased", Some(UnitLease::up_to(Duration::from_millis(50)))),
    ] {
        let store = redis
            .store()
            .await
            .with_batching(Batching::new().max_in_flight(1).max_batch(64))
            .unwrap();
        let mut b = RateLimiter::builder(store, gcra.clone())
            .prefix(prefix)
            .store_timeout(Duration::from_secs(5));
        if let Some(lease) = lease {
            b = b.lease(lease);
        }
        let l = b.build().unwrap();
        // Loads the scripts (batch, check, reservation).
        for i in 0..3 {
            let _ = tokio::join!(
                l.check(format!("warm-{i}"), 1),
                l.check(format!("warm2-{i}"), 1)
            );
        }
        let before = script_calls(&redis);
        let checks = (0..64).map(|i| {
            let l = l.clone();
            tokio::spawn(async move { l.check(format!("user-{i}"), 1).await.unwrap() })
        });
        for d in futures_util::future::join_all(checks).await {
            assert!(d.unwrap().allowed);
        }
        calls.push(script_calls(&redis) - before);
    }
    let (plain, leased) = (calls[0], calls[1]);
    eprintln!("64 cold checks: {plain} script calls without a lease, {leased} with");
    assert!(plain < 32, "batching works without a lease ({plain} calls)");
    assert!(
        leased < 32,
        "with a lease, 64 checks of cold keys took {leased} script calls (batched: {plain})"
    );
}

/// Two checks in a row on a fresh key (a page load: two requests a millisecond apart, then
/// nothing) are 2 checks per lifetime, cold: they take two units from Redis, not a full lease
/// (125 units) extrapolated from the interval between them (one check in a millisecond would
/// read as 10,000 per 10 s lifetime).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_checks_in_a_row_take_only_two_units() {
    let redis = RedisServer::start();
    let gcra = Gcra::new(Quota::per_hour(1_000)).unwrap();
    let leasing = limiter(
        &redis,
        &gcra,
        "two",
        Some(UnitLease::up_to(Duration::from_secs(10))),
    )
    .await;
    let exact = limiter(&redis, &gcra, "two", None).await;
    assert!(leasing.check("k", 1).await.unwrap().allowed);
    assert!(leasing.check("k", 1).await.unwrap().allowed);
    // Exact: 1,000 - 2 - 1 = 997 left after the other instance's check.
    let seen = exact.check("k", 1).await.unwrap().remaining;
    assert!(
        seen >= 997,
        "two checks took {} units from Redis",
        1_000 - 1 - seen
    );
}

/// Refunding decisions answered from a lease gives their units back
/// to Redis once, and the lease's own return adds only what it did not hand out.
#[tokio::test]
async fn refunds_of_leased_decisions_and_the_return_add_up() {
    const LIFETIME: Duration = Duration::from_millis(200);
    let redis = RedisServer::start();
    let gcra = Gcra::new(Quota::per_hour(1_000)).unwrap();
    let leasing = limiter(&redis, &gcra, "refund", Some(UnitLease::up_to(LIFETIME))).await;
    let exact = limiter(&redis, &gcra, "refund", None).await;
    let idle = tasks_alive();
    let before = script_calls(&redis);
    let mut decisions = Vec::new();
    for _ in 0..100 {
        let d = leasing.check("k", 1).await.unwrap();
        assert!(d.allowed);
        decisions.push(d);
    }
    assert!(script_calls(&redis) - before < 50, "leases were used");
    for d in &mut decisions {
        assert!(leasing.refund("k", d).await.unwrap());
    }
    // The limiter is dropped with its lease live: the return still runs. (The dropped
    // limiter's connection ends too: fewer tasks than before when all is done.)
    drop(leasing);
    let_time_pass(LIFETIME * 3, idle).await;
    let mut found = 0;
    while exact.check("k", 1).await.unwrap().allowed {
        found += 1;
    }
    assert!((1_000..=1_001).contains(&found), "found {found} of 1,000");
}

/// A client spraying keys (one check per key per lifetime: cold keys, never leased) does not
/// shut a hot key that comes later out of the lease table: a cold key holding nothing gives
/// its slot to a new key, so the hot key's checks are answered from leases, not one Redis call
/// each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_sprayed_once_do_not_shut_hot_keys_out_of_leases() {
    let redis = RedisServer::start();
    let gcra = Gcra::new(Quota::per_hour(100_000)).unwrap();
    let lease = UnitLease::up_to(Duration::from_secs(10)).max_keys(160);
    let l = limiter(&redis, &gcra, "spray", Some(lease)).await;
    l.check("warm-up", 1).await.unwrap();
    // The spray: 2,000 keys checked once each (within one lifetime).
    for i in 0..2_000 {
        assert!(l.check(format!("spray-{i}"), 1).await.unwrap().allowed);
    }
    // A hot tenant: 500 checks in a row.
    let before = script_calls(&redis);
    for _ in 0..500 {
        assert!(l.check("tenant", 1).await.unwrap().allowed);
    }
    let calls = script_calls(&redis) - before;
    assert!(
        calls < 100,
        "500 checks of a hot key took {calls} script calls"
    );
}

/// Bursty but cold keys (a page load: 2 requests at once, then nothing for a while) cost no
/// more Redis calls with a lease than without: a burst of two neither reserves a block nor
/// gives one back.
#[tokio::test]
async fn a_burst_of_two_costs_no_more_calls_than_without_a_lease() {
    const LIFETIME: Duration = Duration::from_millis(100);
    let redis = RedisServer::start();
    let gcra = Gcra::new(Quota::per_hour(1_000)).unwrap();
    let l = limiter(&redis, &gcra, "burst3", Some(UnitLease::up_to(LIFETIME))).await;
    let idle = tasks_alive();
    l.check("warm-up", 1).await.unwrap();
    l.check("warm-up", 1).await.unwrap();
    let_time_pass(LIFETIME * 3, idle).await;
    let before = script_calls(&redis);
    for user in 0..10 {
        for _ in 0..2 {
            assert!(l.check(format!("user-{user}"), 1).await.unwrap().allowed);
        }
    }
    let_time_pass(LIFETIME * 3, idle).await;
    let calls = script_calls(&redis) - before;
    assert!(
        calls <= 20,
        "20 checks took {calls} script calls (20 without a lease)"
    );
}
