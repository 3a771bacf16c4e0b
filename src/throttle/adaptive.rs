//! Learning from the upstream's answers: where it is kept, the cap on what a header may
//! impose, and what was learned.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::store::{memory::MemoryStore, Backend, UpstreamStore};

/// What an adaptive throttle learned (see
/// [`ThrottleLayer::adaptive_stats`](super::ThrottleLayer::adaptive_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdaptiveStats {
    /// Answers whose headers told something (a window, a pause), recorded in the store.
    pub learned: u64,
    /// Header values ignored as malformed or hostile.
    pub ignored: u64,
    /// Values beyond the cap (`max_pause`), cut down to it.
    pub capped: u64,
    /// Calls held back because the upstream said to pause (a 429 or 503).
    pub paused: u64,
    /// Calls held back because the upstream's window had no units left.
    pub exhausted: u64,
    /// Calls the upstream answered 429.
    pub rate_limited: u64,
    /// 429s sent again after the pause.
    pub retried: u64,
    /// Store calls (take, learn) that failed; the call then went by what this process learned
    /// while the store failed (and by the configured limit, when there is one).
    pub store_errors: u64,
}

#[derive(Debug, Default)]
pub(crate) struct AdaptiveCounters {
    pub(crate) learned: AtomicU64,
    pub(crate) ignored: AtomicU64,
    pub(crate) capped: AtomicU64,
    pub(crate) paused: AtomicU64,
    pub(crate) exhausted: AtomicU64,
    pub(crate) rate_limited: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) store_errors: AtomicU64,
}

impl AdaptiveCounters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> AdaptiveStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        AdaptiveStats {
            learned: get(&self.learned),
            ignored: get(&self.ignored),
            capped: get(&self.capped),
            paused: get(&self.paused),
            exhausted: get(&self.exhausted),
            rate_limited: get(&self.rate_limited),
            retried: get(&self.retried),
            store_errors: get(&self.store_errors),
        }
    }
}

/// An adaptive throttle's settings.
#[derive(Clone)]
pub(crate) struct Adaptive {
    /// Where what the upstream said is shared with the other instances.
    pub(crate) store: Arc<dyn UpstreamStore>,
    /// What this process learned while `store` failed: calls go by it then, so that a store
    /// failure never lets calls out without what the upstream said (a learn-only throttle has
    /// no configured limit to fall back on).
    pub(crate) local: MemoryStore,
    pub(crate) counters: Arc<AdaptiveCounters>,
}

impl Adaptive {
    /// Learns into `store`; what this process learns while it fails, in memory, on the
    /// same clock.
    pub(crate) fn new(store: Arc<dyn UpstreamStore>) -> Self {
        let local = match store.clock() {
            Some(clock) => MemoryStore::builder()
                .clock(clock)
                .build()
                .expect("a store with only a clock builds"),
            None => MemoryStore::new(),
        };
        Self {
            store,
            local,
            counters: Arc::default(),
        }
    }
}

/// The default cap on a pause or a reset an upstream's header may impose.
pub const DEFAULT_MAX_PAUSE: Duration = Duration::from_secs(60);
