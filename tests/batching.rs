//! Exact batching (`RedisStore::with_batching`): checks decided together in one script call get
//! exactly the decisions of one call each, in arrival order; a bad key fails alone; a check whose
//! caller gave up is never sent; bad settings are refused by name.
//!
//! The exactness of batching under real concurrency (many stores x many tasks on one key) is
//! covered by `tests/exactness.rs`, which runs every algorithm on a batched store too.

mod common;

use std::{
    task::Poll,
    time::{Duration, Instant},
};

use common::{dead_redis_url, RedisCluster, RedisServer};
use tower_redis_ratelimit::{
    redis, Algorithm, Batching, Error, Gcra, Key, MultiLimit, Outcome, Quota, RedisStore,
    SlidingWindow, Store, StoreKey, TokenBucket,
};

/// `store.check` on the base key `{namespace:key}`.
fn check_at_base<'a>(
    store: &'a RedisStore,
    algorithm: &'a dyn Algorithm,
    base: &'a str,
    cost: u32,
    now: Option<u64>,
) -> Check<'a> {
    Box::pin(async move {
        let (namespace, key) = base
            .trim_start_matches('{')
            .trim_end_matches('}')
            .split_once(':')
            .expect("{namespace:key}");
        let key = Key::from(key);
        store
            .check(algorithm, StoreKey::new(namespace, Some(&key)), cost, now)
            .await
    })
}

type Check<'a> = tower_redis_ratelimit::BoxFuture<'a, Result<Outcome, Error>>;

