//! Refunds: giving back what an allowed check took, for every algorithm, in Redis and in
//! memory. Property tests against a real Redis: a refund right after its charge leaves every
//! later decision as if the check had never happened, and random interleavings of checks and
//! refunds get the same answers from Redis as from the in-memory twin.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::servers::RedisServer;
use proptest::{prelude::*, test_runner::TestRunner};
use tower_redis_ratelimit::{
    algorithm::FixedWindow,
    algorithm::{Algorithm, MultiLimit},
    rate_limit::{Decision, LimitState},
    Gcra, MemoryStore, Quota, RateLimiter, RedisStore, SlidingWindow, TokenBucket,
};

const T0: u64 = 1_700_000_000_000_000;

/// How much slower than real time the simulated time of the property tests on Redis runs:
/// their periods (and the traffic's grid) are this many times the brisk test's (a second
/// becomes an hour), so a key's state holds for hours of real time, far longer than the
/// test runs. Redis expires keys on its own clock, not on the explicit times (see
/// `RateLimiter::check_at`): on the brisk grid of whole seconds a key could be left a second
/// to live, and a machine under load that stalled that long between two calls made the
/// later one find the key rested in Redis, not in the twin. The same decisions, each at the
/// brisk time times `SLOW`.
const SLOW: u64 = 3_600;

/// Each algorithm, with a quota built from `limit`, `burst` and `period_s`.
fn algorithms(limit: u32, burst: u32, period_s: u64) -> Vec<(&'static str, Arc<dyn Algorithm>)> {
    let period = Duration::from_secs(period_s);
    let q = Quota::new(limit, period).burst(burst);
    let slow = Quota::new(limit * 3, period * 6).burst(burst + limit);
    vec![
        ("gcra", Arc::new(Gcra::new(q).unwrap())),
        ("token-bucket", Arc::new(TokenBucket::new(q).unwrap())),
        (
            "sliding-window",
            Arc::new(SlidingWindow::new(Quota::new(limit, period)).unwrap()),
        ),
        (
            "fixed-window",
            Arc::new(FixedWindow::new(Quota::new(limit, period)).unwrap()),
        ),
        (
            "multi",
            Arc::new(MultiLimit::new([("fast", q), ("slow", slow)]).unwrap()),
        ),
    ]
}

/// One step: the time to move on, and either a check of some cost or a refund of an earlier
/// allowed check (picked by index, modulo the number there are).
#[derive(Debug, Clone)]
enum Op {
    Check(u32),
    Refund(usize),
}

#[derive(Debug, Clone)]
struct Case {
    limit: u32,
    burst: u32,
    period_s: u64,
    steps: Vec<(u64, Op)>,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        // Limits that divide both periods' microseconds: emission intervals exact, so no
        // key's stored time is left a few microseconds ahead of the test's time. Redis
        // expires keys on its own clock, and a key stored with 5 µs to go (an interval
        // rounded up, times the limit) would expire one real millisecond later, before the
        // next call of a loaded machine, while the in-memory twin, on the test's time, keeps
        // it. Rounded intervals are compared with the twin in `agreement`.
        prop::sample::select(vec![1u32, 2, 3, 4, 5, 6, 8]),
        1u32..12,
        // Brisk 10 minutes and an hour (see [`SLOW`]): a key left a moment to live (a
        // charge given back to end just after the test's time, a fixed window's end) comes
        // 3,600 times more rarely.
        prop::sample::select(vec![600 * SLOW, 3_600 * SLOW]),
    )
        .prop_flat_map(|(limit, burst, period_s)| {
            let interval = period_s * 1_000_000 / u64::from(limit);
            let step = prop_oneof![
                3 => Just(0u64),
                5 => 0..interval,
                2 => 0..3 * interval,
                1 => Just(period_s * 1_000_000),
            ];
            let max_cost = limit.max(burst) + 1;
            let op = prop_oneof![
                3 => (1..=max_cost).prop_map(Op::Check),
                2 => any::<usize>().prop_map(Op::Refund),
            ];
            prop::collection::vec((step, op), 1..50).prop_map(move |steps| Case {
                limit,
                burst,
                period_s,
                steps,
            })
        })
}

/// What later requests see of a decision: everything but the charge's bookkeeping.
fn seen(d: &Decision) -> (bool, u64, Option<Duration>, Duration, Vec<LimitState>) {
    (
        d.allowed,
        d.remaining,
        d.retry_after,
        d.reset_after,
        d.limits.clone(),
    )
}

static CASE_ID: AtomicU64 = AtomicU64::new(0);

type Limiter = RateLimiter<Arc<dyn Algorithm>>;

