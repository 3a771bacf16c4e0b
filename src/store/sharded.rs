//! One map for state kept in this process ([`MemoryStore`](super::MemoryStore)'s states, the
//! limiter's deny cache): keys as bytes, split over lock shards so that checks on different
//! keys rarely wait for each other, hashed once per lookup, expired entries swept as a shard
//! grows, and a bound on entries per shard.

use std::{
    hash::{BuildHasher, Hasher},
    sync::{Mutex, MutexGuard},
};

use hashbrown::HashTable;

use super::map_key::MapKey;

/// What the map needs to know of a value: when it stops mattering.
pub(crate) trait Expiring {
    /// The time (in the owner's clock) at and after which the value is dead.
    fn expires_at(&self) -> u64;
}

/// A byte-keyed map split over lock shards.
pub(crate) struct Sharded<V> {
    shards: Box<[Padded<V>]>,
    /// DoS-resistant and seeded per map: keys come from clients.
    hasher: std::collections::hash_map::RandomState,
}

/// A shard's lock on cache lines of its own: threads working on different shards do not slow
/// each other down.
#[repr(align(128))]
struct Padded<V>(Mutex<Shard<V>>);

/// One shard: its entries, each with its hash (so growing the table needs no rehash) and its
/// key (inline while short: no allocation per new key).
pub(crate) struct Shard<V> {
    table: HashTable<(u64, MapKey, V)>,
    /// Size after the last sweep; the next sweep runs when the shard has doubled.
    swept_len: usize,
    max: usize,
    /// Entries forgotten because the shard was full.
    pub(crate) evicted: u64,
    /// What the owner counts besides entries (e.g. log entries), kept up to date by it.
    pub(crate) weight: usize,
    /// When the owner last swept this shard itself (for owners whose values are not
    /// [`Expiring`]).
    pub(crate) swept_at: Option<std::time::Instant>,
}

/// A key's hash and the shard it lives in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    hash: u64,
}

impl Slot {
    /// The hash of the key.
    pub(crate) fn hash(self) -> u64 {
        self.hash
    }

    /// The shard, of `shards` (a power of two), the key lives in.
    pub(crate) fn shard(self, shards: usize) -> usize {
        // Middle bits: the table uses the low bits for buckets and the top ones as tags.
        (self.hash >> 32) as usize & (shards - 1)
    }
}

/// Entries of another table whose keys share this shard's bound (see
/// [`Shard::room_beside`]): what the bound needs to count, sweep and forget them.
pub(crate) trait Beside {
    /// Entries held.
    fn len(&self) -> usize;
    /// Forgets the entries expired at `now`.
    fn sweep(&mut self, now: u64);
    /// Adds the expiry of every entry to `into`.
    fn expiries(&self, into: &mut Vec<u64>);
    /// Forgets up to `left` entries expiring at or before `cutoff`, counting them off `left`.
    fn forget_expiring(&mut self, cutoff: u64, left: &mut usize);
}

/// No other table.
impl Beside for () {
    fn len(&self) -> usize {
        0
    }
    fn sweep(&mut self, _now: u64) {}
    fn expiries(&self, _into: &mut Vec<u64>) {}
    fn forget_expiring(&mut self, _cutoff: u64, _left: &mut usize) {}
}

impl<V> Sharded<V> {
    /// `shards` lock shards (a power of two), holding about `max_entries` entries in all.
    pub(crate) fn new(shards: usize, max_entries: usize) -> Self {
        debug_assert!(shards.is_power_of_two());
        let max_per_shard = max_entries.div_ceil(shards).max(1);
        Self {
            shards: (0..shards)
                .map(|_| {
                    Padded(Mutex::new(Shard {
                        table: HashTable::new(),
                        swept_len: 0,
                        max: max_per_shard,
                        evicted: 0,
                        weight: 0,
                        swept_at: None,
                    }))
                })
                .collect(),
            hasher: Default::default(),
        }
    }

    #[inline]
    pub(crate) fn slot(&self, key: &[u8]) -> Slot {
        // The bytes alone, without `Hash for [u8]`'s length prefix: one key per table, and
        // SipHash's last block holds the length anyway.
        let mut h = self.hasher.build_hasher();
        h.write(key);
        Slot { hash: h.finish() }
    }

    /// Locks the shard of `slot`.
    pub(crate) fn lock(&self, slot: Slot) -> MutexGuard<'_, Shard<V>> {
        lock(&self.shards[slot.shard(self.shards.len())].0)
    }

    /// Every shard in turn, locked.
    pub(crate) fn each(&self) -> impl Iterator<Item = MutexGuard<'_, Shard<V>>> {
        self.shards.iter().map(|s| lock(&s.0))
    }
}

