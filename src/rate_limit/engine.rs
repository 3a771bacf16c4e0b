//! The engine behind every [`RateLimiter`](super::RateLimiter), whatever its algorithm's type:
//! a check decided in one pass. `decide` answers what can be answered without waiting (the
//! deny cache, a unit lease, a store that decides at once); `check` asks the store through the
//! core (breaker, timeout) and falls back to the local share; both end in `conclude`, which
//! counts, reports and feeds the deny cache.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use arc_swap::ArcSwapOption;
use tracing::Level;

use super::{
    delay::{Delays, GiveBack, Waiter},
    lists::key_text,
};
use crate::{
    algorithm::{Algorithm, Change, Outcome},
    core::report::{self, KeyMeters},
    core::{fleet, Core, DenyCache, KeyCount, Leasing, PendingReturn, TopKeys},
    decision::{Admitted, Charge, Decision, KeyState, Settled, Source, Verdict},
    error::{ConfigError, Error, ErrorChain},
    extract::{Key, Out, COMPACT_SCRATCH},
    quota::{Quota, MAX_EXACT},
    store::{KeyBuf, Pace, StoreKey},
};

/// A rate limit without its algorithm's type: what a layer's policies hold.
pub(crate) struct RateEngine {
    pub(crate) core: Core,
    pub(crate) algorithm: Arc<dyn Algorithm>,
    pub(crate) deny_cache: Option<DenyCache>,
    pub(crate) leasing: Option<Leasing>,
    /// Shadow mode: a layer never rejects under this policy. Atomic: live limits
    /// ([`LiveLimits`](super::LiveLimits)) turn it on and off while the limit runs.
    pub(crate) shadow: AtomicBool,
    /// In shadow mode, whether responses still get the rate-limit headers.
    pub(crate) shadow_headers: bool,
    /// The keys this limit denies most.
    pub(crate) top: Option<TopKeys>,
    /// Per-key metrics of the keys the user listed.
    pub(crate) key_meters: KeyMeters,
    /// Under [`FailurePolicy::Local`](crate::FailurePolicy::Local): the same algorithm at the
    /// local share, in memory.
    pub(crate) local: Option<Arc<RateEngine>>,
    /// The compact prefix of this limit's keys in an in-process store (`namespace\0kind\0`,
    /// kind the algorithm's name), written once here rather than on every check.
    pub(crate) prefix: Box<[u8]>,
    /// The quotas a layer's live limits give this limit's requests
    /// ([`RateLimitLayer::live`](super::RateLimitLayer::live)), swapped with them; empty
    /// without live limits. [`RateLimiter::peek`](super::RateLimiter::peek) reads them, so it
    /// shows the quota the layer enforces.
    pub(crate) live: ArcSwapOption<LiveQuotas>,
    /// The marker last seen and the bans this instance knows, to notice a store that lost
    /// this limit's state and write the bans back.
    pub(crate) watch: super::store_watch::StoreWatch,
    /// Automatic bans ([`RateLimiterBuilder::ban_after`](super::RateLimiterBuilder::ban_after)):
    /// the refusals to count.
    pub(crate) banner: Option<super::banner::Banner>,
    /// Delay instead of refusal ([`RateLimiterBuilder::delay`](super::RateLimiterBuilder::delay)):
    /// the longest wait and the requests waiting.
    pub(crate) delays: Delays,
}

/// What [`RateEngine::decide_lean`] answers: the numbers of an admission, or the decision.
// Moved once, to the layer: a boxed decision would cost an allocation on every denial.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AtOnce {
    Admitted(Admitted),
    Decided(Decision),
}

/// The quotas of live limits: the default one (`None`: the algorithm's own) and per key.
pub(crate) struct LiveQuotas {
    pub(crate) own: Option<Arc<Quoted>>,
    pub(crate) plans: HashMap<Box<[u8]>, Arc<Quoted>>,
}

impl LiveQuotas {
    /// The quota for a request of `key` (`None`: the limiter's own).
    pub(crate) fn quoted(&self, key: Option<&Key<'_>>) -> Option<&Arc<Quoted>> {
        if !self.plans.is_empty() {
            if let Some(key) = key {
                if let Some(plan) = key_text(key, |text| self.plans.get(text)) {
                    return Some(plan);
                }
            }
        }
        self.own.as_ref()
    }
}

