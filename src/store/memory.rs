//! An in-process store with the same decisions as Redis.

pub use super::clock::ManualClock;

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{SystemTime, UNIX_EPOCH},
};

use super::{
    unsupported, Acquired, Backend, Beside, BoxFuture, Gate, KeyBuf, Learned, Ledger, Namespaces,
    Pace, Peeked, Scheduled, Sent, Shard, Sharded, Slot, SlotTerms, Slots, Store, StoreKey,
    Upstreams,
};
use crate::{
    algorithm::{gcra, token_bucket, Algorithm, BucketRate, Kind, MemoryState, Outcome, Reset},
    decision::Charge,
    error::{ConfigError, Error},
};

mod leases;
mod offences;
mod upstream;
mod words;

use words::Words;

const SHARDS: usize = 16;

/// Counters in this process's memory: the same algorithms, integer for integer, as the Redis
/// scripts, without a network hop. Limits are per process, so use it for single-instance apps,
/// development, tests and demos, not behind a load balancer.
///
/// A check looks its key up by a hash computed once, in one of 16 lock shards, without
/// allocating: keys of up to 46 bytes (with the limiter's namespace) are held in the map's
/// slot, and a key whose state expired keeps its slot until the map has grown past an eighth
/// of its cap, so that a key coming back now and then is found again. A [`Gcra`](crate::Gcra)
/// key is one atomic word (its theoretical arrival time) in a table of its own, found under
/// its shard's shared lock and compared-and-swapped: checks of one key do not wait for each
/// other, and a denial writes nothing. The other algorithms' state, and a GCRA key whose
/// refunds or reset keep a ledger, are held behind the shard's exclusive lock.
///
/// Memory is bounded: beyond that eighth, expired state is swept as the map grows; the
/// number of keys is capped (default [`MemoryStore::DEFAULT_MAX_KEYS`]), and so is the number
/// of sliding-window log
/// entries held by all keys together (default [`MemoryStore::DEFAULT_MAX_LOG_ENTRIES`]). A
/// GCRA key takes about 85 bytes of heap, a token-bucket key about 127, a sliding-window key
/// about 257
/// plus 30 per entry in its log (287 with one entry, 575 with ten; `cargo bench --bench
/// footprint`; a key longer than 46 bytes with its namespace adds its length). At either cap, the keys whose state expires
/// soonest are forgotten first (they hold the least); a forgotten key starts afresh with a full
/// quota. So a flood of new keys (random IPv6 addresses, say) costs bounded memory, and can at
/// worst loosen the limit of the keys it pushed out by one quota each. One key's own log is
/// never cut short to make room for itself: it is bounded by its limit. Cloning shares the
/// counters. Set the caps, or a [`ManualClock`] for tests, with [`MemoryStore::builder`].
///
/// ```
/// use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(2))?)?;
/// assert!(limiter.check("job-42", 1).await?.allowed);
/// assert!(limiter.check("job-42", 1).await?.allowed);
/// assert!(!limiter.check("job-42", 1).await?.allowed);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Every key's state but a GCRA key's without a refund ledger.
    states: Sharded<Entry>,
    /// A GCRA key's TAT while it has no refund ledger, beside `states` (see `words.rs`).
    words: Words,
    /// The holders of concurrency slots, per key (see [`Backend::acquire`]).
    leases: Sharded<leases::Holders>,
    /// What upstreams said, per key (see [`Backend::take`]).
    upstreams: Sharded<upstream::Said>,
    /// Bans, per key (see [`Backend::ban`]): when each ends.
    bans: Sharded<Ban>,
    /// Bans held (live or not yet swept): while none is, a check looks none up.
    bans_held: AtomicUsize,
    /// Refusals counted toward automatic bans, and the last ban of each key (see
    /// [`Backend::count_refusal`]).
    offences: Sharded<super::offences::Offences>,
    /// Each namespace's marker (see [`Backend::mark`]): a process's memory is never lost
    /// while it runs, so a marker set stays.
    markers: std::sync::Mutex<std::collections::HashMap<Box<str>, Vec<u8>>>,
    /// Each namespace's published top keys (see [`Backend::publish_top`]).
    tops: std::sync::Mutex<std::collections::HashMap<Box<str>, TopSnapshots>>,
    max_entries_per_shard: usize,
    namespaces: Namespaces,
    /// The store's time, when not the wall clock.
    clock: Option<ManualClock>,
}

/// One namespace's published top keys: per instance, when it published (real time) and its
/// snapshot.
type TopSnapshots = std::collections::HashMap<Box<str>, (std::time::Instant, Vec<u8>)>;

/// One key's state. Keys carry the algorithm's name, so two algorithms on the same
/// namespace and key keep separate states, as their Redis keys do.
#[derive(Default)]
struct Entry {
    state: MemoryState,
}

impl Entry {
    fn entries(&self) -> usize {
        self.state.entries()
    }

    /// Runs `f` on `key`'s state in `shard` at `now` (see [`Entry::run`]), the entry inserted
    /// empty when the shard holds none (room made first: expired keys swept, the weight
    /// counted again), and counts its growth in the shard's weight. One lookup for a key
    /// held, the common case.
    fn run_held_or_new<T>(
        (shard, words): (&mut Shard<Entry>, &Words),
        slot: Slot,
        key: &[u8],
        now: u64,
        f: impl FnOnce(&mut MemoryState) -> T,
    ) -> (T, isize, bool) {
        let held = shard.position(slot, key);
        if held.is_none() {
            Entry::make_room(shard, &mut words.write(slot), now);
        }
        let entry = match held.and_then(|at| shard.at(at)) {
            Some(entry) => entry,
            None => shard.insert(slot, key, Entry::default()),
        };
        let (out, grown, empty) = entry.run(now, f);
        shard.weight = shard.weight.wrapping_add_signed(grown);
        (out, grown, empty)
    }