fn limiters(redis: &RedisStore, algorithm: &Arc<dyn Algorithm>) -> (Limiter, Limiter) {
    let prefix = format!("refund{}", CASE_ID.fetch_add(1, Ordering::Relaxed));
    let on_redis = RateLimiter::builder(redis.clone(), Arc::clone(algorithm))
        .prefix(&prefix)
        .store_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let in_memory = RateLimiter::builder(MemoryStore::new(), Arc::clone(algorithm))
        .prefix(&prefix)
        .build()
        .unwrap();
    (on_redis, in_memory)
}

/// Random interleavings of checks and refunds: Redis and the twin agree on every decision
/// and on whether each refund gave anything back.
async fn interleaved_agree(redis: &RedisStore, algorithm: &Arc<dyn Algorithm>, case: &Case) {
    let (on_redis, in_memory) = limiters(redis, algorithm);
    let mut allowed: Vec<(Decision, Decision)> = Vec::new();
    let mut now = T0;
    for (i, (step, op)) in case.steps.iter().enumerate() {
        now += step;
        match op {
            Op::Check(cost) => {
                let r = on_redis.check_at("k", *cost, now).await.unwrap();
                let m = in_memory.check_at("k", *cost, now).await.unwrap();
                assert_eq!(r, m, "step {i} of {case:?}");
                if r.allowed {
                    allowed.push((r, m));
                }
            }
            Op::Refund(pick) if !allowed.is_empty() => {
                // A copy each time: the stores also meet the same charge twice (as a resent
                // call would bring it), and must agree on what that does.
                let (mut r, mut m) = allowed[pick % allowed.len()].clone();
                let given_r = on_redis.refund_at("k", &mut r, now).await.unwrap();
                let given_m = in_memory.refund_at("k", &mut m, now).await.unwrap();
                assert_eq!(
                    given_r,
                    given_m,
                    "{}: refund at step {i} of {case:?}",
                    algorithm.name()
                );
            }
            Op::Refund(_) => {}
        }
    }
}

/// Every check that a refund follows at once (at the same time or later, before the next
/// step) leaves the later decisions exactly as if it had never been made: compared with a
/// limiter that never saw it, on Redis and in memory.
async fn as_if_never(redis: &RedisStore, algorithm: &Arc<dyn Algorithm>, case: &Case) {
    let (charged_redis, charged_memory) = limiters(redis, algorithm);
    let (plain_redis, plain_memory) = limiters(redis, algorithm);
    let mut now = T0;
    for (i, (step, op)) in case.steps.iter().enumerate() {
        now += step;
        match op {
            Op::Check(cost) => {
                let a = charged_redis.check_at("k", *cost, now).await.unwrap();
                let b = charged_memory.check_at("k", *cost, now).await.unwrap();
                let c = plain_redis.check_at("k", *cost, now).await.unwrap();
                let d = plain_memory.check_at("k", *cost, now).await.unwrap();
                let want = seen(&c);
                assert_eq!(seen(&a), want, "redis, step {i} of {case:?}");
                assert_eq!(seen(&b), want, "memory, step {i} of {case:?}");
                assert_eq!(seen(&d), want, "plain memory, step {i} of {case:?}");
            }
            Op::Refund(pick) => {
                // A check only the charged limiters see, refunded at once or a little later.
                let cost = 1 + (*pick as u32) % case.limit.max(case.burst);
                let mut a = charged_redis.check_at("k", cost, now).await.unwrap();
                let mut b = charged_memory.check_at("k", cost, now).await.unwrap();
                assert_eq!(a, b, "extra check at step {i} of {case:?}");
                let allowed = a.allowed;
                let later = now + (*pick as u64 % 2) * (step / 2);
                let given_a = charged_redis.refund_at("k", &mut a, later).await.unwrap();
                let given_b = charged_memory.refund_at("k", &mut b, later).await.unwrap();
                assert_eq!(given_a, given_b, "refund at step {i} of {case:?}");
                if allowed && later == now {
                    assert!(
                        given_a,
                        "a check refunded at once gives its units back: step {i} of {case:?}"
                    );
                }
                if !allowed {
                    assert!(!given_a, "a denial has nothing to give back");
                }
                now = later;
            }
        }
    }
}

