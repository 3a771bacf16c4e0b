//! The engine behind every [`RateLimiter`](super::RateLimiter), whatever its algorithm's type:
//! the store call through the breaker and the timeout, the deny cache, the local share, the
//! counters.

use std::{
    num::NonZeroU32,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use super::{
    breaker::BreakerState, deny_cache::DenyCache, failure::FailurePolicy, stats::Counters,
};
use crate::{
    extract::Out,
    quota::MAX_EXACT,
    store::{within, Backend, Claim, KeyBuf, StoreKey},
    telemetry, Algorithm, Charge, ConfigError, Decision, Error, Key, Outcome, Quota, Rule, Store,
};

/// A limiter without its algorithm's type: what the layer's policies hold.
pub(crate) struct Engine {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) algorithm: Arc<dyn Algorithm>,
    /// `prefix:policy`: every key of this limiter is `{namespace:key}`.
    pub(crate) namespace: String,
    pub(crate) policy: Arc<str>,
    pub(crate) timeout: Duration,
    pub(crate) max_key_len: usize,
    pub(crate) breaker: BreakerState,
    pub(crate) deny_cache: Option<DenyCache>,
    pub(crate) failure: FailurePolicy,
    /// The number of instances the quota is divided among under [`FailurePolicy::Local`].
    pub(crate) share: NonZeroU32,
    /// Shadow mode: a layer never rejects under this policy (see
    /// [`RateLimiterBuilder::shadow`](super::RateLimiterBuilder::shadow)).
    pub(crate) shadow: bool,
    /// Under [`FailurePolicy::Local`]: the same algorithm at the local share, in memory.
    pub(crate) local: Option<Arc<Engine>>,
    pub(crate) counters: Counters,
    /// This limiter's hold on its namespace in the store (released when dropped).
    pub(crate) _claim: Option<Arc<Claim>>,
}

