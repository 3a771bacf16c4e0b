//! Where the counters live.
//!
//! - [`RedisStore`]: one Redis shared by every instance of the app; each check is one atomic
//!   script call. Use it whenever more than one process serves the same clients.
//! - [`MemoryStore`]: in this process only, with the same decisions; for single-instance apps,
//!   development and tests.

mod clock;
mod key;
mod leases;
mod map_key;
mod memory;
mod namespaces;
mod redis;
mod reserved;
mod sharded;
mod upstream;

pub(crate) use self::{clock::micros, namespaces::Claim};
pub use self::{clock::ManualClock, memory::MemoryStore};
pub(crate) use self::{
    key::KeyBuf,
    sharded::{Expiring, Sharded},
};
pub use self::{
    key::StoreKey,
    leases::{Acquired, Leases, SlotTerms},
    namespaces::Namespaces,
    redis::{Batching, RedisStore, RedisStoreBuilder, DEFAULT_CONNECT_TIMEOUT},
    reserved::Reserved,
    upstream::{Blind, Gate, Learned, Upstreams},
};

use std::{future::Future, pin::Pin, sync::Arc};

use crate::{Algorithm, Charge, Error, Outcome};

/// A boxed, sendable future, as returned by [`Store::check`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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

/// Something that can decide a check atomically.
///
/// `key` is the limiter's namespace and the request's key (see [`StoreKey`]); the store runs
/// `algorithm`'s [rule](Algorithm::rule) on that key's state. `now_us` is an explicit time
/// for tests; `None` means the store's own clock.
pub trait Store: Send + Sync + 'static {
    /// Decides one check.
    fn check<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Outcome, Error>>;

    /// Decides one check at once, without a future, when this store can (an in-memory store);
    /// `None` (the default) when the check must go through [`check`](Self::check).
    ///
    /// The limiter tries this first on every check, so a store that implements it must answer
    /// quickly: the store timeout and the circuit breaker do not apply to it.
    fn check_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        cost: u32,
        now_us: Option<u64>,
    ) -> Option<Result<Outcome, Error>> {
        let _ = (algorithm, key, cost, now_us);
        None
    }

    /// Gives back what an allowed check took (`charge`, from its
    /// [`Decision`](crate::Decision)) on `key` and still holds, atomically: the algorithm's
    /// refund (see [`Algorithm::refund`]). `Ok(true)` when units were given back, `Ok(false)`
    /// when there was nothing left to give (the state expired, or the charge drained).
    ///
    /// The default returns [`Error::Unsupported`].
    fn refund<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        charge: &'a Charge,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let _ = (algorithm, key, charge, now_us);
        Box::pin(std::future::ready(Err(Error::Unsupported(
            "this store cannot give units back",
        ))))
    }

    /// Like [`refund`](Self::refund), at once, when this store can (see
    /// [`check_now`](Self::check_now)); `None` (the default) otherwise.
    fn refund_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        charge: &Charge,
        now_us: Option<u64>,
    ) -> Option<Result<bool, Error>> {
        let _ = (algorithm, key, charge, now_us);
        None
    }

    /// Takes up to `up_to` units of `key` at once, as many as it has available, but at least
    /// `cost` (else a denial of `cost`, exactly as [`check`](Self::check) would deny it): a
    /// unit lease's reservation (see [`UnitLease`](crate::UnitLease)). The algorithms that
    /// can be leased are [`Gcra`](crate::Gcra) and [`TokenBucket`](crate::TokenBucket).
    ///
    /// The default returns [`Error::Unsupported`]; a leasing limiter then checks each request
    /// with [`check`](Self::check), as without a lease.
    fn reserve<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        up_to: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Reserved, Error>> {
        let _ = (algorithm, key, cost, up_to, now_us);
        Box::pin(std::future::ready(Err(Error::Unsupported(
            "this store cannot reserve units",
        ))))
    }

    /// The namespaces of the limiters built on this store, so that two limiters with the same
    /// namespace and different quotas are a [`ConfigError`](crate::ConfigError) (see
    /// [`Namespaces`]). `None` (the default): not checked.
    fn namespaces(&self) -> Option<&Namespaces> {
        None
    }

    /// True when this store's time is not the wall clock (a [`MemoryStore`] on a
    /// [`ManualClock`]): limiters built on it keep no deny cache, whose deadlines are in real
    /// time. Default false.
    fn manual_clock(&self) -> bool {
        false
    }
}

/// A shared store is a store: lets one `Arc<dyn Store>` serve several limiters, or a store be
/// chosen at run time.
impl<S: Store + ?Sized> Store for Arc<S> {
    fn check<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Outcome, Error>> {
        (**self).check(algorithm, key, cost, now_us)
    }

    fn check_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        cost: u32,
        now_us: Option<u64>,
    ) -> Option<Result<Outcome, Error>> {
        (**self).check_now(algorithm, key, cost, now_us)
    }

    fn refund<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        charge: &'a Charge,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).refund(algorithm, key, charge, now_us)
    }

    fn refund_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        charge: &Charge,
        now_us: Option<u64>,
    ) -> Option<Result<bool, Error>> {
        (**self).refund_now(algorithm, key, charge, now_us)
    }

    fn reserve<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        up_to: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Reserved, Error>> {
        (**self).reserve(algorithm, key, cost, up_to, now_us)
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        (**self).namespaces()
    }

    fn manual_clock(&self) -> bool {
        (**self).manual_clock()
    }
}
