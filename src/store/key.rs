//! The key a store decides a check under.

use std::fmt;

use crate::{extract::Out, Key};

/// The key a store decides one check under: the limiter's namespace (`prefix:policy`) and the
/// request's [`Key`], or none (the quota that keyless requests share).
///
/// A Redis store derives its keys from [`base`](Self::base), `{namespace:key}`: the braces
/// are a Redis Cluster hash tag, so every key of one check lands on one slot, and keys longer
/// than the limiter's bound are stored as a SHA-1.
#[derive(Clone, Copy)]
pub struct StoreKey<'a> {
    namespace: &'a str,
    key: Option<&'a Key<'a>>,
    max_len: usize,
}

impl<'a> StoreKey<'a> {
    /// `key` in `namespace`, with keys longer than the default bound
    /// ([`DEFAULT_MAX_KEY_LEN`](crate::core::DEFAULT_MAX_KEY_LEN)) hashed; e.g. to call a
    /// [`Store`](crate::Store) directly. Limiters make their own.
    pub fn new(namespace: &'a str, key: Option<&'a Key<'a>>) -> Self {
        Self::bounded(namespace, key, crate::core::DEFAULT_MAX_KEY_LEN)
    }

    pub(crate) fn bounded(namespace: &'a str, key: Option<&'a Key<'a>>, max_len: usize) -> Self {
        Self {
            namespace,
            key,
            max_len,
        }
    }

    /// The limiter's namespace, `prefix:policy`.
    pub fn namespace(&self) -> &str {
        self.namespace
    }

    /// The request's key; `None` for the quota keyless requests share.
    pub fn key(&self) -> Option<&Key<'a>> {
        self.key
    }

    /// `{namespace:key}`, the base of this check's Redis keys.
    ///
    /// ```
    /// # use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(1)).unwrap()).unwrap();
    /// assert_eq!(limiter.storage_key("k-123"), "{rl:default:k-123}");
    /// ```
    pub fn base(&self) -> String {
        let mut out = Vec::new();
        self.write_base(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Writes [`base`](Self::base) followed by `suffix`.
    pub(crate) fn write_base_with(&self, suffix: &[u8], out: &mut impl Out) {
        self.write_base(out);
        out.put(suffix);
    }

    fn write_base(&self, out: &mut impl Out) {
        out.put(b"{");
        out.put(self.namespace.as_bytes());
        out.put(b":");
        match self.key {
            Some(key) => key.write_stored(self.max_len, out),
            // No client key maps here: keys starting with `#` are stored hashed.
            None => out.put(b"#"),
        }
        out.put(b"}");
    }

    /// A compact form unique per (namespace, `kind`, key), for in-process maps.
    pub(crate) fn write_compact(&self, kind: &str, out: &mut impl Out) {
        out.put(self.namespace.as_bytes());
        out.put(&[0]);
        out.put(kind.as_bytes());
        out.put(&[0]);
        self.write_key_compact(out);
    }

    /// The key alone, compact: for a map of one limiter (the deny cache).
    pub(crate) fn write_key_compact(&self, out: &mut impl Out) {
        match self.key {
            Some(key) => key.write_compact(self.max_len, out),
            None => out.put(&[0xff]),
        }
    }
}

impl fmt::Debug for StoreKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.base())
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
