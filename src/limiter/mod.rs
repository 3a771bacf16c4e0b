//! The core limiter: `check(key, cost) -> Decision`, without HTTP.

use std::{
    fmt,
    num::NonZeroU32,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::Poll,
    time::{Duration, Instant},
};

mod breaker;
mod deny_cache;
mod failure;

pub use self::{breaker::CircuitBreaker, failure::FailurePolicy};

use self::{breaker::BreakerState, deny_cache::DenyCache};
use crate::{telemetry, Algorithm, ConfigError, Decision, Error, MemoryStore, Outcome, Store};

/// Default bound on one store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "rl";
/// Default policy name in the headers.
pub const DEFAULT_POLICY_NAME: &str = "default";
/// Default bound on a key's length; longer keys are replaced by a hash.
pub const DEFAULT_MAX_KEY_LEN: usize = 128;
/// Default number of live denials the deny cache holds.
pub const DEFAULT_DENY_CACHE_KEYS: usize = 100_000;

/// Checks keys against one algorithm in one store. Usable on its own (a background job
/// throttling its calls to a third-party API) and the engine of
/// [`RateLimitLayer`](crate::RateLimitLayer).
///
/// Cloning is cheap and shares everything.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_redis_ratelimit::{Quota, RateLimiter, RedisStore, SlidingWindow};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// // The back-fill job's share: 150 units a minute per mailbox.
/// let backfill = RateLimiter::builder(store, SlidingWindow::new(Quota::per_minute(150))?)
///     .prefix("gmail-backfill")
///     .store_timeout(Duration::from_millis(50))
///     .build()?;
///
/// let decision = backfill.check("user-7f3a", 5).await?; // a "send" costs 5 units
/// if !decision.allowed {
///     tokio::time::sleep(decision.retry_after.unwrap_or(Duration::from_secs(60))).await;
/// }
/// # Ok(()) }
/// ```
pub struct RateLimiter<A> {
    inner: Arc<Inner<A>>,
}

struct Inner<A> {
    store: Arc<dyn Store>,
    algorithm: A,
    prefix: String,
    policy: Arc<str>,
    timeout: Duration,
    max_key_len: usize,
    breaker: BreakerState,
    deny_cache: Option<DenyCache>,
    cache_hits: AtomicU64,
    store_errors: AtomicU64,
    short_circuited: AtomicU64,
    degraded: AtomicU64,
}

/// Counters of a [`RateLimiter`], for health checks and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimiterStats {
    /// Checks that failed in the store (errors and timeouts).
    pub store_errors: u64,
    /// Checks refused without calling the store because the circuit breaker was open.
    pub short_circuited: u64,
    /// Decisions made locally at the local share while the store was unavailable.
    pub degraded: u64,
    /// How often the circuit breaker opened.
    pub breaker_opened: u64,
    /// Checks denied by the local deny cache without a store call.
    pub deny_cache_hits: u64,
}

impl<A> Clone for RateLimiter<A> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<A: Algorithm> fmt::Debug for RateLimiter<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("algorithm", &self.inner.algorithm.name())
            .field("prefix", &self.inner.prefix)
            .field("policy", &self.inner.policy)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

impl<A: Algorithm> RateLimiter<A> {
    /// A limiter with the default prefix (`rl`), policy name (`default`), store timeout
    /// (100 ms) and key length bound (128 bytes).
    pub fn new(store: impl Store, algorithm: A) -> Self {
        Self::builder(store, algorithm)
            .build()
            .expect("the defaults are valid")
    }

    /// A builder for the other options.
    pub fn builder(store: impl Store, algorithm: A) -> RateLimiterBuilder<A> {
        RateLimiterBuilder {
            store: Arc::new(store),
            algorithm,
            prefix: DEFAULT_PREFIX.to_owned(),
            policy: DEFAULT_POLICY_NAME.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            breaker: CircuitBreaker::default(),
            deny_cache: DEFAULT_DENY_CACHE_KEYS,
        }
    }

    /// Takes `cost` units for `key`, if they are available. `cost` must be at least 1.
    ///
    /// Errors when the store fails or does not answer within the store timeout; the decision
    /// is then the caller's (the layer applies its [`FailurePolicy`](crate::FailurePolicy)).
    pub async fn check(&self, key: &str, cost: u32) -> Result<Decision, Error> {
        // Answers from the deny cache or a MemoryStore never wait: spend the task's budget so a
        // tight loop of checks still lets the runtime run other tasks and timers.
        tokio::task::coop::consume_budget().await;
        let base = self.storage_key(key);
        match self.decide_now(&base, cost) {
            Some(result) => result,
            None => self.check_base(base, cost, None).await,
        }
    }

