//! Behind Envoy: the rate limit service that proxies and meshes ask.
//!
//! Envoy, Istio, Envoy Gateway, Kuadrant and the Gateway API implementations built on Envoy do
//! not link a rate limiter: they ask a rate limit service over gRPC,
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, with a domain and a list
//! of descriptors (`[("remote_address", "10.0.0.1")]`, `[("api_key", "k"), ("path",
//! "/v1")]`), and refuse the request when the answer is `OVER_LIMIT`. The crate answers that
//! protocol (feature `rls`), with the rules of envoyproxy/ratelimit's YAML files read as it
//! reads them, on any store: counters shared by every instance on one Redis, exact.
//!
//! # Running it
//!
//! The gateway serves it beside its HTTP listener, with no code:
//!
//! ```text
//! gateway --redis redis://10.0.0.5:6379 --rls-listen 0.0.0.0:8081 --rls-config /etc/ratelimit/config
//! ```
//!
//! gRPC and `POST /json` (the same request in proto3's JSON mapping) on one port; the rules
//! reloaded on `SIGHUP` and when the files change; `--rls-algorithm fixed-window` (the
//! default), `gcra` or `sliding-window`; `--on-redis-error`, `--timeout-ms`, `--prefix` and
//! the admin listener as for the HTTP limiter. Point Envoy's `rate_limit_service` at it as
//! at envoyproxy/ratelimit.
//!
//! In a tonic server of your own, [`RlsGrpc`](crate::rate_limit::rls::RlsGrpc) is the
//! service, [`RlsService`](crate::rate_limit::rls::RlsService) the decisions (callable
//! without gRPC), [`RlsRules`](crate::rate_limit::rls::RlsRules) the rules:
//!
//! ```no_run
//! use tower_redis_ratelimit::{
//!     rate_limit::rls::{RlsAlgorithm, RlsGrpc, RlsRules, RlsService, SHOULD_RATE_LIMIT},
//!     FailurePolicy, RedisStore,
//! };
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let rules = RlsRules::load("/etc/ratelimit/config")?; // a file or a directory
//! let service = RlsService::builder(store)
//!     .algorithm(RlsAlgorithm::FixedWindow)
//!     .on_store_error(FailurePolicy::Closed) // UNAVAILABLE: Envoy's failure_mode_deny decides
//!     .build(rules)?;
//! let app: axum::Router = axum::Router::new().route_service(SHOULD_RATE_LIMIT, RlsGrpc::new(service.clone()));
//! // Serve `app` over HTTP/2 cleartext; call `service.replace(RlsRules::load(..)?)` to reload.
//! # let _ = app; Ok(()) }
//! ```
//!
//! # What it decides
//!
//! Each descriptor is matched against its domain's rules as envoyproxy/ratelimit matches it:
//! the entries in order, each level taking the rule with the exact value, else the first
//! pattern with `*` that matches (in the file's order), else the rule with the key alone;
//! the rule the last entry reaches decides. A key-only rule counts each value apart. Every
//! descriptor with a rule is checked, and the answer is `OVER_LIMIT` when any descriptor
//! not in shadow mode is over; each status carries the rule's limit, what remains and the
//! time to the reset. `hits_addend` comes from the descriptor, else the request, else 1; 0
//! looks without spending.
//!
//! **A refused request spends nothing.** envoyproxy/ratelimit counts every descriptor of a
//! refused request, so a client that keeps retrying stays refused; here the descriptors are
//! checked together and what the others took is given back when one refuses. On a Redis
//! Cluster a request's descriptors live in different slots (each rule's keys share a hash
//! tag), so each is one script in its own slot, and the give-backs are one script each too:
//! between a check and its give-back another request may find less room than there will
//! be, never more (a give-back can refuse a request that would have fitted, never admit one
//! over a limit).
//!
//! The fixed window counts as envoyproxy/ratelimit does, with two differences: its weeks
//! start on Monday and its months and years are the calendar's, in UTC (a `month` rule is
//! the calendar month, not 30 days from the epoch), and a refused request does not count.
//! `--rls-algorithm gcra` spreads each rule's units over its unit (no double burst at a
//! window's edge); `sliding-window` admits at most the limit in any span of the unit.
//!
//! When the store fails, the failure policy answers within the store timeout: open, every
//! descriptor `OK`; closed, the call fails with `UNAVAILABLE`; local, each instance decides
//! alone with its share. envoyproxy/ratelimit, by contrast, waits on a dead Redis for its
//! own timeouts.
//!
//! # Operating it
//!
//! Each rule is a limiter of its own, its policy name the rule's path: the domain and the
//! keys (with the value, for a rule on a value) joined by `.` (`edge.remote_address`,
//! `edge.path_/admin*` written with `_` and a hash where a character cannot be in a policy
//! name). `ratelimit_decisions_total` counts every descriptor's decision under it (a shadow
//! rule's refusals as `would_deny`). A descriptor's key is its entries as `key=value`
//! joined by `,` (`%`, `,` and `=` escaped as `%25`, `%2C`, `%3D`): the console
//! ([`Admin::policies`](crate::rate_limit::admin::Admin::policies)) peeks, resets, bans and
//! unbans it with `?policy=` (`GET /keys/api_key=k?policy=edge.api_key`), and `/top` lists
//! the keys refused most with their rule.
//!
//! # Moving from envoyproxy/ratelimit
//!
//! The YAML files are read as they are. `quota_mode` and `share_threshold` are refused (the
//! file's line and column say where); `detailed_metric`, `value_to_metric` and `metadata`
//! are read and change nothing. A descriptor's own `limit` (set by Envoy from dynamic
//! metadata) is not used: the rule decides. Counters are not carried over (the keys differ):
//! a key starts rested.