fn lock<V>(m: &Mutex<Shard<V>>) -> MutexGuard<'_, Shard<V>> {
    // A panic while holding the lock cannot leave a shard half-updated in a way that matters
    // more than losing the limiter: keep going with the data as it is.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<V> Shard<V> {
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn get_mut(&mut self, slot: Slot, key: &[u8]) -> Option<&mut V> {
        self.table
            .find_mut(slot.hash, |e| e.1.as_bytes() == key)
            .map(|e| &mut e.2)
    }

    pub(crate) fn remove(&mut self, slot: Slot, key: &[u8]) -> Option<V> {
        let entry = self
            .table
            .find_entry(slot.hash, |e| e.1.as_bytes() == key)
            .ok()?;
        Some(entry.remove().0 .2)
    }

    /// Where `key` sits in the table, to reach it again with [`at`](Self::at) without a
    /// second lookup.
    pub(crate) fn position(&self, slot: Slot, key: &[u8]) -> Option<usize> {
        self.table
            .find_bucket_index(slot.hash, |e| e.1.as_bytes() == key)
    }

    /// The value at `position`, as [`position`](Self::position) found it (nothing moved since).
    pub(crate) fn at(&mut self, position: usize) -> Option<&mut V> {
        self.table.get_bucket_mut(position).map(|e| &mut e.2)
    }

    /// Adds `key` (not present) with `value`; the caller has made room (see [`Self::room`]).
    pub(crate) fn insert(&mut self, slot: Slot, key: &[u8], value: V) -> &mut V {
        let entry =
            self.table
                .insert_unique(slot.hash, (slot.hash, MapKey::new(key), value), |e| e.0);
        &mut entry.into_mut().2
    }

    /// The most entries this shard holds.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    pub(crate) fn contains(&self, slot: Slot, key: &[u8]) -> bool {
        self.table
            .find(slot.hash, |e| e.1.as_bytes() == key)
            .is_some()
    }

    /// Forgets the first entry, among the first `scan` in the table's order, for which
    /// `forget` holds; true when one was forgotten.
    pub(crate) fn forget_one(&mut self, scan: usize, mut forget: impl FnMut(&V) -> bool) -> bool {
        let Some(hash) = self
            .table
            .iter()
            .take(scan)
            .find(|e| forget(&e.2))
            .map(|e| e.0)
        else {
            return false;
        };
        match self.table.find_entry(hash, |e| forget(&e.2)) {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Keeps the entries for which `keep` holds.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&mut V) -> bool) {
        self.table.retain(|e| keep(&mut e.2));
        self.swept_len = self.table.len();
    }

    /// Values of all entries.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.table.iter().map(|e| &e.2)
    }
}

impl<V: Expiring> Shard<V> {
    /// Makes room for one more entry at `now`: sweeps expired entries when the shard is full,
    /// or has doubled since the last sweep and holds more than an eighth of its bound, and
    /// when still full forgets the eighth of the entries that expire soonest (they hold the
    /// least). True when entries were dropped. Amortised over the inserts that refill the
    /// shard, this is O(log n) per new key.
    ///
    /// Below an eighth of the bound, expired entries stay: a key that comes back after its
    /// state expired (many keys each seen now and then) finds its entry, instead of being
    /// swept and added again on every visit.
    pub(crate) fn room(&mut self, now: u64) -> bool {
        self.room_beside(now, &mut ())
    }

    /// Like [`room`](Self::room), for this shard's entries and `beside`'s together: they share
    /// the bound, are swept together, and the soonest-expiring of either are forgotten first.
    pub(crate) fn room_beside(&mut self, now: u64, beside: &mut impl Beside) -> bool {
        let len = self.table.len() + beside.len();
        if len >= self.max || len >= (2 * self.swept_len).max(self.max / 8).max(256) {
            self.table.retain(|e| e.2.expires_at() > now);
            beside.sweep(now);
            self.swept_len = self.table.len() + beside.len();
        }
        let held = self.table.len() + beside.len();
        if held < self.max {
            return held < len;
        }
        let n = (held / 8).max(1);
        let mut by_expiry: Vec<u64> = self.table.iter().map(|e| e.2.expires_at()).collect();
        beside.expiries(&mut by_expiry);
        by_expiry.select_nth_unstable(n - 1);
        let cutoff = by_expiry[n - 1];
        let mut left = n;
        self.table.retain(|e| {
            let forget = left > 0 && e.2.expires_at() <= cutoff;
            left -= usize::from(forget);
            !forget
        });
        beside.forget_expiring(cutoff, &mut left);
        self.evicted += (n - left) as u64;
        self.swept_len = self.table.len() + beside.len();
        true
    }

    /// Sweeps expired entries; true when there is room for one more. Unlike
    /// [`room`](Self::room), never forgets a live entry (for state that must not be lost,
    /// such as a slot held by a running request).
    pub(crate) fn room_without_eviction(&mut self, now: u64) -> bool {
        if self.table.len() >= self.max {
            self.table.retain(|e| e.2.expires_at() > now);
            self.swept_len = self.table.len();
        }
        self.table.len() < self.max
    }

    /// Forgets entries, soonest-expiring first and never `keep`, until their `weight`s add up
    /// to `excess`; returns the weight freed. For bounds on something other than the number
    /// of entries (e.g. log entries).
    pub(crate) fn shed(
        &mut self,
        keep: &[u8],
        excess: usize,
        weight: impl Fn(&V) -> usize,
    ) -> usize {
        let mut order: Vec<(u64, u64)> = self
            .table
            .iter()
            .filter(|e| e.1.as_bytes() != keep && weight(&e.2) > 0)
            .map(|e| (e.2.expires_at(), e.0))
            .collect();
        order.sort_unstable();
        let mut freed = 0;
        for (_, hash) in order {
            if freed >= excess {
                break;
            }
            // Entries sharing a hash (rare): any of them but `keep`.
            if let Ok(entry) = self.table.find_entry(hash, |e| e.1.as_bytes() != keep) {
                let ((_, _, value), _) = entry.remove();
                freed += weight(&value);
                self.evicted += 1;
            }
        }
        self.swept_len = self.table.len();
        freed
    }
}
