//! The tower layer.

use std::{fmt, num::NonZeroU32, sync::Arc};

use bytes::Bytes;
use http::{request::Parts, Response};
use tower_layer::Layer;

use super::{
    config::{Class, Config, MissingKey, Policy},
    headers::HeaderStyle,
    response::Responder,
    service::RateLimit,
};
use crate::{Algorithm, Decision, FailurePolicy, KeyExtractor, RateLimiter};

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
    config: Config<K, A>,
}

impl<K, A> Clone for RateLimitLayer<K, A> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
        }
    }
}

impl<K, A: Algorithm> fmt::Debug for RateLimitLayer<K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let names: Vec<&str> = c.policies.iter().map(|p| p.limiter.policy_name()).collect();
        f.debug_struct("RateLimitLayer")
            .field("policies", &names)
            .field("failure", &c.failure)
            .field("missing_key", &c.missing_key)
            .field("responder", &c.responder)
            .finish_non_exhaustive()
    }
}

impl<K: KeyExtractor, A: Algorithm> RateLimitLayer<K, A> {
    /// Limits each request under the key `key` gives it, with `limiter`'s algorithm and store.
    /// Defaults: cost 1, IETF headers, [`FailurePolicy::Open`], [`MissingKey::Shared`].
    pub fn new(limiter: RateLimiter<A>, key: K) -> Self {
        Self {
            config: Config {
                policies: vec![Policy {
                    limiter,
                    local: None,
                }],
                classify: None,
                key: Arc::new(key),
                cost: None,
                missing_key: MissingKey::default(),
                failure: FailurePolicy::default(),
                local_share: NonZeroU32::MIN,
                partition_secret: None,
                responder: Arc::new(Responder::default()),
            },
        }
    }

    /// Adds a policy that [`classify`](Self::classify) can select by the limiter's policy
    /// name, e.g. a paid tier with its own quota. Give each policy its own key prefix, or they
    /// share counters.
    ///
    /// ```
    /// use tower_redis_ratelimit::*;
    ///
    /// #[derive(Clone)]
    /// struct Plan(&'static str); // inserted by your authentication middleware
    ///
    /// let store = MemoryStore::new();
    /// let free = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_minute(60))?)
    ///     .prefix("free").policy_name("free").build()?;
    /// let paid = RateLimiter::builder(store, Gcra::new(Quota::per_minute(6000))?)
    ///     .prefix("paid").policy_name("paid").build()?;
    /// let layer = RateLimitLayer::new(free, HeaderKey::new("x-api-key")?)
    ///     .policy(paid)
    ///     .classify(|parts| match (parts.uri.path(), parts.extensions.get::<Plan>()) {
    ///         ("/health", _) => Class::Bypass,
    ///         (_, Some(Plan("paid"))) => Class::policy("paid"),
    ///         _ => Class::Default,
    ///     });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(mut self, limiter: RateLimiter<A>) -> Self {
        self.config.policies.push(Policy {
            limiter,
            local: None,
        });
        self.rebuild_local();
        self
    }

    /// Picks each request's policy (default: always the first). Classify on what the client
    /// cannot forge: an authenticated identity, a route, not a client-chosen header.
    pub fn classify<F>(mut self, classify: F) -> Self
    where
        F: Fn(&Parts) -> Class + Send + Sync + 'static,
    {
        self.config.classify = Some(Arc::new(classify));
        self
    }

    /// Which rate-limit headers to send (default [`HeaderStyle::Ietf`]).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        Arc::make_mut(&mut self.config.responder).style = style;
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
        self.config.failure = policy;
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
        self.config.local_share =
            NonZeroU32::new(instances).expect("local_share must be at least 1");
        self.rebuild_local();
        self
    }

    /// (Re)builds each policy's local twin for [`FailurePolicy::Local`].
    fn rebuild_local(&mut self) {
        let c = &mut self.config;
        for p in &mut c.policies {
            p.local = None;
            if c.failure == FailurePolicy::Local {
                p.local = p.limiter.local_twin(c.local_share);
                if p.local.is_none() {
                    tracing::error!(
                        algorithm = p.limiter.algorithm().name(),
                        "rate limit: FailurePolicy::Local needs an algorithm with a local \
                         share; requests are rejected while the store is unavailable"
                    );
                }
            }
        }
    }

    /// What to do with requests that have no key (default [`MissingKey::Shared`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.config.missing_key = missing;
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
        self.config.cost = Some(Arc::new(cost));
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
        Arc::make_mut(&mut self.config.responder).reject = Some(Arc::new(reject));
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
        Arc::make_mut(&mut self.config.responder).problem_details = true;
        self
    }

    /// Adds the IETF `pk` (partition key) parameter to the `RateLimit` fields: a keyed hash of
    /// the request's rate-limit key, so clients sharing an IP can tell their quotas apart,
    /// without revealing the key. Instances sharing the secret give the same `pk`.
    pub fn partition_key(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.config.partition_secret = Some(Arc::from(secret.as_ref()));
        self
    }

    /// The default policy's limiter.
    pub fn limiter(&self) -> &RateLimiter<A> {
        &self.config.policies[0].limiter
    }
}

impl<S, K: KeyExtractor, A: Algorithm> Layer<S> for RateLimitLayer<K, A> {
    type Service = RateLimit<S, K, A>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::new(self.config.clone()))
    }
}
