//! The engine behind a [`ConcurrencyLimiter`](super::ConcurrencyLimiter): a distributed
//! counting semaphore per key. An acquire goes to the store through the core (breaker,
//! timeout), falls back to the local share when the store is unavailable, and gives back a
//! permit whose answer never came.

use std::sync::Arc;

use futures_util::FutureExt;

use super::{holder::Holder, permit::Permit, releases::Releases};
use crate::{
    core::Core,
    error::Chain,
    error::Error,
    extract::Key,
    store::{Acquired, Backend, SlotTerms, StoreKey},
    telemetry, unique_id,
};

/// A concurrency limit without its handle: what the layer holds.
pub(crate) struct Semaphore {
    pub(crate) core: Core,
    /// The limit, the permits' time to live, the pause after a loss, and the store epochs
    /// seen.
    pub(crate) terms: SlotTerms,
    /// Under [`FailurePolicy::Local`](crate::FailurePolicy::Local): a semaphore in this
    /// process at the local share.
    pub(crate) local: Option<Arc<Semaphore>>,
    /// Releases that failed, sent again until they succeed or their permit would have
    /// expired.
    pub(crate) releases: Releases,
}

impl Semaphore {
    /// The store key of `key` (`None`: the permits keyless requests share).
    pub(crate) fn store_key<'a>(&'a self, key: Option<&'a Key<'a>>) -> StoreKey<'a> {
        self.core.store_key(key)
    }

    /// Requests of one key allowed in flight at once.
    pub(crate) fn limit(&self) -> u32 {
        self.terms.limit()
    }

    /// How long a permit stays held without a renewal.
    pub(crate) fn ttl(&self) -> std::time::Duration {
        self.terms.lease()
    }

    /// Gives `holder`'s permit of `key` back: at once in memory, else within the store
    /// timeout, whatever the circuit breaker says. `late_renewal`: a renewal of it may still
    /// reach the store (see the store's `release`).
    pub(crate) async fn release(
        &self,
        key: Option<&Key<'_>>,
        holder: &str,
        late_renewal: bool,
    ) -> Result<(), Error> {
        let key = self.store_key(key);
        let store = &self.core.store;
        if let Some(result) = store.release_now(key, holder) {
            return result;
        }
        let guard = late_renewal.then(|| self.ttl());
        self.core
            .call_always(store.release(key, holder, guard))
            .await
    }

    /// A permit for `key` if one is free: `Ok(None)` when all are held. When the store is
    /// unavailable: under [`FailurePolicy::Local`](crate::FailurePolicy::Local) a permit of
    /// the local share (a degraded one), otherwise the error.
    pub(crate) async fn acquire(
        self: Arc<Self>,
        key: Option<Key<'static>>,
    ) -> Result<Option<Permit>, Error> {
        let holder = Arc::new(Holder::new(Arc::clone(&self), key, unique_id::next()));
        let mut pending = Unanswered(Some(Arc::clone(&holder)));
        let core = &self.core;
        let store_key = self.store_key(holder.key.as_ref());
        let result = core
            .call(|| self.core.store.acquire(store_key, &holder.id, &self.terms))
            .await;
        // Any error may come after the script ran (a timeout, a connection cut before the
        // reply, a reply that did not parse): give back what may have been taken. Releasing a
        // holder that was never added does nothing.
        if result.is_ok() {
            pending.0 = None;
            holder.extended();
        }
        drop(pending);
        match result {
            Ok(a) => Ok(self.conclude(holder, a, false)),
            Err(e) => {
                let Some(local) = self.local.as_ref().filter(|_| core.decides_locally(&e)) else {
                    return Err(e);
                };
                tracing::debug!(error = %Chain(&e), policy = %core.policy, "concurrency limit: deciding locally (degraded)");
                let permit = local.acquire_now(holder.key.clone())?;
                let counters = &core.counters;
                counters.degraded.increment();
                match permit.is_some() {
                    true => counters.allowed.increment(),
                    false => counters.denied.increment(),
                }
                Ok(permit)
            }
        }
    }

    /// A permit of an in-memory semaphore (the local share), decided at once.
    fn acquire_now(self: &Arc<Self>, key: Option<Key<'static>>) -> Result<Option<Permit>, Error> {
        let holder = Arc::new(Holder::new(Arc::clone(self), key, unique_id::next()));
        let call =
            self.core
                .store
                .acquire(self.store_key(holder.key.as_ref()), &holder.id, &self.terms);
        match call.now_or_never() {
            Some(Ok(a)) => Ok(self.conclude(holder, a, true)),
            Some(Err(e)) => Err(e),
            None => Err(Error::Unsupported(
                "a local share whose store does not answer at once",
            )),
        }
    }

    /// The store's answer: a permit, or none; counted and reported.
    fn conclude(&self, holder: Arc<Holder>, a: Acquired, degraded: bool) -> Option<Permit> {
        let counters = &self.core.counters;
        if a.admitted {
            counters.allowed.increment();
        } else {
            counters.denied.increment();
        }
        telemetry::acquired(&self.core.policy, a.admitted);
        a.admitted.then(|| Permit::new(holder, a.holders, degraded))
    }
}

/// Releases a permit that may have been taken by an acquire whose answer never came: its
/// future was dropped while the call was on its way, or the call failed (timed out, lost its
/// connection) after the script may have run.
struct Unanswered(Option<Arc<Holder>>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(holder) = self.0.take() {
            holder.release_in_background(None);
        }
    }
}
