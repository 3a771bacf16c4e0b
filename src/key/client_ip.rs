use std::net::IpAddr;

use http::request::Parts;
use ipnet::IpNet;

use super::{
    peer_ip::{canonical, peer_ip},
    KeyExtractor,
};
use crate::ConfigError;

/// The client's IP address, read from `X-Forwarded-For` only when the TCP peer is a trusted
/// proxy.
///
/// Spoofing model: a client can write any `X-Forwarded-For` it likes; only the entries your
/// own proxies appended are true. So the header is used only when the peer is in a trusted
/// CIDR, and it is read from the right: trusted proxies are skipped and the first untrusted
/// address is the client. A malformed entry stops the walk and the peer address is used.
/// With no trusted proxies this is [`PeerIp`](crate::PeerIp).
///
/// ```
/// use std::net::SocketAddr;
/// use tower_redis_ratelimit::{ClientIp, KeyExtractor};
///
/// let ip = ClientIp::new().trust("10.0.0.0/8")?;
/// let mut req = http::Request::get("/")
///     .header("x-forwarded-for", "6.6.6.6, 198.51.100.4, 10.0.0.7")
///     .body(())
///     .unwrap();
/// req.extensions_mut().insert("10.0.0.2:443".parse::<SocketAddr>().unwrap());
/// // 6.6.6.6 was written by the client; 198.51.100.4 is who connected to our proxies.
/// assert_eq!(ip.extract(&req.into_parts().0).as_deref(), Some("198.51.100.4"));
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct ClientIp {
    trusted: Vec<IpNet>,
}

impl ClientIp {
    /// No trusted proxies yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the proxies in `cidr` (e.g. `10.0.0.0/8`, `2001:db8::/32`, or one address).
    /// An invalid CIDR is rejected (field `trusted_proxy`).
    pub fn trust(mut self, cidr: &str) -> Result<Self, ConfigError> {
        let net = cidr
            .parse::<IpNet>()
            .or_else(|_| cidr.parse::<IpAddr>().map(IpNet::from))
            .map_err(|_| {
                ConfigError::new(
                    "trusted_proxy",
                    format!("{cidr:?} is not a CIDR or address"),
                )
            })?;
        self.trusted.push(net);
        Ok(self)
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    fn client(&self, parts: &Parts) -> Option<IpAddr> {
        let peer = peer_ip(parts)?;
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        let mut entries = parts
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .flat_map(|v| v.as_bytes().rsplit(|&b| b == b','));
        entries
            .try_fold((), |(), raw| {
                let ip = std::str::from_utf8(raw)
                    .ok()
                    .and_then(|s| s.trim().parse::<IpAddr>().ok())
                    .map(canonical);
                match ip {
                    Some(ip) if self.is_trusted(ip) => Ok(()),
                    Some(ip) => Err(Some(ip)),
                    None => Err(None),
                }
            })
            .err()
            .flatten()
            .or(Some(peer))
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, parts: &Parts) -> Option<String> {
        self.client(parts).map(|ip| ip.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn client(peer: &str, xff: &[&str]) -> Option<String> {
        let mut b = http::Request::get("/");
        for v in xff {
            b = b.header("x-forwarded-for", *v);
        }
        let mut req = b.body(()).unwrap();
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        let ip = ClientIp::new()
            .trust("10.0.0.0/8")
            .unwrap()
            .trust("2001:db8::1")
            .unwrap();
        ip.extract(&req.into_parts().0)
    }

    #[test]
    fn walks_from_the_right_past_trusted_proxies() {
        let peer = "10.1.1.1:1";
        assert_eq!(client("8.8.8.8:1", &["1.1.1.1"]).unwrap(), "8.8.8.8");
        assert_eq!(client(peer, &["1.1.1.1, 2.2.2.2"]).unwrap(), "2.2.2.2");
        assert_eq!(
            client(peer, &["1.1.1.1, 2.2.2.2, 10.9.9.9"]).unwrap(),
            "2.2.2.2"
        );
        assert_eq!(
            client(peer, &["1.1.1.1", "2.2.2.2, 10.0.0.3"]).unwrap(),
            "2.2.2.2"
        );
        assert_eq!(client(peer, &["1.1.1.1, garbage"]).unwrap(), "10.1.1.1");
        assert_eq!(client(peer, &["10.2.2.2"]).unwrap(), "10.1.1.1");
        assert_eq!(client(peer, &[]).unwrap(), "10.1.1.1");
        assert_eq!(client(peer, &[" ::ffff:1.2.3.4 "]).unwrap(), "1.2.3.4");
        assert_eq!(
            client("[2001:db8::1]:1", &["2001:db8::9"]).unwrap(),
            "2001:db8::9"
        );
    }

    #[test]
    fn rejects_bad_cidrs() {
        assert_eq!(
            ClientIp::new().trust("10.0.0.0/33").unwrap_err().field(),
            "trusted_proxy"
        );
        assert!(ClientIp::new().trust("192.168.1.1").is_ok());
    }
}
