//! Peeks, bans and resets in Redis against the in-memory twin, on a real Redis: every check,
//! alone and batched, every peek, after any sequence of checks, bans, unbans and resets,
//! answers the same in both stores; a peek spends nothing and shows what the next check sees.

use std::time::Duration;

use proptest::{prelude::*, test_runner::TestRunner};

use super::{testing::TestRedis, Batching};
use crate::{
    algorithm::{Algorithm, Gcra, MultiLimit, Outcome, SlidingWindow, TokenBucket},
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
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u32..6).prop_map(Op::Check),
        2 => Just(Op::Peek),
        1 => (1u64..3_000_000).prop_map(Op::Ban),
        1 => Just(Op::Unban),
        1 => Just(Op::Reset),
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
    let step = prop_oneof![3 => Just(0u64), 5 => 0..1_500_000u64, 1 => Just(400_000_000)];
    let cases = (1u32..6, 1u32..8, prop::collection::vec((step, op()), 1..40));
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let case_id = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&cases, |(limit, burst, steps)| {
            let period = Duration::from_secs(4);
            let q = Quota::new(limit, period).burst(burst);
            let w = Quota::new(limit, period);
            let algorithms: [Box<dyn Algorithm>; 4] = [
                Box::new(Gcra::new(q).unwrap()),
                Box::new(TokenBucket::new(q).unwrap()),
                Box::new(SlidingWindow::new(w).unwrap()),
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
                for (i, (step, op)) in steps.iter().enumerate() {
                    now += step;
                    let at = format!("{} step {i} ({op:?}) of {steps:?}", algorithm.name());
                    match *op {
                        Op::Check(cost) => {
                            let m = memory.check_now(algorithm, key, cost, Some(now)).unwrap();
                            let m = m.unwrap();
                            let r = rt.block_on(store.check(algorithm, key, cost, Some(now)));
                            assert_eq!(seen(&r.unwrap()), seen(&m), "{at}");
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
                        Op::Unban => {
                            rt.block_on(memory.unban(key)).unwrap();
                            rt.block_on(store.unban(key)).unwrap();
                        }
                        Op::Reset => {
                            rt.block_on(memory.reset(algorithm, key)).unwrap();
                            rt.block_on(store.reset(algorithm, key)).unwrap();
                            let p = rt.block_on(store.peek(algorithm, key, Some(now))).unwrap();
                            let quota = algorithm
                                .parts()
                                .iter()
                                .map(|p| p.quota)
                                .min()
                                .unwrap_or(algorithm.quota());
                            assert_eq!(
                                (p.outcome.remaining, p.outcome.reset_after_us),
                                (quota, 0),
                                "{at}: a reset key is rested"
                            );
                        }
                    }
                }
            }
            Ok(())
        })
        .unwrap();
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
        store.reset(&gcra, key).await.unwrap();
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
