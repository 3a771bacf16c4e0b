//! The keys a limit denies most: a bounded, approximate count per key (the Space-Saving
//! algorithm of Metwally, Agrawal and El Abbadi), in memory fixed whatever the number of keys.
//!
//! A tracker holds `capacity` keys. A denied key already held counts one more; a new key
//! takes a free place, or, when every place is taken, the place of the key with the smallest
//! count, whose count it inherits (so a count is never below the key's true count, and above
//! it by at most what it inherited). While fewer keys than the capacity were ever denied, the
//! counts are exact; after that, any key denied more than `total / capacity` times is held.
//!
//! Threads count in trackers of their own (a few lanes, see [`lane`]), so that cores
//! denying at once do not wait for one lock; a list adds the lanes' counts up, which keeps
//! both properties.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use hashbrown::HashTable;

use super::stats::lane;
use crate::{
    decision::Verdict,
    extract::{Key, Repr},
};

/// One key's counts, from [`RateLimiter::top_keys`](crate::RateLimiter::top_keys): how often
/// this instance denied it, and would have denied it under shadow mode, since it started.
///
/// A key is named two ways: [`key`](Self::key), text a person reads, and, for a key that is
/// text or bytes, [`bytes`](Self::bytes), its own bytes exactly. Two keys that differ only
/// in bytes that are not UTF-8 read alike in `key` and never in `bytes`: ban, peek or reset
/// a listed key with [`Key::bytes`] of its `bytes`.
///
/// ```
/// # use tower_redis_ratelimit::{*, extract::Key};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(1))?)?;
/// for _ in 0..2 {
///     limiter.check(Key::bytes(&b"\xff\xfeabuser"[..]), 1).await?;
/// }
/// let top = limiter.top_keys(1);
/// assert_eq!(top[0].key, "\u{fffd}\u{fffd}abuser");
/// let bytes = top[0].bytes.as_deref().expect("a bytes key");
/// assert_eq!(bytes, b"\xff\xfeabuser");
/// limiter.ban(Key::bytes(bytes), std::time::Duration::from_secs(60)).await?;
/// assert!(limiter.peek(Key::bytes(bytes)).await?.banned_for.is_some());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct KeyCount {
    /// The key as a person reads it (its `Display`): text as is, bytes that are not UTF-8
    /// with each invalid sequence replaced by `�` (U+FFFD), an address, an IPv6 network such
    /// as `2001:db8::/64`, a number. A key longer than 256 bytes is cut there and ends with
    /// `…` (see [`cut`](Self::cut)). A check without a key shows as an empty string.
    pub key: String,
    /// The key's own bytes, for a key of text or bytes (an API key, a header's value): what
    /// [`Key::bytes`] takes to name the same key again. `None` for an address, a network, a
    /// number or a check without a key. A key longer than 256 bytes has its first 256 here
    /// (see [`cut`](Self::cut)).
    pub bytes: Option<Vec<u8>>,
    /// Whether the key is longer than 256 bytes: [`key`](Self::key) and
    /// [`bytes`](Self::bytes) hold its beginning only, and name no key.
    pub cut: bool,
    /// The name of the policy that denied it.
    pub policy: Arc<str>,
    /// Requests of this key denied.
    pub denied: u64,
    /// Requests of this key that a policy in shadow mode would have denied.
    pub would_deny: u64,
}

/// The longest key text kept, in bytes.
const MAX_TEXT: usize = 256;
/// The longest identity kept: a key's compact form; a longer one is replaced by its SHA-1.
const MAX_ID: usize = 72;

/// A key's place in the tracker.
struct Slot {
    id: [u8; MAX_ID],
    id_len: u8,
    hash: u64,
    /// The key's own bytes (a text or bytes key, see `own`) or its text (an address, a
    /// network, a number), at most `MAX_TEXT` bytes.
    text: Vec<u8>,
    /// Whether `text` holds the key's own bytes.
    own: bool,
    /// Whether the key was longer than `MAX_TEXT` bytes.
    cut: bool,
    denied: u64,
    would_deny: u64,
    /// The count inherited from the key this one replaced, counted under `first`.
    inherited: u64,
    first: Verdict,
}

