//! The scripts' maths with explicit times, against real Redis and against MemoryStore.

use std::time::Duration;

use crate::common::limiter;
use crate::servers::{each_backend, keys_with_pttl, RedisServer};
use tower_redis_ratelimit::{
    algorithm::Algorithm, rate_limit::Decision, Gcra, MemoryStore, Quota, RateLimiter,
    SlidingWindow, TokenBucket,
};

const T0: u64 = 1_700_000_000_000_000;

/// How much slower than real time the maths' simulated time runs: every quota's period and
/// every time step is this many times a brisk test's (a second becomes an hour), so a key's
/// state holds for minutes to hours of real time, far longer than the test runs. Redis
/// expires keys on its own clock, not on the explicit times (see `RateLimiter::check_at`):
/// with the brisk periods themselves, a bucket emptied with 500 ms to go was gone once 500 ms
/// of real time had passed, and a machine under load that stalled that long between two
/// checks made the later one find a full bucket. The decisions are the brisk test's; every
/// time and duration asserted is the brisk one times `SLOW`.
const SLOW: u32 = 3_600;

/// A brisk millisecond of simulated time, in microseconds (see [`SLOW`]).
const MS: u64 = 1_000 * SLOW as u64;

/// `n` brisk milliseconds (see [`SLOW`]).
fn dur(n: u64) -> Duration {
    Duration::from_millis(n) * SLOW
}

fn ms(n: u64) -> Option<Duration> {
    Some(dur(n))
}

/// `limit` per `period` of the brisk test (see [`SLOW`]).
fn slowed(limit: u32, period: Duration) -> Quota {
    Quota::new(limit, period * SLOW)
}

async fn at<A: Algorithm>(l: &RateLimiter<A>, key: &str, cost: u32, t: u64) -> Decision {
    l.check_at(key, cost, t).await.expect("check failed")
}

/// Capacity 5, one token every 100 ms (brisk: see [`SLOW`]).
async fn bucket_maths<A: Algorithm>(l: RateLimiter<A>) {
    let k = "bucket";
    for left in (0..5).rev() {
        let d = at(&l, k, 1, T0).await;
        assert!(d.allowed);
        assert_eq!(d.remaining, left);
        assert_eq!(d.capacity, 5);
        assert_eq!(d.retry_after, None);
    }
    let d = at(&l, k, 1, T0).await;
    assert!(!d.allowed && !d.is_never());
    assert_eq!((d.remaining, d.retry_after), (0, ms(100)));
    assert_eq!(d.reset_after, dur(500));
    // Half an interval later: still denied, half the wait.
    let d = at(&l, k, 1, T0 + 50 * MS).await;
    assert_eq!((d.allowed, d.retry_after), (false, ms(50)));
    // One interval later: exactly one more.
    let d = at(&l, k, 1, T0 + 100 * MS).await;
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.reset_after, dur(500));
    assert!(!at(&l, k, 1, T0 + 100 * MS).await.allowed);
    // 250 ms more: two tokens credited, half of a third under way.
    let d = at(&l, k, 3, T0 + 350 * MS).await;
    assert_eq!((d.allowed, d.remaining, d.retry_after), (false, 2, ms(50)));
    let d = at(&l, k, 2, T0 + 350 * MS).await;
    assert_eq!((d.allowed, d.remaining), (true, 0));
    assert_eq!(d.reset_after, dur(450));
    // Cost above capacity: never, distinctly.
    let d = at(&l, k, 6, T0 + 350 * MS).await;
    assert!(d.is_never());
    assert_eq!(d.retry_after, None);
    // Long idle: full again, capped at capacity.
    let d = at(&l, k, 5, T0 + 60_000 * MS).await;
    assert_eq!((d.allowed, d.remaining), (true, 0));
    // Time going backwards credits nothing.
    let d = at(&l, k, 1, T0 + 59_000 * MS).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after, ms(1_100));
}