    /// The base key of `key`, or of the quota shared by requests without a key: `{prefix:#}`,
    /// which no client key can map to (client keys starting with `#` are always hashed).
    pub(crate) fn base_key(&self, key: Option<&str>) -> String {
        match key {
            Some(key) => self.storage_key(key),
            None => format!("{{{}:#}}", self.inner.prefix),
        }
    }

    /// The decision for `base`, when it can be had without waiting: from the deny cache, or
    /// from a store that decides at once ([`Store::check_now`], e.g. a `MemoryStore`). `None`
    /// when the store must be asked with [`check_base`](Self::check_base).
    pub(crate) fn decide_now(&self, base: &str, cost: u32) -> Option<Result<Decision, Error>> {
        if cost == 0 {
            return Some(Err(Error::InvalidInput("cost must be at least 1")));
        }
        if let Some(d) = self.cached_denial(base, cost) {
            return Some(Ok(d));
        }
        let inner = &*self.inner;
        let result = inner.store.check_now(&inner.algorithm, base, cost, None)?;
        Some(self.conclude(base, cost, None, None, result))
    }

    /// A denial answered by the deny cache (see [`RateLimiterBuilder::deny_cache`]).
    fn cached_denial(&self, base: &str, cost: u32) -> Option<Decision> {
        let inner = &*self.inner;
        let cache = inner.deny_cache.as_ref().filter(|_| cost == 1)?;
        let hit = cache.get(base, Instant::now)?;
        inner.cache_hits.fetch_add(1, Ordering::Relaxed);
        Some(Decision {
            allowed: false,
            limit: inner.algorithm.quota(),
            remaining: 0,
            reset_after: hit.reset_after,
            retry_after: Some(hit.retry_after),
            window: inner.algorithm.window(),
            cost,
            policy: Arc::clone(&inner.policy),
            degraded: false,
            limits: Vec::new(),
            partition_key: None,
        })
    }

    /// Like [`check`](Self::check), at an explicit time (microseconds since the Unix epoch)
    /// instead of the store's clock. For tests and simulations only: in production every
    /// instance must use the store's clock, or instances with skewed clocks disagree. Redis
    /// still expires keys on its own clock, so keep simulated periods far longer than the
    /// test's real run time.
    pub async fn check_at(&self, key: &str, cost: u32, now_us: u64) -> Result<Decision, Error> {
        tokio::task::coop::consume_budget().await;
        self.check_base(self.storage_key(key), cost, Some(now_us))
            .await
    }

    /// Asks the store (through the circuit breaker, within the store timeout).
    pub(crate) async fn check_base(
        &self,
        base: String,
        cost: u32,
        now: Option<u64>,
    ) -> Result<Decision, Error> {
        if cost == 0 {
            return Err(Error::InvalidInput("cost must be at least 1"));
        }
        if now.is_some_and(|t| t > crate::quota::MAX_EXACT) {
            return Err(Error::InvalidInput(
                "explicit time must be under 2^52 microseconds",
            ));
        }
        let inner = &*self.inner;
        let Some(permit) = inner.breaker.permit() else {
            inner.short_circuited.fetch_add(1, Ordering::Relaxed);
            telemetry::store_failed(&inner.policy, &Error::CircuitOpen);
            return Err(Error::CircuitOpen);
        };
        let started = Instant::now();
        let mut call = inner.store.check(&inner.algorithm, &base, cost, now);
        // A store that answers at once needs no timer: poll once before arming the timeout.
        let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        let result = match first {
            Poll::Ready(result) => result,
            Poll::Pending => tokio::time::timeout(inner.timeout, call)
                .await
                .unwrap_or(Err(Error::Timeout(inner.timeout))),
        };
        permit.finish(!matches!(&result, Err(e) if e.is_unavailable()));
        self.conclude(&base, cost, now, Some(started), result)
    }

