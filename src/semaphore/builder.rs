//! Building a [`ConcurrencyLimiter`]: every option validated at once, with an error naming the
//! field.

use std::{fmt, sync::Arc, time::Duration};

use super::{limiter::ConcurrencyLimiter, releases::Releases, slots::Slots};
use crate::{
    limiter::{check_names, BreakerState},
    store::SlotTerms,
    CircuitBreaker, ConfigError, FailurePolicy, MemoryStore, Store, DEFAULT_MAX_KEY_LEN,
    DEFAULT_PREFIX, DEFAULT_TIMEOUT,
};

/// The most requests of one key a limiter may allow in flight.
const MAX_IN_FLIGHT: u32 = 1_000_000;
/// The shortest lease: renewals every third of it must have time to arrive.
const MIN_LEASE: Duration = Duration::from_millis(100);
/// The longest lease: a crashed instance's slots stay taken this long.
const MAX_LEASE: Duration = Duration::from_secs(3600);

impl ConcurrencyLimiter {
    /// The lease of a limiter not given one: 10 s, renewed every 3.3 s while held.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

    /// The policy name of a limiter not given one: `concurrency` (so that its `RateLimit`
    /// header item stands apart from a rate limit's `default`).
    pub const DEFAULT_POLICY_NAME: &'static str = "concurrency";

    /// A builder: at most `max_in_flight` requests per key at once, with the default prefix
    /// (`rl`), policy name ([`DEFAULT_POLICY_NAME`](Self::DEFAULT_POLICY_NAME)), lease
    /// ([`DEFAULT_LEASE`](Self::DEFAULT_LEASE)), store timeout (100 ms) and failure policy
    /// ([`FailurePolicy::Open`]).
    pub fn builder(store: impl Store, max_in_flight: u32) -> ConcurrencyLimiterBuilder {
        ConcurrencyLimiterBuilder::new(Arc::new(store), max_in_flight)
    }
}

/// Options for a [`ConcurrencyLimiter`]; [`build`](Self::build) validates them.
///
/// # When Redis loses the slots
///
/// A Redis restart without persistence, `FLUSHALL`, or a failover to a replica that had not
/// received them takes away the holders of running requests. Each running request puts its
/// holder back at its next renewal (within a third of the [lease](Self::lease)), counted even
/// if its key is then over the limit. And the first call after the loss from an instance that
/// had used this limiter on that Redis before (an acquire, or a running request's renewal)
/// finds the epoch marker it remembers (`{prefix:policy:#epoch}:c`, kept a day after the last
/// call; on a cluster, one per hash slot) gone: then no new request of the policy, whatever
/// its key, is admitted for a third of the lease plus two [store
/// timeouts](Self::store_timeout) (3.5 s with the defaults), the time every running request
/// needs to renew and so be counted again. Refused requests get the layer's `429`.
///
/// So at most `max_in_flight` requests of a key run at once, after any number of losses
/// however close together, except for:
/// - requests whose renewals do not reach Redis during that pause (their instance cannot
///   reach it, or the renewal times out): each counts again at its next successful renewal,
///   as a request whose renewals failed for a whole lease does without any loss;
/// - a loss first noticed by an instance that had not used that Redis before (on a cluster,
///   that hash slot; say, one that just started): it cannot tell a loss from a first use and
///   admits up to `max_in_flight` more, until an instance that knew the old epoch calls (at
///   the latest the next renewal of a running request), which pauses admissions from the new
///   epoch's start. That is at most twice the limit for such a loss;
/// - a loss that leaves the epoch marker (a failover that lost only the last writes, a
///   deleted key): no pause; as many new requests as holders went missing may be admitted
///   before those count again at their next renewal.
///
/// A [`MemoryStore`] never loses its slots.
pub struct ConcurrencyLimiterBuilder {
    store: Arc<dyn Store>,
    limit: u32,
    lease: Duration,
    prefix: String,
    policy: String,
    timeout: Duration,
    max_key_len: usize,
    breaker: CircuitBreaker,
    failure: FailurePolicy,
    local_share: u32,
}

