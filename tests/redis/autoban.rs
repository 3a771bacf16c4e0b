//! Automatic bans (`RateLimiterBuilder::ban_after`): refusals counted exactly across two
//! limiters on one store, in Redis and in memory; the ban is the operators' (peek shows it,
//! unban lifts it); escalation capped at a day; shadow mode counts and never bans; the
//! `ratelimit_bans_total` metric by reason.

use std::time::{Duration, Instant};

use crate::servers::RedisServer;
use tower_redis_ratelimit::{
    algorithm::Algorithm, rate_limit::AutoBan, store::Store, Gcra, MemoryStore, Quota, RateLimiter,
};

/// Time enough, on a loaded machine, for a queued refusal to be counted.
const DEADLINE: Duration = Duration::from_secs(30);

fn limiter(
    store: impl Store,
    prefix: &str,
    ban: AutoBan,
    shadow: bool,
) -> RateLimiter<std::sync::Arc<dyn Algorithm>> {
    let algorithm: std::sync::Arc<dyn Algorithm> =
        std::sync::Arc::new(Gcra::new(Quota::per_hour(1)).unwrap());
    RateLimiter::builder(store, algorithm)
        .prefix(prefix)
        .store_timeout(Duration::from_secs(5))
        .shadow(shadow)
        .ban_after(ban)
        .build()
        .unwrap()
}

