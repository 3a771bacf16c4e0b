//! Exact batching (`RedisStore::with_batching`): checks decided together in one script call get
//! exactly the decisions of one call each, in arrival order; a bad key fails alone; a check whose
//! caller gave up is never sent; bad settings are refused by name.
//!
//! The exactness of batching under real concurrency (many stores x many tasks on one key) is
//! covered by `tests/exactness.rs`, which runs every algorithm on a batched store too.

use std::{
    future::Future,
    pin::Pin,
    task::Poll,
    time::{Duration, Instant},
};

use crate::servers::{dead_redis_url, RedisCluster, RedisServer};
use tower_redis_ratelimit::{
    algorithm::{Algorithm, MultiLimit},
    rate_limit::Decision,
    redis,
    store::redis::Batching,
    store::CircuitBreaker,
    Error, Gcra, Quota, RateLimiter, RedisStore, SlidingWindow, TokenBucket,
};

/// A limiter of `algorithm` on `store` under `prefix` (its keys are `{prefix:default:KEY}`),
/// that asks the store every time: no deny cache, no circuit breaker, a generous timeout.
fn limiter<A: Algorithm>(store: &RedisStore, algorithm: A, prefix: &str) -> RateLimiter<A> {
    RateLimiter::builder(store.clone(), algorithm)
        .prefix(prefix)
        .store_timeout(Duration::from_secs(5))
        .deny_cache(0)
        .circuit_breaker(CircuitBreaker::disabled())
        .build()
        .unwrap()
}

/// A check of `key` for `cost`, at `now` when given (else on the store's clock).
fn check<'a, A: Algorithm>(
    limiter: &'a RateLimiter<A>,
    key: &'a str,
    cost: u32,
    now: Option<u64>,
) -> Check<'a> {
    match now {
        Some(now) => Box::pin(limiter.check_at(key, cost, now)),
        None => Box::pin(limiter.check(key, cost)),
    }
}

type Check<'a> = Pin<Box<dyn Future<Output = Result<Decision, Error>> + Send + 'a>>;

