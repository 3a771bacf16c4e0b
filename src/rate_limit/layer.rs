//! The tower layer.

use std::{fmt, sync::Arc};

use bytes::Bytes;
use http::{request::Parts, HeaderMap, HeaderName, Response, StatusCode};
use http_body::Body;
use tower_layer::Layer;

use super::{
    config::{next_layer_id, Class, Config, Policy, PolicyId},
    counting::StatusSet,
    engine::RateEngine,
    limiter::RateLimiter,
    lists::{AccessList, Lists},
    live::{Limits, LiveLimits},
    service::RateLimit,
    usage::SettleFrom,
};
use crate::{
    algorithm::Algorithm,
    decision::Decision,
    error::ConfigError,
    extract::{KeyExtractor, MissingKey},
    http::{box_body, BoxError, HeaderStyle, Responder},
    quota::Quota,
};

/// Rate-limits the requests of a wrapped service, one key per request.
///
/// An allowed request goes to the inner service and its response gets the rate-limit headers;
/// a denied request never reaches the inner service and gets `429 Too Many Requests` with the
/// headers and `Retry-After` (gRPC requests: HTTP 200 with `grpc-status: 8`,
/// RESOURCE_EXHAUSTED, the same headers, and the wait as `google.rpc.RetryInfo` in
/// `grpc-status-details-bin` and as `grpc-retry-pushback-ms`, or a pushback of `-1` when the
/// request can never fit the quota). When the store fails, the policy's
/// [`FailurePolicy`](crate::FailurePolicy) decides (set on its limiter with
/// [`RateLimiterBuilder::on_store_error`](crate::rate_limit::RateLimiterBuilder::on_store_error)).
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
/// let limiter = RateLimiter::new(store, Gcra::new(Quota::per_minute(100).burst(20))?)?;
/// let app = Router::new()
///     .route("/", get(|| async { "ok" }))
///     .layer(RateLimitLayer::new(limiter, PeerIp));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
/// # Ok(()) }
/// ```
pub struct RateLimitLayer<K, A> {
    config: Config<K>,
    default: RateLimiter<A>,
}

impl<K, A> Clone for RateLimitLayer<K, A> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
            default: self.default.clone(),
        }
    }
}

impl<K, A> fmt::Debug for RateLimitLayer<K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl<K: KeyExtractor, A: Algorithm> RateLimitLayer<K, A> {
    /// Limits each request under the key `key` gives it, with `limiter`'s algorithm, store and
    /// failure policy. Defaults: cost 1, IETF headers, [`MissingKey::Shared`].
    pub fn new(limiter: RateLimiter<A>, key: K) -> Self {
        Self {
            config: Config {
                id: next_layer_id(),
                policies: vec![Policy::new(&limiter.engine)],
                classify: None,
                key: Arc::new(key),
                cost: None,
                quota: None,
                count: None,
                settle: None,
                missing_key: MissingKey::default(),
                partition_secret: None,
                responder: Arc::new(Responder::default()),
                extension: false,
                lists: None,
                live: None,
            },
            default: limiter,
        }
    }