impl RateEngine {
    /// The store key of `key` (`None`: the quota keyless requests share).
    #[inline]
    pub(crate) fn store_key<'a>(&'a self, key: Option<&'a Key<'a>>) -> StoreKey<'a> {
        let kind = self.algorithm.name();
        self.core.store_key(key).with_prefix(kind, &self.prefix)
    }

    /// Whether the limit is in shadow mode now.
    pub(crate) fn shadow(&self) -> bool {
        self.shadow.load(Ordering::Relaxed)
    }

    /// The policy name.
    pub(crate) fn policy(&self) -> &Arc<str> {
        &self.core.policy
    }

    /// Whether this limit's algorithm can give units back ([`RateEngine::refund`]): every
    /// built-in one; a custom script cannot.
    pub(crate) fn refundable(&self) -> bool {
        !self.algorithm.rule().is_script()
    }

    /// Counts and reports a decision of `key` answered by `d.source` (see
    /// [`telemetry`](crate::telemetry)), marking it with the policy's shadow mode;
    /// `latency`: how long the store took, when it was asked; `compact`: the key's compact
    /// form, when the caller wrote it already.
    fn record(
        &self,
        d: &mut Decision,
        key: StoreKey<'_>,
        compact: Option<&[u8]>,
        latency: Option<Duration>,
    ) {
        // A ban is an operator's: enforced whether or not the limit is in shadow mode.
        d.shadow = self.shadow() && !d.banned;
        if !self.core.reports {
            return;
        }
        let verdict = d.verdict();
        let near_limit = d.allowed && d.remaining.saturating_mul(5) <= d.capacity;
        self.meter(key, verdict, d.source, latency, near_limit);
        self.watch_ban(key, d.source, d.banned, d.retry_after);
        report::decided(d, key.key(), verdict, latency, &self.core.quiet);
        if let (Some(top), false) = (&self.top, d.allowed) {
            match compact {
                Some(id) => top.record(id, key.key(), verdict),
                None => {
                    let mut scratch = [0; COMPACT_SCRATCH];
                    let (head, tail) = key.key_compact_parts(&mut scratch);
                    top.record_parts(head, tail, key.key(), verdict);
                }
            }
        }
    }

    /// A check the store could not decide (`e`): counted and reported under the failure
    /// policy, then returned.
    fn undecided(&self, e: Error) -> Error {
        if self.core.reports {
            self.core.undecided(self.shadow());
        }
        e
    }

    /// The `n` keys this limit denied (or would have, in shadow mode) most, highest first.
    pub(crate) fn top_keys(&self, n: usize) -> Vec<KeyCount> {
        self.top
            .as_ref()
            .map_or_else(Vec::new, |top| top.top(n, &self.core.policy))
    }

    /// `quota` for one check: this limit's algorithm with it (validated), and the tag that
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

    /// The algorithm a check runs: the one given for it, else the limit's.
    fn algorithm<'a>(&'a self, quoted: Option<&'a Quoted>) -> &'a dyn Algorithm {
        match quoted {
            Some(q) => &*q.algorithm,
            None => &*self.algorithm,
        }
    }

    /// Decides what can be decided without waiting: a cost of zero (an error), a denial the
    /// deny cache holds, units of a live unit lease, or the answer of a store that decides at
    /// once (a `MemoryStore`). `None` when the store must be asked with
    /// [`check`](Self::check).
    pub(crate) fn decide(
        &self,
        key: Option<&Key<'_>>,
        cost: u32,
        quoted: Option<&Quoted>,
    ) -> Option<Result<Decision, Error>> {
        self.decide_as(key, cost, quoted, |_| None, |d| d)
    }

    /// [`decide`](Self::decide) for a caller that needs only the numbers of an admitted
    /// check (a layer that writes no decision into the request and settles nothing after the
    /// response): an admission of a single limit, counted and reported as `decide` would,
    /// comes as [`AtOnce::Admitted`] without the public [`Decision`] being built; everything
    /// else as the decision.
    #[inline]
    pub(crate) fn decide_lean(
        &self,
        key: Option<&Key<'_>>,
        cost: u32,
        quoted: Option<&Quoted>,
    ) -> Option<Result<AtOnce, Error>> {
        self.decide_as(
            key,
            cost,
            quoted,
            |a| Some(AtOnce::Admitted(a)),
            AtOnce::Decided,
        )
    }

    /// [`decide`](Self::decide), an admission handed to `admitted` first (which may take it)
    /// and every decision to `decided`.
    fn decide_as<T>(
        &self,
        key: Option<&Key<'_>>,
        cost: u32,
        quoted: Option<&Quoted>,
        admitted: impl FnOnce(Admitted) -> Option<T>,
        decided: impl FnOnce(Decision) -> T,
    ) -> Option<Result<T, Error>> {
        if cost == 0 {
            return Some(Err(Error::InvalidInput("cost must be at least 1")));
        }
        let key = self.store_key(key);
        if let Some(d) = self.cached_denial(key, cost, quoted) {
            return Some(Ok(decided(d)));
        }
        if self.delaying() {
            return None; // the request's place is kept by `check`, which may wait
        }
        // The source apart from the result, so that the outcome is not moved into a tuple.
        let stored = self.store_now(key, cost, quoted);
        let source = match stored.is_some() {
            true => Source::Store,
            false => Source::UnitLease,
        };
        let result = match stored {
            Some(result) => result,
            None => Ok(self.leasing(quoted)?.take(key, cost)?),
        };
        if let Some(a) = result.as_ref().ok().and_then(|o| self.admitted(o, quoted)) {
            if let Some(t) = admitted(a) {
                self.record_admitted(key, &a, source);
                return Some(Ok(t));
            }
        }
        let result = self.conclude(key, cost, quoted, None, None, source, result);
        Some(
            match result {
                Err(e) => self.fall_back(key, cost, quoted, e),
                ok => ok,
            }
            .map(decided),
        )
    }

    /// The numbers of `outcome`, an admission of a single limit, when nothing else needs its
    /// decision: no `debug` event to write (it shows the decision).
    #[inline]
    fn admitted(&self, outcome: &Outcome, quoted: Option<&Quoted>) -> Option<Admitted> {
        if !outcome.allowed || !outcome.parts.is_empty() || tracing::enabled!(Level::DEBUG) {
            return None;
        }
        let algorithm = self.algorithm(quoted);
        let capacity = algorithm.quota();
        Some(Admitted {
            remaining: outcome.remaining.min(capacity),
            capacity,
            window: algorithm.window(),
            reset_after: Duration::from_micros(outcome.reset_after_us),
        })
    }

    /// Counts and reports an admission (see [`record`](Self::record)) without its decision.
    #[inline]
    fn record_admitted(&self, key: StoreKey<'_>, a: &Admitted, source: Source) {
        if !self.core.reports {
            return;
        }
        let near_limit = a.remaining.saturating_mul(5) <= a.capacity;
        self.meter(key, Verdict::Allowed, source, None, near_limit);
        self.watch_ban(key, source, false, None);
    }

    /// Meters a decision of `key`: its verdict and source (`latency`: how long
    /// the store took, when asked), an admission with a fifth or less of its units left
    /// (`near_limit`), and the per-key meters.
    #[inline]
    fn meter(
        &self,
        key: StoreKey<'_>,
        verdict: Verdict,
        source: Source,
        latency: Option<Duration>,
        near_limit: bool,
    ) {
        self.core.decided(verdict, source, latency);
        if near_limit {
            self.core.meters.near_limit(&self.core.policy);
        }
        if !self.key_meters.is_empty() {
            self.key_meters
                .decided(&self.core.policy, key.key(), verdict);
        }
    }

    /// Keeps this instance's list of `key`'s bans up to what the store said (`banned`, with
    /// `left` its time left), for writing them back to a store that lost them.
    fn watch_ban(&self, key: StoreKey<'_>, source: Source, banned: bool, left: Option<Duration>) {
        let (Source::Store, Some(k)) = (source, key.key()) else {
            return;
        };
        match (banned, left) {
            (true, Some(left)) => self.watch.banned(k, left),
            // Lifted by another instance, or ended: nothing to write back.
            (false, _) if self.watch.knows_bans() => self.watch.unbanned(k),
            _ => {}
        }
    }

    /// A store that decides at once (in memory).
    #[inline]
    fn store_now(
        &self,
        key: StoreKey<'_>,
        cost: u32,
        quoted: Option<&Quoted>,
    ) -> Option<Result<Outcome, Error>> {
        let algorithm = self.algorithm(quoted);
        self.core.store.check_now(algorithm, key, cost, None)
    }

    /// The unit leases a check may be answered from: the limit's own quota, on the store's
    /// clock, in a store that reserves.
    fn leasing(&self, quoted: Option<&Quoted>) -> Option<&Leasing> {
        self.leasing
            .as_ref()
            .filter(|l| quoted.is_none() && l.active())
    }

    /// Decides `key` in the store, after [`decide`](Self::decide) found no answer at hand:
    /// through the core's circuit breaker and within the store timeout (from a unit lease's
    /// reservation when the limit leases), or at the local share when the store is
    /// unavailable and the failure policy says so.
    pub(crate) async fn check(
        self: &Arc<Self>,
        key: Option<&Key<'_>>,
        cost: u32,
        quoted: Option<&Quoted>,
    ) -> Result<Decision, Error> {
        if self.delaying() {
            return self.check_delayed(key, cost, quoted).await;
        }
        let key = self.store_key(key);
        let algorithm = self.algorithm(quoted);
        let core = &self.core;
        let started = Instant::now();
        let (outcome, source) = match self.leasing(quoted) {
            Some(leasing) => {
                let returns = |r: PendingReturn| {
                    let engine = Arc::clone(self);
                    tokio::spawn(async move { r.send(&engine.core, &*engine.algorithm).await });
                };
                match leasing.check(core, algorithm, key, cost, returns).await {
                    Ok((outcome, source)) => (Ok(outcome), source),
                    Err(e) => (Err(e), Source::Store),
                }
            }
            None => {
                let call = core.call(|| core.store.check(algorithm, key, cost, None));
                (call.await, Source::Store)
            }
        };
        match self.conclude(key, cost, quoted, None, Some(started), source, outcome) {
            Err(e) => self.fall_back(key, cost, quoted, e),
            ok => ok,
        }
    }

    /// Whether requests over the limit wait for their units now: a delay is set, and the
    /// policy is not in shadow mode (which never delays).
    fn delaying(&self) -> bool {
        self.delays.max_us() > 0 && !self.shadow()
    }

    /// Decides `key` under a delay (see [`Delay`](super::Delay)): its place kept in the store
    /// (at once within the burst, else when its units come, within the longest wait and the
    /// bounds of waiting requests), then waited for. A request that goes away while it waits
    /// gives its units back ([`Waiter`]). A refusal's `retry_after` is the time until a
    /// request would wait no longer than the longest wait.
    async fn check_delayed(
        self: &Arc<Self>,
        key: Option<&Key<'_>>,
        cost: u32,
        quoted: Option<&Quoted>,
    ) -> Result<Decision, Error> {
        let store_key = self.store_key(key);
        let algorithm = self.algorithm(quoted);
        let burst = algorithm.quota();
        let mut seat_key = KeyBuf::new();
        cache_key(store_key, quoted, &mut seat_key);
        let core = &self.core;
        let max_us = self.delays.max_us();
        let budget_us = match self.delays.room(seat_key.as_bytes(), burst) {
            true => max_us,
            false => 0,
        };
        let started = Instant::now();
        let call = (cost, budget_us);
        let scheduled = core
            .call(|| {
                core.store
                    .schedule(algorithm, store_key, call, Pace::Burst, None)
            })
            .await;
        let mut seated = None;
        let outcome = match scheduled {
            Ok(s) if s.outcome.allowed && s.wait_us > 0 => {
                match self.delays.seat(seat_key.as_bytes(), burst) {
                    Some(seat) => {
                        seated = Some((seat, s.wait_us));
                        Ok(s.outcome)
                    }
                    // Too many wait already: the units go back, and the request is refused.
                    None => Ok(self.unseated(key, cost, quoted, s.outcome, s.wait_us).await),
                }
            }
            Ok(s) => Ok(retry_within(s.outcome, budget_us)),
            Err(e) => Err(e),
        };
        let concluded = self.conclude(
            store_key,
            cost,
            quoted,
            None,
            Some(started),
            Source::Store,
            outcome,
        );
        let mut d = match concluded {
            Err(e) => return self.fall_back(store_key, cost, quoted, e),
            Ok(d) => d,
        };
        let Some((seat, wait_us)) = seated.filter(|_| d.allowed) else {
            return Ok(d);
        };
        let waiter = Waiter {
            _seat: seat,
            limit: Arc::clone(self) as Arc<dyn GiveBack>,
            key: key.map(|k| k.clone().into_owned()),
            charge: d.charge.clone(),
        };
        let wait = Duration::from_micros(wait_us);
        tokio::time::sleep(wait).await;
        waiter.served();
        d.delayed = wait;
        d.reset_after = d.reset_after.saturating_sub(wait);
        Ok(d)
    }

    /// A place kept for a request that cannot wait here (too many wait already): its units
    /// given back, and a refusal in its stead, to retry when its place would have come.
    async fn unseated(
        &self,
        key: Option<&Key<'_>>,
        cost: u32,
        quoted: Option<&Quoted>,
        kept: Outcome,
        wait_us: u64,
    ) -> Outcome {
        let charge = Charge {
            cost,
            quota: quoted.map(|q| q.quota),
            local: false,
            position: kept.position,
        };
        // A failure is counted and logged by the refund; the units then come back with time.
        let _ = self.refund(key, &charge, None).await;
        Outcome::single(false, kept.remaining, Some(wait_us), kept.reset_after_us)
    }

    /// Decides `key` at an explicit time (µs since the Unix epoch), in the store only: no
    /// deny cache, no lease, no local share. For tests and simulations.
    pub(crate) async fn check_at(
        &self,
        key: Option<&Key<'_>>,
        cost: u32,
        now_us: u64,
    ) -> Result<Decision, Error> {
        if cost == 0 {
            return Err(Error::InvalidInput("cost must be at least 1"));
        }
        if now_us > MAX_EXACT {
            return Err(Error::InvalidInput(
                "explicit time must be under 2^52 microseconds",
            ));
        }
        let key = self.store_key(key);
        let core = &self.core;
        let algorithm = &*self.algorithm;
        let started = Instant::now();
        let (max_us, mut wait_us) = (self.delays.max_us(), 0);
        let outcome = match self.delaying() {
            false => {
                core.call(|| core.store.check(algorithm, key, cost, Some(now_us)))
                    .await
            }
            true => core
                .call(|| {
                    let call = (cost, max_us);
                    core.store
                        .schedule(algorithm, key, call, Pace::Burst, Some(now_us))
                })
                .await
                .map(|s| {
                    wait_us = s.wait_us;
                    retry_within(s.outcome, max_us)
                }),
        };
        let mut d = self
            .conclude(
                key,
                cost,
                None,
                Some(now_us),
                Some(started),
                Source::Store,
                outcome,
            )
            .map_err(|e| self.undecided(e))?;
        d.delayed = Duration::from_micros(wait_us);
        Ok(d)
    }

    /// Under [`FailurePolicy::Local`](crate::FailurePolicy::Local) and a store-wide failure:
    /// the local share's decision, marked degraded. Otherwise the error.
    fn fall_back(
        &self,
        key: StoreKey<'_>,
        cost: u32,
        quoted: Option<&Quoted>,
        e: Error,
    ) -> Result<Decision, Error> {
        let Some(local) = self
            .local
            .as_ref()
            .filter(|_| self.core.decides_locally(&e))
        else {
            return Err(self.undecided(e));
        };
        // A quota given for this check is divided like the configured one.
        let local_quoted = match quoted.map(|q| q.divided(self.core.share)) {
            Some(None) => return Err(self.undecided(e)),
            divided => divided.flatten(),
        };
        let mut d = match local.decide(key.key(), cost, local_quoted.as_ref()) {
            Some(Ok(d)) => d,
            Some(Err(local_error)) => return Err(self.undecided(local_error)),
            // A local share always decides at once (a MemoryStore).
            None => return Err(self.undecided(e)),
        };
        d.degraded = true;
        d.source = Source::Local;
        if let Some(charge) = &mut d.charge {
            charge.local = true;
        }
        tracing::debug!(error = %ErrorChain(&e), allowed = d.allowed, policy = %self.core.policy, "rate limit: decided locally (degraded)");
        self.record(&mut d, key, None, None);
        Ok(d)
    }

    /// Gives back what an allowed check of `key` took (`charge`): in the store that decided
    /// it (the local share for a degraded decision), under the quota it was taken under,
    /// through the circuit breaker and within the store timeout. A cached denial of the key
    /// is forgotten, since units are free again.
    pub(crate) async fn refund(
        &self,
        key: Option<&Key<'_>>,
        charge: &Charge,
        now_us: Option<u64>,
    ) -> Result<bool, Error> {
        let result = self.give_back(key, charge, now_us).await;
        let counters = &self.core.counters;
        match &result {
            Ok(true) => counters.refunds.increment(),
            Ok(false) => {}
            Err(_) => counters.refund_errors.increment(),
        }
        report::refunded(&self.core.policy, charge.cost, &result);
        result
    }

    async fn give_back(
        &self,
        key: Option<&Key<'_>>,
        charge: &Charge,
        now_us: Option<u64>,
    ) -> Result<bool, Error> {
        if now_us.is_some_and(|t| t > MAX_EXACT) {
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
            let local_quoted = match quoted.as_ref().map(|q| q.divided(self.core.share)) {
                Some(None) => return Ok(false),
                divided => divided.flatten(),
            };
            let algorithm = local.algorithm(local_quoted.as_ref());
            let result = local
                .core
                .store
                .refund_now(algorithm, store_key, charge, now_us);
            return result.unwrap_or(Ok(false));
        }
        let algorithm = self.algorithm(quoted.as_ref());
        let core = &self.core;
        let result = match core.store.refund_now(algorithm, store_key, charge, now_us) {
            Some(result) => result,
            None => {
                core.call(|| core.store.refund(algorithm, store_key, charge, now_us))
                    .await
            }
        };
        if let (Ok(true), Some(cache)) = (&result, &self.deny_cache) {
            let mut compact = KeyBuf::new();
            cache_key(store_key, quoted.as_ref(), &mut compact);
            cache.remove(compact.as_bytes());
        }
        result
    }

    /// Settles `charge` of `key` to `actual` units (see
    /// [`RateLimiter::settle`](super::RateLimiter::settle)): in the store that decided the
    /// check (the local share for a degraded decision), through the core. `Ok(true)` when the
    /// key's state changed.
    pub(crate) async fn settle(
        &self,
        key: Option<&Key<'_>>,
        charge: &Charge,
        actual: u32,
        now_us: Option<u64>,
    ) -> Result<bool, Error> {
        check_time(now_us)?;
        let store_key = self.store_key(key);
        let quoted = charge.quota.map(|q| self.quoted(q)).transpose()?;
        let result = if charge.local {
            self.settle_locally(store_key, quoted.as_ref(), charge, actual, now_us)
        } else {
            let algorithm = self.algorithm(quoted.as_ref());
            let core = &self.core;
            let store = &core.store;
            match store.settle_now(algorithm, store_key, charge, actual, now_us) {
                Some(result) => result,
                None => {
                    let call = || store.settle(algorithm, store_key, charge, actual, now_us);
                    core.call(call).await
                }
            }
        };
        let given = matches!(result, Ok(true)) && actual < charge.cost;
        if let (true, false, Some(cache)) = (given, charge.local, &self.deny_cache) {
            let mut compact = KeyBuf::new();
            cache_key(store_key, quoted.as_ref(), &mut compact);
            cache.remove(compact.as_bytes());
        }
        let core = &self.core;
        report::settled(&core.policy, &core.quiet, (charge.cost, actual), &result);
        result
    }

    /// A settlement of a decision's charge (`slot`, a decision answered by `source`) to
    /// `actual` units, as [`RateLimiter::settle`](super::RateLimiter::settle) and the layer's
    /// settlements make it: the charge is taken from `slot` (so it settles once) only when it
    /// can be settled, then settled in the store. [`Settled::NoCharge`] for an empty slot.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::settle`](super::RateLimiter::settle): a figure above
    /// [`Settled::MAX_ACTUAL`] or a unit lease's decision leaves the charge in `slot`.
    pub(crate) fn take_for_settlement(
        slot: &mut Option<Charge>,
        source: Source,
        actual: u64,
    ) -> Result<Option<(Charge, u32)>, Error> {
        if slot.is_none() {
            return Ok(None);
        }
        let Ok(actual) = u32::try_from(actual) else {
            return Err(Error::InvalidInput(
                "a charge settles to at most u32::MAX units",
            ));
        };
        if source == Source::UnitLease {
            return Err(Error::Unsupported(
                "a decision answered from a unit lease cannot be settled",
            ));
        }
        Ok(slot.take().map(|charge| (charge, actual)))
    }

    /// Settles `charge`, taken by [`take_for_settlement`](Self::take_for_settlement), to
    /// `actual` units, and says what happened.
    pub(crate) async fn settle_taken(
        &self,
        key: Option<&Key<'_>>,
        charge: Charge,
        actual: u32,
        now_us: Option<u64>,
    ) -> Result<Settled, Error> {
        let change = Change::of(charge.cost, actual);
        if change == Change::None {
            return Ok(Settled::AsCharged);
        }
        let changed = self.settle(key, &charge, actual, now_us).await?;
        Ok(match change {
            Change::Down(units) => Settled::GaveBack {
                units,
                given: changed,
            },
            Change::Up(units) => Settled::Charged { units },
            Change::None => Settled::AsCharged,
        })
    }

    /// Whether a layer can settle this limit's charges after the response: its algorithm
    /// settles, its store does, and its decisions are not answered from unit leases. The
    /// reason when not.
    pub(crate) fn settleable(&self) -> Result<(), String> {
        let why = if !self.algorithm.rule().settles() {
            format!(
                "uses {}, which cannot settle a charge",
                self.algorithm.name()
            )
        } else if self.core.store.regional() {
            "is on a RegionalStore, which cannot settle a charge".to_owned()
        } else if self.leasing.is_some() {
            "takes units from unit leases, whose decisions cannot be settled".to_owned()
        } else {
            return Ok(());
        };
        Err(format!("policy {:?} {why}", self.policy()))
    }

    /// A degraded decision's settlement, at the local share (nothing without one).
    fn settle_locally(
        &self,
        store_key: StoreKey<'_>,
        quoted: Option<&Quoted>,
        charge: &Charge,
        actual: u32,
        now_us: Option<u64>,
    ) -> Result<bool, Error> {
        let Some(local) = &self.local else {
            return Ok(false);
        };
        let local_quoted = match quoted.map(|q| q.divided(self.core.share)) {
            Some(None) => return Ok(false),
            divided => divided.flatten(),
        };
        let algorithm = local.algorithm(local_quoted.as_ref());
        let store = &local.core.store;
        let result = store.settle_now(algorithm, store_key, charge, actual, now_us);
        result.unwrap_or(Ok(false))
    }

    /// `key`'s state as a check would see it, spending nothing: through the core's circuit
    /// breaker and within the store timeout; under
    /// [`FailurePolicy::Local`](crate::FailurePolicy::Local) and a store-wide failure, the
    /// local share's state, marked degraded.
    pub(crate) async fn peek(
        &self,
        key: Option<&Key<'_>>,
        quoted: Option<&Quoted>,
        now_us: Option<u64>,
    ) -> Result<KeyState, Error> {
        check_time(now_us)?;
        let store_key = self.store_key(key);
        let core = &self.core;
        let algorithm = self.algorithm(quoted);
        let peeked = core
            .call(|| core.store.peek(algorithm, store_key, now_us))
            .await;
        // The local share's quota, when the local share answers: a quota given for the peek
        // is divided like the configured one.
        let local_quoted;
        let (peeked, degraded, algorithm) = match peeked {
            Ok(p) => (p, false, algorithm),
            Err(e) => match self.local.as_ref().filter(|_| core.decides_locally(&e)) {
                Some(local) => {
                    local_quoted = match quoted.map(|q| q.divided(core.share)) {
                        Some(None) => return Err(e),
                        divided => divided.flatten(),
                    };
                    let algorithm = local.algorithm(local_quoted.as_ref());
                    let p = local.core.store.peek(algorithm, store_key, now_us).await?;
                    (p, true, algorithm)
                }
                None => return Err(e),
            },
        };
        let mut state = KeyState::from_outcome(
            peeked.outcome,
            peeked.banned_us,
            algorithm.quota(),
            algorithm.window(),
            Arc::clone(&core.policy),
            algorithm.parts(),
        );
        state.degraded = degraded;
        Ok(state)
    }

    /// Removes `key`'s state in the store (not its ban), through the core like a check, and
    /// forgets what this process holds of it: its cached denial, its unit lease, its state at
    /// the local share. Other processes see it within the deny cache's `MAX_AGE` (1 s)
    /// (their cached denials) or their unit leases' lifetime.
    pub(crate) async fn reset(&self, key: Option<&Key<'_>>) -> Result<(), Error> {
        let store_key = self.store_key(key);
        let core = &self.core;
        let algorithm = &*self.algorithm;
        core.call(|| core.store.reset(algorithm, store_key, None))
            .await?;
        self.forget_locally(store_key);
        if let Some(local) = &self.local {
            local
                .core
                .store
                .reset(&*local.algorithm, store_key, None)
                .await?;
        }
        Ok(())
    }

    /// Bans `key` for `duration` in the store (replacing a ban it has), and in this
    /// process's deny cache and local share at once.
    pub(crate) async fn ban(
        &self,
        key: Option<&Key<'_>>,
        duration: Duration,
        now_us: Option<u64>,
    ) -> Result<(), Error> {
        check_time(now_us)?;
        if self.algorithm.rule().is_script() {
            return Err(Error::Unsupported(
                "a custom algorithm's script reads no ban",
            ));
        }
        if !(MIN_BAN..=MAX_BAN).contains(&duration) {
            return Err(Error::Config(ConfigError::new(
                "ban.duration",
                format!(
                    "must be from 1 ms to {} days, not {duration:?}",
                    MAX_BAN.as_secs() / 86_400
                ),
            )));
        }
        let store_key = self.store_key(key);
        let core = &self.core;
        let us = duration.as_micros() as u64;
        let sent = Instant::now();
        core.call(|| core.store.ban(store_key, us, now_us)).await?;
        self.forget_locally(store_key);
        if let (Some(cache), None) = (&self.deny_cache, now_us) {
            let mut compact = KeyBuf::new();
            cache_key(store_key, None, &mut compact);
            cache.insert(compact.as_bytes(), sent, duration, duration, true);
        }
        if let Some(local) = &self.local {
            local.core.store.ban(store_key, us, None).await?;
        }
        if let (Some(key), None) = (key, now_us) {
            self.watch.banned(key, duration);
        }
        Ok(())
    }

    /// Looks at this limit's marker in the store: `true` when the store lost the limit's
    /// state since the last look (counted and logged, and every ban this instance knows
    /// written back with the time it has left).
    pub(crate) async fn notice_reset(&self) -> Result<bool, Error> {
        let token = crate::unique_id::next();
        let core = &self.core;
        let held = core
            .call(|| core.store.mark(&core.namespace, token.as_bytes()))
            .await?;
        let lost = self.watch.saw(held);
        if lost {
            self.watch.set_pending(true);
        }
        if !self.watch.pending() {
            return Ok(false);
        }
        let bans = match self.algorithm.rule().is_script() {
            // A custom algorithm's script reads no ban.
            true => Vec::new(),
            false => self.watch.live_bans(),
        };
        let mut failed = 0;
        for (i, (key, ends)) in bans.iter().enumerate() {
            // The time left now, just before each write.
            let left = ends.saturating_duration_since(std::time::Instant::now());
            if left < MIN_BAN {
                continue;
            }
            if let Err(e) = self.ban(Some(key), left, None).await {
                if e.is_unavailable() {
                    // The store is away again: the rest waits for the next look.
                    failed += bans.len() - i;
                    break;
                }
                failed += 1;
            }
        }
        // What failed is tried again at the next look (every ban again: a write is idempotent).
        self.watch.set_pending(failed > 0);
        if lost {
            report::store_reset(&core.policy, bans.len(), failed);
        } else if failed == 0 {
            report::bans_written_back(&core.policy, bans.len());
        }
        Ok(lost)
    }

    /// Publishes this instance's most denied keys (at most
    /// [`PUBLISHED_KEYS`](fleet::PUBLISHED_KEYS)) for the fleet's view; nothing without top
    /// keys.
    pub(crate) async fn publish_top_keys(&self) -> Result<(), Error> {
        if self.top.is_none() {
            return Ok(());
        }
        let snapshot = fleet::encode(&self.top_keys(fleet::PUBLISHED_KEYS));
        let core = &self.core;
        let instance = &self.watch.instance;
        core.call(|| {
            core.store
                .publish_top(&core.namespace, instance, &snapshot, fleet::SNAPSHOT_TTL)
        })
        .await
    }

    /// The `n` keys denied most across every instance that published its top keys within
    /// [`SNAPSHOT_TTL`](fleet::SNAPSHOT_TTL), this one counted as it is now.
    pub(crate) async fn fleet_top_keys(&self, n: usize) -> Result<Vec<KeyCount>, Error> {
        let core = &self.core;
        let published = core
            .call(|| core.store.read_tops(&core.namespace, fleet::SNAPSHOT_TTL))
            .await?;
        let own = self.top_keys(fleet::PUBLISHED_KEYS);
        let others = published
            .into_iter()
            .filter(|(instance, _)| *instance != self.watch.instance.as_bytes())
            .filter_map(|(_, snapshot)| fleet::decode(&snapshot));
        Ok(fleet::merge(std::iter::once(own).chain(others), n))
    }

    /// Lifts `key`'s ban in the store and in this process.
    pub(crate) async fn unban(&self, key: Option<&Key<'_>>) -> Result<(), Error> {
        let store_key = self.store_key(key);
        let core = &self.core;
        core.call(|| core.store.unban(store_key)).await?;
        self.forget_locally(store_key);
        if let Some(key) = key {
            self.watch.unbanned(key);
        }
        if let Some(local) = &self.local {
            local.core.store.unban(store_key).await?;
        }
        Ok(())
    }

    /// A refusal this process answered: queued to be counted toward a ban when the policy
    /// bans by itself, the key has one, and the refusal is not a ban's.
    fn count_if_refused(&self, key: Option<&Key<'_>>, allowed: bool, banned: bool) {
        if let (Some(banner), Some(key), false, false) = (&self.banner, key, allowed, banned) {
            banner.refused(key, &self.core.policy, &self.core.quiet);
        }
    }

    /// Forgets the cached denial and the unit lease of `key` in this process.
    pub(super) fn forget_locally(&self, key: StoreKey<'_>) {
        if let Some(cache) = &self.deny_cache {
            let mut compact = KeyBuf::new();
            cache_key(key, None, &mut compact);
            cache.remove(compact.as_bytes());
        }
        if let Some(leasing) = &self.leasing {
            leasing.forget(key);
        }
    }

    /// A denial answered by the deny cache (see
    /// [`RateLimiterBuilder::deny_cache`](super::RateLimiterBuilder::deny_cache)).
    #[inline]
    fn cached_denial(
        &self,
        key: StoreKey<'_>,
        cost: u32,
        quoted: Option<&Quoted>,
    ) -> Option<Decision> {
        let cache = self.deny_cache.as_ref()?;
        // No key to build while no denial is held (the common case).
        let now = cache.live(Instant::now)?;
        self.cache_hit(cache, now, key, cost, quoted)
    }

    /// [`cached_denial`](Self::cached_denial) while the cache holds live denials.
    fn cache_hit(
        &self,
        cache: &DenyCache,
        now: Instant,
        key: StoreKey<'_>,
        cost: u32,
        quoted: Option<&Quoted>,
    ) -> Option<Decision> {
        let mut compact = KeyBuf::new();
        cache_key(key, quoted, &mut compact);
        // A denial for lack of units answers cost-1 checks only; a ban answers every cost.
        let hit = cache
            .get_live(compact.as_bytes(), now)
            .filter(|hit| cost == 1 || hit.banned)?;
        let algorithm = self.algorithm(quoted);
        let mut d = Decision::cached_denial(
            algorithm.quota(),
            algorithm.window(),
            Arc::clone(&self.core.policy),
            hit.retry_after,
            hit.reset_after,
        );
        d.cost = cost;
        d.banned = hit.banned;
        // The cache key ends with the key's compact form.
        let id = &compact.as_bytes()[cache_key_prefix(quoted)..];
        self.record(&mut d, key, Some(id), None);
        self.count_if_refused(key.key(), false, hit.banned);
        Some(d)
    }

    /// Turns the store's answer into a decision: counters, telemetry, and the deny cache.
    /// `started`: when the store was asked; `None` when it answered without waiting.
    #[allow(clippy::too_many_arguments)]
    fn conclude(
        &self,
        key: StoreKey<'_>,
        cost: u32,
        quoted: Option<&Quoted>,
        now_us: Option<u64>,
        started: Option<Instant>,
        source: Source,
        result: Result<Outcome, Error>,
    ) -> Result<Decision, Error> {
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(e) => {
                match started {
                    // A store that answers at once failed: the core did not see it.
                    None => self.core.store_failed(&e),
                    // A call that went out and failed (timed out, say) is timed too; a check
                    // the circuit breaker refused made none.
                    Some(s) if self.core.reports && !matches!(e, Error::CircuitOpen) => {
                        self.core.meters.failed_call(&self.core.policy, s.elapsed());
                    }
                    Some(_) => {}
                }
                return Err(e);
            }
        };
        let algorithm = self.algorithm(quoted);
        let mut d = Decision::from_outcome(
            outcome,
            algorithm.quota(),
            algorithm.window(),
            cost,
            Arc::clone(&self.core.policy),
            algorithm.parts(),
            source,
        );
        if let (Some(charge), Some(q)) = (&mut d.charge, quoted) {
            charge.quota = Some(q.quota);
        }
        self.record(&mut d, key, None, started.map(|s| s.elapsed()));
        if now_us.is_none() {
            self.count_if_refused(key.key(), d.allowed, d.banned);
        }
        // Only what cannot change before its deadline (but by an operator, whose reset or
        // unban is seen here within MAX_AGE): a cost-1 denial with nothing left, on the
        // store's clock (never for explicit test times), for single-limit algorithms; a ban.
        if let (Some(cache), None, Some(retry)) = (&self.deny_cache, now_us, d.retry_after) {
            if d.banned || (cost == 1 && d.remaining == 0 && d.limits.is_empty()) {
                let sent = started.unwrap_or_else(Instant::now);
                let mut compact = KeyBuf::new();
                cache_key(key, quoted, &mut compact);
                cache.insert(compact.as_bytes(), sent, retry, d.reset_after, d.banned);
            }
        }
        Ok(d)
    }
}

