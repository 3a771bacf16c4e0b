//! The guide: how to use the crate, chapter by chapter. Nothing here is code; every example
//! compiles, and those that need no Redis run as tests.
//!
//! 1. [Quick start](quick_start): an axum app limited per client, other frameworks, the
//!    limiter without HTTP, and which store to pick.
//! 2. [Choosing an algorithm](algorithms): GCRA, the token bucket, the sliding-window log,
//!    several limits on one key, costs.
//! 3. [Keys](keys): whose quota a request spends; proxies, IPv6 prefixes, long keys, and how
//!    keys are written in Redis.
//! 4. [Headers and rejections](responses): the IETF `RateLimit` fields, `Retry-After`, gRPC,
//!    custom rejection bodies.
//! 5. [Failure modes](failure_modes): what a request gets when Redis is down, slow or
//!    refusing; failure policies, the circuit breaker, timeouts, the local share.
//! 6. [Production Redis](production_redis): TLS, passwords, Sentinel, Cluster, connections,
//!    batching, connect errors.
//! 7. [Operating the limiter](operating): what the limiter reports (counters, logs,
//!    metrics), shadow mode, the deny cache, several policies and plans, quotas per request,
//!    counting by response status, unit leases, concurrency limits, automatic bans.
//! 8. [The outbound throttle](throttle): a client that waits for its quota, and learns the
//!    upstream's limits from its answers.
//! 9. [Testing with the manual clock](testing): tests of your own limits that never sleep.
//! 10. [Several regions](regions): one limit per key across regions that each decide against
//!     their own Redis; the bound, partitions, what works across regions.
//! 11. [Behind Envoy](envoy): the rate limit service Envoy and the meshes ask (feature
//!     `rls`); envoyproxy/ratelimit's rules, what differs, operating it.
//! 12. [Usage-based limits](usage): units known after the work (tokens, bytes), charged on an
//!     estimate and settled from a response header, a trailer or the handler's handle; debts;
//!     a model proxy with requests and tokens per minute per API key.
//!
//! # What the crate promises
//!
//! - **Exact limits across instances.** Every check is one atomic Lua script on the key's
//!   state in Redis, timed by the Redis server's clock (`TIME`): however many instances run
//!   and however their clocks drift, a key is admitted what the algorithm admits, no more.
//!   The documented exceptions are bounded and opt-in: [unit leases](operating#unit-leases)
//!   shift admissions in time by at most the lease's lifetime, the
//!   [local share](failure_modes#the-local-share) divides the quota among instances while
//!   Redis is away, and Redis' asynchronous replication can lose the last writes of a primary
//!   that dies (see [the failover bound](production_redis#failover)).
//! - **The inner service runs only for allowed requests**, and after the decision (or when
//!   the policy says to let a request through: shadow mode, a store failure under
//!   [`FailurePolicy::Open`](crate::FailurePolicy::Open)).
//! - **No surprise when Redis misbehaves**: every store call is bounded by a timeout, a
//!   circuit breaker stops calling a store that keeps failing, and each policy says what a
//!   request gets then ([`FailurePolicy`](crate::FailurePolicy)). A limiter problem is never
//!   a `500`.
//! - **A bad configuration fails when it is built**, with a [`ConfigError`](crate::ConfigError)
//!   naming the field; a Redis that cannot be reached, authenticated or verified fails at
//!   [`RedisStore::connect`](crate::RedisStore::connect), with a kind saying what to fix.
//! - **Client input is bounded**: any key (a header value of any bytes and length) is stored
//!   under a bounded, namespaced Redis key; a hostile forwarding header, cost or upstream
//!   header never panics and never lets a request through unlimited unless the failure
//!   policy says so.
//!
//! # How it compares
//!
//! What could be verified in each project's source or docs ("?" = not verified, check before
//! relying on it). This crate's column is what its tests exercise.
//!
//! | | tower-redis-ratelimit | tower_governor | tower-rate-limit-redis | limitador | Spring Cloud Gateway `RedisRateLimiter` |
//! |---|---|---|---|---|---|
//! | state shared across instances | Redis (or in-memory) | no, in-memory | Redis | memory, disk, Redis, Redis + cache | Redis |
//! | algorithms | GCRA, token bucket, sliding-window log, several limits at once | GCRA | GCRA | fixed window | token bucket |
//! | per-request cost | yes | no (always 1) | no (always 1) | yes | yes (per route) |
//! | IETF `RateLimit` / `RateLimit-Policy` | yes (draft 10), legacy optional | no (`x-ratelimit-*`) | no (`Retry-After` on 429 only) | no (`X-RateLimit-*`, draft-03 syntax, opt-in) | no (`X-RateLimit-*`) |
//! | when the store fails | open, closed, or local fair share; timeout + circuit breaker | n/a | open or closed (`fail_open`), optional timeout | answers UNAVAILABLE; Envoy's setting decides | open (hard-coded) |
//! | `X-Forwarded-For` | rightmost untrusted entry behind trusted CIDRs; RFC 7239 too | leftmost entry, no trusted proxies | ? (user's key resolver) | n/a (Envoy descriptors) | separate resolver: leftmost, or nth from the right |
//! | time source | Redis `TIME` | process clock | Redis `TIME` | Redis key expiry | Redis `TIME` (current script) |
//! | several limits on one key, atomically | yes (`MultiLimit`) | no (stack layers) | ? | no (docs warn of races) | no |
//! | inner service called for denied requests | no | no | yes (`call` runs before the decision; its future is dropped) | n/a | ? |
//!
//! Throughput, side by side with these peers on the same machine, is in the repository's
//! `BENCHMARKS.md`, with the targets the crate missed and why.

pub mod algorithms;
#[cfg(feature = "rls")]
pub mod envoy;
pub mod failure_modes;
pub mod keys;
pub mod operating;
pub mod production_redis;
pub mod quick_start;
pub mod regions;
pub mod responses;
pub mod testing;
pub mod throttle;
pub mod usage;
