//! The throttle's tower layer.

use std::{fmt, marker::PhantomData, sync::Arc, time::Duration};

use http::request::Parts;
use tower_layer::Layer;

use super::{
    adaptive::{Adaptive, AdaptiveCounters, AdaptiveStats, DEFAULT_MAX_PAUSE},
    clock::Clock,
    config::{NoRetry, RetryIdempotent, Settings},
    service::Throttle,
    tokens::TokenBudget,
};
use crate::{
    algorithm::{Algorithm, Gcra},
    error::ConfigError,
    extract::KeyExtractor,
    quota::Quota,
    rate_limit::RateLimiter,
    store::UpstreamStore,
};

/// Makes each outbound request wait for its quota (see the [`throttle`](crate::throttle) module docs).
///
/// The service's error is a [`tower::BoxError`](https://docs.rs/tower/latest/tower/type.BoxError.html):
/// the inner service's error, or a [`ThrottleError`](crate::throttle::ThrottleError). A store failure fails the call rather than
/// let it exceed a third party's limit.
///
/// `R` says whether a request the upstream answered 429 is sent again: [`NoRetry`] (the
/// default) or [`RetryIdempotent`] ([`retry_rate_limited`](Self::retry_rate_limited)).
pub struct ThrottleLayer<K, A, R = NoRetry> {
    settings: Settings<K, A>,
    _retry: PhantomData<fn() -> R>,
}

impl<K, A, R> Clone for ThrottleLayer<K, A, R> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            _retry: PhantomData,
        }
    }
}

impl<K, A: Algorithm, R> fmt::Debug for ThrottleLayer<K, A, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleLayer")
            .field("limiter", &self.settings.limiter)
            .field("max_wait", &self.settings.max_wait)
            .field("adaptive", &self.settings.adaptive.is_some())
            .field("retry", &std::any::type_name::<R>())
            .finish_non_exhaustive()
    }
}

impl<K: KeyExtractor> ThrottleLayer<K, Gcra> {
    /// A throttle with no configured quota, bounded only by what the upstream says (its
    /// stated rate, its windows, its pauses, each cut to [`max_pause`](Self::max_pause)):
    /// for an upstream whose limit you do not know. It is adaptive from the start, sharing
    /// what it learns through `store`; `name` names where (the policy name of the store's
    /// keys: `rl:NAME:...`), so that every instance calling one upstream, learning or with a
    /// quota of its own ([`RateLimiterBuilder::policy_name`](crate::rate_limit::RateLimiterBuilder::policy_name)),
    /// shares one state. Waits are counted on the store's
    /// [`ManualClock`](crate::store::memory::ManualClock) when it has one.
    ///
    /// Until an answer says something, calls go as they come (blind, counted until their
    /// answers come back); a 429 pauses every instance.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `policy_name` when another limiter on `store` already counts
    /// under that name with another algorithm or quota.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_redis_ratelimit::{MemoryStore, GlobalKey, throttle::ThrottleLayer};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = ThrottleLayer::learning(MemoryStore::new(), "maps-api", GlobalKey)?
    ///     .max_wait(Duration::from_secs(30))?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn learning(
        store: impl UpstreamStore + Clone,
        name: &str,
        key: K,
    ) -> Result<ThrottleLayer<K, Gcra>, ConfigError> {
        // The limiter only names the store's keys and bounds store calls: its quota is never
        // asked.
        let limiter = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_second(1))?)
            .policy_name(name)
            .common_counters()
            .build()?;
        let mut layer = ThrottleLayer::new(limiter, key).adaptive(store);
        layer.settings.configured = false;
        Ok(layer)
    }
}

