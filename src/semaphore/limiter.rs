//! The concurrency limiter's typed handle.

use std::{fmt, sync::Arc, time::Duration};

use super::{acquire::acquire, permit::Permit, slots::Slots};
use crate::{store::BoxFuture, Error, FailurePolicy, Key};

/// At most N requests of one key in flight at once, across every instance sharing a store: a
/// distributed counting semaphore whose slots are held under leases.
///
/// [`acquire`](Self::acquire) takes one of the key's slots if one is free and returns a
/// [`Permit`] that holds it; dropping the permit gives it back. While held, the lease is renewed
/// in the background, so requests may run for as long as they need; an instance that crashes
/// stops renewing, and its slots come back by themselves within one
/// [lease](crate::ConcurrencyLimiterBuilder::lease). Usable on its own (a job runner allowing two
/// exports per customer at once) and the engine of
/// [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer).
///
/// In Redis a key's holders are a sorted set under `{prefix:policy:key}:c`, the same hash tag
/// as a [`RateLimiter`](crate::RateLimiter)'s keys for that key: on a cluster, both limits of a
/// key live on one slot. Each acquire, renewal and release is one script call; times come from
/// the Redis server's clock.
///
/// Cloning is cheap and shares everything.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_redis_ratelimit::{ConcurrencyLimiter, FailurePolicy, RedisStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// // At most 2 exports per customer at once, over every worker.
/// let exports = ConcurrencyLimiter::builder(store, 2)
///     .policy_name("exports")
///     .lease(Duration::from_secs(30))
///     .on_store_error(FailurePolicy::Closed)
///     .build()?;
/// match exports.acquire("customer-42").await? {
///     Some(permit) => {
///         // ... run the export; the slot is given back when `permit` is dropped.
///         permit.release().await?;
///     }
///     None => println!("two exports of this customer are already running"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ConcurrencyLimiter {
    pub(crate) slots: Arc<Slots>,
}

impl fmt::Debug for ConcurrencyLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &*self.slots;
        f.debug_struct("ConcurrencyLimiter")
            .field("namespace", &s.namespace)
            .field("max_in_flight", &s.limit())
            .field("lease", &s.lease())
            .field("timeout", &s.timeout)
            .field("on_store_error", &s.failure)
            .finish()
    }
}

impl ConcurrencyLimiter {
    /// Takes one of `key`'s slots if one is free: `Ok(None)` when `max_in_flight` requests of
    /// `key` already hold one.
    ///
    /// When the store fails or does not answer within the store timeout: under
    /// [`FailurePolicy::Local`], a slot of this process's local share (a
    /// [degraded](Permit::is_degraded) permit, or `None`); otherwise the error. An acquire
    /// that timed out, or whose future was dropped, after the store may have admitted it
    /// gives that slot back in the background.
    ///
    /// `key` is text (`&str`, `String`), an IP address, a number or a [`Key`].
    pub async fn acquire<'k>(&self, key: impl Into<Key<'k>>) -> Result<Option<Permit>, Error> {
        tokio::task::coop::consume_budget().await;
        acquire(Arc::clone(&self.slots), Some(key.into().into_owned())).await
    }

    /// [`acquire`](Self::acquire), for the layer (`None`: the slots keyless requests share).
    pub(crate) fn acquire_owned(
        &self,
        key: Option<Key<'static>>,
    ) -> BoxFuture<'static, Result<Option<Permit>, Error>> {
        Box::pin(acquire(Arc::clone(&self.slots), key))
    }

    /// The Redis key holding `key`'s slots: `{prefix:policy:key}:c` (see
    /// [`RateLimiter::storage_key`](crate::RateLimiter::storage_key) for how keys are written).
    ///
    /// ```
    /// # use tower_redis_ratelimit::{ConcurrencyLimiter, MemoryStore};
    /// let limiter = ConcurrencyLimiter::builder(MemoryStore::new(), 4).build().unwrap();
    /// assert_eq!(limiter.storage_key("k-123"), "{rl:concurrency:k-123}:c");
    /// ```
    pub fn storage_key<'k>(&self, key: impl Into<Key<'k>>) -> String {
        let key = key.into();
        self.slots.store_key(Some(&key)).redis_holders_key()
    }

    /// Requests of one key allowed in flight at once.
    pub fn max_in_flight(&self) -> u32 {
        self.slots.limit()
    }

    /// How long a slot is held without a renewal.
    pub fn lease(&self) -> Duration {
        self.slots.lease()
    }

    /// The policy name used in the headers.
    pub fn policy_name(&self) -> &str {
        &self.slots.policy
    }

    /// The bound on one store call.
    pub fn store_timeout(&self) -> Duration {
        self.slots.timeout
    }

    /// What an acquire gets when the store fails.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.slots.failure
    }
}
