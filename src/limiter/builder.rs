//! Building a [`RateLimiter`]: every option validated at once, with an error naming the field.

use std::{fmt, num::NonZeroU32, sync::Arc, time::Duration};

use super::{
    breaker::{BreakerState, CircuitBreaker},
    deny_cache::DenyCache,
    engine::Engine,
    failure::FailurePolicy,
    lease::{LeasedStore, UnitLease},
    names,
    rate_limiter::RateLimiter,
    stats::Counters,
    DEFAULT_DENY_CACHE_KEYS, DEFAULT_MAX_KEY_LEN, DEFAULT_POLICY_NAME, DEFAULT_PREFIX,
    DEFAULT_TIMEOUT,
};
use crate::{Algorithm, ConfigError, MemoryStore, Store};

impl<A: Algorithm> RateLimiter<A> {
    /// A limiter with the default prefix (`rl`), policy name (`default`), store timeout
    /// (100 ms), key length bound (128 bytes) and failure policy ([`FailurePolicy::Open`]).
    ///
    /// # Panics
    ///
    /// When another limiter on the same store already counts under the default namespace
    /// (`rl:default`) with another algorithm or quota: use [`builder`](Self::builder) and give
    /// each its own [`policy_name`](RateLimiterBuilder::policy_name) (`build` returns that
    /// as an error instead).
    pub fn new(store: impl Store, algorithm: A) -> Self {
        match Self::builder(store, algorithm).build() {
            Ok(limiter) => limiter,
            Err(e) => panic!("RateLimiter::new: {e}"),
        }
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
            failure: FailurePolicy::default(),
            local_share: 1,
            share_counters: false,
            shadow: false,
            lease: None,
        }
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
    failure: FailurePolicy,
    local_share: u32,
    share_counters: bool,
    shadow: bool,
    lease: Option<UnitLease>,
}

