use std::{net::IpAddr, ops::ControlFlow};

use http::{header::FORWARDED, request::Parts};
use ipnet::IpNet;

use super::{canonical, peer_ip::peer_ip, Key, KeyExtractor};
use crate::error::ConfigError;

/// Which header your trusted proxies append the client address to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default). An entry is an address,
    /// optionally with a port: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`, `[2001:db8::1]`,
    /// `[2001:db8::1]:443`.
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
/// is in a trusted CIDR, and it is read from the right (the last header line first, each line
/// from its last entry): trusted proxies are skipped and the first untrusted address is the
/// client. What lies to the left of that entry is the client's own text and is never parsed,
/// however malformed (quotes, bytes that are not UTF-8, stray commas). Read only the header
/// your proxies write ([`ProxyHeader`]); the other one is the client's to forge. With no
/// trusted proxies this is the peer address.
///
/// **No address.** When the walk meets a malformed entry (empty, `unknown`, an obfuscated
/// `_name`, garbage) before any untrusted address, or every entry is a trusted proxy, the key
/// is the peer address. A client cannot steer a request there: each trusted proxy appends the
/// address that connected to it, so the right-most untrusted entry is always written by one
/// of your proxies and is a real address. It happens when a trusted proxy appends no address
/// (`for=unknown`, a Unix-socket listener, a proxy that passes the header on without adding
/// to it) or when the request comes from a proxy itself; those requests share the peer's
/// quota. Trusted CIDRs must hold only proxies: a host inside them can claim any address.
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
/// assert_eq!(ip.extract(&req.into_parts().0).unwrap().to_string(), "198.51.100.4");
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
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `trusted_proxy` when `cidr` is not an address or a network in
    /// CIDR notation.
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
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `ipv6_prefix` when `bits` is outside the range above.
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
        // Bytes, not text: a line is never rejected as a whole, so what a client wrote on the
        // left cannot hide what our proxies appended on the right.
        for line in parts.headers.get_all(name).iter().rev() {
            let line = line.as_bytes();
            let walk = match self.header {
                // No quoted strings in X-Forwarded-For: a `"` is just a malformed entry.
                ProxyHeader::XForwardedFor => self.walk(line.rsplit(|&b| b == b',').map(xff_entry)),
                ProxyHeader::Forwarded => self.walk(rsplit_quoted(line, b',').map(forwarded_for)),
            };
            if let ControlFlow::Break(client) = walk {
                return Some(client.unwrap_or(peer));
            }
        }
        Some(peer)
    }

    /// Skips trusted proxies; stops at the first untrusted address, or with `None` at a
    /// malformed entry (the client cannot be identified).
    fn walk(&self, entries: impl Iterator<Item = Option<IpAddr>>) -> ControlFlow<Option<IpAddr>> {
        for entry in entries {
            match entry.map(canonical) {
                Some(ip) if self.is_trusted(ip) => {}
                found => return ControlFlow::Break(found),
            }
        }
        ControlFlow::Continue(())
    }
}

impl KeyExtractor for ClientIp {
    fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
        self.client_addr(parts).map(|ip| match ip {
            IpAddr::V6(_) => Key::network(ip, self.ipv6_prefix),
            ip => Key::ip(ip),
        })
    }
}

/// One `X-Forwarded-For` entry: an address, optionally with a port (see
/// [`ProxyHeader::XForwardedFor`]), between spaces or tabs.
fn xff_entry(entry: &[u8]) -> Option<IpAddr> {
    let entry = std::str::from_utf8(entry.trim_ascii()).ok()?;
    entry.parse().ok().or_else(|| node(entry, is_port))
}

/// The address in the `for=` parameter of one RFC 7239 element, e.g. `for=192.0.2.1`,
/// `for="192.0.2.1:8080"`, `For="[2001:db8::1]:4711"`. `unknown`, obfuscated identifiers
/// (`_hidden`), a missing or repeated `for=` or anything malformed give `None`.
fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    let mut values = rsplit_quoted(element, b';').filter_map(|pair| {
        let eq = pair.iter().position(|&b| b == b'=')?;
        let (name, value) = pair.split_at(eq);
        name.trim_ascii()
            .eq_ignore_ascii_case(b"for")
            .then(|| value[1..].trim_ascii())
    });
    let value = values.next()?;
    if values.next().is_some() {
        return None; // RFC 7239: a parameter occurs at most once per element
    }
    let value = std::str::from_utf8(value).ok()?;
    let value = match value.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"')?,
        None => value,
    };
    // A bare IPv6 address without brackets is invalid in RFC 7239.
    node(value, |p| is_port(p) || is_obfuscated_port(p))
}

/// `192.0.2.1`, `192.0.2.1:port`, `[2001:db8::1]` or `[2001:db8::1]:port`.
fn node(node: &str, port_ok: fn(&str) -> bool) -> Option<IpAddr> {
    let (addr, after) = match node.strip_prefix('[') {
        Some(rest) => {
            let (v6, after) = rest.split_once(']')?;
            (IpAddr::V6(v6.parse().ok()?), after)
        }
        None => {
            let (v4, after) = node.split_at(node.find(':').unwrap_or(node.len()));
            (IpAddr::V4(v4.parse().ok()?), after)
        }
    };
    match after {
        "" => Some(addr),
        _ => after.strip_prefix(':').filter(|p| port_ok(p)).map(|_| addr),
    }
}