impl Slot {
    fn total(&self) -> u64 {
        self.denied + self.would_deny + self.inherited
    }

    fn id(&self) -> &[u8] {
        &self.id[..usize::from(self.id_len)]
    }
}

struct Tracker {
    slots: Vec<Slot>,
    /// Index into `slots`, by the identity's hash.
    index: HashTable<u32>,
    /// The place of the key this lane counted last: a flood of one key is counted there
    /// without hashing its identity or looking it up.
    last: usize,
}

/// A bounded tracker of the keys a limit denies most.
pub(crate) struct TopKeys {
    capacity: usize,
    /// Mixed into every hash, so that nobody can choose keys that collide in advance (a
    /// table of a few hundred places, so at worst a slower lookup).
    seed: u64,
    lanes: Box<[Lane]>,
}

/// One lane's tracker, on cache lines of its own (two cores denying at once do not share a
/// line).
#[repr(align(128))]
struct Lane(Mutex<Tracker>);

/// How many trackers a limit's denials are split into (by thread).
const TOP_LANES: usize = 4;

impl std::fmt::Debug for TopKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopKeys")
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl TopKeys {
    /// A tracker of at most `capacity` keys (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            seed: std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                0u8,
            ),
            lanes: (0..TOP_LANES)
                .map(|_| {
                    Lane(Mutex::new(Tracker {
                        slots: Vec::new(),
                        index: HashTable::new(),
                        last: 0,
                    }))
                })
                .collect(),
        }
    }

    /// [`record`](Self::record), the identity given in two parts (`head` then `tail`, as
    /// [`Key::compact_parts`] reads it): a lane's repeated denials of its last key are counted
    /// without copying the identity out.
    pub(crate) fn record_parts(
        &self,
        head: &[u8],
        tail: &[u8],
        key: Option<&Key<'_>>,
        verdict: Verdict,
    ) {
        let len = head.len() + tail.len();
        if len > MAX_ID {
            // The SHA-1 of the identity, fed in its two parts.
            let mut sha = sha1_smol::Sha1::new();
            sha.update(head);
            sha.update(tail);
            return self.record(&sha.digest().bytes(), key, verdict);
        }
        {
            let mut guard = self.lane();
            let Tracker { slots, last, .. } = &mut *guard;
            let same = |s: &&mut Slot| {
                let id = s.id();
                id.len() == len && id[..head.len()] == *head && id[head.len()..] == *tail
            };
            if let Some(slot) = slots.get_mut(*last).filter(same) {
                count(slot, verdict);
                return;
            }
        }
        let mut id = [0; MAX_ID];
        id[..head.len()].copy_from_slice(head);
        id[head.len()..len].copy_from_slice(tail);
        self.record(&id[..len], key, verdict);
    }

    /// This thread's lane, locked.
    fn lane(&self) -> std::sync::MutexGuard<'_, Tracker> {
        match self.lanes[lane() % TOP_LANES].0.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Counts a denial (`Denied` or `WouldDeny`) of `key` (`None`: the check had no key),
    /// whose compact form (as the store and the deny cache write it, unique per key) is `id`.
    /// Allocates nothing once the tracker is full.
    pub(crate) fn record(&self, id: &[u8], key: Option<&Key<'_>>, verdict: Verdict) {
        let digest;
        let id = match id.len() > MAX_ID {
            true => {
                digest = sha1_smol::Sha1::from(id).digest().bytes();
                &digest[..]
            }
            false => id,
        };
        let mut guard = self.lane();
        let Tracker { slots, index, last } = &mut *guard;
        if let Some(slot) = slots.get_mut(*last).filter(|s| s.id() == id) {
            count(slot, verdict);
            return;
        }
        let hash = mix(self.seed, id);
        let found = index.find(hash, |&i| slots[i as usize].id() == id).copied();
        let at = match found {
            Some(i) => i as usize,
            None if slots.len() < self.capacity => {
                if slots.is_empty() {
                    slots.reserve_exact(self.capacity);
                    // Room for twice the keys held: replacing keys leaves tombstones, which a
                    // table at most half full clears in place instead of growing.
                    index.reserve(2 * self.capacity, |&i| slots[i as usize].hash);
                }
                slots.push(Slot {
                    id: [0; MAX_ID],
                    id_len: 0,
                    hash,
                    text: Vec::with_capacity(MAX_TEXT),
                    own: false,
                    cut: false,
                    denied: 0,
                    would_deny: 0,
                    inherited: 0,
                    first: verdict,
                });
                let at = slots.len() - 1;
                fill(&mut slots[at], id, hash, key, verdict, 0);
                index.insert_unique(hash, at as u32, |&i| slots[i as usize].hash);
                at
            }
            None => {
                // Every place is taken: the key with the smallest count gives its place.
                let (at, least) = slots
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, s)| s.total())
                    .map(|(i, s)| (i, s.total()))
                    .expect("a full tracker holds a key");
                let old = slots[at].hash;
                if let Ok(entry) = index.find_entry(old, |&i| i as usize == at) {
                    entry.remove();
                }
                fill(&mut slots[at], id, hash, key, verdict, least);
                index.insert_unique(hash, at as u32, |&i| slots[i as usize].hash);
                at
            }
        };
        *last = at;
        count(&mut slots[at], verdict);
    }

    /// The `n` keys with the highest counts (denied and would-be denied together), highest
    /// first; the lanes' counts of a key added up.
    pub(crate) fn top(&self, n: usize, policy: &Arc<str>) -> Vec<KeyCount> {
        struct Sum {
            text: Vec<u8>,
            own: bool,
            cut: bool,
            denied: u64,
            would_deny: u64,
        }
        let mut sums: HashMap<Box<[u8]>, Sum> = HashMap::new();
        for lane in self.lanes.iter() {
            let guard = match lane.0.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            for slot in &guard.slots {
                let sum = sums.entry(slot.id().into()).or_insert_with(|| Sum {
                    text: slot.text.clone(),
                    own: slot.own,
                    cut: slot.cut,
                    denied: 0,
                    would_deny: 0,
                });
                sum.denied += slot.denied;
                sum.would_deny += slot.would_deny;
                match slot.first {
                    Verdict::WouldDeny => sum.would_deny += slot.inherited,
                    _ => sum.denied += slot.inherited,
                }
            }
        }
        let mut order: Vec<Sum> = sums.into_values().collect();
        order.sort_by(|a, b| {
            (b.denied + b.would_deny)
                .cmp(&(a.denied + a.would_deny))
                .then_with(|| a.text.cmp(&b.text))
        });
        order
            .into_iter()
            .take(n)
            .map(|s| {
                let mut key = String::from_utf8_lossy(&s.text).into_owned();
                if s.cut {
                    key.push('…');
                }
                KeyCount {
                    key,
                    bytes: s.own.then_some(s.text),
                    cut: s.cut,
                    policy: Arc::clone(policy),
                    denied: s.denied,
                    would_deny: s.would_deny,
                }
            })
            .collect()
    }

    /// The bytes the trackers hold, for the bound's tests.
    #[cfg(test)]
    fn footprint(&self) -> usize {
        self.lanes
            .iter()
            .map(|lane| {
                let guard = lane.0.lock().unwrap();
                guard.slots.capacity() * std::mem::size_of::<Slot>()
                    + guard.slots.iter().map(|s| s.text.capacity()).sum::<usize>()
                    + guard.index.allocation_size()
            })
            .sum()
    }
}