impl GiveBack for RateEngine {
    fn policy(&self) -> &str {
        &self.core.policy
    }

    fn give_back(self: Arc<Self>, key: Option<Key<'static>>, charge: Charge) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime to give the units back on: they come back with time
        };
        runtime.spawn(async move {
            // A failure is counted and logged by the refund itself.
            let _ = self.refund(key.as_ref(), &charge, None).await;
        });
    }
}

/// A refusal under a delay of at most `max_us` (see [`Delay`](super::Delay)), retried when
/// the request would wait no longer than that: its `retry_after` less `max_us` (at least
/// 1 µs). Anything else (an admission, a ban, a cost that never fits) as it is.
fn retry_within(mut outcome: Outcome, max_us: u64) -> Outcome {
    if outcome.allowed || outcome.banned {
        return outcome;
    }
    if let Some(retry) = &mut outcome.retry_after_us {
        *retry = retry.saturating_sub(max_us).max(1);
    }
    outcome
}

/// The shortest ban.
const MIN_BAN: Duration = Duration::from_millis(1);
/// The longest ban: a year and a day.
const MAX_BAN: Duration = Duration::from_secs(366 * 86_400);

/// An explicit time must be one the scripts take.
fn check_time(now_us: Option<u64>) -> Result<(), Error> {
    if now_us.is_some_and(|t| t > MAX_EXACT) {
        return Err(Error::InvalidInput(
            "explicit time must be under 2^52 microseconds",
        ));
    }
    Ok(())
}

