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

use std::sync::Arc;

use futures_util::StreamExt;
use tokio::{runtime::Handle, time::Instant};

use super::{kept::Kept, semaphore::Semaphore};
use crate::error::{Error, ErrorChain, ErrorScope};

/// The most releases one limiter keeps; beyond, a failed release's permit comes back when its
/// lease ends.
pub(crate) const MAX_KEPT: usize = 10_000;
/// Releases sent at once when the store answers again.
const AT_ONCE: usize = 16;

/// Keeps `release`, which failed with `error`, to send it again on the current Tokio runtime.
/// A release the store refused as invalid is not sent again; without a runtime, or with
/// [`MAX_KEPT`] kept already, the permit comes back when it expires. Never panics.
pub(crate) fn keep(semaphore: &Arc<Semaphore>, release: Kept, error: &Error) {
    if error.scope() == ErrorScope::Check {
        tracing::warn!(error = %ErrorChain(error), policy = %semaphore.core.policy, "concurrency limit: the store refused a release; the permit comes back when it expires");
        return;
    }
    let start = {
        let mut state = semaphore.releases.lock();
        if state.kept.len() >= MAX_KEPT {
            if !std::mem::replace(&mut state.full, true) {
                tracing::warn!(error = %ErrorChain(error), policy = %semaphore.core.policy, kept = MAX_KEPT, "concurrency limit: too many failed releases kept; this one's permit comes back when it expires");
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
                tracing::warn!(error = %ErrorChain(&e), policy = %semaphore.core.policy, "concurrency limit: the store refused a release; the permit comes back when it expires");
            }
            Err(_) => semaphore.releases.lock().kept.push(kept.failed()),
        }
    }
}

enum Due {
    Now(Vec<Kept>),
    Wait(Instant),
}
