//! Operating the limiter: what it reports, shadow mode, the deny cache, acting on it at run
//! time (a key's state, resets, bans, allow and deny lists), several policies and plans,
//! quotas per request, counting by response status, unit leases, concurrency limits.
//!
//! # What the limiter reports
//!
//! Every decision is counted once, whatever answered it, under a
//! [`Verdict`](crate::telemetry::Verdict) and a [`Source`](crate::telemetry::Source):
//!
//! | verdict (`decision` label) | meaning |
//! |---|---|
//! | `allowed` | the request goes on (its units were taken, or the store failed and the failure policy lets requests through) |
//! | `denied` | the request was refused: exactly the `429`s (gRPC `RESOURCE_EXHAUSTED`) a layer served |
//! | `would_deny` | a policy in shadow mode would have refused it; it went on |
//! | `unavailable` | the store failed and the failure policy refused it (`503`) |
//!
//! | source | what answered |
//! |---|---|
//! | `store` | the store (Redis, or the in-memory store), asked for this check |
//! | `deny_cache` | the local deny cache, repeating a denial the store gave |
//! | `unit_lease` | units of the key reserved ahead (a unit lease) |
//! | `local` | the local share, while the store was unavailable ([`FailurePolicy::Local`](crate::FailurePolicy::Local)) |
//! | `failure_policy` | nobody could decide: the failure policy answered |
//!
//! **Counters.** [`RateLimiter::stats`](crate::RateLimiter::stats) and
//! [`ConcurrencyLimiter::stats`](crate::concurrency::ConcurrencyLimiter::stats) give a
//! [`LimiterStats`](crate::telemetry::LimiterStats) snapshot since the limiter was built,
//! without any recorder: `allowed`, `denied`, `would_deny`, `unavailable`, and each verdict by
//! source ([`decisions`](crate::telemetry::LimiterStats::decisions)); `store_errors`,
//! `short_circuited` (checks the circuit breaker refused), `breaker_opened`, `degraded`
//! (decisions at the local share), `deny_cache_hits`, `refunds` and `refund_errors`. They are
//! shared by the limiter's clones, so a health check can read them from a clone kept aside
//! ([`RateLimitLayer::limiter`](crate::RateLimitLayer::limiter) gives the default policy's).
//! An adaptive throttle has its own ([`ThrottleLayer::adaptive_stats`](crate::throttle::ThrottleLayer::adaptive_stats)).
//!
//! ```
//! use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
//! use tower_redis_ratelimit::telemetry::{Source, Verdict};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(1))?)?;
//! let watched = limiter.clone();
//! limiter.check("k", 1).await?;
//! limiter.check("k", 1).await?; // the store denies, and the deny cache keeps the denial
//! limiter.check("k", 1).await?; // the deny cache denies
//! let stats = watched.stats();
//! assert_eq!((stats.allowed, stats.denied, stats.store_errors), (1, 2, 0));
//! assert_eq!(stats.decisions(Verdict::Denied, Source::DenyCache), 1);
//! # Ok(()) }
//! ```
//!
//! **Which rule fired.** A [`Decision`](crate::rate_limit::Decision) carries its `policy`, its
//! [`source`](crate::rate_limit::Decision::source), its
//! [`verdict`](crate::rate_limit::Decision::verdict) and, for a
//! [`MultiLimit`](crate::algorithm::MultiLimit), the part that denied
//! ([`binding`](crate::rate_limit::Decision::binding)). A custom rejection
//! ([`on_limited`](crate::RateLimitLayer::on_limited)) is given it; handlers get it with
//! [`decision_extension`](crate::RateLimitLayer::decision_extension); and a decision that
//! does not simply let its request go on records `rate_limit.policy`,
//! `rate_limit.decision`, `rate_limit.source` and `rate_limit.limit` on the request's span,
//! when the span declares them (see [`telemetry`](crate::telemetry)).
//!
//! **Who is being limited.** [`RateLimiter::top_keys`](crate::RateLimiter::top_keys) lists the
//! keys this instance denied (or would have, in shadow mode) most since it started, with their
//! counts: an approximate top list (the Space-Saving algorithm) in fixed memory whatever the
//! number of keys, exact while fewer keys than it tracks (128 unless
//! [`top_keys`](crate::rate_limit::RateLimiterBuilder::top_keys) says otherwise) were denied,
//! and never missing a key denied more than total / capacity times. Each instance counts its
//! own: add up the instances' lists. For a few keys you care about by name (your biggest
//! customers), [`metric_keys`](crate::rate_limit::RateLimiterBuilder::metric_keys) gives them
//! a metric of their own; no other key ever becomes a label.
//!
//! ```
//! # use tower_redis_ratelimit::*;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(2))?)?;
//! for key in ["tenant-a", "tenant-a", "tenant-a", "tenant-a", "tenant-b"] {
//!     limiter.check(key, 1).await?;
//! }
//! let top = limiter.top_keys(10);
//! assert_eq!((top[0].key.as_str(), top[0].denied), ("tenant-a", 2));
//! # Ok(()) }
//! ```
//!
//! **Logs.** Events go through `tracing`, under the target `tower_redis_ratelimit`, and
//! name the policy; raw keys are never logged above `trace`.
//!
//! | level | event |
//! |---|---|
//! | `debug` | each decision (`rate limit: decided`: policy, decision, source, limit, remaining, cost, store latency); a decision at the local share; a refund; a store call that failed; a half-open probe that failed, which keeps the circuit breaker open (no change of state) |
//! | `trace` | each would-be denial in shadow mode with its key (`rate limit: would deny (shadow mode)`: policy, key, source, limit, remaining, retry time) |
//! | `info` | would-be denials in shadow mode, summed: at most a line every ten seconds per policy (`rate limit: would deny (shadow mode); counted since the last such line`, `would_deny=N`, no key); the circuit breaker closing |
//! | `warn` | a check that failed, where a layer applies the failure policy (`rate limit: store failed`, the error's causes on one line; at most a line a second per policy, `left_out` counting the failures not logged since); the circuit breaker opening; a refund that failed; a connection attempt that failed, or a Redis that stopped answering; the first request without a key; a concurrency renewal or release that failed, or Redis found to have lost the permits (admissions paused); a quota from `quota_fn` that cannot be used |
//! | `error` | a request classified under a policy handle of another layer |
//!
//! **Metrics.** With the `metrics` feature (on by default) the limiters record through the
//! [`metrics`](https://docs.rs/metrics) facade; install any recorder (a Prometheus exporter,
//! say) before building the limits (at the latest before the first request). The names are
//! constants in
//! [`telemetry`](crate::telemetry):
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `ratelimit_decisions_total` | counter | `policy`, `decision`, `source` (the tables above) |
//! | `ratelimit_key_decisions_total` | counter | `policy`, `key`, `decision`: only the keys given to `metric_keys` |
//! | `ratelimit_store_errors_total` | counter | `policy`, `kind` = `timeout` / `redis` / `other`: store calls that failed (a check refused by the open breaker made no call) |
//! | `ratelimit_breaker_open` | gauge | `policy`: 1 while the circuit breaker is open, else 0 |
//! | `ratelimit_near_limit_total` | counter | `policy`: allowed decisions that left the key at or under 20% of its capacity |
//! | `ratelimit_policy_capacity`, `ratelimit_policy_window_seconds`, `ratelimit_policy_shadow` | gauge | `policy`: the limit in force and shadow mode (set at build and on each replacement of live limits) |
//! | `ratelimit_store_connected` | gauge | none: 1 while the connection to Redis is open (standalone and Sentinel) |
//! | `ratelimit_store_connects_total` | counter | `result` = `ok` / `failed`: attempts to connect to Redis |
//! | `ratelimit_store_resets_total` | counter | `policy`: stores found to have lost the policy's state (`RateLimiter::notice_reset`) |
//! | `ratelimit_refunds_total` | counter | `policy`, `outcome` = `given` / `nothing` / `failed` |
//! | `ratelimit_upstream_learned_total` | counter | `policy`, `source` = `ratelimit` / `ratelimit-remaining` / `x-ratelimit` / `retry-after` / `429` |
//! | `ratelimit_upstream_waits_total` | counter | `policy` |
//! | `ratelimit_store_latency_seconds` | histogram | `policy`: the checks that waited for the store, those that failed or timed out included (at their duration) |
//!
//! Every family is described (`# HELP`) when a limit is built, and the series a dashboard
//! reads from the start are registered at 0 then (see [`telemetry`](crate::telemetry)).
//!
//! A recorder renders a histogram its own way: `metrics-exporter-prometheus` renders one as a
//! summary (quantiles per instance, which cannot be summed across a fleet) unless it is given
//! buckets, as the gateway does:
//! `PrometheusBuilder::new().set_buckets_for_metric(Matcher::Full(STORE_LATENCY.into()), &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0])?`.
//!
//! **A dashboard**, one Grafana panel per line, each a PromQL query summed across every
//! instance:
//!
//! | panel | query |
//! |---|---|
//! | share of requests refused | `sum by (policy) (rate(ratelimit_decisions_total{decision="denied"}[5m])) / sum by (policy) (rate(ratelimit_decisions_total[5m]))` |
//! | would-be denials (a limit in shadow mode) | `sum by (policy) (rate(ratelimit_decisions_total{decision="would_deny"}[5m]))` |
//! | let through unchecked (fail-open) | `sum by (policy) (rate(ratelimit_decisions_total{source="failure_policy",decision="allowed"}[5m]))` |
//! | refused for a store failure (fail-closed) | `sum by (policy) (rate(ratelimit_decisions_total{decision="unavailable"}[5m]))` |
//! | decided at the local share | `sum by (policy) (rate(ratelimit_decisions_total{source="local"}[5m]))` |
//! | store p99 | `histogram_quantile(0.99, sum by (le, policy) (rate(ratelimit_store_latency_seconds_bucket[5m])))` |
//! | store errors per second | `sum by (policy, kind) (rate(ratelimit_store_errors_total[5m]))` |
//! | instances with the breaker open | `sum by (policy) (ratelimit_breaker_open)` |
//! | keys near their limit | `sum by (policy) (rate(ratelimit_near_limit_total[5m]))` |
//!
//! Alerts worth having: the breaker open on any instance for more than a minute
//! (`max by (policy) (ratelimit_breaker_open) == 1`), fail-open decisions above zero, the
//! store p99 above half the store timeout. The gateway's `--admin-listen ADDR` serves
//! `/metrics` (Prometheus text, with these buckets) and `/top?n=N` (JSON), and counts its
//! limits file's reloads (`ratelimit_config_reloads_total{result="ok"|"refused"}`); see the
//! gateway, `gateway/` in the repository.
//!
//! # Shadow mode
//!
//! Roll out a new limit without enforcing it:
//! [`RateLimiterBuilder::shadow`](crate::rate_limit::RateLimiterBuilder::shadow)`(true)` makes
//! a policy decide and record everything (the [`Decision`](crate::rate_limit::Decision), the
//! counters, the logs, the metrics, the top keys), and change nothing a client sees: every
//! request is served, and no response gets a `RateLimit`, `RateLimit-Policy`,
//! `X-RateLimit-*` or `Retry-After` field from it (clients that adapt to those fields, like
//! this crate's own [adaptive throttle](super::throttle), would otherwise slow down for a
//! limit nobody enforces). An over-limit request is a would-be denial: counted
//! (`would_deny`), its key in [`top_keys`](crate::RateLimiter::top_keys), and logged at
//! `info`. A denial spends nothing, so the counts are what enforcing would see: read
//! `would_deny` and the top keys to learn who the new limit would hit before enforcing it. A
//! store failure lets the request through whatever the failure policy. A ban
//! ([`RateLimiter::ban`](crate::RateLimiter::ban)) is an operator's, not the limit's: a
//! banned key is refused in shadow mode too (429 with `Retry-After`, counted `denied`), as
//! the allow and deny lists apply. Each policy of a
//! layer has its own setting, so a new log-in limit can shadow next to enforced ones.
//! [`shadow_headers`](crate::rate_limit::RateLimiterBuilder::shadow_headers)`(true)` writes the
//! fields after all (never a `Retry-After`), for those who want clients to see them. A
//! [throttle](super::throttle) on a shadow limiter never waits nor fails;
//! [`RateLimiter::check`](crate::RateLimiter::check) still returns the real decision (with
//! [`shadow`](crate::rate_limit::Decision::shadow) set). The demo's `--shadow` turns it on.
//!
//! # The deny cache
//!
//! A flooded key would cost one Redis call per request. Once the store denies a cost-1 check
//! with no units left, the limiter denies that key's cost-1 checks itself until one unit
//! frees up, with the same headers, and asks the store again after that. It is exact: for
//! these algorithms nothing but time frees capacity (other instances can only consume more),
//! and the deadline is measured from when the check was sent, so it never allows what Redis
//! would deny nor denies what Redis would allow. Redis state can vanish early (a restart
//! without persistence, `FLUSHDB`, a key deleted by hand to unban a client), so an entry
//! answers for at most one second before Redis is asked again: a flooded key costs about one
//! Redis call a second per instance, and a reset reaches every instance within a second.
//!
//! On by default, at most 100,000 live denials per limiter;
//! [`deny_cache`](crate::rate_limit::RateLimiterBuilder::deny_cache)`(0)` switches it off.
//! Other costs (but for a ban, which answers every cost), multi-limits and explicit test
//! times always ask the store; denials under a
//! [quota per request](#quotas-per-request) are kept per key *and* quota; a refund on this
//! instance forgets the key's entry (other instances' entries end by themselves, so they
//! deny a little longer, never admit more). A limiter on a store with a
//! [manual clock](super::testing) keeps no deny cache.
//!
//! # Steering the limiter
//!
//! What a support engineer needs without knowing the Redis key layout, on every instance at
//! once:
//!
//! - **Look at a key without spending**:
//!   [`RateLimiter::peek`](crate::RateLimiter::peek) gives a
//!   [`KeyState`](crate::rate_limit::KeyState): the quota, the units a check could take now,
//!   the time until the quota is full, and the time a ban has left. One read-only script per
//!   algorithm, the same arithmetic as a check with no write, so its numbers are the next
//!   check's; a key never seen has `remaining` = `capacity`.
//! - **Reset a key**: [`reset`](crate::RateLimiter::reset) deletes its state in the store
//!   (not its ban), so its next check on any instance finds a rested key.
//! - **Ban a key**: [`ban`](crate::RateLimiter::ban)`(key, duration)` (1 ms to 366 days)
//!   denies every check of the key, whatever its cost and quota, until the ban ends. The ban
//!   is read by the limit's own script (no extra round trip) and takes nothing: when it ends,
//!   the key has what its quota held. A banned check is a denial like any other (`429`,
//!   `Retry-After` = the ban's time left, counted as `denied` under its source) with
//!   [`Decision::banned`](crate::rate_limit::Decision::banned) set.
//!   [`unban`](crate::RateLimiter::unban) lifts it. A custom algorithm's script reads no
//!   ban: banning under it is an error. A ban lives in the store, so while the store cannot
//!   be reached the failure policy decides for a banned key as for any other: under
//!   [`FailurePolicy::Open`](crate::store::FailurePolicy::Open) it is let through (but for an
//!   instance's cached denial of it, for at most 1 s), under `Closed` refused, under `Local`
//!   limited by the in-memory twin, which holds no ban. A refusal that must hold while Redis
//!   is down belongs on the deny list below. A [`MemoryStore`](crate::MemoryStore) holds bans
//!   within its key cap, counted per lock shard: at the default cap of 1,000,000 keys it
//!   refuses a new ban ([`Error::Unsupported`](crate::Error::Unsupported)) once the new
//!   ban's shard is full: from a little under 1,000,000 bans on (about 994,000 measured).
//! - **All of it over HTTP**: with the `admin` feature, `rate_limit::admin::Admin` is the console as an
//!   axum router (metrics, top keys of the instance and of the fleet, peeks, resets, bans,
//!   the limits in force, health), behind a bearer token; mount it on a listener of its own
//!   (`examples/admin.rs`). The gateway serves exactly this router.
//! - **See the keys denied most across the fleet**: [`top_keys`](crate::RateLimiter::top_keys)
//!   is this instance's; with every instance calling
//!   [`publish_top_keys`](crate::RateLimiter::publish_top_keys) every couple of seconds,
//!   [`fleet_top_keys`](crate::RateLimiter::fleet_top_keys) on any of them sums them all.
//! - **Keep bans through a Redis that loses its data** (a restart without persistence, a
//!   flush, a failover to a replica that had not received them): call
//!   [`notice_reset`](crate::RateLimiter::notice_reset) every second or so on every instance
//!   (the gateway does). It reads the limit's marker in the store; when the store lost it,
//!   the instance counts it (`ratelimit_store_resets_total`), logs one line, and writes back
//!   the bans it knows (those it set, and those the store enforced on its checks), each with
//!   the time it has left. Every other key starts afresh, as the store's loss left it.
//! - **Free a key's concurrency slots**:
//!   [`ConcurrencyLimiter::reset`](crate::concurrency::ConcurrencyLimiter::reset).
//! - **Never limit, or always refuse**: a layer's
//!   [`allow`](crate::RateLimitLayer::allow) and [`deny`](crate::RateLimitLayer::deny) lists
//!   of keys and client networks ([`AccessList`](crate::rate_limit::AccessList)). An allowed
//!   request goes straight on: no store call, no rate-limit field, every policy of the layer
//!   skipped. A denied one gets `403` (problem+json with
//!   [`problem_details`](crate::RateLimitLayer::problem_details)). Deny first, then allow, then
//!   a ban, then the limits; networks match the client address as a
//!   [`ClientIp`](crate::ClientIp) finds it, whatever the key.
//!
//! **How soon other instances see it.** The instance that makes the change forgets its own
//! cached denial and unit lease of the key at once, and caches a ban at once. Every other
//! instance asks the store on the key's next check, except that:
//! a cached denial answers for at most **1 s** (the deny cache's bound), so a reset or an
//! unban reaches every instance within 1 s, and a ban reaches an instance on its next store
//! call (at once for a key it does not hold a denial or a lease of); and a **unit lease** of
//! the key keeps handing out what it holds for at most its lifetime
//! ([`UnitLease`](crate::rate_limit::UnitLease)), so with leases a ban reaches every instance
//! within the lease lifetime; after a reset, the units another instance still holds in a
//! lease of the key are handed out on top of the key's fresh quota, for at most that
//! lifetime. Nothing is published between instances: the bound comes from the cache's age,
//! so keep the deny cache's one second if you need it.
//!
//! ```
//! # use std::time::Duration;
//! # use tower_redis_ratelimit::*;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(3))?)?;
//! for _ in 0..4 {
//!     limiter.check("customer-7", 1).await?;
//! }
//! assert_eq!(limiter.peek("customer-7").await?.remaining, 0);
//! limiter.reset("customer-7").await?; // wrongly limited: free them
//! assert_eq!(limiter.peek("customer-7").await?.remaining, 3);
//! limiter.ban("scraper", Duration::from_secs(3600)).await?; // abusive: stop them now
//! let d = limiter.check("scraper", 1).await?;
//! assert!(d.banned && d.retry_after > Some(Duration::from_secs(3599)));
//! # Ok(()) }
//! ```
//!
//! **Limits that change without a restart.**
//! [`RateLimitLayer::live`](crate::RateLimitLayer::live)`(limits)` takes the default
//! policy's quota, per-key plans, allow and deny lists and shadow mode from a
//! [`Limits`](crate::rate_limit::Limits), and gives a
//! [`LiveLimits`](crate::rate_limit::LiveLimits) handle whose
//! [`replace`](crate::rate_limit::LiveLimits::replace) checks new limits whole (every quota
//! must build the limiter's algorithm) and swaps them in atomically: each request is decided
//! entirely under the old limits or the new, no connection is dropped, and counters carry over
//! as the table in [Quotas per request](#quotas-per-request) says. The algorithm and the key
//! cannot change this way (they decide what the counters mean): build a new layer. With the
//! `config` feature, `rate_limit::file::LimitsFile` reads them from TOML, whole,
//! each error naming its line and field, so a reload from a file that is wrong (or empty) is
//! refused and the limits in force stay; `LimitsFile::from_toml` alone is the validation entry
//! point. A file written in place can parse while half written: `rate_limit::file::FileWatch`
//! reads a file only once it has settled (size, modification time and inode unchanged across
//! two looks at least 100 ms apart), refuses what is not a regular file or is over 8 MiB,
//! and is meant to run on a blocking thread; a writer that needs its file read whole at once
//! writes another file and renames it into place. Watching the file and calling `replace` is
//! the app's (the demo's `--config FILE` does it on `SIGHUP` and when the file changes).
//!
//! The gateway demo's admin listener (`--admin-listen ADDR`) serves these as `GET` and
//! `DELETE /keys/{key}`, `PUT /bans/{key}?seconds=N` and `DELETE /bans/{key}` (`{key}` any
//! bytes, percent-encoded), behind
//! `--admin-token` or `--admin-token-file` (required off loopback, compared in constant time,
//! each change logged once with the key and the caller's address), and takes `--allow` and
//! `--deny` lists, and `--config FILE` (see the gateway, `gateway/` in the repository). Never put admin
//! endpoints on the public listener.
//!
//! # Automatic bans
//!
//! A client that keeps hitting its limit gets a fresh quota every period: a credential
//! stuffing or scraping bot then runs at exactly the limit forever. With
//! [`RateLimiterBuilder::ban_after`](crate::rate_limit::RateLimiterBuilder::ban_after), a
//! policy bans such a key by itself: refused N times within a window, the key is banned for
//! a duration, and a key banned again within a day of its last ban gets a longer one (twice
//! unless set, at most a day). The ban is the one operators set: shared by every instance,
//! shown by a peek and `GET /keys/{key}` (`banned_ms`), kept by a reset, lifted by `unban` and
//! `DELETE /bans/{key}`. Refusals are counted in the store, exactly across instances, off the
//! request path: a response is never delayed, and a ban starts one store round trip after
//! the refusal that earned it. Refusals of a banned key do not count, and a ban (an
//! operator's too) starts the count afresh. In shadow mode the policy logs the ban it would
//! set and never bans. Each ban is counted in `ratelimit_bans_total{policy, reason}`
//! (`automatic` or `operator`) and logged once at `info` with the key's digest. See
//! [`AutoBan`](crate::rate_limit::AutoBan); the gateway's `--ban-after N`, `--ban-within`,
//! `--ban-for` and `--ban-escalate` set it.
//!
//! # Delay instead of refusal
//!
//! Clients that do not retry well (browsers, webhooks, batch jobs) fail on a `429` even when
//! the limit would let them through a moment later. With
//! [`RateLimiterBuilder::delay`](crate::rate_limit::RateLimiterBuilder::delay), a policy on
//! GCRA or the token bucket lets a request over its limit wait for its units instead, as
//! NGINX's `limit_req` with `burst` and `delay` does: a request within the burst goes at once;
//! one beyond it goes when its units come, if that is within the delay; later than that it is
//! refused as before, its `Retry-After` the time until a request would wait no longer than
//! the delay (the deny cache holds such a refusal only that long).
//!
//! - **Exact across instances.** The request's place is kept in the store in the same atomic
//!   step as the check (the key's time moves on by its cost), then waited for here: the
//!   requests served, on every instance together, follow the limit exactly, and nothing polls
//!   the store. [`Decision::delayed`](crate::rate_limit::Decision::delayed) says how long a
//!   request waited.
//! - **A client that goes away gives its units back.** A request whose future is dropped
//!   while it waits (its client hung up) is refunded, so the next request is served on time.
//! - **What bounds the held connections.** A waiting request holds its connection and its
//!   task. On each instance at most the quota's burst wait per key, and at most
//!   [`Delay::waiting_at_most`](crate::rate_limit::Delay::waiting_at_most) (10,000 unless set)
//!   in all; a request beyond either is refused (logged at most once a second). Across the
//!   fleet, the store bounds a key's waiting requests to those whose units come within the
//!   delay. Mind the server's own limits on connections and request time: a delay longer
//!   than a proxy's or a client's timeout turns a delay into an error.
//! - **Shadow mode never delays**, and the local share of
//!   [`FailurePolicy::Local`](crate::FailurePolicy::Local) decides at once (no delay while the
//!   store is down). A window (sliding or fixed) cannot delay, nor can a policy with unit
//!   leases, nor a [`RegionalStore`](crate::store::redis::RegionalStore): the builder refuses
//!   them.
//! - **Metrics:** `ratelimit_delayed_total{policy, outcome}` (`served`, or `abandoned` when
//!   the client went away first) and the gauge `ratelimit_waiting{policy}`.
//!
//! [`Limits::delay_up_to`](crate::rate_limit::Limits::delay_up_to) changes the delay of a
//! running layer (zero lifts it); the gateway's `--delay-up-to DURATION` (or `delay_up_to` in
//! its limits file, reloaded) sets it.
//!
//! ```
//! # use std::time::Duration;
//! # use tower_redis_ratelimit::{rate_limit::Delay, *};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 5 a second, bursts of 10; a request over the limit waits up to a second for its unit.
//! let limiter = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_second(5).burst(10))?)
//!     .delay(Delay::up_to(Duration::from_secs(1)))
//!     .build()?;
//! let layer = RateLimitLayer::new(limiter, PeerIp);
//! # let _ = layer;
//! # Ok(()) }
//! ```
//!
//! # Several policies on one layer
//!
//! Several limiters can serve one layer, each with its own policy name (so its own counters
//! and its own name in the headers), algorithm and failure policy.
//! [`add_policy`](crate::RateLimitLayer::add_policy) returns a
//! [`PolicyId`](crate::rate_limit::PolicyId), and [`classify`](crate::RateLimitLayer::classify)
//! picks each request's [`Class`](crate::rate_limit::Class) from what the client cannot forge
//! (an authenticated plan in the request extensions, a route), or bypasses limiting:
//!
//! ```
//! use tower_redis_ratelimit::{rate_limit::Class, *};
//!
//! #[derive(Clone)]
//! enum Plan { Free, Paid } // put in the extensions by your authentication layer
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! let free = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_minute(60))?)
//!     .policy_name("free")
//!     .build()?;
//! let paid = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_minute(6_000))?)
//!     .policy_name("paid")
//!     .build()?;
//! let login = RateLimiter::builder(store, SlidingWindow::new(Quota::per_minute(5))?)
//!     .policy_name("login")
//!     .on_store_error(FailurePolicy::Closed)
//!     .build()?;
//! let mut layer = RateLimitLayer::new(free, HeaderKey::new("x-api-key")?);
//! let paid = layer.add_policy(paid)?;
//! let login = layer.add_policy(login)?;
//! let layer = layer.classify(move |parts| match (parts.uri.path(), parts.extensions.get::<Plan>()) {
//!     ("/health", _) => Class::Bypass,
//!     ("/login", _) => Class::Policy(login),
//!     (_, Some(Plan::Paid)) => Class::Policy(paid),
//!     _ => Class::Default,
//! });
//! # let _ = layer;
//! # Ok(()) }
//! ```
//!
//! A second policy with a name the layer already has is a `ConfigError` (field
//! `policy_name`). A handle cannot name a policy that does not exist; a handle from another
//! layer is answered `503` (gRPC `UNAVAILABLE`) and logged, never decided under the wrong
//! policy nor let through. A bypassed request gets no rate-limit headers.
//!
//! # Quotas per request
//!
//! Plans differ per customer and change without a redeploy.
//! [`quota_fn`](crate::RateLimitLayer::quota_fn) looks a quota up for each request; `None`
//! keeps the policy's configured one. Without HTTP,
//! [`check_with_quota`](crate::RateLimiter::check_with_quota)`(key, cost, quota)`.
//!
//! ```
//! use tower_redis_ratelimit::{Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter};
//!
//! #[derive(Clone)]
//! struct Plan { per_minute: u32 } // put in the extensions by your authentication layer
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(60))?)?;
//! let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-api-key")?).quota_fn(|parts| {
//!     let plan = parts.extensions.get::<Plan>()?;
//!     Some(Quota::per_minute(plan.per_minute))
//! });
//! # let _ = layer;
//! # Ok(()) }
//! ```
//!
//! The algorithm and the key's counters stay the policy's; the headers show the quota used.
//! A quota that cannot build the algorithm (a zero limit, a zero period, a sliding window
//! with a burst) is, from `check_with_quota`, an [`Error::Config`](crate::Error::Config)
//! naming the field, with nothing spent; from `quota_fn`, the request is decided under the
//! configured quota and a warning logged, never let through unlimited. A multi-limit and
//! custom algorithms take no quota per request (`Error::Config` naming `quota`), and a
//! decision under one is never answered from a [unit lease](#unit-leases).
//!
//! A key's state survives a change of its quota, read under the new one. A sliding window
//! takes quotas with its own period only (another period is an `Error::Config` naming
//! `quota.period`: a shorter window would drop log entries a longer one still counts). What a
//! key that spent 5 of 10 an hour gets after the change:
//!
//! | algorithm | the state carries over as | upgrade to 20 an hour | downgrade to 4 an hour |
//! |---|---|---|---|
//! | GCRA | time: the share of the period used | 10 more (half the new quota) | 2 more |
//! | token bucket | tokens left, at most the new burst; refilled at the new rate | 5 more | 4 more |
//! | sliding window | the log of what was spent in the window | 15 more | none until spent units leave the window |
//!
//! The deny cache keeps denials per key *and* quota: after an upgrade the store decides at
//! once, never a denial cached under the old quota. Under `FailurePolicy::Local`, the quota
//! given is divided like the configured one.
//!
//! # Counting by response status
//!
//! Log-in protection counts failures, not successes.
//! [`count_only`](crate::RateLimitLayer::count_only) (or [`count_if`](crate::RateLimitLayer::count_if)
//! with any predicate on the response's status and headers) makes only some responses spend
//! quota; the units of every other response are given back before it is answered:
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter, SlidingWindow};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 5 failed log-ins per account in any 15 minutes; successful ones are free.
//! let window = SlidingWindow::new(Quota::new(5, Duration::from_secs(900)))?;
//! let limiter = RateLimiter::new(MemoryStore::new(), window)?;
//! let login = RateLimitLayer::new(limiter, HeaderKey::new("x-account")?)
//!     .count_only("401,403,5xx".parse()?)?;
//! # let _ = login;
//! # Ok(()) }
//! ```
//!
//! It stays exact under concurrency: units are taken before the inner service runs and given
//! back after, each step one atomic script, so concurrent requests can never make more
//! counted responses than the limit. The price: an uncounted request may be turned away while
//! others of its key are in flight, since their units are still out; and each uncounted
//! response waits for one more store call (the refund), so the client's next request sees its
//! units back, as its `RateLimit` header already does.
//!
//! A request that is not seen to complete uncounted **counts**: the inner service failed,
//! the client hung up before the response head was ready (otherwise an attacker could guess
//! passwords for free by hanging up early), or the refund failed in the store (a warning,
//! and [`LimiterStats::refund_errors`](crate::telemetry::LimiterStats::refund_errors)). A
//! refund goes to the store that decided the check (the local share for a decision made while
//! Redis was down). A custom script cannot give units back, so counting on a policy that uses
//! one is a `ConfigError` naming `count_if`; an empty set of statuses is one naming
//! `count_only`. The demo's `--count-only 401,403,5xx` turns it on.
//!
//! Without HTTP, [`RateLimiter::refund`](crate::RateLimiter::refund)`(key, &mut decision)`
//! gives back what an allowed check took; it uses up the decision's
//! [charge](crate::rate_limit::Decision::charge), so one decision is never given back twice.
//! What a refund does, per algorithm:
//!
//! | algorithm | a refund | and then |
//! |---|---|---|
//! | GCRA | moves the key's time back by what the request's charge still holds of it (the part not drained yet), never before now | as if the request never happened, while its charge has not drained; a request in flight longer gives back less, or nothing |
//! | token bucket | puts back the tokens of what the charge still holds (the same arithmetic), never above the burst | as GCRA |
//! | sliding window | removes the request's own log entry, rewriting at most 64 others | as if the request never happened, when at most 64 entries lie on one side of it; deeper inside a long log, its units leave the window with the entry 64 places older (sooner than with its own, never sooner than with a full refund), and `refund` answers `false` |
//! | multi-limit | each limit as GCRA | as GCRA, per limit |
//!
//! **What a charge still holds.** A bucket key refills by letting its time drain: a check of
//! `cost` took `cost × period / limit` of the key's time, and at a refund only the part not
//! drained yet is still the request's; the part before has already been handed out again, to
//! requests that counted. So a request in flight longer than its charge takes to drain gives
//! nothing back, and slow uncounted requests cannot hand out the units of counted ones (the
//! property the crate's tests check: counted admissions never exceed what the algorithm
//! admits to the counted requests alone at the same arrival times). Each key keeps a small
//! ledger of the refunds that moved other charges (`{…}:gr`, `:br`, `:qr:NAME`, at most 16
//! records, kept until every charge they moved has drained); what it cannot tell apart
//! counts as spent, so a refund never gives back more than its charge holds.
//!
//! **Refunds across a reset.** A [reset](crate::RateLimiter::reset) gives back everything the
//! key held, so a refund of a check admitted before it (a request still in flight while the
//! operator freed the key) gives nothing back: it would hand out the units of requests
//! admitted after the reset. A bucket key's reset leaves a ledger whose floor is the reset's
//! time, kept for one burst's worth of the key's time; a sliding-window log keeps its newest
//! time and its last sequence number, so an entry written after the reset never bears the name
//! of one written before.
//!
//! **A sliding-window refund's work is bounded**, whatever the log's size: it finds its entry
//! with O(log n) commands and rewrites at most 64 entries, since a client decides how many
//! entries its log holds and could otherwise make one refund cost Redis milliseconds for
//! every tenant.
//!
//! A refund gives back once: on a Redis Cluster, whose client sends a call again after a cut
//! connection, GCRA, token-bucket and multi-limit refunds carry a marker that makes a second
//! run give nothing back, and a sliding window's second run finds its entry gone.
//!
//! ```
//! use tower_redis_ratelimit::{MemoryStore, Quota, RateLimiter, SlidingWindow};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // At most 3 failed log-ins a minute per account.
//! let failures = RateLimiter::new(MemoryStore::new(), SlidingWindow::new(Quota::per_minute(3))?)?;
//! for _ in 0..10 {
//!     let mut d = failures.check("alice", 1).await?;
//!     assert!(d.allowed);
//!     let password_ok = true;
//!     if password_ok {
//!         assert!(failures.refund("alice", &mut d).await?); // successes do not count
//!         assert!(!failures.refund("alice", &mut d).await?, "given back once only");
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # Unit leases
//!
//! A key with a high limit served by many instances (one tenant at 50,000 a second over four
//! gateways) costs a Redis call per request even though nearly every answer is "allowed".
//! [`lease`](crate::rate_limit::RateLimiterBuilder::lease)`(`[`UnitLease::up_to`](crate::rate_limit::UnitLease::up_to)`(lifetime))`
//! lets each instance reserve a block of a hot key's units in one script call (as many as
//! the key has, up to the block's size) and hand them out itself; when the lease's lifetime
//! ends, what it did not hand out goes back to Redis (a refund of what those units still hold
//! of the key's time). Blocks are sized to the key's observed rate per lifetime, at most an
//! eighth of the burst per instance ([`UnitLease::max_units`](crate::rate_limit::UnitLease::max_units)
//! lowers it); a key seen fewer than 4 times per lifetime, or one Redis denies, is checked
//! exactly, one call per request, as without leases. At most 10,000 keys are tracked
//! ([`UnitLease::max_keys`](crate::rate_limit::UnitLease::max_keys)); a new key takes the
//! place of a cold one holding nothing.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_redis_ratelimit::{rate_limit::UnitLease, Gcra, Quota, RateLimiter, RedisStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let limiter = RateLimiter::builder(store, Gcra::new(Quota::per_second(50_000))?)
//!     .lease(UnitLease::up_to(Duration::from_millis(50)))
//!     .build()?;
//! # let _ = limiter; Ok(()) }
//! ```
//!
//! **The bound.** Redis counts every unit of a block when it grants it, so all instances
//! together never admit more than the algorithm grants; a leased unit is handed out at most
//! the lifetime after its reservation was *sent*, however slow the reply. The only
//! inexactness is in time: in any window of the quota's period, all instances together admit
//! at most what the algorithm admits in period + lifetime, `burst + (period + lifetime) /
//! emission interval`; that is at most `limit × lifetime / period` more than without leases
//! (50 ms on 1,000 a second: 50 units). Decisions answered from a lease are `allowed` with an
//! approximate `remaining` (what Redis had left at the reservation plus what the lease still
//! holds) and the reset time of the reservation.
//!
//! Only GCRA and the token bucket can be leased (another algorithm is a `ConfigError` naming
//! `lease`; `lease.lifetime` is more than zero and at most 10 s); on a `MemoryStore` a lease
//! changes nothing. A failed reservation is a store error under the limiter's failure policy;
//! a reservation or a return that fails loses its units (fewer admissions, never more). The
//! demo's `--unit-lease-ms N` turns it on.
//!
//! # Concurrency limits
//!
//! A rate limit bounds how often a key may call; some routes need a bound on how many of a
//! key's calls run *at once* (report exports, long uploads, an expensive search). tower's
//! `ConcurrencyLimit` bounds one service in one process;
//! [`ConcurrencyLimitLayer`](crate::concurrency::ConcurrencyLimitLayer) bounds each key across
//! every instance sharing the store: a distributed semaphore in Redis (and its in-memory twin
//! in `MemoryStore`).
//!
//! ```no_run
//! use std::{net::SocketAddr, time::Duration};
//! use axum::{routing::post, Router};
//! use tower::ServiceBuilder;
//! use tower_redis_ratelimit::{
//!     concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter},
//!     FailurePolicy, Gcra, HeaderKey, Quota, RateLimitLayer, RateLimiter, RedisStore,
//! };
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! // At most 2 exports of one API key at once, over every instance; and 30 a minute.
//! let exports = ConcurrencyLimiter::builder(store.clone(), 2)
//!     .policy_name("exports")
//!     .permit_ttl(Duration::from_secs(30))
//!     .on_store_error(FailurePolicy::Local)
//!     .local_share(4) // 4 instances: 2 / 4, at least 1 per instance while Redis is away
//!     .build()?;
//! let rate = RateLimiter::builder(store, Gcra::new(Quota::per_minute(30))?)
//!     .policy_name("exports")
//!     .build()?;
//! let key = || HeaderKey::new("x-api-key");
//! let app = Router::new().route("/exports", post(|| async { "started" })).layer(
//!     ServiceBuilder::new()
//!         // Outermost first: a request refused for concurrency spends no rate units.
//!         .layer(ConcurrencyLimitLayer::new(exports, key()?))
//!         .layer(RateLimitLayer::new(rate, key()?)),
//! );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! - **A permit is held** from admission until the response body ends (its last frame, or an
//!   error, is read) or is dropped; it is also given back when the response future is dropped
//!   (the client went away, a timeout layer outside fired) and when the inner service fails.
//!   Without HTTP: [`acquire`](crate::concurrency::ConcurrencyLimiter::acquire)`(key)` gives
//!   an `Option<`[`Permit`](crate::concurrency::Permit)`>`; dropping the permit (or
//!   `permit.release().await`) gives it back.
//! - **Time to live.** Each permit is held under a time to live (default 10 s,
//!   [`permit_ttl`](crate::concurrency::ConcurrencyLimiterBuilder::permit_ttl), 100 ms to 1 h
//!   and at least three store timeouts), renewed by a background task every third of it
//!   while the request runs, so requests may take as long as they need. An instance that
//!   crashes stops renewing: its permits come back by themselves within one time to live.
//! - **When a renewal fails** (Redis away, a timeout), it is logged and tried again a third
//!   of the time to live later; the request goes on. If no renewal succeeds before the permit
//!   expires, it may be given to another request while this one still runs. When a renewal
//!   finds the permit gone (it expired unrenewed, a process paused longer than its time to
//!   live, Redis lost its state), [`Permit::is_lost`](crate::concurrency::Permit::is_lost)
//!   turns true, a warning is logged, and the renewal puts the permit back: the request counts
//!   again, even if its key is then over the limit (new requests wait until enough end). The
//!   request is never interrupted.
//! - **When a release fails** (Redis stalled or failing over, a connection cut), it is kept
//!   and sent again, at least once a second, until it succeeds or the permit would have
//!   expired by itself: the permit is free within about a second of Redis answering again.
//!   One task per limiter sends them, only while some are kept; at most 10,000 are kept per
//!   limiter (beyond, a permit comes back when it expires). A renewal on its way at the
//!   release may reach Redis after it: the release then marks the holder released for a time
//!   to live (`{prefix:policy:key}:cx`), so that renewal cannot take the permit again.
//! - **When Redis loses the permits** (a restart without persistence, `FLUSHALL`, a failover
//!   to a replica that had not received them): running requests put theirs back at their next
//!   renewal, and the first instance to notice, one that had used the limiter on that Redis
//!   before (its epoch marker `{prefix:policy:#epoch}:c` is gone, or new), pauses the
//!   policy's admissions for a third of the time to live plus two store timeouts (3.5 s by
//!   default; `429`s meanwhile, for every key), the time every running request needs to be
//!   counted again. So at most N requests of a key run at once after any number of restarts,
//!   except: requests whose renewals do not reach Redis during the pause (each counts again
//!   at its next successful renewal); and a loss first noticed by an instance that had not
//!   used that Redis before (one just started cannot tell a loss from a first use), which may
//!   admit up to N more until an instance that knew the old epoch calls. So the bound is 2N
//!   after any number of losses noticed first by instances already running, and N more for
//!   each loss noticed first by a new instance while the requests of earlier epochs still
//!   run (three instances, each started just after its own restart of Redis, with long
//!   requests: up to 3N). On a cluster the marker is kept per hash slot.
//! - **Over the limit:** `429` (gRPC: `RESOURCE_EXHAUSTED`) in the rate limit's styles (plain
//!   text, [`problem_details`](crate::concurrency::ConcurrencyLimitLayer::problem_details), or
//!   [`on_limited`](crate::concurrency::ConcurrencyLimitLayer::on_limited) given a
//!   [`Busy`](crate::concurrency::Busy)), with `RateLimit-Policy:
//!   "exports";q=2;qu="concurrent-requests"` and `RateLimit: "exports";r=0`, and no
//!   `Retry-After`. Admitted responses carry the permits left when they were admitted (`r`).
//! - **Store failures:** the limiter's failure policy: `Open` lets requests through
//!   unlimited, `Closed` answers `503` + `Retry-After: 1`, `Local` admits them to a semaphore
//!   in this process at `max_in_flight / local_share` (at least 1). An acquire that timed out
//!   (or whose future was dropped) after Redis may have admitted it releases that permit in
//!   the background.
//! - **Keys and names:** a key's holders are a sorted set under `{prefix:policy:key}:c`,
//!   scored by deadline, on the Redis server's clock. Give the rate policy and the
//!   concurrency policy the same name (and prefix) to keep both of a key's limits on one
//!   cluster hash slot; they never share state. The default concurrency policy name is
//!   `concurrency`. Two concurrency limiters with the same name and another `max_in_flight`
//!   on one store are a `ConfigError` (`policy_name`).
//! - **Cost:** an admitted acquire + release is 2 round trips (12 Redis commands counting the
//!   two `EVALSHA` and those in the scripts), a refused acquire 1 round trip, and a renewal
//!   per third of the time to live of a long request. A batching store sends these calls
//!   alone.
//!
//! In memory, the store's key cap never forgets a key whose permits are held: when it is
//! full of them, a new key is refused (`429`) and a warning logged. A client that fires its
//! next request the instant the previous one ends, with all of its key's permits in use, may
//! find its permit still taken for one round trip (the release reaches Redis about one round
//! trip after the client may have read the end of the response). The demo's
//! `--concurrency N` turns it on.
