//! The rate limiter's typed handle.

use std::{fmt, sync::Arc, time::Duration};

use super::engine::RateEngine;
use crate::{
    algorithm::Algorithm,
    core::{KeyCount, LimiterStats},
    decision::{Decision, KeyState, Settled},
    error::Error,
    extract::Key,
    quota::Quota,
    store::FailurePolicy,
};

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
///     .policy_name("gmail-backfill")
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
    pub(crate) engine: Arc<RateEngine>,
    pub(crate) algorithm: Arc<A>,
}

impl<A> Clone for RateLimiter<A> {
    fn clone(&self) -> Self {
        Self {
            engine: Arc::clone(&self.engine),
            algorithm: Arc::clone(&self.algorithm),
        }
    }
}

impl<A> fmt::Debug for RateLimiter<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &*self.engine;
        f.debug_struct("RateLimiter")
            .field("algorithm", &e.algorithm.name())
            .field("namespace", &e.core.namespace)
            .field("policy", &e.core.policy)
            .field("timeout", &e.core.timeout)
            .field("on_store_error", &e.core.failure)
            .field("shadow", &e.shadow())
            .finish()
    }
}

impl<A: Algorithm> RateLimiter<A> {
    /// Takes `cost` units for `key`, if they are available. `cost` must be at least 1.
    ///
    /// When the store fails or does not answer within the store timeout: under
    /// [`FailurePolicy::Local`], the decision made in this process at the local share
    /// (marked [`degraded`](Decision::degraded)); otherwise the error (the layer then applies
    /// its [`FailurePolicy`]).
    ///
    /// `key` is text (`&str`, `String`), an IP address, a number or a [`Key`].
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the store does not answer within the store timeout,
    /// [`Error::CircuitOpen`] while the circuit breaker is open, and the store's own error
    /// (unreachable, refused) otherwise. Under [`FailurePolicy::Local`], those are decided in
    /// this process instead. A key the store cannot use (e.g. one holding another type) is that
    /// key's error.
    pub async fn check<'k>(&self, key: impl Into<Key<'k>>, cost: u32) -> Result<Decision, Error> {
        // Answers from the deny cache or a MemoryStore never wait: spend the task's budget so a
        // tight loop of checks still lets the runtime run other tasks and timers.
        tokio::task::coop::consume_budget().await;
        let key = key.into();
        let engine = &self.engine;
        match engine.decide(Some(&key), cost, None) {
            Some(result) => result,
            // Boxed: this future stays small for the answers at hand (a caller that boxes or
            // spawns it allocates and moves only that), and a store that must be waited for
            // takes far longer than the allocation.
            None => Box::pin(engine.check(Some(&key), cost, None)).await,
        }
    }

    /// Like [`check`](Self::check), under `quota` instead of the configured one: a quota
    /// decided per request (a customer's plan, looked up at run time). The algorithm stays
    /// the limiter's, and so do the key's counters: the state is read under the quota given
    /// (see [Quotas per request](crate::guide::operating#quotas-per-request) in the guide
    /// for what an upgrade or a downgrade does to each algorithm). A quota that would not build the algorithm is an
    /// [`Error::Config`] naming the field (`quota.limit`, `quota.period`, `quota.burst`),
    /// and nothing is spent; [`MultiLimit`](crate::algorithm::MultiLimit) and custom algorithms take
    /// no quota per request (`quota`).
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check); [`Error::Config`] naming the quota's field for a quota that
    /// does not build the algorithm.
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(10))?)?;
    /// let pro = Quota::per_minute(1_000);
    /// let d = limiter.check_with_quota("customer-42", 1, pro).await?;
    /// assert_eq!((d.allowed, d.capacity), (true, 1_000));
    /// assert!(limiter.check_with_quota("customer-42", 1, Quota::per_minute(0)).await.is_err());
    /// # Ok(()) }
    /// ```
    pub async fn check_with_quota<'k>(
        &self,
        key: impl Into<Key<'k>>,
        cost: u32,
        quota: Quota,
    ) -> Result<Decision, Error> {
        tokio::task::coop::consume_budget().await;
        let key = key.into();
        let engine = &self.engine;
        let quoted = engine.quoted(quota)?;
        match engine.decide(Some(&key), cost, Some(&quoted)) {
            Some(result) => result,
            None => Box::pin(engine.check(Some(&key), cost, Some(&quoted))).await,
        }
    }

    /// Like [`check`](Self::check), at an explicit time (microseconds since the Unix epoch)
    /// instead of the store's clock. For tests and simulations only: in production every
    /// instance must use the store's clock, or instances with skewed clocks disagree. Redis
    /// still expires keys on its own clock, so keep simulated periods far longer than the
    /// test's real run time.
    ///
    /// Under a [delay](super::RateLimiterBuilder::delay), the request's place is kept as
    /// [`check`](Self::check) keeps it, but not waited for: the decision comes at once, and
    /// [`Decision::delayed`] says how long the request would wait (on the simulated
    /// timeline, which is the caller's). The bounds of requests waiting do not apply.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check).
    pub async fn check_at<'k>(
        &self,
        key: impl Into<Key<'k>>,
        cost: u32,
        now_us: u64,
    ) -> Result<Decision, Error> {
        tokio::task::coop::consume_budget().await;
        let key = key.into();
        self.engine.check_at(Some(&key), cost, now_us).await
    }

    /// Gives back what an allowed check of `key` took and still holds (its
    /// [`Decision::charge`]): for a request that turned out not to count, e.g. a log-in that
    /// succeeded when only failures should spend the quota. Atomic in the store, like a
    /// check: GCRA and the token bucket give back the part of the charge that has not drained
    /// yet (a charge drains as the key refills, so a request in flight longer than that gives
    /// back less, or nothing: its units may already be other requests'), never above the
    /// burst; a sliding window removes the request's own log entry (one deep inside a long log,
    /// with more than 64 entries on both sides, gives its units back later, when the entry 64
    /// places older leaves the window). Limits stay exact under
    /// concurrency: units are taken before the work and given back after, so the requests
    /// that keep their units never exceed the limit.
    ///
    /// `Ok(true)` when units were given back; `Ok(false)` when there was nothing to give back
    /// (a denied decision, one already refunded, or state that expired meanwhile). A refund
    /// goes to the store that decided the check (the local share for a
    /// [`degraded`](Decision::degraded) decision).
    ///
    /// The refund uses up the decision's [charge](Decision::charge), whatever the outcome, so
    /// one decision is never given back twice. When the store fails the error is returned;
    /// the units may or may not have come back (a refund is atomic: all or nothing), so do
    /// not retry it with another check's decision.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the store does not answer within the store timeout,
    /// [`Error::CircuitOpen`] while the circuit breaker is open, and the store's own error
    /// (unreachable, refused) otherwise. [`Error::Unsupported`] for an algorithm that cannot
    /// give units back (a custom script).
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // At most 3 failed log-ins a minute per account.
    /// let failures = RateLimiter::new(MemoryStore::new(), SlidingWindow::new(Quota::per_minute(3))?)?;
    /// for _ in 0..10 {
    ///     let mut d = failures.check("alice", 1).await?;
    ///     assert!(d.allowed);
    ///     let password_ok = true;
    ///     if password_ok {
    ///         assert!(failures.refund("alice", &mut d).await?); // successes do not count
    ///         assert!(!failures.refund("alice", &mut d).await?, "given back once only");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn refund<'k>(
        &self,
        key: impl Into<Key<'k>>,
        decision: &mut Decision,
    ) -> Result<bool, Error> {
        let Some(charge) = decision.charge.take() else {
            return Ok(false);
        };
        let key = key.into();
        self.engine.refund(Some(&key), &charge, None).await
    }

    /// Like [`refund`](Self::refund), at an explicit time (see [`check_at`](Self::check_at)):
    /// for tests and simulations only.
    ///
    /// # Errors
    ///
    /// As [`refund`](Self::refund).
    pub async fn refund_at<'k>(
        &self,
        key: impl Into<Key<'k>>,
        decision: &mut Decision,
        now_us: u64,
    ) -> Result<bool, Error> {
        let Some(charge) = decision.charge.take() else {
            return Ok(false);
        };
        let key = key.into();
        self.engine.refund(Some(&key), &charge, Some(now_us)).await
    }

    /// Settles what an allowed check of `key` took (its [`Decision::charge`]: the estimate
    /// it was admitted on) to the `actual` units its request used, known after the fact: the
    /// tokens a model answered with, the bytes a download served. One atomic call to the store,
    /// on every instance sharing it:
    ///
    /// - **below the charge**, the difference is given back, but at most what the charge
    ///   still holds (the rule of [`refund`](Self::refund): GCRA and the token bucket give
    ///   back the part of the charge that has not drained; a sliding window takes it off the
    ///   check's own log entry; a fixed window gives it back to the check's window while it
    ///   lasts);
    /// - **above the charge**, the difference is charged at once, past the limit if need be:
    ///   a debt, so the key's next checks are denied until it is paid back. GCRA's and the
    ///   token bucket's time moves on by the excess (their
    ///   [`retry_after`](Decision::retry_after) then covers it), at most 100 full quotas
    ///   of debt; a fixed window counts it in the current window, a sliding window logs it
    ///   now (either debt ends with its window).
    ///
    /// A key's ban stays as it is. [`Settled`] says what happened: [`Settled::NoCharge`] for
    /// a decision that holds no charge (a denial, a shadow-mode denial included, the deny
    /// cache's answer; a charge already settled or refunded) and nothing is done;
    /// [`Settled::AsCharged`] when `actual` is the charge. The settlement uses up the
    /// decision's charge, so a decision is settled (or refunded) once. A degraded decision is
    /// settled at the local share, as its refund is.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an `actual` above [`Settled::MAX_ACTUAL`] (the charge
    /// stands, and is kept). [`Error::Unsupported`] for a decision answered from a
    /// [unit lease](super::UnitLease) (its units are the lease's), a store that cannot settle
    /// (a [`RegionalStore`](crate::store::redis::RegionalStore)) or an algorithm that cannot
    /// (a [`MultiLimit`](crate::algorithm::MultiLimit) built with `new`, a custom script;
    /// one built with [`budgets`](crate::algorithm::MultiLimit::budgets) settles the limits
    /// that take the request's cost); the charge is kept
    /// for the first. [`Error::Timeout`], [`Error::CircuitOpen`] and the store's own error as
    /// for a [`refund`](Self::refund): the charge is used up, and the settlement may or may
    /// not have happened (it is atomic: all or nothing).
    ///
    /// ```
    /// # use tower_redis_ratelimit::{rate_limit::Settled, *};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // 1,000 tokens a minute per API key; each answer is admitted on an estimate of 100.
    /// let tokens = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(1_000))?)?;
    /// let mut d = tokens.check("key-1", 100).await?;
    /// assert_eq!(tokens.settle("key-1", &mut d, 40).await?, Settled::GaveBack { units: 60, given: true });
    /// assert_eq!(tokens.peek("key-1").await?.remaining, 960);
    ///
    /// let mut d = tokens.check("key-1", 100).await?;
    /// assert_eq!(tokens.settle("key-1", &mut d, 1_500).await?, Settled::Charged { units: 1_400 });
    /// assert!(!tokens.check("key-1", 1).await?.allowed, "in debt");
    /// assert_eq!(tokens.settle("key-1", &mut d, 1).await?, Settled::NoCharge, "settled once");
    /// assert!(tokens.settle("key-1", &mut d, u64::MAX).await.is_ok());
    /// # Ok(()) }
    /// ```
    pub async fn settle<'k>(
        &self,
        key: impl Into<Key<'k>>,
        decision: &mut Decision,
        actual: u64,
    ) -> Result<Settled, Error> {
        self.settle_when(key.into(), decision, actual, None).await
    }

    /// Like [`settle`](Self::settle), at an explicit time (see [`check_at`](Self::check_at)):
    /// for tests and simulations only.
    ///
    /// # Errors
    ///
    /// As [`settle`](Self::settle).
    pub async fn settle_at<'k>(
        &self,
        key: impl Into<Key<'k>>,
        decision: &mut Decision,
        actual: u64,
        now_us: u64,
    ) -> Result<Settled, Error> {
        self.settle_when(key.into(), decision, actual, Some(now_us))
            .await
    }

    async fn settle_when(
        &self,
        key: Key<'_>,
        decision: &mut Decision,
        actual: u64,
        now_us: Option<u64>,
    ) -> Result<Settled, Error> {
        let taken = RateEngine::take_for_settlement(&mut decision.charge, decision.source, actual)?;
        let Some((charge, actual)) = taken else {
            return Ok(Settled::NoCharge);
        };
        self.engine
            .settle_taken(Some(&key), charge, actual, now_us)
            .await
    }

    /// `key`'s state as its next check would see it, spending nothing: the quota, the units
    /// left and the time until the quota is full again (what a check of cost 0 would show),
    /// and the time its ban has left. One read-only script call in Redis (nothing in memory),
    /// through the circuit breaker and within the store timeout; under
    /// [`FailurePolicy::Local`] with the store unavailable, the local share's state (marked
    /// [`degraded`](KeyState::degraded)). A key never seen has `remaining` = `limit`.
    /// [`Error::Unsupported`] for a custom algorithm. Under a layer's
    /// [live limits](super::RateLimitLayer::live), the quota they give the key (its plan's, or
    /// the quota in force): the one the layer enforces.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the store does not answer within the store timeout,
    /// [`Error::CircuitOpen`] while the circuit breaker is open, and the store's own error
    /// (unreachable, refused) otherwise. [`Error::Unsupported`] for a custom algorithm or a
    /// store that cannot peek.
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(5))?)?;
    /// assert_eq!(limiter.peek("alice").await?.remaining, 5);
    /// limiter.check("alice", 2).await?;
    /// let state = limiter.peek("alice").await?;
    /// assert_eq!((state.capacity, state.remaining, state.banned_for), (5, 3, None));
    /// assert_eq!(limiter.peek("alice").await?.remaining, 3, "a peek spends nothing");
    /// # Ok(()) }
    /// ```
    pub async fn peek<'k>(&self, key: impl Into<Key<'k>>) -> Result<KeyState, Error> {
        let key = key.into();
        let live = self.engine.live.load_full();
        let quoted = live.as_ref().and_then(|q| q.quoted(Some(&key)));
        self.engine
            .peek(Some(&key), quoted.map(|q| &**q), None)
            .await
    }

    /// Like [`peek`](Self::peek), under `quota` instead of the limiter's own: the state a
    /// [`check_with_quota`](Self::check_with_quota) of cost 0 would show (a key with a plan
    /// of its own is peeked under its plan's quota). A quota the algorithm cannot take is an
    /// error, as for a check.
    ///
    /// # Errors
    ///
    /// As [`peek`](Self::peek); [`Error::Config`] naming the quota's field for a quota the
    /// algorithm cannot take.
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(5))?)?;
    /// let gold = Quota::per_minute(100);
    /// limiter.check_with_quota("customer-42", 3, gold).await?;
    /// let state = limiter.peek_with_quota("customer-42", gold).await?;
    /// assert_eq!((state.capacity, state.remaining), (100, 97));
    /// # Ok(()) }
    /// ```
    pub async fn peek_with_quota<'k>(
        &self,
        key: impl Into<Key<'k>>,
        quota: Quota,
    ) -> Result<KeyState, Error> {
        let key = key.into();
        let quoted = self.engine.quoted(quota)?;
        self.engine.peek(Some(&key), Some(&quoted), None).await
    }

    /// Forgets what `key` spent: its state in the store is reset, so its next check, on
    /// any instance sharing the store, finds a rested key. A ban stays (see
    /// [`unban`](Self::unban)). This process forgets its cached denial and unit lease of the
    /// key at once; another instance may still answer the key from its deny cache for at
    /// most 1 s (a cached denial never answers longer before the store is asked again), or
    /// hand out what is left of its unit lease of the key, for at most the lease's lifetime.
    /// Under a quota given per request, only the limiter's own quota's cached denials are
    /// forgotten here; the others end within the same 1 s. A [`refund`](Self::refund) of a
    /// decision made before the reset gives nothing back (the reset gave back all it held).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the store does not answer within the store timeout,
    /// [`Error::CircuitOpen`] while the circuit breaker is open, and the store's own error
    /// (unreachable, refused) otherwise. [`Error::Unsupported`] for a store that cannot reset
    /// keys.
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(MemoryStore::new(), SlidingWindow::new(Quota::per_hour(1))?)?;
    /// assert!(limiter.check("bob", 1).await?.allowed);
    /// assert!(!limiter.check("bob", 1).await?.allowed);
    /// limiter.reset("bob").await?; // a support engineer frees bob
    /// assert!(limiter.check("bob", 1).await?.allowed);
    /// # Ok(()) }
    /// ```
    pub async fn reset<'k>(&self, key: impl Into<Key<'k>>) -> Result<(), Error> {
        let key = key.into();
        self.engine.reset(Some(&key)).await
    }

    /// Denies every check of `key` for `duration` (from 1 ms to 366 days; anything else is an
    /// [`Error::Config`] naming `ban.duration`), whatever its quota holds, replacing a ban it
    /// has. The ban is checked by the limit's own script in the store (no extra round trip),
    /// so every instance sharing the store denies the key from its next check on; this
    /// process at once (its deny cache). A banned check takes nothing from the quota and
    /// is denied with [`Decision::banned`], `remaining` 0 and `retry_after` = the time the ban
    /// has left (`Retry-After` in a layer's 429). The ban and the limit are separate: when
    /// the ban ends, the key has what its quota held. The ban is per key and namespace, so
    /// it holds for every limiter on the same prefix and policy name. In a
    /// [`MemoryStore`](crate::MemoryStore), only this process, and within its key cap (a
    /// new ban is [`Error::Unsupported`] once its lock shard is full: from a little under
    /// `max_keys` bans on). [`Error::Unsupported`] for a custom algorithm (its script does not
    /// read bans). The ban lives in the store: while the store cannot be reached, the failure
    /// policy decides for the key as for any other (under
    /// [`FailurePolicy::Open`](crate::FailurePolicy::Open) it goes through once this process's
    /// cached denial of it, at most 1 s old, is gone); a refusal that must hold then belongs
    /// on a layer's [`deny`](crate::RateLimitLayer::deny) list.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the store does not answer within the store timeout,
    /// [`Error::CircuitOpen`] while the circuit breaker is open, and the store's own error
    /// (unreachable, refused) otherwise. [`Error::Unsupported`] for a store that cannot ban.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_redis_ratelimit::*;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(100))?)?;
    /// limiter.ban("scraper", Duration::from_secs(600)).await?;
    /// let d = limiter.check("scraper", 1).await?;
    /// assert!(d.banned && !d.allowed);
    /// assert!(d.retry_after.unwrap() > Duration::from_secs(599));
    /// assert!(limiter.ban("scraper", Duration::ZERO).await.is_err());
    /// limiter.unban("scraper").await?;
    /// assert!(limiter.check("scraper", 1).await?.allowed);
    /// # Ok(()) }
    /// ```
    pub async fn ban<'k>(&self, key: impl Into<Key<'k>>, duration: Duration) -> Result<(), Error> {
        let key = key.into();
        self.engine.ban(Some(&key), duration, None).await?;
        let policy = self.engine.policy();
        crate::core::report::banned(policy, "operator", Some(&key), duration, None, false);
        Ok(())
    }

    /// Looks at this limit's marker in the store, and answers `true` when the store lost it
    /// since the last look: a Redis that restarted without persistence or was flushed lost
    /// the limit's state with it. Every key then starts afresh, and so would every ban: the
    /// bans this instance knows (those it set with [`ban`](Self::ban), and those the store
    /// enforced on its checks, forgotten when a check finds the ban lifted) are written back
    /// with the time each has left, again at the next looks for those the store refused. Each
    /// instance that notices counts it (`ratelimit_store_resets_total`) and logs one line.
    ///
    /// What this does not notice: a store that kept the marker and lost some state anyway (a
    /// failover to a replica that had received the marker but not the latest bans, an
    /// older snapshot restored). A marker evicted by `maxmemory` is taken for a loss: the bans
    /// are written again, which changes nothing.
    ///
    /// Call it every second or so on every instance (the gateway does): a ban then outlives a
    /// store that lost it within about a second of the store's return. The first look only
    /// takes the marker in; a store that lost its state before it is not noticed. The marker
    /// is one key (`{NS:#epoch}:m`): on a Cluster it watches the node that holds its slot.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redis_ratelimit::Error> {
    /// use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(10))?)?;
    /// // In a task of its own: `loop { limiter.notice_reset().await.ok(); sleep(1 s) }`.
    /// assert!(!limiter.notice_reset().await?); // the first look
    /// assert!(!limiter.notice_reset().await?); // a process's memory is never lost
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the store does not answer within the store timeout,
    /// [`Error::CircuitOpen`] while the circuit breaker is open, and the store's own error
    /// (unreachable, refused) otherwise. [`Error::Unsupported`] across regions, which keep no
    /// bans.
    pub async fn notice_reset(&self) -> Result<bool, Error> {
        self.engine.notice_reset().await
    }

    /// Lifts `key`'s ban (nothing when it has none): this process at once, other instances
    /// within 1 s (their cached denial of the key, see [`reset`](Self::reset)).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the store does not answer within the store timeout,
    /// [`Error::CircuitOpen`] while the circuit breaker is open, and the store's own error
    /// (unreachable, refused) otherwise. [`Error::Unsupported`] for a store that cannot ban.
    pub async fn unban<'k>(&self, key: impl Into<Key<'k>>) -> Result<(), Error> {
        let key = key.into();
        self.engine.unban(Some(&key)).await
    }

    /// The base of the Redis keys under which `key`'s state is stored: `{prefix:policy:key}`
    /// (the Redis key layout is in `src/store/redis/keys.rs`): text longer than the bound (or
    /// starting with `#`) replaced by `#` and its SHA-1, addresses as `#ip:ADDR`, numbers as
    /// `#n:N`. The braces are a Redis Cluster hash tag, so every key of one check lands on
    /// one slot.
    ///
    /// ```
    /// # use std::net::IpAddr;
    /// # use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(1)).unwrap()).unwrap();
    /// assert_eq!(limiter.storage_key("k-123"), "{rl:default:k-123}");
    /// let ip: IpAddr = "10.0.0.1".parse().unwrap();
    /// assert_eq!(limiter.storage_key(ip), "{rl:default:#ip:10.0.0.1}");
    /// assert_eq!(
    ///     limiter.storage_key("x".repeat(10_000)).len(),
    ///     "{rl:default:#}".len() + 40
    /// );
    /// ```
    pub fn storage_key<'k>(&self, key: impl Into<Key<'k>>) -> String {
        let key = key.into();
        self.engine.store_key(Some(&key)).redis_base_key()
    }

    /// The limiter's counters since it was built: every decision by verdict and source,
    /// store errors, the circuit breaker, refunds (see [`LimiterStats`]).
    pub fn stats(&self) -> LimiterStats {
        self.engine.core.stats()
    }

    /// The `n` keys this limiter denied most (or, in shadow mode, would have denied), since
    /// it was built, highest count first: an approximate per-instance top list in fixed
    /// memory (see [`RateLimiterBuilder::top_keys`](super::RateLimiterBuilder::top_keys)),
    /// exact while fewer keys than it tracks were denied. Each instance counts its own
    /// decisions: add up the lists of every instance for the whole picture.
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(1))?)?;
    /// for _ in 0..4 {
    ///     limiter.check("noisy", 1).await?;
    /// }
    /// limiter.check("quiet", 1).await?;
    /// let top = limiter.top_keys(10);
    /// assert_eq!((top[0].key.as_str(), top[0].denied), ("noisy", 3));
    /// assert_eq!(top.len(), 1, "a key never denied is not listed");
    /// # Ok(()) }
    /// ```
    pub fn top_keys(&self, n: usize) -> Vec<KeyCount> {
        self.engine.top_keys(n)
    }

    /// Publishes this instance's most denied keys (its [`top_keys`](Self::top_keys), at most
    /// 1,000) in the store, for [`fleet_top_keys`](Self::fleet_top_keys) on any instance
    /// sharing it; nothing when top keys are off. A publication counts for 10 s: call it
    /// every couple of seconds on every instance (the gateway does every 2 s), and an instance
    /// that stops drops out of the fleet's view 10 s later.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the store does not answer within the store timeout,
    /// [`Error::CircuitOpen`] while the circuit breaker is open, and the store's own error
    /// (unreachable, refused) otherwise. [`Error::Unsupported`] across regions.
    pub async fn publish_top_keys(&self) -> Result<(), Error> {
        self.engine.publish_top_keys().await
    }

    /// The `n` keys denied most across every instance sharing the store: the sum, key by key,
    /// of what each instance published with [`publish_top_keys`](Self::publish_top_keys)
    /// within the last 10 s, this instance counted as it is now. Each instance counts since it
    /// started; an instance that ended drops out. On a [`MemoryStore`](crate::MemoryStore), the limiters sharing
    /// it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redis_ratelimit::Error> {
    /// use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
    ///
    /// let store = MemoryStore::new();
    /// let quota = Quota::per_hour(1);
    /// // Two instances of one policy (two processes on one Redis, in production).
    /// let a = RateLimiter::new(store.clone(), Gcra::new(quota)?)?;
    /// let b = RateLimiter::new(store, Gcra::new(quota)?)?;
    /// for limiter in [&a, &a, &b, &b, &b] {
    ///     limiter.check("scraper", 1).await?; // the first allowed, the rest denied
    /// }
    /// b.publish_top_keys().await?;
    /// let fleet = a.fleet_top_keys(10).await?;
    /// assert_eq!(a.top_keys(10)[0].denied, 1);
    /// assert_eq!((fleet[0].key.as_str(), fleet[0].denied), ("scraper", 4));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`publish_top_keys`](Self::publish_top_keys).
    pub async fn fleet_top_keys(&self, n: usize) -> Result<Vec<KeyCount>, Error> {
        self.engine.fleet_top_keys(n).await
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The policy name used in the headers.
    pub fn policy_name(&self) -> &str {
        &self.engine.core.policy
    }

    /// The bound on one store call.
    pub fn store_timeout(&self) -> Duration {
        self.engine.core.timeout
    }

    /// What a check gets when the store fails.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.engine.core.failure
    }

    /// Whether the limiter is in shadow mode (see
    /// [`RateLimiterBuilder::shadow`](super::RateLimiterBuilder::shadow)).
    pub fn is_shadow(&self) -> bool {
        self.engine.shadow()
    }
}
