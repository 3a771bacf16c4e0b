//! The rate limit: [`RateLimiter`] decides a key and a cost against an algorithm in a store
//! (usable without HTTP), and [`RateLimitLayer`] takes a key from each request, asks its
//! policy's limiter, and calls the inner service only when the request is allowed; the
//! response gets the rate-limit headers, a denied request a `429` (gRPC: `RESOURCE_EXHAUSTED`).
//!
//! A request goes through it in one pass: the layer's service ([`RateLimit`]) picks the
//! request's policy and extracts its key; the policy's engine decides (from its deny cache,
//! a unit lease or a store that answers at once, else through the store in the response
//! future); the HTTP shell answers a denial or adds the headers to the inner service's
//! response.

#[cfg(feature = "admin")]
pub mod admin;
mod autoban;
mod banner;
mod builder;
mod config;
mod counting;
mod delay;
mod engine;
#[cfg(feature = "config")]
pub mod file;
mod future;
mod layer;
mod limiter;
mod lists;
mod live;
#[cfg(feature = "rls")]
pub mod rls;
mod service;
mod store_watch;
mod usage;

/// The rate-limit header fields, and how this crate renders them.
pub mod headers {
    pub use crate::http::headers::{
        render, retry_after_secs, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT,
        X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
    };
    pub use crate::http::QUOTA_EXCEEDED;
}

pub(crate) use self::engine::RateEngine;
pub use self::{
    autoban::AutoBan,
    builder::RateLimiterBuilder,
    config::{Class, PolicyId},
    counting::StatusSet,
    delay::Delay,
    future::ResponseFuture,
    layer::RateLimitLayer,
    limiter::RateLimiter,
    lists::AccessList,
    live::{Limits, LiveLimits},
    service::RateLimit,
    usage::Usage,
};
pub use crate::{
    core::UnitLease,
    decision::{Charge, Decision, KeyState, LimitState, Settled},
    http::{BoxError, HeaderStyle, ResponseBody},
};