/// At most 5 units in any 1 s window (brisk: see [`SLOW`]).
async fn window_maths(l: RateLimiter<SlidingWindow>) {
    let k = "window";
    assert_eq!(at(&l, k, 2, T0).await.remaining, 3);
    assert_eq!(at(&l, k, 2, T0 + 100 * MS).await.remaining, 1);
    let d = at(&l, k, 1, T0 + 200 * MS).await;
    assert_eq!((d.allowed, d.remaining), (true, 0));
    assert_eq!(d.reset_after, dur(1_000));
    let d = at(&l, k, 1, T0 + 300 * MS).await;
    assert!(!d.allowed);
    // The entry of T0 leaves the window at T0 + 1 s; the last at T0 + 1.2 s.
    assert_eq!(d.retry_after, ms(700));
    assert_eq!(d.reset_after, dur(900));
    let d = at(&l, k, 2, T0 + 1_000 * MS).await;
    assert_eq!((d.allowed, d.remaining), (true, 0));
    // Needs 3 units: the entries of T0+100 ms (2) and T0+200 ms (1) must leave.
    let d = at(&l, k, 3, T0 + 1_050 * MS).await;
    assert_eq!((d.allowed, d.remaining, d.retry_after), (false, 0, ms(150)));
    let d = at(&l, k, 3, T0 + 1_200 * MS).await;
    assert_eq!((d.allowed, d.remaining), (true, 0));
    let d = at(&l, k, 6, T0 + 1_200 * MS).await;
    assert!(d.is_never());
    // A clock behind the log's newest entry is treated as the newest entry's time.
    let d = at(&l, k, 1, T0).await;
    assert_eq!((d.allowed, d.retry_after), (false, ms(800)));
    let d = at(&l, k, 5, T0 + 60_000 * MS).await;
    assert_eq!((d.allowed, d.remaining), (true, 0));
}

fn bucket_quota() -> Quota {
    Quota::per_second(10).burst(5)
}

fn window_quota() -> Quota {
    Quota::new(5, Duration::from_secs(1))
}

/// [`bucket_quota`] for the maths at explicit times (see [`SLOW`]).
fn slow_bucket_quota() -> Quota {
    slowed(10, Duration::from_secs(1)).burst(5)
}

/// [`window_quota`] for the maths at explicit times (see [`SLOW`]).
fn slow_window_quota() -> Quota {
    slowed(5, Duration::from_secs(1))
}

#[tokio::test]
async fn gcra_maths_on_redis_and_memory() {
    let redis = RedisServer::start();
    bucket_maths(limiter(
        redis.store().await,
        Gcra::new(slow_bucket_quota()).unwrap(),
        "g",
    ))
    .await;
    bucket_maths(limiter(
        MemoryStore::new(),
        Gcra::new(slow_bucket_quota()).unwrap(),
        "g",
    ))
    .await;
}

#[tokio::test]
async fn token_bucket_maths_on_redis_cluster_and_memory() {
    let tb = || TokenBucket::new(slow_bucket_quota()).unwrap();
    for backend in each_backend() {
        eprintln!("token bucket on {}", backend.name());
        bucket_maths(limiter(backend.store().await, tb(), "tb")).await;
    }
    bucket_maths(limiter(MemoryStore::new(), tb(), "tb")).await;
}

#[tokio::test]
async fn sliding_window_maths_on_redis_cluster_and_memory() {
    let sw = || SlidingWindow::new(slow_window_quota()).unwrap();
    for backend in each_backend() {
        eprintln!("sliding window on {}", backend.name());
        window_maths(limiter(backend.store().await, sw(), "sw")).await;
    }
    window_maths(limiter(MemoryStore::new(), sw(), "sw")).await;
}

/// Every key any script writes has an expiry, on the server clock, after allows and denials.
#[tokio::test]
async fn every_written_key_expires() {
    for backend in each_backend() {
        eprintln!("expiries on {}", backend.name());
        every_written_key_expires_on(&backend).await;
    }
}

async fn every_written_key_expires_on(backend: &crate::servers::Backend) {
    let store = backend.store().await;
    let g = limiter(store.clone(), Gcra::new(bucket_quota()).unwrap(), "ttl-g");
    let tb = limiter(
        store.clone(),
        TokenBucket::new(bucket_quota()).unwrap(),
        "ttl-tb",
    );
    let sw = limiter(
        store.clone(),
        SlidingWindow::new(window_quota()).unwrap(),
        "ttl-sw",
    );
    // A sub-second sliding window: the seed's `EXPIRE window/1e6*2` failed on these.
    let sw_short = limiter(
        store,
        SlidingWindow::new(Quota::new(3, Duration::from_millis(250))).unwrap(),
        "ttl-sw250",
    );
    for i in 0..8 {
        for cost in [1, 2] {
            let key = format!("user-{}", i % 3);
            g.check(&key, cost).await.unwrap();
            tb.check(&key, cost).await.unwrap();
            sw.check(&key, cost).await.unwrap();
            sw_short.check(&key, cost).await.unwrap();
        }
    }
    // The sub-second window's keys may already have expired on a loaded machine (its state
    // lives 250 ms), so they are counted at most; the others are all still there.
    for (prefix, expected, may_have_expired) in [
        ("ttl-g", 3, false),
        ("ttl-tb", 3, false),
        ("ttl-sw", 6, false),
        ("ttl-sw250", 6, true),
    ] {
        let mut keys = backend.keys_with_pttl(&format!("{{{prefix}:*"));
        if may_have_expired {
            // PTTL -2: the key expired between KEYS and PTTL.
            keys.retain(|(_, ttl)| *ttl != -2);
            assert!(keys.len() <= expected, "{prefix}: {keys:?}");
        } else {
            assert_eq!(keys.len(), expected, "{prefix}: {keys:?}");
        }
        for (key, ttl) in keys {
            assert!(ttl > 0, "{key} has PTTL {ttl}");
            assert!(
                ttl <= 1_000,
                "{key} has PTTL {ttl}, longer than its state needs"
            );
            // Every key of one check carries the same hash tag.
            assert!(
                key.starts_with(&format!("{{{prefix}:default:user-")),
                "{key}"
            );
        }
    }
    // The sub-second window's keys are gone once the window has passed.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(backend.keys_with_pttl("{ttl-sw250:*").is_empty());
}

