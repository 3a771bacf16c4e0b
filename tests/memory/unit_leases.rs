//! Unit leases on a store that decides at once (a lease changes nothing), and the lease's
//! options checked by name.

use std::{sync::Arc, time::Duration};

use tower_redis_ratelimit::{
    algorithm::{Algorithm, MultiLimit},
    rate_limit::UnitLease,
    Gcra, MemoryStore, Quota, RateLimiter, SlidingWindow, TokenBucket,
};

/// On a MemoryStore a lease changes nothing: the same decisions as without.
#[tokio::test]
async fn a_lease_on_a_memory_store_changes_nothing() {
    let gcra = Gcra::new(Quota::per_hour(5)).unwrap();
    let leased = RateLimiter::builder(MemoryStore::new(), gcra.clone())
        .lease(UnitLease::up_to(Duration::from_millis(50)))
        .build()
        .unwrap();
    let plain = RateLimiter::new(MemoryStore::new(), gcra).unwrap();
    for _ in 0..8 {
        let (a, b) = (
            leased.check("k", 1).await.unwrap(),
            plain.check("k", 1).await.unwrap(),
        );
        assert_eq!((a.allowed, a.remaining), (b.allowed, b.remaining));
    }
}

#[test]
fn lease_options_are_validated_naming_the_field() {
    let quota = Quota::per_second(100);
    let field = |lease: UnitLease, algorithm: Arc<dyn Algorithm>| {
        RateLimiter::builder(MemoryStore::new(), algorithm)
            .lease(lease)
            .build()
            .unwrap_err()
            .field()
            .to_owned()
    };
    let ok = UnitLease::up_to(Duration::from_millis(50));
    let gcra: Arc<dyn Algorithm> = Arc::new(Gcra::new(quota).unwrap());
    assert_eq!(
        field(UnitLease::up_to(Duration::ZERO), gcra.clone()),
        "lease.lifetime"
    );
    assert_eq!(
        field(UnitLease::up_to(Duration::from_secs(11)), gcra.clone()),
        "lease.lifetime"
    );
    assert_eq!(field(ok.max_units(0), gcra.clone()), "lease.max_units");
    // More than an eighth of the burst is refused, not cut to it.
    let eighth = (quota.burst_size() / 8).max(1);
    assert_eq!(
        field(ok.max_units(eighth + 1), gcra.clone()),
        "lease.max_units"
    );
    let refusal = RateLimiter::builder(MemoryStore::new(), gcra.clone())
        .lease(ok.max_units(eighth + 1))
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        refusal.contains(&format!(
            "must be at most an eighth of the burst ({eighth} for a burst of 100), so that one"
        )),
        "{refusal}"
    );
    assert_eq!(field(ok.max_keys(0), gcra.clone()), "lease.max_keys");
    let window: Arc<dyn Algorithm> = Arc::new(SlidingWindow::new(quota).unwrap());
    assert_eq!(field(ok, window), "lease");
    let multi: Arc<dyn Algorithm> = Arc::new(
        MultiLimit::new([("second", quota), ("minute", Quota::per_minute(1_000))]).unwrap(),
    );
    assert_eq!(field(ok, multi), "lease");
    let bucket: Arc<dyn Algorithm> = Arc::new(TokenBucket::new(quota).unwrap());
    assert!(RateLimiter::builder(MemoryStore::new(), bucket)
        .lease(ok)
        .build()
        .is_ok());
}
