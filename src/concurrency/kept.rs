//! The releases a limiter keeps to send again (see [`releases`](super::releases)): what is
//! kept, and until when it is worth sending.

use std::{
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use tokio::time::Instant;

use crate::extract::Key;

/// The wait before the first new try; it doubles with each failed try, up to
/// [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(100);
/// The longest wait between two tries of one release.
const MAX_WAIT: Duration = Duration::from_secs(1);
/// The releases of one limiter waiting to be sent again.
#[derive(Default)]
pub(crate) struct Releases {
    state: Mutex<State>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) kept: Vec<Kept>,
    /// A worker task runs (or is about to).
    pub(crate) worker: bool,
    /// A release was dropped because [`MAX_KEPT`] were kept (warned once until the count
    /// falls again).
    pub(crate) full: bool,
}

/// One release to send again.
pub(crate) struct Kept {
    pub(crate) key: Option<Key<'static>>,
    pub(crate) holder: String,
    pub(crate) late_renewal: bool,
    /// When the holder's lease ends by itself at the latest: no use sending it after.
    pub(crate) until: Instant,
    pub(crate) next: Instant,
    pub(crate) tries: u32,
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
    pub(crate) fn failed(mut self) -> Self {
        self.tries = self.tries.saturating_add(1);
        let wait = FIRST_WAIT
            .saturating_mul(1 << self.tries.min(10))
            .min(MAX_WAIT);
        self.next = Instant::now() + wait;
        self
    }
}

impl Releases {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Releases kept now (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().kept.len()
    }
}
