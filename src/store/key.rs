//! The key a store decides a check under.

use std::fmt;

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
    /// `namespace\0kind\0` for the limiter's own kind, written once when the limiter was
    /// built: what [`write_compact`](Self::write_compact) would write before the key.
    prefix: Option<(&'static str, &'a [u8])>,
}

impl<'a> StoreKey<'a> {
    /// `key` in `namespace`, with text or bytes longer than `max_len` stored hashed.
    pub(crate) fn bounded(namespace: &'a str, key: Option<&'a Key<'a>>, max_len: usize) -> Self {
        Self {
            namespace,
            key,
            max_len,
            prefix: None,
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

    /// A compact form unique per (namespace, `kind`, key), for in-process maps.
    pub(crate) fn write_compact(&self, kind: &str, out: &mut impl Out) {
        match self.prefix {
            Some((k, prefix)) if k == kind => out.put(prefix),
            _ => {
                out.put(self.namespace.as_bytes());
                out.put(&[0]);
                out.put(kind.as_bytes());
                out.put(&[0]);
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
    pub(crate) fn write_key_compact(&self, out: &mut impl Out) {
        match self.key {
            Some(key) => key.write_compact(self.max_len, out),
            None => out.put(&[0xff]),
        }
    }
}

/// What [`StoreKey::write_compact`] writes before the key for `namespace` and `kind`.
pub(crate) fn compact_prefix(namespace: &str, kind: &str) -> Box<[u8]> {
    [namespace.as_bytes(), &[0], kind.as_bytes(), &[0]]
        .concat()
        .into()
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
