//! Releases that failed (Redis stalled or failing over, a connection cut), kept and sent again
//! until one succeeds or the holder's lease would have ended anyway: a release tried only once
//! would leave its permit taken for the rest of its time to live (up to an hour) whenever Redis missed
//! one moment. A release is idempotent (giving back a permit not held does nothing), so sending
//! it again is safe whatever reached Redis the first time.
//!
//! One worker task per limiter sends them, and only while some are kept: every second at
//! least, one release first, and the rest (a few at a time) only when that one did not find
//! the store unavailable, so a store that is down gets one call a second, not one per kept
//! release. At most [`MAX_KEPT`] are kept per limiter.

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use futures_util::StreamExt;
use tokio::{runtime::Handle, time::Instant};

use super::semaphore::Semaphore;
use crate::{
    error::Chain,
    error::{Error, ErrorScope},
    extract::Key,
};

/// The most releases one limiter keeps; beyond, a failed release's permit comes back when its
/// lease ends.
pub(crate) const MAX_KEPT: usize = 10_000;
/// The wait before the first new try; it doubles with each failed try, up to
/// [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(100);
/// The longest wait between two tries of one release.
const MAX_WAIT: Duration = Duration::from_secs(1);
/// Releases sent at once when the store answers again.
const AT_ONCE: usize = 16;

/// The releases of one limiter waiting to be sent again.
#[derive(Default)]
pub(crate) struct Releases {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    kept: Vec<Kept>,
    /// A worker task runs (or is about to).
    worker: bool,
    /// A release was dropped because [`MAX_KEPT`] were kept (warned once until the count
    /// falls again).
    full: bool,
}

/// One release to send again.
pub(crate) struct Kept {
    key: Option<Key<'static>>,
    holder: String,
    late_renewal: bool,
    /// When the holder's lease ends by itself at the latest: no use sending it after.
    until: Instant,
    next: Instant,
    tries: u32,
}

impl Kept {
    /// `holder`'s release of `key`, worth sending until `until`; `late_renewal` as in
    /// [`Permits::release`].
    pub(crate) fn new(
        key: Option<Key<'static>>,
        holder: String,
        late_renewal: bool,
        until: Instant,
    ) -> Self {
        Self {
            key,
            holder,
            late_renewal,
            until,
            next: Instant::now() + FIRST_WAIT,
            tries: 0,
        }
    }

    /// After a failed try: the next one at most [`MAX_WAIT`] later.
    fn failed(mut self) -> Self {
        self.tries = self.tries.saturating_add(1);
        let wait = FIRST_WAIT
            .saturating_mul(1 << self.tries.min(10))
            .min(MAX_WAIT);
        self.next = Instant::now() + wait;
        self
    }
}

impl Releases {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Releases kept now (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().kept.len()
    }
}

/// Keeps `release`, which failed with `error`, to send it again on the current Tokio runtime.
/// A release the store refused as invalid is not sent again; without a runtime, or with
/// [`MAX_KEPT`] kept already, the permit comes back when it expires. Never panics.
pub(crate) fn keep(semaphore: &Arc<Semaphore>, release: Kept, error: &Error) {
    if error.scope() == ErrorScope::Check {
        tracing::warn!(error = %Chain(error), policy = %semaphore.core.policy, "concurrency limit: the store refused a release; the permit comes back when it expires");
        return;
    }
    let start = {
        let mut state = semaphore.releases.lock();
        if state.kept.len() >= MAX_KEPT {
            if !std::mem::replace(&mut state.full, true) {
                tracing::warn!(error = %Chain(error), policy = %semaphore.core.policy, kept = MAX_KEPT, "concurrency limit: too many failed releases kept; this one's permit comes back when it expires");
            }
            return;
        }
        state.kept.push(release);
        !std::mem::replace(&mut state.worker, true)
    };
    if !start {
        return;
    }
    // Made before the task, so that a task dropped unpolled (a runtime shutting down) still
    // lets the next release start a worker.
    let worker = Worker {
        semaphore: Arc::clone(semaphore),
        done: false,
    };
    match Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(worker.run());
        }
        Err(_) => drop(worker),
    }
}

/// The task sending kept releases; marks the limiter as without one when it ends, also when
/// its runtime drops it.
struct Worker {
    semaphore: Arc<Semaphore>,
    done: bool,
}

