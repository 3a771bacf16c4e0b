//! The outbound throttle: a client that waits for its quota, and learns the upstream's limits.
//!
//! [`ThrottleLayer`](crate::throttle::ThrottleLayer) wraps a client service (e.g.
//! hyper-util's HTTP client) so that each request *waits* for its quota instead of being
//! refused, up to a maximum wait (default 10 s,
//! [`max_wait`](crate::throttle::ThrottleLayer::max_wait), at most a day), and only then goes
//! out; past it, the call fails at once with
//! [`ThrottleError::WouldExceedMaxWait`](crate::throttle::ThrottleError::WouldExceedMaxWait),
//! without waiting in vain. Every worker calling the same third-party API shares the count
//! through the limiter's store. A request without a key is not throttled; a cost of 0 makes
//! it free ([`cost`](crate::throttle::ThrottleLayer::cost)).
//!
//! ```no_run
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_redis_ratelimit::{throttle::ThrottleLayer, Quota, RateLimiter, RedisStore, SlidingWindow};
//!
//! # async fn run<S>(http_client: S) -> Result<(), tower::BoxError>
//! # where S: tower::Service<http::Request<String>, Response = http::Response<String>> + Clone + Send + 'static,
//! #       S::Future: Send, S::Error: Into<tower::BoxError> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! // The API allows 600 a minute; use half, shared by every worker.
//! let limiter = RateLimiter::builder(store, SlidingWindow::new(Quota::per_minute(300))?)
//!     .policy_name("calendar")
//!     .build()?;
//! let client = ServiceBuilder::new()
//!     .layer(
//!         ThrottleLayer::new(limiter, |_: &http::request::Parts| Some("calendar".to_owned()))
//!             .max_wait(Duration::from_secs(30))?,
//!     )
//!     .service(http_client);
//! # let _ = client; Ok(()) }
//! ```
//!
//! The service's error is a `tower::BoxError`: the inner service's error, or a
//! [`ThrottleError`](crate::throttle::ThrottleError). A store failure fails the call
//! (`ThrottleError::Store`) rather than let it exceed a third party's limit, unless the
//! limiter decides at the [local share](super::failure_modes#the-local-share). Unlike the
//! server-side layers, the wait happens in the response future, before the inner service is
//! called; `poll_ready` only forwards to the inner service.
//!
//! # Sharing one log
//!
//! For bulk work to use only what interactive calls leave, both limiters must count on the
//! *same* sliding-window log: the same store, prefix and policy name, and
//! [`common_counters`](crate::rate_limit::RateLimiterBuilder::common_counters) on both, the
//! bulk job's with a lower threshold. Interactive traffic then pushes the bulk job back,
//! never the other way round. The repository's `examples/backfill.rs` does exactly that,
//! against a local stand-in for a mail API with per-operation costs (add
//! `--redis redis://HOST:PORT` to share through Redis):
//!
//! ```text
//! cargo run --example backfill -- --secs 5
//! interactive: 20 sent, 0 failed, slowest 1 ms
//! backfill: 3 calls (6 units), 1 failed
//! api charged 106 units in 5 s (interactive quota 30/s, back-fill at most 10/s of it)
//! ```
//!
//! Interactive sends use 20 of the 30 units a second, so the back-fill job, whose threshold
//! on the same log is 10, gets a call through only when the log dips below it (`failed`
//! counts calls that waited longer than their `max_wait`).
//!
//! ```
//! use tower_redis_ratelimit::{MemoryStore, Quota, RateLimiter, SlidingWindow};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let store = MemoryStore::new();
//! let interactive = RateLimiter::builder(store.clone(), SlidingWindow::new(Quota::per_second(30))?)
//!     .policy_name("mail-api")
//!     .common_counters()
//!     .build()?;
//! let backfill = RateLimiter::builder(store, SlidingWindow::new(Quota::per_second(10))?)
//!     .policy_name("mail-api")
//!     .common_counters()
//!     .build()?;
//! # let _ = (interactive, backfill);
//! # Ok(()) }
//! ```
//!
//! # Testing without waiting
//!
//! On a [`MemoryStore`](crate::MemoryStore) with a
//! [`ManualClock`](crate::store::memory::ManualClock), the throttle waits on that clock, not in
//! real time, adaptive or not; its maximum wait is counted on it too. A test starts its calls,
//! waits until they all wait ([`sleepers`](crate::store::memory::ManualClock::sleepers)), and
//! advances the clock:
//!
//! ```
//! use std::{convert::Infallible, time::Duration};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_redis_ratelimit::{
//!     store::memory::ManualClock, throttle::ThrottleLayer, Gcra, GlobalKey, MemoryStore, Quota,
//!     RateLimiter,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower::BoxError> {
//! let clock = ManualClock::new();
//! let store = MemoryStore::builder().clock(clock.clone()).build()?;
//! let limiter = RateLimiter::new(store, Gcra::new(Quota::per_minute(1))?)?;
//! let api = service_fn(|_: http::Request<()>| async { Ok::<_, Infallible>(http::Response::new(())) });
//! let client = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(limiter, GlobalKey).max_wait(Duration::from_secs(120))?)
//!     .service(api);
//! client.clone().oneshot(http::Request::new(())).await?;
//! let second = tokio::spawn(client.oneshot(http::Request::new(())));
//! while clock.sleepers() == 0 {
//!     tokio::task::yield_now().await;
//! }
//! clock.advance(Duration::from_secs(60)); // the next unit, a minute later on the test's clock
//! second.await??;
//! # Ok(()) }
//! ```
//!
//! # Learning the upstream's limits
//!
//! Real APIs publish their limits in their answers and change them (per plan, per time of
//! day, under incident). [`ThrottleLayer::adaptive`](crate::throttle::ThrottleLayer::adaptive)`(store)`
//! reads them and shares what it learned, so **every instance** sharing the store slows down
//! at once:
//!
//! ```no_run
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_redis_ratelimit::{throttle::ThrottleLayer, Gcra, Quota, RateLimiter, RedisStore};
//!
//! # async fn run<S>(http_client: S) -> Result<(), tower::BoxError>
//! # where S: tower::Service<http::Request<String>, Response = http::Response<String>> + Clone + Send + 'static,
//! #       S::Future: Send, S::Error: Into<tower::BoxError> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! // Our own ceiling: 100 a second. The upstream's real limit is learned from its answers.
//! let limiter = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_second(100))?)
//!     .policy_name("calendar")
//!     .build()?;
//! let client = ServiceBuilder::new()
//!     .layer(
//!         ThrottleLayer::new(limiter, |_: &http::request::Parts| Some("calendar".to_owned()))
//!             .adaptive(store) // learn, and share through Redis
//!             .max_pause(Duration::from_secs(30))? // no header may pause us longer
//!             .max_wait(Duration::from_secs(10))?
//!             .retry_rate_limited(), // send idempotent 429s again after the pause
//!     )
//!     .service(http_client);
//! # let _ = client; Ok(()) }
//! ```
//!
//! - **What it reads** ([`read_limits`](crate::throttle::read_limits)): the IETF
//!   `RateLimit: "name";r=R;t=T` field (the one this crate's server side writes; the item
//!   with the fewest units left), `RateLimit-Remaining` / `-Reset` (earlier drafts),
//!   `X-RateLimit-Remaining` / `-Reset` (a reset of 1,000,000,000 or more is a Unix time, in
//!   milliseconds from 10^12; otherwise seconds from now), and `Retry-After` (seconds or an
//!   HTTP date) on a `429` or a `503`. A `429` without one pauses for 1 s
//!   ([`DEFAULT_429_PAUSE`](crate::throttle::DEFAULT_429_PAUSE)), or until the window resets
//!   when the answer says none is left. A `429` or `503` that says to come back at once
//!   (`Retry-After: 0`, a date in the past, `r=0;t=0`, a reset of 0 or in the past) pauses
//!   every instance for 1 s too, as a retry waits.
//! - **Hostile values** (negative, non-numeric, fractional, 20 digits, `NaN`) are ignored; a
//!   pause or a reset beyond [`max_pause`](crate::throttle::ThrottleLayer::max_pause)
//!   (default 60 s, at most a day; a `Retry-After` in the year 9999, a reset in 3 years) is
//!   cut to it, and so is a `Retry-After` of more seconds than 19 digits hold (it pauses
//!   `max_pause`, as 19 nines do). Both are counted and logged at `info`.
//! - **The upstream's rate.** From `RateLimit-Policy: "name";q=Q;w=W` (read with an RFC 9651
//!   parser; the policy the `RateLimit` item names, else the slowest), or inferred from
//!   `RateLimit-Limit` / `X-RateLimit-Limit` beside a reset (a window at least as long as the
//!   reset in whole seconds: the longest seen is kept), or, for an upstream that tells nothing
//!   but `Retry-After`, estimated from its first refusal: the calls it answered without a word
//!   until then, over the time until its pause ends (later answers of calls sent before are
//!   added; a refusal of a paced call takes an eighth off). What an upstream tells replaces an
//!   estimate.
//! - **Pacing.** Once the rate is known, calls are spread at 97% of it (the margin keeps the
//!   jitter of the calls' way there from putting more than the quota in any window, rolling
//!   ones included) instead of going in a burst and waiting for the reset: each call is given
//!   its place in the pace in one store call, shared by every instance, and waits for it;
//!   the place is kept, never raced for again. A place beyond the call's maximum wait is not
//!   taken: the call fails at once. The pace starts behind the calls the upstream already
//!   counted and those still on their way, so a rolling window never sees the first burst
//!   and the pace on top. An answer saying none is left moves the pace on by one unit, so that
//!   calls probe sooner than a whole-second reset (an upper bound) but never burst.
//! - **What it keeps**, per key, in the store (`{prefix:policy:key}:u`, one atomic script to
//!   read, one to learn): a pause until a time, the rate and the next free place in its pace,
//!   and the units left in the upstream's window and when it ends. Before each call the
//!   throttle waits while paused; then, with a rate known, for its place; without one, while
//!   the window has fewer units left than the call costs (taking them when it goes). Answers
//!   arrive out of order, so within one window the smaller remaining count and the earlier
//!   reset win; a later window replaces it. When a window ends (no rate known), one call goes
//!   first and learns the next; the others wait for its answer (at most 1 s), so blind calls
//!   cannot overrun the new window. A configured limiter decides as before: **the configured
//!   quota stays an upper bound**, and an upstream saying more is available changes nothing.
//! - **Learn-only.** [`ThrottleLayer::learning`](crate::throttle::ThrottleLayer::learning)
//!   builds a throttle with no configured quota, bounded only by what the upstream says (and
//!   [`max_pause`](crate::throttle::ThrottleLayer::max_pause)): for an upstream whose limit you
//!   do not know, instead of inventing a ceiling.
//! - **A `429`** is sent again after the pause when the layer has
//!   [`retry_rate_limited`](crate::throttle::ThrottleLayer::retry_rate_limited) and the method
//!   is idempotent (`GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`; the body must be
//!   `Clone`), at most twice, within `max_wait`; otherwise the `429` is the answer.
//! - **What it reports:** [`adaptive_stats`](crate::throttle::ThrottleLayer::adaptive_stats)
//!   ([`AdaptiveStats`](crate::throttle::AdaptiveStats): learned, ignored, capped, paused,
//!   exhausted, rate_limited, retried, store_errors); `debug` events for what was learned and
//!   from which header, `info` for ignored or capped values; the metrics
//!   `ratelimit_upstream_learned_total{policy,source}` and
//!   `ratelimit_upstream_waits_total{policy}`.
//! - **Cost:** one store call before each request, one after each answer that says something
//!   or answers a call sent blind (while nothing is known: an upstream that never sends its
//!   limits costs both on every call until its first refusal). A failure of these calls is
//!   logged and counted; the call then goes by what this process learned from the answers
//!   it got while the store failed (kept in memory, on the same clock), and by the
//!   configured limit when there is one, so a learn-only throttle whose Redis is down or
//!   slow still keeps the upstream's pauses and windows, per process.
//!
//! Measured in real time (`scripts/bench-outbound`; BENCHMARKS.md has every row and the
//! machine): an upstream of 40 calls a second, three copies of `examples/outbound` with
//! `--adaptive --limit 1000 --per 1s` sharing one Redis, 200 calls each with 8 in flight.
//! "Use" is the upstream's `200`s over the run's wall time × 40; the ideal wait of a call is
//! the 24 calls in flight over the rate, 600 ms:
//!
//! | upstream / headers | use | `429`s from the upstream | `429`s to callers | wait p99 |
//! |---|---:|---:|---:|---:|
//! | rolling window, `RateLimit-Policy` + `RateLimit` | 97% | 0% | 0 | 671 ms |
//!
//! Every kind of limit (fixed window, rolling window, token bucket, `Retry-After` only) in every
//! header style is also run on a manual clock by the crate's tests, three learning instances
//! of eight callers each: 95–97% of the rate used, no `429` for the upstreams that tell their
//! limit, p99 wait 620 ms. An upstream telling only `Retry-After` refuses the calls in flight
//! when its limit is first hit (2–4% of 600 here, all sent again after the pause, none reaching
//! a caller) and none after.
//!
//! # Token budgets
//!
//! A model API limits tokens per minute beside requests per minute, per API key, and the
//! tokens a call uses are known only from its answer. [`ThrottleLayer::token_budget`](crate::throttle::ThrottleLayer::token_budget)
//! makes an adaptive throttle respect that budget too, shared by **every instance** calling
//! the key:
//!
//! ```no_run
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_redis_ratelimit::{throttle::{ThrottleLayer, TokenBudget, TokenUsage}, RedisStore};
//!
//! # async fn run<S>(http_client: S) -> Result<(), tower::BoxError>
//! # where S: tower::Service<http::Request<String>, Response = http::Response<String>> + Clone + Send + 'static,
//! #       S::Future: Send, S::Error: Into<tower::BoxError> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! // What a call will use, before it is sent: the caller's own estimate (prompt + max_tokens).
//! let budget = TokenBudget::new().estimate(|parts: &http::request::Parts| {
//!     parts.headers.get("x-estimated-tokens")
//!         .and_then(|v| v.to_str().ok()?.parse().ok())
//!         .unwrap_or(1_000)
//! });
//! let client = ServiceBuilder::new()
//!     .layer(
//!         ThrottleLayer::learning(store, "openai", |_: &http::request::Parts| Some("key-1".to_owned()))?
//!             .max_wait(Duration::from_secs(60))?
//!             .token_budget(budget)?,
//!     )
//!     .service(http_client);
//! # let req = http::Request::new(String::new());
//! let res = tower::ServiceExt::oneshot(client, req).await?;
//! // The usage the body reports (`usage.total_tokens`), settled for every instance.
//! let used = 1_234;
//! if let Some(usage) = res.extensions().get::<TokenUsage>() {
//!     usage.settle(used).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! - **What it reads** ([`read_token_limits`](crate::throttle::read_token_limits)): OpenAI's
//!   `x-ratelimit-limit-tokens`, `x-ratelimit-remaining-tokens` and
//!   `x-ratelimit-reset-tokens` (a duration such as `6m0s`, `1s`, `20ms`, `1h2m3.5s`, read
//!   strictly: a sign, an unknown unit or a number too long is ignored and counted, never a
//!   panic), else Anthropic's `anthropic-ratelimit-tokens-limit|remaining|reset` (the reset an
//!   RFC 3339 time), else the tighter of its `-input-tokens-*` and `-output-tokens-*`. The
//!   `-requests` fields of both (OpenAI's `x-ratelimit-*-requests`, Anthropic's
//!   `anthropic-ratelimit-requests-*`) feed the request budget, as `X-RateLimit-*` does.
//! - **How it is held**: beside what the upstream said of its requests, under the same key
//!   (a hash of its own in Redis, `{prefix:name:key}:ut`), by the same rules: the limit is
//!   tokens per [`TokenBudget::window`](crate::throttle::TokenBudget::window) (a minute by
//!   default), and calls are paced a little below it (97%), each keeping its place for its
//!   estimate. Until the first answer tells the budget, calls go blind, each counted at its
//!   estimate until its answer is back.
//! - **Estimate first, settle after**: a call takes its estimate before it is sent
//!   ([`TokenBudget::estimate`](crate::throttle::TokenBudget::estimate), default
//!   [`DEFAULT_TOKEN_ESTIMATE`](crate::throttle::DEFAULT_TOKEN_ESTIMATE)), and is settled to
//!   what it used: the whole number in a response header
//!   ([`settle_from_header`](crate::throttle::TokenBudget::settle_from_header)), or through the
//!   [`TokenUsage`](crate::throttle::TokenUsage) handle in the response's extensions, once,
//!   the first to settle winning. Using more than the estimate is a **debt**: the pace moves
//!   on by it and the next calls wait for it. Using less gives the difference back, never
//!   before now (no burst is made of it). A call not settled keeps its estimate; so does a
//!   call the upstream refused (429), whose pause holds every call back.
//!
//! Against a fake model API of 40,000 tokens per (one-second) window, three instances of four
//! callers each, calls estimated at 500 tokens and using 300 to 700, the crate's tests see no
//! 429 and about 95% of the budget used (`tests/redis/tokens.rs`).
//!
//! # Waiting in turn
//!
//! Callers of one key in one process are served in the order they asked: only the first in
//! the key's line asks the stores for its turn (waiting for the configured quota and the
//! upstream's pause there), and leaves the line once its place in the pace is kept, so a call
//! that waited long is never overtaken by one that just came. Across instances, places are
//! handed out in the order the store sees the calls, and kept: no instance starves another.
//! Under a configured [`Gcra`](crate::Gcra) quota (in Redis or in memory), a call's place in
//! the quota's schedule is kept in one store call: calls go one emission interval per unit
//! apart, never in a burst (the quota's burst is left unused, so 20 a second is at most 20
//! calls in any rolling second), and a call whose place is beyond its maximum wait fails at
//! once. Under a token bucket or a sliding window, a call checks until the quota has room:
//! those quotas keep their burst, and across instances the first to check after a unit frees
//! gets it. In the upstream's pace, places are kept the same way. Eight callers sharing 20
//! calls a second each wait about 8 / 20 = 0.4 s. A call that cannot get its turn within its maximum wait fails with a
//! [`ThrottleError`](crate::throttle::ThrottleError) that says how long it waited (`rate
//! limit: waited 9004 ms, the upstream's limit frees in 982 ms, beyond the maximum wait`).
//!
//! The repository's `examples/outbound.rs` is a load generator for it (its doc header lists
//! its flags):
//!
//! ```text
//! cargo run --example outbound -- --upstream http://127.0.0.1:3000/ --requests 100 --concurrency 8 --adaptive
//! upstream: http://127.0.0.1:3000/, 100 requests, 8 in flight, key "upstream", limit: none, adaptive: on
//! waits p50 411 ms, p99 720 ms, max 772 ms
//! sent 100, ok 100, limited 0, failed 0 in 5.1 s
//! ```
//!
//! That is against the gateway demo at `--limit 20 --per 1s --key global` (GCRA, a burst of
//! 20), learn-only (`--adaptive` without `--limit`): the first eight calls go blind, the
//! answers' `RateLimit-Policy` gives the rate, and the rest are paced at 97% of it, so the
//! gateway's burst is left unused (5.1 s where a burst and then the rate take 4.0 s) and none
//! is refused. `waits` is how long calls waited, from asking to go until their request was
//! sent: eight in flight at 20 a second wait 400 ms each. Run without `--adaptive` and with
//! `--limit 20 --per 1s`, the calls are paced at the configured limit, one every 50 ms; a
//! limit that matches the upstream's is still refused now and then when the upstream's
//! count was spent by someone else, which only its headers say. Several copies with the same
//! `--redis` and `--key` share one limit.
