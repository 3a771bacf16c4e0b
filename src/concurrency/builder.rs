//! Building a [`ConcurrencyLimiter`]: every option validated at once, with an error naming the
//! field.

use std::{fmt, sync::Arc, time::Duration};

use super::{kept::Releases, limiter::ConcurrencyLimiter, semaphore::Semaphore};
use crate::{
    core::{common_options, Core, Options},
    error::ConfigError,
    store::FailurePolicy,
    store::{MemoryStore, SlotStore, SlotTerms, Slots, Store},
};

/// The most requests of one key a limiter may allow in flight.
const MAX_IN_FLIGHT: u32 = 1_000_000;
/// The shortest time to live: renewals every third of it must have time to arrive.
const MIN_TTL: Duration = Duration::from_millis(100);
/// The longest time to live: a crashed instance's permits stay taken this long.
const MAX_TTL: Duration = Duration::from_secs(3600);

impl ConcurrencyLimiter {
    /// The time to live of the permits of a limiter not given one: 10 s, renewed every 3.3 s
    /// while held.
    pub const DEFAULT_PERMIT_TTL: Duration = Duration::from_secs(10);

    /// The policy name of a limiter not given one: `concurrency` (so that its `RateLimit`
    /// header item stands apart from a rate limit's `default`).
    pub const DEFAULT_POLICY_NAME: &'static str = "concurrency";

    /// A builder: at most `max_in_flight` requests per key at once, with the default prefix
    /// (`rl`), policy name ([`DEFAULT_POLICY_NAME`](Self::DEFAULT_POLICY_NAME)), permit time
    /// to live ([`DEFAULT_PERMIT_TTL`](Self::DEFAULT_PERMIT_TTL)), store timeout (100 ms) and
    /// failure policy ([`FailurePolicy::Open`]).
    pub fn builder(store: impl SlotStore, max_in_flight: u32) -> ConcurrencyLimiterBuilder {
        let store = Arc::new(store);
        ConcurrencyLimiterBuilder {
            slots: store.clone(),
            store,
            limit: max_in_flight,
            ttl: Self::DEFAULT_PERMIT_TTL,
            options: Options::new(Self::DEFAULT_POLICY_NAME),
        }
    }
}

/// Options for a [`ConcurrencyLimiter`]; [`build`](Self::build) validates them.
///
/// # When Redis loses the permits
///
/// A Redis restart without persistence, `FLUSHALL`, or a failover to a replica that had not
/// received them takes away the holders of running requests. Each running request puts its
/// holder back at its next renewal (within a third of the
/// [time to live](Self::permit_ttl)), counted even
/// if its key is then over the limit. And the first call after the loss from an instance that
/// had used this limiter on that Redis before (an acquire, or a running request's renewal)
/// finds the epoch marker it remembers (a key of the policy's namespace kept a day after the
/// last call, see the key layout in `src/store/redis/keys.rs`; on a cluster, one per hash
/// slot) gone: then no new request of the policy, whatever
/// its key, is admitted for a third of the time to live plus two [store
/// timeouts](Self::store_timeout) (3.5 s with the defaults), the time every running request
/// needs to renew and so be counted again. Refused requests get the layer's `429`.
///
/// So at most `max_in_flight` requests of a key run at once, after any number of losses
/// however close together, except for:
/// - requests whose renewals do not reach Redis during that pause (their instance cannot
///   reach it, or the renewal times out): each counts again at its next successful renewal,
///   as a request whose renewals failed for a whole time to live does without any loss;
/// - a loss first noticed by an instance that had not used that Redis before (on a cluster,
///   that hash slot; say, one that just started): it cannot tell a loss from a first use and
///   admits up to `max_in_flight` more, until an instance that knew the old epoch calls (at
///   the latest the next renewal of a running request), which pauses admissions from the new
///   epoch's start. That is `max_in_flight` more for each such loss while the requests of
///   earlier epochs still run (twice the limit after one; losses noticed first by instances
///   already running add nothing);
/// - a loss that leaves the epoch marker (a failover that lost only the last writes, a
///   deleted key): no pause; as many new requests as holders went missing may be admitted
///   before those count again at their next renewal.
///
/// A [`MemoryStore`] never loses its permits.
pub struct ConcurrencyLimiterBuilder {
    store: Arc<dyn Store>,
    /// The same store, for its concurrency slots.
    slots: Arc<dyn Slots>,
    limit: u32,
    ttl: Duration,
    options: Options,
}

