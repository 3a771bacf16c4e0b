//! Keys: whose quota a request spends.
//!
//! A [`KeyExtractor`](crate::KeyExtractor) reads the request head and returns the request's
//! [`Key`](crate::extract::Key), or `None` when it has none. The built-ins:
//!
//! | extractor | key | |
//! |---|---|---|
//! | [`PeerIp`](crate::PeerIp) | the TCP peer's address | axum's `ConnectInfo<SocketAddr>` (feature `axum`, on by default), tonic's `TcpConnectInfo` (feature `tonic`), or a `SocketAddr` extension |
//! | [`ClientIp`](crate::ClientIp) | the client's address behind your proxies | the forwarding header, only when the peer is a trusted proxy; IPv6 grouped by /64 |
//! | [`HeaderKey`](crate::HeaderKey) | a header's value, e.g. an API key | borrowed from the request, any bytes |
//! | [`GlobalKey`](crate::GlobalKey) | one key for every request | a global quota, e.g. to protect a downstream |
//!
//! `a.or(b)` ([`KeyExtractor::or`](crate::KeyExtractor::or)) takes `a`'s key, else `b`'s: "the
//! API key, else the client IP". Any function of the request head returning an `Option` of a
//! `String`, a `&'static str`, a `u64`, an `IpAddr` or a `Key` is an extractor too;
//! [`key_fn`](crate::extract::key_fn) spares writing the closure's argument type, and an
//! `Arc<dyn KeyExtractor>` chooses one at run time.
//!
//! ```
//! use http::request::Parts;
//! use tower_redis_ratelimit::{
//!     extract::{key_fn, Key},
//!     ClientIp, HeaderKey, KeyExtractor,
//! };
//!
//! #[derive(Clone)]
//! struct UserId(u64); // put in the extensions by your authentication layer
//! let by_user = key_fn(|parts| parts.extensions.get::<UserId>().map(|u| u.0));
//!
//! // An extractor of your own returns a key borrowed from the request: no `String` per request.
//! struct Tenant;
//! impl KeyExtractor for Tenant {
//!     fn extract<'a>(&self, parts: &'a Parts) -> Option<Key<'a>> {
//!         parts.headers.get("x-tenant").map(|v| Key::bytes(v.as_bytes()))
//!     }
//! }
//!
//! let api_key_else_ip = HeaderKey::new("x-api-key")?.or(ClientIp::new().trust("10.0.0.0/8")?);
//! let req = http::Request::get("/").header("x-tenant", "acme").body(()).unwrap();
//! assert_eq!(Tenant.extract(&req.into_parts().0).unwrap().to_string(), "acme");
//! # let _ = (by_user, api_key_else_ip);
//! # Ok::<(), tower_redis_ratelimit::ConfigError>(())
//! ```
//!
//! A key is the client's to choose whenever it comes from the request: a header, a path
//! segment, a forwarded address. Key on what an authentication layer verified, or a client
//! can spread its requests over made-up keys, each with a fresh quota.
//!
//! # Behind proxies: `ClientIp`
//!
//! A client can write any `X-Forwarded-For` or `Forwarded` it likes; only the entries your own
//! proxies appended are true. So [`ClientIp`](crate::ClientIp) reads the header only when the
//! TCP peer is in a trusted CIDR ([`ClientIp::trust`](crate::ClientIp::trust)), and reads it
//! **from the right**: trusted proxies are skipped and the first untrusted address is the
//! client. Whatever lies to its left is the client's own text and is never parsed (quotes,
//! bytes that are not UTF-8, garbage); entries may carry a port (`1.2.3.4:80`,
//! `[2001:db8::1]:443`). Read only the header your proxies write
//! ([`ProxyHeader`](crate::extract::ProxyHeader): `X-Forwarded-For` by default, or RFC 7239
//! `Forwarded`); the other one is the client's to forge. When no address can be identified
//! (a malformed entry before any untrusted one, or every entry trusted), the key is the peer
//! address. Trusted CIDRs must hold only proxies: a host inside them can claim any address.
//!
//! **IPv6.** One host usually owns a whole /64, so `ClientIp` keys IPv6 clients by their /64
//! network (`2001:db8:1:2::/64`); [`ClientIp::ipv6_prefix`](crate::ClientIp::ipv6_prefix)
//! changes it (56 or 48 where clients get whole prefixes, 128 for one key per address).
//! IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`) count as their IPv4 address, here and in
//! `PeerIp`.
//!
//! ```
//! use std::net::SocketAddr;
//! use tower_redis_ratelimit::{ClientIp, KeyExtractor};
//!
//! let ip = ClientIp::new().trust("10.0.0.0/8")?.ipv6_prefix(56)?;
//! let mut req = http::Request::get("/")
//!     .header("x-forwarded-for", "6.6.6.6, 2001:db8:1:2:3::9, 10.0.0.7")
//!     .body(())
//!     .unwrap();
//! req.extensions_mut().insert("10.0.0.2:443".parse::<SocketAddr>().unwrap());
//! // 6.6.6.6 is what the client wrote; 2001:db8:1:2:3::9 connected to our proxy 10.0.0.7.
//! assert_eq!(ip.extract(&req.into_parts().0).unwrap().to_string(), "2001:db8:1::/56");
//! # Ok::<(), tower_redis_ratelimit::ConfigError>(())
//! ```
//!
//! # Requests without a key
//!
//! By default ([`MissingKey::Shared`](crate::extract::MissingKey::Shared)) every keyless
//! request shares one quota, under a key no client can produce, and the first one logs a
//! warning: a misconfigured extractor (`PeerIp` without connection info, say) still limits.
//! [`RateLimitLayer::on_missing_key`](crate::RateLimitLayer::on_missing_key)`(MissingKey::Allow)`
//! lets keyless requests through unlimited, without rate-limit headers. Never a `500`.
//!
//! # Keys in Redis
//!
//! Each check's Redis keys start with `{PREFIX:POLICY:KEY}`: the limiter's prefix (`rl` by
//! default, [`RateLimiterBuilder::prefix`](crate::rate_limit::RateLimiterBuilder::prefix)),
//! its policy name (`default` by default,
//! [`RateLimiterBuilder::policy_name`](crate::rate_limit::RateLimiterBuilder::policy_name))
//! and the request's key, then the algorithm's suffix (`:g` GCRA, `:b` token bucket, `:l2` and
//! `:m2` sliding window, `:q:NAME` per multi-limit limit). The braces are a Redis Cluster
//! hash tag, so all keys of one check land on one hash slot. The whole layout, every key with
//! its type, writer and expiry, is one table in the repository's `src/store/redis/keys.rs`.
//! The key is written as:
//!
//! | key | stored as |
//! |---|---|
//! | text (`"k-123"`) | as it is: `{rl:default:k-123}` |
//! | text longer than `max_key_len` (default 128 bytes), or starting with `#` | `#` and its SHA-1 in hex |
//! | bytes that are not UTF-8 (a header value) | `#` and their SHA-1 |
//! | an IP address (`PeerIp`, `ClientIp`) | `#ip:ADDR`: `{rl:default:#ip:203.0.113.7}` |
//! | an IP network (IPv6 clients by prefix) | `#ip:ADDR/BITS`: `{rl:default:#ip:2001:db8:1:2::/64}` |
//! | a number | `#n:N`: `{rl:default:#n:42}` |
//! | none (the quota keyless requests share) | `#`: `{rl:default:#}` |
//!
//! So a client cannot make Redis store huge keys, and no client-chosen text lands on an
//! address's or a number's counter: an API key `"203.0.113.7"` and the IP address
//! 203.0.113.7 are different keys, so `HeaderKey::new("x-api-key")?.or(PeerIp)` cannot be
//! made to spend an address's quota. [`RateLimiter::storage_key`](crate::RateLimiter::storage_key)
//! shows the base key of any key.
//!
//! ```
//! use std::net::IpAddr;
//! use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
//!
//! let limiter = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_second(5))?)
//!     .prefix("api")
//!     .policy_name("free")
//!     .build()?;
//! assert_eq!(limiter.storage_key("k-123"), "{api:free:k-123}");
//! assert_eq!(limiter.storage_key("203.0.113.7".parse::<IpAddr>()?), "{api:free:#ip:203.0.113.7}");
//! assert_eq!(limiter.storage_key(42u64), "{api:free:#n:42}");
//! assert!(limiter.storage_key("x".repeat(500)).starts_with("{api:free:#"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Each policy counts apart
//!
//! The prefix and the policy name are the limiter's **namespace**. Two limiters built on one
//! store (a `RedisStore` or `MemoryStore` value and its clones) with the same namespace and
//! algorithm but another quota would spend each other's counters (a log-in limit spent by
//! browsing), so building the second fails with a [`ConfigError`](crate::ConfigError) naming
//! `policy_name`, unless both call
//! [`RateLimiterBuilder::common_counters`](crate::rate_limit::RateLimiterBuilder::common_counters),
//! as a back-fill job with a lower threshold on the same sliding-window log as interactive
//! calls would (see [the outbound throttle](super::throttle#sharing-one-log)). Limiters with
//! the same algorithm and quota are the same policy and share, as do the app's instances in
//! other processes: that is the point of a shared store. Give every limit its own policy name;
//! the name is also its name in the headers, the logs and the metrics.
//!
//! ```
//! use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
//!
//! let store = MemoryStore::new();
//! let browse = RateLimiter::new(store.clone(), Gcra::new(Quota::per_minute(100))?)?;
//! let login = RateLimiter::new(store.clone(), Gcra::new(Quota::per_minute(5))?);
//! assert_eq!(login.unwrap_err().field(), "policy_name");
//! let login = RateLimiter::builder(store, Gcra::new(Quota::per_minute(5))?)
//!     .policy_name("login")
//!     .build()?;
//! # let _ = (browse, login);
//! # Ok::<(), tower_redis_ratelimit::ConfigError>(())
//! ```
//!
//! A prefix is 1 to 64 visible ASCII characters without braces; a policy name 1 to 64
//! characters from `A-Z a-z 0-9 - _ . :`. A prefix per app or environment keeps those sharing
//! one Redis apart.