impl<K: KeyExtractor, A: Algorithm> ThrottleLayer<K, A> {
    /// Throttles requests under the key `key` gives them; waits at most 10 s by default.
    /// A request without a key is not throttled. On a store with a
    /// [`ManualClock`](crate::store::memory::ManualClock), waits are counted on that clock.
    pub fn new(limiter: RateLimiter<A>, key: K) -> Self {
        let clock = limiter
            .engine
            .core
            .store
            .clock()
            .map_or(Clock::Wall, Clock::Manual);
        Self {
            settings: Settings {
                limiter,
                key: Arc::new(key),
                cost: None,
                max_wait: Duration::from_secs(10),
                max_pause: DEFAULT_MAX_PAUSE,
                adaptive: None,
                clock,
                configured: true,
                lines: Arc::default(),
                tokens: None,
            },
            _retry: PhantomData,
        }
    }

    /// Sends a request the upstream answered `429 Too Many Requests` again, after the pause
    /// it said (or learned), as long as that fits the maximum wait, when its method is
    /// idempotent (`GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`), at most twice. A 429
    /// that says to come back at once still waits [`DEFAULT_429_PAUSE`](crate::throttle::DEFAULT_429_PAUSE).
    /// The request's body must be `Clone` (a copy is kept for the next send). The last 429 is
    /// the answer when the request cannot go again (the pause, or the upstream's window,
    /// would outlast the maximum wait).
    pub fn retry_rate_limited(self) -> ThrottleLayer<K, A, RetryIdempotent> {
        ThrottleLayer {
            settings: self.settings,
            _retry: PhantomData,
        }
    }
}

