//! Client-side throttling: wait for quota instead of rejecting.
//!
//! [`ThrottleLayer`] wraps an outbound client (an HTTP client service calling a third-party
//! API) so that each request waits until its key has the units it costs, up to a maximum
//! wait, and only then goes out. The limit is shared through the store by every process
//! calling the same API, like the server-side [`RateLimitLayer`](crate::RateLimitLayer).
//!
//! ```no_run
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_redis_ratelimit::{Quota, RateLimiter, RedisStore, SlidingWindow, throttle::ThrottleLayer};
//!
//! # async fn run<S>(http_client: S) -> Result<(), Box<dyn std::error::Error>>
//! # where S: tower::Service<http::Request<String>, Response = http::Response<String>> + Clone + Send + 'static,
//! #       S::Future: Send, S::Error: Into<tower::BoxError> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! // Google Calendar allows 600 a minute; use half, shared by every worker.
//! let limiter = RateLimiter::new(store, SlidingWindow::new(Quota::per_minute(300))?)?;
//! let client = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(limiter, |_: &http::request::Parts| Some("calendar".to_owned()))
//!         .max_wait(Duration::from_secs(30))?)
//!     .service(http_client);
//! # Ok(()) }
//! ```
//!
//! With [`ThrottleLayer::token_budget`], an adaptive throttle also learns a model API's
//! budget of tokens per minute (OpenAI's `x-ratelimit-*-tokens`, Anthropic's
//! `anthropic-ratelimit-tokens-*`) and paces calls by it: each call takes its
//! [`TokenBudget`] estimate before it is sent and is settled to what it used afterwards (a
//! response header, or the [`TokenUsage`] handle), so that many workers calling one API key
//! stay within its tokens per minute (see the guide's
//! [token budgets](crate::guide::throttle#token-budgets)).
//!
//! `poll_ready` only forwards to the inner service: the wait depends on the request's key and
//! cost, so it happens in the response future, before the inner service is called.

mod adaptive;
mod clock;
mod config;
mod error;
mod layer;
mod learn;
mod line;
mod model;
mod service;
mod tokens;

pub use self::{
    adaptive::{AdaptiveStats, DEFAULT_MAX_PAUSE},
    config::{NoRetry, RetryIdempotent},
    error::ThrottleError,
    layer::ThrottleLayer,
    learn::{
        read_limits, read_token_limits, HeaderFamily, Reading, StatedQuota, DEFAULT_429_PAUSE,
    },
    service::Throttle,
    tokens::{TokenBudget, TokenUsage, DEFAULT_TOKEN_ESTIMATE, DEFAULT_TOKEN_WINDOW},
};
pub use crate::store::upstream::{Learned, Rate};
