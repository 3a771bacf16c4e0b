//! Where a request's rate-limit key comes from.
//!
//! A [`KeyExtractor`] reads the request head and returns the key whose quota the request
//! spends, or `None` when the request has no key (see
//! [`MissingKey`](crate::MissingKey) for what the layer then does; it is never a 500).
//!
//! Built-ins: [`GlobalKey`] (one quota for everybody), [`PeerIp`] (the TCP peer),
//! [`ClientIp`] (the peer, or the forwarded client address when the peer is a trusted proxy)
//! and [`HeaderKey`] (an API key header). Any closure
//! `Fn(&http::request::Parts) -> Option<String>` is an extractor too:
//!
//! ```
//! use http::request::Parts;
//! use tower_redis_ratelimit::KeyExtractor;
//!
//! // Per tenant, from a path like /tenants/{id}/...
//! let by_tenant = |parts: &Parts| {
//!     let mut segments = parts.uri.path().split('/');
//!     (segments.nth(1) == Some("tenants")).then(|| segments.next().map(str::to_owned)).flatten()
//! };
//! let req = http::Request::get("/tenants/acme/orders").body(()).unwrap();
//! assert_eq!(by_tenant.extract(&req.into_parts().0).as_deref(), Some("acme"));
//! ```
//!
//! Keys may be any length or content: the limiter namespaces them and replaces long ones by a
//! hash before they reach the store.

mod client_ip;
mod cost;
mod global;
mod header;
mod peer_ip;

pub use client_ip::{ClientIp, ProxyHeader};
pub(crate) use cost::CostFn;
pub use global::GlobalKey;
pub use header::HeaderKey;
pub use peer_ip::PeerIp;

use http::request::Parts;

/// Gives the rate-limit key of a request.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key, or `None` when the request has none.
    fn extract(&self, parts: &Parts) -> Option<String>;
}

/// A shared extractor is an extractor: lets one be chosen at run time
/// (`Arc<dyn KeyExtractor>`).
impl<T: KeyExtractor + ?Sized> KeyExtractor for std::sync::Arc<T> {
    fn extract(&self, parts: &Parts) -> Option<String> {
        (**self).extract(parts)
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts) -> Option<String> {
        self(parts)
    }
}