fn run(name: &str, check: impl Fn(&RedisStore, &Arc<dyn Algorithm>, &Case) + Send) {
    let redis = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(redis.store());
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let _guard = rt.enter();
    runner
        .run(&cases(), |case| {
            for (_, algorithm) in algorithms(case.limit, case.burst, case.period_s) {
                check(&store, &algorithm, &case);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
}

#[test]
fn refunds_in_memory_match_redis() {
    run("interleaved", |store, algorithm, case| {
        tokio::runtime::Handle::current().block_on(interleaved_agree(store, algorithm, case));
    });
}

#[test]
fn a_refund_after_its_charge_is_as_if_the_check_never_happened() {
    run("as if never", |store, algorithm, case| {
        tokio::runtime::Handle::current().block_on(as_if_never(store, algorithm, case));
    });
}

/// Checks and refunds in logs longer than a refund rewrites (past 64 members on both sides
/// of the refunded one): Redis and the twin agree on every decision and refund.
#[test]
fn refunds_in_long_logs_match_redis() {
    let redis = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(redis.store());
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 12,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let long_logs = (200u32..400).prop_flat_map(|limit| {
        let interval = 600_000_000 / u64::from(limit);
        let step = prop_oneof![3 => Just(0u64), 1 => 0..interval / 4];
        let op = prop_oneof![
            12 => Just(Op::Check(1)),
            2 => (2u32..=3).prop_map(Op::Check),
            3 => any::<usize>().prop_map(Op::Refund),
        ];
        prop::collection::vec((step, op), 250..450).prop_map(move |steps| Case {
            limit,
            burst: limit,
            period_s: 600,
            steps,
        })
    });
    let _guard = rt.enter();
    runner
        .run(&long_logs, |case| {
            let window = Quota::new(case.limit, Duration::from_secs(case.period_s));
            let algorithm: Arc<dyn Algorithm> = Arc::new(SlidingWindow::new(window).unwrap());
            rt.block_on(interleaved_agree(&store, &algorithm, &case));
            Ok(())
        })
        .unwrap();
}

/// Refunds in a log of many members sharing a score (one batch, or one microsecond): each
/// finds its member among them (by sequence number), the log stays ordered, and Redis agrees
/// with the twin. Near the log's newer end a refund gives its units back; deep inside (more
/// than 64 members on either side) its units move onto the member 64 places older and leave
/// the window with it.
#[tokio::test]
async fn refunds_in_a_log_of_members_sharing_a_score_keep_the_log_exact() {
    let redis = RedisServer::start();
    let window = Duration::from_secs(60);
    let limit = 2008;
    let algorithm = SlidingWindow::new(Quota::new(limit, window)).unwrap();
    let on_redis = RateLimiter::new(redis.store().await, algorithm.clone()).unwrap();
    let in_memory = RateLimiter::new(MemoryStore::new(), algorithm).unwrap();
    let (t1, t2) = (T0 + 1_000, T0 + 2_000);
    let mut kept = Vec::new();
    for (t, n, cost) in [(T0, 1001, 1), (t1, 1, 5), (t2, 1002, 1)] {
        for i in 0..n {
            let r = on_redis.check_at("k", cost, t).await.unwrap();
            let m = in_memory.check_at("k", cost, t).await.unwrap();
            assert!(r.allowed && m.allowed);
            // The 500th at T0, the one of cost 5, the 1000th at t2.
            if (t == T0 && i == 499) || cost == 5 || (t == t2 && i == 999) {
                kept.push((r, m));
            }
        }
    }
    // Two members newer than it: given back.
    let (mut r, mut m) = kept.pop().unwrap();
    assert!(on_redis.refund_at("k", &mut r, t2).await.unwrap());
    assert!(in_memory.refund_at("k", &mut m, t2).await.unwrap());
    // Deep inside: moved, nothing given back now.
    for (mut r, mut m) in kept {
        assert!(!on_redis.refund_at("k", &mut r, t2).await.unwrap());
        assert!(!in_memory.refund_at("k", &mut m, t2).await.unwrap());
    }
    let r = on_redis.check_at("k", 1, t2).await.unwrap();
    let m = in_memory.check_at("k", 1, t2).await.unwrap();
    assert_eq!(r, m);
    assert_eq!(r.remaining, 0, "only the unit given back was free");
    let members: Vec<String> = tower_redis_ratelimit::redis::cmd("ZRANGE")
        .arg(format!("{}:l2", on_redis.storage_key("k")))
        .arg(0)
        .arg(-1)
        .query(&mut redis.conn())
        .unwrap();
    let totals: Vec<u64> = members.iter().map(|m| m[..16].parse().unwrap()).collect();
    assert!(
        totals.windows(2).all(|w| w[0] < w[1]),
        "the log's totals are out of order"
    );
    // The T0 members left the window, with the units moved onto them: the 1,002 at t2, less
    // the one given back, plus the check above, remain.
    let later = T0 + 60_000_000 + 1;
    let r = on_redis.check_at("k", 1, later).await.unwrap();
    let m = in_memory.check_at("k", 1, later).await.unwrap();
    assert_eq!(r, m);
    assert_eq!(m.remaining, u64::from(limit) - 1002 - 1);
}

/// One decision is given back once: the second refund of it is `Ok(false)` and the limit
/// holds, for every algorithm.
#[tokio::test]
async fn a_decision_is_given_back_once() {
    let redis = RedisServer::start();
    for (name, algorithm) in crate::common::each_algorithm(Quota::per_minute(3)) {
        let limiter = RateLimiter::new(redis.store().await, algorithm).unwrap();
        let key = format!("once-{name}");
        let mut first = limiter.check_at(key.as_str(), 1, T0).await.unwrap();
        assert!(limiter.check_at(key.as_str(), 1, T0).await.unwrap().allowed);
        assert!(limiter.check_at(key.as_str(), 1, T0).await.unwrap().allowed);
        assert!(limiter
            .refund_at(key.as_str(), &mut first, T0)
            .await
            .unwrap());
        assert!(first.charge().is_none(), "{name}");
        assert!(
            !limiter
                .refund_at(key.as_str(), &mut first, T0)
                .await
                .unwrap(),
            "{name}"
        );
        let mut kept = 2;
        while limiter.check_at(key.as_str(), 1, T0).await.unwrap().allowed {
            kept += 1;
            assert!(kept <= 3, "{name}: more than the limit counted");
        }
        assert_eq!(kept, 3, "{name}");
    }
}

/// A refund script run twice with the same marker key (as the cluster client would resend
/// it after a cut connection) gives back once; without a marker (standalone connections
/// never resend) it is the script the store always ran. For GCRA, the token bucket and the
/// multi-limit; a sliding window's second run finds its entry gone.
#[test]
fn a_refund_resent_with_its_marker_gives_back_once() {
    use tower_redis_ratelimit::redis::{self, Script};
    let redis_server = RedisServer::start();
    let mut c = redis_server.conn();
    let prelude = include_str!("../../lua/prelude.lua");
    let ledger = include_str!("../../lua/refund_ledger.lua");
    let gcra = Script::new(include_str!("../../lua/gcra.lua"));
    let gcra_refund = Script::new(&format!(
        "{prelude}{ledger}{}{}",
        include_str!("../../lua/gcra_state.lua"),
        include_str!("../../lua/gcra_refund.lua")
    ));
    let bucket = Script::new(&format!(
        "{prelude}{}",
        include_str!("../../lua/token_bucket.lua")
    ));
    let bucket_refund = Script::new(&format!(
        "{prelude}{ledger}{}",
        include_str!("../../lua/token_bucket_refund.lua")
    ));
    // 3 a minute: emission 20 s, burst 3. Spend all 3, then refund the last twice.
    let (emission, burst, now) = (20_000_000u64, 3u64, T0);
    for (name, key) in [("gcra", "{m:g}:g"), ("bucket", "{m:b}:b")] {
        let ledger_key = format!("{key}r");
        // The check's decision, and the time its charge left (now + its reset time).
        let check = |c: &mut redis::Connection| -> (i64, u64) {
            if name == "gcra" {
                // GCRA's check: the step, the tolerance, a rested key's lifetime in ms, the
                // time; admitted, `TAT SECS USECS`; denied, now - TAT.
                let reply: redis::Value = gcra
                    .key(key)
                    .arg(emission)
                    .arg(emission * burst)
                    .arg(emission.div_ceil(1_000))
                    .arg(now)
                    .invoke(c)
                    .unwrap();
                return match reply {
                    redis::Value::BulkString(text) => {
                        let text = String::from_utf8(text).unwrap();
                        let w: Vec<u64> = text.split(' ').map(|w| w.parse().unwrap()).collect();
                        assert_eq!(w.len(), 3, "{name}: {text}");
                        assert_eq!(w[1] * 1_000_000 + w[2], now, "{name}: admitted now");
                        (1, w[0])
                    }
                    redis::Value::Int(r) if r <= 0 => (0, 0),
                    other => panic!("{name}: {other:?}"),
                };
            }
            let reply: Vec<i64> = bucket
                .key(key)
                .arg(now)
                .arg(1)
                .arg(emission)
                .arg(burst)
                .invoke(c)
                .unwrap();
            let end = if reply[0] == 1 {
                assert_eq!(reply.len(), 5, "{name}: {reply:?}");
                assert_eq!(reply[4] as u64, now, "{name}: admitted now");
                now + reply[3] as u64
            } else {
                0
            };
            (reply[0], end)
        };
        let refund = |c: &mut redis::Connection, marker: &str, end: u64| -> i64 {
            let script = if name == "gcra" {
                &gcra_refund
            } else {
                &bucket_refund
            };
            // The same arguments for both: now, cost, emission, burst, admitted at, end.
            script
                .key(key)
                .key(&ledger_key)
                .key(marker)
                .arg(now)
                .arg(1)
                .arg(emission)
                .arg(burst)
                .arg(now)
                .arg(end)
                .invoke(c)
                .unwrap()
        };
        let mut end = 0;
        for _ in 0..3 {
            let (allowed, e) = check(&mut c);
            assert_eq!(allowed, 1, "{name}");
            end = e;
        }
        let marker = format!("{}:rf:one", &key[..key.find('}').unwrap() + 1]);
        assert_eq!(refund(&mut c, &marker, end), 1, "{name}: first run");
        assert_eq!(refund(&mut c, &marker, end), 0, "{name}: resent");
        assert_eq!(check(&mut c).0, 1, "{name}: the unit given back once");
        assert_eq!(check(&mut c).0, 0, "{name}: and only once");
        let ttl: i64 = redis::cmd("PTTL").arg(&marker).query(&mut c).unwrap();
        assert!(
            (1..=30_000).contains(&ttl),
            "{name}: the marker lives 30 s: {ttl}"
        );
    }
}

/// On a cluster, every GCRA refund carries its marker (and a standalone store's none).
#[tokio::test]
async fn refunds_on_a_cluster_carry_a_marker() {
    let cluster = crate::servers::RedisCluster::start(3, 0);
    let limiter = crate::common::limiter(
        cluster.store().await,
        Gcra::new(Quota::per_minute(3)).unwrap(),
        "marked",
    );
    let mut d = limiter.check("k", 1).await.unwrap();
    assert!(limiter.refund("k", &mut d).await.unwrap());
    let markers = cluster.keys_with_pttl("{marked:*}:rf:*");
    assert_eq!(markers.len(), 1, "{markers:?}");
    assert!((1..=30_000).contains(&markers[0].1), "{markers:?}");
    let redis = RedisServer::start();
    let limiter = crate::common::limiter(
        redis.store().await,
        Gcra::new(Quota::per_minute(3)).unwrap(),
        "unmarked",
    );
    let mut d = limiter.check("k", 1).await.unwrap();
    assert!(limiter.refund("k", &mut d).await.unwrap());
    assert!(crate::servers::keys_with_pttl(&mut redis.conn(), "*:rf:*").is_empty());
}

/// One request of a traffic case: the time since the previous arrival, its cost, and, for a
/// request whose response turns out not to count, how long it stays in flight before its
/// refund (held across drains when that is longer than its charge takes to drain).
#[derive(Debug, Clone)]
struct Request {
    gap: u64,
    cost: u32,
    uncounted_for: Option<u64>,
}

#[derive(Debug, Clone)]
struct Traffic {
    limit: u32,
    burst: u32,
    period_s: u64,
    requests: Vec<Request>,
}

/// Traffic on a grid of `grid` µs (arrival gaps and times in flight are multiples of it):
/// bursts, gaps of about an emission interval and of a whole drain, short and long stays in
/// flight. `limits` are the limits to pick from (divisors of the period keep every time on
/// the grid). The period is 10 minutes times `slow` (see [`SLOW`]).
fn traffic(limits: Vec<u32>, grid: u64, slow: u64) -> impl Strategy<Value = Traffic> {
    (prop::sample::select(limits), 1u32..9).prop_flat_map(move |(limit, burst)| {
        let period_s = 600 * slow;
        let emission = period_s * 1_000_000 / u64::from(limit) / grid;
        let drain = emission * u64::from(burst);
        let gap = prop_oneof![
            3 => Just(0u64),
            4 => 0..=emission,
            2 => 0..=3 * emission,
            1 => 0..=2 * drain,
        ];
        let stay = prop_oneof![
            3 => Just(None),
            2 => Just(Some(0u64)),
            2 => (0..=emission).prop_map(Some),
            3 => (0..=2 * drain).prop_map(Some),
        ];
        let request = (gap, 1..=burst + 1, stay).prop_map(move |(gap, cost, stay)| Request {
            gap: gap * grid,
            cost,
            uncounted_for: stay.map(|s| s * grid),
        });
        prop::collection::vec(request, 1..60).prop_map(move |requests| Traffic {
            limit,
            burst,
            period_s,
            requests,
        })
    })
}

/// Each algorithm that gives back a share of a charge in time (not a log entry), for
/// `traffic`'s quota.
fn timed_algorithms(t: &Traffic) -> Vec<(&'static str, Arc<dyn Algorithm>)> {
    let q = Quota::new(t.limit, Duration::from_secs(t.period_s)).burst(t.burst);
    let slow = Quota::new(t.limit * 3, Duration::from_secs(t.period_s * 6)).burst(t.burst + 2);
    vec![
        ("gcra", Arc::new(Gcra::new(q).unwrap())),
        ("token-bucket", Arc::new(TokenBucket::new(q).unwrap())),
        (
            "multi",
            Arc::new(MultiLimit::new([("fast", q), ("slow", slow)]).unwrap()),
        ),
    ]
}

/// What playing a traffic case gave: the counted admissions (time, cost), the counted
/// arrivals (admitted or not), and every decision and refund as later requests see it.
#[derive(Debug, PartialEq)]
struct Played {
    counted: Vec<(u64, u32)>,
    arrivals: Vec<(u64, u32)>,
    trace: Vec<String>,
}

/// Plays `traffic` on `limiter` (key "k"): each request is checked when it arrives; an
/// admitted uncounted one is refunded when it leaves.
async fn play(limiter: &Limiter, t: &Traffic) -> Played {
    use std::collections::BTreeMap;
    // Events by (time, order): arrivals are numbered first, so a refund due at an arrival's
    // time comes after it.
    enum Event {
        Arrive(u32, Option<u64>),
        Leave(Box<Decision>),
    }
    let mut events = BTreeMap::new();
    let mut now = T0;
    for (i, r) in t.requests.iter().enumerate() {
        now += r.gap;
        events.insert((now, i), Event::Arrive(r.cost, r.uncounted_for));
    }
    let mut order = t.requests.len();
    let (mut counted, mut arrivals, mut trace) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(((at, _), event)) = events.pop_first() {
        match event {
            Event::Arrive(cost, uncounted_for) => {
                let d = limiter.check_at("k", cost, at).await.unwrap();
                trace.push(format!("+{} check {cost}: {:?}", at - T0, seen(&d)));
                match uncounted_for {
                    None => {
                        arrivals.push((at, cost));
                        if d.allowed {
                            counted.push((at, cost));
                        }
                    }
                    Some(stay) if d.allowed => {
                        events.insert((at + stay, order), Event::Leave(Box::new(d)));
                        order += 1;
                    }
                    Some(_) => {}
                }
            }
            Event::Leave(mut d) => {
                let given = limiter.refund_at("k", &mut d, at).await.unwrap();
                trace.push(format!("+{} refund: {given}", at - T0));
            }
        }
    }
    Played {
        counted,
        arrivals,
        trace,
    }
}

/// The counted admissions of a played traffic case never exceed what the algorithm admits to
/// the counted requests alone at the same arrival times: a fresh limiter (`fresh`) admits
/// every one of them, each at its time and cost. With costs of one unit, that is also no more
/// than a fresh limiter admits of all the counted arrivals. (With larger costs a count of
/// requests is no bound: a refunded request can leave room that a large counted one would
/// have wasted; the bound is on the units and their times.)
async fn counted_within_the_algorithm(
    played: &Played,
    fresh: impl Fn() -> Limiter,
    t: &Traffic,
    label: &str,
) {
    let Played {
        counted, arrivals, ..
    } = played;
    let alone = fresh();
    for (i, &(at, cost)) in counted.iter().enumerate() {
        let d = alone.check_at("k", cost, at).await.unwrap();
        assert!(
            d.allowed,
            "{label}: counted admission {i} ({cost} at +{} µs) exceeds what the algorithm \
             admits to the counted requests alone: {counted:?} in {t:?}",
            at - T0
        );
    }
    if t.requests.iter().all(|r| r.cost == 1) {
        let alone = fresh();
        let mut admitted = 0;
        for &(at, cost) in arrivals {
            admitted += usize::from(alone.check_at("k", cost, at).await.unwrap().allowed);
        }
        assert!(
            counted.len() <= admitted,
            "{label}: {} counted admissions, {admitted} for the counted requests alone: {t:?}",
            counted.len()
        );
    }
}

/// Requests held in flight across drains and refunded as uncounted never let the counted
/// ones exceed the algorithm, in memory (GCRA, the token bucket, the multi-limit; many cases
/// at microsecond times); GCRA and the token bucket make the same decisions and refunds.
#[test]
fn refunds_never_let_counted_admissions_exceed_the_algorithm_in_memory() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 1_024,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&traffic((1..13).collect(), 1, 1), |t| {
            let mut traces = Vec::new();
            for (name, algorithm) in timed_algorithms(&t) {
                let fresh =
                    || RateLimiter::new(MemoryStore::new(), Arc::clone(&algorithm)).unwrap();
                let played = rt.block_on(play(&fresh(), &t));
                rt.block_on(counted_within_the_algorithm(&played, fresh, &t, name));
                traces.push(played.trace);
            }
            assert_eq!(traces[0], traces[1], "gcra and token bucket: {t:?}");
            Ok(())
        })
        .unwrap();
}

/// The same on a real Redis, which agrees with the in-memory twin on every decision and
/// refund: fewer cases, on a grid of whole brisk seconds (with limits dividing the period),
/// each stretched to an hour with the period (see [`SLOW`]), so that every key outlives the
/// real time a case takes, a stall of the machine included.
#[test]
fn refunds_never_let_counted_admissions_exceed_the_algorithm_in_redis() {
    let redis = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(redis.store());
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &traffic(vec![1, 2, 3, 4, 5, 6, 8, 10, 12], 1_000_000 * SLOW, SLOW),
            |t| {
                for (name, algorithm) in timed_algorithms(&t) {
                    let (on_redis, in_memory) = limiters(&store, &algorithm);
                    let played = rt.block_on(play(&on_redis, &t));
                    let twin = rt.block_on(play(&in_memory, &t));
                    assert_eq!(played, twin, "{name}: Redis and the twin, {t:?}");
                    let fresh = || limiters(&store, &algorithm).0;
                    rt.block_on(counted_within_the_algorithm(&played, fresh, &t, name));
                }
                Ok(())
            },
        )
        .unwrap();
}

