//! One holder of a permit: renewed in the background while held, released when given up
//! (and the release sent again until it succeeds, see [`releases`](super::releases)).

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, Mutex,
};

use tokio::{runtime::Handle, time::Instant};

use super::{kept::Kept, releases, semaphore::Semaphore};
use crate::{
    error::{Error, ErrorChain},
    extract::Key,
};

/// A holder of (maybe) one permit: what a [`Permit`](super::Permit), its renewal task and
/// its release share.
pub(crate) struct Holder {
    pub(crate) semaphore: Arc<Semaphore>,
    pub(crate) key: Option<Key<'static>>,
    /// Unique across instances: the holder's member in the store.
    pub(crate) id: String,
    /// Set when a renewal found the permit gone (and put it back).
    pub(crate) lost: AtomicBool,
    /// Set when the holder is given up: from then on no renewal is sent.
    given_up: AtomicBool,
    /// Set while a renewal may be on its way, from just before it is sent until its answer.
    renewing: AtomicBool,
    /// Set for good when a renewal got no answer: it may still reach the store, even after
    /// the release.
    unanswered: AtomicBool,
    /// When the store last extended the permit, or may have: it expires by itself at most
    /// one time to live (and one store timeout) after.
    extended_at: Mutex<Instant>,
}

impl Holder {
    pub(crate) fn new(semaphore: Arc<Semaphore>, key: Option<Key<'static>>, id: String) -> Self {
        Self {
            semaphore,
            key,
            id,
            lost: AtomicBool::new(false),
            given_up: AtomicBool::new(false),
            renewing: AtomicBool::new(false),
            unanswered: AtomicBool::new(false),
            extended_at: Mutex::new(Instant::now()),
        }
    }

    /// Records that the store extended the permit, or may have, just now.
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

    /// Gives the permit back and waits for the store (within the store timeout). On a failure,
    /// the release is also kept and sent again in the background.
    pub(crate) async fn release(self: &Arc<Self>) -> Result<(), Error> {
        let late_renewal = self.give_up();
        let result = self
            .semaphore
            .release(self.key.as_ref(), &self.id, late_renewal)
            .await;
        if let Err(e) = &result {
            self.keep_trying(late_renewal, e);
        }
        result
    }

    /// Gives the permit back without waiting: at once when the store can (in memory), else on
    /// the current Tokio runtime, else on `runtime`; a release that fails is sent again until
    /// it succeeds or the permit has expired. Without a runtime, the permit comes back when its
    /// time to live ends. Never panics.
    pub(crate) fn release_in_background(self: Arc<Self>, runtime: Option<&Handle>) {
        let late_renewal = self.give_up();
        let semaphore = &self.semaphore;
        let key = semaphore.store_key(self.key.as_ref());
        if let Some(result) = semaphore.slots.release_now(key, &self.id) {
            if let Err(e) = result {
                tracing::warn!(error = %ErrorChain(&e), "concurrency limit: release failed; the permit comes back when it expires");
            }
            return;
        }
        let Some(runtime) = Handle::try_current().ok().or_else(|| runtime.cloned()) else {
            tracing::debug!("concurrency limit: no Tokio runtime to release on; the permit comes back when it expires");
            return;
        };
        // A runtime that is shutting down drops the task: the permit then expires by itself.
        runtime.spawn(async move {
            let result = self
                .semaphore
                .release(self.key.as_ref(), &self.id, late_renewal)
                .await;
            if let Err(e) = result {
                self.keep_trying(late_renewal, &e);
            }
        });
    }

    /// Keeps this release, which failed with `error`, to send it again until the lease would
    /// have ended by itself.
    fn keep_trying(&self, late_renewal: bool, error: &Error) {
        let semaphore = &self.semaphore;
        tracing::warn!(error = %ErrorChain(error), policy = %semaphore.core.policy, "concurrency limit: release failed; sending it again until it succeeds or its permit expires");
        let extended_at = *self.extended_at.lock().unwrap_or_else(|e| e.into_inner());
        let until = extended_at + semaphore.ttl() + semaphore.core.timeout;
        let kept = Kept::new(self.key.clone(), self.id.clone(), late_renewal, until);
        releases::keep(semaphore, kept, error);
    }

    /// Renews the permit every third of its time to live until the holder is given up. A
    /// renewal that finds the permit gone puts it back (and marks it lost); a failed one (store
    /// away, timeout) is logged and tried again at the next tick: two can fail before the
    /// permit expires.
    pub(crate) async fn keep_renewed(self: Arc<Self>) {
        let semaphore = &self.semaphore;
        let core = &semaphore.core;
        let every = semaphore.ttl() / 3;
        loop {
            tokio::time::sleep(every).await;
            // Paired with `give_up`.
            self.renewing.store(true, Ordering::SeqCst);
            if self.given_up.load(Ordering::SeqCst) {
                return;
            }
            let key = semaphore.store_key(self.key.as_ref());
            let call = semaphore.slots.renew(key, &self.id, &semaphore.terms);
            let result = core.call_always(call).await;
            self.extended();
            match result {
                Ok(held) => {
                    self.renewing.store(false, Ordering::SeqCst);
                    if !held && !self.lost.swap(true, Ordering::AcqRel) {
                        tracing::warn!(
                            policy = %core.policy,
                            permit_ttl = ?semaphore.ttl(),
                            "concurrency limit: a request's permit was gone (it outlived its time to live unrenewed, or the store lost its state); it is counted again, and new requests wait until the key is under its limit"
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

fn renewal_failed(holder: &Holder, e: &Error) {
    tracing::warn!(error = %ErrorChain(&e), policy = %holder.semaphore.core.policy, "concurrency limit: renewing a permit failed; trying again in a third of its time to live");
}
