//! A bounded soak: mixed traffic on every algorithm while Redis is killed and restarted twice.
//! Reports allowed / denied / errors, and checks that no counter drifted: in each Redis
//! lifetime every key admitted at most its quota, and (with traffic to spare) all of it.
//!
//! `SOAK_SECS=600 cargo test --release --test soak -- --nocapture` runs it longer
//! (default 20 s).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use crate::servers::RedisServer;
use tower_redis_ratelimit::{
    algorithm::Algorithm, store::CircuitBreaker, Gcra, Quota, RateLimiter, RedisStore,
    SlidingWindow, TokenBucket,
};

const QUOTA: u64 = 50;
const KEYS: u64 = 20;

fn soak_secs() -> u64 {
    std::env::var("SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

fn build<A: Algorithm>(store: RedisStore, a: A, prefix: &str) -> RateLimiter<A> {
    RateLimiter::builder(store, a)
        .prefix(prefix)
        .store_timeout(Duration::from_millis(250))
        .circuit_breaker(CircuitBreaker::new(5, Duration::from_millis(100)))
        .build()
        .unwrap()
}

/// Units admitted per (segment, algorithm, key); a segment is one Redis lifetime.
type Ledger = Mutex<HashMap<(usize, usize, u64), u64>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_two_restarts() {
    let secs = soak_secs();
    let mut redis = RedisServer::start();
    let store = redis.store().await;
    // A day's quota: nothing refills during the soak, so each lifetime's totals are exact.
    let q = Quota::per_day(QUOTA as u32);
    let g = build(store.clone(), Gcra::new(q).unwrap(), "soak-g");
    let tb = build(store.clone(), TokenBucket::new(q).unwrap(), "soak-tb");
    let sw = build(store, SlidingWindow::new(q).unwrap(), "soak-sw");

    let segment = Arc::new(AtomicUsize::new(0));
    let ledger: Arc<Ledger> = Arc::default();
    let (allowed, denied, errors) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..32u64 {
        let (g, tb, sw) = (g.clone(), tb.clone(), sw.clone());
        let (segment, ledger, stop) = (segment.clone(), ledger.clone(), stop.clone());
        let (allowed, denied, errors) = (allowed.clone(), denied.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = 0x2545_F491_4F6C_DD1D_u64 ^ (t + 1);
            while !stop.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let key = rng % KEYS;
                let cost = (rng >> 8) % 3 + 1;
                let algo = ((rng >> 16) % 3) as usize;
                let name = format!("user{key}");
                let before = segment.load(Ordering::SeqCst);
                let result = match algo {
                    0 => g.check(&name, cost as u32).await,
                    1 => tb.check(&name, cost as u32).await,
                    _ => sw.check(&name, cost as u32).await,
                };
                let after = segment.load(Ordering::SeqCst);
                match result {
                    Ok(d) if d.allowed => {
                        allowed.fetch_add(1, Ordering::Relaxed);
                        // The segment is bumped after the old server is dead and before the
                        // new one starts, so a success never straddles a restart.
                        assert_eq!(before, after, "a check succeeded across a restart");
                        *ledger
                            .lock()
                            .unwrap()
                            .entry((after, algo, key))
                            .or_default() += cost;
                    }
                    Ok(_) => {
                        denied.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        }));
    }
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(secs / 3)).await;
        redis.kill();
        segment.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.restart();
    }
    tokio::time::sleep(Duration::from_secs(secs / 3)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }

    let (a, d, e) = (
        allowed.load(Ordering::Relaxed),
        denied.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    );
    println!("soak {secs} s: allowed {a}, denied {d}, errors {e} (two Redis restarts)");
    for (name, l) in [
        ("gcra", g.stats()),
        ("token-bucket", tb.stats()),
        ("sliding-window", sw.stats()),
    ] {
        println!("  {name}: {l:?}");
    }
    let ledger = ledger.lock().unwrap();
    for seg in 0..3 {
        for algo in 0..3 {
            for key in 0..KEYS {
                let units = ledger.get(&(seg, algo, key)).copied().unwrap_or(0);
                assert!(
                    units <= QUOTA,
                    "segment {seg} algo {algo} key {key}: {units} > {QUOTA}"
                );
                assert!(
                    units >= QUOTA - 2,
                    "segment {seg} algo {algo} key {key}: only {units}"
                );
            }
        }
    }
    assert!(d > a, "the soak should be far over its limits");
    assert!(e > 0, "the restarts should have been noticed");
}
