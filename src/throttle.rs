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
//! use tower_redis_ratelimit::{Quota, RateLimiter, RedisStore, SlidingWindow, ThrottleLayer};
//!
//! # async fn run<S>(http_client: S) -> Result<(), Box<dyn std::error::Error>>
//! # where S: tower::Service<http::Request<String>, Response = http::Response<String>> + Clone + Send + 'static,
//! #       S::Future: Send, S::Error: Into<tower::BoxError> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! // Google Calendar allows 600 a minute; use half, shared by every worker.
//! let limiter = RateLimiter::new(store, SlidingWindow::new(Quota::per_minute(300))?);
//! let client = ServiceBuilder::new()
//!     .layer(ThrottleLayer::new(limiter, |_: &http::request::Parts| Some("calendar".to_owned()))
//!         .max_wait(Duration::from_secs(30)))
//!     .service(http_client);
//! # Ok(()) }
//! ```
//!
//! `poll_ready` only forwards to the inner service: the wait depends on the request's key and
//! cost, so it happens in the response future, before the inner service is called.

use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use http::{request::Parts, Request};
use tower_layer::Layer;
use tower_service::Service;

use crate::{
    layer::CostFn, store::BoxFuture, Algorithm, Decision, Error, KeyExtractor, RateLimiter,
};

/// The error of a throttled call that could not get its quota in time.
#[derive(Debug)]
#[non_exhaustive]
pub enum ThrottleError {
    /// The quota would not be available within the maximum wait (or the request's cost can
    /// never fit: `retry_after` is `None`).
    WouldExceedMaxWait {
        /// The last decision.
        decision: Decision,
    },
    /// The store failed (the policy for throttles is closed: the call is not made).
    Store(Error),
}

impl fmt::Display for ThrottleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThrottleError::WouldExceedMaxWait { decision } => match decision.retry_after {
                Some(wait) => write!(
                    f,
                    "rate limit: quota {:?} available in {wait:?}, beyond the maximum wait",
                    decision.policy
                ),
                None => write!(
                    f,
                    "rate limit: cost {} can never fit quota {:?} of {}",
                    decision.cost, decision.policy, decision.limit
                ),
            },
            ThrottleError::Store(e) => write!(f, "rate limit: {e}"),
        }
    }
}

impl std::error::Error for ThrottleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ThrottleError::Store(e) => Some(e),
            _ => None,
        }
    }
}

/// Makes each outbound request wait for its quota (see the [module docs](self)).
///
/// The service's error is a [`tower::BoxError`](https://docs.rs/tower/latest/tower/type.BoxError.html):
/// the inner service's error, or a [`ThrottleError`]. A store failure fails the call rather than
/// let it exceed a third party's limit.
pub struct ThrottleLayer<K, A> {
    limiter: RateLimiter<A>,
    key: Arc<K>,
    cost: Option<Arc<CostFn>>,
    max_wait: Duration,
}

impl<K, A> Clone for ThrottleLayer<K, A> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: Arc::clone(&self.key),
            cost: self.cost.clone(),
            max_wait: self.max_wait,
        }
    }
}

impl<K, A: Algorithm> fmt::Debug for ThrottleLayer<K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleLayer")
            .field("limiter", &self.limiter)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl<K: KeyExtractor, A: Algorithm> ThrottleLayer<K, A> {
    /// Throttles requests under the key `key` gives them; waits at most 10 s by default.
    /// A request without a key is not throttled.
    pub fn new(limiter: RateLimiter<A>, key: K) -> Self {
        Self {
            limiter,
            key: Arc::new(key),
            cost: None,
            max_wait: Duration::from_secs(10),
        }
    }

    /// Units each request costs (default 1; 0 makes it free).
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// The longest a request waits for its quota before failing with
    /// [`ThrottleError::WouldExceedMaxWait`]. A request that would have to wait longer fails at
    /// once, without waiting in vain.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }
}

impl<S, K, A> Layer<S> for ThrottleLayer<K, A> {
    type Service = Throttle<S, K, A>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle {
            inner,
            layer: ThrottleLayer {
                limiter: self.limiter.clone(),
                key: Arc::clone(&self.key),
                cost: self.cost.clone(),
                max_wait: self.max_wait,
            },
        }
    }
}

/// The service made by [`ThrottleLayer`].
pub struct Throttle<S, K, A> {
    inner: S,
    layer: ThrottleLayer<K, A>,
}

impl<S: Clone, K, A> Clone for Throttle<S, K, A> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, K, A: Algorithm> fmt::Debug for Throttle<S, K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

/// Waits until `key` has `cost` units, within `max_wait`.
async fn acquire<A: Algorithm>(
    limiter: &RateLimiter<A>,
    key: &str,
    cost: u32,
    max_wait: Duration,
) -> Result<Decision, ThrottleError> {
    let deadline = Instant::now() + max_wait;
    loop {
        let d = limiter
            .check(key, cost)
            .await
            .map_err(ThrottleError::Store)?;
        if d.allowed {
            return Ok(d);
        }
        match d.retry_after {
            Some(wait) if Instant::now() + wait <= deadline => {
                tracing::debug!(policy = %d.policy, ?wait, "rate limit: waiting for quota");
                tokio::time::sleep(wait).await;
            }
            _ => return Err(ThrottleError::WouldExceedMaxWait { decision: d }),
        }
    }
}

impl<S, K, A, B> Service<Request<B>> for Throttle<S, K, A>
where
    S: Service<Request<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    K: KeyExtractor,
    A: Algorithm,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = BoxFuture<'static, Result<S::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (parts, body) = req.into_parts();
        let key = self.layer.key.extract(&parts);
        let cost = self.layer.cost.as_ref().map_or(1, |f| f(&parts));
        let req = Request::from_parts(parts, body);
        let limiter = self.layer.limiter.clone();
        let max_wait = self.layer.max_wait;
        Box::pin(async move {
            if let (Some(key), true) = (key, cost > 0) {
                acquire(&limiter, &key, cost, max_wait).await?;
            }
            inner.call(req).await.map_err(Into::into)
        })
    }
}
