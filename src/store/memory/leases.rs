//! The in-memory twin of the Redis semaphore scripts (`lua/semaphore_*.lua`): the same rules,
//! on this store's clock (a [`ManualClock`](crate::store::memory::ManualClock) when it has one). It never loses
//! its state, so it keeps no epoch and never pauses admissions; and its calls are never
//! reordered, so a renewal never arrives after its holder's release.

use std::time::Duration;

use super::MemoryStore;
use crate::store::{micros, Acquired, Expiring, KeyBuf, StoreKey};

/// The holders of one key's slots: (holder id, deadline in µs).
#[derive(Default)]
pub(super) struct Holders {
    held: Vec<(Box<str>, u64)>,
}

impl Expiring for Holders {
    fn expires_at(&self) -> u64 {
        self.held.iter().map(|h| h.1).max().unwrap_or(0)
    }
}

impl Holders {
    /// Drops the holders whose deadline is at or before `now`, as the acquire script does.
    fn expire(&mut self, now: u64) {
        self.held.retain(|h| h.1 > now);
    }
}

const KIND: &str = "concurrency";

impl MemoryStore {
    /// Runs `f` on the holders of `key`, removed when left empty. An absent key is created
    /// empty when `create`, else `f` is not run (`None`). The key cap never forgets a key
    /// with live holders: when full of them, a new key is not created (`None`).
    fn with_holders<T>(
        &self,
        key: StoreKey<'_>,
        create: bool,
        f: impl FnOnce(&mut Holders, u64) -> T,
    ) -> Option<T> {
        let now = self.now_us();
        let mut compact = KeyBuf::new();
        key.write_compact(KIND, &mut compact);
        let key = compact.as_bytes();
        let map = &self.inner.leases;
        let slot = map.slot(key);
        let mut shard = map.lock(slot);
        if shard.get_mut(slot, key).is_none() && !(create && shard.room_without_eviction(now)) {
            return None;
        }
        let holders = match shard.get_mut(slot, key) {
            Some(h) => h,
            None => shard.insert(slot, key, Holders::default()),
        };
        let out = f(holders, now);
        if holders.held.is_empty() {
            shard.remove(slot, key);
        }
        Some(out)
    }

    pub(super) fn acquire_now(
        &self,
        key: StoreKey<'_>,
        holder: &str,
        limit: u32,
        lease: Duration,
    ) -> Acquired {
        let acquired = self.with_holders(key, true, |h, now| {
            h.expire(now);
            let deadline = now.saturating_add(micros(lease));
            // The same holder again is admitted once, its lease renewed (as the script does).
            if let Some(held) = h.held.iter_mut().find(|(id, _)| **id == *holder) {
                held.1 = deadline;
                return Acquired::new(true, h.held.len() as u64);
            }
            if h.held.len() >= limit as usize {
                return Acquired::new(false, h.held.len() as u64);
            }
            h.held.push((holder.into(), deadline));
            Acquired::new(true, h.held.len() as u64)
        });
        acquired.unwrap_or_else(|| {
            tracing::warn!("concurrency limit: the store's key cap is full of keys with running requests; refusing a new key");
            Acquired::new(false, 0)
        })
    }

    /// `false` when `holder` held no slot (its lease ran out unrenewed): it is put back, counted
    /// even over the limit, as the renewal script does.
    pub(super) fn renew_now(&self, key: StoreKey<'_>, holder: &str, lease: Duration) -> bool {
        let renewed = self.with_holders(key, true, |h, now| {
            // A lease past its deadline no longer counts, even if no acquire swept it yet.
            h.expire(now);
            let deadline = now.saturating_add(micros(lease));
            match h.held.iter_mut().find(|(id, _)| **id == *holder) {
                Some(held) => {
                    held.1 = deadline;
                    true
                }
                None => {
                    h.held.push((holder.into(), deadline));
                    false
                }
            }
        });
        renewed.unwrap_or_else(|| {
            tracing::warn!("concurrency limit: the store's key cap is full of keys with running requests; a running request could not be counted again");
            false
        })
    }

    /// Slot holders under all keys, expired ones not swept yet included (for tests and
    /// health checks).
    pub fn lease_holders(&self) -> usize {
        self.inner
            .leases
            .each()
            .map(|s| s.values().map(|h| h.held.len()).sum::<usize>())
            .sum()
    }
}

impl MemoryStore {
    /// Gives `holder`'s slot back (nothing when it holds none).
    pub(super) fn release_holder(&self, key: StoreKey<'_>, holder: &str) {
        self.with_holders(key, false, |h, _| h.held.retain(|(id, _)| **id != *holder));
    }

    /// Gives every slot of `key` back.
    pub(super) fn release_every_holder(&self, key: StoreKey<'_>) {
        self.with_holders(key, false, |h, _| h.held.clear());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{extract::Key, store::clock::ManualClock};

    #[test]
    fn admits_up_to_the_limit_expires_renews_and_releases() {
        let clock = ManualClock::starting_at(Duration::from_secs(1_000));
        let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let k = Key::from("k");
        let key = StoreKey::bounded("t", Some(&k), 128);
        let lease = Duration::from_secs(10);
        assert!(store.acquire_now(key, "a", 2, lease).admitted);
        assert_eq!(
            store.acquire_now(key, "b", 2, lease),
            Acquired::new(true, 2)
        );
        assert_eq!(
            store.acquire_now(key, "c", 2, lease),
            Acquired::new(false, 2)
        );
        clock.advance(Duration::from_secs(6));
        assert!(store.renew_now(key, "a", lease));
        // `b` expires at 10 s exactly: gone at its deadline, so `c` takes its slot.
        clock.advance(Duration::from_secs(4));
        assert_eq!(
            store.acquire_now(key, "c", 2, lease),
            Acquired::new(true, 2)
        );
        // `b` still runs: its renewal puts it back, over the limit, and nobody else gets in
        // until enough holders end.
        assert!(!store.renew_now(key, "b", lease));
        assert_eq!(
            store.acquire_now(key, "d", 2, lease),
            Acquired::new(false, 3)
        );
        store.release_holder(key, "a");
        assert_eq!(
            store.acquire_now(key, "d", 2, lease),
            Acquired::new(false, 2)
        );
        store.release_holder(key, "b");
        store.release_holder(key, "nobody");
        assert_eq!(store.lease_holders(), 1);
        store.release_holder(key, "c");
        assert_eq!(store.lease_holders(), 0);
        // A renewal of a key with no holder left creates it again.
        assert!(!store.renew_now(key, "e", lease));
        assert_eq!(store.lease_holders(), 1);
        store.release_holder(key, "e");
        assert_eq!(store.lease_holders(), 0);
        assert!(
            store.inner.leases.each().all(|s| s.len() == 0),
            "empty keys stay"
        );
    }
}
