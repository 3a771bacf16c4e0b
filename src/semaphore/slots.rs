//! The settings behind a [`ConcurrencyLimiter`](super::ConcurrencyLimiter), and its call to
//! the store through the circuit breaker and within the store timeout.

use std::{sync::Arc, time::Duration};

use super::releases::Releases;
use crate::{
    limiter::BreakerState,
    store::{within, Acquired, Backend, Claim, SlotTerms, StoreKey},
    Error, FailurePolicy, Key, Store,
};

/// A concurrency limiter without its handle: what the layer holds.
pub(crate) struct Slots {
    pub(crate) store: Arc<dyn Store>,
    /// `prefix:policy`: a key's holders are under `{namespace:key}:c`.
    pub(crate) namespace: String,
    pub(crate) policy: Arc<str>,
    /// The limit, the lease, the pause after a loss, and the store epochs seen.
    pub(crate) terms: SlotTerms,
    pub(crate) timeout: Duration,
    pub(crate) max_key_len: usize,
    pub(crate) breaker: BreakerState,
    pub(crate) failure: FailurePolicy,
    /// Under [`FailurePolicy::Local`]: a semaphore in this process at the local share.
    pub(crate) local: Option<Arc<Slots>>,
    /// Releases that failed, sent again until they succeed or their lease has ended.
    pub(crate) releases: Releases,
    /// This limiter's hold on its namespace in the store (released when dropped).
    pub(crate) _claim: Option<Arc<Claim>>,
}

impl Slots {
    /// The store key of `key` (`None`: the slots keyless requests share).
    pub(crate) fn store_key<'a>(&'a self, key: Option<&'a Key<'a>>) -> StoreKey<'a> {
        StoreKey::bounded(&self.namespace, key, self.max_key_len)
    }

    /// Requests of one key allowed in flight at once.
    pub(crate) fn limit(&self) -> u32 {
        self.terms.limit()
    }

    /// How long a slot is held without a renewal.
    pub(crate) fn lease(&self) -> Duration {
        self.terms.lease()
    }

    /// The store's answer, through the circuit breaker and within the store timeout.
    pub(crate) async fn ask_store(
        &self,
        key: Option<&Key<'_>>,
        holder: &str,
    ) -> Result<Acquired, Error> {
        let Some(permit) = self.breaker.permit() else {
            return Err(Error::CircuitOpen);
        };
        let key = self.store_key(key);
        let call = self.store.acquire(key, holder, &self.terms);
        let result = within(self.timeout, call).await;
        permit.finish(!matches!(&result, Err(e) if e.is_unavailable()));
        if let Err(e) = &result {
            tracing::warn!(error = %crate::error::Chain(&e), policy = %self.policy, "concurrency limit: store failed");
        }
        result
    }

    /// Gives `holder`'s slot of `key` back, within the store timeout (at once in memory).
    /// `late_renewal`: a renewal of it may still reach the store (see [`Backend::release`]).
    pub(crate) async fn release(
        &self,
        key: Option<&Key<'_>>,
        holder: &str,
        late_renewal: bool,
    ) -> Result<(), Error> {
        let key = self.store_key(key);
        if let Some(result) = self.store.release_now(key, holder) {
            return result;
        }
        let guard = late_renewal.then(|| self.lease());
        within(self.timeout, self.store.release(key, holder, guard)).await
    }
}