impl<K: KeyExtractor, A: Algorithm, R> ThrottleLayer<K, A, R> {
    /// Units each request costs (default 1; 0 makes it free).
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.settings.cost = Some(Arc::new(cost));
        self
    }

    /// The longest a request waits for its quota before failing with
    /// [`ThrottleError::WouldExceedMaxWait`](crate::throttle::ThrottleError::WouldExceedMaxWait) (default
    /// 10 s). A request that would have to wait longer fails at once, without waiting in vain.
    /// Zero (never wait: fail when the quota is not there) up to one day; beyond, a
    /// [`ConfigError`] naming `max_wait`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `max_wait` beyond one day.
    pub fn max_wait(mut self, max_wait: Duration) -> Result<Self, ConfigError> {
        if max_wait > MAX_WAIT_CAP {
            return Err(ConfigError::new(
                "max_wait",
                format!("{max_wait:?}: must be at most one day"),
            ));
        }
        self.settings.max_wait = max_wait;
        Ok(self)
    }

    /// Learns the upstream's limits from its answers and shares what it learned through
    /// `store` (the same Redis as the limiter's, so that every instance slows down at once;
    /// or a `MemoryStore` for one process). Each answer's headers are read with
    /// [`read_limits`](crate::throttle::read_limits): the units left in the upstream's
    /// window and when it resets (IETF `RateLimit`, `RateLimit-Remaining`/`-Reset`,
    /// `X-RateLimit-Remaining`/`-Reset`), and a pause after a 429 or a 503 (`Retry-After`).
    ///
    /// Before each call, the throttle waits while the upstream said to pause, or while its
    /// window has fewer units left than the call costs (taking them when it goes); then the
    /// configured limiter decides as without adaptation. The configured quota stays an upper
    /// bound: an upstream saying more is available than configured changes nothing. A store
    /// failure here is logged and counted, and the call goes by what this process learned
    /// while the store failed (in memory), and by the configured limit.
    ///
    /// Costs one more store call before each request, and one after each answer that says
    /// something. When the limiter's store is on the wall clock and `store` has a
    /// [`ManualClock`](crate::store::memory::ManualClock), waits are counted on that clock.
    pub fn adaptive(mut self, store: impl UpstreamStore) -> Self {
        if let (Clock::Wall, Some(manual)) = (&self.settings.clock, store.clock()) {
            self.settings.clock = Clock::Manual(manual);
        }
        self.settings.adaptive = Some(Adaptive::new(Arc::new(store)));
        self
    }

    /// The longest pause or reset an upstream's header may impose (default 60 s): a header
    /// saying to wait an hour, or a reset in a year, is cut to it (and counted). More than
    /// zero and at most one day; otherwise a [`ConfigError`] naming `max_pause`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `max_pause` for zero or more than one day.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_redis_ratelimit::{Gcra, GlobalKey, MemoryStore, Quota, RateLimiter, throttle::ThrottleLayer};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(5))?)?;
    /// let layer = ThrottleLayer::new(limiter, GlobalKey).max_pause(Duration::from_secs(30))?;
    /// let too_long = layer.clone().max_pause(Duration::from_secs(2 * 86_400));
    /// assert_eq!(too_long.unwrap_err().field(), "max_pause");
    /// assert_eq!(layer.max_wait(Duration::MAX).unwrap_err().field(), "max_wait");
    /// # Ok(()) }
    /// ```
    pub fn max_pause(mut self, max_pause: Duration) -> Result<Self, ConfigError> {
        if max_pause.is_zero() || max_pause > MAX_PAUSE_CAP {
            return Err(ConfigError::new(
                "max_pause",
                format!("{max_pause:?}: must be more than zero and at most one day"),
            ));
        }
        self.settings.max_pause = max_pause;
        Ok(self)
    }

    /// Learns and respects the upstream's token budget beside its request budget (a model
    /// API's tokens per minute, see [`TokenBudget`]): each call takes its estimate of tokens
    /// before it is sent, waiting for its place in the upstream's token pace as for the
    /// request budget, and is settled afterwards to what it used (a response header, or the
    /// [`TokenUsage`](crate::throttle::TokenUsage) handle in the response's extensions). The
    /// budget is kept in the adaptive store under the call's key (apart from the requests),
    /// so that every instance calling one API key stays within its tokens per minute. A call
    /// whose estimate is 0 takes no tokens.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `token_budget` when the layer is not
    /// [`adaptive`](Self::adaptive) (nor [`learning`](ThrottleLayer::learning)): the budget
    /// is learned from the upstream's answers and kept in the adaptive store.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_redis_ratelimit::{MemoryStore, GlobalKey, throttle::{ThrottleLayer, TokenBudget}};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let budget = TokenBudget::new().estimate(|_: &http::request::Parts| 800);
    /// let layer = ThrottleLayer::learning(MemoryStore::new(), "model-api", GlobalKey)?
    ///     .token_budget(budget.clone())?;
    /// # let _ = layer;
    /// // Not adaptive: nowhere to learn the budget into.
    /// # use tower_redis_ratelimit::{Gcra, Quota, RateLimiter};
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(5))?)?;
    /// let refused = ThrottleLayer::new(limiter, GlobalKey).token_budget(budget);
    /// assert_eq!(refused.unwrap_err().field(), "token_budget");
    /// # Ok(()) }
    /// ```
    pub fn token_budget(mut self, budget: TokenBudget) -> Result<Self, ConfigError> {
        if self.settings.adaptive.is_none() {
            return Err(ConfigError::new(
                "token_budget",
                "the throttle is not adaptive: call `adaptive` first (the budget is learned into its store)",
            ));
        }
        self.settings.tokens = Some(Arc::new(budget));
        Ok(self)
    }

    /// What the adaptive throttle learned so far (`None` unless [`adaptive`](Self::adaptive)).
    /// Shared by the layer's clones and services.
    pub fn adaptive_stats(&self) -> Option<AdaptiveStats> {
        self.settings
            .adaptive
            .as_ref()
            .map(|a| AdaptiveCounters::snapshot(&a.counters))
    }
}

/// The largest `max_pause`.
const MAX_PAUSE_CAP: Duration = Duration::from_secs(86_400);
/// The largest `max_wait`.
const MAX_WAIT_CAP: Duration = Duration::from_secs(86_400);

impl<S, K, A, R> Layer<S> for ThrottleLayer<K, A, R> {
    type Service = Throttle<S, K, A, R>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle::new(inner, self.settings.clone())
    }
}
