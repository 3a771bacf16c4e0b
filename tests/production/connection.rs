//! The life of the Redis connection: closed while idle (Redis' `timeout`, a NAT, a restart in
//! a quiet period), cut with a check in flight, and the timeouts a user sets, above and below
//! redis-rs' own 500 ms default, in force on every backend.

use std::time::{Duration, Instant};

use crate::servers::{proxy::Proxy, RedisServer};
use tower_redis_ratelimit::{
    redis, store::redis::Batching, store::CircuitBreaker, Error, Gcra, Quota, RateLimiter,
    RedisStore,
};

fn limiter(store: RedisStore, timeout: Duration) -> RateLimiter<Gcra> {
    RateLimiter::builder(store, Gcra::new(Quota::per_hour(100)).unwrap())
        .store_timeout(timeout)
        .circuit_breaker(CircuitBreaker::disabled())
        .deny_cache(0)
        .build()
        .unwrap()
}

/// Redis closes connections idle for a second. Every check comes after a longer pause, so
/// each finds its connection closed: each must still succeed, on a new connection.
#[tokio::test]
async fn a_connection_closed_while_idle_is_replaced_before_the_next_check() {
    let redis = RedisServer::start_with(&["--timeout", "1"]);
    let l = limiter(redis.store().await, Duration::from_millis(500));
    for round in 0..3 {
        let d = l.check("sparse", 1).await;
        assert!(
            matches!(&d, Ok(d) if d.allowed),
            "round {round}: {d:?} after an idle pause"
        );
        // Redis checks idle clients about every 100 ms (hz 10).
        tokio::time::sleep(Duration::from_millis(1_600)).await;
    }
    assert_eq!(l.stats().store_errors, 0);
}

/// Redis restarts while nobody calls: the first check after it is back succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_check_after_an_idle_restart_succeeds() {
    let mut redis = RedisServer::start();
    let l = limiter(redis.store().await, Duration::from_millis(500));
    assert!(l.check("k", 1).await.unwrap().allowed);
    // The app is idle (its runtime free) while Redis goes down and comes back.
    let _redis = tokio::task::spawn_blocking(move || {
        redis.restart();
        redis
    })
    .await
    .unwrap();
    let d = l.check("k", 1).await;
    assert!(matches!(&d, Ok(d) if d.allowed), "{d:?}");
}

/// The check reached Redis (it spent a unit) but the answer was lost with the connection: it
/// must fail, not be sent again (which would spend a second unit).
#[tokio::test]
async fn a_check_cut_off_in_flight_is_not_sent_twice() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", redis.port).parse().unwrap()).await;
    let l = limiter(
        RedisStore::connect(&proxy.url()).await.unwrap(),
        Duration::from_secs(2),
    );
    assert_eq!(l.check("k", 1).await.unwrap().remaining, 99);
    proxy.cut_next_answer();
    let cut = l.check("k", 1).await;
    assert!(
        matches!(&cut, Err(e) if e.is_unavailable()),
        "a check whose answer was lost must fail: {cut:?}"
    );
    // Exactly one unit was spent by the lost check: the next one sees 97 left.
    let d = l.check("k", 1).await.unwrap();
    assert_eq!(d.remaining, 97, "the lost check was sent twice: {d:?}");
}

/// With Redis hung (`SIGSTOP`), a check fails after the timeout the user set, not earlier:
/// redis-rs' default response timeout (500 ms) must not cut it short, and a shorter one is
/// kept too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeouts_the_user_sets_are_the_ones_in_force() {
    let redis = RedisServer::start();
    let multiplexed = redis.store().await;
    let pooled = redis.store_with_pool(4).await;
    // Batching: the call timeout (900 ms) binds before the store timeout (3 s).
    let batched = redis
        .store()
        .await
        .with_batching(Batching::new().call_timeout(Duration::from_millis(900)))
        .unwrap();
    let cases = [
        (
            "multiplexed",
            multiplexed.clone(),
            Duration::from_millis(300),
            Duration::from_millis(300),
        ),
        (
            "multiplexed",
            multiplexed,
            Duration::from_millis(900),
            Duration::from_millis(900),
        ),
        (
            "bb8 pool",
            pooled,
            Duration::from_millis(900),
            Duration::from_millis(900),
        ),
        (
            "batched",
            batched,
            Duration::from_secs(3),
            Duration::from_millis(900),
        ),
    ];
    let limiters: Vec<_> = cases
        .into_iter()
        .map(|(name, store, timeout, binding)| (name, limiter(store, timeout), binding))
        .collect();
    for (name, l, _) in &limiters {
        assert!(l.check("warm", 1).await.is_ok(), "{name}");
    }
    redis.signal("-STOP");
    for (name, l, binding) in &limiters {
        let started = Instant::now();
        let r = l.check("k", 1).await;
        let took = started.elapsed();
        println!("{name}: failed after {took:?} (timeout in force: {binding:?})");
        assert!(matches!(r, Err(Error::Timeout(_))), "{name}: {r:?}");
        assert!(
            took >= *binding,
            "{name}: cut short at {took:?}, before {binding:?}"
        );
        assert!(
            took < *binding + Duration::from_secs(2),
            "{name}: {took:?}, long after {binding:?}"
        );
    }
    redis.signal("-CONT");
    let _: () = redis::cmd("PING").query(&mut redis.conn()).unwrap();
}
