//! How the replies of a reservation (a unit lease's call) and of a place in a schedule read.
//! Only GCRA and the token bucket reserve, only GCRA schedules; their calls are in
//! `algorithms/`.

use super::reply;
use crate::{
    algorithm::Outcome,
    error::Error,
    store::{Reserved, Scheduled},
};

/// Reads a reservation's reply (see [`Reserved::from_ints`]).
pub(crate) fn parse(reply: redis::Value, cost: u32, up_to: u32) -> Result<Reserved, Error> {
    let ints = reply::ints(reply)?;
    if let [2, 0, left, reset, 0] = *ints.as_slice() {
        if left > 0 && left == reset {
            return Ok(Reserved {
                outcome: Outcome::banned(left as u64),
                granted: 0,
            });
        }
    }
    Reserved::from_ints(&ints, cost, up_to)
}

/// Reads a schedule's reply (see [`Scheduled::from_ints`]).
pub(crate) fn parse_schedule(reply: redis::Value) -> Result<Scheduled, Error> {
    Scheduled::from_ints(&reply::ints(reply)?)
}

/// The reservation scripts against the in-memory twin, on a real Redis: a reservation of up to
/// `up_to` units (at least `cost`) grants what the twin had available, capped, and leaves the
/// key as the twin's check of `cost` and then of the rest of the grant leaves it; a denial is
/// the twin's denial of `cost`.
#[cfg(test)]
mod agreement {
    use std::time::Duration;

    use proptest::{prelude::*, test_runner::TestRunner};

    use super::super::testing::TestRedis;
    use crate::{
        algorithm::{Algorithm, Gcra, TokenBucket},
        extract::Key,
        quota::Quota,
        store::{Backend, MemoryStore, StoreKey},
    };

    const T0: u64 = 1_700_000_000_000_000;

    #[test]
    fn reservations_match_the_in_memory_twin() {
        let redis = TestRedis::start();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = rt.block_on(redis.store());
        let step = prop_oneof![3 => Just(0u64), 5 => 0..2_000_000u64, 1 => Just(600_000_000)];
        let cases = (1u32..12, 1u32..16).prop_flat_map(move |(limit, burst)| {
            let max = limit.max(burst) + 2;
            let steps = prop::collection::vec((step.clone(), 1..=max, 1..=3 * max), 1..40);
            (Just((limit, burst)), steps)
        });
        let mut runner = TestRunner::new(ProptestConfig {
            cases: 64,
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        let case_id = std::sync::atomic::AtomicU64::new(0);
        runner
            .run(&cases, |((limit, burst), steps)| {
                let q = Quota::new(limit, Duration::from_secs(600)).burst(burst);
                let algorithms: [Box<dyn Algorithm>; 2] = [
                    Box::new(Gcra::new(q).unwrap()),
                    Box::new(TokenBucket::new(q).unwrap()),
                ];
                for algorithm in &algorithms {
                    let id = case_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let namespace = format!("reserve{id}");
                    let k = Key::from("k");
                    let key = StoreKey::bounded(&namespace, Some(&k), 128);
                    let memory = MemoryStore::new();
                    let mut now = T0;
                    for (i, &(step, cost, up_to)) in steps.iter().enumerate() {
                        now += step;
                        let at = format!("{} step {i} of {steps:?}", algorithm.name());
                        let r =
                            rt.block_on(store.reserve(&**algorithm, key, cost, up_to, Some(now)));
                        let r = r.unwrap();
                        let twin = |cost| memory.check_now(&**algorithm, key, cost, Some(now));
                        let m = twin(cost).unwrap().unwrap();
                        if !m.allowed {
                            assert_eq!((&r.outcome, r.granted), (&m, 0), "{at}");
                            continue;
                        }
                        let available = m.remaining + u64::from(cost);
                        let want = u64::from(up_to).min(available).max(u64::from(cost));
                        assert_eq!(u64::from(r.granted), want, "{at}");
                        let last = match want - u64::from(cost) {
                            0 => m,
                            rest => twin(rest as u32).unwrap().unwrap(),
                        };
                        assert!(last.allowed, "{at}");
                        let o = &r.outcome;
                        assert_eq!(
                            (o.allowed, o.remaining, o.retry_after_us, o.reset_after_us),
                            (true, last.remaining, Some(0), last.reset_after_us),
                            "{at}"
                        );
                    }
                }
                Ok(())
            })
            .unwrap();
    }
}
