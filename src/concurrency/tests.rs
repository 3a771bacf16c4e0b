//! The releases sent again, on a store whose releases fail while it is down, on a paused
//! clock.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use super::{
    kept::Kept,
    releases::{keep, MAX_KEPT},
};
use crate::error::Error;
use crate::{
    concurrency::ConcurrencyLimiter,
    store::{
        Acquired, Backend, BoxFuture, MemoryStore, Namespaces, SlotTerms, Slots, Store, StoreKey,
    },
};

/// An in-memory store whose releases fail (as an unavailable store) while `down`.
#[derive(Clone, Default)]
struct Flaky {
    inner: MemoryStore,
    down: Arc<AtomicBool>,
    releases: Arc<AtomicUsize>,
}

impl Store for Flaky {}

impl Backend for Flaky {
    fn check<'a>(
        &'a self,
        algorithm: &'a dyn crate::algorithm::Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<crate::algorithm::Outcome, Error>> {
        self.inner.check(algorithm, key, cost, now_us)
    }

    fn refund<'a>(
        &'a self,
        algorithm: &'a dyn crate::algorithm::Algorithm,
        key: StoreKey<'a>,
        charge: &'a crate::decision::Charge,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.refund(algorithm, key, charge, now_us)
    }

    fn settle<'a>(
        &'a self,
        algorithm: &'a dyn crate::algorithm::Algorithm,
        key: StoreKey<'a>,
        charge: &'a crate::decision::Charge,
        actual: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.settle(algorithm, key, charge, actual, now_us)
    }

    fn settle_now(
        &self,
        _algorithm: &dyn crate::algorithm::Algorithm,
        _key: StoreKey<'_>,
        _charge: &crate::decision::Charge,
        _actual: u32,
        _now_us: Option<u64>,
    ) -> Option<Result<bool, Error>> {
        None
    }

    fn reserve<'a>(
        &'a self,
        algorithm: &'a dyn crate::algorithm::Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        up_to: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<crate::store::Reserved, Error>> {
        self.inner.reserve(algorithm, key, cost, up_to, now_us)
    }

    fn schedule<'a>(
        &'a self,
        algorithm: &'a dyn crate::algorithm::Algorithm,
        key: StoreKey<'a>,
        call: (u32, u64),
        pace: crate::store::Pace,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<crate::store::Scheduled, Error>> {
        self.inner.schedule(algorithm, key, call, pace, now_us)
    }

    fn peek<'a>(
        &'a self,
        algorithm: &'a dyn crate::algorithm::Algorithm,
        key: StoreKey<'a>,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<crate::store::Peeked, Error>> {
        self.inner.peek(algorithm, key, now_us)
    }

    fn reset<'a>(
        &'a self,
        algorithm: &'a dyn crate::algorithm::Algorithm,
        key: StoreKey<'a>,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.reset(algorithm, key, now_us)
    }

    fn ban<'a>(
        &'a self,
        key: StoreKey<'a>,
        duration_us: u64,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.ban(key, duration_us, now_us)
    }

    fn unban<'a>(&'a self, key: StoreKey<'a>) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.unban(key)
    }

    fn count_refusal<'a>(
        &'a self,
        key: StoreKey<'a>,
        terms: &'a crate::store::offences::BanTerms,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<crate::store::offences::Counted, Error>> {
        self.inner.count_refusal(key, terms, now_us)
    }

    fn mark<'a>(
        &'a self,
        namespace: &'a str,
        token: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, Error>> {
        self.inner.mark(namespace, token)
    }

    fn publish_top<'a>(
        &'a self,
        namespace: &'a str,
        instance: &'a str,
        snapshot: &'a [u8],
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.publish_top(namespace, instance, snapshot, ttl)
    }

    fn read_tops<'a>(
        &'a self,
        namespace: &'a str,
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<crate::store::Snapshots, Error>> {
        self.inner.read_tops(namespace, ttl)
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        None
    }

    // The rest as a remote store: every call through its future, on the wall clock.
    fn check_now(
        &self,
        _algorithm: &dyn crate::algorithm::Algorithm,
        _key: StoreKey<'_>,
        _cost: u32,
        _now_us: Option<u64>,
    ) -> Option<Result<crate::algorithm::Outcome, Error>> {
        None
    }

    fn refund_now(
        &self,
        _algorithm: &dyn crate::algorithm::Algorithm,
        _key: StoreKey<'_>,
        _charge: &crate::decision::Charge,
        _now_us: Option<u64>,
    ) -> Option<Result<bool, Error>> {
        None
    }

    fn schedules(&self) -> bool {
        false
    }

    fn regional(&self) -> bool {
        false
    }

    fn check_timeout(&self, _timeout: Duration) -> Result<(), crate::ConfigError> {
        Ok(())
    }

    fn manual_clock(&self) -> bool {
        false
    }

    fn clock(&self) -> Option<crate::store::memory::ManualClock> {
        None
    }
}