impl Drop for Worker {
    fn drop(&mut self) {
        if !self.done {
            self.semaphore.releases.lock().worker = false;
        }
    }
}

impl Worker {
    async fn run(mut self) {
        loop {
            let Some(due) = self.due() else {
                return;
            };
            let (first, rest) = match due {
                Due::Wait(until) => {
                    tokio::time::sleep_until(until).await;
                    continue;
                }
                Due::Now(mut due) => {
                    let first = due.swap_remove(0);
                    (first, due)
                }
            };
            let semaphore = &*self.semaphore;
            match semaphore
                .release(first.key.as_ref(), &first.holder, first.late_renewal)
                .await
            {
                Err(e) if e.is_unavailable() => {
                    // Still away: the others wait for the next round.
                    let mut state = semaphore.releases.lock();
                    state.kept.push(first.failed());
                    state.kept.extend(rest.into_iter().map(Kept::failed));
                    continue;
                }
                result => self.settle(first, result),
            }
            futures_util::stream::iter(rest)
                .for_each_concurrent(AT_ONCE, |kept| async {
                    let result = semaphore
                        .release(kept.key.as_ref(), &kept.holder, kept.late_renewal)
                        .await;
                    self.settle(kept, result);
                })
                .await;
        }
    }

    /// What to send now, or until when to wait; `None` (and this worker is done) when nothing
    /// is kept any more. Drops the releases whose lease has ended meanwhile.
    fn due(&mut self) -> Option<Due> {
        let now = Instant::now();
        let mut state = self.semaphore.releases.lock();
        let before = state.kept.len();
        state.kept.retain(|k| k.until > now);
        let expired = before - state.kept.len();
        if expired > 0 {
            tracing::warn!(policy = %self.semaphore.core.policy, releases = expired, "concurrency limit: releases never reached the store; their permits came back when they expired");
        }
        if state.kept.len() < MAX_KEPT {
            state.full = false;
        }
        if state.kept.is_empty() {
            state.worker = false;
            self.done = true;
            return None;
        }
        let (due, later): (Vec<Kept>, Vec<Kept>) =
            state.kept.drain(..).partition(|k| k.next <= now);
        state.kept = later;
        if due.is_empty() {
            let next = state.kept.iter().map(|k| k.next).min().unwrap_or(now);
            return Some(Due::Wait(next));
        }
        Some(Due::Now(due))
    }

    /// Forgets `kept` when `result` is a success (or a refusal no try will change), keeps it
    /// for the next round otherwise.
    fn settle(&self, kept: Kept, result: Result<(), Error>) {
        let semaphore = &self.semaphore;
        match result {
            Ok(()) => {
                tracing::debug!(policy = %semaphore.core.policy, tries = kept.tries + 1, "concurrency limit: a failed release went through");
            }
            Err(e) if e.scope() == ErrorScope::Check => {
                tracing::warn!(error = %Chain(&e), policy = %semaphore.core.policy, "concurrency limit: the store refused a release; the permit comes back when it expires");
            }
            Err(_) => semaphore.releases.lock().kept.push(kept.failed()),
        }
    }
}

enum Due {
    Now(Vec<Kept>),
    Wait(Instant),
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;
    use crate::{
        store::{Acquired, Backend, BoxFuture, Namespaces, SlotTerms, StoreKey},
        ConcurrencyLimiter, MemoryStore, Store,
    };

    /// An in-memory store whose releases fail (as an unavailable store) while `down`.
    #[derive(Clone, Default)]
    struct Flaky {
        inner: MemoryStore,
        down: Arc<AtomicBool>,
        releases: Arc<AtomicUsize>,
    }

    impl Store for Flaky {}