/// Runs `checks` concurrently, polling each for the first time in index order, so their jobs
/// reach the batching queue in that order (the test runtime has one thread).
async fn in_order(mut checks: Vec<Check<'_>>) -> Vec<Result<Outcome, Error>> {
    let mut out: Vec<Option<Result<Outcome, Error>>> = checks.iter().map(|_| None).collect();
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
        .map(|c| common::command_calls(c, |name| name == "evalsha" || name == "eval"))
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

/// Waves of concurrent checks at explicit times, on four keys with costs up to one more than
/// the burst: the batched store must answer exactly what one call per check, in the same order,
/// answers. On one server: small batches and one call in flight, so calls are strictly in
/// arrival order; on a cluster (calls are not held back there), batches big enough for a wave.
async fn same_as_one_call_each<A: Algorithm>(
    name: &str,
    algorithm: A,
    batched: RedisStore,
    single: RedisStore,
    conns: &mut [redis::Connection],
    (batching, max_calls_per_check): (Batching, f64),
) {
    let batched = batched.with_batching(batching).unwrap();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D ^ name.len() as u64);
    let (mut now, mut checks, mut calls, mut allowed, mut denied) = (T0, 0, 0, 0, 0);
    for _wave in 0..40 {
        now += rng.below(300_000);
        let wave: Vec<(String, u32)> = (0..1 + rng.below(24))
            .map(|_| (format!("k{}", rng.below(4)), 1 + rng.below(6) as u32))
            .collect();
        let keys_b: Vec<String> = wave
            .iter()
            .map(|(k, _)| format!("{{b-{name}:{k}}}"))
            .collect();
        let before = script_calls(conns);
        let got = in_order(
            wave.iter()
                .zip(&keys_b)
                .map(|((_, cost), key)| check_at_base(&batched, &algorithm, key, *cost, Some(now)))
                .collect(),
        )
        .await;
        calls += script_calls(conns) - before;
        checks += wave.len() as u64;
        for ((key, cost), got) in wave.iter().zip(got) {
            let want = check_at_base(
                &single,
                &algorithm,
                &format!("{{s-{name}:{key}}}"),
                *cost,
                Some(now),
            )
            .await
            .unwrap();
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
    let q = Quota::per_second(10).burst(5);
    same_as_one_call_each(
        "gcra",
        Gcra::new(q).unwrap(),
        batched(),
        batched(),
        conns,
        setup,
    )
    .await;
    same_as_one_call_each(
        "tb",
        TokenBucket::new(q).unwrap(),
        batched(),
        batched(),
        conns,
        setup,
    )
    .await;
    same_as_one_call_each(
        "sw",
        SlidingWindow::new(Quota::new(5, Duration::from_secs(1))).unwrap(),
        batched(),
        batched(),
        conns,
        setup,
    )
    .await;
    let multi = MultiLimit::new([("s", q), ("m", Quota::per_minute(30))]).unwrap();
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

/// A key holding foreign or corrupted data fails its own check with the error a single call
/// gets; the other checks of the same call are decided normally. A key of another type fails
/// whether its checks would have written (cost 1) or not (cost above the burst: no write
/// tells the batch script that the key exists), and so does every repeat of a bad key.
#[tokio::test]
async fn a_bad_key_fails_alone_within_its_batch() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    for key in ["{be:wrongtype}:g", "{be:wrongtype-big}:g"] {
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg("x")
            .arg(1)
            .query(&mut conn)
            .unwrap();
    }
    let _: () = redis::cmd("SET")
        .arg("{be:corrupt}:g")
        .arg("not a number")
        .query(&mut conn)
        .unwrap();
    let gcra = Gcra::new(Quota::per_minute(5)).unwrap();
    let single = redis.store().await;
    let batched = redis.store().await.with_batching(Batching::new()).unwrap();
    let checks = [
        ("{be:a}", 1),
        ("{be:wrongtype}", 1),
        ("{be:b}", 1),
        ("{be:corrupt}", 1),
        ("{be:wrongtype-big}", 6),
        ("{be:c}", 1),
        ("{be:wrongtype}", 2),
        ("{be:corrupt}", 1),
    ];
    // Loads the script, so that the call below is counted once.
    assert!(check_at_base(&batched, &gcra, "{be:warm}", 1, None)
        .await
        .is_ok());
    let before = script_calls(&mut [redis.conn()]);
    let got = in_order(
        checks
            .iter()
            .map(|(k, cost)| check_at_base(&batched, &gcra, k, *cost, None))
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
                let alone = check_at_base(&single, &gcra, key, *cost, None)
                    .await
                    .unwrap_err();
                eprintln!("{key}: {e}\n  alone: {alone}");
                let (Error::Redis(batched), Error::Redis(alone)) = (&e, &alone) else {
                    panic!("{key}: {e:?} / {alone:?}");
                };
                assert_eq!(batched.code(), alone.code(), "{key}");
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
    for key in ["{be:wrongtype}:g", "{be:wrongtype-big}:g"] {
        let kind: String = redis::cmd("TYPE").arg(key).query(&mut conn).unwrap();
        assert_eq!(kind, "hash", "{key}");
    }
    let corrupt: String = redis::cmd("GET")
        .arg("{be:corrupt}:g")
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
    let gcra = Gcra::new(Quota::per_minute(5)).unwrap();
    redis.signal("-STOP");
    let in_flight = {
        let (store, gcra) = (store.clone(), gcra.clone());
        tokio::spawn(async move { check_at_base(&store, &gcra, "{ab:first}", 1, None).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        check_at_base(&store, &gcra, "{ab:late}", 1, None),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "Redis is stopped: the check cannot finish"
    );
    redis.signal("-CONT");
    assert!(in_flight.await.unwrap().unwrap().allowed);
    assert!(
        check_at_base(&store, &gcra, "{ab:next}", 1, None)
            .await
            .unwrap()
            .allowed
    );
    let mut conn = redis.conn();
    let exists = |k: &str, c: &mut redis::Connection| -> i64 {
        redis::cmd("EXISTS").arg(format!("{k}:g")).query(c).unwrap()
    };
    assert_eq!(exists("{ab:first}", &mut conn), 1);
    assert_eq!(exists("{ab:next}", &mut conn), 1);
    assert_eq!(
        exists("{ab:late}", &mut conn),
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
    let gcra = Gcra::new(Quota::per_minute(5)).unwrap();
    let started = Instant::now();
    let results = in_order(
        (0..10)
            .map(|_| check_at_base(&store, &gcra, "{dead:k}", 1, None))
            .collect(),
    )
    .await;
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
    let gcra = Gcra::new(Quota::per_minute(5)).unwrap();
    assert!(check_at_base(&store, &gcra, "{st:warm}", 1, None)
        .await
        .is_ok());
    redis.signal("-STOP");
    for key in ["{st:a}", "{st:b}"] {
        let started = Instant::now();
        let e = check_at_base(&store, &gcra, key, 1, None)
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::Timeout(t) if t == timeout),
            "{key}: {e:?}"
        );
        assert!(e.is_unavailable());
        eprintln!("{key}: timed out after {:?}", started.elapsed());
    }
    redis.signal("-CONT");
    assert!(
        check_at_base(&store, &gcra, "{st:c}", 1, None)
            .await
            .unwrap()
            .allowed
    );
}

/// The batch form of a custom script: a check whose script returns something other than an
/// array (nil, a string) gets an error of its own; the others get their replies.
#[tokio::test]
async fn custom_batch_scripts_answer_every_check() {
    use tower_redis_ratelimit::batch_script;
    let redis = RedisServer::start();
    let script = batch_script(
        "if ARGV[2] == 'nil' then return nil end \
         if ARGV[2] == 'str' then return 'x' end \
         return { tonumber(redis.call('INCR', KEYS[1])) }",
    );
    let mut inv = script.prepare_invoke();
    for k in ["{c}:1", "{c}:2", "{c}:3", "{c}:4"] {
        inv.key(k);
    }
    inv.arg("").arg(4);
    for a in ["ok", "nil", "str", "ok"] {
        inv.arg(1).arg(1).arg(a);
    }
    let reply: Vec<redis::Value> = inv.invoke(&mut redis.conn()).unwrap();
    assert_eq!(reply.len(), 4, "{reply:?}");
    assert_eq!(reply[0], redis::Value::Array(vec![redis::Value::Int(1)]));
    for bad in &reply[1..3] {
        let redis::Value::BulkString(msg) = bad else {
            panic!("{reply:?}");
        };
        assert!(
            String::from_utf8_lossy(msg).contains("not an array"),
            "{reply:?}"
        );
    }
    assert_eq!(reply[3], redis::Value::Array(vec![redis::Value::Int(1)]));
}
