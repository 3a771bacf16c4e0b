//! The key a store decides a check under.

use std::{
    collections::HashMap,
    fmt,
    sync::{LazyLock, PoisonError, RwLock},
};

use crate::extract::{Key, Out, COMPACT_SCRATCH};

/// The key a store decides one check under: the limiter's namespace (`prefix:policy`) and the
/// request's [`Key`], or none (the quota that keyless requests share), with the bound above
/// which the limiter stores keys hashed. Each store writes its own form of it (a Redis store:
/// see `redis/keys.rs`; in memory: [`write_compact`](Self::write_compact)).
#[derive(Clone, Copy)]
pub(crate) struct StoreKey<'a> {
    namespace: &'a str,
    key: Option<&'a Key<'a>>,
    max_len: usize,
    /// The namespace's number (see [`namespace_id`]), when the caller holds it.
    id: Option<u32>,
    /// The compact prefix for the limiter's own kind (see [`compact_prefix`]), written once
    /// when the limiter was built: what [`write_compact`](Self::write_compact) would write
    /// before the key.
    prefix: Option<(&'static str, &'a [u8])>,
}

impl<'a> StoreKey<'a> {
    /// `key` in `namespace`, with text or bytes longer than `max_len` stored hashed.
    pub(crate) fn bounded(namespace: &'a str, key: Option<&'a Key<'a>>, max_len: usize) -> Self {
        Self {
            namespace,
            key,
            max_len,
            id: None,
            prefix: None,
        }
    }

    /// The same key, with its namespace's number (see [`namespace_id`]) given.
    pub(crate) fn numbered(self, id: u32) -> Self {
        debug_assert_eq!(id, namespace_id(self.namespace));
        Self {
            id: Some(id),
            ..self
        }
    }

    /// The same key, with its compact prefix for `kind` written ahead (see
    /// [`compact_prefix`]).
    pub(crate) fn with_prefix(self, kind: &'static str, prefix: &'a [u8]) -> Self {
        debug_assert_eq!(prefix, &compact_prefix(self.namespace, kind)[..]);
        Self {
            prefix: Some((kind, prefix)),
            ..self
        }
    }

    /// The limiter's namespace, `prefix:policy`.
    pub(crate) fn namespace(&self) -> &'a str {
        self.namespace
    }

    /// The request's key; `None` for the quota keyless requests share.
    pub(crate) fn key(&self) -> Option<&'a Key<'a>> {
        self.key
    }

    /// The length above which text or bytes are stored hashed.
    pub(crate) fn max_len(&self) -> usize {
        self.max_len
    }

    /// A compact form unique per (namespace, `kind`, key), for in-process maps: the
    /// namespace's number in this process (see [`namespace_id`]), `kind`, a `0` byte, and the
    /// key's compact form. The namespace takes four bytes however long it is, so the key of
    /// an in-process map is about as short as the request's key.
    #[inline]
    pub(crate) fn write_compact(&self, kind: &str, out: &mut impl Out) {
        match self.prefix {
            Some((k, prefix)) if k == kind => out.put(prefix),
            _ => {
                let id = self.id.unwrap_or_else(|| namespace_id(self.namespace));
                write_prefix(id, kind, out);
            }
        }
        self.write_key_compact(out);
    }

    /// What [`write_key_compact`](Self::write_key_compact) writes, as two parts read in
    /// place (see [`Key::compact_parts`]).
    pub(crate) fn key_compact_parts<'s>(
        &'s self,
        scratch: &'s mut [u8; COMPACT_SCRATCH],
    ) -> (&'s [u8], &'s [u8]) {
        match self.key {
            Some(key) => key.compact_parts(self.max_len, scratch),
            None => (&[0xff], &[]),
        }
    }

    /// The key alone, compact: for a map of one limiter (the deny cache).
    #[inline]
    pub(crate) fn write_key_compact(&self, out: &mut impl Out) {
        match self.key {
            Some(key) => key.write_compact(self.max_len, out),
            None => out.put(&[0xff]),
        }
    }
}

/// What [`StoreKey::write_compact`] writes before the key for `namespace` and `kind`.
pub(crate) fn compact_prefix(namespace: &str, kind: &str) -> Box<[u8]> {
    let mut prefix = Vec::new();
    write_prefix(namespace_id(namespace), kind, &mut prefix);
    prefix.into()
}

