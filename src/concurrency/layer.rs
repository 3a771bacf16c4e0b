//! The tower layer.

use std::{fmt, sync::Arc};

use bytes::Bytes;
use http::Response;
use http_body::Body;
use tower_layer::Layer;

use super::{config::Config, limiter::ConcurrencyLimiter, service::ConcurrencyLimit, Busy};
use crate::{
    extract::{KeyExtractor, MissingKey},
    http::{box_body, BoxError, HeaderStyle, Responder},
};

/// Lets at most [`max_in_flight`](ConcurrencyLimiter::max_in_flight) requests of one key be
/// in flight at once, across every instance sharing the limiter's store.
///
/// An admitted request goes to the inner service, holding one of its key's permits until its
/// response body ends (or fails, or is dropped); the permit is also given back when the response
/// future is dropped or the inner service returns an error. Its response gets the key's
/// concurrency headers (with [`HeaderStyle::Ietf`]: `RateLimit-Policy:
/// "concurrency";q=4;qu="concurrent-requests"` and `RateLimit: "concurrency";r=1`, the permits
/// left when it was admitted).
///
/// With a [`RedisStore`](crate::RedisStore), the release is sent when the body ends, so it
/// reaches Redis about one round trip after the client may have read the end of the response:
/// a client that sends its next request the instant the previous one ends, with all of its
/// key's permits in use, may find its permit still taken for that round trip. (A
/// [`MemoryStore`](crate::MemoryStore) gives the permit back before the body reports its end.)
/// A release that fails (Redis stalled or failing over, a connection cut) is sent again, at
/// least once a second, until it succeeds or it would have expired by itself.
///
/// After Redis loses the permits (a restart without persistence, `FLUSHALL`), running requests
/// are counted again at their next renewal, and once an instance that used that Redis before
/// notices, the limiter admits no new request for a third of the time to live plus two store
/// timeouts (`429`s meanwhile), so the limit holds after any number of restarts; see
/// [`ConcurrencyLimiterBuilder`](crate::concurrency::ConcurrencyLimiterBuilder#when-redis-loses-the-permits)
/// for the exact bound.
///
/// A request over the limit never reaches the inner service: `429 Too Many Requests`
/// (gRPC requests: HTTP 200 with `grpc-status: 8`, RESOURCE_EXHAUSTED) with the same headers
/// (`r=0`) and a plain-text or, with [`problem_details`](Self::problem_details), an RFC 9457
/// body, as [`RateLimitLayer`](crate::RateLimitLayer) answers. No `Retry-After` (nor gRPC's
/// `RetryInfo` or `grpc-retry-pushback-ms`): a permit frees when a request of the key ends,
/// which nothing can predict (a crashed holder's within one time to live, a live one's
/// whenever it finishes).
///
/// When the store fails, the limiter's [`FailurePolicy`](crate::FailurePolicy) decides:
/// `Open` lets the request through unlimited and without headers, `Closed` answers `503` with
/// `Retry-After: 1` (gRPC `UNAVAILABLE`), `Local` admits it to a semaphore in this process at
/// the local share (see
/// [`ConcurrencyLimiterBuilder::local_share`](crate::concurrency::ConcurrencyLimiterBuilder::local_share)).
///
/// It composes with [`RateLimitLayer`](crate::RateLimitLayer) on the same key, in either order:
/// outside it, a request refused for concurrency spends no rate units; inside it, every request
/// spends them, refused or not. Both add their own `RateLimit` list items.
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_redis_ratelimit::{HeaderKey, MemoryStore, concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter}};
///
/// # fn layer() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = ConcurrencyLimiter::builder(MemoryStore::new(), 2)
///     .policy_name("reports")
///     .build()?;
/// let service = ServiceBuilder::new()
///     .layer(ConcurrencyLimitLayer::new(limiter, HeaderKey::new("x-api-key")?).problem_details())
///     .service_fn(|_req: http::Request<String>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(String::from("done")))
///     });
/// # let _ = service; Ok(()) }
/// ```
pub struct ConcurrencyLimitLayer<K> {
    config: Config<K>,
}

impl<K> Clone for ConcurrencyLimitLayer<K> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
        }
    }
}

impl<K> fmt::Debug for ConcurrencyLimitLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl<K: KeyExtractor> ConcurrencyLimitLayer<K> {
    /// Limits the requests in flight under the key `key` gives each, with `limiter`'s limit,
    /// store and failure policy. Defaults: IETF headers, [`MissingKey::Shared`] (keyless
    /// requests share one set of permits).
    pub fn new(limiter: ConcurrencyLimiter, key: K) -> Self {
        Self {
            config: Config {
                limiter,
                key: Arc::new(key),
                missing_key: MissingKey::default(),
                responder: Arc::new(Responder::default()),
            },
        }
    }

    /// Which headers to send (default [`HeaderStyle::Ietf`]). The legacy `X-RateLimit-*`
    /// headers hold one value each: composed with a rate limit in that style, the outer layer's
    /// value wins.
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        Arc::make_mut(&mut self.config.responder).style = style;
        self
    }

    /// Answers refused requests (other than gRPC) with an RFC 9457
    /// `application/problem+json` body of type `quota-exceeded` naming the policy, instead of
    /// plain text.
    pub fn problem_details(mut self) -> Self {
        Arc::make_mut(&mut self.config.responder).problem_details = true;
        self
    }

    /// What to do with requests that have no key (default [`MissingKey::Shared`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.config.missing_key = missing;
        self
    }

    /// Builds the response for refused (non-gRPC) requests instead of the default plain-text
    /// 429, with any body, from what refused them (see [`Busy`]). The concurrency headers are
    /// added unless already present.
    ///
    /// ```
    /// use axum::{http::StatusCode, response::IntoResponse};
    /// use tower_redis_ratelimit::{concurrency::ConcurrencyLimitLayer, GlobalKey, MemoryStore, concurrency::ConcurrencyLimiter};
    ///
    /// # fn layer() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = ConcurrencyLimiter::builder(MemoryStore::new(), 2).build()?;
    /// let layer = ConcurrencyLimitLayer::new(limiter, GlobalKey).on_limited(|busy| {
    ///     let body = format!(r#"{{"error":"busy","max_in_flight":{}}}"#, busy.max_in_flight);
    ///     (StatusCode::TOO_MANY_REQUESTS, [("content-type", "application/json")], body)
    ///         .into_response()
    /// });
    /// # Ok(()) }
    /// ```
    pub fn on_limited<F, B>(mut self, reject: F) -> Self
    where
        F: Fn(&Busy) -> Response<B> + Send + Sync + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Arc::make_mut(&mut self.config.responder).reject =
            Some(Arc::new(move |busy: &Busy| reject(busy).map(box_body)));
        self
    }

    /// The limiter.
    pub fn limiter(&self) -> &ConcurrencyLimiter {
        &self.config.limiter
    }
}

impl<S, K: KeyExtractor> Layer<S> for ConcurrencyLimitLayer<K> {
    type Service = ConcurrencyLimit<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit::new(inner, Arc::new(self.config.clone()))
    }
}
