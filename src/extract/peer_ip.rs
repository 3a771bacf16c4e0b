use std::net::{IpAddr, SocketAddr};

use http::request::Parts;

use super::{canonical, Key, KeyExtractor};

/// The TCP peer's IP address.
///
/// Read from the request extensions, where the server put it:
///
/// - **axum**: `ConnectInfo<SocketAddr>`; serve the router with
///   `into_make_service_with_connect_info::<SocketAddr>()` (feature `axum`, on by default).
/// - **tonic**: `TcpConnectInfo`, which tonic's server inserts for TCP connections (feature
///   `tonic`). Not over TLS: tonic then inserts `TlsConnectInfo<TcpConnectInfo>`; use a
///   closure extractor reading that.
/// - **anything else** (hyper, a test): a `SocketAddr` extension.
///
/// IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`) count as their IPv4 address. Behind a
/// reverse proxy every request has the proxy's address: use [`ClientIp`](crate::ClientIp) with
/// the proxy's address as trusted. Without connection info the request has no key (see
/// [`MissingKey`](crate::extract::MissingKey)).
///
/// ```
/// use std::net::SocketAddr;
/// use tower_redis_ratelimit::{KeyExtractor, PeerIp};
///
/// let mut req = http::Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert("[::ffff:203.0.113.9]:5000".parse::<SocketAddr>().unwrap());
/// assert_eq!(PeerIp.extract(&req.into_parts().0).unwrap().to_string(), "203.0.113.9");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp;

impl KeyExtractor for PeerIp {
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        peer_ip(parts).map(Key::ip)
    }
}

/// The peer address from the request extensions, IPv4-mapped addresses unwrapped.
pub(crate) fn peer_ip(parts: &Parts) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(canonical(info.0.ip()));
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = parts
        .extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|info| info.remote_addr())
    {
        return Some(canonical(addr.ip()));
    }
    parts
        .extensions
        .get::<SocketAddr>()
        .map(|addr| canonical(addr.ip()))
}