/// The length of what [`cache_key`] writes before the key.
fn cache_key_prefix(quoted: Option<&Quoted>) -> usize {
    match quoted {
        Some(q) => 1 + q.tag.len(),
        None => 1,
    }
}

/// The deny cache's key for `key` (and the quota given for the check, if any): a marker
/// byte, then the quota's fixed-length tag when there is one, then the key. The marker goes
/// first so that no key's bytes can spell another key with a quota.
pub(super) fn cache_key(key: StoreKey<'_>, quoted: Option<&Quoted>, out: &mut KeyBuf) {
    match quoted {
        Some(q) => {
            out.put(b"q");
            out.put(&q.tag);
        }
        None => out.put(b"-"),
    }
    key.write_key_compact(out);
}

/// A quota given for one check: the limit's algorithm with it, and a tag (limit, period,
/// burst) that keeps its cached denials apart from other quotas' for the same key.
pub(crate) struct Quoted {
    algorithm: Box<dyn Algorithm>,
    tag: [u8; 24],
    quota: Quota,
}

impl Quoted {
    /// The limit's algorithm with this quota.
    pub(crate) fn algorithm(&self) -> &dyn Algorithm {
        &*self.algorithm
    }

    /// Whether this quota runs exactly as `algorithm` does (the limiter's own quota).
    pub(crate) fn same_rule(&self, algorithm: &dyn Algorithm) -> bool {
        format!("{:?}", self.algorithm.rule()) == format!("{:?}", algorithm.rule())
    }

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
