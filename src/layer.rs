//! The tower layer.

use std::{fmt, num::NonZeroU32, sync::Arc};

use bytes::Bytes;
use http::{request::Parts, Response};
use tower_layer::Layer;

use crate::{
    headers::HeaderStyle, response::Responder, service::Config, Algorithm, Decision, FailurePolicy,
    KeyExtractor, RateLimit, RateLimiter,
};

/// What the layer does with a request whose [`KeyExtractor`] found no key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// All keyless requests share one quota (a key no client can produce). The default: a misconfigured
    /// extractor (e.g. [`PeerIp`](crate::PeerIp) without connection info) still limits,
    /// and the first such request logs a warning.
    #[default]
    Shared,
    /// Keyless requests are not limited and get no rate-limit headers.
    Allow,
}

/// Rate-limits the requests of a wrapped service, one key per request.
///
/// An allowed request goes to the inner service and its response gets the rate-limit headers;
/// a denied request never reaches the inner service and gets `429 Too Many Requests` with the
/// headers and `Retry-After` (gRPC requests: HTTP 200 with `grpc-status: 8`,
/// RESOURCE_EXHAUSTED). When the store fails, the [`FailurePolicy`] decides.
///
/// Cloning is cheap: the configuration is shared; `K` and `A` need not be `Clone`.
///
/// ```no_run
/// use std::net::SocketAddr;
/// use axum::{routing::get, Router};
/// use tower_redis_ratelimit::{Gcra, PeerIp, Quota, RateLimitLayer, RateLimiter, RedisStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// let limiter = RateLimiter::new(store, Gcra::new(Quota::per_minute(100).burst(20))?);
/// let app = Router::new()
///     .route("/", get(|| async { "ok" }))
///     .layer(RateLimitLayer::new(limiter, PeerIp));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
/// # Ok(()) }
/// ```
pub struct RateLimitLayer<K, A> {
    limiter: RateLimiter<A>,
    key: Arc<K>,
    cost: Option<Arc<CostFn>>,
    missing_key: MissingKey,
    failure: FailurePolicy,
    local_share: NonZeroU32,
    /// The local-share twin, built when the policy is `Local`.
    local: Option<RateLimiter<A>>,
    partition_secret: Option<Arc<[u8]>>,
    responder: Responder,
}

pub(crate) type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;

impl<K, A> Clone for RateLimitLayer<K, A> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: Arc::clone(&self.key),
            cost: self.cost.clone(),
            missing_key: self.missing_key,
            failure: self.failure,
            local_share: self.local_share,
            local: self.local.clone(),
            partition_secret: self.partition_secret.clone(),
            responder: self.responder.clone(),
        }
    }
}

impl<K, A: Algorithm> fmt::Debug for RateLimitLayer<K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("failure", &self.failure)
            .field("missing_key", &self.missing_key)
            .field("responder", &self.responder)
            .finish_non_exhaustive()
    }
}

impl<K: KeyExtractor, A: Algorithm> RateLimitLayer<K, A> {
    /// Limits each request under the key `key` gives it, with `limiter`'s algorithm and store.
    /// Defaults: cost 1, IETF headers, [`FailurePolicy::Open`], [`MissingKey::Shared`].
    pub fn new(limiter: RateLimiter<A>, key: K) -> Self {
        Self {
            limiter,
            key: Arc::new(key),
            cost: None,
            missing_key: MissingKey::default(),
            failure: FailurePolicy::default(),
            local_share: NonZeroU32::MIN,
            local: None,
            partition_secret: None,
            responder: Responder::default(),
        }
    }

