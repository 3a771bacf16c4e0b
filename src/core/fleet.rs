//! The fleet's top keys: each instance's [`KeyCount`]s as a snapshot it publishes in the
//! store, and the sum over every instance's.

use std::{collections::HashMap, sync::Arc, time::Duration};

use super::KeyCount;

/// How long a published snapshot counts: an instance that stopped publishing (it ended) drops
/// out of the fleet's view after this.
pub(crate) const SNAPSHOT_TTL: Duration = Duration::from_secs(10);

/// The most keys an instance publishes (its most denied).
pub(crate) const PUBLISHED_KEYS: usize = 1_000;

/// The most bytes of one snapshot read: a longer one is not this crate's and is skipped.
const MAX_SNAPSHOT: usize = 4 << 20;

const VERSION: u8 = 1;

/// What names one key in the fleet's sum: its policy, text, bytes and whether it was cut.
type KeyId = (Arc<str>, String, Option<Vec<u8>>, bool);

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// `counts` as a snapshot: a version byte, then for each key its flags (1: bytes follow,
/// 2: cut), key, bytes, policy (each a little-endian `u32` length and the bytes), denied and
/// would-deny counts (little-endian `u64`).
pub(crate) fn encode(counts: &[KeyCount]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + counts.len() * 48);
    out.push(VERSION);
    for c in counts {
        out.push(u8::from(c.bytes.is_some()) | (u8::from(c.cut) << 1));
        put_bytes(&mut out, c.key.as_bytes());
        if let Some(bytes) = &c.bytes {
            put_bytes(&mut out, bytes);
        }
        put_bytes(&mut out, c.policy.as_bytes());
        out.extend_from_slice(&c.denied.to_le_bytes());
        out.extend_from_slice(&c.would_deny.to_le_bytes());
    }
    out
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<usize> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()?;
        self.take(n)
    }
}

/// The counts of a snapshot, or `None` for one this crate did not write (a broken reply
/// loses that instance's counts, nothing else).
pub(crate) fn decode(snapshot: &[u8]) -> Option<Vec<KeyCount>> {
    if snapshot.len() > MAX_SNAPSHOT {
        return None;
    }
    let mut r = Reader(snapshot);
    if r.take(1)? != [VERSION] {
        return None;
    }
    let mut counts = Vec::new();
    while !r.0.is_empty() {
        let flags = r.take(1)?[0];
        let key = String::from_utf8(r.bytes()?.to_vec()).ok()?;
        let bytes = match flags & 1 {
            1 => Some(r.bytes()?.to_vec()),
            _ => None,
        };
        let policy = std::str::from_utf8(r.bytes()?).ok()?;
        counts.push(KeyCount {
            key,
            bytes,
            cut: flags & 2 != 0,
            policy: Arc::from(policy),
            denied: r.u64()?,
            would_deny: r.u64()?,
        });
    }
    Some(counts)
}

/// The sum of every instance's counts, key by key (a key is its policy, text, bytes and
/// cut), the `n` most denied first (denied and would-deny together; ties by key).
pub(crate) fn merge(lists: impl IntoIterator<Item = Vec<KeyCount>>, n: usize) -> Vec<KeyCount> {
    let mut sums: HashMap<KeyId, KeyCount> = HashMap::new();
    for list in lists {
        for c in list {
            let id = (Arc::clone(&c.policy), c.key.clone(), c.bytes.clone(), c.cut);
            match sums.get_mut(&id) {
                Some(sum) => {
                    sum.denied = sum.denied.saturating_add(c.denied);
                    sum.would_deny = sum.would_deny.saturating_add(c.would_deny);
                }
                None => {
                    sums.insert(id, c);
                }
            }
        }
    }
    let mut all: Vec<KeyCount> = sums.into_values().collect();
    all.sort_by(|a, b| {
        let total = |c: &KeyCount| c.denied.saturating_add(c.would_deny);
        total(b)
            .cmp(&total(a))
            .then_with(|| a.key.cmp(&b.key))
            .then_with(|| a.policy.cmp(&b.policy))
    });
    all.truncate(n);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(key: &str, bytes: Option<&[u8]>, denied: u64, would_deny: u64) -> KeyCount {
        KeyCount {
            key: key.to_owned(),
            bytes: bytes.map(<[u8]>::to_vec),
            cut: false,
            policy: Arc::from("default"),
            denied,
            would_deny,
        }
    }

    #[test]
    fn snapshots_round_trip_and_broken_ones_are_refused() {
        let counts = vec![
            count("a", Some(b"a"), 3, 0),
            count("10.0.0.1", None, 0, 7),
            KeyCount {
                cut: true,
                ..count("\u{fffd}x", Some(&[0xff, b'x']), 1, 1)
            },
        ];
        let snapshot = encode(&counts);
        assert_eq!(decode(&snapshot).unwrap(), counts);
        assert_eq!(decode(&encode(&[])).unwrap(), []);
        for cut in 0..snapshot.len() {
            let _ = decode(&snapshot[..cut]); // never panics
        }
        assert!(decode(&snapshot[..snapshot.len() - 1]).is_none());
        assert!(decode(b"").is_none());
        assert!(decode(b"\x02").is_none());
        assert!(decode(b"\x01\x00\xff\xff\xff\xff").is_none());
    }

    #[test]
    fn the_fleet_sums_each_key_and_ranks_the_most_denied_first() {
        let a = vec![count("k", Some(b"k"), 5, 0), count("j", Some(b"j"), 1, 0)];
        let b = vec![count("k", Some(b"k"), 2, 1), count("i", Some(b"i"), 7, 0)];
        let fleet = merge([a, b], 2);
        assert_eq!(
            fleet,
            [count("k", Some(b"k"), 7, 1), count("i", Some(b"i"), 7, 0)]
        );
    }
}
