//! Where a request's rate-limit key comes from.
//!
//! A [`KeyExtractor`] reads the request head and returns the key whose quota the request
//! spends, or `None` when the request has no key (see
//! [`MissingKey`] for what the layer then does; it is never a 500).
//!
//! Built-ins: [`GlobalKey`] (one quota for everybody), [`PeerIp`] (the TCP peer),
//! [`ClientIp`] (the peer, or the forwarded client address when the peer is a trusted proxy)
//! and [`HeaderKey`] (an API key header); [`KeyExtractor::or`] falls back from one to another
//! ("API key, else client IP"). A [`Key`] is text, bytes, an address or a number, borrowed
//! from the request where it can be: no `String` per request.
//!
//! Any function of the request head is an extractor too; [`key_fn`] spares the closure's
//! argument type:
//!
//! ```
//! use tower_redis_ratelimit::{KeyExtractor, extract::key_fn};
//!
//! // Per tenant, from a path like /tenants/{id}/...
//! let by_tenant = key_fn(|parts| {
//!     let mut segments = parts.uri.path().split('/');
//!     (segments.nth(1) == Some("tenants")).then(|| segments.next().map(str::to_owned)).flatten()
//! });
//! let req = http::Request::get("/tenants/acme/orders").body(()).unwrap();
//! assert_eq!(by_tenant.extract(&req.into_parts().0).unwrap().to_string(), "acme");
//! ```
//!
//! Keys may be any length or content: the limiter namespaces them and replaces long ones by a
//! hash before they reach the store.

mod client_ip;
mod combinators;
mod cost;
mod global;
mod header;
mod key;
mod missing;
mod peer_ip;

pub use self::{
    client_ip::{ClientIp, ProxyHeader},
    combinators::{key_fn, KeyFn, Or},
    global::GlobalKey,
    header::HeaderKey,
    key::Key,
    missing::MissingKey,
    peer_ip::PeerIp,
};
pub(crate) use self::{
    cost::CostFn,
    key::{canonical, Out, Repr, COMPACT_SCRATCH},
};

use http::request::Parts;

/// Gives the rate-limit key of a request.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key, or `None` when the request has none.
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>>;

    /// This extractor's key, or `other`'s when this one finds none: e.g. the API key, else
    /// the client IP. The two kinds of keys never meet (see [`Key`]).
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use tower_redis_ratelimit::{HeaderKey, KeyExtractor, PeerIp};
    ///
    /// let key = HeaderKey::new("x-api-key")?.or(PeerIp);
    /// let mut req = http::Request::get("/").body(()).unwrap();
    /// req.extensions_mut().insert("203.0.113.9:5000".parse::<SocketAddr>().unwrap());
    /// let (mut parts, _) = req.into_parts();
    /// assert_eq!(key.extract(&parts).unwrap().to_string(), "203.0.113.9");
    /// parts.headers.insert("x-api-key", "k-123".parse().unwrap());
    /// assert_eq!(key.extract(&parts).unwrap().to_string(), "k-123");
    /// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
    /// ```
    fn or<B: KeyExtractor>(self, other: B) -> Or<Self, B>
    where
        Self: Sized,
    {
        Or::new(self, other)
    }
}

/// A shared extractor is an extractor: lets one be chosen at run time
/// (`Arc<dyn KeyExtractor>`).
impl<T: KeyExtractor + ?Sized> KeyExtractor for std::sync::Arc<T> {
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        (**self).extract(parts)
    }
}

/// A function of the request head giving an owned key (`String`, `u64`, `IpAddr`, ...). Its
/// argument needs its type written (`|parts: &Parts| ...`); [`key_fn`] spares that.
impl<F, K> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    K: Into<Key<'static>>,
{
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        self(parts).map(Into::into)
    }
}
