//! Peeks, bans and resets in Redis against the in-memory twin, on a real Redis: every check,
//! alone and batched, every peek and every refund, after any sequence of checks, bans,
//! unbans, resets and refunds, answers the same in both stores; a peek spends nothing and shows
//! what the next check sees.

use std::time::Duration;

use proptest::{prelude::*, test_runner::TestRunner};

use super::{testing::TestRedis, Batching};
use crate::{
    algorithm::{Algorithm, FixedWindow, Gcra, MultiLimit, Outcome, SlidingWindow, TokenBucket},
    extract::Key,
    quota::Quota,
    store::{Backend, MemoryStore, StoreKey},
};

const T0: u64 = 1_700_000_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Check(u32),
    Peek,
    Ban(u64),
    Unban,
    Reset,
    /// The refund of the allowed check this many back among those not given back yet.
    Refund(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u32..6).prop_map(Op::Check),
        2 => Just(Op::Peek),
        1 => (1u64..450_000_000).prop_map(Op::Ban),
        1 => Just(Op::Unban),
        1 => Just(Op::Reset),
        2 => (0usize..3).prop_map(Op::Refund),
    ]
}

/// What both stores must agree on (where a charge lies is compared by the refund tests).
fn seen(o: &Outcome) -> impl PartialEq + std::fmt::Debug + '_ {
    (
        o.allowed,
        o.remaining,
        o.retry_after_us,
        o.reset_after_us,
        &o.parts,
        o.binding,
        o.banned,
    )
}

