//! Failure modes: what a request gets when Redis is down, slow or refusing.
//!
//! A rate limiter sits in front of every request: when Redis misbehaves it must neither take
//! the app down nor silently stop limiting. Three things bound the damage, all set on the
//! limiter's builder, each policy its own:
//!
//! - **the store timeout** ([`store_timeout`](crate::rate_limit::RateLimiterBuilder::store_timeout),
//!   default 100 ms) bounds every store call, including waiting for a connection or a
//!   reconnect;
//! - **the circuit breaker** ([`circuit_breaker`](crate::rate_limit::RateLimiterBuilder::circuit_breaker),
//!   default [`CircuitBreaker::new(5, 1 s)`](crate::store::CircuitBreaker)): after 5
//!   store-wide failures in a row it stops calling Redis for a cool-down of 1 s, then lets
//!   one check through as a probe (success closes it, failure opens it for another
//!   cool-down), so a dead Redis costs no timeout per request. Opening is logged at `warn`,
//!   closing at `info`;
//! - **the failure policy** ([`on_store_error`](crate::rate_limit::RateLimiterBuilder::on_store_error),
//!   a [`FailurePolicy`](crate::FailurePolicy)) says what a request gets when the check
//!   failed or was refused by the breaker.
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{
//!     store::CircuitBreaker, FailurePolicy, Gcra, MemoryStore, Quota, RateLimiter, SlidingWindow,
//! };
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! # let store = MemoryStore::new(); // a RedisStore in production
//! // Browsing: keep limiting, approximately, while Redis is away; 4 instances share the limit.
//! let browse = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_minute(600))?)
//!     .policy_name("browse")
//!     .store_timeout(Duration::from_millis(50))
//!     .circuit_breaker(CircuitBreaker::new(3, Duration::from_millis(500)))
//!     .on_store_error(FailurePolicy::Local)
//!     .local_share(4)
//!     .build()?;
//! // Log-in: rather 503 than a password-guessing burst let through.
//! let login = RateLimiter::builder(store, SlidingWindow::new(Quota::per_minute(5))?)
//!     .policy_name("login")
//!     .on_store_error(FailurePolicy::Closed)
//!     .build()?;
//! # let _ = (browse, login);
//! # Ok(()) }
//! ```
//!
//! # What a request gets
//!
//! | fault | `Open` (default) | `Closed` | `Local` + `.local_share(n)` |
//! |---|---|---|---|
//! | Redis down (connection refused) | served, no rate-limit headers | `503` + `Retry-After: 1` (gRPC `UNAVAILABLE`) | decided in this process at 1/n of the quota, marked `degraded` |
//! | Redis hung (`SIGSTOP`, overloaded) | the same, after the store timeout; at once while the breaker is open | the same | the same |
//! | Redis refuses every key: `OOM`, `READONLY` (a demoted primary), `NOAUTH` / `WRONGPASS` / `NOPERM`, `BUSY`, `LOADING`, `MISCONF`, `MASTERDOWN`, `CLUSTERDOWN`, `TRYAGAIN` | as down (the breaker counts them) | the same | the same |
//! | an idle connection closed (Redis' `timeout`, a NAT, a load balancer) | nothing: the connection is replaced when it closes, and the next check goes out on a new one | the same | the same |
//! | Redis restarted | checks resume by themselves (a new connection on the next check); counters restart from empty unless Redis persists them | the same | the same |
//! | a connection cut with a check in flight | that check fails (it may have reached Redis, so it is not sent twice); the next one reconnects | the same | the same |
//! | scripts lost (`SCRIPT FLUSH`, a restart, a failover) | nothing: `NOSCRIPT`, the script is loaded again, one more round trip | the same | the same |
//! | foreign data under a key (`WRONGTYPE`, a corrupted value) | served, for that key; a warning logged | `503` | `503` (the store is up: a local decision would not help) |
//! | a request without a key | shares one quota with every keyless request, or passes with [`MissingKey::Allow`](crate::extract::MissingKey::Allow) | the same | the same |
//!
//! Under any policy, a policy in [shadow mode](super::operating#shadow-mode) lets the request
//! through. A failed check is logged at `warn` by the layer (`rate limit: store failed`, with
//! the error's causes on one line; at most a line a second per policy, however many requests
//! fail, with `left_out` counting those it did not log) and counted
//! ([`LimiterStats::store_errors`](crate::telemetry::LimiterStats::store_errors),
//! `short_circuited` for checks the breaker refused). [`RateLimiter::check`](crate::RateLimiter::check)
//! called directly decides at the local share under `Local` too, and otherwise returns the
//! error for you to handle.
//!
//! Why `Open` is the default: an outage of the limiter's Redis should not become an outage
//! of the service it protects. Choose `Closed` where an unlimited burst is worse than
//! unavailability (log-in, password reset, payments), and `Local` to keep limiting while
//! Redis is away.
//!
//! # What each Redis error means
//!
//! [`Error::scope`](crate::Error::scope) says what an error means for the next check (an
//! [`ErrorScope`](crate::store::ErrorScope)); only store-wide errors count towards the
//! circuit breaker and switch `Local` to local decisions.
//!
//! | scope | errors | means |
//! |---|---|---|
//! | `Store` | timeouts; connection, protocol and authentication failures; no connection to send on; the breaker open; `OOM`, `READONLY`, `NOAUTH`, `WRONGPASS`, `NOPERM`, `BUSY`, `LOADING`, `MISCONF`, `MASTERDOWN`, `CLUSTERDOWN`, `TRYAGAIN`, `max number of clients reached`, a killed script; any code this crate does not recognise | the whole store refuses work: the next check of any key would fail too |
//! | `Key` | `WRONGTYPE` (foreign data under the key), `CROSSSLOT`, a corrupted stored value (the script's own error), a reply of the wrong shape, another algorithm's state under an in-memory key | the store is up; this key's state is unusable |
//! | `Check` | a cost of 0, an argument the script refuses, an algorithm the store does not support, a quota per request that cannot work | this check alone is invalid |
//!
//! An unknown code counts as store-wide on purpose: failing over to the local share (or the
//! breaker's rest) costs little when wrong, while blaming one key for a store-wide refusal
//! would turn `Local` into an outage.
//!
//! What has reached Redis when a call fails: a command sent on a connection already known
//! dead provably never left the process and is sent again on a new connection; a command
//! that may have reached Redis is never sent twice (it may have spent units). A check that
//! timed out may have spent its units.
//!
//! # The local share
//!
//! Under [`FailurePolicy::Local`](crate::FailurePolicy::Local), a limiter keeps an in-memory
//! twin of its algorithm with the quota divided by
//! [`local_share`](crate::rate_limit::RateLimiterBuilder::local_share)`(n)`, rounded down but
//! never below one unit (default `n` = 1: the whole quota per instance). While the store is
//! unavailable each instance decides alone at its share, so with `n` instances each admitting
//! 1/n, the fleet stays near the global limit instead of `n` times it (fail open) or zero (fail
//! closed). Such decisions are marked [`Decision::degraded`](crate::rate_limit::Decision::degraded),
//! counted ([`LimiterStats::degraded`](crate::telemetry::LimiterStats::degraded), the metric
//! `ratelimit_decisions_total{source="local"}`) and logged at `debug`. A [quota per
//! request](super::operating#quotas-per-request) is divided the same way; a refund of a degraded
//! decision goes to the local share. An algorithm that cannot be divided (a custom one without
//! [`Algorithm::local_share`](crate::algorithm::Algorithm::local_share)) makes `Local` a
//! [`ConfigError`](crate::ConfigError) naming `on_store_error`. The local twin starts empty,
//! and what it counted is not sent to Redis when Redis answers again.
//!
//! # Bounded memory
//!
//! Nothing a client sends grows memory without bound:
//!
//! - keys longer than [`max_key_len`](crate::rate_limit::RateLimiterBuilder::max_key_len)
//!   (default 128 bytes) are stored as a SHA-1; every Redis key a script writes has an expiry;
//! - [`MemoryStore`](crate::MemoryStore) (and the local twin) sweeps expired state and caps
//!   its keys (default 1,000,000, about 85 MB of GCRA state at 85 bytes a key, 130 MB of
//!   token-bucket state at 127) and the sliding-window log entries of all keys together (default 4,000,000, about
//!   120 MB at about 30 bytes an entry); at a cap the keys whose state expires soonest are forgotten
//!   first, and a forgotten key starts afresh with a full quota. Set the caps with
//!   [`MemoryStore::builder`](crate::MemoryStore::builder);
//! - the deny cache holds at most 100,000 live denials per limiter
//!   ([`deny_cache`](crate::rate_limit::RateLimiterBuilder::deny_cache)), the unit-lease
//!   table 10,000 keys ([`UnitLease::max_keys`](crate::rate_limit::UnitLease::max_keys)), a
//!   concurrency limiter at most 10,000 failed releases to send again.
//!
//! Every decision uses the store's clock (Redis `TIME`), so instances with skewed clocks
//! agree. After an hour idle nothing is stale: the sockets the store opens keep TCP alive (the
//! first probe after 30 s idle), a connection Redis or a NAT dropped meanwhile is replaced as
//! soon as its closing is seen, and the limiters hold no state that outlives the store's.
