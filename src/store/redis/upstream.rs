//! What upstreams said, in Redis: `lua/upstream_take.lua` and `lua/upstream_learn.lua` on a
//! hash under the throttle's key (`:u`, see `keys.rs`).

use std::{sync::LazyLock, time::Duration};

use redis::{Cmd, Script, Value};

use super::{keys, link::evalsha, reply, RedisStore};
use crate::{
    error::Error,
    store::{
        micros,
        upstream::{Blind, Gate, Learned},
        BoxFuture, KeyBuf, StoreKey,
    },
};

static TAKE: LazyLock<Script> = prelude_script!("upstream_take.lua");
static LEARN: LazyLock<Script> = prelude_script!("upstream_learn.lua");

/// The largest time a script takes: 2^52 µs, as the prelude checks.
const MAX_US: u64 = 1 << 52;

fn call(script: &Script, key: StoreKey<'_>) -> Cmd {
    let mut buf = KeyBuf::new();
    keys::write_key(key, keys::UPSTREAM, &mut buf);
    evalsha(
        script,
        1,
        |cmd| {
            cmd.arg(buf.as_bytes());
        },
        None,
    )
}

fn parse_gate(reply: Value) -> Result<Gate, Error> {
    let items = reply::ints(reply)?;
    match items.as_slice() {
        [1, 0, how @ (0..=2)] => {
            let how = [Blind::Counted, Blind::Blind, Blind::Probe][*how as usize];
            Ok(Gate::new(true, Duration::ZERO).blind(how))
        }
        [0, wait, 0] if *wait > 0 => Ok(Gate::new(false, Duration::from_micros(*wait as u64))),
        _ => Err(Error::InvalidReply(format!(
            "take: expected {{0|1, wait, 0|1|2}}: {items:?}"
        ))),
    }
}

