use std::net::{IpAddr, Ipv6Addr};

use http::{header::FORWARDED, request::Parts};
use ipnet::{IpNet, Ipv6Net};

use super::{
    peer_ip::{canonical, peer_ip},
    KeyExtractor,
};
use crate::ConfigError;

/// Which header your trusted proxies append the client address to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`; the `for=` parameter of
    /// each element.
    Forwarded,
}

/// The client's IP address, read from the forwarding header only when the TCP peer is a
/// trusted proxy; IPv6 clients grouped by prefix (default /64).
///
/// **Spoofing model.** A client can write any `X-Forwarded-For` or `Forwarded` it likes; only
/// the entries your own proxies appended are true. So the header is used only when the peer
/// is in a trusted CIDR, and it is read from the right: trusted proxies are skipped and the
/// first untrusted address is the client. A malformed, `unknown` or obfuscated entry stops the
/// walk and the peer address is used. Read only the header your proxies write
/// ([`ProxyHeader`]); the other one is the client's to forge. With no trusted proxies this is
/// the peer address.
///
/// **IPv6.** One host usually owns a whole /64, so IPv6 clients are keyed by their /64
/// network (`2001:db8:1:2::/64`); [`ipv6_prefix`](Self::ipv6_prefix) changes it.
/// IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`) count as IPv4.
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
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: Vec<IpNet>,
    header: ProxyHeader,
    ipv6_prefix: u8,
}

impl Default for ClientIp {
    fn default() -> Self {
        Self {
            trusted: Vec::new(),
            header: ProxyHeader::default(),
            ipv6_prefix: 64,
        }
    }
}

impl ClientIp {
    /// No trusted proxies yet; `X-Forwarded-For`; IPv6 grouped by /64.
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

    /// Reads this header from trusted proxies (default `X-Forwarded-For`).
    pub fn header(mut self, header: ProxyHeader) -> Self {
        self.header = header;
        self
    }