fn write_prefix(namespace_id: u32, kind: &str, out: &mut impl Out) {
    out.put(&namespace_id.to_le_bytes());
    out.put(kind.as_bytes());
    out.put(&[0]);
}

/// The number of `namespace` in this process: given to each namespace the first time it is
/// asked for, and the same for as long as the process runs. Namespaces come from the
/// configuration (a limiter's prefix and its policies), never from requests, so the table
/// stays as small as the configuration.
pub(crate) fn namespace_id(namespace: &str) -> u32 {
    static IDS: LazyLock<RwLock<HashMap<Box<str>, u32>>> = LazyLock::new(Default::default);
    // A panic while the lock was held left the table whole (an insert is one call).
    if let Some(&id) = IDS
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(namespace)
    {
        return id;
    }
    let mut ids = IDS.write().unwrap_or_else(PoisonError::into_inner);
    let next = u32::try_from(ids.len()).expect("fewer than 2^32 namespaces");
    *ids.entry(namespace.into()).or_insert(next)
}

impl fmt::Debug for StoreKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreKey")
            .field("namespace", &self.namespace)
            .field("key", &self.key)
            .finish()
    }
}

/// Bytes on the stack while they fit (keys are short), on the heap beyond.
pub(crate) struct KeyBuf {
    inline: [u8; 192],
    len: usize,
    spilled: Vec<u8>,
}

impl KeyBuf {
    pub(crate) fn new() -> Self {
        Self {
            inline: [0; 192],
            len: 0,
            spilled: Vec::new(),
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        if self.spilled.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spilled
        }
    }

    pub(crate) fn clear(&mut self) {
        self.len = 0;
        self.spilled.clear();
    }
}

impl Out for KeyBuf {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        if self.spilled.is_empty() && self.len + bytes.len() <= self.inline.len() {
            self.inline[self.len..self.len + bytes.len()].copy_from_slice(bytes);
            self.len += bytes.len();
        } else {
            if self.spilled.is_empty() {
                self.spilled.extend_from_slice(&self.inline[..self.len]);
            }
            self.spilled.extend_from_slice(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::Key;

    fn compact(key: StoreKey<'_>, kind: &str) -> Vec<u8> {
        let mut out = Vec::new();
        key.write_compact(kind, &mut out);
        out
    }

    #[test]
    fn a_namespace_keeps_its_number_and_no_two_share_one() {
        let a = namespace_id("rl:compact-test-a");
        let b = namespace_id("rl:compact-test-b");
        assert_ne!(a, b);
        assert_eq!(namespace_id("rl:compact-test-a"), a);
        assert_eq!(namespace_id(&String::from("rl:compact-test-b")), b);
    }

    #[test]
    fn compact_keys_tell_namespaces_kinds_and_keys_apart_in_every_form() {
        let k1 = Key::text("alice");
        let k2 = Key::text("bob");
        let keys = [
            StoreKey::bounded("rl:compact-ns-1", Some(&k1), 128),
            StoreKey::bounded("rl:compact-ns-1", Some(&k2), 128),
            StoreKey::bounded("rl:compact-ns-1", None, 128),
            StoreKey::bounded("rl:compact-ns-2", Some(&k1), 128),
        ];
        let mut seen = std::collections::HashSet::new();
        for key in keys {
            for kind in ["gcra", "ban", "token_bucket"] {
                let plain = compact(key, kind);
                // The same bytes with the namespace's number given, or the limiter's own
                // prefix written ahead.
                let id = namespace_id(key.namespace());
                assert_eq!(compact(key.numbered(id), kind), plain);
                let prefix = compact_prefix(key.namespace(), "gcra");
                assert_eq!(compact(key.with_prefix("gcra", &prefix), kind), plain);
                assert!(seen.insert(plain), "{key:?} {kind}");
            }
        }
    }

    #[test]
    fn a_long_namespace_makes_no_longer_compact_keys() {
        let key = Key::text("alice");
        let short = compact(StoreKey::bounded("rl:x", Some(&key), 128), "gcra");
        let long = "rl:".to_string() + &"n".repeat(60);
        let long = compact(StoreKey::bounded(&long, Some(&key), 128), "gcra");
        assert_eq!(short.len(), long.len());
        assert!(short.len() <= 4 + "gcra".len() + 1 + 1 + "alice".len() + 1);
    }
}