/// The upstream calls of [`Backend`](crate::store::Backend) on a [`RedisStore`].
impl RedisStore {
    pub(super) fn take_units<'a>(
        &'a self,
        key: StoreKey<'a>,
        cost: u32,
    ) -> BoxFuture<'a, Result<Gate, Error>> {
        let mut cmd = call(&TAKE, key);
        cmd.arg(cost);
        Box::pin(async move { parse_gate(self.link.eval(&TAKE, &cmd).await?) })
    }

    pub(super) fn learn_said<'a>(
        &'a self,
        key: StoreKey<'a>,
        learned: Learned,
        how: Blind,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let mut cmd = call(&LEARN, key);
        let us = |d: Option<Duration>| d.map_or(0, |d| micros(d).min(MAX_US));
        cmd.arg(us(learned.pause));
        match (learned.remaining, learned.reset) {
            (Some(r), Some(t)) => cmd.arg(r.min(MAX_US)).arg(us(Some(t))),
            _ => cmd.arg(-1).arg(-1),
        };
        cmd.arg(match how {
            Blind::Counted => 0,
            Blind::Blind => 1,
            Blind::Probe => 2,
        });
        Box::pin(async move {
            self.link.eval(&LEARN, &cmd).await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_replies_are_checked() {
        let arr = |v: Vec<i64>| Value::Array(v.into_iter().map(Value::Int).collect());
        assert!(parse_gate(arr(vec![1, 0, 0])).unwrap().go);
        assert_eq!(parse_gate(arr(vec![1, 0, 1])).unwrap().blind, Blind::Blind);
        assert_eq!(parse_gate(arr(vec![1, 0, 2])).unwrap().blind, Blind::Probe);
        assert_eq!(
            parse_gate(arr(vec![0, 1500, 0])).unwrap(),
            Gate::new(false, Duration::from_micros(1500))
        );
        for bad in [
            arr(vec![0, 0, 0]),
            arr(vec![1, 5, 0]),
            arr(vec![2, 0, 0]),
            arr(vec![0, -3, 0]),
            arr(vec![1, 0]),
            arr(vec![1, 0, 3]),
        ] {
            assert!(parse_gate(bad).is_err());
        }
    }
}

/// The scripts and their in-memory twin, call by call on a real Redis and a `MemoryStore`
/// (the throttle's side is in `tests/adaptive.rs`).
#[cfg(test)]
mod agreement {
    use std::{future::Future, sync::Arc};

    use super::super::testing::TestRedis;
    use crate::{
        extract::Key,
        store::{clock::ManualClock, Backend, Blind, Learned, MemoryStore, Store, StoreKey},
    };
    use std::time::Duration;

    async fn on_both<F, Fut>(redis: &TestRedis, f: F)
    where
        F: Fn(Arc<dyn Store>, &'static str) -> Fut,
        Fut: Future<Output = ()>,
    {
        f(Arc::new(redis.store().await), "redis").await;
        f(Arc::new(MemoryStore::new()), "memory").await;
    }

    /// An answer that took long to come back (its end looks a second later) never gives
    /// back units already spent in the window it belongs to.
    #[tokio::test]
    async fn a_late_answer_never_gives_back_units_spent_in_its_window() {
        let redis = TestRedis::start();
        on_both(&redis, |store, name| async move {
            let k = Key::from("late");
            let key = StoreKey::bounded("rv", Some(&k), 128);
            let w = |r| Learned::new().window(r, Duration::from_secs(10));
            store.learn(key, w(0), Blind::Counted).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            store.learn(key, w(9), Blind::Counted).await.unwrap();
            assert!(!store.take(key, 1).await.unwrap().go, "{name}");
        })
        .await;
    }

    /// The call that went first to learn a new window got an answer without one: the others
    /// stop waiting at once and go blind (instead of waiting for the probe's 1 s deadline,
    /// then probing again, one call a second).
    #[tokio::test]
    async fn after_a_probe_that_learned_nothing_calls_go_blind_again() {
        let redis = TestRedis::start();
        on_both(&redis, |store, name| async move {
            let k = Key::from("probe");
            let key = StoreKey::bounded("rv", Some(&k), 128);
            let w = Learned::new().window(5, Duration::from_millis(300));
            store.learn(key, w, Blind::Counted).await.unwrap();
            tokio::time::sleep(Duration::from_millis(400)).await;
            let first = store.take(key, 1).await.unwrap();
            assert_eq!((first.go, first.blind), (true, Blind::Probe), "{name}");
            assert!(
                !store.take(key, 1).await.unwrap().go,
                "{name}: waits for the probe"
            );
            store
                .learn(key, Learned::new(), Blind::Probe)
                .await
                .unwrap();
            let next = store.take(key, 1).await.unwrap();
            assert_eq!((next.go, next.blind), (true, Blind::Blind), "{name}");
        })
        .await;
    }

    /// Blind calls whose answers came back are not taken off the next window (100 answered
    /// header-less calls must not leave a window of 50 with none).
    #[tokio::test]
    async fn answered_blind_calls_are_not_taken_off_the_next_window() {
        let redis = TestRedis::start();
        on_both(&redis, |store, name| async move {
            let k = Key::from("blind");
            let key = StoreKey::bounded("rv", Some(&k), 128);
            for _ in 0..100 {
                let g = store.take(key, 1).await.unwrap();
                assert_eq!(g.blind, Blind::Blind, "{name}");
                store.learn(key, Learned::new(), g.blind).await.unwrap();
            }
            let g = store.take(key, 1).await.unwrap();
            let w = Learned::new().window(50, Duration::from_secs(10));
            store.learn(key, w, g.blind).await.unwrap();
            let mut went = 0;
            while store.take(key, 1).await.unwrap().go {
                went += 1;
                assert!(went <= 50, "{name}");
            }
            assert_eq!(went, 50, "{name}");
        })
        .await;
    }

    /// Redis and the in-memory twin agree on a sequence with blind calls, a zero pause and
    /// a window.
    #[tokio::test]
    async fn the_twin_agrees_with_redis() {
        let redis = TestRedis::start();
        let mut went = Vec::new();
        for store in [
            Arc::new(redis.store().await) as Arc<dyn Store>,
            Arc::new(MemoryStore::new()),
        ] {
            let k = Key::from("twin");
            let key = StoreKey::bounded("rv", Some(&k), 128);
            for _ in 0..3 {
                assert!(store.take(key, 1).await.unwrap().go);
            }
            let zero = Learned::new().pause(Duration::ZERO);
            store.learn(key, zero, Blind::Counted).await.unwrap();
            let w = Learned::new().window(10, Duration::from_secs(5));
            store.learn(key, w, Blind::Counted).await.unwrap();
            let mut n = 0;
            for _ in 0..12 {
                n += u32::from(store.take(key, 1).await.unwrap().go);
            }
            went.push(n);
        }
        assert_eq!(went[0], went[1], "redis {} memory {}", went[0], went[1]);
        assert_eq!(
            went[0], 7,
            "10 left, less the 3 blind calls still on their way"
        );
    }

    /// The in-memory state expires as the Redis key does: an expired state does not come back
    /// with its old window and probe.
    #[tokio::test]
    async fn the_in_memory_state_expires_like_the_redis_key() {
        let clock = ManualClock::new();
        let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let k = Key::from("expiry");
        let key = StoreKey::bounded("rv", Some(&k), 128);
        let w = Learned::new().window(0, Duration::from_secs(1));
        store.learn(key, w, Blind::Counted).await.unwrap();
        clock.advance(Duration::from_secs(600));
        assert!(store.take(key, 1).await.unwrap().go);
        assert!(
            store.take(key, 1).await.unwrap().go,
            "no probe of a forgotten window"
        );
    }
}