/// Runs `checks` concurrently, polling each for the first time in index order, so their jobs
/// reach the batching queue in that order (the test runtime has one thread).
async fn in_order(mut checks: Vec<Check<'_>>) -> Vec<Result<Decision, Error>> {
    let mut out: Vec<Option<Result<Decision, Error>>> = checks.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, check) in checks.iter_mut().enumerate() {
            if out[i].is_none() {
                match check.as_mut().poll(cx) {
                    Poll::Ready(r) => out[i] = Some(r),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

/// Script calls served so far by these servers (`INFO commandstats`).
fn script_calls(conns: &mut [redis::Connection]) -> u64 {
    conns
        .iter_mut()
        .map(|c| crate::servers::command_calls(c, |name| name == "evalsha" || name == "eval"))
        .sum()
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

const T0: u64 = 1_800_000_000_000_000;

/// How much slower than real time the waves' simulated time runs: every quota's period and
/// every gap between waves is this many times a brisk test's (a second becomes an hour), so a
/// key's state holds for minutes to hours, far longer than the test runs. Redis expires keys
/// on its own clock, not on the explicit times (see `RateLimiter::check_at`): with the brisk
/// periods themselves, a key written with 100 ms to go was gone once 100 ms of real time had
/// passed, and a machine under load that stalled that long between two checks of one key
/// made the later one find the key rested on one side of the comparison only.
const SLOW: u32 = 3_600;

/// `limit` per `period` of the brisk test (see [`SLOW`]).
fn slowed(limit: u32, period: Duration) -> Quota {
    Quota::new(limit, period * SLOW)
}

/// The waves `name`'s test sends, each at its time: on four keys, costs up to one more than the
/// burst.
fn waves(name: &str) -> Vec<(u64, Vec<(String, u32)>)> {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D ^ name.len() as u64);
    let mut now = T0;
    (0..40)
        .map(|_| {
            now += rng.below(300_000) * u64::from(SLOW);
            let wave = (0..1 + rng.below(24))
                .map(|_| (format!("k{}", rng.below(4)), 1 + rng.below(6) as u32))
                .collect();
            (now, wave)
        })
        .collect()
}

/// Waves of concurrent checks at explicit times (see [`waves`]): the batched store must answer
/// exactly what one call per check, in the same order, answers. On one server: small batches
/// and one call in flight, so calls are strictly in arrival order; on a cluster (calls are not
/// held back there), batches big enough for a wave.
async fn same_as_one_call_each<A: Algorithm>(
    name: &str,
    algorithm: impl Fn() -> A,
    batched: RedisStore,
    single: RedisStore,
    conns: &mut [redis::Connection],
    (batching, max_calls_per_check): (Batching, f64),
) {
    let batched = limiter(
        &batched.with_batching(batching).unwrap(),
        algorithm(),
        &format!("b-{name}"),
    );
    let single = limiter(&single, algorithm(), &format!("s-{name}"));
    let (mut checks, mut calls, mut allowed, mut denied) = (0, 0, 0, 0);
    for (now, wave) in waves(name) {
        let before = script_calls(conns);
        let got = in_order(
            wave.iter()
                .map(|(key, cost)| check(&batched, key, *cost, Some(now)))
                .collect(),
        )
        .await;
        calls += script_calls(conns) - before;
        checks += wave.len() as u64;
        for ((key, cost), got) in wave.iter().zip(got) {
            let want = single.check_at(key.as_str(), *cost, now).await.unwrap();
            assert_eq!(
                got.unwrap(),
                want,
                "{name}: {key} cost {cost} at +{} µs",
                now - T0
            );
            if want.allowed {
                allowed += 1;
            } else {
                denied += 1;
            }
        }
    }
    eprintln!(
        "{name}: {checks} checks in {calls} script calls, {allowed} allowed, {denied} denied"
    );
    assert!(
        allowed > 20 && denied > 20,
        "{name}: the waves must both admit and deny"
    );
    assert!(
        (calls as f64) < checks as f64 * max_calls_per_check,
        "{name}: {checks} checks took {calls} script calls: not batched"
    );
}

/// `max_calls_per_check`: on one server, a wave of up to 24 checks leaves in batches of 7; on a
/// cluster, only checks on the same slot (here: the same key) share a call.
async fn every_algorithm(
    batched: impl Fn() -> RedisStore,
    conns: &mut [redis::Connection],
    setup: (Batching, f64),
) {
    let q = slowed(10, Duration::from_secs(1)).burst(5);
    let gcra = || Gcra::new(q).unwrap();
    same_as_one_call_each("gcra", gcra, batched(), batched(), conns, setup).await;
    let bucket = || TokenBucket::new(q).unwrap();
    same_as_one_call_each("tb", bucket, batched(), batched(), conns, setup).await;
    let window = || SlidingWindow::new(slowed(5, Duration::from_secs(1))).unwrap();
    same_as_one_call_each("sw", window, batched(), batched(), conns, setup).await;
    let multi = || MultiLimit::new([("s", q), ("m", slowed(30, Duration::from_secs(60)))]).unwrap();
    same_as_one_call_each("multi", multi, batched(), batched(), conns, setup).await;
}

#[tokio::test]
async fn batched_decisions_equal_one_call_each_on_standalone_redis() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    let batching = Batching::new().max_batch(7).max_in_flight(1);
    every_algorithm(|| store.clone(), &mut [redis.conn()], (batching, 0.25)).await;
}

#[tokio::test]
async fn batched_decisions_equal_one_call_each_on_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let store = cluster.store().await;
    let mut conns: Vec<_> = cluster.nodes.iter().map(RedisServer::conn).collect();
    every_algorithm(|| store.clone(), &mut conns, (Batching::new(), 0.75)).await;
}

/// The waves of [`waves`], each split every way: into batches of 1 to 8 checks and of a whole
/// wave. A wave's checks are all queued in one poll, so each call takes the next `max_batch` of
/// them in arrival order (the script calls counted say so): where the test above leaves its
/// batch boundaries to timing, here every boundary is placed, so that a key's checks are cut
/// apart at every point, and each split must answer what one call per check answers.
async fn every_split_as_one_call_each<A: Algorithm>(
    name: &str,
    algorithm: impl Fn() -> A,
    store: &RedisStore,
    conn: &mut redis::Connection,
) {
    let single = limiter(store, algorithm(), &format!("one-{name}"));
    let splits: Vec<_> = [1, 2, 3, 4, 5, 6, 7, 8, 24]
        .into_iter()
        .map(|size| {
            let batching = Batching::new().max_batch(size).max_in_flight(1);
            let batched = store.clone().with_batching(batching).unwrap();
            (
                size,
                limiter(&batched, algorithm(), &format!("split{size}-{name}")),
            )
        })
        .collect();
    // Loads the batch script, so that each call below is counted once.
    assert!(splits[0].1.check_at("warm", 1, T0).await.is_ok());
    for (now, wave) in waves(name) {
        let mut answers = Vec::new();
        for (size, batched) in &splits {
            let before = script_calls(std::slice::from_mut(conn));
            let got = in_order(
                wave.iter()
                    .map(|(key, cost)| check(batched, key, *cost, Some(now)))
                    .collect(),
            )
            .await;
            let calls = script_calls(std::slice::from_mut(conn)) - before;
            assert_eq!(
                calls,
                wave.len().div_ceil(*size) as u64,
                "{name}: {} checks in batches of {size}",
                wave.len()
            );
            answers.push((size, got));
        }
        for (i, (key, cost)) in wave.iter().enumerate() {
            let want = single.check_at(key.as_str(), *cost, now).await.unwrap();
            for (size, got) in &answers {
                assert_eq!(
                    got[i].as_ref().unwrap(),
                    &want,
                    "{name}: batches of {size}: {key} cost {cost} at +{} µs",
                    now - T0
                );
            }
        }
    }
}

#[tokio::test]
async fn every_split_of_a_wave_decides_as_one_call_each() {
    let redis = RedisServer::start();
    let store = redis.store().await;
    let conn = &mut redis.conn();
    let q = slowed(10, Duration::from_secs(1)).burst(5);
    every_split_as_one_call_each("gcra", || Gcra::new(q).unwrap(), &store, conn).await;
    every_split_as_one_call_each("tb", || TokenBucket::new(q).unwrap(), &store, conn).await;
    let window = slowed(5, Duration::from_secs(1));
    let sw = || SlidingWindow::new(window).unwrap();
    every_split_as_one_call_each("sw", sw, &store, conn).await;
    let parts = [("s", q), ("m", slowed(30, Duration::from_secs(60)))];
    let multi = || MultiLimit::new(parts).unwrap();
    every_split_as_one_call_each("multi", multi, &store, conn).await;
}

/// A key holding foreign or corrupted data fails its own check with the error a single call
/// gets; the other checks of the same call are decided normally. A key of another type fails
/// whether its checks would have written (cost 1) or not (cost above the burst: no write
/// tells the batch script that the key exists), and so does every repeat of a bad key.
#[tokio::test]
async fn a_bad_key_fails_alone_within_its_batch() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    for key in ["{be:default:wrongtype}:g", "{be:default:wrongtype-big}:g"] {
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg("x")
            .arg(1)
            .query(&mut conn)
            .unwrap();
    }
    let _: () = redis::cmd("SET")
        .arg("{be:default:corrupt}:g")
        .arg("not a number")
        .query(&mut conn)
        .unwrap();
    let gcra = || Gcra::new(Quota::per_minute(5)).unwrap();
    let single = limiter(&redis.store().await, gcra(), "be");
    let batched = redis.store().await.with_batching(Batching::new()).unwrap();
    let batched = limiter(&batched, gcra(), "be");
    let checks = [
        ("a", 1),
        ("wrongtype", 1),
        ("b", 1),
        ("corrupt", 1),
        ("wrongtype-big", 6),
        ("c", 1),
        ("wrongtype", 2),
        ("corrupt", 1),
    ];
    // Loads the script, so that the call below is counted once.
    assert!(batched.check("warm", 1).await.is_ok());
    let before = script_calls(&mut [redis.conn()]);
    let got = in_order(
        checks
            .iter()
            .map(|(k, cost)| check(&batched, k, *cost, None))
            .collect(),
    )
    .await;
    assert_eq!(script_calls(&mut [redis.conn()]) - before, 1, "one call");
    for ((key, cost), got) in checks.iter().zip(got) {
        match got {
            Ok(o) => {
                assert!(!key.contains("wrongtype") && !key.contains("corrupt"));
                assert!(o.allowed && o.remaining == 4, "{key}: {o:?}");
            }
            Err(e) => {
                let alone = single.check(*key, *cost).await.unwrap_err();
                eprintln!("{key}: {e}\n  alone: {alone}");
                let scopes = (e.scope(), alone.scope());
                let (Error::Redis(batched), Error::Redis(alone)) = (&e, &alone) else {
                    panic!("{key}: {e:?} / {alone:?}");
                };
                // The same error, by its scope (Redis 5 and 6 answer a check's WRONGTYPE
                // as `ERR Error running script …: WRONGTYPE …`, a batch's as `WRONGTYPE …`).
                assert_eq!(scopes.0, scopes.1, "{key}: {batched} / {alone}");
                assert!(
                    alone.to_string().contains(batched.detail().unwrap()),
                    "{key}: {batched} / {alone}"
                );
                assert!(!e.is_unavailable(), "{key}: {e} blamed on the store");
                assert!(key.contains("wrongtype") || key.contains("corrupt"));
            }
        }
    }
    // Nothing was written over the foreign data.
    for key in ["{be:default:wrongtype}:g", "{be:default:wrongtype-big}:g"] {
        let kind: String = redis::cmd("TYPE").arg(key).query(&mut conn).unwrap();
        assert_eq!(kind, "hash", "{key}");
    }
    let corrupt: String = redis::cmd("GET")
        .arg("{be:default:corrupt}:g")
        .query(&mut conn)
        .unwrap();
    assert_eq!(corrupt, "not a number");
}

