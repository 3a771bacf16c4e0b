//! Allow and deny lists: keys and networks a layer never limits, or always refuses.

use std::{collections::HashSet, fmt, net::IpAddr};

use http::request::Parts;
use ipnet::IpNet;

use crate::{
    error::ConfigError,
    extract::{ClientIp, Key, Repr},
};

/// Keys and client networks, for [`RateLimitLayer::allow`](super::RateLimitLayer::allow) and
/// [`RateLimitLayer::deny`](super::RateLimitLayer::deny).
///
/// An entry that reads as an address or a CIDR (`10.0.0.0/8`, `2001:db8::/32`,
/// `203.0.113.7`) matches the request's client address as a [`ClientIp`] finds it (the peer,
/// or what trusted proxies forwarded; see [`RateLimitLayer::list_addresses`](super::RateLimitLayer::list_addresses)),
/// whatever the layer's key is. Any other entry matches the request's key, written as the
/// key extractor produced it (a header's value, `tenant-42`).
///
/// ```
/// use tower_redis_ratelimit::rate_limit::AccessList;
///
/// let vips = AccessList::parse(["monitoring", "10.0.0.0/8", "2001:db8::/32"])?;
/// assert_eq!((vips.keys(), vips.networks()), (1, 2));
/// assert!(AccessList::parse(["10.0.0.0/33"]).is_err());
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AccessList {
    keys: HashSet<Box<[u8]>>,
    nets: Vec<IpNet>,
}

impl fmt::Debug for AccessList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessList")
            .field("keys", &self.keys.len())
            .field("networks", &self.nets)
            .finish()
    }
}

impl AccessList {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// A list of `entries`, each a key, an address or a CIDR (see [`AccessList`]). An entry
    /// that is empty, or that looks like a CIDR but is not one (`10.0.0.0/33`), is a
    /// [`ConfigError`] naming `list`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `list` for the first entry that is empty or looks like a
    /// network but does not read as one.
    pub fn parse<S: AsRef<str>>(entries: impl IntoIterator<Item = S>) -> Result<Self, ConfigError> {
        let mut list = Self::new();
        for entry in entries {
            list = list.entry(entry.as_ref())?;
        }
        Ok(list)
    }

    /// Adds one entry (see [`parse`](Self::parse)).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `list` when `entry` is empty or looks like a network but does
    /// not read as one.
    pub fn entry(mut self, entry: &str) -> Result<Self, ConfigError> {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(ConfigError::new("list", "an entry is empty"));
        }
        if let Ok(ip) = entry.parse::<IpAddr>() {
            self.nets.push(IpNet::from(canonical(ip)));
        } else if let Some((ip, _)) = entry
            .split_once('/')
            .filter(|(ip, _)| ip.parse::<IpAddr>().is_ok())
        {
            let net = entry.parse::<IpNet>().map_err(|_| {
                ConfigError::new("list", format!("{entry:?} is not a CIDR (address/bits)"))
            })?;
            // An IPv4 network written as IPv6 (`::ffff:10.0.0.0/104`) matches IPv4 clients.
            let net = match (ip.parse::<IpAddr>(), net) {
                (Ok(IpAddr::V6(v6)), IpNet::V6(n))
                    if v6.to_ipv4_mapped().is_some() && n.prefix_len() >= 96 =>
                {
                    match ipnet::Ipv4Net::new(
                        v6.to_ipv4_mapped()
                            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
                        n.prefix_len() - 96,
                    ) {
                        Ok(v4) => IpNet::V4(v4.trunc()),
                        Err(_) => net.trunc(),
                    }
                }
                _ => net.trunc(),
            };
            self.nets.push(net);
        } else {
            self.keys.insert(entry.as_bytes().into());
        }
        Ok(self)
    }

    /// Adds one entry given as bytes: an entry that is UTF-8 reads as [`entry`](Self::entry)
    /// reads it; any other is a key (bytes a key extractor may produce, e.g. a header's
    /// value, see [`Key::bytes`]), ASCII whitespace around it trimmed.
    ///
    /// # Errors
    ///
    /// As [`entry`](Self::entry), for an entry that is UTF-8.
    ///
    /// ```
    /// use tower_redis_ratelimit::rate_limit::AccessList;
    ///
    /// let list = AccessList::new()
    ///     .entry_bytes(b"\xff\xfeabuser")?
    ///     .entry_bytes(b"10.0.0.0/8")?;
    /// assert_eq!((list.keys(), list.networks()), (1, 1));
    /// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
    /// ```
    pub fn entry_bytes(mut self, entry: &[u8]) -> Result<Self, ConfigError> {
        match std::str::from_utf8(entry) {
            Ok(text) => self.entry(text),
            Err(_) => {
                self.keys.insert(entry.trim_ascii().into());
                Ok(self)
            }
        }
    }

    /// How many keys the list holds.
    pub fn keys(&self) -> usize {
        self.keys.len()
    }

    /// How many networks (and addresses) the list holds.
    pub fn networks(&self) -> usize {
        self.nets.len()
    }

    /// True when the list holds nothing.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.nets.is_empty()
    }

    /// Whether `key` or the client address `client` is on the list.
    fn matches(&self, key: Option<&Key<'_>>, client: Option<IpAddr>) -> bool {
        if let (Some(ip), false) = (client, self.nets.is_empty()) {
            let ip = canonical(ip);
            if self.nets.iter().any(|n| n.contains(&ip)) {
                return true;
            }
        }
        match key {
            Some(key) if !self.keys.is_empty() => key_text(key, |text| self.keys.contains(text)),
            _ => false,
        }
    }
}

