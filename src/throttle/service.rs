//! The throttle's tower service: wait for quota, then call the inner service.

use std::{
    fmt,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use http::Request;
use tower_service::Service;

use super::{config::Settings, error::ThrottleError};
use crate::{Algorithm, BoxFuture, Key, KeyExtractor, RateLimiter};

/// The service made by [`ThrottleLayer`](super::ThrottleLayer).
pub struct Throttle<S, K, A> {
    inner: S,
    settings: Settings<K, A>,
}

impl<S, K, A> Throttle<S, K, A> {
    pub(crate) fn new(inner: S, settings: Settings<K, A>) -> Self {
        Self { inner, settings }
    }
}

impl<S: Clone, K, A> Clone for Throttle<S, K, A> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            settings: self.settings.clone(),
        }
    }
}

impl<S: fmt::Debug, K, A: Algorithm> fmt::Debug for Throttle<S, K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("inner", &self.inner)
            .field("limiter", &self.settings.limiter)
            .field("max_wait", &self.settings.max_wait)
            .finish_non_exhaustive()
    }
}

/// Waits until `key` has `cost` units, within `max_wait`. Under a limiter in shadow mode,
/// never waits nor fails: a denial is counted and logged, a store error logged.
async fn acquire<A: Algorithm>(
    limiter: &RateLimiter<A>,
    key: &Key<'_>,
    cost: u32,
    max_wait: Duration,
) -> Result<(), ThrottleError> {
    let deadline = Instant::now() + max_wait;
    let shadow = limiter.is_shadow();
    loop {
        let d = match limiter.check(key, cost).await {
            Ok(d) => d,
            Err(e) if shadow => {
                tracing::warn!(error = %e, "rate limit: store failed (shadow mode: not waiting)");
                return Ok(());
            }
            Err(e) => return Err(ThrottleError::Store(e)),
        };
        if d.allowed {
            return Ok(());
        }
        if shadow {
            limiter.engine.shadow_denied(&d);
            return Ok(());
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
        let key = self.settings.key.extract(&parts).map(Key::into_owned);
        let cost = self.settings.cost.as_ref().map_or(1, |f| f(&parts));
        let req = Request::from_parts(parts, body);
        let limiter = self.settings.limiter.clone();
        let max_wait = self.settings.max_wait;
        Box::pin(async move {
            if let (Some(key), true) = (key, cost > 0) {
                acquire(&limiter, &key, cost, max_wait).await?;
            }
            inner.call(req).await.map_err(Into::into)
        })
    }
}
