//! A request's rate-limit key, borrowed from the request where it can be.

use std::{
    borrow::Cow,
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

/// A request's rate-limit key: text or bytes (borrowed from a header where possible), an IP
/// address, an IP network, or a number. It reaches the store without a `String` per request.
///
/// Keys of different kinds never meet: an API key `"203.0.113.7"` and the IP address
/// 203.0.113.7 are different keys, so an extractor that falls back from one kind to another
/// ([`KeyExtractor::or`](super::KeyExtractor::or)) cannot be made to spend the other's quota.
///
/// ```
/// use std::net::{IpAddr, Ipv4Addr};
/// use tower_redis_ratelimit::extract::Key;
///
/// let api_key = Key::from("k-123");
/// let ip = Key::from(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)));
/// let tenant = Key::from(42u64);
/// assert_eq!(ip.to_string(), "203.0.113.7");
/// assert_ne!(Key::from("203.0.113.7"), ip);
/// # let _ = (api_key, tenant);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key<'a>(Repr<'a>);

/// What a [`Key`] holds, for a store that writes its own form of it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum Repr<'a> {
    Text(Cow<'a, str>),
    /// Bytes that are not UTF-8.
    Bytes(Cow<'a, [u8]>),
    Ip(IpAddr),
    Net(IpAddr, u8),
    Number(u64),
}

impl<'a> Key<'a> {
    /// Text, e.g. an API key or a user id.
    pub fn text(text: impl Into<Cow<'a, str>>) -> Self {
        Self(Repr::Text(text.into()))
    }

    /// Bytes, e.g. a header value that may not be UTF-8. Bytes that are valid UTF-8 are the
    /// same key as that text.
    pub fn bytes(bytes: impl Into<Cow<'a, [u8]>>) -> Self {
        Self(match bytes.into() {
            Cow::Borrowed(b) => match std::str::from_utf8(b) {
                Ok(s) => Repr::Text(Cow::Borrowed(s)),
                Err(_) => Repr::Bytes(Cow::Borrowed(b)),
            },
            Cow::Owned(b) => match String::from_utf8(b) {
                Ok(s) => Repr::Text(Cow::Owned(s)),
                Err(e) => Repr::Bytes(Cow::Owned(e.into_bytes())),
            },
        })
    }

    /// An IP address; IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`) are their IPv4 address.
    pub fn ip(ip: IpAddr) -> Self {
        Self(Repr::Ip(canonical(ip)))
    }

    /// The IP network of `ip` with a prefix of `bits` (e.g. an IPv6 client's /64); `bits` at
    /// or above the address length is the address itself.
    pub fn network(ip: IpAddr, bits: u8) -> Self {
        let ip = canonical(ip);
        match ip {
            IpAddr::V4(v4) if bits < 32 => {
                let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
                Self(Repr::Net(Ipv4Addr::from(u32::from(v4) & mask).into(), bits))
            }
            IpAddr::V6(v6) if bits < 128 => {
                let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
                Self(Repr::Net(
                    Ipv6Addr::from(u128::from(v6) & mask).into(),
                    bits,
                ))
            }
            ip => Self(Repr::Ip(ip)),
        }
    }

    /// A number, e.g. a tenant id.
    pub const fn number(n: u64) -> Self {
        Self(Repr::Number(n))
    }

    /// The same key, owning what it borrowed.
    pub fn into_owned(self) -> Key<'static> {
        Key(match self.0 {
            Repr::Text(t) => Repr::Text(Cow::Owned(t.into_owned())),
            Repr::Bytes(b) => Repr::Bytes(Cow::Owned(b.into_owned())),
            Repr::Ip(ip) => Repr::Ip(ip),
            Repr::Net(ip, bits) => Repr::Net(ip, bits),
            Repr::Number(n) => Repr::Number(n),
        })
    }

    /// The key's text or bytes, when it is text or bytes.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Repr::Text(t) => Some(t.as_bytes()),
            Repr::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// What the key holds.
    pub(crate) fn repr(&self) -> &Repr<'a> {
        &self.0
    }

    /// Writes a compact binary form, unique per key (a tag byte and the payload; long text as
    /// its SHA-1): for in-memory lookups, where no one reads the key.
    #[inline]
    pub(crate) fn write_compact(&self, max_len: usize, out: &mut impl Out) {
        let (tag, bytes) = match &self.0 {
            Repr::Text(t) => (0, t.as_bytes()),
            Repr::Bytes(b) => (6, &b[..]),
            _ => (0, &[][..]),
        };
        match &self.0 {
            Repr::Text(_) | Repr::Bytes(_) if bytes.len() > max_len => {
                out.put(&[tag + 1]);
                out.put(&sha1_smol::Sha1::from(bytes).digest().bytes());
            }
            Repr::Text(_) | Repr::Bytes(_) => {
                out.put(&[tag]);
                out.put(bytes);
            }
            // The tag and the bytes in one write: numbers and addresses are the common keys.
            Repr::Ip(IpAddr::V4(v4)) => {
                let [a, b, c, d] = v4.octets();
                out.put(&[2, a, b, c, d]);
            }
            Repr::Ip(IpAddr::V6(v6)) => {
                let mut tagged = [3; 17];
                tagged[1..].copy_from_slice(&v6.octets());
                out.put(&tagged);
            }
            Repr::Net(ip, bits) => {
                out.put(&[4, *bits]);
                match ip {
                    IpAddr::V4(v4) => out.put(&v4.octets()),
                    IpAddr::V6(v6) => out.put(&v6.octets()),
                }
            }
            Repr::Number(n) => {
                let mut tagged = [5; 9];
                tagged[1..].copy_from_slice(&n.to_be_bytes());
                out.put(&tagged);
            }
        }
    }

    /// The bytes [`write_compact`](Self::write_compact) writes, as two parts (the tag with
    /// whatever fits beside it in `scratch`, then the key's own bytes, or nothing): read in
    /// place, without copying a text key.
    pub(crate) fn compact_parts<'s>(
        &'s self,
        max_len: usize,
        scratch: &'s mut [u8; COMPACT_SCRATCH],
    ) -> (&'s [u8], &'s [u8]) {
        let (tag, bytes) = match &self.0 {
            Repr::Text(t) => (0, t.as_bytes()),
            Repr::Bytes(b) => (6, &b[..]),
            _ => (0, &[][..]),
        };
        let len = match &self.0 {
            Repr::Text(_) | Repr::Bytes(_) if bytes.len() > max_len => {
                scratch[0] = tag + 1;
                scratch[1..21].copy_from_slice(&sha1_smol::Sha1::from(bytes).digest().bytes());
                21
            }
            Repr::Text(_) | Repr::Bytes(_) => {
                scratch[0] = tag;
                return (&scratch[..1], bytes);
            }
            Repr::Ip(IpAddr::V4(v4)) => {
                scratch[0] = 2;
                scratch[1..5].copy_from_slice(&v4.octets());
                5
            }
            Repr::Ip(IpAddr::V6(v6)) => {
                scratch[0] = 3;
                scratch[1..17].copy_from_slice(&v6.octets());
                17
            }
            Repr::Net(ip, bits) => {
                scratch[..2].copy_from_slice(&[4, *bits]);
                match ip {
                    IpAddr::V4(v4) => {
                        scratch[2..6].copy_from_slice(&v4.octets());
                        6
                    }
                    IpAddr::V6(v6) => {
                        scratch[2..18].copy_from_slice(&v6.octets());
                        18
                    }
                }
            }
            Repr::Number(n) => {
                scratch[0] = 5;
                scratch[1..9].copy_from_slice(&n.to_be_bytes());
                9
            }
        };
        (&scratch[..len], &[])
    }
}