impl fmt::Debug for ConcurrencyLimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimiterBuilder")
            .field("max_in_flight", &self.limit)
            .field("lease", &self.lease)
            .field("prefix", &self.prefix)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyLimiterBuilder {
    fn new(store: Arc<dyn Store>, limit: u32) -> Self {
        Self {
            store,
            limit,
            lease: ConcurrencyLimiter::DEFAULT_LEASE,
            prefix: DEFAULT_PREFIX.to_owned(),
            policy: ConcurrencyLimiter::DEFAULT_POLICY_NAME.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            breaker: CircuitBreaker::default(),
            failure: FailurePolicy::default(),
            local_share: 1,
        }
    }

    /// How long a slot stays held without a renewal (default 10 s): the time within which
    /// the slots of a crashed instance come back. Held slots are renewed every third of it,
    /// and after Redis loses the slots admissions pause for a third of it plus two store
    /// timeouts (see [When Redis loses the slots](Self#when-redis-loses-the-slots)). From
    /// 100 ms to one hour, and at least three times the [store timeout](Self::store_timeout),
    /// so that a renewal that times out still leaves time for another before the lease ends.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The first part of this limiter's namespace (default `rl`); a key's slots are under
    /// `{prefix:policy:key}:c`. 1 to 64 visible ASCII characters, without `{`, `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The policy name (default `concurrency`): the second part of this limiter's namespace,
    /// and the name in the `RateLimit` headers. 1 to 64 characters from `A-Z a-z 0-9 - _ . :`.
    ///
    /// A concurrency policy and a rate policy may share a name: their keys differ by suffix
    /// (`:c` and the algorithm's), so they never spend each other's state. Two concurrency
    /// limiters on one store with the same prefix and name but another `max_in_flight` would
    /// share slots under different limits, so building the second fails.
    pub fn policy_name(mut self, name: impl Into<String>) -> Self {
        self.policy = name.into();
        self
    }

    /// Bound on one store call (acquire, renewal, release), including waiting for a pooled
    /// connection (default 100 ms). A release that fails is sent again, at least once a
    /// second, until it succeeds or its lease would have ended by itself.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Keys longer than this many bytes are stored as a hash (default 128, at least 16).
    pub fn max_key_len(mut self, len: usize) -> Self {
        self.max_key_len = len;
        self
    }

    /// When to stop calling a failing store for acquires (default: after 5 failures in a
    /// row, for 1 s). Renewals and releases are always sent.
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// What an acquire gets when the store fails or times out (default
    /// [`FailurePolicy::Open`]: the layer lets the request through unlimited).
    /// [`FailurePolicy::Closed`]: the layer answers `503`. [`FailurePolicy::Local`]: a slot
    /// of a semaphore in this process, at `max_in_flight` divided by
    /// [`local_share`](Self::local_share).
    pub fn on_store_error(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// The number of instances sharing the limit, for [`FailurePolicy::Local`]: while the
    /// store is unavailable, each instance allows `max_in_flight / instances` requests per key
    /// at once (rounded down, at least 1). At least 1 (the default).
    pub fn local_share(mut self, instances: u32) -> Self {
        self.local_share = instances;
        self
    }

    /// Validates the options; the error names the field.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{ConcurrencyLimiter, MemoryStore};
    ///
    /// let err = ConcurrencyLimiter::builder(MemoryStore::new(), 0).build().unwrap_err();
    /// assert_eq!(err.field(), "max_in_flight");
    /// let err = ConcurrencyLimiter::builder(MemoryStore::new(), 4)
    ///     .lease(Duration::from_millis(10))
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.field(), "lease");
    /// ```
    pub fn build(self) -> Result<ConcurrencyLimiter, ConfigError> {
        if !(1..=MAX_IN_FLIGHT).contains(&self.limit) {
            return Err(ConfigError::new(
                "max_in_flight",
                format!("{}: must be 1 to {MAX_IN_FLIGHT}", self.limit),
            ));
        }
        if !(MIN_LEASE..=MAX_LEASE).contains(&self.lease) {
            return Err(ConfigError::new(
                "lease",
                format!("{:?}: must be 100 ms to 1 hour", self.lease),
            ));
        }
        self.breaker.validate()?;
        check_names(&self.prefix, &self.policy)?;
        if self.timeout.is_zero() {
            return Err(ConfigError::new("store_timeout", "must be more than zero"));
        }
        if self.timeout.saturating_mul(3) > self.lease {
            return Err(ConfigError::new(
                "lease",
                format!(
                    "{:?}: must be at least three times the store timeout ({:?}), so that a \
                     renewal that times out leaves time for another before the lease ends",
                    self.lease, self.timeout
                ),
            ));
        }
        if self.max_key_len < 16 {
            return Err(ConfigError::new("max_key_len", "must be at least 16"));
        }
        if self.local_share == 0 {
            return Err(ConfigError::new("local_share", "must be at least 1"));
        }
        let namespace = format!("{}:{}", self.prefix, self.policy);
        let claim = match self.store.namespaces() {
            Some(namespaces) => {
                let rule = format!("at most {} in flight", self.limit);
                Some(namespaces.claim(&namespace, "concurrency", rule, false)?)
            }
            None => None,
        };
        let policy: Arc<str> = self.policy.into();
        // Every running holder renews within a third of the lease (plus the call before it
        // and its own), so all are counted again by the end of the pause.
        let pause = self.lease / 3 + self.timeout.saturating_mul(2);
        let local = (self.failure == FailurePolicy::Local).then(|| {
            Arc::new(Slots {
                store: Arc::new(MemoryStore::new()),
                namespace: namespace.clone(),
                policy: Arc::clone(&policy),
                terms: SlotTerms::new((self.limit / self.local_share).max(1), self.lease, pause),
                timeout: DEFAULT_TIMEOUT,
                max_key_len: self.max_key_len,
                breaker: BreakerState::new(CircuitBreaker::disabled()),
                failure: FailurePolicy::Closed,
                local: None,
                releases: Releases::default(),
                _claim: None,
            })
        });
        Ok(ConcurrencyLimiter {
            slots: Arc::new(Slots {
                store: self.store,
                namespace,
                policy,
                terms: SlotTerms::new(self.limit, self.lease, pause),
                timeout: self.timeout,
                max_key_len: self.max_key_len,
                breaker: BreakerState::new(self.breaker),
                failure: self.failure,
                local,
                releases: Releases::default(),
                _claim: claim,
            }),
        })
    }
}