    /// Which rate-limit headers to send (default [`HeaderStyle::Ietf`]).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.responder.style = style;
        self
    }

    /// What to do when the store fails or times out (default [`FailurePolicy::Open`]).
    ///
    /// With [`FailurePolicy::Local`], also set [`local_share`](Self::local_share) to the number
    /// of instances sharing the quota.
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// # let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(600)).unwrap());
    /// // Four gateways: while Redis is away, each admits 150 a minute per key.
    /// let layer = RateLimitLayer::new(limiter, PeerIp)
    ///     .on_store_error(FailurePolicy::Local)
    ///     .local_share(4);
    /// ```
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self.rebuild_local();
        self
    }

    /// The number of instances that share the quota, for [`FailurePolicy::Local`]: while the
    /// store is unavailable, each instance decides alone with the quota (limit and burst)
    /// divided by `instances`, rounded down but at least one unit (default 1: the whole quota
    /// per instance).
    ///
    /// # Panics
    ///
    /// If `instances` is 0.
    pub fn local_share(mut self, instances: u32) -> Self {
        self.local_share = NonZeroU32::new(instances).expect("local_share must be at least 1");
        self.rebuild_local();
        self
    }

    fn rebuild_local(&mut self) {
        self.local = None;
        if self.failure == FailurePolicy::Local {
            self.local = self.limiter.local_twin(self.local_share);
            if self.local.is_none() {
                tracing::error!(
                    algorithm = self.limiter.algorithm().name(),
                    "rate limit: FailurePolicy::Local needs an algorithm with a local share; \
                     requests are rejected while the store is unavailable"
                );
            }
        }
    }

    /// What to do with requests that have no key (default [`MissingKey::Shared`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.missing_key = missing;
        self
    }

    /// Units each request costs (default 1). A cost of 0 makes the request free: it is not
    /// checked and gets no rate-limit headers.
    ///
    /// ```
    /// # use tower_redis_ratelimit::{Gcra, GlobalKey, MemoryStore, Quota, RateLimitLayer, RateLimiter};
    /// # let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(250)).unwrap());
    /// let layer = RateLimitLayer::new(limiter, GlobalKey).cost(|parts| match parts.uri.path() {
    ///     "/health" => 0,
    ///     p if p.starts_with("/send") => 5,
    ///     _ => 1,
    /// });
    /// ```
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Builds the response for denied (non-gRPC) requests instead of the default plain-text
    /// 429. The rate-limit headers and `Retry-After` are added unless already present.
    ///
    /// ```
    /// # use tower_redis_ratelimit::{Gcra, GlobalKey, MemoryStore, Quota, RateLimitLayer, RateLimiter};
    /// # let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(250)).unwrap());
    /// let layer = RateLimitLayer::new(limiter, GlobalKey).on_limited(|d| {
    ///     let body = format!(r#"{{"error":"slow down","remaining":{}}}"#, d.remaining);
    ///     http::Response::builder()
    ///         .status(429)
    ///         .header("content-type", "application/json")
    ///         .body(body.into())
    ///         .unwrap()
    /// });
    /// ```
    pub fn on_limited<F>(mut self, reject: F) -> Self
    where
        F: Fn(&Decision) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.responder.reject = Some(Arc::new(reject));
        self
    }

    /// Answers denied requests (other than gRPC) with an RFC 9457 `application/problem+json`
    /// body of type `quota-exceeded` listing the `violated-policies`, instead of plain text.
    ///
    /// ```text
    /// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
    ///  "title":"Request cannot be satisfied as assigned quota has been exceeded",
    ///  "status":429,"detail":"cost 1 exceeds the 0 units left; retry in 4 s",
    ///  "violated-policies":["default"]}
    /// ```
    pub fn problem_details(mut self) -> Self {
        self.responder.problem_details = true;
        self
    }

    /// Adds the IETF `pk` (partition key) parameter to the `RateLimit` fields: a keyed hash of
    /// the request's rate-limit key, so clients sharing an IP can tell their quotas apart,
    /// without revealing the key. Instances sharing the secret give the same `pk`.
    pub fn partition_key(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.partition_secret = Some(Arc::from(secret.as_ref()));
        self
    }

    /// The limiter.
    pub fn limiter(&self) -> &RateLimiter<A> {
        &self.limiter
    }
}

impl<S, K: KeyExtractor, A: Algorithm> Layer<S> for RateLimitLayer<K, A> {
    type Service = RateLimit<S, K, A>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(
            inner,
            Arc::new(Config {
                limiter: self.limiter.clone(),
                key: Arc::clone(&self.key),
                cost: self.cost.clone(),
                missing_key: self.missing_key,
                failure: self.failure,
                local: self.local.clone(),
                partition_secret: self.partition_secret.clone(),
                responder: Arc::new(self.responder.clone()),
            }),
        )
    }
}
