//! What a store offers a [`ConcurrencyLimiter`](crate::ConcurrencyLimiter): per-key slots held
//! under leases that expire.

use std::{sync::Arc, time::Duration};

use super::{BoxFuture, Store, StoreKey};
use crate::Error;

/// A store that keeps, per key, a set of holders with lease deadlines: a counting semaphore
/// whose slots come back by themselves when a holder stops renewing (its process crashed).
///
/// Deadlines are on the store's clock (Redis `TIME`, a [`MemoryStore`](crate::MemoryStore)'s
/// clock), so the app servers' clocks do not matter. A lease whose deadline has passed is gone:
/// it no longer counts against the limit, and it can no longer be renewed.
///
/// [`RedisStore`](crate::RedisStore) and [`MemoryStore`](crate::MemoryStore) implement it. It
/// builds on [`Store`] for the store's [`Namespaces`](crate::Namespaces), so that a
/// concurrency policy and a rate policy of the same name are kept apart.
pub trait Leases: Store {
    /// Admits `holder` (an id unique across instances) under `key` if fewer than `limit`
    /// unexpired holders hold it, with a lease of `lease`; first drops expired holders.
    fn acquire<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        limit: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Acquired, Error>>;

    /// Moves `holder`'s deadline to `lease` from now; `false` when it holds no slot any more
    /// (its lease expired, or it was released, or the store lost its state).
    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Gives `holder`'s slot back; releasing a slot not held does nothing.
    fn release<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Gives the slot back at once, without a future, when this store can (an in-memory
    /// store); `None` (the default) when it must go through [`release`](Self::release). A
    /// dropped [`Permit`](crate::Permit) tries this first, so that its slot is free before the
    /// drop returns; otherwise it spawns the release on the Tokio runtime.
    fn release_now(&self, key: StoreKey<'_>, holder: &str) -> Option<Result<(), Error>> {
        let _ = (key, holder);
        None
    }
}

/// A store's answer to [`Leases::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Acquired {
    /// Whether the holder got a slot.
    pub admitted: bool,
    /// Unexpired holders of the key after the call (including the new one when admitted).
    pub holders: u64,
}

impl Acquired {
    /// An answer, for custom stores.
    pub const fn new(admitted: bool, holders: u64) -> Self {
        Self { admitted, holders }
    }
}

/// A shared store keeps leases too.
impl<S: Leases + ?Sized> Leases for Arc<S> {
    fn acquire<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        limit: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Acquired, Error>> {
        (**self).acquire(key, holder, limit, lease)
    }

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).renew(key, holder, lease)
    }

    fn release<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        (**self).release(key, holder)
    }

    fn release_now(&self, key: StoreKey<'_>, holder: &str) -> Option<Result<(), Error>> {
        (**self).release_now(key, holder)
    }
}
