//! The exact local deny cache: after Redis denies a key, deny the same check locally until
//! the denial's retry time, without a round trip.
//!
//! Exact because for every algorithm here nothing but time frees capacity: other instances can
//! only consume more. The cache holds only what cannot change before its deadline:
//! denials of a cost-1 check with no units left, until one unit frees up. It answers only
//! cost-1 checks of that key; any other cost asks the store. Deadlines are measured from when
//! the check was *sent*, so they end no later than the store's own (never denies what the
//! store would allow). State can also vanish in Redis (a restart without persistence, a
//! `FLUSHDB`, a key deleted by hand), which frees capacity early; so an entry answers for at
//! most [`MAX_AGE`] before the store is asked again.

use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        OnceLock,
    },
    time::{Duration, Instant},
};

use crate::store::{Expiring, Sharded};

const SHARDS: usize = 16;

/// The longest a cached denial answers before the store is asked again.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Until when the entry answers: the denial's end, or `MAX_AGE` after it was sent.
    valid: Instant,
    /// When one unit is available again.
    until: Instant,
    /// When the whole quota is available again.
    reset: Instant,
    /// `reset - until`, when the quota fills after the unit frees (always, but a caller may
    /// say otherwise): a hit then needs one subtraction from the clock, not two.
    reset_gap: Option<Duration>,
    /// A ban: it answers checks of every cost.
    banned: bool,
}

/// Microseconds since a fixed instant of this process, for the map's sweeps.
fn micros(at: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(|| Instant::now() - Duration::from_secs(3600));
    at.saturating_duration_since(epoch).as_micros() as u64
}

impl Expiring for Entry {
    fn expires_at(&self) -> u64 {
        micros(self.valid)
    }
}

/// A bounded map from a limiter's key to the end of a known denial.
pub(crate) struct DenyCache {
    entries: Sharded<Entry>,
    /// Entries held (live or not yet swept): lets a lookup skip the lock and the hash while
    /// nothing is denied, the common case.
    held: Padded,
    /// The latest time any entry answers until (see [`micros`]): past it, every entry held
    /// is dead, and a lookup skips the lock and the hash too (e.g. once a flood has ended).
    live_until: Padded64,
}

/// [`Padded`], for a time.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded64(AtomicU64);

/// A counter on a cache line of its own: it is read on every lookup while the shard locks
/// next to it change hands.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded(AtomicUsize);

/// A cached denial: how long until one unit frees, and until the quota is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hit {
    pub(crate) retry_after: Duration,
    pub(crate) reset_after: Duration,
    /// The denial is a ban's.
    pub(crate) banned: bool,
}