    /// Turns the store's answer into a decision: counters, telemetry, and the deny cache.
    /// `started`: when the store was asked; `None` when it answered without waiting.
    fn conclude(
        &self,
        base: &str,
        cost: u32,
        now: Option<u64>,
        started: Option<Instant>,
        result: Result<Outcome, Error>,
    ) -> Result<Decision, Error> {
        let inner = &*self.inner;
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(e) => {
                inner.store_errors.fetch_add(1, Ordering::Relaxed);
                telemetry::store_failed(&inner.policy, &e);
                return Err(e);
            }
        };
        let d = Decision::from_outcome(
            outcome,
            inner.algorithm.quota(),
            inner.algorithm.window(),
            cost,
            Arc::clone(&inner.policy),
            inner.algorithm.parts(),
        );
        telemetry::decided(&d, started);
        // Only what cannot change before its deadline: a cost-1 denial with nothing left,
        // on the store's clock (never for explicit test times), for single-limit algorithms.
        if let (Some(cache), None, Some(retry)) = (&inner.deny_cache, now, d.retry_after) {
            if cost == 1 && d.remaining == 0 && d.limits.is_empty() {
                let sent = started.unwrap_or_else(Instant::now);
                cache.insert(base, sent, retry, d.reset_after);
            }
        }
        Ok(d)
    }

    /// The base key under which `key`'s state is stored: `{prefix:key}`, with a key longer
    /// than the bound (or starting with `#`) replaced by `#` and its SHA-1. The braces are a
    /// Redis Cluster hash tag, so every key of one check lands on one slot.
    ///
    /// ```
    /// # use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(1)).unwrap());
    /// assert_eq!(limiter.storage_key("10.0.0.1"), "{rl:10.0.0.1}");
    /// assert_eq!(limiter.storage_key(&"x".repeat(10_000)).len(), "{rl:#}".len() + 40);
    /// ```
    pub fn storage_key(&self, key: &str) -> String {
        let inner = &*self.inner;
        if key.len() > inner.max_key_len || key.starts_with('#') {
            let digest = sha1_smol::Sha1::from(key.as_bytes()).digest();
            format!("{{{}:#{digest}}}", inner.prefix)
        } else {
            format!("{{{}:{key}}}", inner.prefix)
        }
    }

    /// Decides `base` (made by [`base_key`](Self::base_key) from `key`) in the store, unless
    /// [`decide_now`](Self::decide_now) already failed with `failed`; when the store is
    /// unavailable and `local` is given, decides `key` again with `local` (the local-share
    /// twin) and marks the decision degraded.
    pub(crate) async fn check_or_local(
        &self,
        base: String,
        key: Option<&str>,
        cost: u32,
        local: Option<&RateLimiter<A>>,
        failed: Option<Error>,
    ) -> Result<Decision, Error> {
        let result = match failed {
            Some(e) => Err(e),
            None => self.check_base(base, cost, None).await,
        };
        let (Err(e), Some(local)) = (&result, local) else {
            return result;
        };
        if !e.is_unavailable() {
            return result;
        }
        let local_base = local.base_key(key);
        let mut d = match local.decide_now(&local_base, cost) {
            Some(result) => result?,
            None => local.check_base(local_base, cost, None).await?,
        };
        d.degraded = true;
        self.inner.degraded.fetch_add(1, Ordering::Relaxed);
        telemetry::degraded(&d);
        tracing::debug!(error = %e, allowed = d.allowed, "rate limit: decided locally (degraded)");
        Ok(d)
    }

    /// A limiter over a fresh [`MemoryStore`] with this algorithm's quota divided among
    /// `instances`, for [`FailurePolicy::Local`](crate::FailurePolicy::Local). `None` when the
    /// algorithm cannot be divided.
    pub(crate) fn local_twin(&self, instances: NonZeroU32) -> Option<RateLimiter<A>> {
        let inner = &*self.inner;
        let algorithm = inner.algorithm.local_share(instances)?;
        let twin = RateLimiter::builder(MemoryStore::new(), algorithm)
            .prefix(inner.prefix.clone())
            .policy_name(inner.policy.to_string())
            .max_key_len(inner.max_key_len)
            .circuit_breaker(CircuitBreaker::disabled())
            .build()
            .ok()?;
        Some(twin)
    }

    /// Counters: store errors, checks refused by the circuit breaker, degraded decisions.
    pub fn stats(&self) -> LimiterStats {
        let inner = &*self.inner;
        LimiterStats {
            store_errors: inner.store_errors.load(Ordering::Relaxed),
            short_circuited: inner.short_circuited.load(Ordering::Relaxed),
            degraded: inner.degraded.load(Ordering::Relaxed),
            breaker_opened: inner.breaker.times_opened(),
            deny_cache_hits: inner.cache_hits.load(Ordering::Relaxed),
        }
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.inner.algorithm
    }

    /// The policy name used in the headers.
    pub fn policy_name(&self) -> &str {
        &self.inner.policy
    }

    /// The bound on one store call.
    pub fn store_timeout(&self) -> Duration {
        self.inner.timeout
    }
}

/// Options for a [`RateLimiter`]; [`build`](Self::build) validates them.
pub struct RateLimiterBuilder<A> {
    store: Arc<dyn Store>,
    algorithm: A,
    prefix: String,
    policy: String,
    timeout: Duration,
    max_key_len: usize,
    breaker: CircuitBreaker,
    deny_cache: usize,
}