/// 1 to 5 digits.
fn is_port(p: &str) -> bool {
    (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit())
}

/// RFC 7239 `obfport`: `_` and letters, digits, `.`, `_`, `-`. It still names a real address.
fn is_obfuscated_port(p: &str) -> bool {
    p.strip_prefix('_').is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    })
}

/// Splits `s` on `sep` from the right, except inside double-quoted strings (which may hold
/// `\`-escapes). Scanning right to left, a quote can only change how the bytes to its *left*
/// are split: a stray `"` in the client's part cannot swallow the elements our proxies
/// appended after it.
fn rsplit_quoted(s: &[u8], sep: u8) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let s = rest?;
        let mut quoted = false;
        for i in (0..s.len()).rev() {
            match s[i] {
                // Right to left, a quote outside a string closes one...
                b'"' if !quoted => quoted = true,
                // ...and inside one it opens it, unless it is an escaped `\"`.
                b'"' if !escaped(&s[..i]) => quoted = false,
                b if b == sep && !quoted => {
                    rest = Some(&s[..i]);
                    return Some(&s[i + 1..]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(s)
    })
}

/// Whether the byte after `before` is escaped: `before` ends in an odd run of `\`.
fn escaped(before: &[u8]) -> bool {
    before.iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn extract<V: AsRef<[u8]>>(ip: &ClientIp, peer: &str, header: &str, values: &[V]) -> String {
        let mut b = http::Request::get("/");
        for v in values {
            b = b.header(header, http::HeaderValue::from_bytes(v.as_ref()).unwrap());
        }
        let mut req = b.body(()).unwrap();
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        ip.extract(&req.into_parts().0).unwrap().to_string()
    }

    const NO_LINES: &[&str] = &[];

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

    /// The header is read from the right and the walk stops at the first untrusted address;
    /// nothing to its left (the client's part) is even parsed.
    #[test]
    fn x_forwarded_for_shapes() {
        let ip = trusted().ipv6_prefix(128).unwrap();
        let peer = "10.1.1.1";
        // (header lines, expected key)
        let table: &[(&[&[u8]], &str)] = &[
            // Ports and brackets.
            (&[b"1.2.3.4:80"], "1.2.3.4"),
            (&[b"1.2.3.4:80, 10.0.0.3:8080"], "1.2.3.4"),
            (&[b"[2001:db8::2]:443"], "2001:db8::2"),
            (&[b"[2001:db8::2]"], "2001:db8::2"),
            (&[b"2001:db8::2"], "2001:db8::2"),
            (&[b"2.2.2.2, [2001:db8::1]:443"], "2.2.2.2"), // trusted v6 hop with a port
            (&[b"[::ffff:1.2.3.4]:80"], "1.2.3.4"),
            (&[b" \t1.2.3.4:65535\t "], "1.2.3.4"),
            // Malformed addresses and ports.
            (&[b"1.2.3.4:"], peer),
            (&[b"1.2.3.4:123456"], peer),
            (&[b"1.2.3.4:8a"], peer),
            (&[b"1.2.3.4:+80"], peer),
            (&[b"[2001:db8::2]:"], peer),
            (&[b"[2001:db8::2]x"], peer),
            (&[b"[1.2.3.4]"], peer),
            (&[b"[2001:db8::2"], peer),
            (&[b"2001:db8::2]:443"], peer),
            (&[b"\"1.2.3.4\""], peer), // XFF has no quoted strings
            (&[b"1.2.3.4 5.6.7.8"], peer),
            (&[b"unknown"], peer),
            // Garbage left of the client's entry never matters.
            (&[b"\", 2.2.2.2"], "2.2.2.2"),
            (&[b"\"1.1.1.1, 2.2.2.2"], "2.2.2.2"),
            (&[b"\"a, b\", 2.2.2.2, 10.0.0.3"], "2.2.2.2"),
            (&[b"garbage, 2.2.2.2:81, 10.0.0.3"], "2.2.2.2"),
            (&[b"\xff, 2.2.2.2"], "2.2.2.2"),
            (&[b"1.1.1.1\xfe\xff, 2.2.2.2, 10.0.0.3"], "2.2.2.2"),
            (&[b"\"\xc3, [2001:db8::2]:443"], "2001:db8::2"),
            (&[b"\xff\"", b"2.2.2.2"], "2.2.2.2"),
            (&[b"garbage", b"1.1.1.1, 2.2.2.2", b"10.0.0.3"], "2.2.2.2"),
            // The right-most untrusted entry malformed: the peer.
            (&[b"2.2.2.2, garbage, 10.0.0.3"], peer),
            (&[b"2.2.2.2, 1.1.1.1\xff"], peer),
            (&[b"2.2.2.2", b"\xff"], peer),
            (&[b"\xff, 10.0.0.3"], peer),
            // All trusted, several lines: the peer.
            (&[b"10.2.2.2", b"10.3.3.3:1, [2001:db8::1]"], peer),
            // Empty entries: skipped only when they are the client's.
            (&[b"1.1.1.1, , 2.2.2.2"], "2.2.2.2"),
            (&[b"2.2.2.2, , 10.0.0.3"], peer),
            (&[b""], peer),
            (&[b"2.2.2.2", b""], peer),
            (&[b",", b"2.2.2.2"], "2.2.2.2"),
        ];
        let wrong: Vec<String> = table
            .iter()
            .filter_map(|(values, want)| {
                let got = extract(&ip, "10.1.1.1:1", "x-forwarded-for", values);
                let shown: Vec<_> = values.iter().map(|v| String::from_utf8_lossy(v)).collect();
                (got != *want).then(|| format!("{shown:?}: got {got}, want {want}"))
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn forwarded_shapes() {
        let ip = trusted()
            .header(ProxyHeader::Forwarded)
            .ipv6_prefix(128)
            .unwrap();
        let peer = "10.1.1.1";
        let table: &[(&[&[u8]], &str)] = &[
            // Quotes and garbage left of the client's element never matter.
            (&[b"\", for=192.0.2.61"], "192.0.2.61"),
            (&[b"for=\"6.6.6.6, for=192.0.2.61"], "192.0.2.61"),
            (&[b"for=6.6.6.6\", for=\"192.0.2.61:80\""], "192.0.2.61"),
            (
                &[b"for=\"\\\", for=\"192.0.2.61\";by=10.0.0.1"],
                "192.0.2.61",
            ),
            (&[b"\";\";=, for=192.0.2.61, for=10.0.0.5"], "192.0.2.61"),
            (&[b"for=\"", b"for=192.0.2.61"], "192.0.2.61"),
            (&[b"for=\xff, for=192.0.2.61"], "192.0.2.61"),
            (&[b"for=\"\xff, for=192.0.2.61"], "192.0.2.61"),
            (
                &[b"for=192.0.2.1", b"for=10.2.3.4;by=\"\xff\""],
                "192.0.2.1",
            ),
            (&[b"\xff", b"for=192.0.2.1, for=10.2.3.4"], "192.0.2.1"),
            // Quoted strings in the proxies' elements, with escapes and separators inside.
            (&[b"for=192.0.2.62;by=\"a\\\"b, c;d\""], "192.0.2.62"),
            (
                &[b"for=\"192.0.2.63\";x=\"\\\\\", for=10.0.0.5"],
                "192.0.2.63",
            ),
            (&[b"proto=https;for=\"[2001:db8::7]:443\""], "2001:db8::7"),
            (&[b"for=\"192.0.2.43:_abc\""], "192.0.2.43"),
            (&[b"for=192.0.2.1, for=\"[2001:db8::1]:80\""], "192.0.2.1"),
            // The right-most untrusted element malformed: the peer.
            (&[b"for=192.0.2.1, for=\"bad\", for=10.0.0.5"], peer),
            (&[b"for=192.0.2.1, for=\"192.0.2.2"], peer),
            (&[b"for=192.0.2.1, for=192.0.2.2\""], peer),
            (&[b"for=192.0.2.1, for=\"192.0.2.2:\""], peer),
            (&[b"for=192.0.2.1, for=\"192.0.2.2:_\""], peer),
            (&[b"for=1.2.3.4;for=5.6.7.8"], peer), // a parameter at most once
            (&[b"for=192.0.2.1", b"for=\xff"], peer),
            // All trusted; empty elements.
            (&[b"for=10.2.2.2, for=10.3.3.3"], peer),
            (&[b"for=6.6.6.6,, for=192.0.2.1"], "192.0.2.1"),
            (&[b"for=192.0.2.1,,for=10.0.0.5"], peer),
            (&[b""], peer),
        ];
        let wrong: Vec<String> = table
            .iter()
            .filter_map(|(values, want)| {
                let got = extract(&ip, "10.1.1.1:1", "forwarded", values);
                let shown: Vec<_> = values.iter().map(|v| String::from_utf8_lossy(v)).collect();
                (got != *want).then(|| format!("{shown:?}: got {got}, want {want}"))
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn ipv6_grouped_by_prefix() {
        let ip = ClientIp::new();
        let key = |peer| extract(&ip, peer, "x-forwarded-for", NO_LINES);
        assert_eq!(key("[2001:db8:1:2:aaaa::1]:5"), "2001:db8:1:2::/64");
        assert_eq!(key("[2001:db8:1:2:bbbb::9]:5"), "2001:db8:1:2::/64");
        assert_eq!(key("[2001:db8:1:3::1]:5"), "2001:db8:1:3::/64");
        assert_eq!(key("203.0.113.9:5"), "203.0.113.9");
        let ip48 = ClientIp::new().ipv6_prefix(48).unwrap();
        assert_eq!(
            extract(&ip48, "[2001:db8:1:2::1]:5", "x-forwarded-for", NO_LINES),
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
