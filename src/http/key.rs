//! The key of a request, and what the layer does with a request that has none.

use std::sync::atomic::{AtomicBool, Ordering};

use http::request::Parts;

use crate::extract::{Key, KeyExtractor, MissingKey};

/// A request's key, as a layer uses it.
pub(crate) enum Keyed<'a> {
    /// Limited under this key (`None`: the limit keyless requests share).
    Limited(Option<Key<'a>>),
    /// Not limited: the request has no key and the layer lets such requests through.
    Unlimited,
}

/// The key `extractor` finds in `parts`, under the rule `missing` for requests without one.
/// The first keyless request a layer limits logs a warning (once per process and `what`:
/// `"rate limit"` or `"concurrency limit"`), since a misconfigured extractor shows as every
/// request sharing one limit.
pub(crate) fn key_of<'a, K: KeyExtractor + ?Sized>(
    extractor: &K,
    missing: MissingKey,
    parts: &'a Parts,
    warned: &AtomicBool,
    what: &str,
) -> Keyed<'a> {
    match extractor.extract(parts) {
        Some(key) => Keyed::Limited(Some(key)),
        None if missing == MissingKey::Allow => Keyed::Unlimited,
        None => {
            if !warned.swap(true, Ordering::Relaxed) {
                tracing::warn!("{what}: a request had no key; keyless requests share one limit");
            }
            Keyed::Limited(None)
        }
    }
}
