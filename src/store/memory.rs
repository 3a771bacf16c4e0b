//! An in-process store with the same decisions as Redis.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};

use super::{BoxFuture, Namespaces, Store};
use crate::{algorithm::MemoryState, Algorithm, Error, Outcome};

const SHARDS: usize = 16;

/// Counters in this process's memory: the same algorithms, integer for integer, as the Redis
/// scripts, without a network hop. Limits are per process, so use it for single-instance apps,
/// development, tests and demos, not behind a load balancer.
///
/// Memory is bounded: expired state is swept as the map grows, the number of keys is capped
/// (default [`MemoryStore::DEFAULT_MAX_KEYS`]), and so is the number of sliding-window log
/// entries held by all keys together (default [`MemoryStore::DEFAULT_MAX_LOG_ENTRIES`]; a
/// log entry takes 16 bytes, a key about 120-230). At either cap, the keys whose state expires
/// soonest are forgotten first (they hold the least); a forgotten key starts afresh with a full
/// quota. So a flood of new keys (random IPv6 addresses, say) costs bounded memory, and can at
/// worst loosen the limit of the keys it pushed out by one quota each. One key's own log is
/// never cut short to make room for itself: it is bounded by its limit. Cloning shares the
/// counters.
///
/// ```
/// use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(2))?);
/// assert!(limiter.check("job-42", 1).await?.allowed);
/// assert!(limiter.check("job-42", 1).await?.allowed);
/// assert!(!limiter.check("job-42", 1).await?.allowed);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    shards: Arc<[Mutex<Shard>; SHARDS]>,
    max_per_shard: usize,
    max_entries_per_shard: usize,
    namespaces: Arc<Namespaces>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::with_max_keys(Self::DEFAULT_MAX_KEYS)
    }
}

#[derive(Default)]
// Aligned so that each shard's lock sits on cache lines of its own: threads working on
// different shards do not slow each other down.
#[repr(align(128))]
struct Shard {
    evicted: u64,
    /// Log entries held by the states in `map` (see [`MemoryState::entries`]).
    entries: usize,
    /// Keyed by the limiter's base key (no allocation to look one up); see [`Entry`].
    map: HashMap<Box<str>, Entry>,
    /// Entries under an alternative key (`base \0 algorithm`), held when two algorithms share
    /// a base key; while there are none, a lookup never builds that key.
    alternative: usize,
    /// Size after the last sweep; the next sweep runs when the map has doubled.
    swept_len: usize,
}

/// One algorithm's state for one base key. Like the algorithms' Redis keys, which carry a
/// suffix per algorithm, two algorithms sharing a prefix keep separate states: the first
/// holds the entry under the base key, another one under `base \0 algorithm`.
struct Entry {
    algorithm: &'static str,
    alternative: bool,
    state: MemoryState,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.len())
            .finish()
    }
}

impl MemoryStore {
    /// Default cap on the number of keys: about 120-130 MB of GCRA or token-bucket state at
    /// the cap (122 and 130 bytes per key, `cargo bench --bench footprint`).
    pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

    /// Default cap on the sliding-window log entries of all keys together: 64 MB of entries at
    /// the cap (16 bytes each, counted as allocated), on top of the keys.
    pub const DEFAULT_MAX_LOG_ENTRIES: usize = 4_000_000;

    /// An empty store with the default key cap.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store holding at most about `max_keys` keys (rounded up to a multiple of 16,
    /// the number of lock shards).
    pub fn with_max_keys(max_keys: usize) -> Self {
        Self {
            shards: Arc::default(),
            max_per_shard: max_keys.div_ceil(SHARDS).max(1),
            max_entries_per_shard: Self::DEFAULT_MAX_LOG_ENTRIES.div_ceil(SHARDS),
            namespaces: Arc::default(),
        }
    }

    /// Caps the sliding-window log entries of all keys together at about `entries` (rounded
    /// up to a multiple of 16, the number of lock shards; default
    /// [`DEFAULT_MAX_LOG_ENTRIES`](Self::DEFAULT_MAX_LOG_ENTRIES)). Entries are counted as
    /// allocated: 16 bytes each.
    pub fn max_log_entries(mut self, entries: usize) -> Self {
        self.max_entries_per_shard = entries.div_ceil(SHARDS).max(1);
        self
    }