impl fmt::Debug for ConcurrencyLimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimiterBuilder")
            .field("max_in_flight", &self.limit)
            .field("permit_ttl", &self.ttl)
            .field("prefix", &self.options.prefix)
            .field("policy", &self.options.policy)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyLimiterBuilder {
    common_options!();

    /// How long a permit stays held without a renewal (default 10 s): the time within which
    /// the permits of a crashed instance come back. Held permits are renewed every third of
    /// it, and after Redis loses the permits admissions pause for a third of it plus two
    /// store timeouts (see [When Redis loses the permits](Self#when-redis-loses-the-permits)).
    /// From 100 ms to one hour, and at least three times the
    /// [store timeout](Self::store_timeout), so that a renewal that times out still leaves
    /// time for another before the permit expires.
    pub fn permit_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Validates the options; the error names the field.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first setting that cannot work.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{MemoryStore, concurrency::ConcurrencyLimiter};
    ///
    /// let err = ConcurrencyLimiter::builder(MemoryStore::new(), 0).build().unwrap_err();
    /// assert_eq!(err.field(), "max_in_flight");
    /// let err = ConcurrencyLimiter::builder(MemoryStore::new(), 4)
    ///     .permit_ttl(Duration::from_millis(10))
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.field(), "permit_ttl");
    /// ```
    pub fn build(self) -> Result<ConcurrencyLimiter, ConfigError> {
        if !(1..=MAX_IN_FLIGHT).contains(&self.limit) {
            return Err(ConfigError::new(
                "max_in_flight",
                format!("{}: must be 1 to {MAX_IN_FLIGHT}", self.limit),
            ));
        }
        if !(MIN_TTL..=MAX_TTL).contains(&self.ttl) {
            return Err(ConfigError::new(
                "permit_ttl",
                format!("{:?}: must be 100 ms to 1 hour", self.ttl),
            ));
        }
        let timeout = self.options.timeout;
        if timeout.saturating_mul(3) > self.ttl {
            return Err(ConfigError::new(
                "permit_ttl",
                format!(
                    "{:?}: must be at least three times the store timeout ({timeout:?}), so \
                     that a renewal that times out leaves time for another before the permit \
                     expires",
                    self.ttl
                ),
            ));
        }
        let namespace = self.options.namespace();
        let rule = format!("at most {} in flight", self.limit);
        let core = self.options.build(self.store, "concurrency", rule, false)?;
        // Every running holder renews within a third of the time to live (plus the call
        // before it and its own), so all are counted again by the end of the pause.
        let pause = self.ttl / 3 + core.timeout.saturating_mul(2);
        let local = (core.failure == FailurePolicy::Local).then(|| {
            let limit = (self.limit / core.share.get()).max(1);
            let store = Arc::new(MemoryStore::new());
            Arc::new(Semaphore {
                core: Core::local(store.clone(), &namespace, &core.policy),
                slots: store,
                terms: SlotTerms::new(limit, self.ttl, pause),
                local: None,
                releases: Releases::default(),
            })
        });
        Ok(ConcurrencyLimiter {
            semaphore: Arc::new(Semaphore {
                core,
                slots: self.slots,
                terms: SlotTerms::new(self.limit, self.ttl, pause),
                local,
                releases: Releases::default(),
            }),
        })
    }
}
