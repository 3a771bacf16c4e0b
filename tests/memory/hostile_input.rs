//! Property tests of everything a client can reach: key extractors and header rendering with
//! random, non-UTF-8, empty and 64 KiB inputs never panic, keys stay bounded, headers stay
//! well-formed. Bounded: a few hundred cases each.

use std::net::SocketAddr;

use http::{request::Parts, HeaderValue, Request};
use proptest::prelude::*;
use tower_redis_ratelimit::{
    extract::ProxyHeader, ClientIp, Gcra, HeaderKey, KeyExtractor, MemoryStore, PeerIp, Quota,
    RateLimiter,
};

/// Bytes a header value may hold: visible ASCII, space, tab and obs-text (0x80-0xFF).
fn header_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            8 => 0x20u8..0x7f,
            2 => 0x80u8..=0xff,
            1 => Just(b'\t'),
            1 => Just(b','),
        ],
        0..max,
    )
}

fn parts_with(headers: &[(&str, Vec<u8>)], peer: Option<SocketAddr>) -> Parts {
    let mut req = Request::get("/").body(()).unwrap();
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        req.headers_mut()
            .append(name, HeaderValue::from_bytes(value).unwrap());
    }
    if let Some(peer) = peer {
        req.extensions_mut().insert(peer);
    }
    req.into_parts().0
}

fn limiter() -> RateLimiter<Gcra> {
    RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(5)).unwrap()).unwrap()
}

/// `{rl:default:` + at most 128 bytes or `#` + 40 hex digits + `}`.
const MAX_STORAGE_KEY: usize = 12 + 128 + 1;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn header_key_never_panics_and_keys_stay_bounded(value in header_bytes(300)) {
        let parts = parts_with(&[("x-api-key", value.clone())], None);
        let key = HeaderKey::new("x-api-key").unwrap().extract(&parts);
        prop_assert_eq!(key.is_none(), value.is_empty());
        if let Some(key) = key {
            let stored = limiter().storage_key(&key);
            prop_assert!(stored.len() <= MAX_STORAGE_KEY, "{} bytes", stored.len());
        }
    }

    #[test]
    fn client_ip_never_panics_and_answers_an_address(
        xff in prop::collection::vec(
            prop_oneof![
                header_bytes(40),
                any::<std::net::IpAddr>().prop_map(|ip| ip.to_string().into_bytes()),
                Just(b"10.0.0.1".to_vec()),
                Just(b"[::1]:80".to_vec()),
                Just(b" , ,".to_vec()),
            ],
            0..6,
        ),
        peer in prop_oneof![Just("10.0.0.9:1"), Just("203.0.113.5:2"), Just("[::ffff:10.1.2.3]:3")],
    ) {
        let peer: SocketAddr = peer.parse().unwrap();
        let headers: Vec<(&str, Vec<u8>)> = xff.into_iter().map(|v| ("x-forwarded-for", v)).collect();
        let parts = parts_with(&headers, Some(peer));
        let ip = ClientIp::new().trust("10.0.0.0/8").unwrap();
        let key = ip.extract(&parts).expect("a peer is always an answer").to_string();
        // An address, or an IPv6 /64 network.
        let addr = key.strip_suffix("/64").unwrap_or(&key);
        let parsed: std::net::IpAddr = addr.parse().expect("the key is an IP address");
        prop_assert_eq!(key.ends_with("/64"), parsed.is_ipv6());
        if !peer.ip().to_canonical().to_string().starts_with("10.") {
            prop_assert_eq!(parsed, peer.ip().to_canonical(), "untrusted peer must be the key");
        }
        prop_assert_eq!(
            PeerIp.extract(&parts).map(|k| k.to_string()),
            Some(peer.ip().to_canonical().to_string())
        );
    }

    /// Whatever the client writes left of the entry our proxy appended (quotes,
    /// commas, bytes that are not UTF-8), the key is the address the proxy appended.
    #[test]
    fn client_written_prefix_never_moves_the_key(
        prefix in header_bytes(60),
        lines in 1..3usize,
        proxy_hop in any::<bool>(),
        port in prop::option::of(1u16..),
    ) {
        let client = match port {
            Some(port) => format!("198.51.100.77:{port}"),
            None => "198.51.100.77".to_owned(),
        };
        let hop = if proxy_hop { ", 10.0.0.1" } else { "" };
        let appended = format!("{client}{hop}");
        // One line `P, client[, hop]`, or the client's `P` on a line of its own.
        let headers: Vec<(&str, Vec<u8>)> = if lines == 1 {
            let mut line = prefix;
            line.extend_from_slice(b", ");
            line.extend_from_slice(appended.as_bytes());
            vec![("x-forwarded-for", line)]
        } else {
            vec![("x-forwarded-for", prefix), ("x-forwarded-for", appended.into_bytes())]
        };
        let parts = parts_with(&headers, Some("10.0.0.9:1".parse().unwrap()));
        let ip = ClientIp::new().trust("10.0.0.0/8").unwrap();
        prop_assert_eq!(ip.extract(&parts).map(|k| k.to_string()), Some("198.51.100.77".to_owned()));
    }

    /// The same for RFC 7239 `Forwarded`, whose quoted strings a stray `"` on the client's
    /// side must not stretch over the proxy's element.
    #[test]
    fn client_written_prefix_never_moves_the_forwarded_key(
        prefix in header_bytes(60),
        quoted in any::<bool>(),
        proxy_hop in any::<bool>(),
    ) {
        let element = if quoted {
            r#"for="198.51.100.77:4711";proto=https"#
        } else {
            "for=198.51.100.77"
        };
        let hop = if proxy_hop { r#", for="10.0.0.1";by=_edge"# } else { "" };
        let mut line = prefix;
        line.extend_from_slice(format!(", {element}{hop}").as_bytes());
        let parts = parts_with(&[("forwarded", line)], Some("10.0.0.9:1".parse().unwrap()));
        let ip = ClientIp::new()
            .trust("10.0.0.0/8")
            .unwrap()
            .header(ProxyHeader::Forwarded);
        prop_assert_eq!(ip.extract(&parts).map(|k| k.to_string()), Some("198.51.100.77".to_owned()));
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// 64 KiB values: no panic, a bounded key, and the same value gets the same key.
    #[test]
    fn huge_header_values(value in header_bytes(64 * 1024)) {
        let parts = parts_with(&[("x-api-key", value)], None);
        let extractor = HeaderKey::new("x-api-key").unwrap();
        let l = limiter();
        if let Some(key) = extractor.extract(&parts) {
            let stored = l.storage_key(&key);
            prop_assert!(stored.len() <= MAX_STORAGE_KEY);
            prop_assert_eq!(stored, l.storage_key(extractor.extract(&parts).unwrap()));
        }
    }
}
