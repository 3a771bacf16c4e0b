//! The tower service.

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{
    body::ResponseBody,
    config::{Config, MissingKey},
    future::ResponseFuture,
    headers::partition_key,
    response::is_grpc,
};
use crate::{Algorithm, BoxFuture, KeyExtractor};

static WARNED_UNKEYED: AtomicBool = AtomicBool::new(false);

/// The service made by [`RateLimitLayer`](crate::RateLimitLayer).
pub struct RateLimit<S, K, A> {
    inner: S,
    config: Arc<Config<K, A>>,
}

impl<S, K, A> RateLimit<S, K, A> {
    pub(crate) fn new(inner: S, config: Arc<Config<K, A>>) -> Self {
        Self { inner, config }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K, A> Clone for RateLimit<S, K, A> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, K, A: Algorithm> fmt::Debug for RateLimit<S, K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.config.policies[0].limiter)
            .finish_non_exhaustive()
    }
}

impl<S, K, A, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K, A>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    K: KeyExtractor,
    A: Algorithm,
    ReqBody: Send + 'static,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The limit depends on the request's key, so the decision is made in `call`.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // Call the clone that was driven to readiness; leave a fresh clone in its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = &*self.config;
        let responder = Arc::clone(&config.responder);

        let (parts, body) = req.into_parts();
        let grpc = is_grpc(&parts.headers);
        let policy = config.policy_for(&parts);
        let cost = config.cost.as_ref().map_or(1, |f| f(&parts));
        let key = config.key.extract(&parts);
        let req = Request::from_parts(parts, body);
        let Some(policy) = policy.filter(|_| cost > 0) else {
            return ResponseFuture::unchecked(req, inner, responder);
        };
        if key.is_none() {
            if config.missing_key == MissingKey::Allow {
                return ResponseFuture::unchecked(req, inner, responder);
            }
            if !WARNED_UNKEYED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "rate limit: a request had no key; keyless requests share one quota"
                );
            }
        }
        let pk = config
            .partition_secret
            .as_ref()
            .map(|secret| partition_key(secret, key.as_deref().unwrap_or("#")));
        let base = policy.limiter.base_key(key.as_deref());
        // Answered without waiting (deny cache, in-memory store): no boxed future.
        let mut failed = None;
        match policy.limiter.decide_now(&base, cost) {
            // The store is down and a local share is configured: decide below, locally.
            Some(Err(e)) if policy.local.is_some() && e.is_unavailable() => failed = Some(e),
            Some(result) => {
                let result = result.map(|mut d| {
                    d.partition_key = pk;
                    d
                });
                return ResponseFuture::decided(
                    result,
                    req,
                    inner,
                    responder,
                    config.failure,
                    grpc,
                );
            }
            None => {}
        }
        let limiter = policy.limiter.clone();
        let local = policy.local.clone();
        let check: BoxFuture<'static, _> = Box::pin(async move {
            let mut d = limiter
                .check_or_local(base, key.as_deref(), cost, local.as_ref(), failed)
                .await?;
            d.partition_key = pk;
            Ok(d)
        });
        ResponseFuture::checking(check, req, inner, responder, config.failure, grpc)
    }
}