    /// Keys IPv6 clients by their `/bits` network (default 64; 128 keys each address).
    /// Outside 1..=128 is rejected (field `ipv6_prefix`).
    pub fn ipv6_prefix(mut self, bits: u8) -> Result<Self, ConfigError> {
        if !(1..=128).contains(&bits) {
            return Err(ConfigError::new("ipv6_prefix", "must be 1 to 128"));
        }
        self.ipv6_prefix = bits;
        Ok(self)
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client address (not yet grouped): the peer, or the rightmost untrusted entry of the
    /// forwarding header when the peer is trusted.
    pub fn client_addr(&self, parts: &Parts) -> Option<IpAddr> {
        let peer = peer_ip(parts)?;
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        let name = match self.header {
            ProxyHeader::XForwardedFor => "x-forwarded-for",
            ProxyHeader::Forwarded => FORWARDED.as_str(),
        };
        // Header lines in order, then their comma-separated entries, walked from the right.
        let lines: Vec<&[u8]> = parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        for line in lines.into_iter().rev() {
            let Ok(line) = std::str::from_utf8(line) else {
                return Some(peer);
            };
            for entry in split_unquoted(line, ',').into_iter().rev() {
                let ip = match self.header {
                    ProxyHeader::XForwardedFor => entry.trim().parse::<IpAddr>().ok(),
                    ProxyHeader::Forwarded => forwarded_for(entry),
                };
                match ip.map(canonical) {
                    Some(ip) if self.is_trusted(ip) => continue,
                    Some(ip) => return Some(ip),
                    None => return Some(peer),
                }
            }
        }
        Some(peer)
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, parts: &Parts) -> Option<String> {
        self.client_addr(parts).map(|ip| match ip {
            IpAddr::V6(v6) if self.ipv6_prefix < 128 => {
                let net = Ipv6Net::new(v6, self.ipv6_prefix).map_or(v6, |n| n.network());
                format!("{}/{}", net, self.ipv6_prefix)
            }
            ip => ip.to_string(),
        })
    }
}

/// Splits on `sep` outside double-quoted strings (which may contain `\`-escapes).
fn split_unquoted(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// The address in the `for=` parameter of one RFC 7239 element, e.g. `for=192.0.2.1`,
/// `for="192.0.2.1:8080"`, `For="[2001:db8::1]:4711"`. `unknown`, obfuscated identifiers
/// (`_hidden`), a missing `for=` or anything malformed give `None`.
fn forwarded_for(element: &str) -> Option<IpAddr> {
    let value = split_unquoted(element, ';').into_iter().find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.trim().eq_ignore_ascii_case("for").then(|| v.trim())
    })?;
    let node = match value.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"')?,
        None => value,
    };
    if let Some(rest) = node.strip_prefix('[') {
        // [v6] or [v6]:port
        let (addr, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        return addr.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    // v4 or v4:port (a bare IPv6 without brackets is invalid in RFC 7239)
    let (addr, port) = match node.split_once(':') {
        Some((a, p)) => (a, Some(p)),
        None => (node, None),
    };
    if port.is_some_and(|p| !is_port(p)) {
        return None;
    }
    addr.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) || p.starts_with('_')
    // an obfuscated port still names a real address
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn extract(ip: &ClientIp, peer: &str, header: &str, values: &[&str]) -> String {
        let mut b = http::Request::get("/");
        for v in values {
            b = b.header(header, *v);
        }
        let mut req = b.body(()).unwrap();
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        ip.extract(&req.into_parts().0).unwrap()
    }

    fn trusted() -> ClientIp {
        ClientIp::new()
            .trust("10.0.0.0/8")
            .unwrap()
            .trust("2001:db8::1")
            .unwrap()
    }

    #[test]
    fn x_forwarded_for_table() {
        let ip = trusted().ipv6_prefix(128).unwrap();
        let xff = |peer: &str, values: &[&str]| extract(&ip, peer, "x-forwarded-for", values);
        let proxy = "10.1.1.1:1";
        // (peer, header lines, expected key)
        let table: &[(&str, &[&str], &str)] = &[
            ("8.8.8.8:1", &["1.1.1.1"], "8.8.8.8"), // untrusted peer: header ignored
            (proxy, &["1.1.1.1, 2.2.2.2"], "2.2.2.2"), // spoofed left-most entry ignored
            (proxy, &["1.1.1.1, 2.2.2.2, 10.9.9.9"], "2.2.2.2"), // trusted hops skipped
            (proxy, &["1.1.1.1", "2.2.2.2, 10.0.0.3"], "2.2.2.2"), // several header lines
            (proxy, &["1.1.1.1, garbage"], "10.1.1.1"), // malformed: the peer
            (proxy, &["10.2.2.2, 10.3.3.3"], "10.1.1.1"), // all trusted: the peer
            (proxy, &[], "10.1.1.1"),
            (proxy, &[" ::ffff:1.2.3.4 "], "1.2.3.4"), // IPv4-mapped unwrapped
            (proxy, &["1.1.1.1,,2.2.2.2"], "2.2.2.2"),
            (proxy, &["2.2.2.2,"], "10.1.1.1"), // empty right-most entry is malformed
            ("[2001:db8::1]:1", &["2001:db8::9"], "2001:db8::9"),
            ("[::ffff:10.0.0.1]:1", &["3.3.3.3"], "3.3.3.3"), // mapped trusted peer
        ];
        for (peer, values, want) in table {
            assert_eq!(xff(peer, values), *want, "{peer} {values:?}");
        }
    }

    #[test]
    fn forwarded_table() {
        let ip = trusted()
            .header(ProxyHeader::Forwarded)
            .ipv6_prefix(128)
            .unwrap();
        let fwd = |values: &[&str]| extract(&ip, "10.1.1.1:1", "forwarded", values);
        let table: &[(&[&str], &str)] = &[
            (&["for=192.0.2.60;proto=http;by=203.0.113.43"], "192.0.2.60"),
            (&["for=6.6.6.6, for=192.0.2.61"], "192.0.2.61"),
            (&[r#"For="[2001:db8:cafe::17]:4711""#], "2001:db8:cafe::17"),
            (&[r#"for="[2001:db8:cafe::17]""#], "2001:db8:cafe::17"),
            (&[r#"for="192.0.2.43:47011", for=10.0.0.5"#], "192.0.2.43"),
            (&["for=192.0.2.1", "for=10.2.3.4;by=x"], "192.0.2.1"),
            (&["for=unknown"], "10.1.1.1"),
            (&["for=_hidden, for=10.2.2.2"], "10.1.1.1"),
            (&["proto=https"], "10.1.1.1"),
            (&["for=2001:db8::5"], "10.1.1.1"), // unbracketed IPv6 is invalid
            (&[r#"for="[2001:db8::5"#], "10.1.1.1"),
            (&[r#"for="1.2.3.4;x=\"a,b\"""#], "10.1.1.1"),
            (&[r#"for=1.2.3.4;note="a, b""#], "1.2.3.4"), // comma inside quotes
            (&["for=\"[::ffff:1.2.3.4]:80\""], "1.2.3.4"),
            (&["for=1.2.3.4:99999999"], "10.1.1.1"),
        ];
        for (values, want) in table {
            assert_eq!(fwd(values), *want, "{values:?}");
        }
    }

    #[test]
    fn ipv6_grouped_by_prefix() {
        let ip = ClientIp::new();
        let key = |peer| extract(&ip, peer, "x-forwarded-for", &[]);
        assert_eq!(key("[2001:db8:1:2:aaaa::1]:5"), "2001:db8:1:2::/64");
        assert_eq!(key("[2001:db8:1:2:bbbb::9]:5"), "2001:db8:1:2::/64");
        assert_eq!(key("[2001:db8:1:3::1]:5"), "2001:db8:1:3::/64");
        assert_eq!(key("203.0.113.9:5"), "203.0.113.9");
        let ip48 = ClientIp::new().ipv6_prefix(48).unwrap();
        assert_eq!(
            extract(&ip48, "[2001:db8:1:2::1]:5", "x-forwarded-for", &[]),
            "2001:db8:1::/48"
        );
        assert_eq!(
            ClientIp::new().ipv6_prefix(0).unwrap_err().field(),
            "ipv6_prefix"
        );
        assert_eq!(
            ClientIp::new().ipv6_prefix(129).unwrap_err().field(),
            "ipv6_prefix"
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