/// `MONITOR` on a test Redis: every command it runs, scripts' included.
struct Monitor {
    lines: std::io::BufReader<std::net::TcpStream>,
}

impl Monitor {
    fn start(port: u16) -> Self {
        use std::io::{BufRead, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut lines = std::io::BufReader::new(stream);
        let mut ok = String::new();
        lines.read_line(&mut ok).unwrap();
        assert_eq!(ok.trim_end(), "+OK");
        Self { lines }
    }

    /// The commands scripts ran (each as its name and arguments) until the `ECHO` of
    /// `marker` that the caller sends after them.
    fn scripts_until(&mut self, marker: &str) -> Vec<Vec<String>> {
        use std::io::BufRead;
        let mut commands = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.lines.read_line(&mut line).unwrap() > 0,
                "MONITOR ended"
            );
            let Some((source, rest)) = line.split_once("] ") else {
                continue;
            };
            let args = monitor_args(rest);
            if args.len() == 2 && args[0].eq_ignore_ascii_case("echo") && args[1] == marker {
                return commands;
            }
            if source.ends_with("lua") {
                commands.push(args);
            }
        }
    }
}

/// The quoted arguments of a `MONITOR` line.
fn monitor_args(rest: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut chars = rest.trim_end().chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => arg.extend(chars.next()),
                '"' => break,
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    args
}

