//! The concurrency middleware: [`ConcurrencyLimitLayer`] takes a key from each request and
//! lets at most N requests of that key be in flight at once, across every instance sharing
//! the store; a request over the limit gets a `429` (gRPC: `RESOURCE_EXHAUSTED`).
//!
//! A request holds its permit from the moment it is admitted until its response body ends or
//! is dropped; also given back when the response future is dropped (the client went away)
//! or the inner service fails. tower's `ConcurrencyLimit` bounds one service in one process;
//! this bounds each key across the fleet.
//!
//! ```no_run
//! use std::{net::SocketAddr, time::Duration};
//! use axum::{routing::get, Router};
//! use tower::ServiceBuilder;
//! use tower_redis_ratelimit::{
//!     concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter},
//!     Gcra, PeerIp, Quota, RateLimitLayer, RateLimiter, RedisStore,
//! };
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let rate = RateLimiter::new(store.clone(), Gcra::new(Quota::per_minute(100))?)?;
//! let in_flight = ConcurrencyLimiter::builder(store, 4)
//!     .permit_ttl(Duration::from_secs(30))
//!     .build()?;
//! let app = Router::new().route("/", get(|| async { "ok" })).layer(
//!     ServiceBuilder::new()
//!         // Outermost first: a request refused for concurrency spends no rate units.
//!         .layer(ConcurrencyLimitLayer::new(in_flight, PeerIp))
//!         .layer(RateLimitLayer::new(rate, PeerIp)),
//! );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! What happens when a renewal or a release fails, when Redis loses the permits, and what a
//! refused request gets: [Concurrency limits](crate::guide::operating#concurrency-limits) in
//! the guide.

// `semaphore` is the engine's state, `acquire` the path to a permit (the store, the local
// share), `holder` one admitted request's renewals and release, `releases` and `kept` the
// failed releases sent again, `permit` what the request holds; `config` what the layer and
// its services share, so that neither imports the other.

mod acquire;
mod builder;
mod config;
mod future;
mod holder;
mod kept;
mod layer;
mod limiter;
mod permit;
mod releases;
mod semaphore;
mod service;
#[cfg(test)]
mod tests;

pub use self::{
    builder::ConcurrencyLimiterBuilder, future::ResponseFuture, layer::ConcurrencyLimitLayer,
    limiter::ConcurrencyLimiter, permit::Permit, service::ConcurrencyLimit,
};

use std::sync::Arc;

/// What a concurrency limit tells a custom rejection
/// ([`ConcurrencyLimitLayer::on_limited`]) about a refused request: every permit of its key
/// was held.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Busy {
    /// The limit's policy name.
    pub policy: Arc<str>,
    /// Requests of one key allowed in flight at once.
    pub max_in_flight: u32,
}

impl Busy {
    fn new(limiter: &ConcurrencyLimiter) -> Self {
        Self {
            policy: Arc::clone(&limiter.semaphore.core.policy),
            max_in_flight: limiter.max_in_flight(),
        }
    }
}
