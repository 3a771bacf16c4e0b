//! The tower service.

use std::{
    fmt,
    sync::{atomic::AtomicBool, Arc},
    task::{Context, Poll},
};

use http::{Request, Response};
use tower_service::Service;

use super::{
    config::Config,
    future::{Answer, ResponseFuture},
};
use crate::{
    extract::{Key, KeyExtractor},
    http::{is_grpc, key_of, Keyed, ResponseBody},
};

static WARNED_UNKEYED: AtomicBool = AtomicBool::new(false);

/// The service made by [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer).
pub struct ConcurrencyLimit<S, K> {
    inner: S,
    config: Arc<Config<K>>,
}

impl<S, K> ConcurrencyLimit<S, K> {
    pub(crate) fn new(inner: S, config: Arc<Config<K>>) -> Self {
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

impl<S: Clone, K> Clone for ConcurrencyLimit<S, K> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), Arc::clone(&self.config))
    }
}

impl<S: fmt::Debug, K> fmt::Debug for ConcurrencyLimit<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .field("layer", &self.config)
            .finish()
    }
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimit<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor,
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
        let (parts, body) = req.into_parts();
        let keyed = key_of(
            &*config.key,
            config.missing_key,
            &parts,
            &WARNED_UNKEYED,
            "concurrency limit",
        );
        let key = match keyed {
            Keyed::Limited(key) => Ok(key.map(Key::into_owned)),
            Keyed::Unlimited => Err(()),
        };
        let answer = Answer {
            responder: Arc::clone(&config.responder),
            limiter: config.limiter.clone(),
            grpc: is_grpc(&parts.headers),
        };
        let req = Request::from_parts(parts, body);
        let Ok(key) = key else {
            return ResponseFuture::unchecked(req, inner, answer);
        };
        let acquire = config.limiter.acquire_owned(key);
        ResponseFuture::acquiring(acquire, req, inner, answer)
    }
}
