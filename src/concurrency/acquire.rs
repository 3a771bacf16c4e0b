//! Taking a permit: the store's answer through the core (breaker, timeout), the local share
//! when the store is away, and a release for an answer that never came.

use std::sync::Arc;

use futures_util::FutureExt;

use super::{holder::Holder, permit::Permit, semaphore::Semaphore};
use crate::{
    core::report,
    decision::{Source, Verdict},
    error::{Error, ErrorChain},
    extract::Key,
    store::{Acquired, Slots},
    unique_id,
};

impl Semaphore {
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
            .call(|| self.slots.acquire(store_key, &holder.id, &self.terms))
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
            Ok(a) => Ok(self.conclude(holder, a, Source::Store)),
            Err(e) => {
                let Some(local) = self.local.as_ref().filter(|_| core.decides_locally(&e)) else {
                    core.undecided(false);
                    return Err(e);
                };
                tracing::debug!(error = %ErrorChain(&e), policy = %core.policy, "concurrency limit: deciding locally (degraded)");
                let permit = local.acquire_now(holder.key.clone()).inspect_err(|_| {
                    core.undecided(false);
                })?;
                let verdict = match permit.is_some() {
                    true => Verdict::Allowed,
                    false => Verdict::Denied,
                };
                core.decided(verdict, Source::Local, None);
                report::acquired(&core.policy, verdict, Source::Local);
                Ok(permit)
            }
        }
    }

    /// A permit of an in-memory semaphore (the local share), decided at once.
    fn acquire_now(self: &Arc<Self>, key: Option<Key<'static>>) -> Result<Option<Permit>, Error> {
        let holder = Arc::new(Holder::new(Arc::clone(self), key, unique_id::next()));
        let call = self
            .slots
            .acquire(self.store_key(holder.key.as_ref()), &holder.id, &self.terms);
        match call.now_or_never() {
            Some(Ok(a)) => Ok(self.conclude(holder, a, Source::Local)),
            Some(Err(e)) => Err(e),
            None => Err(Error::Unsupported(
                "a local share whose store does not answer at once",
            )),
        }
    }

    /// The store's answer (`source`: the store, or the local share): a permit, or none;
    /// counted and reported.
    fn conclude(&self, holder: Arc<Holder>, a: Acquired, source: Source) -> Option<Permit> {
        let core = &self.core;
        if core.reports {
            let verdict = match a.admitted {
                true => Verdict::Allowed,
                false => Verdict::Denied,
            };
            core.decided(verdict, source, None);
            report::acquired(&core.policy, verdict, source);
        }
        let degraded = source == Source::Local;
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
