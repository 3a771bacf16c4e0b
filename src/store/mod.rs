//! Where the counters live.
//!
//! - [`RedisStore`](crate::RedisStore): one Redis shared by every instance of the app; each check is one atomic
//!   script call. Use it whenever more than one process serves the same clients.
//! - [`MemoryStore`]: in this process only, with the same decisions; for single-instance apps,
//!   development and tests.

mod backend;
pub(crate) mod clock;
mod failure;
mod key;
mod leases;
mod map_key;
pub mod memory;
mod namespaces;
pub(crate) mod offences;
pub mod redis;
mod reserved;
mod sharded;
pub(crate) mod upstream;

pub use self::failure::{CircuitBreaker, FailurePolicy};
pub(crate) use self::{
    backend::{unsupported, Backend, BoxFuture, Peeked, Slots, Snapshots, Upstreams},
    clock::micros,
    key::{compact_prefix, namespace_id, KeyBuf, StoreKey},
    leases::{Acquired, SlotTerms},
    namespaces::{Claim, Namespaces},
    reserved::{Pace, Reserved, Scheduled},
    sharded::{Beside, Expiring, Shard, Sharded, Slot},
    upstream::{Gate, Ledger, Sent},
};
pub(crate) use self::{memory::MemoryStore, upstream::Learned};
pub use crate::error::ErrorScope;

use crate::error::Error;

/// A store call bounded by `timeout` ([`Error::Timeout`] past it). A store that answers at
/// once (in memory) needs no timer: the call is polled once before one is armed.
pub(crate) async fn within<T>(
    timeout: std::time::Duration,
    mut call: BoxFuture<'_, Result<T, Error>>,
) -> Result<T, Error> {
    use std::task::Poll;
    let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
    match first {
        Poll::Ready(result) => result,
        Poll::Pending => tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(Error::Timeout(timeout))),
    }
}

/// Where a limiter keeps its counters: a [`RedisStore`](crate::RedisStore) shared by every
/// instance of the app, or a [`MemoryStore`] in this process. Pass one to a builder as a value
/// (`impl Store`), or shared and chosen at run time as an `Arc<dyn Store>`.
///
/// ```
/// use std::sync::Arc;
/// use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter, store::Store};
///
/// # fn run(redis: Option<tower_redis_ratelimit::RedisStore>) -> Result<(), tower_redis_ratelimit::ConfigError> {
/// let store: Arc<dyn Store> = match redis {
///     Some(redis) => Arc::new(redis),
///     None => Arc::new(MemoryStore::new()),
/// };
/// let api = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_second(10))?)
///     .policy_name("api")
///     .build()?;
/// let login = RateLimiter::builder(store, Gcra::new(Quota::per_minute(5))?)
///     .policy_name("login")
///     .build()?;
/// # Ok(()) }
/// ```
///
/// The trait is sealed: only this crate's stores implement it. What a store does for the
/// limiters (rate checks and refunds, unit leases' reservations, concurrency slots, what
/// upstreams said, each store's clock and the registry of the policies built on it) is
/// crate-private and still changing: the operator and multi-region work will extend it, and
/// each of its answers carries bookkeeping (where a charge lies on a key's time, for a
/// refund) that an outside store could not produce. Opening the trait later, once it
/// settles, is a change that breaks no one.
#[allow(private_bounds)] // The sealed part: its methods are the crate's.
pub trait Store: Backend {}

/// A [`Store`] that keeps concurrency slots, as a
/// [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter) needs: a
/// [`RedisStore`](crate::RedisStore), a [`MemoryStore`], or an `Arc` of either (shared as an
/// `Arc<dyn SlotStore>`).
///
/// ```
/// # fn run(redis: Option<tower_redis_ratelimit::RedisStore>) {
/// use std::sync::Arc;
/// use tower_redis_ratelimit::{concurrency::ConcurrencyLimiter, store::SlotStore, MemoryStore};
///
/// let store: Arc<dyn SlotStore> = match redis {
///     Some(redis) => Arc::new(redis),
///     None => Arc::new(MemoryStore::new()),
/// };
/// let _ = ConcurrencyLimiter::builder(store, 3);
/// # }
/// ```
///
/// A store without them is refused when the limiter is built, by the compiler:
///
/// ```compile_fail
/// # async fn run(regional: tower_redis_ratelimit::store::redis::RegionalStore) {
/// // Concurrency limits do not work across regions.
/// let _ = tower_redis_ratelimit::concurrency::ConcurrencyLimiter::builder(regional, 3);
/// # }
/// ```
///
/// Sealed, like [`Store`].
#[allow(private_bounds)]
pub trait SlotStore: Store + Slots {}

impl<S: Store + Slots + ?Sized> SlotStore for S {}

/// A [`Store`] that keeps what upstreams said, as an adaptive
/// [`ThrottleLayer`](crate::throttle::ThrottleLayer) needs: a
/// [`RedisStore`](crate::RedisStore), a [`MemoryStore`], or an `Arc` of either (shared as an
/// `Arc<dyn UpstreamStore>`). Sealed, like [`Store`].
#[allow(private_bounds)]
pub trait UpstreamStore: Store + Upstreams {}

impl<S: Store + Upstreams + ?Sized> UpstreamStore for S {}
