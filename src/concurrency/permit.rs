//! What an admitted request holds.

use std::{
    fmt,
    sync::{atomic::Ordering, Arc},
};

use tokio::{runtime::Handle, task::AbortHandle};

use super::holder::Holder;
use crate::error::Error;

/// One of a key's `max_in_flight` permits, held until dropped or [released](Self::release).
///
/// While it is held, a background task on the Tokio runtime renews it every third of its time
/// to live, so a request may run for as long as it needs. Dropping it gives the permit back:
/// at once for a [`MemoryStore`](crate::MemoryStore), otherwise with a release spawned on the
/// Tokio runtime (the one current at the drop, else the one it was acquired on). A release
/// that fails (Redis stalled or failing over, a connection cut) is sent again, at least once a
/// second, until it succeeds or the permit would have expired by itself, so the permit is free
/// within about a second of Redis answering again. Dropping it never blocks and never panics,
/// also outside a runtime; when no runtime is left to send the release, the permit comes back
/// when it expires.
///
/// A permit leaked with [`std::mem::forget`] keeps renewing, and so stays held, for as long as
/// its runtime runs. A process that dies (or a runtime that is shut down)
/// stops renewing: its permits come back within one time to live.
///
/// When the store cannot be reached, renewals fail and are tried again every third of the
/// time to live; if none succeeds before the permit expires, it may be given to another
/// request while this one still runs. When a renewal finds the permit gone (its time to live ran out
/// unrenewed, or the store lost its state), [`is_lost`](Self::is_lost) turns true and the
/// renewal puts the permit back: the request counts again, even if its key is then over the
/// limit (new requests of the key are refused until enough end). The request is never
/// interrupted. See [`ConcurrencyLimiterBuilder`](crate::concurrency::ConcurrencyLimiterBuilder) for what
/// this bounds after Redis loses its state.
///
/// ```
/// use tower_redis_ratelimit::{MemoryStore, concurrency::ConcurrencyLimiter};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = ConcurrencyLimiter::builder(MemoryStore::new(), 1).build()?;
/// let permit = limiter.acquire("report-42").await?.expect("a free permit");
/// assert_eq!((permit.in_flight(), permit.max_in_flight()), (1, 1));
/// assert!(limiter.acquire("report-42").await?.is_none(), "the only permit is held");
/// drop(permit);
/// assert!(limiter.acquire("report-42").await?.is_some());
/// # Ok(()) }
/// ```
pub struct Permit {
    holder: Arc<Holder>,
    in_flight: u64,
    degraded: bool,
    renewal: Option<AbortHandle>,
    /// The runtime it was acquired on, to release on when dropped outside one.
    runtime: Option<Handle>,
    released: bool,
}

impl Permit {
    /// A held permit; starts renewing it when a Tokio runtime is at hand.
    pub(crate) fn new(holder: Arc<Holder>, in_flight: u64, degraded: bool) -> Self {
        let runtime = Handle::try_current().ok();
        let renewal = runtime
            .as_ref()
            .map(|rt| rt.spawn(Arc::clone(&holder).keep_renewed()).abort_handle());
        Self {
            holder,
            in_flight,
            degraded,
            renewal,
            runtime,
            released: false,
        }
    }

    /// Requests of this key in flight when this one was admitted, itself included.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The limit it was admitted under (the local share's when [degraded](Self::is_degraded)).
    pub fn max_in_flight(&self) -> u32 {
        self.holder.semaphore.limit()
    }

    /// The policy name of the limiter that admitted it.
    pub fn policy_name(&self) -> &str {
        &self.holder.semaphore.core.policy
    }

    /// True when the store was unavailable and the permit is one of this process's local share
    /// ([`FailurePolicy::Local`](crate::FailurePolicy::Local)).
    pub fn is_degraded(&self) -> bool {
        self.degraded
    }

    /// True when a renewal found the permit gone: the request outlived its time to live without a
    /// successful renewal (the store was away, or the process stalled), or the store lost its
    /// state (a restart, `FLUSHDB`). That renewal put it back, but another request may have
    /// taken its place meanwhile (the key is then over its limit until enough requests end).
    pub fn is_lost(&self) -> bool {
        self.holder.lost.load(Ordering::Acquire)
    }

    /// Gives the permit back now and waits for the store to confirm (within the store timeout).
    /// On an error, the release is also sent again in the background until it succeeds or the
    /// permit would have expired by itself.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the store does not answer within the store timeout,
    /// [`Error::CircuitOpen`] while the circuit breaker is open, and the store's own error
    /// (unreachable, refused) otherwise. The release is sent again in the background then.
    pub async fn release(mut self) -> Result<(), Error> {
        self.stop_renewing();
        self.released = true;
        self.holder.release().await
    }

    fn stop_renewing(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.stop_renewing();
        if !self.released {
            Arc::clone(&self.holder).release_in_background(self.runtime.as_ref());
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("policy", &self.holder.semaphore.core.policy)
            .field("holder", &self.holder.id)
            .field("in_flight", &self.in_flight)
            .field("max_in_flight", &self.holder.semaphore.limit())
            .field("degraded", &self.degraded)
            .field("lost", &self.is_lost())
            .finish()
    }
}