    /// Sliding-window log entries held (as allocated), across all keys.
    pub fn log_entries(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries).sum()
    }

    /// Keys forgotten so far because the store was at its cap.
    pub fn evicted(&self) -> u64 {
        self.shards.iter().map(|s| lock(s).evicted).sum()
    }

    /// Number of keys held, including expired ones not swept yet.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[shard_index(key, SHARDS)]
    }

    fn decide_base(
        &self,
        algorithm: &dyn Algorithm,
        base_key: &str,
        cost: u32,
        now: Option<u64>,
    ) -> Result<Outcome, Error> {
        self.decide(algorithm, base_key, cost, now.unwrap_or_else(now_us))
    }

    fn decide(
        &self,
        algorithm: &dyn Algorithm,
        base: &str,
        cost: u32,
        now: u64,
    ) -> Result<Outcome, Error> {
        let name = algorithm.name();
        let mut shard = lock(self.shard(base));
        let shard = &mut *shard;
        // Where this algorithm's state for `base` lives (see `Entry`).
        let other_key: String;
        let (key, alternative) = match shard.map.get(base) {
            Some(e) if e.algorithm == name => (base, false),
            None if shard.alternative == 0 => (base, false),
            held => {
                other_key = format!("{base}\u{0}{name}");
                if held.is_none() && !shard.map.contains_key(other_key.as_str()) {
                    (base, false)
                } else {
                    (other_key.as_str(), true)
                }
            }
        };
        if !shard.map.contains_key(key) {
            let full = shard.map.len() >= self.max_per_shard;
            if full || shard.map.len() >= 2 * shard.swept_len.max(512) {
                shard.sweep(now);
            }
            if shard.map.len() >= self.max_per_shard {
                shard.evict_soonest_expiring();
            }
            let entry = Entry {
                algorithm: name,
                alternative,
                state: MemoryState::default(),
            };
            shard.map.insert(key.into(), entry);
            shard.alternative += usize::from(alternative);
        }
        let Some(entry) = shard.map.get_mut(key) else {
            unreachable!("the key was inserted above");
        };
        let state = &mut entry.state;
        let before = state.entries();
        state.expire(now);
        let outcome = algorithm.decide(state, now, cost);
        let after = state.entries();
        shard.entries = shard.entries + after - before;
        if state.is_empty() {
            shard.map.remove(key);
            shard.alternative -= usize::from(alternative);
        } else if after > before && shard.entries > self.max_entries_per_shard {
            shard.sweep(now);
            if shard.entries > self.max_entries_per_shard {
                shard.evict_logs(key, self.max_entries_per_shard);
            }
        }
        outcome
    }
}

impl Shard {
    fn sweep(&mut self, now: u64) {
        let mut dropped_alternatives = 0;
        let mut entries = 0;
        self.map.retain(|_, e| {
            e.state.expire(now);
            let keep = !e.state.is_empty();
            dropped_alternatives += usize::from(!keep && e.alternative);
            entries += e.state.entries();
            keep
        });
        self.alternative -= dropped_alternatives;
        self.entries = entries;
        self.swept_len = self.map.len();
    }

    /// Forgets keys holding log entries, soonest-expiring first, until the shard holds at most
    /// 7/8 of `max` entries; never `keep` (the key being decided).
    fn evict_logs(&mut self, keep: &str, max: usize) {
        let mut logs: Vec<(u64, usize, Box<str>)> = self
            .map
            .iter()
            .filter(|(k, e)| e.state.entries() > 0 && &***k != keep)
            .map(|(k, e)| (e.state.expires_at(), e.state.entries(), k.clone()))
            .collect();
        logs.sort_unstable_by_key(|(expires, _, _)| *expires);
        let target = max - max / 8;
        for (_, _, k) in logs {
            if self.entries <= target {
                break;
            }
            self.forget(&k);
        }
        self.swept_len = self.map.len();
    }

    /// Removes `key` and what it held from the counts.
    fn forget(&mut self, key: &str) {
        if let Some(e) = self.map.remove(key) {
            self.alternative -= usize::from(e.alternative);
            self.entries -= e.state.entries();
            self.evicted += 1;
        }
    }

    /// Forgets an eighth of the keys (at least one): those whose state expires soonest.
    /// Amortised over the inserts that refill them, this is O(log n) per new key.
    fn evict_soonest_expiring(&mut self) {
        let n = (self.map.len() / 8).max(1);
        let mut by_expiry: Vec<(u64, &Box<str>)> = self
            .map
            .iter()
            .map(|(k, e)| (e.state.expires_at(), k))
            .collect();
        by_expiry.select_nth_unstable(n - 1);
        let doomed: Vec<Box<str>> = by_expiry[..n].iter().map(|(_, k)| (*k).clone()).collect();
        for k in doomed {
            self.forget(&k);
        }
        self.swept_len = self.map.len();
    }
}

/// Which of `shards` lock shards holds `key`. FNV-1a: cheap, and only spreads keys over locks.
pub(crate) fn shard_index(key: &str, shards: usize) -> usize {
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (h as usize) % shards
}

