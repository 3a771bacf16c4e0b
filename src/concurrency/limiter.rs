//! The concurrency limiter's typed handle.

use std::{fmt, sync::Arc, time::Duration};

use super::{permit::Permit, semaphore::Semaphore};
use crate::{
    core::LimiterStats, error::Error, extract::Key, store::BoxFuture, store::FailurePolicy,
};

/// At most N requests of one key in flight at once, across every instance sharing a store: a
/// distributed counting semaphore whose permits are held under a time to live.
///
/// [`acquire`](Self::acquire) takes one of the key's permits if one is free and returns a
/// [`Permit`] that holds it; dropping the permit gives it back. While held, the permit is renewed
/// in the background, so requests may run for as long as they need; an instance that crashes
/// stops renewing, and its permits come back by themselves within one
/// [time to live](crate::concurrency::ConcurrencyLimiterBuilder::permit_ttl). Usable on its own (a job runner allowing two
/// exports per customer at once) and the engine of
/// [`ConcurrencyLimitLayer`](crate::concurrency::ConcurrencyLimitLayer).
///
/// In Redis a key's holders are a sorted set under [`storage_key`](Self::storage_key), with the
/// same hash tag as a [`RateLimiter`](crate::RateLimiter)'s keys for that key when both limits
/// have the same prefix and policy name (the Redis key layout is in `src/store/redis/keys.rs`):
/// on a cluster, both limits of a key then live on one hash slot. Each
/// acquire, renewal and release is one script call; times come from the Redis server's clock.
///
/// Cloning is cheap and shares everything.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_redis_ratelimit::{FailurePolicy, RedisStore, concurrency::ConcurrencyLimiter};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// // At most 2 exports per customer at once, over every worker.
/// let exports = ConcurrencyLimiter::builder(store, 2)
///     .policy_name("exports")
///     .permit_ttl(Duration::from_secs(30))
///     .on_store_error(FailurePolicy::Closed)
///     .build()?;
/// match exports.acquire("customer-42").await? {
///     Some(permit) => {
///         // ... run the export; the permit is given back when `permit` is dropped.
///         permit.release().await?;
///     }
///     None => println!("two exports of this customer are already running"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ConcurrencyLimiter {
    pub(crate) semaphore: Arc<Semaphore>,
}

impl fmt::Debug for ConcurrencyLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &*self.semaphore;
        f.debug_struct("ConcurrencyLimiter")
            .field("namespace", &s.core.namespace)
            .field("max_in_flight", &s.limit())
            .field("permit_ttl", &s.ttl())
            .field("timeout", &s.core.timeout)
            .field("on_store_error", &s.core.failure)
            .finish()
    }
}

impl ConcurrencyLimiter {
    /// Takes one of `key`'s permits if one is free: `Ok(None)` when `max_in_flight` requests of
    /// `key` already hold one.
    ///
    /// When the store fails or does not answer within the store timeout: under
    /// [`FailurePolicy::Local`], a permit of this process's local share (a
    /// [degraded](Permit::is_degraded) permit, or `None`); otherwise the error. An acquire
    /// that timed out, or whose future was dropped, after the store may have admitted it
    /// gives that permit back in the background.
    ///
    /// `key` is text (`&str`, `String`), an IP address, a number or a [`Key`].
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the store does not answer within the store timeout,
    /// [`Error::CircuitOpen`] while the circuit breaker is open, and the store's own error
    /// (unreachable, refused) otherwise.
    pub async fn acquire<'k>(&self, key: impl Into<Key<'k>>) -> Result<Option<Permit>, Error> {
        tokio::task::coop::consume_budget().await;
        let key = Some(key.into().into_owned());
        Arc::clone(&self.semaphore).acquire(key).await
    }

    /// [`acquire`](Self::acquire), for the layer (`None`: the permits keyless requests share).
    pub(crate) fn acquire_owned(
        &self,
        key: Option<Key<'static>>,
    ) -> BoxFuture<'static, Result<Option<Permit>, Error>> {
        Box::pin(Arc::clone(&self.semaphore).acquire(key))
    }

    /// Frees every slot `key` holds in the store, through the circuit breaker and within the
    /// store timeout: new requests of the key are admitted up to the limit again, on every
    /// instance. A request still running keeps its permit, and its next renewal (every third
    /// of the [permit TTL](Self::permit_ttl)) counts it again, even over the limit; a request
    /// that has gone away without releasing (a crashed instance) no longer holds a slot.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the store does not answer within the store timeout,
    /// [`Error::CircuitOpen`] while the circuit breaker is open, and the store's own error
    /// (unreachable, refused) otherwise.
    ///
    /// ```
    /// # use tower_redis_ratelimit::{MemoryStore, concurrency::ConcurrencyLimiter};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = ConcurrencyLimiter::builder(MemoryStore::new(), 1).build()?;
    /// let held = limiter.acquire("report").await?.expect("a slot");
    /// assert!(limiter.acquire("report").await?.is_none());
    /// limiter.reset("report").await?;
    /// assert!(limiter.acquire("report").await?.is_some());
    /// # drop(held);
    /// # Ok(()) }
    /// ```
    pub async fn reset<'k>(&self, key: impl Into<Key<'k>>) -> Result<(), Error> {
        let key = key.into();
        let core = &self.semaphore.core;
        let store_key = self.semaphore.store_key(Some(&key));
        core.call(|| self.semaphore.slots.release_all(store_key))
            .await
    }

    /// The Redis key holding `key`'s permits: its base key (see
    /// [`RateLimiter::storage_key`](crate::RateLimiter::storage_key) for how keys are written)
    /// with the holders' suffix.
    ///
    /// ```
    /// # use tower_redis_ratelimit::{MemoryStore, concurrency::ConcurrencyLimiter};
    /// let limiter = ConcurrencyLimiter::builder(MemoryStore::new(), 4).build().unwrap();
    /// assert_eq!(limiter.storage_key("k-123"), "{rl:concurrency:k-123}:c");
    /// ```
    pub fn storage_key<'k>(&self, key: impl Into<Key<'k>>) -> String {
        let key = key.into();
        self.semaphore.store_key(Some(&key)).redis_holders_key()
    }

    /// Requests of one key allowed in flight at once.
    pub fn max_in_flight(&self) -> u32 {
        self.semaphore.limit()
    }

    /// How long a permit stays held without a renewal.
    pub fn permit_ttl(&self) -> Duration {
        self.semaphore.ttl()
    }

    /// The policy name used in the headers.
    pub fn policy_name(&self) -> &str {
        &self.semaphore.core.policy
    }

    /// The bound on one store call.
    pub fn store_timeout(&self) -> Duration {
        self.semaphore.core.timeout
    }

    /// What an acquire gets when the store fails.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.semaphore.core.failure
    }

    /// Counters: requests admitted and refused, store errors, acquires refused by the
    /// circuit breaker, permits of the local share (`degraded`).
    ///
    /// ```
    /// # use tower_redis_ratelimit::{MemoryStore, concurrency::ConcurrencyLimiter};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = ConcurrencyLimiter::builder(MemoryStore::new(), 1).build()?;
    /// let held = limiter.acquire("k").await?;
    /// assert!(limiter.acquire("k").await?.is_none());
    /// let stats = limiter.stats();
    /// assert_eq!((stats.allowed, stats.denied), (1, 1));
    /// # drop(held); Ok(()) }
    /// ```
    pub fn stats(&self) -> LimiterStats {
        self.semaphore.core.stats()
    }
}
