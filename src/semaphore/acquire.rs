//! Taking a slot: the store's answer, a release for an answer that never came, and the local
//! share when the store is away.

use std::sync::Arc;

use futures_util::FutureExt;

use super::{lease::Lease, permit::Permit, slots::Slots};
use crate::{unique_id, Error, Key};

/// Releases a slot that may have been taken by an acquire whose answer never came: its
/// future was dropped while the call was on its way, or the call failed (timed out, lost
/// its connection) after the script may have run.
struct Pending(Option<Arc<Lease>>);

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(lease) = self.0.take() {
            lease.release_in_background(None);
        }
    }
}

/// A slot for `key` if one is free: `Ok(None)` when all are held. When the store is
/// unavailable: under [`FailurePolicy::Local`](crate::FailurePolicy::Local) a slot of the
/// local share (a degraded permit), otherwise the error.
pub(crate) async fn acquire(
    slots: Arc<Slots>,
    key: Option<Key<'static>>,
) -> Result<Option<Permit>, Error> {
    let lease = Arc::new(Lease::new(Arc::clone(&slots), key, unique_id::next()));
    let mut pending = Pending(Some(Arc::clone(&lease)));
    let result = slots.ask_store(lease.key.as_ref(), &lease.holder).await;
    // Any error may come after the script ran (a timeout, a connection cut before the
    // reply, a reply that did not parse): give back what may have been taken. Releasing a
    // holder that was never added does nothing.
    if result.is_ok() {
        pending.0 = None;
        lease.extended();
    }
    drop(pending);
    match result {
        Ok(a) if a.admitted => Ok(Some(Permit::new(lease, a.holders, false))),
        Ok(_) => Ok(None),
        Err(e) => {
            let Some(local) = slots.local.as_ref().filter(|_| e.is_unavailable()) else {
                return Err(e);
            };
            tracing::debug!(error = %crate::error::Chain(&e), policy = %slots.policy, "concurrency limit: deciding locally (degraded)");
            acquire_local(local, lease.key.clone())
        }
    }
}

/// A slot of an in-memory semaphore (the local share), decided at once.
fn acquire_local(local: &Arc<Slots>, key: Option<Key<'static>>) -> Result<Option<Permit>, Error> {
    let lease = Arc::new(Lease::new(Arc::clone(local), key, unique_id::next()));
    let call = local.store.acquire(
        local.store_key(lease.key.as_ref()),
        &lease.holder,
        &local.terms,
    );
    match call.now_or_never() {
        Some(Ok(a)) if a.admitted => Ok(Some(Permit::new(lease, a.holders, true))),
        Some(Ok(_)) => Ok(None),
        Some(Err(e)) => Err(e),
        None => Err(Error::Unsupported(
            "a local share whose store does not answer at once",
        )),
    }
}
