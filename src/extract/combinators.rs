//! Extractors built from others, or from a function.

use http::request::Parts;

use super::{Key, KeyExtractor};

/// The first extractor's key, or the second's when the first finds none; see
/// [`KeyExtractor::or`].
#[derive(Debug, Clone)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A, B> Or<A, B> {
    pub(crate) fn new(first: A, second: B) -> Self {
        Self { first, second }
    }
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        self.first
            .extract(parts)
            .or_else(|| self.second.extract(parts))
    }
}

/// An extractor from a function of the request head; see [`key_fn`].
#[derive(Clone)]
pub struct KeyFn<F>(F);

impl<F> std::fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyFn")
    }
}

/// An extractor from a function of the request head that gives an owned key (`String`,
/// `u64`, `IpAddr`, ...), without writing the closure's argument type.
///
/// ```
/// use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimitLayer, RateLimiter, extract::key_fn};
///
/// # let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(60)).unwrap()).unwrap();
/// #[derive(Clone)]
/// struct UserId(u64); // put there by your authentication layer
/// let layer = RateLimitLayer::new(
///     limiter,
///     key_fn(|parts| parts.extensions.get::<UserId>().map(|u| u.0)),
/// );
/// ```
pub fn key_fn<F, K>(f: F) -> KeyFn<F>
where
    F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    K: Into<Key<'static>>,
{
    KeyFn(f)
}

impl<F, K> KeyExtractor for KeyFn<F>
where
    F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    K: Into<Key<'static>>,
{
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        (self.0)(parts).map(Into::into)
    }
}