/// Waits until `key` is banned (its ban's time left), or fails after [`DEADLINE`].
async fn banned<A: Algorithm>(l: &RateLimiter<A>, key: &str) -> Duration {
    let started = Instant::now();
    loop {
        if let Some(left) = l.peek(key).await.unwrap().banned_for {
            return left;
        }
        assert!(started.elapsed() < DEADLINE, "{key} was never banned");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Refuses `key` `n` times on `l` (its quota spent first when `fresh`).
async fn refuse<A: Algorithm>(l: &RateLimiter<A>, key: &str, n: usize, fresh: bool) {
    if fresh {
        assert!(l.check(key, 1).await.unwrap().allowed);
    }
    for _ in 0..n {
        let d = l.check(key, 1).await.unwrap();
        assert!(!d.allowed && !d.banned, "{key}: {d:?}");
    }
}

/// Refuses `key` once on `l`, after its cached denial of the key as banned is gone (another
/// instance lifted the ban: at most 1 s).
async fn refuse_once_unbanned<A: Algorithm>(l: &RateLimiter<A>, key: &str) {
    let started = Instant::now();
    loop {
        let d = l.check(key, 1).await.unwrap();
        assert!(!d.allowed, "{d:?}");
        if !d.banned {
            return;
        }
        assert!(started.elapsed() < DEADLINE, "{key} stayed banned");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every refusal `l` queued before is counted: a sentinel key refused 3 times behind them
/// (one queue, taken in order) is banned.
async fn drained<A: Algorithm>(l: &RateLimiter<A>, sentinel: &str) {
    refuse(l, sentinel, 3, true).await;
    banned(l, sentinel).await;
}

/// Two limiters (two instances) on one store: two refusals on one and one on the other ban
/// the key, on both, for the ban's time; not before the third; refusals while banned do not
/// count; an operator's unban lifts it and the count starts afresh.
async fn counted_exactly_across_instances(a: impl Store, b: impl Store, prefix: &str) {
    let ban = AutoBan::new(3, Duration::from_secs(60), Duration::from_secs(600));
    let (a, b) = (
        limiter(a, prefix, ban, false),
        limiter(b, prefix, ban, false),
    );
    refuse(&a, "k", 1, true).await;
    refuse(&b, "k", 1, false).await;
    drained(&a, "sentinel-a1").await;
    drained(&b, "sentinel-b1").await;
    assert_eq!(
        a.peek("k").await.unwrap().banned_for,
        None,
        "2 refusals of 3"
    );
    refuse(&b, "k", 1, false).await;
    let left = banned(&a, "k").await;
    assert!(
        left > Duration::from_secs(590) && left <= Duration::from_secs(600),
        "{left:?}"
    );
    // Each instance refuses it as banned (an instance's cached denial of the key, at most
    // 1 s old, may answer first).
    for l in [&a, &b] {
        let started = Instant::now();
        let d = loop {
            let d = l.check("k", 1).await.unwrap();
            if d.banned || started.elapsed() > DEADLINE {
                break d;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(d.banned && !d.allowed, "{d:?}");
        assert!(d.retry_after.unwrap() > Duration::from_secs(580));
    }
    // A reset leaves the ban; refusals while banned are not counted (and none is sent).
    a.reset("k").await.unwrap();
    assert!(a.peek("k").await.unwrap().banned_for.is_some());
    a.unban("k").await.unwrap();
    assert!(b.peek("k").await.unwrap().banned_for.is_none());
    // The count started afresh with the ban: two refusals after it do not ban.
    refuse(&a, "k", 1, true).await;
    refuse_once_unbanned(&b, "k").await;
    drained(&a, "sentinel-a2").await;
    drained(&b, "sentinel-b2").await;
    assert_eq!(a.peek("k").await.unwrap().banned_for, None);
    // The third does, escalated: twice the first ban.
    refuse(&a, "k", 1, false).await;
    let left = banned(&b, "k").await;
    assert!(
        left > Duration::from_secs(1190) && left <= Duration::from_secs(1200),
        "{left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_counted_exactly_across_instances_on_redis() {
    let redis = RedisServer::start();
    let (a, b) = (redis.store().await, redis.store().await);
    counted_exactly_across_instances(a, b, "ab-exact").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_counted_exactly_across_instances_in_memory() {
    let store = MemoryStore::new();
    counted_exactly_across_instances(store.clone(), store, "ab-exact").await;
}

/// Each ban within a day of the last: three times longer, at most a day.
async fn escalation_is_capped_at_a_day(store: impl Store) {
    let day = Duration::from_secs(86_400);
    let ban =
        AutoBan::new(1, Duration::from_secs(60), Duration::from_secs(12 * 3600)).escalate(3.0);
    let l = limiter(store, "ab-cap", ban, false);
    refuse(&l, "k", 1, true).await;
    let left = banned(&l, "k").await;
    assert!(
        left > Duration::from_secs(12 * 3600 - 10) && left <= day / 2,
        "{left:?}"
    );
    for _ in 0..2 {
        l.unban("k").await.unwrap();
        refuse(&l, "k", 1, false).await;
        let left = banned(&l, "k").await;
        assert!(
            left > day - Duration::from_secs(10) && left <= day,
            "{left:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_is_capped_at_a_day_on_redis() {
    let redis = RedisServer::start();
    escalation_is_capped_at_a_day(redis.store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalation_is_capped_at_a_day_in_memory() {
    escalation_is_capped_at_a_day(MemoryStore::new()).await;
}

/// In shadow mode refusals are counted and the would-be ban logged, never set: the key is
/// refused 9 times (3 would-be bans); once the 3 "would ban" lines are logged (every refusal
/// counted), the key has no ban and is not refused as banned.
async fn shadow_never_bans(store: impl Store + Clone) {
    let ban = AutoBan::new(3, Duration::from_secs(60), Duration::from_secs(600));
    let shadow = limiter(store.clone(), "ab-shadow", ban, true);
    assert!(shadow.check("k", 1).await.unwrap().allowed);
    for _ in 0..9 {
        let d = shadow.check("k", 1).await.unwrap();
        assert!(!d.allowed && d.shadow && !d.banned, "{d:?}");
    }
    let started = Instant::now();
    while logged("would ban") < 3 {
        assert!(
            started.elapsed() < DEADLINE,
            "the would-be bans were never logged"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(shadow.peek("k").await.unwrap().banned_for, None);
    let d = shadow.check("k", 1).await.unwrap();
    assert!(!d.banned, "{d:?}");
}

/// The log lines of this test process, for what the counting task logs.
static LOG: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

struct Lines;

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().push_str(&String::from_utf8_lossy(buf));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How many lines logged so far say `what` (the subscriber installed on first call).
fn logged(what: &str) -> usize {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(|| Lines)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
    });
    LOG.lock().unwrap().matches(what).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_counts_and_never_bans_on_redis() {
    logged("");
    let redis = RedisServer::start();
    shadow_never_bans(redis.store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_counts_and_never_bans_in_memory() {
    logged("");
    shadow_never_bans(MemoryStore::new()).await;
}

/// `ratelimit_bans_total{policy, reason}`: an automatic ban and an operator's, once each.
#[cfg(feature = "metrics")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_are_counted_by_reason() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in this test process");
    let redis = RedisServer::start();
    let ban = AutoBan::new(2, Duration::from_secs(60), Duration::from_secs(60));
    let l = limiter(redis.store().await, "ab-metric", ban, false);
    refuse(&l, "k", 2, true).await;
    banned(&l, "k").await;
    l.ban("other", Duration::from_secs(60)).await.unwrap();
    // Each snapshot takes what the counters counted since the last one: added up here.
    let mut counted = std::collections::HashMap::<String, u64>::new();
    let mut take = || {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let k = key.key();
            let reason = k.labels().find(|l| l.key() == "reason");
            let ours = k.name() == "ratelimit_bans_total"
                && k.labels()
                    .any(|l| l.key() == "policy" && l.value() == "default");
            if let (true, Some(reason), DebugValue::Counter(n)) = (ours, reason, value) {
                *counted.entry(reason.value().to_owned()).or_default() += n;
            }
        }
        counted.clone()
    };
    // The ban is counted once the store answered its setter (just after it is in force).
    let started = Instant::now();
    while take().get("operator") != Some(&1) || take().get("automatic") != Some(&1) {
        assert!(started.elapsed() < DEADLINE, "{counted:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let counted = take();
    assert_eq!(counted.get("automatic"), Some(&1), "{counted:?}");
    assert_eq!(counted.get("operator"), Some(&1), "{counted:?}");
}
