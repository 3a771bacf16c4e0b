//! What a store keeps for a [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter): per-key slots,
//! each held for a time to live that renewals extend (see
//! [`Backend::acquire`](super::Backend::acquire)).
//!
//! Deadlines are on the store's clock (Redis `TIME`, a [`MemoryStore`](crate::MemoryStore)'s
//! clock), so the app servers' clocks do not matter. A holder whose deadline has passed no
//! longer counts against the limit, until its holder renews it: a renewal puts a holder that
//! is not held (any more) back, counted even when the key is then over its limit, because the
//! request it stands for is still running.
//!
//! A store that can lose its state (a Redis restart without persistence, `FLUSHALL`) keeps an
//! epoch, and a limiter remembers the epochs it has seen in its [`SlotTerms`]: a call that
//! finds the epoch gone or replaced, by a limiter that had seen the old one, knows the holders
//! were lost, and the store then admits no new holder for [`SlotTerms::pause`] while the
//! running ones put theirs back at their next renewal.

use std::{
    collections::HashMap,
    fmt,
    sync::Mutex,
    time::{Duration, Instant},
};

/// A store's answer to [`Backend::acquire`](super::Backend::acquire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acquired {
    /// Whether the holder got a slot.
    pub(crate) admitted: bool,
    /// Unexpired holders of the key after the call (including the new one when admitted).
    pub(crate) holders: u64,
}

impl Acquired {
    pub(crate) const fn new(admitted: bool, holders: u64) -> Self {
        Self { admitted, holders }
    }
}

/// What a [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter) brings to each call on a key's
/// slots besides the key and the holder: its limit, its permits' time to live, how long to pause admissions
/// after the store lost its state, and the store epochs it has seen.
pub(crate) struct SlotTerms {
    limit: u32,
    ttl: Duration,
    pause: Duration,
    /// The epoch last seen per unit of the store (a Redis server, or a cluster hash slot), and
    /// when.
    epochs: Mutex<HashMap<u16, (u64, Instant)>>,
}

/// An epoch not seen for this long is forgotten: the store's marker of it may have expired
/// meanwhile (a store keeps it for at least twice as long after its last call), and a marker
/// that expired is no sign of a loss.
const EPOCH_MEMORY: Duration = Duration::from_secs(12 * 3600);

impl SlotTerms {
    /// `limit` holders at once, each for `ttl` without a renewal, admitting no new holder for `pause`
    /// after the store is found to have lost its state; no epoch seen yet.
    pub(crate) fn new(limit: u32, ttl: Duration, pause: Duration) -> Self {
        Self {
            limit,
            ttl,
            pause,
            epochs: Mutex::default(),
        }
    }

    /// Holders allowed at once under one key.
    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    /// How long a holder keeps its slot without a renewal.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How long no new holder is admitted after a call finds that the store lost its state:
    /// long enough for every running holder to renew, and so to be counted again.
    pub(crate) fn pause(&self) -> Duration {
        self.pause
    }

    /// The epoch last seen for `unit` of the store (0: none, or none for many hours).
    pub(crate) fn known_epoch(&self, unit: u16) -> u64 {
        let epochs = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        match epochs.get(&unit) {
            Some(&(epoch, seen)) if seen.elapsed() < EPOCH_MEMORY => epoch,
            _ => 0,
        }
    }

    /// Records the epoch the store answered for `unit`; true when it replaces another one.
    pub(crate) fn saw_epoch(&self, unit: u16, epoch: u64) -> bool {
        let mut epochs = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match epochs.get_mut(&unit) {
            // Written again at most once a minute: calls of one key do not fight over it.
            Some(seen)
                if seen.0 == epoch && now.duration_since(seen.1) < Duration::from_secs(60) =>
            {
                false
            }
            Some(seen) => {
                let replaced = seen.0 != epoch;
                *seen = (epoch, now);
                replaced
            }
            None => {
                epochs.insert(unit, (epoch, now));
                false
            }
        }
    }
}

impl fmt::Debug for SlotTerms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotTerms")
            .field("limit", &self.limit)
            .field("ttl", &self.ttl)
            .field("pause", &self.pause)
            .finish_non_exhaustive()
    }
}
