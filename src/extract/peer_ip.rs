use std::net::{IpAddr, SocketAddr};

use http::request::Parts;

use super::KeyExtractor;

/// The TCP peer's IP address.
///
/// Read from axum's `ConnectInfo<SocketAddr>` (serve the router with
/// `into_make_service_with_connect_info::<SocketAddr>()`) or from a `SocketAddr` request
/// extension. IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`) count as their IPv4 address.
///
/// Behind a reverse proxy every request has the proxy's address: use [`ClientIp`](crate::ClientIp)
/// with the proxy's address as trusted. Without connection info the request has no key.
///
/// ```
/// use std::net::SocketAddr;
/// use tower_redis_ratelimit::{KeyExtractor, PeerIp};
///
/// let mut req = http::Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert("[::ffff:203.0.113.9]:5000".parse::<SocketAddr>().unwrap());
/// assert_eq!(PeerIp.extract(&req.into_parts().0).as_deref(), Some("203.0.113.9"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp;

impl KeyExtractor for PeerIp {
    fn extract(&self, parts: &Parts) -> Option<String> {
        peer_ip(parts).map(|ip| ip.to_string())
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
    parts
        .extensions
        .get::<SocketAddr>()
        .map(|addr| canonical(addr.ip()))
}

pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}