impl<A: Algorithm> fmt::Debug for RateLimiterBuilder<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiterBuilder")
            .field("algorithm", &self.algorithm.name())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl<A: Algorithm> RateLimiterBuilder<A> {
    /// Namespace for this limiter's keys (default `rl`). Give each limiter sharing a Redis its
    /// own prefix. 1 to 64 visible ASCII characters, without `{`, `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Policy name in the `RateLimit` headers (default `default`). 1 to 64 characters from
    /// `A-Z a-z 0-9 - _ . :`.
    pub fn policy_name(mut self, name: impl Into<String>) -> Self {
        self.policy = name.into();
        self
    }

    /// Bound on one store call, including waiting for a pooled connection (default 100 ms).
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Keys longer than this many bytes are stored as a hash (default 128, at least 16).
    pub fn max_key_len(mut self, len: usize) -> Self {
        self.max_key_len = len;
        self
    }

    /// When to stop calling a failing store (default: after 5 failures in a row, for 1 s).
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// The exact local deny cache: once the store denies a cost-1 check of a key with no units
    /// left, this limiter denies further cost-1 checks of that key itself until one unit is
    /// free again, without a round trip. Exact (nothing but time frees capacity, and the
    /// deadline is measured from when the check was sent), so it never allows what the store
    /// would deny nor denies what it would allow; the flood case then costs no Redis calls.
    /// Holds at most `max_keys` live denials (default 100,000); 0 switches it off. An entry
    /// answers for at most one second before the store is asked again, so state lost in Redis
    /// (a restart, `FLUSHDB`) is noticed within a second.
    pub fn deny_cache(mut self, max_keys: usize) -> Self {
        self.deny_cache = max_keys;
        self
    }

    /// Validates the options.
    pub fn build(self) -> Result<RateLimiter<A>, ConfigError> {
        self.breaker.validate()?;
        let p = &self.prefix;
        if p.is_empty()
            || p.len() > 64
            || !p
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
        {
            return Err(ConfigError::new(
                "prefix",
                format!("{p:?}: must be 1 to 64 visible ASCII characters without braces"),
            ));
        }
        let n = &self.policy;
        if n.is_empty()
            || n.len() > 64
            || !n
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        {
            return Err(ConfigError::new(
                "policy_name",
                format!("{n:?}: must be 1 to 64 characters from A-Z a-z 0-9 - _ . :"),
            ));
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::new("store_timeout", "must be more than zero"));
        }
        if self.max_key_len < 16 {
            return Err(ConfigError::new("max_key_len", "must be at least 16"));
        }
        Ok(RateLimiter {
            inner: Arc::new(Inner {
                store: self.store,
                algorithm: self.algorithm,
                prefix: self.prefix,
                policy: self.policy.into(),
                timeout: self.timeout,
                max_key_len: self.max_key_len,
                breaker: BreakerState::new(self.breaker),
                deny_cache: (self.deny_cache > 0).then(|| DenyCache::new(self.deny_cache)),
                cache_hits: AtomicU64::new(0),
                store_errors: AtomicU64::new(0),
                short_circuited: AtomicU64::new(0),
                degraded: AtomicU64::new(0),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Gcra, MemoryStore, Quota};

    fn builder() -> RateLimiterBuilder<Gcra> {
        RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_second(1)).unwrap())
    }

    #[test]
    fn rejects_bad_options_naming_the_field() {
        let field = |b: RateLimiterBuilder<Gcra>| b.build().unwrap_err().field();
        assert_eq!(field(builder().prefix("")), "prefix");
        assert_eq!(field(builder().prefix("a{b")), "prefix");
        assert_eq!(field(builder().prefix("a b")), "prefix");
        assert_eq!(field(builder().policy_name("x\"y")), "policy_name");
        assert_eq!(field(builder().policy_name("")), "policy_name");
        assert_eq!(
            field(builder().store_timeout(Duration::ZERO)),
            "store_timeout"
        );
        assert_eq!(field(builder().max_key_len(3)), "max_key_len");
        assert!(builder()
            .prefix("api:v1")
            .policy_name("free-tier")
            .build()
            .is_ok());
    }

    #[test]
    fn long_and_marker_keys_are_hashed() {
        let l = builder().build().unwrap();
        let long = "k".repeat(129);
        let hashed = l.storage_key(&long);
        assert!(
            hashed.starts_with("{rl:#") && hashed.len() == 46,
            "{hashed}"
        );
        assert_eq!(
            l.storage_key(&"k".repeat(128)),
            format!("{{rl:{}}}", "k".repeat(128))
        );
        // A client cannot pick a raw key equal to another key's hashed form.
        let forged = &hashed[4..hashed.len() - 1];
        assert_ne!(l.storage_key(forged), hashed);
    }

    #[tokio::test]
    async fn zero_cost_is_an_error() {
        let l = builder().build().unwrap();
        assert!(matches!(l.check("k", 0).await, Err(Error::InvalidInput(_))));
    }
}