/// Arguments and stored state are validated before any write; broken state is an error.
/// (GCRA's check, `lua/gcra.lua`, validates no argument: only the store calls it, with
/// arguments built from validated types, and the store refuses a cost of 0 or a time past 2^52
/// before sending: see `store::redis::operating`. The scripts that validate their arguments are
/// held to it here.)
#[tokio::test]
async fn scripts_reject_bad_arguments_and_foreign_data() {
    use tower_redis_ratelimit::redis;
    let redis_server = RedisServer::start();
    let mut conn = redis_server.conn();
    let g = Gcra::new(bucket_quota()).unwrap();
    // The token bucket's script as the store runs it (after the prelude): the same leading
    // arguments as every script but GCRA's check.
    let script = redis::Script::new(concat!(
        include_str!("../../lua/prelude.lua"),
        include_str!("../../lua/token_bucket.lua")
    ));
    // Bad arguments (now, cost, emission, burst) straight to the script: errors, and no key
    // is written.
    for args in [
        vec!["", "1", "0", "5"],
        vec!["", "0", "100000", "5"],
        vec!["", "-1", "100000", "5"],
        vec!["", "1.5", "100000", "5"],
        vec!["", "nan", "100000", "5"],
        vec!["", "1", "100000", "abc"],
        vec!["x", "1", "100000", "5"],
        vec!["", "1", "100000"],
        vec!["", "1", "4503599627370496", "2"],
    ] {
        let mut inv = script.prepare_invoke();
        inv.key("{bad}:g");
        for a in &args {
            inv.arg(*a);
        }
        let r: redis::RedisResult<redis::Value> = inv.invoke(&mut conn);
        let e = r.expect_err(&format!("{args:?} was accepted"));
        assert!(e.to_string().contains("tower-redis-ratelimit"), "{e}");
    }
    let n: i64 = redis::cmd("EXISTS")
        .arg("{bad}:g")
        .query(&mut conn)
        .unwrap();
    assert_eq!(n, 0);

    // Foreign data under the limiter's keys: an error, never a decision.
    let store = redis_server.store().await;
    let gl = limiter(store.clone(), g, "x");
    let tb = limiter(
        store.clone(),
        TokenBucket::new(bucket_quota()).unwrap(),
        "x",
    );
    let sw = limiter(store, SlidingWindow::new(window_quota()).unwrap(), "x");
    let _: () = redis::cmd("SET")
        .arg("{x:default:junk}:g")
        .arg("not a number")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("{x:default:junk}:b")
        .arg("n")
        .arg("-3")
        .arg("t")
        .arg("1")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("{x:default:junk}:l2")
        .arg("a string")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("{x:default:wrongtype}:g")
        .arg("a")
        .arg("1")
        .query(&mut conn)
        .unwrap();
    assert!(gl.check("junk", 1).await.is_err());
    // A GCRA state holding a ban's copy is `TAT:BAN`, both integers up to 2^52: anything
    // else is an error too, banned or not.
    for junk in [
        "5:x",
        "5:",
        ":7",
        "5:7:9",
        "99999999999999999999:1",
        "1:99999999999999999999",
    ] {
        let _: () = redis::cmd("SET")
            .arg("{x:default:junk2}:g")
            .arg(junk)
            .query(&mut conn)
            .unwrap();
        assert!(gl.check("junk2", 1).await.is_err(), "{junk}");
    }
    assert!(tb.check("junk", 1).await.is_err());
    assert!(sw.check("junk", 1).await.is_err());
    assert!(gl.check("wrongtype", 1).await.is_err());
}

