//! What upstreams said, in Redis: `lua/upstream_take.lua`, `lua/upstream_learn.lua` and
//! `lua/upstream_settle.lua` on a hash under the throttle's key (`:u` for requests, `:ut` for
//! tokens, see `keys.rs`).

use std::{sync::LazyLock, time::Duration};

use redis::{Cmd, Script, Value};

use super::{keys, link::evalsha, reply, RedisStore};
use crate::{
    error::Error,
    store::{
        micros,
        upstream::{Gate, Learned, Ledger, Sent, MAX_RATE_QUOTA, MAX_RATE_WINDOW},
        BoxFuture, KeyBuf, StoreKey,
    },
};

static TAKE: LazyLock<Script> = prelude_script!("upstream_take.lua");
static LEARN: LazyLock<Script> = prelude_script!("upstream_learn.lua");
static SETTLE: LazyLock<Script> = prelude_script!("upstream_settle.lua");

/// The largest time a script takes: 2^52 µs, as the prelude checks.
const MAX_US: u64 = 1 << 52;

/// The script's call on `key`'s hash of `ledger`, at `now` (µs since the epoch) when given,
/// else at Redis' time.
fn call(script: &Script, key: StoreKey<'_>, ledger: Ledger, now: Option<u64>) -> Cmd {
    let suffix = match ledger {
        Ledger::Requests => keys::UPSTREAM,
        Ledger::Tokens => keys::UPSTREAM_TOKENS,
    };
    let mut buf = KeyBuf::new();
    keys::write_key(key, suffix, &mut buf);
    evalsha(
        script,
        1,
        |cmd| {
            cmd.arg(buf.as_bytes());
        },
        now,
    )
}