    /// Makes room in `shard` and `words` (the same shard of both tables) for one more key at
    /// `now`, the weight counted again when entries went.
    fn make_room(shard: &mut Shard<Entry>, words: &mut words::WordShard, now: u64) {
        if shard.room_beside(now, words) {
            shard.weight = shard.values().map(Entry::entries).sum();
        }
    }

    /// Runs `f` on the state at `now`, its expired value cleared first: what `f` returned, by
    /// how many log entries the state grew (or shrank), and whether it is left empty.
    fn run<T>(&mut self, now: u64, f: impl FnOnce(&mut MemoryState) -> T) -> (T, isize, bool) {
        let before = self.entries();
        self.state.expire(now);
        let out = f(&mut self.state);
        let grown = self.entries() as isize - before as isize;
        (out, grown, self.state.is_empty())
    }
}

/// When a key's ban ends, in microseconds on the store's clock.
struct Ban(u64);

impl super::Expiring for Ban {
    fn expires_at(&self) -> u64 {
        self.0
    }
}

impl super::Expiring for Entry {
    fn expires_at(&self) -> u64 {
        self.state.expires_at()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStoreBuilder::default().store()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.len())
            .finish()
    }
}

impl MemoryStore {
    /// Default cap on the number of keys: about 85 MB of GCRA state or 130 MB of token-bucket
    /// state at the cap (85 and 127 bytes per key, keys held in place, `cargo bench --bench
    /// footprint`).
    pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

    /// Default cap on the sliding-window log entries of all keys together: about 120 MB of
    /// entries at the cap (24 bytes each, about 30 with the logs' spare capacity), on top of
    /// the keys.
    pub const DEFAULT_MAX_LOG_ENTRIES: usize = 4_000_000;

    /// An empty store with the default caps, on the wall clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// Settings for a store: its caps and its clock (see [`MemoryStoreBuilder`]).
    ///
    /// ```
    /// use tower_redis_ratelimit::{MemoryStore, store::memory::ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let store = MemoryStore::builder()
    ///     .max_keys(10_000)
    ///     .max_log_entries(100_000)
    ///     .clock(clock.clone())
    ///     .build()?;
    /// let err = MemoryStore::builder().max_keys(0).build().unwrap_err();
    /// assert_eq!(err.field(), "max_keys");
    /// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
    /// ```
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::default()
    }

    /// Microseconds since the Unix epoch on this store's clock.
    #[inline]
    fn now_us(&self) -> u64 {
        match &self.inner.clock {
            Some(clock) => clock.now_us(),
            None => now_us(),
        }
    }

    /// Keys forgotten so far because the store was at a cap.
    pub fn evicted(&self) -> u64 {
        self.inner.states.each().map(|s| s.evicted).sum()
    }

    /// Number of keys held, including expired ones not swept yet.
    pub fn len(&self) -> usize {
        let states: usize = self.inner.states.each().map(|s| s.len()).sum();
        states + self.inner.words.each().map(|w| w.len()).sum::<usize>()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sliding-window log entries held (as allocated), across all keys.
    pub fn log_entries(&self) -> usize {
        self.inner.states.each().map(|s| s.weight).sum()
    }

    #[inline]
    fn decide(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        cost: u32,
        now: u64,
    ) -> Result<Outcome, Error> {
        // As in the scripts: a custom algorithm's checks read no ban.
        if !algorithm.rule().is_script() {
            if let Some(left) = self.ban_left(key, now) {
                return Ok(Outcome::banned(left));
            }
        }
        let mut compact = KeyBuf::new();
        key.write_compact(algorithm.name(), &mut compact);
        self.decide_compact(algorithm, compact.as_bytes(), cost, now)
    }

    /// The twin of `lua/gcra_schedule.lua` and `lua/token_bucket_schedule.lua` (see
    /// [`Backend::schedule`]).
    fn schedule_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        (cost, budget_us): (u32, u64),
        pace: Pace,
        now: u64,
    ) -> Result<Scheduled, Error> {
        let (rate, gcra) = match algorithm.rule().kind() {
            Kind::Gcra(gcra) => (gcra.rate(), true),
            Kind::TokenBucket(bucket) => (bucket.rate(), false),
            _ => {
                return Err(Error::Unsupported(
                    "only GCRA and the token bucket schedule calls",
                ))
            }
        };
        if cost == 0 {
            return Err(Error::InvalidInput("cost must be at least 1"));
        }
        if let Some(left) = self.ban_left(key, now) {
            return Ok(Scheduled {
                outcome: Outcome::banned(left),
                wait_us: 0,
            });
        }
        let mut compact = KeyBuf::new();
        key.write_compact(algorithm.name(), &mut compact);
        let key = compact.as_bytes();
        let call = (u64::from(cost), budget_us);
        self.in_general(algorithm, key, now, |shard, slot, words| {
            Self::schedule_in(shard, words, (slot, key), (rate, gcra), call, pace, now)
        })
    }

    /// [`schedule_now`](Self::schedule_now) on `key`'s shard of the general table.
    fn schedule_in(
        shard: &mut Shard<Entry>,
        words: &Words,
        (slot, key): (Slot, &[u8]),
        (rate, gcra): (BucketRate, bool),
        call: (u64, u64),
        pace: Pace,
        now: u64,
    ) -> Result<Scheduled, Error> {
        let (scheduled, _, empty) = Entry::run_held_or_new((shard, words), slot, key, now, |s| {
            if !gcra {
                let stored = s.bucket()?;
                let (scheduled, write) = token_bucket::schedule(rate, stored, now, call, pace);
                if let Some((bucket, ttl)) = write {
                    s.put_bucket(bucket, now, ttl);
                }
                return Ok(scheduled);
            }
            let (scheduled, write) =
                super::reserved::gcra_schedule(rate, s.tat()?, now, call, pace);
            if let Some(tat) = write {
                s.put_tat(tat, now, tat - now);
            }
            Ok(scheduled)
        });
        if empty {
            shard.remove(slot, key);
        }
        scheduled
    }

    #[inline]
    fn decide_compact(
        &self,
        algorithm: &dyn Algorithm,
        key: &[u8],
        cost: u32,
        now: u64,
    ) -> Result<Outcome, Error> {
        if let Some(rate) = word_rate(algorithm) {
            return self.decide_gcra(algorithm, rate, key, cost, now);
        }
        let inner = &*self.inner;
        let slot = inner.states.slot(key);
        let mut shard = inner.states.lock(slot);
        let shard = &mut *shard;
        let (outcome, grown, empty) =
            Entry::run_held_or_new((shard, &inner.words), slot, key, now, |s| {
                algorithm.decide(s, now, cost)
            });
        if empty {
            shard.remove(slot, key);
        } else if grown > 0 && shard.weight > inner.max_entries_per_shard {
            // A sliding-window log grew past the shard's share of the cap.
            Entry::make_room(shard, &mut inner.words.write(slot), now);
            let max = inner.max_entries_per_shard;
            if shard.weight > max {
                let freed = shard.shed(key, shard.weight - (max - max / 8), Entry::entries);
                shard.weight -= freed;
            }
        }
        outcome
    }
}

