//! The throttle's tower layer.

use std::{fmt, sync::Arc, time::Duration};

use http::request::Parts;
use tower_layer::Layer;

use super::{config::Settings, service::Throttle};
use crate::{Algorithm, KeyExtractor, RateLimiter};

/// Makes each outbound request wait for its quota (see the [`throttle`](crate::throttle) module docs).
///
/// The service's error is a [`tower::BoxError`](https://docs.rs/tower/latest/tower/type.BoxError.html):
/// the inner service's error, or a [`ThrottleError`](crate::ThrottleError). A store failure fails the call rather than
/// let it exceed a third party's limit.
pub struct ThrottleLayer<K, A> {
    settings: Settings<K, A>,
}

impl<K, A> Clone for ThrottleLayer<K, A> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
        }
    }
}

impl<K, A: Algorithm> fmt::Debug for ThrottleLayer<K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleLayer")
            .field("limiter", &self.settings.limiter)
            .field("max_wait", &self.settings.max_wait)
            .finish_non_exhaustive()
    }
}

impl<K: KeyExtractor, A: Algorithm> ThrottleLayer<K, A> {
    /// Throttles requests under the key `key` gives them; waits at most 10 s by default.
    /// A request without a key is not throttled.
    pub fn new(limiter: RateLimiter<A>, key: K) -> Self {
        Self {
            settings: Settings {
                limiter,
                key: Arc::new(key),
                cost: None,
                max_wait: Duration::from_secs(10),
            },
        }
    }

    /// Units each request costs (default 1; 0 makes it free).
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.settings.cost = Some(Arc::new(cost));
        self
    }

    /// The longest a request waits for its quota before failing with
    /// [`ThrottleError::WouldExceedMaxWait`](crate::ThrottleError::WouldExceedMaxWait). A request that would have to wait longer fails at
    /// once, without waiting in vain.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.settings.max_wait = max_wait;
        self
    }
}

impl<S, K, A> Layer<S> for ThrottleLayer<K, A> {
    type Service = Throttle<S, K, A>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle::new(inner, self.settings.clone())
    }
}