fn lock(m: &Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a shard half-updated in a way that matters
    // more than losing the limiter: keep going with the data as it is.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Microseconds since the Unix epoch, as Redis' `TIME` reports them.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Store for MemoryStore {
    fn check<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        base_key: &'a str,
        cost: u32,
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<Outcome, Error>> {
        Box::pin(std::future::ready(
            self.decide_base(algorithm, base_key, cost, now),
        ))
    }

    fn check_now(
        &self,
        algorithm: &dyn Algorithm,
        base_key: &str,
        cost: u32,
        now: Option<u64>,
    ) -> Option<Result<Outcome, Error>> {
        Some(self.decide_base(algorithm, base_key, cost, now))
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        Some(&self.namespaces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Gcra, Quota};

    #[test]
    fn key_churn_stays_under_the_cap_and_evicts_soonest_expiring_first() {
        let store = MemoryStore::with_max_keys(1_600);
        let long = Gcra::new(Quota::per_hour(1)).unwrap();
        let short = Gcra::new(Quota::per_second(1)).unwrap();
        let t0 = 1_700_000_000_000_000;
        // A key whose state lives an hour.
        assert!(store.decide(&long, "keeper", 1, t0).unwrap().allowed);
        // A flood of one-off keys whose state lives a second.
        for i in 0..100_000u64 {
            store.decide(&short, &format!("ip{i}"), 1, t0 + i).unwrap();
            assert!(store.len() <= 1_600);
        }
        assert!(store.evicted() > 90_000);
        // The long-lived key survived: it is still limited.
        assert!(
            !store
                .decide(&long, "keeper", 1, t0 + 100_000)
                .unwrap()
                .allowed
        );
    }

    /// Two algorithms on one base key keep separate states, as their Redis keys do, also when
    /// the one holding the base key is swept while the other lives on under its own key.
    #[test]
    fn algorithms_sharing_a_base_key_keep_separate_states() {
        use crate::TokenBucket;
        let store = MemoryStore::new();
        let short = Gcra::new(Quota::per_second(1)).unwrap();
        let long = TokenBucket::new(Quota::per_hour(1)).unwrap();
        let t0 = 1_700_000_000_000_000;
        let allowed = |a: &dyn Algorithm, t: u64| store.decide(a, "{rl:k}", 1, t).unwrap().allowed;
        assert!(allowed(&short, t0));
        assert!(
            allowed(&long, t0),
            "the token bucket has a state of its own"
        );
        assert!(!allowed(&long, t0 + 1));
        assert!(!allowed(&short, t0 + 1));
        // The GCRA state expires and is swept; the bucket's lives on.
        let later = t0 + 2_000_000;
        for shard in store.shards.iter() {
            lock(shard).sweep(later);
        }
        assert_eq!(store.len(), 1);
        assert!(!allowed(&long, later), "the bucket lost its state");
        assert!(allowed(&short, later));
        assert!(!allowed(&long, later + 1));
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn expired_keys_are_swept() {
        let store = MemoryStore::new();
        let g = Gcra::new(Quota::per_second(10)).unwrap();
        let t0 = 1_700_000_000_000_000;
        for i in 0..10_000u64 {
            store.decide(&g, &format!("k{i}"), 1, t0).unwrap();
        }
        // One second later every state has expired; new keys trigger sweeps.
        for i in 0..10_000u64 {
            store
                .decide(&g, &format!("n{i}"), 1, t0 + 1_000_000 + i)
                .unwrap();
        }
        assert!(store.len() < 15_000, "{}", store.len());
        assert_eq!(store.evicted(), 0);
    }

    /// Sliding-window logs of many keys stay under the entry cap: each shard holds at most its
    /// share plus the log of the key being decided.
    #[test]
    fn log_entries_stay_under_the_cap() {
        use crate::SlidingWindow;
        let store = MemoryStore::with_max_keys(1_000_000).max_log_entries(1_024);
        let w = SlidingWindow::new(Quota::per_hour(10)).unwrap();
        let t0 = 1_700_000_000_000_000;
        let mut peak = 0;
        for round in 0..10u64 {
            for i in 0..2_000u64 {
                store.decide(&w, &format!("k{i}"), 1, t0 + round).unwrap();
                peak = peak.max(store.log_entries());
            }
        }
        // A log of 10 entries takes at most 16 slots: 16 shards x (64 + 16).
        assert!(peak <= 16 * (64 + 16), "peak {peak}");
        assert!(store.evicted() > 0);
    }

    /// The key being decided is never evicted to make room for its own log: a key whose log
    /// alone exceeds the cap still admits exactly its limit.
    #[test]
    fn a_key_is_never_cut_short_by_its_own_log() {
        use crate::SlidingWindow;
        let store = MemoryStore::new().max_log_entries(160);
        let w = SlidingWindow::new(Quota::per_hour(5_000)).unwrap();
        let t0 = 1_700_000_000_000_000;
        let admitted = (0..6_000u64)
            .filter(|i| store.decide(&w, "big", 1, t0 + i).unwrap().allowed)
            .count();
        assert_eq!(admitted, 5_000);
    }
}