impl MemoryStore {
    /// A GCRA check: on `key`'s word under its shard's shared lock when it has one (the
    /// common case: one lookup, no lock held alone, a denial writes nothing); else on its
    /// state in the general table if it has one with a refund ledger; else on a new word, or
    /// on the word of a bare state moved from the general table.
    #[inline]
    fn decide_gcra(
        &self,
        algorithm: &dyn Algorithm,
        rate: BucketRate,
        key: &[u8],
        cost: u32,
        now: u64,
    ) -> Result<Outcome, Error> {
        let inner = &*self.inner;
        let slot = inner.states.slot(key);
        let units = u64::from(cost);
        if let Some(outcome) = inner.words.read(slot).decide(slot, key, rate, now, units) {
            return Ok(outcome);
        }
        // Every move between the tables holds the general shard's lock: while it is held
        // here, the key stays where it is found.
        let mut shard = inner.states.lock(slot);
        let shard = &mut *shard;
        let mut moved = None;
        if let Some(entry) = shard.get_mut(slot, key) {
            match entry.state.bare_tat_at(now) {
                Some(tat) => moved = Some(tat),
                None => {
                    let (outcome, grown, empty) =
                        entry.run(now, |s| algorithm.decide(s, now, cost));
                    shard.weight = shard.weight.wrapping_add_signed(grown);
                    if empty {
                        shard.remove(slot, key);
                    }
                    return outcome;
                }
            }
            shard.remove(slot, key);
        }
        let mut words = inner.words.write(slot);
        if let Some(outcome) = words.decide(slot, key, rate, now, units) {
            return Ok(outcome); // another check added the word meanwhile
        }
        let stored = moved.flatten();
        let (outcome, write) = gcra::decide(rate, stored, now, units);
        if let Some(tat) = write.or(stored.filter(|&t| t > now)) {
            if moved.is_none() {
                Entry::make_room(shard, &mut words, now);
            }
            words.insert(slot, key, tat);
        }
        Ok(outcome)
    }

    /// Runs `f` on the general table's shard of `key` (compact): for a GCRA algorithm, with
    /// the key's word moved into that table first, and its state moved back after when it is
    /// left bare (a TAT without a refund ledger, or nothing).
    fn in_general<T>(
        &self,
        algorithm: &dyn Algorithm,
        key: &[u8],
        now: u64,
        f: impl FnOnce(&mut Shard<Entry>, Slot, &Words) -> T,
    ) -> T {
        let inner = &*self.inner;
        let slot = inner.states.slot(key);
        let mut shard = inner.states.lock(slot);
        let shard = &mut *shard;
        let gcra = word_rate(algorithm).is_some();
        if gcra {
            if let Some(tat) = inner.words.write(slot).remove(slot, key) {
                let state = MemoryState::of_tat(tat);
                shard.insert(slot, key, Entry { state });
            }
        }
        let out = f(shard, slot, &inner.words);
        if gcra {
            if let Some(entry) = shard.get_mut(slot, key) {
                if let Some(bare) = entry.state.bare_tat_at(now) {
                    shard.remove(slot, key);
                    if let Some(tat) = bare.filter(|&t| t > now) {
                        inner.words.write(slot).insert(slot, key, tat);
                    }
                }
            }
        }
        out
    }
}

/// The rate of a GCRA whose keys are words: the built-in [`Gcra`](crate::Gcra), under its own
/// name (or shared behind an `Arc`). Another algorithm whose rule is GCRA's but whose name is
/// its own may decide differently in memory (its [`Algorithm::decide`] is what runs here): its
/// keys stay in the general table.
fn word_rate(algorithm: &dyn Algorithm) -> Option<BucketRate> {
    match algorithm.rule().kind() {
        Kind::Gcra(gcra) if algorithm.name() == "gcra" => Some(gcra.rate()),
        _ => None,
    }
}

