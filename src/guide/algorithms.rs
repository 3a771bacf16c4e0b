//! Choosing an algorithm: GCRA, the token bucket, the sliding-window log, the fixed window,
//! several limits on one key, and what a request costs.
//!
//! | algorithm | Redis state per key | decides | pick it when |
//! |---|---|---|---|
//! | [`Gcra`](crate::Gcra) | one integer (~50 B) | capacity `burst`, refilled at `limit` per `period` | the default: a smooth rate with bursts, the cheapest in Redis |
//! | [`TokenBucket`](crate::TokenBucket) | a two-field hash (~100 B) | exactly the same as `Gcra` with the same quota | you want the state readable in Redis as "tokens left" |
//! | [`SlidingWindow`](crate::SlidingWindow) | one log entry (~100 B) per admitted request, for one window | at most `limit` units in any window of `period` | an exact "N per window" contract, e.g. a provider's quota, with per-request costs |
//! | [`FixedWindow`](crate::algorithm::FixedWindow) | one short string (~60 B) | at most `limit` units in each window of the clock (a period from the epoch, or a calendar week, month or year in UTC) | long quotas and plans (a million calls a month), windows everyone can read off a calendar; up to twice the limit can pass around a window's end |
//! | [`MultiLimit`](crate::algorithm::MultiLimit) | one integer per limit | several GCRA limits at once, e.g. 10 a second and 1,000 a day | a key needs several limits and a request refused by one must not spend the others |
//! | [`MultiLimit::budgets`](crate::algorithm::MultiLimit::budgets) | one integer per budget | several budgets with their own costs at once, e.g. 60 requests and 100,000 tokens a minute | requests and the units they use (tokens) on one key, the units settled after the response (see [usage-based limits](super::usage)) |
//!
//! A [`Quota`](crate::Quota) is `limit` units per `period`, with an optional `burst`: for
//! GCRA and the token bucket the bucket's capacity (default: `limit`), refilled at `limit`
//! per `period`; a sliding window has no separate burst (another burst is a
//! [`ConfigError`](crate::ConfigError) naming `quota.burst`). Quotas are plain data,
//! validated when an algorithm is built from them; the error names the field (`quota.limit`,
//! `quota.period`, `quota.burst`).
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{Gcra, Quota, SlidingWindow, TokenBucket, algorithm::MultiLimit};
//!
//! let smooth = Gcra::new(Quota::per_minute(100).burst(20))?; // 100 a minute, 20 at once
//! let same = TokenBucket::new(Quota::per_minute(100).burst(20))?; // the same decisions
//! let contract = SlidingWindow::new(Quota::new(300, Duration::from_secs(60)))?;
//! let both = MultiLimit::new([
//!     ("burst", Quota::per_second(10)),
//!     ("daily", Quota::per_day(1_000)),
//! ])?;
//! assert_eq!(Gcra::new(Quota::per_second(0)).unwrap_err().field(), "quota.limit");
//! assert_eq!(
//!     SlidingWindow::new(Quota::per_minute(10).burst(20)).unwrap_err().field(),
//!     "quota.burst"
//! );
//! # let _ = (smooth, same, contract, both);
//! # Ok::<(), tower_redis_ratelimit::ConfigError>(())
//! ```
//!
//! # GCRA or a sliding window
//!
//! A bucket (GCRA, token bucket) lets a rested key spend its whole `burst` at once, then one
//! unit every `period / limit`: a smooth rate, and a key that waits gets its burst back. A
//! sliding window admits at most `limit` units in *any* window of `period`, with no boundary
//! burst (a fixed window admits up to twice its limit across a boundary); a unit spent comes
//! back exactly one period later. Take the window when the contract is literally "N per
//! window", e.g. to stay under a third party's published quota; take GCRA otherwise: its
//! state is one integer per key however busy the key is, while a window's log holds an entry
//! per admitted request (see [bounded memory](super::failure_modes#bounded-memory)).
//!
//! Bucket rates are kept as one unit per *emission interval* of `period / limit`, rounded
//! **up** to a microsecond: a limit can be a hair stricter than asked, never looser.
//!
//! # Fixed and calendar windows
//!
//! A [`FixedWindow`](crate::algorithm::FixedWindow) counts the units admitted in the window of the clock
//! a request falls in, and starts afresh when the next one begins: windows of the quota's
//! period counted from the Unix epoch (a minute from :00, a day from midnight UTC), or
//! [calendar](crate::algorithm::Calendar) weeks from Monday, months and years in UTC. Its state
//! is one counter per key whatever the traffic, so it holds a monthly plan that a sliding
//! window's log could not (a million admitted calls are a million log entries); a refused
//! request takes nothing, and a refund gives back to the window that counted it while that
//! window lasts. The `RateLimit` header's reset is the window's end; a calendar window's
//! policy states its [nominal](crate::algorithm::Calendar::nominal) length (7, 30, 365 days).
//!
//! ```
//! use tower_redis_ratelimit::{algorithm::{Calendar, FixedWindow}, Quota};
//!
//! let per_minute = FixedWindow::new(Quota::per_minute(600))?; // from :00 of each minute
//! let monthly = FixedWindow::calendar(Calendar::Month, 1_000_000)?;
//! # let _ = (per_minute, monthly);
//! # Ok::<(), tower_redis_ratelimit::ConfigError>(())
//! ```
//!
//! # Several limits on one key
//!
//! [`MultiLimit`](crate::algorithm::MultiLimit) puts up to 8 named GCRA limits on one key,
//! decided in **one atomic script call**: a request refused by any limit takes nothing from
//! the others. Stacking limits as separate checks (or separate layers) overshoots, since the
//! limits that passed were already spent. Each limit is its own item in the `RateLimit`
//! headers, `Retry-After` covers the longest wait, the [`Decision`](crate::rate_limit::Decision)'s
//! fields describe the binding limit and [`Decision::limits`](crate::rate_limit::Decision::limits)
//! all of them. A multi-limit takes no [quota per request](super::operating#quotas-per-request).
//!
//! # Costs
//!
//! Every algorithm takes a per-request cost: [`RateLimitLayer::cost`](crate::RateLimitLayer::cost)
//! computes it from the request head, [`RateLimiter::check`](crate::RateLimiter::check) takes it
//! as an argument. In a layer, a cost of 0 makes the request free: it is not checked and
//! gets no rate-limit headers; `check` refuses a cost of 0 as
//! [`Error::InvalidInput`](crate::Error::InvalidInput). A request whose cost exceeds the
//! capacity is denied as **never** ([`Decision::is_never`](crate::rate_limit::Decision::is_never),
//! no `Retry-After`), not told to retry forever.
//!
//! ```
//! use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(10))?)?;
//! let d = limiter.check("k", 4).await?;
//! assert_eq!((d.allowed, d.remaining), (true, 6));
//! let d = limiter.check("k", 7).await?; // 6 left: wait for one more unit
//! assert!(!d.allowed && d.retry_after.is_some());
//! let d = limiter.check("k", 11).await?; // more than the burst of 10: never
//! assert!(d.is_never() && d.retry_after.is_none());
//! # Ok(()) }
//! ```
//!
//! # What every script does
//!
//! Each algorithm is a Lua script that the [`RedisStore`](crate::RedisStore) runs atomically,
//! and an in-memory twin in [`MemoryStore`](crate::MemoryStore) that makes the same decisions
//! integer for integer. Every script reads the clock from Redis (`TIME`; an explicit time
//! exists for tests only, see [`RateLimiter::check_at`](crate::RateLimiter::check_at)),
//! computes on integers (microseconds), validates every argument before its first write,
//! sets an expiry on every key it writes (a key lives no longer than its state matters), and
//! replies `{allowed, remaining, retry_after, reset_after}`. The sliding window keeps running
//! totals, so a check costs O(log n) however many requests the window holds. All keys of one
//! check share a hash tag, ready for Redis Cluster, and long keys are stored as a SHA-1 (see
//! [Keys in Redis](super::keys#keys-in-redis)).
//!
//! # A custom algorithm
//!
//! An algorithm tells the store what to run with [`Algorithm::rule`](crate::algorithm::Algorithm::rule).
//! A custom one returns [`Rule::script`](crate::algorithm::Rule::script) with its Lua side
//! (the [`Scripted`](crate::algorithm::Scripted) trait: its source, its keys' suffixes, its
//! arguments, whether concurrent checks may share a batched call, how its reply reads; the
//! `RedisStore` loads, caches and runs it) and, to run in a `MemoryStore` too, implements
//! [`Algorithm::decide`](crate::algorithm::Algorithm::decide) on a
//! [`MemoryState`](crate::algorithm::MemoryState). A custom script cannot give units back (so
//! no [counting by response status](super::operating#counting-by-response-status)), take a
//! quota per request or be divided for the [local share](super::failure_modes#the-local-share)
//! unless it implements [`Algorithm::local_share`](crate::algorithm::Algorithm::local_share).
//! The stores are the crate's own ([`Store`](crate::store::Store) is sealed): a new algorithm
//! runs on them, a new store comes with the crate.