/// Room for the part of a compact key that is not the key's own bytes: a tag and a SHA-1.
pub(crate) const COMPACT_SCRATCH: usize = 21;

/// Where a key is written: a buffer on the stack, a `Vec`.
pub(crate) trait Out {
    fn put(&mut self, bytes: &[u8]);
}

impl Out for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// IPv4-mapped IPv6 addresses as IPv4.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl fmt::Display for Key<'_> {
    /// The key as a person reads it: text as is (bytes that are not UTF-8 replaced), an
    /// address, `ADDR/BITS`, a number.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Text(t) => f.write_str(t),
            Repr::Bytes(b) => f.write_str(&String::from_utf8_lossy(b)),
            Repr::Ip(ip) => write!(f, "{ip}"),
            Repr::Net(ip, bits) => write!(f, "{ip}/{bits}"),
            Repr::Number(n) => write!(f, "{n}"),
        }
    }
}

impl fmt::Debug for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.0 {
            Repr::Text(_) => "Key::text",
            Repr::Bytes(_) => "Key::bytes",
            Repr::Ip(_) => "Key::ip",
            Repr::Net(..) => "Key::network",
            Repr::Number(_) => "Key::number",
        };
        write!(f, "{kind}({self})")
    }
}

impl<'a> From<&'a str> for Key<'a> {
    fn from(s: &'a str) -> Self {
        Key::text(s)
    }
}