/// A check whose caller stopped waiting while its batch was still queued is never sent, so it
/// takes no quota for a request that was already answered by the failure policy.
#[tokio::test]
async fn a_check_abandoned_in_the_queue_is_not_sent() {
    let redis = RedisServer::start();
    let store = redis
        .store()
        .await
        .with_batching(Batching::new().max_in_flight(1))
        .unwrap();
    let l = limiter(&store, Gcra::new(Quota::per_minute(5)).unwrap(), "ab");
    redis.signal("-STOP");
    let in_flight = {
        let l = l.clone();
        tokio::spawn(async move { l.check("first", 1).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let gave_up = tokio::time::timeout(Duration::from_millis(50), l.check("late", 1)).await;
    assert!(
        gave_up.is_err(),
        "Redis is stopped: the check cannot finish"
    );
    redis.signal("-CONT");
    assert!(in_flight.await.unwrap().unwrap().allowed);
    assert!(l.check("next", 1).await.unwrap().allowed);
    let mut conn = redis.conn();
    let exists = |k: &str, c: &mut redis::Connection| -> i64 {
        let key = format!("{}:g", l.storage_key(k));
        redis::cmd("EXISTS").arg(key).query(c).unwrap()
    };
    assert_eq!(exists("first", &mut conn), 1);
    assert_eq!(exists("next", &mut conn), 1);
    assert_eq!(
        exists("late", &mut conn),
        0,
        "an abandoned check took quota"
    );
}

#[tokio::test]
async fn bad_batching_settings_are_refused_by_name() {
    let redis = RedisServer::start();
    for (batching, field) in [
        (Batching::new().max_batch(0), "batching.max_batch"),
        (Batching::new().max_batch(5000), "batching.max_batch"),
        (Batching::new().max_in_flight(0), "batching.max_in_flight"),
    ] {
        let err = redis.store().await.with_batching(batching).unwrap_err();
        assert_eq!(err.field(), field);
        assert!(err.to_string().contains(field), "{err}");
    }
    let store = redis.store().await.with_batching(Batching::new()).unwrap();
    assert_eq!(store.batching(), Some(Batching::new()));
    assert_eq!(store.without_batching().batching(), None);
}

#[test]
fn batching_outside_a_runtime_is_refused() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = runtime.block_on(redis.store());
    let err = store.with_batching(Batching::new()).unwrap_err();
    assert_eq!(err.field(), "batching");
}

/// With Redis down, batched checks fail fast as unavailable (so the failure policy applies).
#[tokio::test]
async fn batched_checks_against_a_dead_redis_are_unavailable() {
    let store = RedisStore::connect_lazy(&dead_redis_url())
        .unwrap()
        .with_batching(Batching::new())
        .unwrap();
    let l = limiter(&store, Gcra::new(Quota::per_minute(5)).unwrap(), "dead");
    let started = Instant::now();
    let results = in_order((0..10).map(|_| check(&l, "k", 1, None)).collect()).await;
    for r in results {
        let e = r.unwrap_err();
        assert!(e.is_unavailable(), "{e}");
    }
    eprintln!("10 checks failed in {:?}", started.elapsed());
}

/// A call that Redis does not answer within `call_timeout` fails its checks with a timeout and
/// frees its in-flight slot: later checks are not stuck behind it.
#[tokio::test]
async fn a_stalled_call_times_out_and_frees_its_slot() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(150);
    let store = redis
        .store()
        .await
        .with_batching(Batching::new().max_in_flight(1).call_timeout(timeout))
        .unwrap();
    let l = limiter(&store, Gcra::new(Quota::per_minute(5)).unwrap(), "st");
    assert!(l.check("warm", 1).await.is_ok());
    redis.signal("-STOP");
    for key in ["a", "b"] {
        let started = Instant::now();
        let e = l.check(key, 1).await.unwrap_err();
        assert!(
            matches!(e, Error::Timeout(t) if t == timeout),
            "{key}: {e:?}"
        );
        assert!(e.is_unavailable());
        eprintln!("{key}: timed out after {:?}", started.elapsed());
    }
    redis.signal("-CONT");
    assert!(l.check("c", 1).await.unwrap().allowed);
}

/// A batchable custom algorithm: a check whose script returns something other than an array
/// (nil, a string) fails alone with an error of its own; the others in the same script call
/// get their replies.
#[tokio::test]
async fn custom_scripts_batch_and_a_bad_reply_fails_alone() {
    use tower_redis_ratelimit::algorithm::{Outcome, Rule, Scripted};

    /// Counts its key's checks; costs 2 and 3 stand for a script that answers nil and a
    /// string.
    struct Counter;
    impl Scripted for Counter {
        fn source(&self) -> &'static str {
            "if ARGV[2] == '2' then return nil end \
             if ARGV[2] == '3' then return 'x' end \
             local n = redis.call('INCR', KEYS[1]) \
             redis.call('PEXPIRE', KEYS[1], 60000) \
             return { n }"
        }
        fn key_suffixes(&self) -> &[&'static str] {
            &[":n"]
        }
        fn args(&self, cost: u32) -> Vec<u64> {
            vec![u64::from(cost)]
        }
        fn batchable(&self) -> bool {
            true
        }
        fn parse_reply(&self, reply: &[i64]) -> Result<Outcome, Error> {
            match *reply {
                [n] if n > 0 => Ok(Outcome::single(true, n as u64, Some(0), 0)),
                _ => Outcome::from_ints(reply),
            }
        }
    }
    impl Algorithm for Counter {
        fn name(&self) -> &'static str {
            "counter"
        }
        fn quota(&self) -> u64 {
            1_000
        }
        fn window(&self) -> Duration {
            Duration::from_secs(60)
        }
        fn rule(&self) -> Rule<'_> {
            Rule::script(self)
        }
    }

    let redis = RedisServer::start();
    let store = redis.store().await.with_batching(Batching::new()).unwrap();
    let l = limiter(&store, Counter, "custom");
    // Loads the script, so that the call below is counted once.
    assert_eq!(l.check("warm", 1).await.unwrap().remaining, 1);
    let before = script_calls(&mut [redis.conn()]);
    let got = in_order(
        [("a", 1), ("b", 2), ("c", 3), ("a", 1), ("d", 1)]
            .iter()
            .map(|(k, cost)| check(&l, k, *cost, None))
            .collect(),
    )
    .await;
    assert_eq!(script_calls(&mut [redis.conn()]) - before, 1, "one call");
    let remaining: Vec<_> = got
        .iter()
        .map(|r| {
            r.as_ref()
                .map(|d| d.remaining)
                .map_err(|e| crate::common::chain(e))
        })
        .collect();
    assert_eq!(remaining[0], Ok(1));
    assert_eq!(remaining[3], Ok(2), "the same key, counted in order");
    assert_eq!(remaining[4], Ok(1));
    for (bad, what) in [(1, "nil"), (2, "string")] {
        let e = remaining[bad].as_ref().unwrap_err();
        assert!(e.contains("not an array") && e.contains(what), "{e}");
    }
}