/// Settings for a [`MemoryStore`], from [`MemoryStore::builder`]: how many keys and log entries
/// it holds at most, and its clock. Each setter takes the value as given; [`build`](Self::build)
/// checks them all, and a value that cannot work is a [`ConfigError`] naming the field.
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder {
    max_keys: usize,
    max_log_entries: usize,
    clock: Option<ManualClock>,
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        Self {
            max_keys: MemoryStore::DEFAULT_MAX_KEYS,
            max_log_entries: MemoryStore::DEFAULT_MAX_LOG_ENTRIES,
            clock: None,
        }
    }
}

impl MemoryStoreBuilder {
    /// Holds at most about `keys` keys (rounded up to a multiple of 16, the number of lock
    /// shards; default [`MemoryStore::DEFAULT_MAX_KEYS`]); at least 1. The same cap applies
    /// apart to concurrency slots and to what upstreams said.
    pub fn max_keys(mut self, keys: usize) -> Self {
        self.max_keys = keys;
        self
    }

    /// Holds at most about `entries` sliding-window log entries, all keys together (rounded
    /// up to a multiple of 16; default [`MemoryStore::DEFAULT_MAX_LOG_ENTRIES`]); at least 1.
    /// Entries are counted as allocated: 24 bytes each (about 30 on the heap with the logs'
    /// spare capacity).
    pub fn max_log_entries(mut self, entries: usize) -> Self {
        self.max_log_entries = entries;
        self
    }

    /// Decides on `clock`, which moves only when a test says (see [`ManualClock`]), instead
    /// of the wall clock. Limiters built on the store keep no deny cache.
    pub fn clock(mut self, clock: ManualClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The store, or a [`ConfigError`] naming the first setting that cannot work.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first setting that cannot work.
    pub fn build(self) -> Result<MemoryStore, ConfigError> {
        if self.max_keys == 0 {
            return Err(ConfigError::new("max_keys", "must be at least 1"));
        }
        if self.max_log_entries == 0 {
            return Err(ConfigError::new("max_log_entries", "must be at least 1"));
        }
        Ok(self.store())
    }

    /// The store of settings known to be valid.
    fn store(self) -> MemoryStore {
        MemoryStore {
            inner: Arc::new(Inner {
                states: Sharded::new(SHARDS, self.max_keys),
                words: Words::new(SHARDS),
                leases: Sharded::new(SHARDS, self.max_keys),
                upstreams: Sharded::new(SHARDS, self.max_keys),
                bans: Sharded::new(SHARDS, self.max_keys),
                bans_held: AtomicUsize::new(0),
                offences: Sharded::new(SHARDS, self.max_keys),
                markers: Default::default(),
                tops: Default::default(),
                max_entries_per_shard: self.max_log_entries.div_ceil(SHARDS).max(1),
                namespaces: Namespaces::new(),
                clock: self.clock,
            }),
        }
    }
}

impl MemoryStore {
    /// The time `key`'s ban has left at `now`, if it is banned.
    #[inline]
    fn ban_left(&self, key: StoreKey<'_>, now: u64) -> Option<u64> {
        match self.inner.bans_held.load(Ordering::Relaxed) {
            0 => None,
            _ => self.ban_held(key, now),
        }
    }

    /// [`ban_left`](Self::ban_left) while the store holds bans.
    #[cold]
    fn ban_held(&self, key: StoreKey<'_>, now: u64) -> Option<u64> {
        let mut compact = KeyBuf::new();
        key.write_compact("ban", &mut compact);
        let bans = &self.inner.bans;
        let slot = bans.slot(compact.as_bytes());
        let mut shard = bans.lock(slot);
        let ends = shard.get_mut(slot, compact.as_bytes())?.0;
        (ends > now).then(|| ends - now)
    }

    /// Bans `key` until `ends`, or lifts its ban (`None`).
    fn set_ban(&self, key: StoreKey<'_>, ends: Option<u64>, now: u64) -> Result<(), Error> {
        let mut compact = KeyBuf::new();
        key.write_compact("ban", &mut compact);
        let inner = &*self.inner;
        let slot = inner.bans.slot(compact.as_bytes());
        let mut shard = inner.bans.lock(slot);
        let before = shard.len();
        match ends {
            Some(ends) => {
                if let Some(ban) = shard.get_mut(slot, compact.as_bytes()) {
                    ban.0 = ends;
                } else if shard.room_without_eviction(now) {
                    shard.insert(slot, compact.as_bytes(), Ban(ends));
                } else {
                    return Err(Error::Unsupported(
                        "the store holds as many bans as its key cap allows",
                    ));
                }
            }
            None => {
                shard.remove(slot, compact.as_bytes());
            }
        }
        let after = shard.len();
        if after >= before {
            inner.bans_held.fetch_add(after - before, Ordering::Relaxed);
        } else {
            inner.bans_held.fetch_sub(before - after, Ordering::Relaxed);
        }
        Ok(())
    }

    /// `key`'s state as a check at `now` would see it, spending nothing.
    fn peek_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        now: u64,
    ) -> Result<Peeked, Error> {
        let banned_us = self.ban_left(key, now).unwrap_or(0);
        let mut compact = KeyBuf::new();
        key.write_compact(algorithm.name(), &mut compact);
        let key = compact.as_bytes();
        let outcome = self.in_general(algorithm, key, now, |shard, slot, _| {
            match shard.get_mut(slot, key) {
                Some(entry) => {
                    let (outcome, grown, _) =
                        entry.run(now, |s| crate::algorithm::peek(algorithm, s, now));
                    shard.weight = shard.weight.wrapping_add_signed(grown);
                    outcome
                }
                None => crate::algorithm::peek(algorithm, &mut MemoryState::default(), now),
            }
        })?;
        Ok(Peeked { outcome, banned_us })
    }