impl DenyCache {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            entries: Sharded::new(SHARDS, max_keys),
            held: Padded::default(),
            live_until: Padded64::default(),
        }
    }

    /// `now`, when an entry may still answer then; `None` when none can (nothing held, or
    /// every entry dead): no key need be looked up. The clock is read only when entries are
    /// held.
    pub(crate) fn live(&self, now: impl FnOnce() -> Instant) -> Option<Instant> {
        if self.held.0.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let now = now();
        (micros(now) < self.live_until.0.load(Ordering::Relaxed)).then_some(now)
    }

    /// The live denial for `key`, if any; `now` is read only when entries are held.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &[u8], now: impl FnOnce() -> Instant) -> Option<Hit> {
        let now = self.live(now)?;
        self.get_live(key, now)
    }

    /// [`get`](Self::get) at `now`, which [`live`](Self::live) gave.
    pub(crate) fn get_live(&self, key: &[u8], now: Instant) -> Option<Hit> {
        let slot = self.entries.slot(key);
        let mut shard = self.entries.lock(slot);
        let e = *shard.get_mut(slot, key)?;
        drop(shard);
        if now >= e.valid {
            return None;
        }
        // `now < valid <= until`.
        let retry_after = e.until - now;
        let reset_after = match e.reset_gap {
            Some(gap) => retry_after + gap,
            None => e.reset.saturating_duration_since(now),
        };
        Some(Hit {
            retry_after,
            reset_after,
            banned: e.banned,
        })
    }

    /// Records that a cost-1 check of `key`, sent at `sent`, was denied with no units left:
    /// one unit frees after `retry_after`, the quota after `reset_after`. Or, `banned`, that
    /// the key is banned for `retry_after` (from `sent`): the entry then answers every cost.
    pub(crate) fn insert(
        &self,
        key: &[u8],
        sent: Instant,
        retry_after: Duration,
        reset_after: Duration,
        banned: bool,
    ) {
        let until = sent + retry_after;
        let reset = sent + reset_after;
        let entry = Entry {
            valid: sent + retry_after.min(MAX_AGE),
            until,
            reset,
            reset_gap: reset.checked_duration_since(until),
            banned,
        };
        // Before the entry is visible: a lookup that finds it must not skip it. `micros` is
        // monotonic, and an entry rounded down ends no later than it would have.
        self.live_until
            .0
            .fetch_max(micros(entry.valid) + 1, Ordering::Relaxed);
        let slot = self.entries.slot(key);
        let mut shard = self.entries.lock(slot);
        if let Some(e) = shard.get_mut(slot, key) {
            *e = entry;
            return;
        }
        let before = shard.len();
        shard.room(micros(Instant::now()));
        shard.insert(slot, key, entry);
        // Under the shard's lock, so the count is exact once every insert has returned.
        let after = shard.len();
        if after >= before {
            self.held.0.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.held.0.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// Forgets the denial cached for `key`, if any (its units were given back).
    pub(crate) fn remove(&self, key: &[u8]) {
        if self.held.0.load(Ordering::Relaxed) == 0 {
            return;
        }
        let slot = self.entries.slot(key);
        let mut shard = self.entries.lock(slot);
        if shard.remove(slot, key).is_some() {
            self.held.0.fetch_sub(1, Ordering::Relaxed);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.each().map(|s| s.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_until_the_deadline_measured_from_sending() {
        let c = DenyCache::new(1_000);
        let sent = Instant::now();
        c.insert(
            b"k",
            sent,
            Duration::from_millis(100),
            Duration::from_secs(5),
            false,
        );
        let hit = c.get(b"k", || sent + Duration::from_millis(40)).unwrap();
        assert_eq!(hit.retry_after, Duration::from_millis(60));
        assert_eq!(hit.reset_after, Duration::from_millis(4_960));
        assert_eq!(c.get(b"k", || sent + Duration::from_millis(100)), None);
        assert_eq!(c.get(b"other", || sent), None);
        // A long denial answers for at most MAX_AGE, with its true retry time.
        c.insert(
            b"day",
            sent,
            Duration::from_secs(3_600),
            Duration::from_secs(7_200),
            false,
        );
        let hit = c.get(b"day", || sent + Duration::from_millis(500)).unwrap();
        assert_eq!(hit.retry_after, Duration::from_millis(3_599_500));
        assert_eq!(c.get(b"day", || sent + MAX_AGE), None);
    }

    /// Lookups skip the map once every entry is dead, never while one lives: a long denial
    /// keeps answering after shorter ones ended, and a denial cached later answers again.
    #[test]
    fn skips_lookups_only_when_every_entry_is_dead() {
        let c = DenyCache::new(1_000);
        let sent = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(c.live(|| sent), None, "nothing held");
        c.insert(b"long", sent, ms(300), ms(300), false);
        c.insert(b"short", sent, ms(10), ms(10), false);
        assert!(c.get(b"long", || sent + ms(50)).is_some());
        assert_eq!(c.get(b"short", || sent + ms(50)), None);
        assert_eq!(c.live(|| sent + ms(299)), Some(sent + ms(299)));
        assert_eq!(c.live(|| sent + ms(301)), None, "every entry is dead");
        assert_eq!(c.get(b"long", || sent + ms(301)), None);
        // Replacing an entry extends it too.
        c.insert(b"short", sent + ms(400), ms(100), ms(100), false);
        assert!(c.get(b"short", || sent + ms(450)).is_some());
        assert_eq!(c.get(b"long", || sent + ms(450)), None);
        assert_eq!(c.live(|| sent + ms(501)), None);
    }

    #[test]
    fn bounded_and_sweeps_expired_entries() {
        let c = DenyCache::new(160);
        let long_ago = Instant::now() - Duration::from_secs(10);
        for i in 0..10_000 {
            c.insert(
                format!("old{i}").as_bytes(),
                long_ago,
                Duration::from_secs(1),
                Duration::from_secs(1),
                false,
            );
        }
        assert!(c.len() <= 160);
        let now = Instant::now();
        for i in 0..10_000 {
            c.insert(
                format!("live{i}").as_bytes(),
                now,
                Duration::from_secs(60),
                Duration::from_secs(60),
                false,
            );
        }
        assert!(c.len() <= 160, "{}", c.len());
        // The cache holds live denials up to its bound.
        assert!(
            (0..10_000)
                .filter(|i| c.get(format!("live{i}").as_bytes(), || now).is_some())
                .count()
                >= 100
        );
    }
}
