//! GCRA keys held as one atomic word each: the theoretical arrival time (TAT), found under a
//! shard's shared lock and compared-and-swapped, so that checks of one key, and of keys of
//! one shard, do not wait for each other, and a denial writes nothing.
//!
//! The table sits beside the store's general one ([`Sharded<Entry>`](super::Sharded)) with as
//! many shards, a key's shard in both chosen by the same hash: shard `i` of both shares one
//! bound on keys. A GCRA key lives in exactly one of them. It is here while it has no refund
//! ledger; whatever needs more than the word (a refund, a reset, a settlement, a place kept)
//! moves it to the general table under that table's shard lock and this one's write lock, and
//! a state left without a ledger comes back. Locks are taken in that order only: the general
//! shard, then this one.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    RwLock, RwLockReadGuard, RwLockWriteGuard,
};

use hashbrown::HashTable;

use super::{Beside, Slot};
use crate::{
    algorithm::{gcra, BucketRate, Outcome},
    store::map_key::MapKey,
};

/// The words, split over read-write-locked shards.
pub(super) struct Words {
    shards: Box<[Padded]>,
}

/// A shard's lock on cache lines of its own.
#[repr(align(128))]
struct Padded(RwLock<WordShard>);

/// One shard of words.
#[derive(Default)]
pub(super) struct WordShard {
    table: HashTable<Word>,
}

/// One key: its hash (so growing the table needs no rehash), its TAT and its bytes (inline
/// while short), in one 64-byte cache line.
#[repr(C, align(64))]
struct Word {
    hash: u64,
    tat: AtomicU64,
    key: MapKey,
}

impl Words {
    /// `shards` shards, as many as the general table's.
    pub(super) fn new(shards: usize) -> Self {
        Self {
            shards: (0..shards)
                .map(|_| Padded(RwLock::new(WordShard::default())))
                .collect(),
        }
    }

    /// The shard of `slot`, shared.
    pub(super) fn read(&self, slot: Slot) -> RwLockReadGuard<'_, WordShard> {
        let lock = &self.shards[slot.shard(self.shards.len())].0;
        // A panic while holding the lock leaves every word whole: keep going.
        lock.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The shard of `slot`, alone.
    pub(super) fn write(&self, slot: Slot) -> RwLockWriteGuard<'_, WordShard> {
        let lock = &self.shards[slot.shard(self.shards.len())].0;
        lock.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Every shard in turn, alone.
    pub(super) fn each(&self) -> impl Iterator<Item = RwLockWriteGuard<'_, WordShard>> {
        self.shards
            .iter()
            .map(|s| s.0.write().unwrap_or_else(|e| e.into_inner()))
    }
}

impl WordShard {
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    fn find(&self, slot: Slot, key: &[u8]) -> Option<&Word> {
        self.table.find(slot.hash(), |w| w.key.as_bytes() == key)
    }

    /// The check of `cost` on `key` at `now`, its word compared-and-swapped (the twin
    /// [`gcra::decide`]); `None` when the shard holds no word for `key`.
    #[inline]
    pub(super) fn decide(
        &self,
        slot: Slot,
        key: &[u8],
        rate: BucketRate,
        now: u64,
        cost: u64,
    ) -> Option<Outcome> {
        let word = self.find(slot, key)?;
        // One word, read and written by read-modify-writes: their order is the word's own,
        // and nothing else is published through it, so no ordering with other memory is
        // needed. A TAT only grows here (the moves that set it back hold the write lock), so
        // a denial on a value read before a concurrent admission's is one the newer value
        // gives too.
        let mut tat = word.tat.load(Ordering::Relaxed);
        loop {
            let (outcome, write) = gcra::decide(rate, Some(tat), now, cost);
            let Some(new) = write else {
                return Some(outcome);
            };
            match word
                .tat
                .compare_exchange_weak(tat, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(outcome),
                Err(held) => tat = held,
            }
        }
    }

    /// Adds `key` (not present) with `tat`; the caller has made room.
    pub(super) fn insert(&mut self, slot: Slot, key: &[u8], tat: u64) {
        let word = Word {
            hash: slot.hash(),
            tat: AtomicU64::new(tat),
            key: MapKey::new(key),
        };
        self.table.insert_unique(slot.hash(), word, |w| w.hash);
    }

    /// Takes `key`'s word out: its TAT.
    pub(super) fn remove(&mut self, slot: Slot, key: &[u8]) -> Option<u64> {
        let entry = self
            .table
            .find_entry(slot.hash(), |w| w.key.as_bytes() == key)
            .ok()?;
        Some(entry.remove().0.tat.into_inner())
    }
}

/// A word expires when its TAT is reached: a check from then on finds a rested key.
impl Beside for WordShard {
    fn len(&self) -> usize {
        self.table.len()
    }

    fn sweep(&mut self, now: u64) {
        self.table.retain(|w| *w.tat.get_mut() > now);
    }

    fn expiries(&self, into: &mut Vec<u64>) {
        into.extend(self.table.iter().map(|w| w.tat.load(Ordering::Relaxed)));
    }

    fn forget_expiring(&mut self, cutoff: u64, left: &mut usize) {
        self.table.retain(|w| {
            let forget = *left > 0 && *w.tat.get_mut() <= cutoff;
            *left -= usize::from(forget);
            !forget
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_takes_one_cache_line() {
        assert_eq!(std::mem::size_of::<Word>(), 64);
        assert_eq!(std::mem::align_of::<Word>(), 64);
    }
}
