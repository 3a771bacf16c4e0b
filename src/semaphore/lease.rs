//! One holder's lease on one slot: renewed in the background while held, released when given
//! up (and the release sent again until it succeeds, see [`releases`](super::releases)).

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, Mutex,
};

use tokio::{runtime::Handle, time::Instant};

use super::{
    releases::{self, Kept},
    slots::Slots,
};
use crate::{store::within, Error, Key};

/// A holder of (maybe) one slot: what a [`Permit`](super::Permit), its renewal task and its
/// release share.
pub(crate) struct Lease {
    pub(crate) slots: Arc<Slots>,
    pub(crate) key: Option<Key<'static>>,
    pub(crate) holder: String,
    /// Set when a renewal found the slot gone (and put it back).
    pub(crate) lost: AtomicBool,
    /// Set when the holder is given up: from then on no renewal is sent.
    given_up: AtomicBool,
    /// Set while a renewal may be on its way, from just before it is sent until its answer.
    renewing: AtomicBool,
    /// Set for good when a renewal got no answer: it may still reach the store, even after
    /// the release.
    unanswered: AtomicBool,
    /// When the store last extended the lease, or may have: the lease ends by itself at most
    /// one lease (and one store timeout) after.
    extended_at: Mutex<Instant>,
}

impl Lease {
    pub(crate) fn new(slots: Arc<Slots>, key: Option<Key<'static>>, holder: String) -> Self {
        Self {
            slots,
            key,
            holder,
            lost: AtomicBool::new(false),
            given_up: AtomicBool::new(false),
            renewing: AtomicBool::new(false),
            unanswered: AtomicBool::new(false),
            extended_at: Mutex::new(Instant::now()),
        }
    }

    /// Records that the store extended the lease, or may have, just now.
    pub(crate) fn extended(&self) {
        *self.extended_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// Stops renewals for good; true when a renewal may still reach the store after this
    /// (one is on its way, or one got no answer), so that the release must keep it from
    /// putting the holder back.
    fn give_up(&self) -> bool {
        // Paired with `keep_renewed`: a renewal either sees `given_up` and is not sent, or has
        // set `renewing` before, which this sees.
        self.given_up.store(true, Ordering::SeqCst);
        self.renewing.load(Ordering::SeqCst) || self.unanswered.load(Ordering::SeqCst)
    }

    /// Gives the slot back and waits for the store (within the store timeout). On a failure,
    /// the release is also kept and sent again in the background.
    pub(crate) async fn release(self: &Arc<Self>) -> Result<(), Error> {
        let late_renewal = self.give_up();
        let result = self
            .slots
            .release(self.key.as_ref(), &self.holder, late_renewal)
            .await;
        if let Err(e) = &result {
            self.keep_trying(late_renewal, e);
        }
        result
    }

    /// Gives the slot back without waiting: at once when the store can (in memory), else on
    /// the current Tokio runtime, else on `runtime`; a release that fails is sent again until
    /// it succeeds or the lease has ended. Without a runtime, the slot comes back when its
    /// lease ends. Never panics.
    pub(crate) fn release_in_background(self: Arc<Self>, runtime: Option<&Handle>) {
        let late_renewal = self.give_up();
        let slots = &self.slots;
        let key = slots.store_key(self.key.as_ref());
        if let Some(result) = slots.store.release_now(key, &self.holder) {
            if let Err(e) = result {
                tracing::warn!(error = %crate::error::Chain(&e), "concurrency limit: release failed; the slot comes back when its lease ends");
            }
            return;
        }
        let Some(runtime) = Handle::try_current().ok().or_else(|| runtime.cloned()) else {
            tracing::debug!("concurrency limit: no Tokio runtime to release on; the slot comes back when its lease ends");
            return;
        };
        // A runtime that is shutting down drops the task: the lease then ends by itself.
        runtime.spawn(async move {
            let result = self
                .slots
                .release(self.key.as_ref(), &self.holder, late_renewal)
                .await;
            if let Err(e) = result {
                self.keep_trying(late_renewal, &e);
            }
        });
    }

    /// Keeps this release, which failed with `error`, to send it again until the lease would
    /// have ended by itself.
    fn keep_trying(&self, late_renewal: bool, error: &Error) {
        tracing::warn!(error = %crate::error::Chain(&error), policy = %self.slots.policy, "concurrency limit: release failed; sending it again until it succeeds or its lease ends");
        let extended_at = *self.extended_at.lock().unwrap_or_else(|e| e.into_inner());
        let until = extended_at + self.slots.lease() + self.slots.timeout;
        let kept = Kept::new(self.key.clone(), self.holder.clone(), late_renewal, until);
        releases::keep(&self.slots, kept, error);
    }

    /// Renews the lease every third of its length until the holder is given up. A renewal
    /// that finds the slot gone puts it back (and marks the lease lost); a failed one (store
    /// away, timeout) is logged and tried again at the next tick: two can fail before the
    /// lease ends.
    pub(crate) async fn keep_renewed(self: Arc<Self>) {
        let slots = &self.slots;
        let every = slots.lease() / 3;
        loop {
            tokio::time::sleep(every).await;
            // Paired with `give_up`.
            self.renewing.store(true, Ordering::SeqCst);
            if self.given_up.load(Ordering::SeqCst) {
                return;
            }
            let key = slots.store_key(self.key.as_ref());
            let call = slots.store.renew(key, &self.holder, &slots.terms);
            let result = within(slots.timeout, call).await;
            self.extended();
            match result {
                Ok(held) => {
                    self.renewing.store(false, Ordering::SeqCst);
                    if !held && !self.lost.swap(true, Ordering::AcqRel) {
                        tracing::warn!(
                            policy = %slots.policy,
                            lease = ?slots.lease(),
                            "concurrency limit: a request's slot was gone (it outlived its lease unrenewed, or the store lost its state); it is counted again, and new requests wait until the key is under its limit"
                        );
                    }
                }
                Err(e) => {
                    self.unanswered.store(true, Ordering::SeqCst);
                    self.renewing.store(false, Ordering::SeqCst);
                    renewal_failed(&self, &e);
                }
            }
        }
    }
}

fn renewal_failed(lease: &Lease, e: &Error) {
    tracing::warn!(error = %crate::error::Chain(&e), policy = %lease.slots.policy, "concurrency limit: renewing a lease failed; trying again in a third of the lease");
}
