//! The policy core under every limit of this crate: the store handle and the namespace the
//! limit claims in it, the circuit breaker and the timeout around each store call, the
//! failure policy with its local share, and the counters and telemetry.
//!
//! A [`RateLimiter`](crate::RateLimiter) (through its engine) and a
//! [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter) (through its semaphore) each
//! hold one [`Core`] and add what is theirs (an algorithm with its deny cache and unit leases;
//! a limit of requests in flight); the throttle uses its `RateLimiter`'s. Their builders
//! share [`Options`]: the options every limit has, validated in one place.

mod breaker;
mod deny_cache;
pub(crate) mod fleet;
mod lease;
mod names;
mod options;
pub(crate) mod quiet;
pub(crate) mod report;
mod stats;
mod top;

pub(crate) use self::{
    deny_cache::DenyCache,
    lease::{Leasing, PendingReturn},
    options::{common_options, Options},
    stats::Counters,
    top::TopKeys,
};
pub use self::{lease::UnitLease, stats::LimiterStats, top::KeyCount};

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use self::{breaker::BreakerState, report::Meters};
use crate::{
    decision::{Source, Verdict},
    error::Error,
    extract::Key,
    store::{
        namespace_id, within, BoxFuture, CircuitBreaker, Claim, FailurePolicy, Store, StoreKey,
    },
};

/// Default bound on one store call.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
/// Default key prefix.
pub(crate) const DEFAULT_PREFIX: &str = "rl";
/// Default bound on a key's length; longer keys are replaced by a hash.
pub(crate) const DEFAULT_MAX_KEY_LEN: usize = 128;

/// What every limit holds: where its state lives and how calls to it are guarded.
pub(crate) struct Core {
    pub(crate) store: Arc<dyn Store>,
    /// `prefix:policy`: every key of this limit is stored under `{namespace:key}`.
    pub(crate) namespace: Box<str>,
    /// The namespace's number in this process (the start of its keys in an in-process map).
    namespace_id: u32,
    /// The policy name: the limit's name in the headers, the logs and the metrics.
    pub(crate) policy: Arc<str>,
    pub(crate) timeout: Duration,
    pub(crate) max_key_len: usize,
    breaker: BreakerState,
    pub(crate) failure: FailurePolicy,
    /// The number of instances a limit is divided among under [`FailurePolicy::Local`].
    pub(crate) share: NonZeroU32,
    pub(crate) counters: Counters,
    pub(crate) meters: Meters,
    /// This limit's log gates (one line per cause and period).
    pub(crate) quiet: quiet::Quiet,
    /// Whether this limit reports its decisions (counters, metrics, events): every limit but
    /// a local share, whose decisions its limit reports.
    pub(crate) reports: bool,
    /// This limit's hold on its namespace in the store (released when dropped).
    _claim: Option<Arc<Claim>>,
}

impl Core {
    /// A core for a limit decided in this process at the local share (a `MemoryStore`): no
    /// breaker, no claim, and errors are final.
    pub(crate) fn local(store: Arc<dyn Store>, namespace: &str, policy: &Arc<str>) -> Self {
        Self {
            store,
            namespace: namespace.into(),
            namespace_id: namespace_id(namespace),
            policy: Arc::clone(policy),
            timeout: DEFAULT_TIMEOUT,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            breaker: BreakerState::new(CircuitBreaker::disabled(), None),
            failure: FailurePolicy::Closed,
            share: NonZeroU32::MIN,
            counters: Counters::default(),
            meters: Meters::default(),
            quiet: quiet::Quiet::default(),
            reports: false,
            _claim: None,
        }
    }

    /// The store key of `key` (`None`: the limit keyless requests share).
    pub(crate) fn store_key<'a>(&'a self, key: Option<&'a Key<'a>>) -> StoreKey<'a> {
        StoreKey::bounded(&self.namespace, key, self.max_key_len).numbered(self.namespace_id)
    }

    /// One store call through the circuit breaker and within the store timeout. Refused at
    /// once with [`Error::CircuitOpen`] while the breaker is open; every failure is counted
    /// and reported, and the store-wide ones count towards opening the breaker.
    pub(crate) async fn call<'a, T>(
        &self,
        call: impl FnOnce() -> BoxFuture<'a, Result<T, Error>>,
    ) -> Result<T, Error> {
        let Some(attempt) = self.breaker.attempt() else {
            self.counters.short_circuited.increment();
            report::short_circuited(&self.policy);
            return Err(Error::CircuitOpen);
        };
        let result = within(self.timeout, call()).await;
        attempt.finish(!matches!(&result, Err(e) if e.is_unavailable()));
        if let Err(e) = &result {
            self.store_failed(e);
        }
        result
    }

    /// One store call within the store timeout, sent whatever the circuit breaker says and
    /// not counted by it: renewals and releases of what a request already holds, which must
    /// go out even while new checks are refused.
    pub(crate) async fn call_always<T>(
        &self,
        call: BoxFuture<'_, Result<T, Error>>,
    ) -> Result<T, Error> {
        within(self.timeout, call).await
    }

    /// A store failure: counted and reported.
    pub(crate) fn store_failed(&self, e: &Error) {
        self.counters.store_errors.increment();
        report::store_failed(&self.policy, e);
    }

    /// Whether a check that failed with `e` is decided at the local share instead: under
    /// [`FailurePolicy::Local`], when the store as a whole is unavailable.
    pub(crate) fn decides_locally(&self, e: &Error) -> bool {
        self.failure == FailurePolicy::Local && e.is_unavailable()
    }

    /// Counts and meters one decision; `latency`: how long the store took, when it was
    /// asked.
    #[inline]
    pub(crate) fn decided(&self, verdict: Verdict, source: Source, latency: Option<Duration>) {
        if !self.reports {
            return;
        }
        self.counters.decided(verdict, source);
        self.meters.decided(&self.policy, verdict, source, latency);
    }

    /// A check the store could not decide: what the failure policy makes of it (let
    /// through under `open` or when `lets_through`, e.g. in shadow mode; refused
    /// otherwise), counted and reported.
    pub(crate) fn undecided(&self, lets_through: bool) -> Verdict {
        let verdict = match self.failure == FailurePolicy::Open || lets_through {
            true => Verdict::Allowed,
            false => Verdict::Unavailable,
        };
        self.decided(verdict, Source::FailurePolicy, None);
        report::undecided(&self.policy, verdict);
        verdict
    }

    /// The counters, as a snapshot.
    pub(crate) fn stats(&self) -> LimiterStats {
        self.counters.snapshot(self.breaker.times_opened())
    }
}