    impl Backend for Flaky {
        fn check<'a>(
            &'a self,
            algorithm: &'a dyn crate::Algorithm,
            key: StoreKey<'a>,
            cost: u32,
            now_us: Option<u64>,
        ) -> BoxFuture<'a, Result<crate::Outcome, Error>> {
            self.inner.check(algorithm, key, cost, now_us)
        }

        fn namespaces(&self) -> Option<&Namespaces> {
            None
        }

        fn acquire<'a>(
            &'a self,
            key: StoreKey<'a>,
            holder: &'a str,
            terms: &'a SlotTerms,
        ) -> BoxFuture<'a, Result<Acquired, Error>> {
            self.inner.acquire(key, holder, terms)
        }

        fn renew<'a>(
            &'a self,
            key: StoreKey<'a>,
            holder: &'a str,
            terms: &'a SlotTerms,
        ) -> BoxFuture<'a, Result<bool, Error>> {
            self.inner.renew(key, holder, terms)
        }

        fn release<'a>(
            &'a self,
            key: StoreKey<'a>,
            holder: &'a str,
            late_renewal: Option<Duration>,
        ) -> BoxFuture<'a, Result<(), Error>> {
            self.releases.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Box::pin(std::future::ready(Err(Error::Timeout(
                    Duration::from_millis(100),
                ))));
            }
            self.inner.release(key, holder, late_renewal)
        }
    }

    fn limiter(store: Flaky, lease: Duration) -> ConcurrencyLimiter {
        ConcurrencyLimiter::builder(store, 1)
            .permit_ttl(lease)
            .build()
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_release_is_sent_again_at_least_once_a_second_until_it_succeeds() {
        let store = Flaky::default();
        let limiter = limiter(store.clone(), Duration::from_secs(60));
        store.down.store(true, Ordering::SeqCst);
        let permit = limiter.acquire("k").await.unwrap().unwrap();
        assert!(permit.release().await.is_err());
        assert_eq!(limiter.semaphore.releases.len(), 1);
        // Down for 10 s: about one try a second, one call each (not one per kept release).
        tokio::time::sleep(Duration::from_secs(10)).await;
        let tries = store.releases.load(Ordering::SeqCst);
        assert!((10..=16).contains(&tries), "{tries} tries in 10 s");
        assert!(limiter.acquire("k").await.unwrap().is_none(), "still held");
        store.down.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(limiter.semaphore.releases.len(), 0);
        assert!(limiter.acquire("k").await.unwrap().is_some(), "given back");
        // The worker is gone, and a new failure starts another.
        tokio::task::yield_now().await;
        assert!(!limiter.semaphore.releases.lock().worker);
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_stays_down_gets_one_try_a_second_and_releases_end_with_their_lease() {
        let store = Flaky::default();
        let lease = Duration::from_secs(30);
        let limiter = ConcurrencyLimiter::builder(store.clone(), 100)
            .permit_ttl(lease)
            .build()
            .unwrap();
        let permits: Vec<_> =
            futures_util::future::join_all((0..50).map(|i| limiter.acquire(format!("k{i}"))))
                .await
                .into_iter()
                .map(|p| p.unwrap().unwrap())
                .collect();
        store.down.store(true, Ordering::SeqCst);
        drop(permits);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(limiter.semaphore.releases.len(), 50);
        let first_tries = store.releases.load(Ordering::SeqCst);
        assert_eq!(first_tries, 50);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let tries = store.releases.load(Ordering::SeqCst) - first_tries;
        assert!(tries <= 16, "{tries} tries in 10 s for 50 kept releases");
        // Past the lease, nothing is kept, and the permits came back by themselves.
        tokio::time::sleep(lease).await;
        assert_eq!(limiter.semaphore.releases.len(), 0);
        assert!(!limiter.semaphore.releases.lock().worker);
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_max_kept_releases_are_kept() {
        let store = Flaky::default();
        let limiter = ConcurrencyLimiter::builder(store.clone(), 1)
            .permit_ttl(Duration::from_secs(60))
            .build()
            .unwrap();
        let semaphore = &limiter.semaphore;
        let error = Error::Timeout(Duration::from_millis(100));
        let until = Instant::now() + Duration::from_secs(60);
        for i in 0..MAX_KEPT + 10 {
            keep(
                semaphore,
                Kept::new(None, format!("h{i}"), false, until),
                &error,
            );
        }
        assert_eq!(semaphore.releases.len(), MAX_KEPT);
        // A release the store refuses as invalid is not kept.
        let invalid = Error::InvalidInput("no");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(semaphore.releases.len(), 0, "sent once the store answers");
        keep(
            semaphore,
            Kept::new(None, "x".into(), false, until),
            &invalid,
        );
        assert_eq!(semaphore.releases.len(), 0);
    }
}
