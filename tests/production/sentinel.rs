//! Redis Sentinel on a real local deployment (one primary, one replica, three Sentinels; see
//! `crate::servers::sentinel`): `connect_sentinel` finds the primary, checks stay exact, a killed
//! primary is followed to the promoted replica under load (failover time, errors and overshoot
//! printed), a wrong master name or dead Sentinels fail at connect with the right kind, and
//! the gateway demo runs on `--redis-sentinel`.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use crate::common::limiter;
use crate::servers::{
    keys_with_pttl,
    sentinel::{Sentinel, SentinelSetup, MASTER},
    RedisServer,
};
use tower_redis_ratelimit::{
    store::redis::ConnectErrorKind, store::CircuitBreaker, Error, Gcra, Quota, RateLimiter,
    RedisStore, SlidingWindow, TokenBucket,
};

async fn sentinel_store(setup: &SentinelSetup, connect_timeout: Duration) -> RedisStore {
    RedisStore::builder()
        .connect_timeout(connect_timeout)
        .connect_sentinel(&setup.sentinel_urls(), MASTER)
        .await
        .unwrap_or_else(|e| panic!("connect_sentinel failed: {e}\n{}", setup.logs()))
}

#[tokio::test]
async fn connect_sentinel_finds_the_primary_and_checks_are_exact() {
    let setup = SentinelSetup::start();
    let store = sentinel_store(&setup, Duration::from_secs(2)).await;

    let sw = limiter(
        store.clone(),
        SlidingWindow::new(Quota::per_minute(10)).unwrap(),
        "exact-sw",
    );
    let gcra = limiter(
        store.clone(),
        Gcra::new(Quota::per_minute(10)).unwrap(),
        "exact-gcra",
    );
    let tb = limiter(
        store,
        TokenBucket::new(Quota::per_minute(10)).unwrap(),
        "exact-tb",
    );
    let mut allowed = [0; 3];
    for _ in 0..15 {
        allowed[0] += u32::from(sw.check("k", 1).await.unwrap().allowed);
        allowed[1] += u32::from(gcra.check("k", 1).await.unwrap().allowed);
        allowed[2] += u32::from(tb.check("k", 1).await.unwrap().allowed);
    }
    assert_eq!(
        allowed, [10; 3],
        "allowed of 15 (sliding window, GCRA, token bucket)"
    );
    // Another key has its own quota.
    assert!(sw.check("other", 1).await.unwrap().allowed);

    // The state went to the primary (the replica would have answered READONLY), and it
    // replicates.
    let on_primary = keys_with_pttl(&mut setup.primary.conn(), "{exact-*");
    assert!(
        on_primary.len() >= 3,
        "no limiter keys on the primary: {on_primary:?}"
    );
    assert!(on_primary.iter().all(|(_, ttl)| *ttl > 0), "{on_primary:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let on_replica = keys_with_pttl(&mut setup.replica.conn(), "{exact-*");
        if on_replica.len() == on_primary.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica holds {on_replica:?}, primary {on_primary:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A primary that freezes (SIGSTOP: the socket stays open, nothing answers) is failed over
/// by the Sentinels; the store notices that nothing answers, asks the Sentinels again and
/// follows the promoted replica, instead of keeping the connection to the frozen primary
/// and timing out every check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_is_left_for_the_promoted_replica() {
    let setup = SentinelSetup::start();
    let store = sentinel_store(&setup, Duration::from_secs(1)).await;
    let limiter =
        RateLimiter::builder(store, SlidingWindow::new(Quota::per_minute(1_000)).unwrap())
            .prefix("frozen")
            .store_timeout(Duration::from_millis(200))
            .circuit_breaker(CircuitBreaker::disabled())
            .deny_cache(0)
            .build()
            .unwrap();
    assert!(limiter.check("k", 1).await.unwrap().allowed);

    setup.primary.signal("-STOP");
    let frozen_at = Instant::now();
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let recovered = loop {
        let outcome = limiter.check("k", 1).await;
        match outcome {
            Ok(d) => break d,
            Err(e) => *outcomes.entry(e.to_string()).or_default() += 1,
        }
        if frozen_at.elapsed() > Duration::from_secs(20) {
            setup.primary.signal("-CONT");
            panic!(
                "still failing 20 s after the primary froze: {outcomes:?}\n{}",
                setup.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let took = frozen_at.elapsed();
    eprintln!("recovered {took:?} after the freeze; failures on the way: {outcomes:?}");
    assert!(recovered.allowed);
    assert!(
        !outcomes.is_empty(),
        "no check failed while the primary was frozen"
    );
    // The state went to the promoted replica.
    let on_replica = keys_with_pttl(&mut setup.replica.conn(), "{frozen*");
    assert!(!on_replica.is_empty(), "no limiter key on the new primary");
    let role: redis::Value = redis::cmd("ROLE").query(&mut setup.replica.conn()).unwrap();
    assert!(
        format!("{role:?}").contains("master"),
        "the replica was not promoted: {role:?}"
    );
    // Dropping the setup SIGKILLs the frozen process.
}

/// One check made by the failover traffic.
#[derive(Clone, Debug)]
struct Attempt {
    key: usize,
    /// When the check started and ended, from the start of the traffic.
    start: Duration,
    end: Duration,
    outcome: Outcome,
}

#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Allowed,
    Denied,
    Failed(String),
}

const FAILOVER_LIMIT: u32 = 150;
const FAILOVER_KEYS: usize = 8;
const FAILOVER_TASKS: usize = 4;

/// Kills the primary under load (4 tasks, a check every ~5 ms each on 8 keys, 150 per minute
/// per key, store timeout 200 ms, no circuit breaker, no deny cache, so every check goes to
/// Redis) and measures how long checks fail, how many, and by how much a key's limit is
/// exceeded afterwards (writes the dead primary acknowledged but did not replicate).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_under_load_moves_to_the_promoted_replica_and_limits_hold() {
    let mut setup = SentinelSetup::start();
    let store = sentinel_store(&setup, Duration::from_secs(1)).await;
    let limiter = RateLimiter::builder(
        store,
        SlidingWindow::new(Quota::per_minute(FAILOVER_LIMIT)).unwrap(),
    )
    .prefix("failover")
    .store_timeout(Duration::from_millis(200))
    .circuit_breaker(CircuitBreaker::disabled())
    .deny_cache(0)
    .build()
    .unwrap();

    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let log: Arc<Mutex<Vec<Attempt>>> = Arc::default();
    let mut tasks = Vec::new();
    for task in 0..FAILOVER_TASKS {
        let (limiter, stop, log) = (limiter.clone(), stop.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = task;
            while !stop.load(Ordering::Relaxed) {
                let key = n % FAILOVER_KEYS;
                n += 1;
                let start = origin.elapsed();
                let outcome = match limiter.check(&format!("user{key}"), 1).await {
                    Ok(d) if d.allowed => Outcome::Allowed,
                    Ok(_) => Outcome::Denied,
                    Err(e) => Outcome::Failed(e.to_string()),
                };
                let end = origin.elapsed();
                log.lock().unwrap().push(Attempt {
                    key,
                    start,
                    end,
                    outcome,
                });
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }

    // About 100 admitted per key before the kill: every key is still admitting (its writes
    // are in flight to the replica) when the primary dies.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let before: Vec<Attempt> = log.lock().unwrap().clone();
    let failed_before: Vec<&Attempt> = before
        .iter()
        .filter(|a| matches!(a.outcome, Outcome::Failed(_)))
        .collect();
    assert!(
        failed_before.is_empty(),
        "checks failed before the kill: {failed_before:?}"
    );
    assert!(
        before.iter().all(|a| a.outcome == Outcome::Allowed),
        "a key reached its limit before the kill; raise FAILOVER_LIMIT"
    );
    assert!(before.len() > 100, "too little traffic: {}", before.len());

    let killed_at = origin.elapsed();
    let old_primary = setup.primary.port;
    setup.primary.kill();

    // Until: checks failed after the kill, none has failed for 1.5 s since, and every key
    // was denied by a check that started after the last failure (so its count is complete).
    let deadline = killed_at + Duration::from_secs(25);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = origin.elapsed();
        let attempts = log.lock().unwrap().clone();
        let last_failure = attempts
            .iter()
            .filter(|a| a.start >= killed_at && matches!(a.outcome, Outcome::Failed(_)))
            .map(|a| a.start)
            .max();
        if let Some(last_failure) = last_failure {
            let mut denied_after = [false; FAILOVER_KEYS];
            for a in attempts.iter().filter(|a| a.start > last_failure) {
                if a.outcome == Outcome::Denied {
                    denied_after[a.key] = true;
                }
            }
            if now.saturating_sub(last_failure) > Duration::from_millis(1_500)
                && denied_after.iter().all(|&d| d)
            {
                break;
            }
        }
        if now > deadline {
            stop.store(true, Ordering::Relaxed);
            let summary = summarize(&attempts, killed_at);
            panic!(
                "no recovery within {:?} of the kill: {summary}\n{}",
                deadline - killed_at,
                setup.logs()
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let attempts = log.lock().unwrap().clone();

    let last_failure = attempts
        .iter()
        .filter(|a| matches!(a.outcome, Outcome::Failed(_)))
        .max_by_key(|a| a.start)
        .expect("no check failed after the kill")
        .clone();
    // Recovered: the first success that started after the last failure (every check after it
    // succeeded).
    let recovered_at = attempts
        .iter()
        .filter(|a| a.start > last_failure.start && !matches!(a.outcome, Outcome::Failed(_)))
        .map(|a| a.end)
        .min()
        .expect("no success after the last failure");
    let first_success = attempts
        .iter()
        .filter(|a| a.start >= killed_at && !matches!(a.outcome, Outcome::Failed(_)))
        .map(|a| a.end)
        .min()
        .unwrap();
    let failover = recovered_at - killed_at;
    let failures: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| matches!(a.outcome, Outcome::Failed(_)))
        .collect();
    let after_recovery = attempts.iter().filter(|a| a.start >= recovered_at).count();

    // Per key: admitted in all (the whole run is inside the 60 s window), and admitted by the
    // old primary in its last second, which bounds what its lost replication backlog held.
    let mut admitted = [0u32; FAILOVER_KEYS];
    let mut admitted_last_second = [0u32; FAILOVER_KEYS];
    for a in attempts.iter().filter(|a| a.outcome == Outcome::Allowed) {
        admitted[a.key] += 1;
        if a.start < killed_at && a.start + Duration::from_secs(1) >= killed_at {
            admitted_last_second[a.key] += 1;
        }
    }
    let overshoot: Vec<u32> = admitted
        .iter()
        .map(|&n| n.saturating_sub(FAILOVER_LIMIT))
        .collect();
    let mut failure_kinds: BTreeMap<String, usize> = BTreeMap::new();
    for f in &failures {
        if let Outcome::Failed(e) = &f.outcome {
            // The message up to the first address-specific detail.
            let kind: String = e.split(':').take(2).collect::<Vec<_>>().join(":");
            *failure_kinds.entry(kind).or_default() += 1;
        }
    }
    println!(
        "sentinel failover: primary killed at {killed_at:?}; first success {} ms after the \
         kill, checks succeeding consistently {} ms after the kill; {} failed checks (of {} \
         in all, {} after recovery, none failed); admitted per key {admitted:?} (limit \
         {FAILOVER_LIMIT}), overshoot per key {overshoot:?} (max {}), admitted per key in the \
         old primary's last second {admitted_last_second:?}; failures by kind {failure_kinds:?}",
        (first_success - killed_at).as_millis(),
        failover.as_millis(),
        failures.len(),
        attempts.len(),
        after_recovery,
        overshoot.iter().max().unwrap(),
    );

    assert!(
        failover < Duration::from_secs(15),
        "checks failed for {failover:?} after the kill"
    );
    assert!(
        after_recovery > 200,
        "too little traffic after recovery: {after_recovery}"
    );
    // Limits hold after the failover: each key's overshoot is bounded by what the old primary
    // admitted just before dying (its unreplicated writes are at most that).
    for key in 0..FAILOVER_KEYS {
        assert!(
            overshoot[key] <= admitted_last_second[key],
            "user{key}: admitted {} > limit {FAILOVER_LIMIT} + {} admitted in the old \
             primary's last second",
            admitted[key],
            admitted_last_second[key]
        );
    }
    // The Sentinels promoted the replica, and the store's keys are there.
    setup.wait_master(setup.replica.port, Duration::from_secs(5));
    assert_ne!(setup.replica.port, old_primary);
    assert_eq!(setup.replica.role(), "master");
    let on_new_primary = keys_with_pttl(&mut setup.replica.conn(), "{failover:*");
    assert!(on_new_primary.len() >= FAILOVER_KEYS, "{on_new_primary:?}");
}

/// A one-line summary of the traffic after `killed_at`, for failure messages.
fn summarize(attempts: &[Attempt], killed_at: Duration) -> String {
    let after: Vec<&Attempt> = attempts.iter().filter(|a| a.start >= killed_at).collect();
    let failed: Vec<&Attempt> = after
        .iter()
        .copied()
        .filter(|a| matches!(a.outcome, Outcome::Failed(_)))
        .collect();
    format!(
        "{} checks after the kill, {} failed, the last failure: {:?}",
        after.len(),
        failed.len(),
        failed.last()
    )
}

#[tokio::test]
async fn a_wrong_master_name_is_no_primary() {
    let setup = SentinelSetup::start();
    let started = Instant::now();
    let result = RedisStore::builder()
        .connect_timeout(Duration::from_secs(1))
        .connect_sentinel(&setup.sentinel_urls(), "no-such-master")
        .await;
    match result {
        Err(Error::Connect(e)) => {
            assert_eq!(e.kind(), ConnectErrorKind::NoPrimary, "{e}");
            assert!(e.message().contains("no-such-master"), "{e}");
        }
        Err(other) => panic!("expected a NoPrimary connect error, got {other:?}"),
        Ok(_) => panic!("connected to a master no Sentinel monitors"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn all_sentinels_down_fails_within_the_connect_timeout() {
    let mut setup = SentinelSetup::start();
    for s in &mut setup.sentinels {
        s.kill();
    }
    let connect_timeout = Duration::from_secs(1);
    let started = Instant::now();
    let result = RedisStore::builder()
        .connect_timeout(connect_timeout)
        .connect_sentinel(&setup.sentinel_urls(), MASTER)
        .await;
    let took = started.elapsed();
    match result {
        Err(Error::Connect(e)) => assert!(
            matches!(
                e.kind(),
                ConnectErrorKind::Unreachable | ConnectErrorKind::NoPrimary
            ),
            "{e}"
        ),
        Err(other) => panic!("expected a connect error, got {other:?}"),
        Ok(_) => panic!("connected with every Sentinel down"),
    }
    assert!(
        took < connect_timeout + Duration::from_secs(1),
        "took {took:?}"
    );
}

/// Sentinels that accept connections but never answer (SIGSTOP): one of three does not delay
/// connecting, all three make it time out within the connect timeout.
#[tokio::test]
async fn stopped_sentinels_are_bounded_by_the_connect_timeout() {
    let setup = SentinelSetup::start();
    let connect_timeout = Duration::from_secs(1);
    let urls = setup.sentinel_urls();
    let connect = || {
        RedisStore::builder()
            .connect_timeout(connect_timeout)
            .connect_sentinel(&urls, MASTER)
    };

    setup.sentinels[0].signal("-STOP");
    let started = Instant::now();
    let store = connect()
        .await
        .unwrap_or_else(|e| panic!("one stopped Sentinel of three: {e}"));
    assert!(
        started.elapsed() < connect_timeout,
        "{:?}",
        started.elapsed()
    );
    let l = limiter(store, Gcra::new(Quota::per_minute(2)).unwrap(), "stopped");
    assert!(l.check("k", 1).await.unwrap().allowed);

    for s in &setup.sentinels[1..] {
        s.signal("-STOP");
    }
    let started = Instant::now();
    let result = connect().await;
    let took = started.elapsed();
    match result {
        Err(Error::Connect(e)) => assert_eq!(e.kind(), ConnectErrorKind::TimedOut, "{e}"),
        Err(other) => panic!("expected a connect error, got {other:?}"),
        Ok(_) => panic!("connected with every Sentinel stopped"),
    }
    assert!(
        took >= connect_timeout && took < connect_timeout + Duration::from_secs(1),
        "took {took:?}"
    );
}

/// A Sentinel that names a server refusing the primary's password (a decoy with a password
/// of its own), next to two that name the primary: the store connects to the primary, even
/// when the decoy's Sentinel answers first (the two others are stopped until its answer has
/// been tried); the same with a Sentinel naming a server that never answers. When no
/// Sentinel names a server that works, the error gives each one's
/// failure: with the kind of failure when every server named refused the same way, else
/// `NoPrimary`.
#[tokio::test]
async fn a_sentinel_naming_a_server_that_refuses_the_password_does_not_hide_the_primary() {
    let mut primary = RedisServer::start_with(&["--requirepass", "pw1"]);
    let decoy = RedisServer::start_with(&["--requirepass", "pw2"]);
    let liar = Sentinel::watching(decoy.port, Some("pw2"));
    let honest = [
        Sentinel::watching(primary.port, Some("pw1")),
        Sentinel::watching(primary.port, Some("pw1")),
    ];
    let all: Vec<String> = [&liar, &honest[0], &honest[1]]
        .iter()
        .map(|s| s.url())
        .collect();
    let connect = |sentinels: Vec<String>| async move {
        RedisStore::builder()
            .connect_timeout(Duration::from_secs(3))
            .primary_auth(None, "pw1")
            .connect_sentinel(&sentinels, MASTER)
            .await
    };

    for s in &honest {
        s.signal("-STOP");
    }
    let connecting = tokio::spawn(connect(all.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    for s in &honest {
        s.signal("-CONT");
    }
    let store = connecting
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the decoy's Sentinel answered first: {e}"));
    let l = limiter(store, Gcra::new(Quota::per_minute(5)).unwrap(), "liar");
    assert!(l.check("k", 1).await.unwrap().allowed);
    let mut on_primary = redis::Client::open(format!("redis://:pw1@127.0.0.1:{}", primary.port))
        .unwrap()
        .get_connection()
        .unwrap();
    assert!(!keys_with_pttl(&mut on_primary, "{liar*").is_empty());
    // In whatever order the Sentinels answer.
    for _ in 0..3 {
        connect(all.clone())
            .await
            .unwrap_or_else(|e| panic!("the Sentinels answering in any order: {e}"));
    }

    // A Sentinel naming a server that accepts connections and never answers, first: the
    // primary named meanwhile is tried without waiting for it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mute = Sentinel::watching(silent.local_addr().unwrap().port(), None);
    for s in &honest {
        s.signal("-STOP");
    }
    let connecting = tokio::spawn(connect(vec![mute.url(), honest[0].url(), honest[1].url()]));
    tokio::time::sleep(Duration::from_millis(500)).await;
    for s in &honest {
        s.signal("-CONT");
    }
    connecting
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("a Sentinel named a server that never answers: {e}"));

    // No Sentinel names a server that takes the password: the kind says so, and the message
    // names the server and the Sentinel that named it.
    let e = connect_error(connect(vec![liar.url()]).await);
    assert_eq!(e.kind(), ConnectErrorKind::AuthFailed, "{e}");
    for needle in [
        format!("primary 127.0.0.1:{}", decoy.port),
        format!("sentinel 127.0.0.1:{}", liar.port),
    ] {
        assert!(e.message().contains(&needle), "{needle}: {e}");
    }
    // The primary down too: the decoy refused the password, the primary is unreachable.
    primary.kill();
    let e = connect_error(connect(all).await);
    assert_eq!(e.kind(), ConnectErrorKind::NoPrimary, "{e}");
    for needle in [
        format!("primary 127.0.0.1:{}", decoy.port),
        format!("primary 127.0.0.1:{}", primary.port),
        "authentication failed".to_owned(),
        "unreachable".to_owned(),
    ] {
        assert!(e.message().contains(&needle), "{needle}: {e}");
    }
}

fn connect_error(
    result: Result<RedisStore, Error>,
) -> tower_redis_ratelimit::store::redis::ConnectError {
    match result {
        Err(Error::Connect(e)) => e,
        Err(other) => panic!("expected a connect error, got {other:?}"),
        Ok(_) => panic!("connected through Sentinels that name no working primary"),
    }
}