/// `f` of `key`'s text as the key extractor wrote it (without a copy for text and bytes).
pub(crate) fn key_text<R>(key: &Key<'_>, f: impl FnOnce(&[u8]) -> R) -> R {
    match key.repr() {
        Repr::Text(t) => f(t.as_bytes()),
        Repr::Bytes(b) => f(b),
        _ => f(key.to_string().as_bytes()),
    }
}

/// An IPv4 address written as IPv6 (`::ffff:10.0.0.1`) is that IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// A layer's lists, and how they find a request's client address.
#[derive(Debug, Clone)]
pub(crate) struct Lists {
    pub(crate) allow: AccessList,
    pub(crate) deny: AccessList,
    pub(crate) client: ClientIp,
}

impl Default for Lists {
    fn default() -> Self {
        Self {
            allow: AccessList::new(),
            deny: AccessList::new(),
            client: ClientIp::new(),
        }
    }
}

/// What a layer's lists say of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listed {
    /// On the deny list: refused (`403`), whatever else it is on.
    Denied,
    /// On the allow list: no limit applies, no store is asked.
    Allowed,
    /// On neither.
    No,
}

impl Lists {
    /// Deny first, then allow. `key`: what the layer's key extractor found.
    pub(crate) fn check(&self, parts: &Parts, key: Option<&Key<'_>>) -> Listed {
        let wants_addr = !self.allow.nets.is_empty() || !self.deny.nets.is_empty();
        let client = wants_addr.then(|| self.client.client_addr(parts)).flatten();
        if self.deny.matches(key, client) {
            Listed::Denied
        } else if self.allow.matches(key, client) {
            Listed::Allowed
        } else {
            Listed::No
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_keys_addresses_or_networks() {
        let list = AccessList::parse([
            "vip",
            "10.0.0.0/8",
            "203.0.113.7",
            "2001:db8::/32",
            "::ffff:192.0.2.0/120",
        ])
        .unwrap();
        assert_eq!((list.keys(), list.networks()), (1, 4));
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let key = Key::from("vip");
        assert!(list.matches(Some(&key), None));
        assert!(!list.matches(Some(&Key::from("vip2")), ip("198.51.100.1")));
        assert!(list.matches(None, ip("10.200.3.4")));
        assert!(list.matches(None, ip("203.0.113.7")));
        assert!(!list.matches(None, ip("203.0.113.8")));
        assert!(list.matches(None, ip("2001:db8:ffff::1")));
        assert!(
            list.matches(None, ip("::ffff:10.0.0.1")),
            "a mapped address is IPv4"
        );
        assert!(
            list.matches(None, ip("192.0.2.200")),
            "a mapped network is IPv4"
        );
        // A key that is an address is matched by its text too.
        let by_text = AccessList::new().entry("tenant:203.0.113.9").unwrap();
        assert!(by_text.matches(Some(&Key::from("tenant:203.0.113.9")), None));
        for bad in ["", "  ", "10.0.0.0/33", "2001:db8::/129", "10.0.0.0/x"] {
            assert!(AccessList::parse([bad]).is_err(), "{bad:?}");
        }
    }

    /// An entry of bytes that are not UTF-8 is the key of those bytes, and only that key
    /// (not the text they read as with U+FFFD in place of each invalid sequence); one that is
    /// UTF-8 reads as the same entry given as text.
    #[test]
    fn entries_of_bytes_are_the_keys_of_those_bytes() {
        let list = AccessList::new()
            .entry_bytes(b" \xff\xfeabuser ")
            .unwrap()
            .entry_bytes(b"10.0.0.0/8")
            .unwrap()
            .entry_bytes("caf\u{e9}".as_bytes())
            .unwrap();
        assert_eq!((list.keys(), list.networks()), (2, 1));
        assert!(list.matches(Some(&Key::bytes(&b"\xff\xfeabuser"[..])), None));
        assert!(!list.matches(Some(&Key::bytes(&b"\xfe\xffabuser"[..])), None));
        assert!(!list.matches(Some(&Key::from("\u{fffd}\u{fffd}abuser")), None));
        assert!(list.matches(Some(&Key::from("caf\u{e9}")), None));
        assert!(list.matches(None, Some("10.1.2.3".parse().unwrap())));
        assert!(AccessList::new().entry_bytes(b" ").is_err());
        assert!(AccessList::new().entry_bytes(b"10.0.0.0/33").is_err());
    }
}