impl Engine {
    /// The store key of `key` (`None`: the quota keyless requests share).
    pub(crate) fn store_key<'a>(&'a self, key: Option<&'a Key<'a>>) -> StoreKey<'a> {
        StoreKey::bounded(&self.namespace, key, self.max_key_len)
    }

    /// Whether this limiter's algorithm can give units back ([`Engine::refund`]): every
    /// built-in one; a custom script cannot.
    pub(crate) fn refundable(&self) -> bool {
        !matches!(self.algorithm.rule(), Rule::Script(_))
    }

    /// A denial a layer let through because this policy is in shadow mode.
    pub(crate) fn shadow_denied(&self, d: &Decision) {
        self.counters.shadow_denials.fetch_add(1, Ordering::Relaxed);
        telemetry::shadow_denied(d);
    }

    /// `quota` for one check: this limiter's algorithm with it (validated), and the tag that
    /// keeps its deny-cache entries apart from other quotas' (see
    /// [`Algorithm::with_quota`]).
    pub(crate) fn quoted(&self, quota: Quota) -> Result<Quoted, ConfigError> {
        let algorithm = self.algorithm.with_quota(quota)?;
        let mut tag = [0u8; 24];
        tag[..8].copy_from_slice(&u64::from(quota.limit()).to_le_bytes());
        let period = u64::try_from(quota.period().as_micros()).unwrap_or(u64::MAX);
        tag[8..16].copy_from_slice(&period.to_le_bytes());
        tag[16..].copy_from_slice(&u64::from(quota.burst_size()).to_le_bytes());
        Ok(Quoted {
            algorithm,
            tag,
            quota,
        })
    }

    /// The algorithm a check runs: the one given for it, else the limiter's.
    fn algorithm<'a>(&'a self, quoted: Option<&'a Quoted>) -> &'a dyn Algorithm {
        match quoted {
            Some(q) => &*q.algorithm,
            None => &*self.algorithm,
        }
    }

    /// The decision for `key`, when it can be had without waiting: from the deny cache, or
    /// from a store that decides at once ([`Store::check_now`], e.g. a `MemoryStore`). `None`
    /// when the store must be asked with [`check`](Self::check).
    pub(crate) fn decide_now(
        &self,
        key: Option<&Key<'_>>,
        cost: u32,
        quoted: Option<&Quoted>,
    ) -> Option<Result<Decision, Error>> {
        if cost == 0 {
            return Some(Err(Error::InvalidInput("cost must be at least 1")));
        }
        let key = self.store_key(key);
        if let Some(d) = self.cached_denial(key, cost, quoted) {
            return Some(Ok(d));
        }
        let algorithm = self.algorithm(quoted);
        let result = self.store.check_now(algorithm, key, cost, None)?;
        let result = self.conclude(key, cost, quoted, None, None, result);
        Some(match result {
            Err(e) => self.fall_back_now(key, cost, quoted, e),
            ok => ok,
        })
    }

    /// Decides `key` in the store (through the circuit breaker, within the store timeout),
    /// or at the local share when the store is unavailable and the policy says so.
    pub(crate) async fn check(
        &self,
        key: Option<&Key<'_>>,
        cost: u32,
        quoted: Option<&Quoted>,
        now: Option<u64>,
    ) -> Result<Decision, Error> {
        let key = self.store_key(key);
        let result = self.ask_store(key, cost, quoted, now).await;
        match result {
            Err(e) if now.is_none() => self.fall_back_now(key, cost, quoted, e),
            result => result,
        }
    }

    /// Under [`FailurePolicy::Local`] and a store-wide failure: the local share's decision,
    /// marked degraded. Otherwise the error.
    fn fall_back_now(
        &self,
        key: StoreKey<'_>,
        cost: u32,
        quoted: Option<&Quoted>,
        e: Error,
    ) -> Result<Decision, Error> {
        let Some(local) = self.local.as_ref().filter(|_| e.is_unavailable()) else {
            return Err(e);
        };
        // A quota given for this check is divided like the configured one.
        let local_quoted = match quoted.map(|q| q.divided(self.share)) {
            Some(None) => return Err(e),
            divided => divided.flatten(),
        };
        let mut d = match local.decide_now(key.key(), cost, local_quoted.as_ref()) {
            Some(result) => result?,
            None => return Err(e), // a local share always decides at once (a MemoryStore)
        };
        d.degraded = true;
        if let Some(charge) = &mut d.charge {
            charge.local = true;
        }
        self.counters.degraded.fetch_add(1, Ordering::Relaxed);
        telemetry::degraded(&d);
        tracing::debug!(error = %crate::error::Chain(&e), allowed = d.allowed, "rate limit: decided locally (degraded)");
        Ok(d)
    }

    async fn ask_store(
        &self,
        key: StoreKey<'_>,
        cost: u32,
        quoted: Option<&Quoted>,
        now: Option<u64>,
    ) -> Result<Decision, Error> {
        if cost == 0 {
            return Err(Error::InvalidInput("cost must be at least 1"));
        }
        if now.is_some_and(|t| t > MAX_EXACT) {
            return Err(Error::InvalidInput(
                "explicit time must be under 2^52 microseconds",
            ));
        }
        let Some(permit) = self.breaker.permit() else {
            self.counters
                .short_circuited
                .fetch_add(1, Ordering::Relaxed);
            telemetry::store_failed(&self.policy, &Error::CircuitOpen);
            return Err(Error::CircuitOpen);
        };
        let started = Instant::now();
        let call = self.store.check(self.algorithm(quoted), key, cost, now);
        let result = within(self.timeout, call).await;
        permit.finish(!matches!(&result, Err(e) if e.is_unavailable()));
        self.conclude(key, cost, quoted, now, Some(started), result)
    }

    /// Gives back what an allowed check of `key` took (`charge`): in the store that decided
    /// it (the local share for a degraded decision), under the quota it was taken under,
    /// through the circuit breaker and within the store timeout. A cached denial of the key
    /// is forgotten, since units are free again.
    pub(crate) async fn refund(
        &self,
        key: Option<&Key<'_>>,
        charge: &Charge,
        now: Option<u64>,
    ) -> Result<bool, Error> {
        let result = self.give_back(key, charge, now).await;
        match &result {
            Ok(true) => {
                self.counters.refunds.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(_) => {
                self.counters.refund_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        telemetry::refunded(&self.policy, charge.cost, &result);
        result
    }

    async fn give_back(
        &self,
        key: Option<&Key<'_>>,
        charge: &Charge,
        now: Option<u64>,
    ) -> Result<bool, Error> {
        if now.is_some_and(|t| t > MAX_EXACT) {
            return Err(Error::InvalidInput(
                "explicit time must be under 2^52 microseconds",
            ));
        }
        let store_key = self.store_key(key);
        let quoted = charge.quota.map(|q| self.quoted(q)).transpose()?;
        if charge.local {
            let Some(local) = &self.local else {
                return Ok(false);
            };
            let local_quoted = match quoted.as_ref().map(|q| q.divided(self.share)) {
                Some(None) => return Ok(false),
                divided => divided.flatten(),
            };
            let algorithm = local.algorithm(local_quoted.as_ref());
            let result = local.store.refund_now(algorithm, store_key, charge, now);
            return result.unwrap_or(Ok(false));
        }
        let algorithm = self.algorithm(quoted.as_ref());
        let result = match self.store.refund_now(algorithm, store_key, charge, now) {
            Some(result) => result,
            None => {
                let Some(permit) = self.breaker.permit() else {
                    return Err(Error::CircuitOpen);
                };
                let call = self.store.refund(algorithm, store_key, charge, now);
                let result = within(self.timeout, call).await;
                permit.finish(!matches!(&result, Err(e) if e.is_unavailable()));
                result
            }
        };
        if let (Ok(true), Some(cache)) = (&result, &self.deny_cache) {
            let mut compact = KeyBuf::new();
            Self::cache_key(store_key, quoted.as_ref(), &mut compact);
            cache.remove(compact.as_bytes());
        }
        result
    }

    /// The deny cache's key for `key` (and the quota given for the check, if any): a marker
    /// byte, then the quota's fixed-length tag when there is one, then the key. The marker
    /// goes first so that no key's bytes can spell another key with a quota.
    fn cache_key(key: StoreKey<'_>, quoted: Option<&Quoted>, out: &mut KeyBuf) {
        match quoted {
            Some(q) => {
                out.put(b"q");
                out.put(&q.tag);
            }
            None => out.put(b"-"),
        }
        key.write_key_compact(out);
    }

    /// A denial answered by the deny cache (see
    /// [`RateLimiterBuilder::deny_cache`](super::RateLimiterBuilder::deny_cache)).
    fn cached_denial(
        &self,
        key: StoreKey<'_>,
        cost: u32,
        quoted: Option<&Quoted>,
    ) -> Option<Decision> {
        let cache = self.deny_cache.as_ref().filter(|_| cost == 1)?;
        // No key to build while no denial is held (the common case).
        let now = cache.live(Instant::now)?;
        let mut compact = KeyBuf::new();
        Self::cache_key(key, quoted, &mut compact);
        let hit = cache.get(compact.as_bytes(), || now)?;
        self.counters
            .deny_cache_hits
            .fetch_add(1, Ordering::Relaxed);
        let algorithm = self.algorithm(quoted);
        Some(Decision::cached_denial(
            algorithm.quota(),
            algorithm.window(),
            Arc::clone(&self.policy),
            hit.retry_after,
            hit.reset_after,
        ))
    }

    /// Turns the store's answer into a decision: counters, telemetry, and the deny cache.
    /// `started`: when the store was asked; `None` when it answered without waiting.
    fn conclude(
        &self,
        key: StoreKey<'_>,
        cost: u32,
        quoted: Option<&Quoted>,
        now: Option<u64>,
        started: Option<Instant>,
        result: Result<Outcome, Error>,
    ) -> Result<Decision, Error> {
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(e) => {
                self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                telemetry::store_failed(&self.policy, &e);
                return Err(e);
            }
        };
        let algorithm = self.algorithm(quoted);
        let mut d = Decision::from_outcome(
            outcome,
            algorithm.quota(),
            algorithm.window(),
            cost,
            Arc::clone(&self.policy),
            algorithm.parts(),
        );
        if let (Some(charge), Some(q)) = (&mut d.charge, quoted) {
            charge.quota = Some(q.quota);
        }
        telemetry::decided(&d, started);
        // Only what cannot change before its deadline: a cost-1 denial with nothing left,
        // on the store's clock (never for explicit test times), for single-limit algorithms.
        if let (Some(cache), None, Some(retry)) = (&self.deny_cache, now, d.retry_after) {
            if cost == 1 && d.remaining == 0 && d.limits.is_empty() {
                let sent = started.unwrap_or_else(Instant::now);
                let mut compact = KeyBuf::new();
                Self::cache_key(key, quoted, &mut compact);
                cache.insert(compact.as_bytes(), sent, retry, d.reset_after);
            }
        }
        Ok(d)
    }
}

/// A quota given for one check: the limiter's algorithm with it, and a tag (limit, period,
/// burst) that keeps its cached denials apart from other quotas' for the same key.
pub(crate) struct Quoted {
    algorithm: Box<dyn Algorithm>,
    tag: [u8; 24],
    quota: Quota,
}

impl Quoted {
    /// The same quota divided among `instances`, for the local share (same tag and quota:
    /// it stands for the quota given); `None` when the algorithm cannot be divided.
    fn divided(&self, instances: NonZeroU32) -> Option<Quoted> {
        Some(Quoted {
            algorithm: Box::new(self.algorithm.local_share(instances)?),
            tag: self.tag,
            quota: self.quota,
        })
    }
}