    /// Resets `key`'s state under `algorithm` at `now`, as `lua/reset.lua` does: a GCRA,
    /// token-bucket or multi-limit state goes, and its refund ledgers become floors just after
    /// `now` (a refund of a check admitted before gives nothing back); a sliding-window log
    /// empties, keeping its newest time and last sequence number (no entry written after bears
    /// the name of one written before); a custom algorithm's state goes.
    fn reset_now(&self, algorithm: &dyn Algorithm, key: StoreKey<'_>, now: u64) {
        let mut compact = KeyBuf::new();
        key.write_compact(algorithm.name(), &mut compact);
        let key = compact.as_bytes();
        self.in_general(algorithm, key, now, |shard, slot, words| {
            Self::reset_in(algorithm, (shard, words), (slot, key), now);
        });
    }

    /// [`reset_now`](Self::reset_now) on `key`'s shard of the general table.
    fn reset_in(
        algorithm: &dyn Algorithm,
        (shard, words): (&mut Shard<Entry>, &Words),
        (slot, key): (Slot, &[u8]),
        now: u64,
    ) {
        // How long a charge admitted before now may hold part of each limit's time.
        let leads = match algorithm.rule().twin().map(|twin| twin.reset()) {
            Some(Reset::Floors(leads)) => leads,
            Some(Reset::EmptyLog) => {
                if let Some(entry) = shard.get_mut(slot, key) {
                    let ((), grown, empty) = entry.run(now, MemoryState::empty_log);
                    shard.weight = shard.weight.wrapping_add_signed(grown);
                    if empty {
                        shard.remove(slot, key);
                    }
                }
                return;
            }
            Some(Reset::Window) => {
                if let Some(entry) = shard.get_mut(slot, key) {
                    entry.run(now, |s| s.zero_window(now));
                }
                return;
            }
            None => {
                if let Some(entry) = shard.remove(slot, key) {
                    shard.weight = shard.weight.saturating_sub(entry.entries());
                }
                return;
            }
        };
        Entry::run_held_or_new((shard, words), slot, key, now, |s| {
            s.rest_with_floors(&leads, now)
        });
    }

    /// The algorithm's refund twin on `key`'s state, if it holds one.
    fn give_back(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        charge: &Charge,
        now: u64,
    ) -> Result<bool, Error> {
        let mut compact = KeyBuf::new();
        key.write_compact(algorithm.name(), &mut compact);
        let key = compact.as_bytes();
        self.in_general(algorithm, key, now, |shard, slot, _| {
            let Some(entry) = shard.get_mut(slot, key) else {
                return Ok(false);
            };
            let (given, grown, empty) = entry.run(now, |s| algorithm.refund(s, now, charge));
            shard.weight = shard.weight.wrapping_add_signed(grown);
            if empty {
                shard.remove(slot, key);
            }
            given
        })
    }
}

impl MemoryStore {
    /// The algorithm's settlement twin on `key`'s state (made when a settlement up finds
    /// none). A ban stays as it is: it is kept apart from the state.
    fn settle_state(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        charge: &Charge,
        actual: u32,
        now: u64,
    ) -> Result<bool, Error> {
        let mut compact = KeyBuf::new();
        key.write_compact(algorithm.name(), &mut compact);
        let key = compact.as_bytes();
        self.in_general(algorithm, key, now, |shard, slot, words| {
            let (settled, _, empty) = Entry::run_held_or_new((shard, words), slot, key, now, |s| {
                algorithm.settle(s, now, charge, actual)
            });
            if empty {
                shard.remove(slot, key);
            }
            settled
        })
    }
}

/// Microseconds since the Unix epoch, as Redis' `TIME` reports them.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Store for MemoryStore {}

impl Backend for MemoryStore {
    fn check<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<Outcome, Error>> {
        let result = self.decide(algorithm, key, cost, now.unwrap_or_else(|| self.now_us()));
        Box::pin(std::future::ready(result))
    }