#[test]
fn peeks_bans_and_resets_match_the_in_memory_twin() {
    let redis = TestRedis::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(redis.store());
    let batched =
        rt.block_on(async { redis.store().await.with_batching(Batching::new()).unwrap() });
    // Periods of minutes: Redis expires the keys on its own clock, so a simulated period far
    // longer than the run's real time keeps a key's parts (a log and its totals) from
    // expiring apart while the machine is slow.
    let step = prop_oneof![3 => Just(0u64), 5 => 0..225_000_000u64, 1 => Just(60_000_000_000)];
    let cases = (1u32..6, 1u32..8, prop::collection::vec((step, op()), 1..40));
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let case_id = std::sync::atomic::AtomicU64::new(0);
    // Refunds that gave something back, in either store (the run must have some).
    let given = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&cases, |(limit, burst, steps)| {
            let period = Duration::from_secs(600);
            let q = Quota::new(limit, period).burst(burst);
            let w = Quota::new(limit, period);
            let algorithms: [Box<dyn Algorithm>; 5] = [
                Box::new(Gcra::new(q).unwrap()),
                Box::new(TokenBucket::new(q).unwrap()),
                Box::new(SlidingWindow::new(w).unwrap()),
                Box::new(FixedWindow::new(w).unwrap()),
                Box::new(
                    MultiLimit::new([("short", q), ("long", Quota::new(limit + 2, period * 3))])
                        .unwrap(),
                ),
            ];
            for algorithm in &algorithms {
                let algorithm = &**algorithm;
                let id = case_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let namespace = format!("steer{id}");
                let k = Key::from("k");
                let key = StoreKey::bounded(&namespace, Some(&k), 128);
                let memory = MemoryStore::new();
                let mut now = T0;
                // Allowed checks not given back yet: (cost, Redis's outcome, the twin's).
                let mut held: Vec<(u32, Outcome, Outcome)> = Vec::new();
                for (i, (step, op)) in steps.iter().enumerate() {
                    now += step;
                    let at = format!("{} step {i} ({op:?}) of {steps:?}", algorithm.name());
                    match *op {
                        Op::Check(cost) => {
                            let m = memory.check_now(algorithm, key, cost, Some(now)).unwrap();
                            let m = m.unwrap();
                            let r = rt.block_on(store.check(algorithm, key, cost, Some(now)));
                            let r = r.unwrap();
                            assert_eq!(seen(&r), seen(&m), "{at}");
                            if m.allowed {
                                held.push((cost, r, m.clone()));
                            }
                            // The same check, batched, on a copy of the key's state.
                            let b = rt.block_on(batched.check(algorithm, key, cost, Some(now)));
                            let b = b.unwrap();
                            if m.allowed {
                                // It took units again: take them in memory too.
                                let again = memory.check_now(algorithm, key, cost, Some(now));
                                let again = again.unwrap().unwrap();
                                assert_eq!(seen(&b), seen(&again), "{at} (batched)");
                            } else {
                                assert_eq!(seen(&b), seen(&m), "{at} (batched)");
                            }
                        }
                        Op::Peek => {
                            let m = rt.block_on(memory.peek(algorithm, key, Some(now))).unwrap();
                            let r = rt.block_on(store.peek(algorithm, key, Some(now))).unwrap();
                            assert_eq!(r, m, "{at}");
                            let again = rt.block_on(store.peek(algorithm, key, Some(now)));
                            assert_eq!(again.unwrap(), r, "{at}: a peek spent something");
                            // The next check sees what the peek showed.
                            if m.banned_us == 0 && algorithm.parts().is_empty() {
                                let c = memory.check_now(algorithm, key, 1, Some(now));
                                let c = c.unwrap().unwrap();
                                let r = rt.block_on(store.check(algorithm, key, 1, Some(now)));
                                assert_eq!(seen(&r.unwrap()), seen(&c), "{at}");
                                assert_eq!(c.allowed, m.outcome.remaining >= 1, "{at}");
                                if c.allowed {
                                    assert_eq!(c.remaining + 1, m.outcome.remaining, "{at}");
                                }
                            }
                        }
                        Op::Ban(us) => {
                            rt.block_on(memory.ban(key, us, Some(now))).unwrap();
                            rt.block_on(store.ban(key, us, Some(now))).unwrap();
                        }
                        Op::Refund(back) if back < held.len() => {
                            let (cost, r, m) = held.remove(held.len() - 1 - back);
                            let charge = |o: &Outcome| crate::decision::Charge {
                                cost,
                                quota: None,
                                local: false,
                                position: o.position.clone(),
                            };
                            let (cm, cr) = (charge(&m), charge(&r));
                            let rm = rt.block_on(memory.refund(algorithm, key, &cm, Some(now)));
                            let rr = rt.block_on(store.refund(algorithm, key, &cr, Some(now)));
                            let (rm, rr) = (rm.unwrap(), rr.unwrap());
                            assert_eq!(rr, rm, "{at}");
                            given.fetch_add(u64::from(rr), std::sync::atomic::Ordering::Relaxed);
                        }
                        Op::Refund(_) => {}
                        Op::Unban => {
                            rt.block_on(memory.unban(key)).unwrap();
                            rt.block_on(store.unban(key)).unwrap();
                        }
                        Op::Reset => {
                            rt.block_on(memory.reset(algorithm, key, Some(now)))
                                .unwrap();
                            rt.block_on(store.reset(algorithm, key, Some(now))).unwrap();
                            let p = rt.block_on(store.peek(algorithm, key, Some(now))).unwrap();
                            let quota = algorithm
                                .parts()
                                .iter()
                                .map(|p| p.quota)
                                .min()
                                .unwrap_or(algorithm.quota());
                            // Rested: as a key never seen (whose reset is 0, or for a fixed
                            // window the window's end).
                            let unseen = Key::from("unseen");
                            let unseen = StoreKey::bounded(&namespace, Some(&unseen), 128);
                            let fresh = rt.block_on(store.peek(algorithm, unseen, Some(now)));
                            let fresh = fresh.unwrap().outcome.reset_after_us;
                            assert_eq!(
                                (p.outcome.remaining, p.outcome.reset_after_us),
                                (quota, fresh),
                                "{at}: a reset key is rested"
                            );
                            if algorithm.name() != "fixed-window" {
                                assert_eq!(fresh, 0, "{at}");
                            }
                        }
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    assert!(given.into_inner() > 0, "no refund gave anything back");
}

/// A check, a reset, then a check taking the whole quota, all in one microsecond: the refund
/// of the first check gives nothing back (the reset gave back all it held), in Redis and in
/// memory, under every built-in algorithm, so the key stays spent.
async fn refund_across_a_reset(
    store: &(impl Backend + std::fmt::Debug),
    algorithm: &dyn Algorithm,
    key: StoreKey<'_>,
) {
    let at = format!("{} in {store:?}", algorithm.name());
    let before = store.check(algorithm, key, 1, Some(T0)).await.unwrap();
    assert!(before.allowed, "{at}");
    store.reset(algorithm, key, Some(T0)).await.unwrap();
    let after = store.check(algorithm, key, 2, Some(T0)).await.unwrap();
    assert!(after.allowed && after.remaining == 0, "{at}: {after:?}");
    let charge = crate::decision::Charge {
        cost: 1,
        quota: None,
        local: false,
        position: before.position,
    };
    let given = store
        .refund(algorithm, key, &charge, Some(T0))
        .await
        .unwrap();
    assert!(
        !given,
        "{at}: a refund from before the reset gave something back"
    );
    let next = store.check(algorithm, key, 1, Some(T0)).await.unwrap();
    assert!(
        !next.allowed,
        "{at}: the check after the reset lost its units"
    );
    // A check admitted after the reset is given back as before.
    let late = store
        .check(algorithm, key, 1, Some(T0 + 60_000_000))
        .await
        .unwrap();
    assert!(late.allowed, "{at}: {late:?}");
    let charge = crate::decision::Charge {
        position: late.position,
        ..charge
    };
    let given = store
        .refund(algorithm, key, &charge, Some(T0 + 60_000_000))
        .await;
    assert!(
        given.unwrap(),
        "{at}: a refund after the reset gave nothing back"
    );
}

#[test]
fn a_refund_of_a_check_admitted_before_a_reset_gives_nothing_back() {
    let redis = TestRedis::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(redis.store());
    let q = Quota::new(2, Duration::from_secs(60));
    let algorithms: [Box<dyn Algorithm>; 5] = [
        Box::new(Gcra::new(q).unwrap()),
        Box::new(TokenBucket::new(q).unwrap()),
        Box::new(SlidingWindow::new(q).unwrap()),
        Box::new(FixedWindow::new(q).unwrap()),
        Box::new(
            MultiLimit::new([
                ("short", q),
                ("long", Quota::new(4, Duration::from_secs(180))),
            ])
            .unwrap(),
        ),
    ];
    for (i, algorithm) in algorithms.iter().enumerate() {
        let namespace = format!("reset-refund{i}");
        let k = Key::from("k");
        let key = StoreKey::bounded(&namespace, Some(&k), 128);
        rt.block_on(refund_across_a_reset(&store, &**algorithm, key));
        rt.block_on(refund_across_a_reset(
            &MemoryStore::new(),
            &**algorithm,
            key,
        ));
    }
}

/// A ban denies every check, reservations included, and takes nothing; a reset keeps it.
#[test]
fn a_ban_takes_nothing_and_outlives_a_reset() {
    let redis = TestRedis::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(redis.store());
    let gcra = Gcra::new(Quota::per_second(10).burst(5)).unwrap();
    let k = Key::from("k");
    let key = StoreKey::bounded("steer-ban", Some(&k), 128);
    rt.block_on(async {
        store.check(&gcra, key, 2, Some(T0)).await.unwrap();
        store.ban(key, 5_000_000, Some(T0)).await.unwrap();
        let d = store.check(&gcra, key, 1, Some(T0 + 1)).await.unwrap();
        assert!(d.banned && !d.allowed);
        assert_eq!(d.retry_after_us, Some(4_999_999));
        let r = store.reserve(&gcra, key, 1, 4, Some(T0 + 2)).await.unwrap();
        assert!(r.outcome.banned && r.granted == 0);
        store.reset(&gcra, key, Some(T0 + 2)).await.unwrap();
        let p = store.peek(&gcra, key, Some(T0 + 3)).await.unwrap();
        assert_eq!((p.outcome.remaining, p.banned_us), (5, 4_999_997));
        // When the ban ends, the key has what its quota held: nothing was taken meanwhile.
        let d = store
            .check(&gcra, key, 5, Some(T0 + 5_000_000))
            .await
            .unwrap();
        assert!(d.allowed && !d.banned);
    });
}

/// GCRA's check reads the ban's copy in the key's state (`TAT:BAN`, see keys.rs), so every
/// writer of that state keeps it: a refund during a ban, a reset; an unban takes it off and
/// keeps the TAT. Checked on the stored values and on what checks answer, against the twin.
#[test]
fn the_ban_copy_in_a_gcra_state_is_kept_by_its_writers() {
    use crate::decision::Charge;
    let redis = TestRedis::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(redis.store());
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut raw =
        |key: &str| -> Option<String> { redis::cmd("GET").arg(key).query(&mut conn).unwrap() };
    let gcra = Gcra::new(Quota::per_second(10).burst(5)).unwrap();
    let memory = MemoryStore::new();
    let k = Key::from("k");
    let key = StoreKey::bounded("steer-copy", Some(&k), 128);
    let state = "{steer-copy:k}:g";
    let charge = |o: &Outcome| Charge {
        cost: 1,
        quota: None,
        local: false,
        position: o.position.clone(),
    };
    rt.block_on(async {
        let both = |cost: u32, now: u64| {
            let m = memory
                .check_now(&gcra, key, cost, Some(now))
                .unwrap()
                .unwrap();
            (store.check(&gcra, key, cost, Some(now)), m)
        };
        let (r, m) = both(1, T0);
        let first = r.await.unwrap();
        assert_eq!(seen(&first), seen(&m));
        assert_eq!(raw(state).as_deref(), Some("1700000000100000"));
        store.ban(key, 5_000_000, Some(T0)).await.unwrap();
        memory.ban(key, 5_000_000, Some(T0)).await.unwrap();
        assert_eq!(
            raw(state).as_deref(),
            Some("1700000000100000:1700000005000000")
        );
        // A refund during the ban gives the unit back and keeps the ban.
        assert!(store
            .refund(&gcra, key, &charge(&first), Some(T0 + 10))
            .await
            .unwrap());
        assert!(memory
            .refund(&gcra, key, &charge(&m), Some(T0 + 10))
            .await
            .unwrap());
        assert_eq!(raw(state).as_deref(), Some("0:1700000005000000"));
        let (r, m) = both(1, T0 + 20);
        let d = r.await.unwrap();
        assert!(d.banned && m.banned);
        assert_eq!(seen(&d), seen(&m));
        // A reset keeps the ban; an unban lifts it and keeps what the state holds.
        store.reset(&gcra, key, Some(T0 + 25)).await.unwrap();
        memory.reset(&gcra, key, Some(T0 + 25)).await.unwrap();
        assert_eq!(raw(state).as_deref(), Some("0:1700000005000000"));
        store.unban(key).await.unwrap();
        memory.unban(key).await.unwrap();
        assert_eq!(raw(state), None);
        let (r, m) = both(2, T0 + 30);
        assert_eq!(seen(&r.await.unwrap()), seen(&m));
        store.ban(key, 1_000_000, Some(T0 + 40)).await.unwrap();
        memory.ban(key, 1_000_000, Some(T0 + 40)).await.unwrap();
        assert_eq!(
            raw(state).as_deref(),
            Some("1700000000200030:1700000001000040")
        );
        store.unban(key).await.unwrap();
        memory.unban(key).await.unwrap();
        assert_eq!(raw(state).as_deref(), Some("1700000000200030"));
        let (r, m) = both(1, T0 + 50);
        assert_eq!(seen(&r.await.unwrap()), seen(&m));
    });
}

/// The store refuses what GCRA's check does not validate (lua/gcra.lua): a cost of 0, an
/// explicit time past 2^52; nothing is written.
#[test]
fn the_store_refuses_what_gcras_check_does_not_validate() {
    let redis = TestRedis::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let gcra = Gcra::new(Quota::per_second(10)).unwrap();
    let k = Key::from("k");
    let key = StoreKey::bounded("steer-refuse", Some(&k), 128);
    rt.block_on(async {
        for store in [
            redis.store().await,
            redis.store().await.with_batching(Batching::new()).unwrap(),
        ] {
            for (cost, now) in [(0, Some(T0)), (0, None), (1, Some((1 << 52) + 1))] {
                let e = store.check(&gcra, key, cost, now).await.unwrap_err();
                assert!(matches!(e, crate::Error::InvalidInput(_)), "{e:?}");
            }
            let p = store.peek(&gcra, key, Some(T0)).await.unwrap();
            assert_eq!((p.outcome.remaining, p.outcome.reset_after_us), (10, 0));
        }
    });
}

/// A limit's marker keeps the first token set until the server loses it (here `FLUSHALL`,
/// as a restart without persistence would): then the next look sets the token it brings, and
/// the marker expires a day after the last look.
#[test]
fn a_marker_keeps_its_token_until_the_server_loses_it() {
    let redis = TestRedis::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = redis.store().await;
        assert_eq!(store.mark("rl:marked", b"first").await.unwrap(), b"first");
        assert_eq!(store.mark("rl:marked", b"second").await.unwrap(), b"first");
        assert_eq!(store.mark("rl:other", b"third").await.unwrap(), b"third");
        let client = redis::Client::open(redis.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let ttl: i64 = redis::cmd("PTTL")
            .arg("{rl:marked:#epoch}:m")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!((86_000_000..=86_400_000).contains(&ttl), "{ttl}");
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        assert_eq!(store.mark("rl:marked", b"second").await.unwrap(), b"second");
    });
}

/// Published top keys are read back with their instance while they count, and an instance
/// that stopped publishing drops out once its time has passed (a lower bound waited here).
#[test]
fn published_top_keys_count_for_their_time() {
    let redis = TestRedis::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = redis.store().await;
        let ttl = Duration::from_millis(300);
        store
            .publish_top("rl:top", "a", b"snap-a", ttl)
            .await
            .unwrap();
        store
            .publish_top("rl:top", "b", b"snap-b", ttl)
            .await
            .unwrap();
        let mut read = store.read_tops("rl:top", ttl).await.unwrap();
        read.sort();
        assert_eq!(
            read,
            [
                (b"a".to_vec(), b"snap-a".to_vec()),
                (b"b".to_vec(), b"snap-b".to_vec())
            ]
        );
        assert!(store.read_tops("rl:other", ttl).await.unwrap().is_empty());
        tokio::time::sleep(Duration::from_millis(400)).await;
        store
            .publish_top("rl:top", "b", b"snap-b2", ttl)
            .await
            .unwrap();
        assert_eq!(
            store.read_tops("rl:top", ttl).await.unwrap(),
            [(b"b".to_vec(), b"snap-b2".to_vec())]
        );
        let client = redis::Client::open(redis.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let fields: Vec<String> = redis::cmd("HKEYS")
            .arg("{rl:top:#epoch}:t")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(fields, ["b"], "the silent instance's snapshot is gone");
    });
}
