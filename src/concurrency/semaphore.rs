//! The engine behind a [`ConcurrencyLimiter`](super::ConcurrencyLimiter): a distributed
//! counting semaphore per key, its settings and the release of a permit.

use std::sync::Arc;

use super::kept::Releases;
use crate::{
    core::Core,
    error::Error,
    extract::Key,
    store::{SlotTerms, Slots, StoreKey},
};

/// A concurrency limit without its handle: what the layer holds.
pub(crate) struct Semaphore {
    pub(crate) core: Core,
    /// The store's concurrency slots (the store `core` calls).
    pub(crate) slots: Arc<dyn Slots>,
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
        self.terms.ttl()
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
        let store = &self.slots;
        if let Some(result) = store.release_now(key, holder) {
            return result;
        }
        let guard = late_renewal.then(|| self.ttl());
        self.core
            .call_always(store.release(key, holder, guard))
            .await
    }
}