/// Members sharing a score (a repeated time) must still expire in admission order: the log's
/// members are zero-padded so that "10" does not sort before "9".
async fn many_members_at_one_time(l: RateLimiter<SlidingWindow>) {
    for _ in 0..10 {
        assert!(at(&l, "tie", 1, T0).await.allowed);
    }
    assert!(at(&l, "tie", 1, T0 + 500 * MS).await.allowed);
    // The ten entries of T0 have left the window; one unit is in use.
    let d = at(&l, "tie", 11, T0 + 1_000 * MS).await;
    assert_eq!((d.allowed, d.remaining), (true, 0));
    let d = at(&l, "tie", 12, T0 + 1_100 * MS).await;
    assert_eq!((d.allowed, d.retry_after), (false, ms(900)));
}

#[tokio::test]
async fn sliding_window_orders_members_sharing_a_time() {
    let q = slowed(12, Duration::from_secs(1));
    let sw = || SlidingWindow::new(q).unwrap();
    for backend in each_backend() {
        many_members_at_one_time(limiter(backend.store().await, sw(), "tie")).await;
    }
    many_members_at_one_time(limiter(MemoryStore::new(), sw(), "tie")).await;
}

/// If the totals hash disappears (eviction, a stray DEL) while the log remains, the script
/// rebuilds the totals from the log and errs towards denying.
#[tokio::test]
async fn sliding_window_survives_losing_its_totals() {
    use tower_redis_ratelimit::redis;
    let redis_server = RedisServer::start();
    let l = limiter(
        redis_server.store().await,
        SlidingWindow::new(Quota::per_hour(3)).unwrap(),
        "lost",
    );
    for _ in 0..3 {
        assert!(l.check("k", 1).await.unwrap().allowed);
    }
    let mut conn = redis_server.conn();
    let n: i64 = redis::cmd("DEL")
        .arg("{lost:default:k}:m2")
        .query(&mut conn)
        .unwrap();
    assert_eq!(n, 1);
    let d = l.check("k", 1).await.unwrap();
    assert!(
        !d.allowed,
        "admitted past the limit after losing the totals"
    );
    assert_eq!(d.remaining, 0);
}

/// Burst 5 (one unit every 100 ms) and 8 a day, decided together (brisk: see [`SLOW`]).
async fn multi_maths(l: RateLimiter<tower_redis_ratelimit::algorithm::MultiLimit>) {
    let k = "multi";
    for left in (0..5).rev() {
        let d = at(&l, k, 1, T0).await;
        assert!(d.allowed);
        assert_eq!(d.remaining, left, "the burst binds");
        assert_eq!(d.limits.len(), 2);
        assert_eq!(d.limits[1].remaining, 3 + left, "daily: 8 - 5 + ...");
    }
    // Denied by the burst only; the day's quota is not touched by the denial.
    let d = at(&l, k, 1, T0).await;
    assert!(!d.allowed);
    assert_eq!(d.retry_after, ms(100));
    assert_eq!(&*d.limits[0].name, "burst");
    assert!(d.limits[0].violated() && !d.limits[1].violated());
    assert_eq!(d.limits[1].remaining, 3);
    // Three more over time exhaust the day.
    for i in 1..=3 {
        assert!(at(&l, k, 1, T0 + i * 1_000 * MS).await.allowed);
    }
    let d = at(&l, k, 1, T0 + 10_000 * MS).await;
    assert!(!d.allowed);
    assert!(!d.limits[0].violated() && d.limits[1].violated());
    // The day's bucket refills one unit every 3 h; the wait is measured from the last TAT.
    let day_interval = 86_400_000 / 8;
    assert_eq!(d.capacity, 8, "the binding limit is the daily one");
    assert!(d.retry_after.unwrap() > dur(day_interval - 20_000));
    // Cost above one limit's capacity: never.
    assert!(at(&l, k, 6, T0 + 20_000 * MS).await.is_never());
}

#[tokio::test]
async fn multi_limit_maths_on_redis_and_memory() {
    use tower_redis_ratelimit::algorithm::MultiLimit;
    let redis = RedisServer::start();
    let m = || {
        MultiLimit::new([
            ("burst", slow_bucket_quota()),
            ("daily", slowed(8, Duration::from_secs(86_400))),
        ])
        .unwrap()
    };
    multi_maths(limiter(redis.store().await, m(), "ml")).await;
    multi_maths(limiter(MemoryStore::new(), m(), "ml")).await;
    // Every key written expires, and all keys of one check share a hash tag.
    let l = limiter(redis.store().await, m(), "ml-ttl");
    l.check("k", 1).await.unwrap();
    let keys = keys_with_pttl(&mut redis.conn(), "{ml-ttl:*");
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(
        keys.iter()
            .all(|(k, ttl)| *ttl > 0 && k.starts_with("{ml-ttl:default:k}:q:")),
        "{keys:?}"
    );
}