    /// Adds a policy that [`classify`](Self::classify) can select with the returned handle,
    /// e.g. a stricter log-in limit, or a paid tier with its own quota. It may use another
    /// algorithm than the default policy, and has its own failure policy. Each policy counts
    /// under its own name: a second policy with a name already in this layer is an error
    /// (field `policy_name`).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `policy_name` when a policy of this layer already has that
    /// name.
    ///
    /// ```
    /// use tower_redis_ratelimit::{rate_limit::Class, *};
    ///
    /// #[derive(Clone)]
    /// struct Plan(&'static str); // inserted by your authentication middleware
    ///
    /// let store = MemoryStore::new();
    /// let free = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_minute(60))?)
    ///     .policy_name("free").build()?;
    /// let paid = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_minute(6000))?)
    ///     .policy_name("paid").build()?;
    /// let login = RateLimiter::builder(store, SlidingWindow::new(Quota::per_minute(5))?)
    ///     .policy_name("login")
    ///     .on_store_error(FailurePolicy::Closed)
    ///     .build()?;
    /// let mut layer = RateLimitLayer::new(free, HeaderKey::new("x-api-key")?);
    /// let paid = layer.add_policy(paid)?;
    /// let login = layer.add_policy(login)?;
    /// let layer = layer.classify(move |parts| match (parts.uri.path(), parts.extensions.get::<Plan>()) {
    ///     ("/health", _) => Class::Bypass,
    ///     ("/login", _) => Class::Policy(login),
    ///     (_, Some(Plan("paid"))) => Class::Policy(paid),
    ///     _ => Class::Default,
    /// });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add_policy<B: Algorithm>(
        &mut self,
        limiter: RateLimiter<B>,
    ) -> Result<PolicyId, ConfigError> {
        let name = limiter.engine.policy();
        if self
            .config
            .policies
            .iter()
            .any(|p| p.engine.policy() == name)
        {
            return Err(ConfigError::new(
                "policy_name",
                format!("this layer already has a policy named {name:?}"),
            ));
        }
        if self.config.count.is_some() {
            cannot_refund(&limiter.engine)?;
        }
        if let Some(settle) = &self.config.settle {
            cannot_settle(&limiter.engine, settle.field())?;
        }
        self.config.policies.push(Policy::new(&limiter.engine));
        Ok(PolicyId::new(
            self.config.id,
            self.config.policies.len() - 1,
        ))
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

    /// Writes the rate-limit fields on denials only (the `429`, or gRPC's
    /// `RESOURCE_EXHAUSTED`, with `Retry-After` and the fields of [`headers`](Self::headers)'
    /// style): an allowed response carries none, and its decision is never rendered. What
    /// tower_governor and most gateways do, and the layer's leanest path; clients then learn
    /// their quota only when they exceed it. The default writes them on every response.
    ///
    /// ```
    /// # use tower_redis_ratelimit::{Gcra, GlobalKey, MemoryStore, Quota, RateLimitLayer, RateLimiter};
    /// # let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(100)).unwrap()).unwrap();
    /// let layer = RateLimitLayer::new(limiter, GlobalKey).headers_on_denials_only();
    /// ```
    pub fn headers_on_denials_only(mut self) -> Self {
        Arc::make_mut(&mut self.config.responder).denials_only = true;
        self
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
    /// # let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(250)).unwrap()).unwrap();
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

    /// A quota decided per request: a customer's plan from what an authentication layer put
    /// in the request extensions, a claim of a verified token, a plan cached from a
    /// database. `None` keeps the policy's configured quota. It applies to whichever policy
    /// the request falls under, with that policy's algorithm and counters (see
    /// [`RateLimiter::check_with_quota`](crate::RateLimiter::check_with_quota) for what a
    /// change of quota does to a key's state); the headers show the quota used.
    ///
    /// A quota that cannot build the policy's algorithm (a zero limit, say) is not used: the
    /// request is decided under the configured quota, and a warning is logged each time. Never
    /// a panic, never a request let through unlimited. Look the quota up from what the client
    /// cannot forge.
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// #[derive(Clone)]
    /// struct Plan { per_minute: u32 } // put in the extensions by your auth layer
    ///
    /// # fn layer() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(60))?)?;
    /// let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-api-key")?)
    ///     .quota_fn(|parts| {
    ///         let plan = parts.extensions.get::<Plan>()?;
    ///         Some(Quota::per_minute(plan.per_minute))
    ///     });
    /// # Ok(()) }
    /// ```
    pub fn quota_fn<F>(mut self, quota: F) -> Self
    where
        F: Fn(&Parts) -> Option<Quota> + Send + Sync + 'static,
    {
        self.config.quota = Some(Arc::new(quota));
        self
    }

    /// Counts only the responses `count` says so: the units of any other response are given
    /// back once its head is ready ([`RateLimiter::refund`]), so that, for example, only
    /// failed log-ins spend a log-in quota (express-rate-limit's `skipSuccessfulRequests`, a
    /// Fail2Ban mode). `count` sees the response's status and headers; for gRPC that is the
    /// HTTP head, which holds `grpc-status` only for a trailers-only (error) response. Applies
    /// to every policy of the layer.
    ///
    /// Exact under concurrency: units are taken before the inner service runs and given back
    /// after, atomically in the store, so concurrent requests can never make more counted
    /// responses than the limit (an uncounted request may be turned away while others are in
    /// flight, as their units are still out). The response waits for the refund (one store
    /// call, within the store timeout), so the client's next request sees the units back; its
    /// `RateLimit` header shows them back too.
    ///
    /// A request counts when it was not seen to complete uncounted:
    /// - the inner service failed (no response), or the client went away and the response
    ///   future was dropped before the response head was ready: counted. An attacker cannot
    ///   spend nothing by hanging up before the answer;
    /// - the refund failed in the store: counted (the units stay spent, a warning is logged
    ///   and [`LimiterStats::refund_errors`](crate::telemetry::LimiterStats::refund_errors) counts it);
    /// - the future was dropped while the refund was on its way: counted unless the refund
    ///   already reached the store (a refund is atomic: all or nothing).
    ///
    /// Errors with a [`ConfigError`] naming `count_if` when a policy's algorithm cannot give
    /// units back (a custom script); the built-in algorithms all can.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when a policy's algorithm cannot give units back (a custom script).
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// # fn layer() -> Result<(), Box<dyn std::error::Error>> {
    /// // 5 failed log-ins per account a minute; successful ones are free.
    /// let limiter = RateLimiter::new(MemoryStore::new(), SlidingWindow::new(Quota::per_minute(5))?)?;
    /// let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-account")?)
    ///     .count_if(|status, _headers| status.is_client_error() || status.is_server_error())?;
    /// # Ok(()) }
    /// ```
    pub fn count_if<F>(mut self, count: F) -> Result<Self, ConfigError>
    where
        F: Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    {
        for policy in &self.config.policies {
            cannot_refund(&policy.engine)?;
        }
        self.config.count = Some(Arc::new(count));
        Ok(self)
    }

    /// Counts only the responses whose status is in `statuses` (see
    /// [`count_if`](Self::count_if), whose rules apply).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `count_only` for an empty set, or as
    /// [`count_if`](Self::count_if).
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// # fn layer() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(10))?)?;
    /// let layer = RateLimitLayer::new(limiter, PeerIp).count_only("401,403,5xx".parse()?)?;
    /// # Ok(()) }
    /// ```
    ///
    /// An empty set (nothing would ever count, so nothing would be limited) is a
    /// [`ConfigError`] naming `count_only`.
    pub fn count_only(self, statuses: StatusSet) -> Result<Self, ConfigError> {
        if statuses.is_empty() {
            return Err(ConfigError::new(
                "count_only",
                "no status codes: no response would spend quota, so nothing would be limited",
            ));
        }
        self.count_if(move |status, _| statuses.contains(status))
    }

    /// Settles each request's charge to the whole number its response carries in the header
    /// `name`: the request is admitted on its first charge (its [`cost`](Self::cost), an
    /// estimate), and once the inner service's response head is ready, the charge is settled
    /// to the figure in one atomic store call *before* the response is returned, so the key's
    /// next request sees it (see [`RateLimiter::settle`] for what a settlement up or down
    /// does: below the charge, units back, at most what it still holds; above it, a debt that
    /// the key's next requests wait out, refused with a `Retry-After` covering it). For a
    /// model's tokens, a download's bytes, a query's complexity: any usage the inner service
    /// knows when it answers.
    ///
    /// - **The figure**: one value of ASCII digits, at most
    ///   [`Settled::MAX_ACTUAL`](super::Settled::MAX_ACTUAL). A missing header leaves the
    ///   first charge. A value that does not read (negative, `abc`, `1e9`, empty, several
    ///   values, too large) leaves the first charge too, and is logged at most once a second
    ///   for the policy (`warn`, with the value's first bytes); never a panic.
    /// - **The header stays** on the response, for the client to read. Behind a proxy that
    ///   must not forward it, remove it outside this layer.
    /// - **What holds no charge settles nothing**: a denial let through in shadow mode, a
    ///   request let through while the store fails, a free or bypassed request. An admitted
    ///   request under shadow mode is settled as when enforcing, so that shadow mode reports
    ///   what enforcing would do.
    /// - **With [`count_if`](Self::count_if)**: a response that does not count gives its
    ///   whole charge back, as without settling; one that counts is settled.
    /// - **With [`settle_from_handle`](Self::settle_from_handle)**: the first to settle wins
    ///   (a handler's settlement before the response makes the header's do nothing).
    /// - **A store error** while settling: the response is returned all the same, the error
    ///   logged at most once a second for the policy; the settlement happened whole or not at
    ///   all.
    ///
    /// The response's `RateLimit` field shows the units left after the settlement (the reset
    /// time stays the check's).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `settle_from_header` when a policy cannot settle: a
    /// [`MultiLimit`](crate::algorithm::MultiLimit) built with `new` (one built with
    /// [`budgets`](crate::algorithm::MultiLimit::budgets) settles) or a custom script, a
    /// [`RegionalStore`](crate::store::redis::RegionalStore), unit leases.
    ///
    /// ```
    /// use http::HeaderName;
    /// use tower_redis_ratelimit::*;
    ///
    /// # fn layer() -> Result<(), Box<dyn std::error::Error>> {
    /// // 100,000 tokens a minute per API key: each call is admitted on an estimate of 1,000,
    /// // then settled to the tokens the upstream says it used.
    /// let tokens = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(100_000))?)?;
    /// let layer = RateLimitLayer::new(tokens, HeaderKey::new("x-api-key")?)
    ///     .cost(|_| 1_000)
    ///     .settle_from_header(HeaderName::from_static("x-usage-tokens"))?;
    /// # Ok(()) }
    /// ```
    pub fn settle_from_header(mut self, name: HeaderName) -> Result<Self, ConfigError> {
        self.settle_mut("settle_from_header")?.header = Some(name);
        Ok(self)
    }

    /// Puts a [`Usage`](super::Usage) handle in each request's extensions, for the handler
    /// to settle the request's charge to the units it used whenever it knows them, also after
    /// the response has started streaming (see [`Usage`](super::Usage): settled once, the
    /// first settlement wins; a handle dropped without settling leaves the first charge). Axum handlers take it with
    /// `Extension<Usage>`; others with `req.extensions().get::<Usage>().cloned()`.
    ///
    /// Off by default: a handle costs an allocation per request.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `settle_from_handle` when a policy cannot settle (as for
    /// [`settle_from_header`](Self::settle_from_header)).
    ///
    /// ```
    /// use tower_redis_ratelimit::{rate_limit::{Settled, Usage}, *};
    ///
    /// # fn layer() -> Result<(), Box<dyn std::error::Error>> {
    /// let bytes = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_hour(1 << 30))?)?;
    /// let layer = RateLimitLayer::new(bytes, PeerIp)
    ///     .cost(|_| 1 << 20) // a megabyte, until the handler knows
    ///     .settle_from_handle()?;
    /// // In the handler, or in the task that streams its body:
    /// async fn served(usage: Usage, bytes_sent: u64) -> Result<Settled, Error> {
    ///     usage.settle(bytes_sent).await
    /// }
    /// # Ok(()) }
    /// ```
    pub fn settle_from_handle(mut self) -> Result<Self, ConfigError> {
        self.settle_mut("settle_from_handle")?.handle = true;
        Ok(self)
    }

    /// Settles each request's charge to the whole number in the trailer `name` of its
    /// response body: the usage block at the end of a streamed answer (a model's completion
    /// streamed token by token, whose usage is known at its end). When the inner service's
    /// body yields its trailers, the charge is settled before the trailers frame is passed on,
    /// so a client that has read the whole body gets its next request decided on the
    /// settlement. The figure reads as for
    /// [`settle_from_header`](Self::settle_from_header) (one value of ASCII digits; anything
    /// else keeps the first charge, logged at most once a second); its rules apply too: the
    /// first to settle wins (a header in the response head comes first; a handler's
    /// [`Usage`](super::Usage) may come before either), an uncounted response's charge is
    /// given back at its head. A body that ends without the trailer, or is dropped before
    /// it, leaves the first charge. The trailer stays in the body.
    ///
    /// Trailers reach the client over HTTP/2, or over HTTP/1.1 chunked when it sent
    /// `TE: trailers` and the response declares them (`Trailer: x-usage-tokens`); the
    /// settlement does not depend on it: it is made when the inner body yields them.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `settle_from_trailer` when a policy cannot settle (as for
    /// [`settle_from_header`](Self::settle_from_header)).
    ///
    /// ```
    /// use http::HeaderName;
    /// use tower_redis_ratelimit::*;
    ///
    /// # fn layer() -> Result<(), Box<dyn std::error::Error>> {
    /// let tokens = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(100_000))?)?;
    /// let layer = RateLimitLayer::new(tokens, HeaderKey::new("x-api-key")?)
    ///     .cost(|_| 1_000)
    ///     .settle_from_trailer(HeaderName::from_static("x-usage-tokens"))?;
    /// # Ok(()) }
    /// ```
    pub fn settle_from_trailer(mut self, name: HeaderName) -> Result<Self, ConfigError> {
        self.settle_mut("settle_from_trailer")?.trailer = Some(name);
        Ok(self)
    }

    /// The layer's settlement sources, once every policy is known to settle (`field` names
    /// the method asking).
    fn settle_mut(&mut self, field: &'static str) -> Result<&mut SettleFrom, ConfigError> {
        for policy in &self.config.policies {
            cannot_settle(&policy.engine, field)?;
        }
        Ok(Arc::make_mut(
            self.config.settle.get_or_insert_with(Arc::default),
        ))
    }

    /// Builds the response for denied (non-gRPC) requests instead of the default plain-text
    /// 429, with any body: an axum response (`IntoResponse::into_response()`), a `String`,
    /// `Full<Bytes>`... The rate-limit headers and `Retry-After` are added unless already
    /// present.
    ///
    /// ```
    /// # use tower_redis_ratelimit::{Gcra, GlobalKey, MemoryStore, Quota, RateLimitLayer, RateLimiter};
    /// use axum::{http::StatusCode, response::IntoResponse};
    ///
    /// # let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(250)).unwrap()).unwrap();
    /// let layer = RateLimitLayer::new(limiter, GlobalKey).on_limited(|d| {
    ///     let body = format!(r#"{{"error":"slow down","remaining":{}}}"#, d.remaining);
    ///     (StatusCode::TOO_MANY_REQUESTS, [("content-type", "application/json")], body)
    ///         .into_response()
    /// });
    /// ```
    pub fn on_limited<F, B>(mut self, reject: F) -> Self
    where
        F: Fn(&Decision) -> Response<B> + Send + Sync + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Arc::make_mut(&mut self.config.responder).reject =
            Some(Arc::new(move |d: &Decision| reject(d).map(box_body)));
        self
    }

    /// Keys and client networks that no limit of this layer applies to: their requests go
    /// straight to the inner service, with no store call and no rate-limit field (see
    /// [`AccessList`] for how entries match). The deny list wins over it: a request on both is
    /// refused. For keys that must never be throttled: health checks, your own services.
    ///
    /// ```
    /// use tower_redis_ratelimit::{rate_limit::AccessList, *};
    ///
    /// # fn run(limiter: RateLimiter<Gcra>) -> Result<(), ConfigError> {
    /// let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-api-key")?)
    ///     .allow(AccessList::parse(["internal-batch", "10.0.0.0/8"])?);
    /// # Ok(()) }
    /// ```
    pub fn allow(mut self, list: AccessList) -> Self {
        self.lists_mut().allow = list;
        self
    }

    /// Keys and client networks this layer always refuses, before any limit and without a
    /// store call: `403 Forbidden` (`application/problem+json` with
    /// [`problem_details`](Self::problem_details); gRPC `PERMISSION_DENIED`), with no
    /// rate-limit field. A request is checked against the deny list first, then the allow
    /// list, then a ban ([`RateLimiter::ban`]), then the limits.
    pub fn deny(mut self, list: AccessList) -> Self {
        self.lists_mut().deny = list;
        self
    }

    /// How the lists find a request's client address, for their networks: the peer address
    /// unless this [`ClientIp`](crate::extract::ClientIp) trusts proxies (default: `ClientIp::new()`,
    /// the peer). Give the one your key extractor is, when it is a `ClientIp`.
    pub fn list_addresses(mut self, client: crate::extract::ClientIp) -> Self {
        self.lists_mut().client = client;
        self
    }

    /// Takes the default policy's quota, plans, allow and deny lists and shadow mode from
    /// `limits`, and returns the handle that replaces them while the layer runs
    /// ([`LiveLimits::replace`]): a new limit without a restart, counters kept. Lists set
    /// before with [`allow`](Self::allow) and [`deny`](Self::deny) give way to the limits'
    /// (the addresses are still found as [`list_addresses`](Self::list_addresses) said, so
    /// call it first). Shadow mode left unset in `limits` is the limiter's. Errors (naming
    /// the field) when a quota does not build the limiter's algorithm, when `limits`' quota is
    /// not the algorithm's (`quota`: one quota given twice; change it with
    /// [`LiveLimits::replace`]), when `limits` turn off the shadow mode the limiter's builder
    /// turned on (`shadow`), when the limiter's limits are already live in another layer
    /// (`live`), or when the layer chooses quotas with [`quota_fn`](Self::quota_fn).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field, for each case listed above.
    ///
    /// ```
    /// use tower_redis_ratelimit::{rate_limit::{AccessList, Limits}, *};
    ///
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(10))?)?;
    /// let (layer, live) = RateLimitLayer::new(limiter, HeaderKey::new("x-api-key")?)
    ///     .live(Limits::new(Quota::per_minute(10)).plan("gold", Quota::per_minute(100)))?;
    /// // Later, from a reload: checked whole, then in force for the next request.
    /// live.replace(Limits::new(Quota::per_minute(20)).deny(AccessList::parse(["abuser"])?))?;
    /// assert!(live.replace(Limits::new(Quota::per_minute(0))).is_err());
    /// assert_eq!(live.limits().quota(), Quota::per_minute(20));
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn live(mut self, limits: Limits) -> Result<(Self, LiveLimits), ConfigError> {
        if self.config.quota.is_some() {
            return Err(ConfigError::new(
                "quota_fn",
                "live limits choose each request's quota; quota_fn would too",
            ));
        }
        let client = self
            .config
            .lists
            .take()
            .map_or_else(crate::extract::ClientIp::new, |l| l.client.clone());
        let engine = std::sync::Arc::clone(&self.config.policies[0].engine);
        let live = LiveLimits::new(engine, client, limits)?;
        self.config.live = Some(live.clone());
        Ok((self, live))
    }

    fn lists_mut(&mut self) -> &mut Lists {
        Arc::make_mut(self.config.lists.get_or_insert_with(Arc::default))
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
    /// without revealing the key. Instances sharing the secret give the same `pk`. A secret
    /// shorter than [`MIN_PARTITION_SECRET`](Self::MIN_PARTITION_SECRET) bytes is a
    /// [`ConfigError`] naming `partition_key`: with a guessable secret, anyone could hash the
    /// likely keys (addresses, ids) and read the key back from `pk`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `partition_key` for a secret shorter than
    /// [`MIN_PARTITION_SECRET`](Self::MIN_PARTITION_SECRET) bytes.
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// # fn run(limiter: RateLimiter<Gcra>) -> Result<(), ConfigError> {
    /// let layer = RateLimitLayer::new(limiter, PeerIp).partition_key("a secret of 16 bytes or more")?;
    /// # Ok(()) }
    /// ```
    pub fn partition_key(mut self, secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        let secret = secret.as_ref();
        if secret.len() < Self::MIN_PARTITION_SECRET {
            return Err(ConfigError::new(
                "partition_key",
                format!(
                    "the secret must be at least {} bytes",
                    Self::MIN_PARTITION_SECRET
                ),
            ));
        }
        self.config.partition_secret = Some(Arc::from(secret));
        Ok(self)
    }

    /// The shortest secret [`partition_key`](Self::partition_key) takes, in bytes.
    pub const MIN_PARTITION_SECRET: usize = 16;

    /// Puts the [`Decision`](super::Decision) of each request that goes on in the request's
    /// extensions, for the inner service and its handlers (default off: it costs a clone
    /// and an allocation per request). A handler then reads which policy decided, where the
    /// answer came from ([`Decision::source`](super::Decision::source)), what is left, and
    /// under shadow mode whether the request would have been denied
    /// ([`Decision::verdict`](super::Decision::verdict)). Denied requests never reach the
    /// inner service: [`on_limited`](Self::on_limited) is given their decision.
    ///
    /// ```
    /// # use tower_redis_ratelimit::{Gcra, GlobalKey, MemoryStore, Quota, RateLimitLayer, RateLimiter};
    /// use axum::{routing::get, Extension, Router};
    /// use tower_redis_ratelimit::rate_limit::Decision;
    ///
    /// # let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(250)).unwrap()).unwrap();
    /// let app: Router = Router::new()
    ///     .route("/", get(|Extension(d): Extension<Decision>| async move {
    ///         format!("{} units left under {}", d.remaining, d.policy)
    ///     }))
    ///     .layer(RateLimitLayer::new(limiter, GlobalKey).decision_extension(true));
    /// ```
    pub fn decision_extension(mut self, on: bool) -> Self {
        self.config.extension = on;
        self
    }

    /// The default policy's limiter.
    pub fn limiter(&self) -> &RateLimiter<A> {
        &self.default
    }
}

/// A [`ConfigError`] naming `count_if` when `policy` cannot give units back.
fn cannot_refund(policy: &RateEngine) -> Result<(), ConfigError> {
    if policy.refundable() {
        return Ok(());
    }
    Err(ConfigError::new(
        "count_if",
        format!(
            "policy {:?} uses {}, which cannot give units back; counting by response needs a built-in algorithm",
            policy.policy(),
            policy.algorithm.name()
        ),
    ))
}

/// A [`ConfigError`] naming `field` when `policy` cannot settle its charges.
fn cannot_settle(policy: &RateEngine, field: &'static str) -> Result<(), ConfigError> {
    policy
        .settleable()
        .map_err(|why| ConfigError::new(field, format!("{why}; settling needs GCRA, the token bucket or a window on a RedisStore or a MemoryStore, without unit leases")))
}

impl<S, K: KeyExtractor, A: Algorithm> Layer<S> for RateLimitLayer<K, A> {
    type Service = RateLimit<S, K, A>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::new(self.config.clone()))
    }
}