impl<'a> From<&'a String> for Key<'a> {
    fn from(s: &'a String) -> Self {
        Key::text(s.as_str())
    }
}

impl From<String> for Key<'static> {
    fn from(s: String) -> Self {
        Key::text(s)
    }
}

impl From<IpAddr> for Key<'static> {
    fn from(ip: IpAddr) -> Self {
        Key::ip(ip)
    }
}

impl From<u64> for Key<'static> {
    fn from(n: u64) -> Self {
        Key::number(n)
    }
}

impl<'a> From<&'a Key<'a>> for Key<'a> {
    fn from(key: &'a Key<'a>) -> Self {
        Key(match &key.0 {
            Repr::Text(t) => Repr::Text(Cow::Borrowed(t)),
            Repr::Bytes(b) => Repr::Bytes(Cow::Borrowed(b)),
            other => other.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_forms_are_unique_per_key() {
        let compact = |k: Key<'_>| {
            let mut out = Vec::new();
            k.write_compact(128, &mut out);
            out
        };
        let v4: IpAddr = "203.0.113.7".parse().unwrap();
        let keys = [
            compact(Key::from("203.0.113.7")),
            compact(Key::ip(v4)),
            compact(Key::network(v4, 24)),
            compact(Key::number(42)),
            compact(Key::from("42")),
            compact(Key::from("x".repeat(129))),
            compact(Key::from("x".repeat(128))),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    /// The two parts read in place are the bytes written, for every kind of key.
    #[test]
    fn compact_parts_are_the_compact_form() {
        let v4: IpAddr = "203.0.113.7".parse().unwrap();
        let v6: IpAddr = "2001:db8::7".parse().unwrap();
        let bytes = [0u8, 255, 7];
        let keys = [
            Key::from("203.0.113.7"),
            Key::from(""),
            Key::ip(v4),
            Key::ip(v6),
            Key::network(v4, 24),
            Key::network(v6, 64),
            Key::number(42),
            Key::number(u64::MAX),
            Key::from("x".repeat(129)),
            Key::from("x".repeat(128)),
            Key::bytes(&bytes[..]),
            Key::bytes(vec![9u8; 200]),
        ];
        for key in &keys {
            let mut written = Vec::new();
            key.write_compact(128, &mut written);
            let mut scratch = [0; COMPACT_SCRATCH];
            let (head, tail) = key.compact_parts(128, &mut scratch);
            assert_eq!([head, tail].concat(), written, "{key:?}");
        }
    }
}
