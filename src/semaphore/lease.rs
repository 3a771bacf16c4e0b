//! One holder's lease on one slot: renewed in the background while held, released when given
//! up.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use tokio::runtime::Handle;

use super::slots::Slots;
use crate::{store::within, Error, Key};

/// A holder of (maybe) one slot: what a [`Permit`](super::Permit), its renewal task and its
/// release share.
pub(crate) struct Lease {
    pub(crate) slots: Arc<Slots>,
    pub(crate) key: Option<Key<'static>>,
    pub(crate) holder: String,
    /// Set when a renewal found the slot gone.
    pub(crate) lost: AtomicBool,
}

impl Lease {
    pub(crate) fn new(slots: Arc<Slots>, key: Option<Key<'static>>, holder: String) -> Self {
        Self {
            slots,
            key,
            holder,
            lost: AtomicBool::new(false),
        }
    }

    /// Gives the slot back and waits for the store (within the store timeout).
    pub(crate) async fn release(&self) -> Result<(), Error> {
        let slots = &self.slots;
        let key = slots.store_key(self.key.as_ref());
        if let Some(result) = slots.store.release_now(key, &self.holder) {
            return result;
        }
        within(slots.timeout, slots.store.release(key, &self.holder)).await
    }

    /// Gives the slot back without waiting: at once when the store can (in memory), else on
    /// the current Tokio runtime, else on `runtime`. Without either, the slot comes back when
    /// its lease ends. Never panics.
    pub(crate) fn release_in_background(self: Arc<Self>, runtime: Option<&Handle>) {
        let slots = &self.slots;
        let key = slots.store_key(self.key.as_ref());
        if let Some(result) = slots.store.release_now(key, &self.holder) {
            if let Err(e) = result {
                tracing::warn!(error = %e, "concurrency limit: release failed; the slot comes back when its lease ends");
            }
            return;
        }
        let Some(runtime) = Handle::try_current().ok().or_else(|| runtime.cloned()) else {
            tracing::debug!("concurrency limit: no Tokio runtime to release on; the slot comes back when its lease ends");
            return;
        };
        // A runtime that is shutting down drops the task: the lease then ends by itself.
        runtime.spawn(async move {
            if let Err(e) = self.release().await {
                tracing::warn!(error = %e, policy = %self.slots.policy, "concurrency limit: release failed; the slot comes back when its lease ends");
            }
        });
    }

    /// Renews the lease every third of its length until the slot is found gone (then marks it
    /// lost). A failed renewal (store away, timeout) is logged and tried again at the next
    /// tick: two can fail before the lease ends.
    pub(crate) async fn keep_renewed(self: Arc<Self>) {
        let slots = &self.slots;
        let every = slots.lease / 3;
        loop {
            tokio::time::sleep(every).await;
            let key = slots.store_key(self.key.as_ref());
            let call = slots.store.renew(key, &self.holder, slots.lease);
            match within(slots.timeout, call).await {
                Ok(true) => {}
                Ok(false) => {
                    self.lost.store(true, Ordering::Release);
                    tracing::warn!(
                        policy = %slots.policy,
                        lease = ?slots.lease,
                        "concurrency limit: a request's lease was lost (it outlived its lease unrenewed, or the store lost its state); the request goes on, and its slot may be given to another"
                    );
                    return;
                }
                Err(e) => renewal_failed(&self, &e),
            }
        }
    }
}

fn renewal_failed(lease: &Lease, e: &Error) {
    tracing::warn!(error = %e, policy = %lease.slots.policy, "concurrency limit: renewing a lease failed; trying again in a third of the lease");
}