fn parse_gate(reply: Value) -> Result<Gate, Error> {
    let items = reply::ints(reply)?;
    match items.as_slice() {
        [1, 0, how @ (0..=2)] => {
            let how = [Sent::Counted, Sent::Blind, Sent::Probe][*how as usize];
            Ok(Gate::new(true, Duration::ZERO).blind(how))
        }
        [1, wait, 0] if *wait > 0 => Ok(Gate::new(true, Duration::from_micros(*wait as u64))),
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
        ledger: Ledger,
        cost: u32,
        budget: Duration,
    ) -> BoxFuture<'a, Result<Gate, Error>> {
        self.take_units_at(key, ledger, cost, budget, None)
    }

    /// [`take_units`](Self::take_units) at `now` (µs since the epoch) when given.
    fn take_units_at<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        cost: u32,
        budget: Duration,
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<Gate, Error>> {
        let mut cmd = call(&TAKE, key, ledger, now);
        cmd.arg(cost).arg(micros(budget).min(MAX_US));
        Box::pin(async move { parse_gate(self.link.eval(&TAKE, &cmd).await?) })
    }

    pub(super) fn learn_said<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        learned: Learned,
        how: Sent,
        cost: u32,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.learn_said_at(key, ledger, learned, (how, cost), None)
    }

    /// [`learn_said`](Self::learn_said) at `now` (µs since the epoch) when given.
    fn learn_said_at<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        learned: Learned,
        (how, cost): (Sent, u32),
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let mut cmd = call(&LEARN, key, ledger, now);
        let us = |d: Option<Duration>| d.map_or(0, |d| micros(d).min(MAX_US));
        cmd.arg(us(learned.pause));
        match (learned.remaining, learned.reset) {
            (Some(r), Some(t)) => cmd.arg(r.min(MAX_US)).arg(us(Some(t))),
            _ => cmd.arg(-1).arg(-1),
        };
        cmd.arg(match how {
            Sent::Counted => 0,
            Sent::Blind => 1,
            Sent::Probe => 2,
        });
        match learned.rate.filter(|r| r.quota > 0 && !r.window.is_zero()) {
            Some(r) => cmd
                .arg(r.quota.min(MAX_RATE_QUOTA))
                .arg(us(Some(r.window.min(MAX_RATE_WINDOW))))
                .arg(u8::from(r.stated)),
            None => cmd.arg(0).arg(0).arg(0),
        };
        cmd.arg(cost);
        Box::pin(async move {
            self.link.eval(&LEARN, &cmd).await?;
            Ok(())
        })
    }

    pub(super) fn settle_used<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        taken: u64,
        used: u64,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.settle_used_at(key, ledger, taken, used, None)
    }

    /// [`settle_used`](Self::settle_used) at `now` (µs since the epoch) when given.
    fn settle_used_at<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        taken: u64,
        used: u64,
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let mut cmd = call(&SETTLE, key, ledger, now);
        cmd.arg(taken.min(MAX_RATE_QUOTA))
            .arg(used.min(MAX_RATE_QUOTA));
        Box::pin(async move {
            self.link.eval(&SETTLE, &cmd).await?;
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
        assert_eq!(parse_gate(arr(vec![1, 0, 1])).unwrap().blind, Sent::Blind);
        assert_eq!(parse_gate(arr(vec![1, 0, 2])).unwrap().blind, Sent::Probe);
        assert_eq!(
            parse_gate(arr(vec![0, 1500, 0])).unwrap(),
            Gate::new(false, Duration::from_micros(1500))
        );
        assert_eq!(
            parse_gate(arr(vec![1, 5, 0])).unwrap(),
            Gate::new(true, Duration::from_micros(5))
        );
        for bad in [
            arr(vec![0, 0, 0]),
            arr(vec![1, 5, 1]),
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
/// (the throttle's side is in `tests/redis/adaptive.rs`).
#[cfg(test)]
mod agreement {
    use std::{future::Future, sync::Arc, time::Duration};

    use super::super::testing::TestRedis;
    use crate::{
        extract::Key,
        store::{
            clock::ManualClock,
            redis::RedisStore,
            upstream::{Gate, Learned, Ledger, Rate, Sent},
            MemoryStore, StoreKey, UpstreamStore, Upstreams,
        },
    };

    /// One of the two stores on a manual clock: Redis is given the clock's time with each
    /// call (the scripts' explicit time), the `MemoryStore` is built on the clock.
    enum OnClock {
        Redis(RedisStore, ManualClock),
        Memory(MemoryStore, ManualClock),
    }

    impl OnClock {
        async fn take(&self, key: StoreKey<'_>, cost: u32) -> Gate {
            self.take_within(key, cost, Duration::from_secs(60)).await
        }

        /// A take by a caller who may wait `budget` for its place in the upstream's pace.
        async fn take_within(&self, key: StoreKey<'_>, cost: u32, budget: Duration) -> Gate {
            match self {
                Self::Redis(store, clock) => {
                    store.take_units_at(key, REQ, cost, budget, Some(clock.now_us()))
                }
                Self::Memory(store, _) => store.take(key, REQ, cost, budget),
            }
            .await
            .unwrap()
        }

        async fn learn(&self, key: StoreKey<'_>, learned: Learned, how: Sent) {
            match self {
                Self::Redis(store, clock) => {
                    store.learn_said_at(key, REQ, learned, (how, 1), Some(clock.now_us()))
                }
                Self::Memory(store, _) => store.learn(key, REQ, learned, how, 1),
            }
            .await
            .unwrap()
        }

        fn advance(&self, by: Duration) {
            match self {
                Self::Redis(_, clock) | Self::Memory(_, clock) => clock.advance(by),
            }
        }
    }

    /// The ledger these tests run on: requests (tokens follow the same rules, under a key of
    /// their own; see `tokens_are_settled_alike_in_redis_and_in_memory`).
    const REQ: Ledger = Ledger::Requests;

    /// Runs `f` on Redis, then on memory, each on a clock of its own.
    async fn on_both<F, Fut>(redis: &TestRedis, f: F)
    where
        F: Fn(OnClock, &'static str) -> Fut,
        Fut: Future<Output = ()>,
    {
        f(
            OnClock::Redis(redis.store().await, ManualClock::new()),
            "redis",
        )
        .await;
        let clock = ManualClock::new();
        let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        f(OnClock::Memory(memory, clock), "memory").await;
    }

    /// Every gate of a run of takes and answers with a rate, on Redis and in memory: the
    /// same places in the pace, to the microsecond.
    async fn paced_run(store: &OnClock, key: StoreKey<'_>) -> Vec<(bool, u128, Sent)> {
        let mut gates = Vec::new();
        let mut take = |g: Gate| gates.push((g.go, g.wait.as_micros(), g.blind));
        let rate = |r: u64, stated: bool| {
            let w = Duration::from_secs(1);
            let rate = if stated {
                Rate::stated(40, w)
            } else {
                Rate::inferred(40, w)
            };
            Learned::new().window(r, w).rate(rate)
        };
        // Three calls go blind; the first answer says 37 left of 40 a second: the pace starts
        // behind the 3 counted and the 2 still on their way.
        for _ in 0..3 {
            take(store.take(key, 1).await);
        }
        store.learn(key, rate(37, true), Sent::Blind).await;
        for _ in 0..3 {
            take(store.take(key, 2).await);
        }
        // Beyond the caller's budget: refused, nothing kept.
        take(store.take_within(key, 1, Duration::from_millis(100)).await);
        take(store.take_within(key, 1, Duration::from_secs(1)).await);
        // None left: the pace moves one unit on.
        store.advance(Duration::from_millis(700));
        store.learn(key, rate(0, true), Sent::Counted).await;
        take(store.take(key, 1).await);
        // An inferred window keeps the longest seen: a 2 s reset slows the pace to 40 per 2 s.
        store.advance(Duration::from_secs(2));
        store
            .learn(
                key,
                Learned::new().rate(Rate::inferred(40, Duration::from_secs(2))),
                Sent::Counted,
            )
            .await;
        store.learn(key, rate(5, false), Sent::Counted).await;
        take(store.take(key, 1).await);
        take(store.take(key, 1).await);
        // A 429's pause holds every call back, paced or not.
        store
            .learn(
                key,
                Learned::new().pause(Duration::from_secs(3)),
                Sent::Counted,
            )
            .await;
        take(store.take(key, 1).await);
        gates
    }

    #[tokio::test]
    async fn calls_are_paced_at_the_upstreams_rate_alike_in_redis_and_in_memory() {
        let redis = TestRedis::start();
        let k = Key::from("paced");
        let key = StoreKey::bounded("rv", Some(&k), 128);
        let on_redis = OnClock::Redis(redis.store().await, ManualClock::new());
        let clock = ManualClock::new();
        let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let on_memory = OnClock::Memory(memory, clock);
        let gates = paced_run(&on_redis, key).await;
        assert_eq!(gates, paced_run(&on_memory, key).await);
        // One unit every 1 s / 40 / 0.97 = 25,774 µs.
        let i = 25_774;
        let blind = (true, 0, Sent::Blind);
        let paced = |wait| (true, wait, Sent::Counted);
        assert_eq!(
            gates,
            vec![
                blind,
                blind,
                blind,
                paced(5 * i),
                paced(7 * i),
                paced(9 * i),
                (false, 11 * i, Sent::Counted),
                paced(11 * i),
                // 700 ms later the pace has passed; the empty window moves it one unit on.
                paced(i),
                // 40 per 2 s: each unit twice as long; the pace had already passed.
                paced(0),
                paced(51_547),
                (false, 3_000_000, Sent::Counted),
            ]
        );
    }

    /// An upstream that tells nothing but a pause: the calls it answered without a word since
    /// the first, over the time until the pause ends, are its rate; late answers of calls sent
    /// before add to it; a pause answering a paced call takes an eighth off. Alike in Redis
    /// and in memory.
    #[tokio::test]
    async fn a_rate_is_estimated_from_the_first_pause_alike_in_redis_and_in_memory() {
        async fn estimate(store: &OnClock, key: StoreKey<'_>) -> Vec<(bool, u128, Sent)> {
            let mut gates = Vec::new();
            for _ in 0..9 {
                gates.push(store.take(key, 1).await);
            }
            store.advance(Duration::from_millis(200));
            for _ in 0..7 {
                store.learn(key, Learned::new(), Sent::Blind).await;
            }
            // The first 429: paused for 800 ms; 7 answered over the 1 s until it ends.
            let pause = Learned::new().pause(Duration::from_millis(800));
            store.learn(key, pause, Sent::Blind).await;
            // One more sent before it, answered since: 8 a second.
            store.learn(key, Learned::new(), Sent::Blind).await;
            gates.push(store.take(key, 1).await);
            store.advance(Duration::from_millis(800));
            for _ in 0..3 {
                gates.push(store.take(key, 1).await);
            }
            // A paced call answered 429: the pause holds, and 8 - 8/8 = 7 a second after it.
            store.learn(key, pause, Sent::Counted).await;
            gates.push(store.take(key, 1).await);
            store.advance(Duration::from_millis(800));
            for _ in 0..2 {
                gates.push(store.take(key, 1).await);
            }
            gates
                .into_iter()
                .map(|g| (g.go, g.wait.as_micros(), g.blind))
                .collect()
        }
        let redis = TestRedis::start();
        let k = Key::from("estimated");
        let key = StoreKey::bounded("rv", Some(&k), 128);
        let on_redis = OnClock::Redis(redis.store().await, ManualClock::new());
        let clock = ManualClock::new();
        let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let gates = estimate(&on_redis, key).await;
        assert_eq!(gates, estimate(&OnClock::Memory(memory, clock), key).await);
        let blind = (true, 0, Sent::Blind);
        let paced = |wait| (true, wait, Sent::Counted);
        // One unit every 1 s / 8 / 0.97 = 128,866 µs from the pause's end; then every
        // 1 s / 7 / 0.97 = 147,276 µs, from where the pace was, after the second pause.
        let (i8, i7) = (128_866, 147_276);
        let mut expected = vec![blind; 9];
        expected.extend([
            (false, 800_000, Sent::Counted),
            paced(0),
            paced(i8),
            paced(2 * i8),
            (false, 800_000, Sent::Counted),
            paced(0),
            paced(i7),
        ]);
        assert_eq!(gates, expected);
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
            store.learn(key, w(0), Sent::Counted).await;
            store.advance(Duration::from_millis(1_500));
            store.learn(key, w(9), Sent::Counted).await;
            assert!(!store.take(key, 1).await.go, "{name}");
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
            store.learn(key, w, Sent::Counted).await;
            store.advance(Duration::from_millis(400));
            let first = store.take(key, 1).await;
            assert_eq!((first.go, first.blind), (true, Sent::Probe), "{name}");
            assert!(!store.take(key, 1).await.go, "{name}: waits for the probe");
            store.learn(key, Learned::new(), Sent::Probe).await;
            let next = store.take(key, 1).await;
            assert_eq!((next.go, next.blind), (true, Sent::Blind), "{name}");
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
                let g = store.take(key, 1).await;
                assert_eq!(g.blind, Sent::Blind, "{name}");
                store.learn(key, Learned::new(), g.blind).await;
            }
            let g = store.take(key, 1).await;
            let w = Learned::new().window(50, Duration::from_secs(10));
            store.learn(key, w, g.blind).await;
            let mut went = 0;
            while store.take(key, 1).await.go {
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
            Arc::new(redis.store().await) as Arc<dyn UpstreamStore>,
            Arc::new(MemoryStore::new()),
        ] {
            let k = Key::from("twin");
            let key = StoreKey::bounded("rv", Some(&k), 128);
            for _ in 0..3 {
                assert!(store.take(key, REQ, 1, Duration::ZERO).await.unwrap().go);
            }
            let zero = Learned::new().pause(Duration::ZERO);
            store.learn(key, REQ, zero, Sent::Counted, 1).await.unwrap();
            let w = Learned::new().window(10, Duration::from_secs(5));
            store.learn(key, REQ, w, Sent::Counted, 1).await.unwrap();
            let mut n = 0;
            for _ in 0..12 {
                n += u32::from(store.take(key, REQ, 1, Duration::ZERO).await.unwrap().go);
            }
            went.push(n);
        }
        assert_eq!(went[0], went[1], "redis {} memory {}", went[0], went[1]);
        assert_eq!(
            went[0], 7,
            "10 left, less the 3 blind calls still on their way"
        );
    }

    impl OnClock {
        /// A take of `cost` units of `ledger`, by a caller who may wait a minute.
        async fn take_of(&self, key: StoreKey<'_>, ledger: Ledger, cost: u32) -> Gate {
            let minute = Duration::from_secs(60);
            match self {
                Self::Redis(store, clock) => {
                    store.take_units_at(key, ledger, cost, minute, Some(clock.now_us()))
                }
                Self::Memory(store, _) => store.take(key, ledger, cost, minute),
            }
            .await
            .unwrap()
        }

        async fn learn_tokens(&self, key: StoreKey<'_>, learned: Learned, how: (Sent, u32)) {
            match self {
                Self::Redis(store, clock) => {
                    store.learn_said_at(key, Ledger::Tokens, learned, how, Some(clock.now_us()))
                }
                Self::Memory(store, _) => store.learn(key, Ledger::Tokens, learned, how.0, how.1),
            }
            .await
            .unwrap()
        }

        async fn settle_tokens(&self, key: StoreKey<'_>, taken: u64, used: u64) {
            match self {
                Self::Redis(store, clock) => {
                    store.settle_used_at(key, Ledger::Tokens, taken, used, Some(clock.now_us()))
                }
                Self::Memory(store, _) => store.settle(key, Ledger::Tokens, taken, used),
            }
            .await
            .unwrap()
        }
    }

    /// A token budget, on its own key beside the requests': blind calls counted by their
    /// estimates, the pace started behind them, settlements moving it on (a debt) and back
    /// (never before now); the same gates in Redis and in memory, to the microsecond.
    #[tokio::test]
    async fn tokens_are_settled_alike_in_redis_and_in_memory() {
        const TOK: Ledger = Ledger::Tokens;
        async fn tokens_run(store: OnClock, _: &'static str) -> Vec<(bool, u128)> {
            let k = Key::from("tokens");
            let key = StoreKey::bounded("rv", Some(&k), 128);
            let mut gates = Vec::new();
            // Three calls of 1,000 tokens go blind; the first answer says 9,000 of 10,000
            // left: the pace starts behind its 1,000 and the 2,000 still on their way.
            for _ in 0..3 {
                gates.push(store.take_of(key, TOK, 1_000).await);
            }
            let told = Learned::new()
                .window(9_000, Duration::from_secs(6))
                .rate(Rate::stated(10_000, Duration::from_secs(60)));
            store.learn_tokens(key, told, (Sent::Blind, 1_000)).await;
            gates.push(store.take_of(key, TOK, 500).await);
            // It used 2,000 of its 500: a debt of 1,500.
            store.settle_tokens(key, 500, 2_000).await;
            gates.push(store.take_of(key, TOK, 500).await);
            // It used 100 of its 500: 400 back.
            store.settle_tokens(key, 500, 100).await;
            gates.push(store.take_of(key, TOK, 500).await);
            // Long after: giving back makes no burst.
            store.advance(Duration::from_secs(120));
            store.settle_tokens(key, 500, 0).await;
            gates.push(store.take_of(key, TOK, 500).await);
            // The requests' key knew nothing of it: that call goes blind.
            let g = store.take_of(key, REQ, 1).await;
            let mut out: Vec<_> = gates.iter().map(|g| (g.go, g.wait.as_micros())).collect();
            out.push((g.go, u128::from(g.blind == Sent::Blind)));
            out
        }
        let redis = TestRedis::start();
        let on_redis =
            tokens_run(OnClock::Redis(redis.store().await, ManualClock::new()), "").await;
        let clock = ManualClock::new();
        let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        assert_eq!(
            on_redis,
            tokens_run(OnClock::Memory(memory, clock), "").await
        );
        // One token every 60 s / 10,000 / 0.97 = 6,186 µs.
        let i = 6_186;
        assert_eq!(
            on_redis,
            vec![
                (true, 0),
                (true, 0),
                (true, 0),
                (true, 3_000 * i),
                (true, 5_000 * i),
                (true, 5_100 * i),
                (true, 0),
                (true, 1),
            ]
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
        store.learn(key, REQ, w, Sent::Counted, 1).await.unwrap();
        clock.advance(Duration::from_secs(600));
        assert!(store.take(key, REQ, 1, Duration::ZERO).await.unwrap().go);
        assert!(
            store.take(key, REQ, 1, Duration::ZERO).await.unwrap().go,
            "no probe of a forgotten window"
        );
    }
}