/// A fast hash of `bytes` (8 bytes at a time, a multiply and a rotation each), seeded.
fn mix(seed: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = seed ^ (bytes.len() as u64).wrapping_mul(K);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let word = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h ^ word).wrapping_mul(K).rotate_left(29);
    }
    let mut last = [0u8; 8];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h ^ u64::from_le_bytes(last)).wrapping_mul(K);
    h ^ (h >> 32)
}

/// Counts one denial (or would-be denial) in `slot`.
fn count(slot: &mut Slot, verdict: Verdict) {
    match verdict {
        Verdict::WouldDeny => slot.would_deny += 1,
        _ => slot.denied += 1,
    }
}

/// Gives `slot` to a new key.
fn fill(
    slot: &mut Slot,
    id: &[u8],
    hash: u64,
    key: Option<&Key<'_>>,
    first: Verdict,
    inherited: u64,
) {
    slot.id[..id.len()].copy_from_slice(id);
    slot.id_len = id.len() as u8;
    slot.hash = hash;
    slot.text.clear();
    slot.own = false;
    slot.cut = false;
    match key.map(|k| (k, k.repr())) {
        Some((_, Repr::Text(t))) => {
            // Cut on a character boundary: the text read back is the key's own beginning.
            let mut end = t.len().min(MAX_TEXT);
            while !t.is_char_boundary(end) {
                end -= 1;
            }
            slot.text.extend_from_slice(&t.as_bytes()[..end]);
            (slot.own, slot.cut) = (true, end < t.len());
        }
        Some((_, Repr::Bytes(b))) => {
            let end = b.len().min(MAX_TEXT);
            slot.text.extend_from_slice(&b[..end]);
            (slot.own, slot.cut) = (true, end < b.len());
        }
        // An address, a network or a number: at most 43 bytes of text, in the room the slot
        // holds.
        Some((key, _)) => {
            let _ = std::io::Write::write_fmt(&mut slot.text, format_args!("{key}"));
        }
        None => {}
    }
    slot.denied = 0;
    slot.would_deny = 0;
    slot.inherited = inherited;
    slot.first = first;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Arc<str> {
        Arc::from("p")
    }

    /// `key`'s compact form, as the engine gives it.
    fn id(key: &Key<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        key.write_compact(128, &mut out);
        out
    }

    impl TopKeys {
        fn count(&self, key: Option<&Key<'_>>, verdict: Verdict) {
            let id = key.map_or_else(|| vec![0xff], id);
            self.record(&id, key, verdict);
        }
    }

    #[test]
    fn counts_are_exact_while_the_keys_fit() {
        let top = TopKeys::new(100);
        for i in 0..100u64 {
            for _ in 0..=i {
                top.count(Some(&Key::number(i)), Verdict::Denied);
            }
            top.count(Some(&Key::number(i)), Verdict::WouldDeny);
        }
        let all = top.top(1_000, &policy());
        assert_eq!(all.len(), 100);
        for (rank, count) in all.iter().enumerate() {
            let i = 99 - rank as u64;
            assert_eq!(count.key, i.to_string());
            assert_eq!((count.denied, count.would_deny), (i + 1, 1));
        }
        assert_eq!(top.top(3, &policy()).len(), 3);
    }

    #[test]
    fn memory_stays_fixed_and_heavy_hitters_are_found_among_a_million_keys() {
        let top = TopKeys::new(128);
        top.count(Some(&Key::text("warm-up")), Verdict::Denied);
        let mut heavy_seen = [0u64; 5];
        let mut footprint = 0;
        // A million distinct keys denied once each, and five heavy hitters among them,
        // denied 20,000 times each: more than total / capacity, so they must be held.
        for i in 0..1_000_000u64 {
            if i % 1_000 == 0 {
                // Now and then a long one, cut to the longest text kept.
                let key = format!("tenant-{i}-{}", "x".repeat((i % 300_000 / 1_000) as usize));
                top.count(Some(&Key::text(key.as_str())), Verdict::Denied);
            } else {
                top.count(Some(&Key::number(i)), Verdict::Denied);
            }
            if i % 10 == 0 {
                let h = (i / 10 % 5) as usize;
                top.count(Some(&Key::text(format!("heavy-{h}"))), Verdict::WouldDeny);
                heavy_seen[h] += 1;
            }
            if i == 1_000 {
                footprint = top.footprint();
            }
        }
        assert_eq!(
            top.footprint(),
            footprint,
            "the tracker grew after it was full"
        );
        assert!(
            footprint < TOP_LANES * 128 * 1024,
            "{footprint} bytes for 128 keys in {TOP_LANES} lanes"
        );
        let best = top.top(5, &policy());
        let mut names: Vec<_> = best.iter().map(|c| c.key.clone()).collect();
        names.sort();
        assert_eq!(
            names,
            ["heavy-0", "heavy-1", "heavy-2", "heavy-3", "heavy-4"],
            "{best:?}"
        );
        for c in &best {
            let h: usize = c.key["heavy-".len()..].parse().unwrap();
            // Never below the true count, above it by at most total / capacity.
            assert!(c.would_deny + c.denied >= heavy_seen[h]);
            assert!(c.would_deny + c.denied <= heavy_seen[h] + 1_100_001 / 128);
        }
    }

    /// Space-Saving as the module describes it, one key at a time over a list: the counts a
    /// lane must hold whatever shortcut it takes.
    fn space_saving(capacity: usize, denials: &[(u8, bool)]) -> Vec<(String, u64, u64)> {
        // (key, denied, would_deny, inherited, first verdict would-deny)
        let mut held: Vec<(u8, u64, u64, u64, bool)> = Vec::new();
        for &(key, would) in denials {
            let at = match held.iter().position(|h| h.0 == key) {
                Some(at) => at,
                None if held.len() < capacity => {
                    held.push((key, 0, 0, 0, would));
                    held.len() - 1
                }
                None => {
                    let (at, least) = held
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, h)| h.1 + h.2 + h.3)
                        .map(|(i, h)| (i, h.1 + h.2 + h.3))
                        .unwrap();
                    held[at] = (key, 0, 0, least, would);
                    at
                }
            };
            match would {
                true => held[at].2 += 1,
                false => held[at].1 += 1,
            }
        }
        let mut out: Vec<_> = held
            .into_iter()
            .map(|(key, denied, would, inherited, first)| match first {
                true => (key.to_string(), denied, would + inherited),
                false => (key.to_string(), denied + inherited, would),
            })
            .collect();
        out.sort_by(|a, b| (b.1 + b.2).cmp(&(a.1 + a.2)).then_with(|| a.0.cmp(&b.0)));
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        #[test]
        fn a_lane_holds_the_counts_of_space_saving(
            capacity in 1..5usize,
            denials in proptest::collection::vec((0..7u8, proptest::bool::ANY), 0..200),
        ) {
            let top = TopKeys::new(capacity);
            for &(key, would) in &denials {
                let verdict = if would { Verdict::WouldDeny } else { Verdict::Denied };
                top.count(Some(&Key::number(u64::from(key))), verdict);
            }
            let got: Vec<_> = top
                .top(capacity, &policy())
                .into_iter()
                .map(|c| (c.key, c.denied, c.would_deny))
                .collect();
            proptest::prop_assert_eq!(got, space_saving(capacity, &denials));
        }
    }

    #[test]
    fn long_keys_are_cut_and_still_told_apart() {
        let top = TopKeys::new(10);
        let a = format!("{}a", "é".repeat(400));
        let b = format!("{}b", "é".repeat(400));
        top.count(Some(&Key::text(a.as_str())), Verdict::Denied);
        top.count(Some(&Key::text(b.as_str())), Verdict::Denied);
        top.count(Some(&Key::text(b.as_str())), Verdict::Denied);
        top.count(None, Verdict::Denied);
        let all = top.top(10, &policy());
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].denied, 2);
        assert!(all[0].key.ends_with('…'));
        assert!(all[0].key.len() <= MAX_TEXT + 3);
        assert!(all.iter().any(|c| c.key.is_empty()));
    }

    /// Keys that read alike (each byte sequence that is not UTF-8 reads as U+FFFD) are told
    /// apart by their bytes, which name the key again; a text key's bytes are its text; an
    /// address or a number has none.
    #[test]
    fn keys_that_read_alike_are_told_apart_by_their_bytes() {
        let top = TopKeys::new(10);
        let ip: std::net::IpAddr = "203.0.113.7".parse().unwrap();
        let keys = [
            Key::bytes(&b"\xff\xfeabuser"[..]),
            Key::bytes(&b"\xfe\xffabuser"[..]),
            Key::text("\u{fffd}\u{fffd}abuser"),
            Key::number(7),
            Key::ip(ip),
        ];
        for (i, key) in keys.iter().enumerate() {
            for _ in 0..=i {
                top.count(Some(key), Verdict::Denied);
            }
        }
        let all = top.top(10, &policy());
        let got: Vec<_> = all
            .iter()
            .map(|c| (c.key.as_str(), c.bytes.as_deref(), c.cut, c.denied))
            .collect();
        let lookalike = "\u{fffd}\u{fffd}abuser";
        assert_eq!(
            got,
            [
                ("203.0.113.7", None, false, 5),
                ("7", None, false, 4),
                (lookalike, Some(lookalike.as_bytes()), false, 3),
                (lookalike, Some(&b"\xfe\xffabuser"[..]), false, 2),
                (lookalike, Some(&b"\xff\xfeabuser"[..]), false, 1),
            ]
        );
        for (count, key) in all.iter().zip(keys.iter().rev()) {
            if let Some(bytes) = &count.bytes {
                assert_eq!(&Key::bytes(&bytes[..]), key);
            }
        }
    }

    /// A key longer than the text kept: its first bytes (a whole character for text), said
    /// to be cut.
    #[test]
    fn long_bytes_are_cut_and_said_to_be() {
        let top = TopKeys::new(10);
        let mut long = vec![0xff; 300];
        long[0] = b'a';
        top.count(Some(&Key::bytes(long.clone())), Verdict::Denied);
        let text = "é".repeat(200);
        top.count(Some(&Key::text(text.as_str())), Verdict::WouldDeny);
        top.count(Some(&Key::text("short")), Verdict::WouldDeny);
        let all = top.top(10, &policy());
        let bytes = all
            .iter()
            .find(|c| c.bytes.as_ref().unwrap()[0] == b'a')
            .unwrap();
        assert_eq!(bytes.bytes.as_deref(), Some(&long[..MAX_TEXT]));
        assert!(bytes.cut && bytes.key.ends_with('…'), "{bytes:?}");
        let cut = all.iter().find(|c| c.key.starts_with('é')).unwrap();
        assert_eq!(cut.bytes.as_deref(), Some(&text.as_bytes()[..MAX_TEXT]));
        assert_eq!(cut.key, format!("{}…", "é".repeat(MAX_TEXT / 2)));
        assert!(cut.cut);
        let short = all.iter().find(|c| c.key == "short").unwrap();
        assert!(!short.cut);
    }

    /// An identity given in parts counts as the same identity given whole: short and long
    /// (hashed) ones, text and numbers, split anywhere, as a lane's last key or not.
    #[test]
    fn parts_count_as_the_whole_identity() {
        let whole = TopKeys::new(16);
        let parts = TopKeys::new(16);
        let long = "k".repeat(300);
        let keys = [
            Key::text("a"),
            Key::number(7),
            Key::text(long.as_str()),
            Key::text("a"),
            Key::text("b"),
            Key::text("b"),
            Key::text(long.as_str()),
        ];
        for (n, key) in keys.iter().cycle().take(60).enumerate() {
            let verdict = if n % 3 == 0 {
                Verdict::WouldDeny
            } else {
                Verdict::Denied
            };
            let id = id(key);
            whole.record(&id, Some(key), verdict);
            let split = n % (id.len() + 1);
            parts.record_parts(&id[..split], &id[split..], Some(key), verdict);
            let mut scratch = [0; crate::extract::COMPACT_SCRATCH];
            let (head, tail) = key.compact_parts(128, &mut scratch);
            assert_eq!([head, tail].concat(), id);
        }
        assert_eq!(whole.top(16, &policy()), parts.top(16, &policy()));
        assert_eq!(parts.top(16, &policy()).len(), 4);
    }
}