impl<A: Algorithm> fmt::Debug for RateLimiterBuilder<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiterBuilder")
            .field("algorithm", &self.algorithm.name())
            .field("prefix", &self.prefix)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<A: Algorithm> RateLimiterBuilder<A> {
    /// The first part of this limiter's namespace (default `rl`); keys are
    /// `{prefix:policy:key}`. 1 to 64 visible ASCII characters, without `{`, `}`. Handy to
    /// keep apps or environments sharing one Redis apart.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The policy name (default `default`): the second part of this limiter's namespace, and
    /// the name in the `RateLimit` headers. 1 to 64 characters from `A-Z a-z 0-9 - _ . :`.
    ///
    /// Each policy counts under its own name. Two limiters on one store with the same prefix
    /// and name but another algorithm or quota would spend each other's counters, so building
    /// the second fails, unless both [`share_counters`](Self::share_counters).
    pub fn policy_name(mut self, name: impl Into<String>) -> Self {
        self.policy = name.into();
        self
    }

    /// Shares this limiter's counters with other limiters of the same namespace (prefix and
    /// policy name) that decide with another algorithm or quota, on purpose: e.g. a back-fill
    /// job with a lower threshold on the same sliding-window log as interactive calls, so that
    /// bulk work only uses what interactive calls leave. Every limiter sharing must call it.
    pub fn share_counters(mut self) -> Self {
        self.share_counters = true;
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

    /// What a check gets when the store fails or times out (default
    /// [`FailurePolicy::Open`]). With [`FailurePolicy::Local`], also set
    /// [`local_share`](Self::local_share).
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// // Log-in: never unlimited, even when Redis is away.
    /// let login = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_minute(5))?)
    ///     .policy_name("login")
    ///     .on_store_error(FailurePolicy::Closed)
    ///     .build()?;
    /// // Four gateways: while Redis is away, each admits 150 a minute per key.
    /// let general = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_minute(600))?)
    ///     .on_store_error(FailurePolicy::Local)
    ///     .local_share(4)
    ///     .build()?;
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// The number of instances that share the quota, for [`FailurePolicy::Local`]: while the
    /// store is unavailable, each instance decides alone with the quota (limit and burst)
    /// divided by `instances`, rounded down but at least one unit (default 1: the whole quota
    /// per instance). At least 1.
    pub fn local_share(mut self, instances: u32) -> Self {
        self.local_share = instances;
        self
    }

    /// Shadow (dry-run) mode, to roll a new limit out without risk (default off). The limiter
    /// decides and records everything as usual (the [`Decision`](crate::Decision), its
    /// counters, tracing and metrics), but a [`RateLimitLayer`](crate::RateLimitLayer) never
    /// rejects under this policy:
    ///
    /// - a request over its limit goes on to the inner service, with the rate-limit headers
    ///   of the denial (`r=0`, and `t` until it would have been allowed) but no `Retry-After`,
    ///   and is logged at `info` ("rate limit: would deny (shadow mode)") and counted
    ///   ([`LimiterStats::shadow_denials`](crate::LimiterStats), the metric
    ///   `ratelimit_shadow_denials_total`);
    /// - a store failure lets the request through, whatever
    ///   [`on_store_error`](Self::on_store_error) says (it is still logged and counted).
    ///
    /// A [`ThrottleLayer`](crate::ThrottleLayer) on such a limiter never waits nor fails: a
    /// denial is counted and logged the same way, and the request goes out at once.
    ///
    /// A denied request spends nothing, as when enforcing, so the counts are the ones the
    /// limit would see if it were enforced. [`RateLimiter::check`](crate::RateLimiter::check)
    /// still returns the real decision: direct callers read
    /// [`RateLimiter::is_shadow`](crate::RateLimiter::is_shadow).
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// let trial = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_minute(60))?)
    ///     .policy_name("new-limit")
    ///     .shadow(true)
    ///     .build()?;
    /// assert!(trial.is_shadow());
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// Unit leases for hot keys that are allowed (default off): this limiter reserves blocks
    /// of a hot key's units in one store call and hands them out itself, within the lease's
    /// lifetime of sending the reservation, and gives back what it did not hand out. Exact in
    /// count, shifted in time by at most the lifetime: in any window of the quota's period,
    /// all instances together admit at most what the algorithm admits in period + lifetime.
    /// Decisions answered from a lease carry approximate `remaining` and reset times. See
    /// [`UnitLease`].
    ///
    /// Only [`Gcra`](crate::Gcra) and [`TokenBucket`](crate::TokenBucket) can be leased
    /// (else a [`ConfigError`] naming `lease`); on a [`MemoryStore`] it changes nothing.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_redis_ratelimit::*;
    /// let limiter = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_second(50_000))?)
    ///     .lease(UnitLease::up_to(Duration::from_millis(50)))
    ///     .build()?;
    /// let window = RateLimiter::builder(MemoryStore::new(), SlidingWindow::new(Quota::per_second(10))?)
    ///     .lease(UnitLease::up_to(Duration::from_millis(50)))
    ///     .build();
    /// assert_eq!(window.unwrap_err().field(), "lease");
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn lease(mut self, lease: UnitLease) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Validates the options; the error names the field.
    pub fn build(self) -> Result<RateLimiter<A>, ConfigError> {
        self.breaker.validate()?;
        names::check(&self.prefix, &self.policy)?;
        if self.timeout.is_zero() {
            return Err(ConfigError::new("store_timeout", "must be more than zero"));
        }
        if self.max_key_len < 16 {
            return Err(ConfigError::new("max_key_len", "must be at least 16"));
        }
        let Some(instances) = NonZeroU32::new(self.local_share) else {
            return Err(ConfigError::new("local_share", "must be at least 1"));
        };
        let cap = match &self.lease {
            Some(lease) => Some(lease.validate(self.algorithm.rule())?),
            None => None,
        };
        let algorithm = Arc::new(self.algorithm);
        let namespace = format!("{}:{}", self.prefix, self.policy);
        let local = match self.failure {
            FailurePolicy::Local => {
                let Some(shared) = algorithm.local_share(instances) else {
                    return Err(ConfigError::new(
                        "on_store_error",
                        format!(
                            "FailurePolicy::Local needs an algorithm whose quota can be divided \
                             among instances; {} cannot",
                            algorithm.name()
                        ),
                    ));
                };
                Some(Arc::new(local_engine(
                    shared,
                    &namespace,
                    &self.policy,
                    self.max_key_len,
                )))
            }
            _ => None,
        };
        let claim = match self.store.namespaces() {
            Some(namespaces) => {
                let rule = fingerprint(&*algorithm);
                let share = self.share_counters;
                Some(namespaces.claim(&namespace, algorithm.name(), rule, share)?)
            }
            None => None,
        };
        let dyn_algorithm: Arc<dyn Algorithm> = algorithm.clone();
        // A store on a manual clock decides on its own time; the cache's is real.
        let deny_cache = (self.deny_cache > 0 && !self.store.manual_clock())
            .then(|| DenyCache::new(self.deny_cache));
        let store = match (self.lease, cap) {
            (Some(lease), Some(cap)) => Arc::new(LeasedStore::new(
                self.store,
                Arc::clone(&dyn_algorithm),
                &namespace,
                self.max_key_len,
                self.timeout,
                lease.lifetime(),
                lease.tracked_keys(),
                cap,
            )),
            _ => self.store,
        };
        let engine = Engine {
            store,
            algorithm: dyn_algorithm,
            namespace,
            policy: self.policy.into(),
            timeout: self.timeout,
            max_key_len: self.max_key_len,
            breaker: BreakerState::new(self.breaker),
            deny_cache,
            failure: self.failure,
            share: instances,
            shadow: self.shadow,
            local,
            counters: Counters::default(),
            _claim: claim,
        };
        Ok(RateLimiter {
            engine: Arc::new(engine),
            algorithm,
        })
    }
}

/// What a limiter decides with, to tell two limiters of one namespace apart.
fn fingerprint(algorithm: &dyn Algorithm) -> String {
    let parts: Vec<&str> = algorithm.parts().iter().map(|p| &*p.name).collect();
    match parts.is_empty() {
        true => format!("{:?}", algorithm.rule()),
        false => format!("{:?} {parts:?}", algorithm.rule()),
    }
}

/// The in-memory limiter deciding at the local share while the store is unavailable.
fn local_engine(
    algorithm: Arc<dyn Algorithm>,
    namespace: &str,
    policy: &str,
    max_key_len: usize,
) -> Engine {
    Engine {
        store: Arc::new(MemoryStore::new()),
        algorithm,
        namespace: namespace.to_owned(),
        policy: policy.into(),
        timeout: DEFAULT_TIMEOUT,
        max_key_len,
        breaker: BreakerState::new(CircuitBreaker::disabled()),
        deny_cache: None,
        failure: FailurePolicy::Closed,
        share: NonZeroU32::MIN,
        shadow: false,
        local: None,
        counters: Counters::default(),
        _claim: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Error, Gcra, Quota};

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
        assert_eq!(field(builder().local_share(0)), "local_share");
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
        let hashed = l.storage_key(long.as_str());
        assert!(
            hashed.starts_with("{rl:default:#") && hashed.len() == 54,
            "{hashed}"
        );
        assert_eq!(
            l.storage_key("k".repeat(128)),
            format!("{{rl:default:{}}}", "k".repeat(128))
        );
        // A client cannot pick a raw key equal to another key's hashed form.
        let forged = &hashed[12..hashed.len() - 1];
        assert_ne!(l.storage_key(forged), hashed);
    }

    #[tokio::test]
    async fn zero_cost_is_an_error() {
        let l = builder().build().unwrap();
        assert!(matches!(l.check("k", 0).await, Err(Error::InvalidInput(_))));
    }
}