impl Slots for Flaky {
    fn release_all<'a>(&'a self, key: StoreKey<'a>) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.release_all(key)
    }

    fn acquire<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        terms: &'a SlotTerms,
    ) -> BoxFuture<'a, Result<Acquired, Error>> {
        self.inner.acquire(key, holder, terms)
    }

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        terms: &'a SlotTerms,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.renew(key, holder, terms)
    }

    fn release<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        late_renewal: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(std::future::ready(Err(Error::Timeout(
                Duration::from_millis(100),
            ))));
        }
        self.inner.release(key, holder, late_renewal)
    }

    /// Through [`release`](Slots::release), which fails while the store is down.
    fn release_now(&self, _key: StoreKey<'_>, _holder: &str) -> Option<Result<(), Error>> {
        None
    }
}

fn limiter(store: Flaky, lease: Duration) -> ConcurrencyLimiter {
    ConcurrencyLimiter::builder(store, 1)
        .permit_ttl(lease)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_failed_release_is_sent_again_at_least_once_a_second_until_it_succeeds() {
    let store = Flaky::default();
    let limiter = limiter(store.clone(), Duration::from_secs(60));
    store.down.store(true, Ordering::SeqCst);
    let permit = limiter.acquire("k").await.unwrap().unwrap();
    assert!(permit.release().await.is_err());
    assert_eq!(limiter.semaphore.releases.len(), 1);
    // Down for 10 s: about one try a second, one call each (not one per kept release).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let tries = store.releases.load(Ordering::SeqCst);
    assert!((10..=16).contains(&tries), "{tries} tries in 10 s");
    assert!(limiter.acquire("k").await.unwrap().is_none(), "still held");
    store.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(limiter.semaphore.releases.len(), 0);
    assert!(limiter.acquire("k").await.unwrap().is_some(), "given back");
    // The worker is gone, and a new failure starts another.
    tokio::task::yield_now().await;
    assert!(!limiter.semaphore.releases.lock().worker);
}

#[tokio::test(start_paused = true)]
async fn a_store_that_stays_down_gets_one_try_a_second_and_releases_end_with_their_lease() {
    let store = Flaky::default();
    let lease = Duration::from_secs(30);
    let limiter = ConcurrencyLimiter::builder(store.clone(), 100)
        .permit_ttl(lease)
        .build()
        .unwrap();
    let permits: Vec<_> =
        futures_util::future::join_all((0..50).map(|i| limiter.acquire(format!("k{i}"))))
            .await
            .into_iter()
            .map(|p| p.unwrap().unwrap())
            .collect();
    store.down.store(true, Ordering::SeqCst);
    drop(permits);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(limiter.semaphore.releases.len(), 50);
    let first_tries = store.releases.load(Ordering::SeqCst);
    assert_eq!(first_tries, 50);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let tries = store.releases.load(Ordering::SeqCst) - first_tries;
    assert!(tries <= 16, "{tries} tries in 10 s for 50 kept releases");
    // Past the lease, nothing is kept, and the permits came back by themselves.
    tokio::time::sleep(lease).await;
    assert_eq!(limiter.semaphore.releases.len(), 0);
    assert!(!limiter.semaphore.releases.lock().worker);
}

#[tokio::test(start_paused = true)]
async fn at_most_max_kept_releases_are_kept() {
    let store = Flaky::default();
    let limiter = ConcurrencyLimiter::builder(store.clone(), 1)
        .permit_ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let semaphore = &limiter.semaphore;
    let error = Error::Timeout(Duration::from_millis(100));
    let until = Instant::now() + Duration::from_secs(60);
    for i in 0..MAX_KEPT + 10 {
        keep(
            semaphore,
            Kept::new(None, format!("h{i}"), false, until),
            &error,
        );
    }
    assert_eq!(semaphore.releases.len(), MAX_KEPT);
    // A release the store refuses as invalid is not kept.
    let invalid = Error::InvalidInput("no");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(semaphore.releases.len(), 0, "sent once the store answers");
    keep(
        semaphore,
        Kept::new(None, "x".into(), false, until),
        &invalid,
    );
    assert_eq!(semaphore.releases.len(), 0);
}