/// Log members a script command reads or writes: those it names (`ZADD`, `ZREM`), or the
/// span of ranks it reads (`ZRANGE`); a range by score without `LIMIT` reads every member
/// in it, unbounded. Counting, reading a hash or a key's size touches no member.
fn members_touched(command: &[String]) -> usize {
    let int = |i: usize| command.get(i).and_then(|a| a.parse::<i64>().ok());
    match command[0].to_ascii_lowercase().as_str() {
        "zadd" => (command.len() - 2) / 2,
        "zrem" => command.len() - 2,
        "zrange" => match (int(2), int(3)) {
            (Some(a), Some(b)) if a >= 0 && b >= a => (b - a + 1) as usize,
            (Some(-1), Some(-1)) => 1,
            _ => usize::MAX,
        },
        "zrangebyscore" | "zrevrangebyscore" => {
            match command.iter().position(|a| a.eq_ignore_ascii_case("limit")) {
                Some(i) => command
                    .get(i + 2)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(usize::MAX),
                None => usize::MAX,
            }
        }
        _ => 0,
    }
}

/// At the sizes a client controls (100,000 per 120 s, a log of 40,000 members, 100 refunds
/// parked in its middle), each refund does bounded work in Redis, as `MONITOR` shows of the
/// commands its script ran: at most 16 commands touching at most 3 × 64 + 8 log members in
/// all, not the 20,000 members of a side. The refunds give nothing back now (their units move
/// 64 members back and leave the window with them), and Redis agrees with the in-memory twin
/// afterwards.
#[tokio::test]
async fn a_sliding_window_refund_does_bounded_work_whatever_the_log_size() {
    use tower_redis_ratelimit::redis::{self, Script};
    let redis = RedisServer::start();
    let window = Duration::from_secs(120);
    let algorithm = SlidingWindow::new(Quota::new(100_000, window)).unwrap();
    let on_redis = RateLimiter::new(redis.store().await, algorithm.clone()).unwrap();
    let in_memory = RateLimiter::new(MemoryStore::new(), algorithm).unwrap();
    // 20,000 counted requests, 100 parked ones (uncounted, in flight), 20,000 more: the
    // filler goes to the same script the limiter runs, pipelined.
    let script = Script::new(&format!(
        "{}{}",
        include_str!("../../lua/prelude.lua"),
        include_str!("../../lua/sliding_window.lua")
    ));
    let base = on_redis.storage_key("k");
    let mut c = redis.conn();
    script.prepare_invoke().load(&mut c).unwrap();
    let mut fill = |from: u64, to: u64| {
        for chunk in (from..to).collect::<Vec<_>>().chunks(1_000) {
            let mut pipe = redis::pipe();
            for i in chunk {
                pipe.cmd("EVALSHA")
                    .arg(script.get_hash())
                    .arg(2)
                    .arg(format!("{base}:l2"))
                    .arg(format!("{base}:m2"))
                    .arg(T0 + i)
                    .arg(1)
                    .arg(window.as_micros() as u64)
                    .arg(100_000)
                    .ignore();
            }
            pipe.query::<()>(&mut c).unwrap();
        }
    };
    fill(0, 20_000);
    let mut parked = Vec::new();
    for i in 20_000..20_100 {
        let r = on_redis.check_at("k", 1, T0 + i).await.unwrap();
        assert!(r.allowed);
        parked.push(r);
    }
    fill(20_100, 40_100);
    let mut twin_parked = Vec::new();
    for i in 0..40_100 {
        let m = in_memory.check_at("k", 1, T0 + i).await.unwrap();
        assert!(m.allowed);
        if (20_000..20_100).contains(&i) {
            twin_parked.push(m);
        }
    }
    let mut monitor = Monitor::start(redis.port);
    let now = T0 + 50_000;
    for (i, (mut r, mut m)) in parked.into_iter().zip(twin_parked).enumerate() {
        let given = on_redis.refund_at("k", &mut r, now).await.unwrap();
        let marker = format!("refund-{i}-done");
        let _: String = redis::cmd("ECHO").arg(&marker).query(&mut c).unwrap();
        let commands = monitor.scripts_until(&marker);
        let touched = commands
            .iter()
            .map(|cmd| members_touched(cmd))
            .fold(0usize, usize::saturating_add);
        assert!(
            commands.len() <= 16 && touched <= 3 * 64 + 8,
            "refund {i}: {} commands touching {touched} log members: {:?}",
            commands.len(),
            commands
                .iter()
                .map(|c| c.iter().take(4).cloned().collect::<Vec<_>>().join(" "))
                .collect::<Vec<_>>()
        );
        assert!(
            !given,
            "refund {i}: deep in the log, nothing is given back now"
        );
        assert!(!in_memory.refund_at("k", &mut m, now).await.unwrap());
    }
    for at in [now, T0 + 120_000_000 + 19_935, T0 + 120_000_000 + 19_999] {
        let r = on_redis.check_at("k", 1, at).await.unwrap();
        let m = in_memory.check_at("k", 1, at).await.unwrap();
        assert_eq!(r, m, "at +{}", at - T0);
    }
}

/// A refund ledger that is not one (foreign data under its key) is an error, never a refund
/// of more than the charge holds; checks of the key go on.
#[tokio::test]
async fn a_corrupted_refund_ledger_is_an_error() {
    use tower_redis_ratelimit::redis;
    let redis = RedisServer::start();
    let limiter = RateLimiter::new(
        redis.store().await,
        Gcra::new(Quota::per_minute(3)).unwrap(),
    )
    .unwrap();
    let first = limiter.check("k", 1).await.unwrap();
    assert!(limiter.check("k", 1).await.unwrap().allowed);
    for junk in ["x", "1 2 3", "-5 0", "99999999999999999 0 1 2 3 4"] {
        let _: () = redis::cmd("SET")
            .arg(format!("{}:gr", limiter.storage_key("k")))
            .arg(junk)
            .query(&mut redis.conn())
            .unwrap();
        let mut d = first.clone();
        let e = limiter.refund("k", &mut d).await.unwrap_err();
        let e = crate::common::chain(&e);
        assert!(e.contains("refund ledger"), "{junk:?}: {e}");
    }
    assert!(limiter.check("k", 1).await.unwrap().allowed);
    assert!(!limiter.check("k", 1).await.unwrap().allowed);
}