    #[inline]
    fn check_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        cost: u32,
        now: Option<u64>,
    ) -> Option<Result<Outcome, Error>> {
        Some(self.decide(algorithm, key, cost, now.unwrap_or_else(|| self.now_us())))
    }

    fn refund<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        charge: &'a Charge,
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let result = self.give_back(algorithm, key, charge, now.unwrap_or_else(|| self.now_us()));
        Box::pin(std::future::ready(result))
    }

    fn refund_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        charge: &Charge,
        now: Option<u64>,
    ) -> Option<Result<bool, Error>> {
        Some(self.give_back(algorithm, key, charge, now.unwrap_or_else(|| self.now_us())))
    }

    fn settle<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        charge: &'a Charge,
        actual: u32,
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let now = now.unwrap_or_else(|| self.now_us());
        let result = self.settle_state(algorithm, key, charge, actual, now);
        Box::pin(std::future::ready(result))
    }

    fn settle_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        charge: &Charge,
        actual: u32,
        now: Option<u64>,
    ) -> Option<Result<bool, Error>> {
        let now = now.unwrap_or_else(|| self.now_us());
        Some(self.settle_state(algorithm, key, charge, actual, now))
    }

    /// Unit leases save round trips to a remote store; in memory there are none to save.
    fn reserve<'a>(
        &'a self,
        _algorithm: &'a dyn Algorithm,
        _key: StoreKey<'a>,
        _cost: u32,
        _up_to: u32,
        _now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<super::Reserved, Error>> {
        unsupported("this store cannot reserve units")
    }

    fn schedules(&self) -> bool {
        true
    }

    fn schedule<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        call: (u32, u64),
        pace: Pace,
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<Scheduled, Error>> {
        let now = now.unwrap_or_else(|| self.now_us());
        Box::pin(std::future::ready(
            self.schedule_now(algorithm, key, call, pace, now),
        ))
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        Some(&self.inner.namespaces)
    }

    fn peek<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<Peeked, Error>> {
        let result = self.peek_now(algorithm, key, now.unwrap_or_else(|| self.now_us()));
        Box::pin(std::future::ready(result))
    }

    fn reset<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.reset_now(algorithm, key, now.unwrap_or_else(|| self.now_us()));
        Box::pin(std::future::ready(Ok(())))
    }

    fn ban<'a>(
        &'a self,
        key: StoreKey<'a>,
        duration_us: u64,
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let now = now.unwrap_or_else(|| self.now_us());
        let result = self.set_ban(key, Some(now.saturating_add(duration_us)), now);
        if result.is_ok() {
            self.forget_refusals(key);
        }
        Box::pin(std::future::ready(result))
    }

    fn count_refusal<'a>(
        &'a self,
        key: StoreKey<'a>,
        terms: &'a super::offences::BanTerms,
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<super::offences::Counted, Error>> {
        let now = now.unwrap_or_else(|| self.now_us());
        Box::pin(std::future::ready(self.count_refusal_now(key, terms, now)))
    }

    fn mark<'a>(
        &'a self,
        namespace: &'a str,
        token: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, Error>> {
        let mut markers = self
            .inner
            .markers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let held = markers
            .entry(namespace.into())
            .or_insert_with(|| token.to_vec())
            .clone();
        Box::pin(std::future::ready(Ok(held)))
    }

    fn publish_top<'a>(
        &'a self,
        namespace: &'a str,
        instance: &'a str,
        snapshot: &'a [u8],
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let now = std::time::Instant::now();
        let mut tops = self
            .inner
            .tops
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let published = tops.entry(namespace.into()).or_default();
        published.retain(|_, (at, _)| now.duration_since(*at) < ttl);
        published.insert(instance.into(), (now, snapshot.to_vec()));
        Box::pin(std::future::ready(Ok(())))
    }

    fn read_tops<'a>(
        &'a self,
        namespace: &'a str,
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<crate::store::Snapshots, Error>> {
        let now = std::time::Instant::now();
        let tops = self
            .inner
            .tops
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fresh = tops
            .get(namespace)
            .into_iter()
            .flatten()
            .filter(|(_, (at, _))| now.duration_since(*at) < ttl)
            .map(|(instance, (_, snapshot))| (instance.as_bytes().to_vec(), snapshot.clone()))
            .collect();
        Box::pin(std::future::ready(Ok(fresh)))
    }

    fn unban<'a>(&'a self, key: StoreKey<'a>) -> BoxFuture<'a, Result<(), Error>> {
        let result = self.set_ban(key, None, self.now_us());
        Box::pin(std::future::ready(result))
    }

    fn manual_clock(&self) -> bool {
        self.inner.clock.is_some()
    }

    fn clock(&self) -> Option<ManualClock> {
        self.inner.clock.clone()
    }

    fn regional(&self) -> bool {
        false
    }

    /// Answers at once: any store timeout will do.
    fn check_timeout(&self, _timeout: std::time::Duration) -> Result<(), ConfigError> {
        Ok(())
    }
}

impl Slots for MemoryStore {
    fn release_all<'a>(&'a self, key: StoreKey<'a>) -> BoxFuture<'a, Result<(), Error>> {
        self.release_every_holder(key);
        Box::pin(std::future::ready(Ok(())))
    }

    fn acquire<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        terms: &'a SlotTerms,
    ) -> BoxFuture<'a, Result<Acquired, Error>> {
        let acquired = self.acquire_now(key, holder, terms.limit(), terms.ttl());
        Box::pin(std::future::ready(Ok(acquired)))
    }

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        terms: &'a SlotTerms,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let renewed = self.renew_now(key, holder, terms.ttl());
        Box::pin(std::future::ready(Ok(renewed)))
    }

    /// A renewal here never arrives after its holder's release (calls are not reordered in
    /// memory), so `late_renewal` needs no guard.
    fn release<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        _late_renewal: Option<std::time::Duration>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.release_holder(key, holder);
        Box::pin(std::future::ready(Ok(())))
    }

    fn release_now(&self, key: StoreKey<'_>, holder: &str) -> Option<Result<(), Error>> {
        self.release_holder(key, holder);
        Some(Ok(()))
    }
}

