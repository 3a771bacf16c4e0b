//! A rate limit service for Envoy and the proxies that speak its protocol
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`), with rules read from
//! envoyproxy/ratelimit's YAML files. Feature `rls`.
//!
//! [`RlsService`] decides a [`RateLimitRequest`](proto::RateLimitRequest): each descriptor
//! of the request is matched against its domain's [`RlsRules`], and every descriptor that has
//! a rule is checked in the store, each rule a limiter of its own (its policy name the rule's
//! path, e.g. `edge.remote_address`, in the metrics; its counters in the store under it). The
//! answer is `OVER_LIMIT` when any descriptor not in shadow mode is over its limit.
//!
//! **A refused request spends nothing** on any of its descriptors: the descriptors are
//! checked together, and when one refuses the request, what the others took is given back
//! (each a refund of its own, in its own slot on a Cluster). envoyproxy/ratelimit counts every
//! descriptor of a refused request, so a client that keeps retrying stays refused; here it
//! gets in as soon as its limits have room. Between a check and its give-back, another
//! request may see a descriptor with less room than it will have: a give-back can refuse
//! a request that would have fitted, never let one in over a limit.
//!
//! Differences from envoyproxy/ratelimit, besides that one:
//! - The algorithm is chosen for the whole service ([`RlsAlgorithm`]): the fixed window
//!   counts as envoyproxy/ratelimit does, but its weeks start on Monday and its months and
//!   years are the calendar's (envoyproxy/ratelimit's are 30 and 365 days from the epoch).
//! - A store that fails answers by the [failure policy](crate::store::FailurePolicy):
//!   open, every descriptor `OK`; closed, the call fails with `UNAVAILABLE` (so Envoy's
//!   `failure_mode_deny` applies); local, decided in this process at the local share. Always
//!   within the store timeout.
//! - A descriptor's `limit` (the caller's own limit) is not used: the rule's limit decides.
//! - `quota_mode` and `share_threshold` are refused in a file; `detailed_metric`,
//!   `value_to_metric` and `metadata` are read and change nothing (every value is counted
//!   apart already, and no metadata is sent).
//!
//! A descriptor's key in the store, and in [`RateLimiter::peek`](crate::RateLimiter::peek),
//! `reset` and `ban` of its rule's limiter ([`RlsService::limiter`]): its entries as
//! `key=value` joined by `,`, each `%`, `,` and `=` in them written `%25`, `%2C`, `%3D`
//! (`remote_address=10.0.0.1`, `api_key=k,path=/v1`). An operators' console steers every
//! rule by its policy name when given the service
//! ([`Admin::policies`](crate::rate_limit::admin::Admin::policies), feature `admin`).
//!
//! ```
//! use tower_redis_ratelimit::{rate_limit::rls::{proto::*, RlsRules, RlsService}, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rules = RlsRules::from_yaml("edge.yaml", "
//! domain: edge
//! descriptors:
//!   - key: api_key
//!     rate_limit: { unit: minute, requests_per_unit: 2 }
//! ")?;
//! let service = RlsService::builder(MemoryStore::new()).build(rules)?;
//! let request = RateLimitRequest {
//!     domain: "edge".into(),
//!     descriptors: vec![RateLimitDescriptor {
//!         entries: vec![Entry { key: "api_key".into(), value: "k".into() }],
//!         ..Default::default()
//!     }],
//!     hits_addend: 0,
//! };
//! assert_eq!(service.should_rate_limit(&request).await?.overall_code(), Code::Ok);
//! assert_eq!(service.should_rate_limit(&request).await?.overall_code(), Code::Ok);
//! assert_eq!(service.should_rate_limit(&request).await?.overall_code(), Code::OverLimit);
//! # Ok(()) }
//! ```

mod config;
mod grpc;
mod json;
pub mod proto;
mod service;

pub use self::{
    config::{RlsRule, RlsRules},
    grpc::{RlsGrpc, SHOULD_RATE_LIMIT},
    json::{json_request, json_response},
    service::{RlsAlgorithm, RlsService, RlsServiceBuilder},
};

/// The largest rules file [`RlsRules::load`] reads: 8 MiB.
pub const MAX_FILE_LEN: u64 = 8 << 20;