impl Upstreams for MemoryStore {
    fn take<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        cost: u32,
        budget: std::time::Duration,
    ) -> BoxFuture<'a, Result<Gate, Error>> {
        let gate = self.take_units(key, ledger, cost, budget);
        Box::pin(std::future::ready(Ok(gate)))
    }

    fn learn<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        learned: Learned,
        how: Sent,
        cost: u32,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.learn_said(key, ledger, learned, how, cost);
        Box::pin(std::future::ready(Ok(())))
    }

    fn settle<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        taken: u64,
        used: u64,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.settle_used(key, ledger, taken, used);
        Box::pin(std::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{algorithm::Gcra, extract::Key, quota::Quota};

    impl MemoryStore {
        /// `key` of namespace `t`, at `now`.
        fn decide_at(
            &self,
            algorithm: &dyn Algorithm,
            key: &str,
            cost: u32,
            now: u64,
        ) -> Result<Outcome, Error> {
            let key = Key::from(key);
            self.decide(
                algorithm,
                StoreKey::bounded("t", Some(&key), 128),
                cost,
                now,
            )
        }
    }

    #[test]
    fn key_churn_stays_under_the_cap_and_evicts_soonest_expiring_first() {
        let store = MemoryStore::builder().max_keys(1_600).build().unwrap();
        let long = Gcra::new(Quota::per_hour(1)).unwrap();
        let short = Gcra::new(Quota::per_second(1)).unwrap();
        let t0 = 1_700_000_000_000_000;
        // A key whose state lives an hour.
        assert!(store.decide_at(&long, "keeper", 1, t0).unwrap().allowed);
        // A flood of one-off keys whose state lives a second.
        for i in 0..100_000u64 {
            store
                .decide_at(&short, &format!("ip{i}"), 1, t0 + i)
                .unwrap();
            assert!(store.len() <= 1_600);
        }
        assert!(store.evicted() > 90_000);
        // The long-lived key survived: it is still limited.
        assert!(
            !store
                .decide_at(&long, "keeper", 1, t0 + 100_000)
                .unwrap()
                .allowed
        );
    }

    /// Two algorithms on one base key keep separate states, as their Redis keys do, also when
    /// the one holding the base key is swept while the other lives on under its own key.
    #[test]
    fn algorithms_sharing_a_base_key_keep_separate_states() {
        use crate::algorithm::TokenBucket;
        let store = MemoryStore::new();
        let short = Gcra::new(Quota::per_second(1)).unwrap();
        let long = TokenBucket::new(Quota::per_hour(1)).unwrap();
        let t0 = 1_700_000_000_000_000;
        let allowed =
            |a: &dyn Algorithm, t: u64| store.decide_at(a, "{rl:k}", 1, t).unwrap().allowed;
        assert!(allowed(&short, t0));
        assert!(
            allowed(&long, t0),
            "the token bucket has a state of its own"
        );
        assert!(!allowed(&long, t0 + 1));
        assert!(!allowed(&short, t0 + 1));
        // The GCRA state expires and is swept; the bucket's lives on.
        let later = t0 + 2_000_000;
        for mut shard in store.inner.states.each() {
            shard.room(later);
            shard.retain(|e| {
                e.state.expire(later);
                !e.state.is_empty()
            });
        }
        for mut words in store.inner.words.each() {
            words.sweep(later);
        }
        assert_eq!(store.len(), 1);
        assert!(!allowed(&long, later), "the bucket lost its state");
        assert!(allowed(&short, later));
        assert!(!allowed(&long, later + 1));
        assert_eq!(store.len(), 2);
    }

    /// Beyond an eighth of the cap (here 1,250 keys a shard, 20,000 in all), expired keys
    /// are swept as new ones come.
    #[test]
    fn expired_keys_are_swept() {
        let store = MemoryStore::builder().max_keys(160_000).build().unwrap();
        let g = Gcra::new(Quota::per_second(10)).unwrap();
        let t0 = 1_700_000_000_000_000;
        for i in 0..10_000u64 {
            store.decide_at(&g, &format!("k{i}"), 1, t0).unwrap();
        }
        // One second later every state has expired; new keys (all live) trigger sweeps.
        for i in 0..30_000u64 {
            store
                .decide_at(&g, &format!("n{i}"), 1, t0 + 1_000_000 + i)
                .unwrap();
        }
        assert_eq!(store.len(), 30_000, "the expired keys are gone");
        assert_eq!(store.evicted(), 0);
    }

    /// Below an eighth of the cap, an expired key stays, so that it is found again when it
    /// comes back (no entry added per visit), and it decides as a rested key.
    #[test]
    fn expired_keys_stay_below_an_eighth_of_the_cap() {
        let store = MemoryStore::new();
        let g = Gcra::new(Quota::per_second(1)).unwrap();
        let t0 = 1_700_000_000_000_000;
        // New keys come while the first ones have expired; then the first ones come back.
        for (round, keys) in [(0, 0..5_000u64), (1, 5_000..10_000), (2, 0..5_000)] {
            for i in keys {
                let at = t0 + round * 2_000_000 + i;
                assert!(
                    store
                        .decide_at(&g, &format!("k{i}"), 1, at)
                        .unwrap()
                        .allowed
                );
                assert!(
                    !store
                        .decide_at(&g, &format!("k{i}"), 1, at)
                        .unwrap()
                        .allowed
                );
            }
            assert_eq!(store.len(), if round == 0 { 5_000 } else { 10_000 });
        }
        assert_eq!(store.evicted(), 0);
    }

    /// Many threads checking one GCRA key at once, on a clock that does not move: exactly its
    /// burst admitted, however the compare-and-swaps of its word interleave.
    #[test]
    fn one_word_hammered_by_many_threads_admits_exactly_the_burst() {
        let store = MemoryStore::new();
        let g = Gcra::new(Quota::per_hour(10).burst(1_000)).unwrap();
        let t0 = 1_700_000_000_000_000;
        // The word exists before the threads start, so every check races on it.
        assert!(store.decide_at(&g, "hot", 1, t0).unwrap().allowed);
        let threads = 8;
        let start = std::sync::Barrier::new(threads);
        let admitted: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        (0..1_000)
                            .filter(|_| store.decide_at(&g, "hot", 1, t0).unwrap().allowed)
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted + 1, 1_000);
        assert_eq!(store.len(), 1);
        // New keys too: the first check of each, from every thread at once, adds one word.
        let admitted: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        (0..200u64)
                            .flat_map(|k| (0..10).map(move |_| k))
                            .filter(|k| {
                                let key = format!("new{k}");
                                store.decide_at(&g, &key, 100, t0).unwrap().allowed
                            })
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, 200 * 10, "10 checks of 100 units per key");
        assert_eq!(store.len(), 201);
    }

    /// A GCRA key is held as a word, counted by `len`, and once its TAT has passed it is
    /// swept like any expired key, here by new keys of the general table (a token bucket's)
    /// once a shard's keys of both tables together have doubled since its last sweep.
    #[test]
    fn a_word_past_its_tat_is_counted_and_swept() {
        use crate::algorithm::TokenBucket;
        // 2,048 keys a shard: sweeps start at 256 keys in one shard.
        let store = MemoryStore::builder().max_keys(16 * 2_048).build().unwrap();
        let g = Gcra::new(Quota::per_second(10)).unwrap();
        let t0 = 1_700_000_000_000_000;
        for i in 0..3_000u64 {
            store.decide_at(&g, &format!("k{i}"), 1, t0).unwrap();
        }
        assert_eq!(store.len(), 3_000);
        let words: usize = store.inner.words.each().map(|w| w.len()).sum();
        assert_eq!(words, 3_000, "every GCRA key is a word");
        // 100 ms later every TAT has passed.
        let b = TokenBucket::new(Quota::per_hour(1)).unwrap();
        let later = t0 + 100_000;
        for i in 0..8_000u64 {
            store.decide_at(&b, &format!("n{i}"), 1, later + i).unwrap();
        }
        assert_eq!(store.len(), 8_000, "the expired words are gone");
        assert_eq!(store.evicted(), 0);
        // At the cap, the words expiring soonest go first, before the general table's keys.
        let small = MemoryStore::builder().max_keys(1_600).build().unwrap();
        for i in 0..800u64 {
            small.decide_at(&b, &format!("b{i}"), 1, t0).unwrap();
        }
        for i in 0..20_000u64 {
            small.decide_at(&g, &format!("g{i}"), 1, t0 + i).unwrap();
            assert!(small.len() <= 1_600);
        }
        assert!(small.evicted() > 18_000);
        let kept = (0..800u64)
            .filter(|i| {
                !small
                    .decide_at(&b, &format!("b{i}"), 1, t0 + 20_000)
                    .unwrap()
                    .allowed
            })
            .count();
        assert_eq!(
            kept, 800,
            "every token bucket, expiring in an hour, is still limited"
        );
    }

    /// A GCRA key is in one table at a time: a word, in the general table while a refund's or
    /// a reset's ledger lives, a word again once it is spent; deciding as the twin throughout.
    #[tokio::test]
    async fn a_gcra_key_is_held_in_one_table_at_a_time() {
        use crate::RateLimiter;
        use std::time::Duration;
        let clock = ManualClock::new();
        let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let gcra = Gcra::new(Quota::per_second(10).burst(2)).unwrap();
        let limiter = RateLimiter::new(store.clone(), gcra).unwrap();
        let held = || {
            let states: usize = store.inner.states.each().map(|s| s.len()).sum();
            let words: usize = store.inner.words.each().map(|w| w.len()).sum();
            (states, words)
        };
        let mut first = limiter.check("k", 1).await.unwrap();
        assert!(first.allowed);
        assert_eq!(held(), (0, 1), "a word");
        assert!(limiter.refund("k", &mut first).await.unwrap());
        assert_eq!(held(), (1, 0), "with its ledger, in the general table");
        for allowed in [true, true, false] {
            assert_eq!(limiter.check("k", 1).await.unwrap().allowed, allowed);
            assert_eq!(held(), (1, 0));
        }
        clock.advance(Duration::from_secs(1));
        assert!(limiter.check("k", 1).await.unwrap().allowed);
        assert_eq!(held(), (0, 1), "its ledger spent, a word again");
        limiter.reset("k").await.unwrap();
        assert_eq!(
            held(),
            (1, 0),
            "a reset's floor keeps it in the general table"
        );
        for allowed in [true, true, false] {
            assert_eq!(limiter.check("k", 1).await.unwrap().allowed, allowed);
        }
        clock.advance(Duration::from_secs(1));
        assert!(limiter.check("k", 1).await.unwrap().allowed);
        assert_eq!(held(), (0, 1));
    }

    /// Sliding-window logs of many keys stay under the entry cap: each shard holds at most its
    /// share plus the log of the key being decided.
    #[test]
    fn log_entries_stay_under_the_cap() {
        use crate::algorithm::SlidingWindow;
        let store = MemoryStore::builder()
            .max_keys(1_000_000)
            .max_log_entries(1_024)
            .build()
            .unwrap();
        let w = SlidingWindow::new(Quota::per_hour(10)).unwrap();
        let t0 = 1_700_000_000_000_000;
        let mut peak = 0;
        for round in 0..10u64 {
            for i in 0..2_000u64 {
                store
                    .decide_at(&w, &format!("k{i}"), 1, t0 + round)
                    .unwrap();
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
        use crate::algorithm::SlidingWindow;
        let store = MemoryStore::builder().max_log_entries(160).build().unwrap();
        let w = SlidingWindow::new(Quota::per_hour(5_000)).unwrap();
        let t0 = 1_700_000_000_000_000;
        let admitted = (0..6_000u64)
            .filter(|i| store.decide_at(&w, "big", 1, t0 + i).unwrap().allowed)
            .count();
        assert_eq!(admitted, 5_000);
    }

    /// A setting that cannot work is an error naming it; nothing is clamped or ignored.
    #[test]
    fn settings_are_checked_by_name() {
        let b = MemoryStore::builder;
        assert_eq!(b().max_keys(0).build().unwrap_err().field(), "max_keys");
        let e = b().max_log_entries(0).build().unwrap_err();
        assert_eq!(e.field(), "max_log_entries");
        // Every setting applies together: a clock with caps.
        let clock = ManualClock::starting_at(std::time::Duration::from_secs(1_000));
        let store = b().max_keys(32).max_log_entries(64).clock(clock.clone());
        let store = store.build().unwrap();
        assert!(store.manual_clock());
        assert_eq!(store.now_us(), 1_000_000_000);
        assert_eq!(store.inner.max_entries_per_shard, 4);
        clock.advance(std::time::Duration::from_secs(1));
        assert_eq!(store.now_us(), 1_001_000_000);
    }
}
