//! Rate-limiting algorithms: what a decision is, its parameters, and an in-memory twin.
//!
//! Each built-in algorithm has a Lua implementation that the [`RedisStore`](crate::RedisStore)
//! runs atomically (its wire format lives with the Redis store), and an in-memory twin that
//! makes exactly the same decisions, used by [`MemoryStore`](crate::MemoryStore). A store
//! learns what to run from [`Algorithm::rule`]: the algorithms know no store. Choosing one is
//! in the guide, [Choosing an algorithm](crate::guide::algorithms).
//!
//! | algorithm | state per key | pick it when |
//! |---|---|---|
//! | [`Gcra`] | one integer | the default: smooth rate with a burst, cheapest in Redis |
//! | [`TokenBucket`] | a two-field hash | the same decisions as GCRA, state readable as "tokens left" |
//! | [`SlidingWindow`] | one log entry per admitted request | an exact "at most N in any window" contract, e.g. a third-party API quota |
//! | [`FixedWindow`] | one counter | long quotas and calendar plans (a week, a month, a year) |
//!
//! ```
//! use tower_redis_ratelimit::{Gcra, Quota, SlidingWindow, TokenBucket};
//!
//! let gcra = Gcra::new(Quota::per_minute(100).burst(20))?;
//! let bucket = TokenBucket::new(Quota::per_second(10))?;
//! let window = SlidingWindow::new(Quota::per_minute(300))?;
//! # Ok::<(), tower_redis_ratelimit::ConfigError>(())
//! ```

mod bucket;
mod fixed_window;
pub(crate) mod gcra;
mod held;
mod multi;
mod outcome;
mod rate;
mod scripted;
mod settle;
mod sliding_window;
mod state;
pub(crate) mod token_bucket;

pub use self::{
    fixed_window::{Calendar, FixedWindow},
    gcra::Gcra,
    multi::{LimitCost, MultiLimit},
    outcome::{Outcome, PartInfo, PartOutcome},
    scripted::Scripted,
    sliding_window::SlidingWindow,
    state::MemoryState,
    token_bucket::TokenBucket,
};
pub(crate) use self::{
    held::Placed,
    outcome::{LogEntry, Position},
    rate::BucketRate,
    settle::Change,
};
pub use crate::quota::Quota;

use std::{fmt, num::NonZeroU32, sync::Arc, time::Duration};

use crate::{
    decision::Charge,
    error::{ConfigError, Error},
};

/// A rate-limiting algorithm: its parameters (for the headers and for stores) and its
/// in-memory twin.
///
/// The built-ins are [`Gcra`], [`TokenBucket`], [`SlidingWindow`] and [`MultiLimit`]. For a
/// custom algorithm, return [`Rule::script`] with its Lua implementation (see [`Scripted`])
/// and, to run it in a [`MemoryStore`](crate::MemoryStore), implement
/// [`decide`](Self::decide).
pub trait Algorithm: Send + Sync + 'static {
    /// A short name for logs, e.g. `"gcra"`.
    fn name(&self) -> &'static str;

    /// Units a fully rested key has (`q` in `RateLimit-Policy`).
    fn quota(&self) -> u64;

    /// Time in which the full quota is restored (`w` in `RateLimit-Policy`).
    fn window(&self) -> Duration;

    /// For algorithms deciding several limits at once: each limit's name, quota and window, in
    /// the order of [`Outcome::parts`]. Empty (the default) for a single limit.
    fn parts(&self) -> &[PartInfo] {
        &[]
    }

    /// What a store must run to decide a check.
    fn rule(&self) -> Rule<'_>;

    /// The in-memory twin: decides one check at `now_us` (microseconds) on this key's state,
    /// exactly as the store-side implementation would.
    ///
    /// The default returns [`Error::Unsupported`].
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] by default (an algorithm with no in-memory twin); an
    /// implementation's own error, e.g. [`Error::WrongType`] for a state another algorithm
    /// wrote.
    fn decide(&self, state: &mut MemoryState, now_us: u64, cost: u32) -> Result<Outcome, Error> {
        let _ = (state, now_us, cost);
        Err(Error::Unsupported(
            "this algorithm has no in-memory implementation",
        ))
    }

    /// The in-memory twin of a refund: gives back on this key's state what an allowed check
    /// took (`charge`) and still holds at `now_us`, exactly as the store-side refund does.
    /// `Ok(false)` when there was nothing to give back (the state expired, the entry is gone,
    /// or the charge has drained).
    ///
    /// The default returns [`Error::Unsupported`]; the built-in algorithms all refund, in
    /// Redis and in memory.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] by default (an algorithm that cannot give units back); an
    /// implementation's own error, e.g. [`Error::WrongType`] for a state another algorithm
    /// wrote.
    fn refund(&self, state: &mut MemoryState, now_us: u64, charge: &Charge) -> Result<bool, Error> {
        let _ = (state, now_us, charge);
        Err(Error::Unsupported("this algorithm cannot give units back"))
    }

    /// The in-memory twin of a settlement: the charge of an allowed check (`charge`, its
    /// estimate) settled at `now_us` to the `actual` units the request used, exactly as the
    /// store-side settlement does. Below the charge, the difference is given back, but at most
    /// what the charge still holds (the rule of [`refund`](Self::refund)); above it, the
    /// difference is charged at `now_us` whatever the limit: a debt that the key's next checks
    /// wait out. `Ok(true)` when the key's state changed.
    ///
    /// The default returns [`Error::Unsupported`]; GCRA, the token bucket, the sliding window
    /// and the fixed window settle, in Redis and in memory.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] by default (an algorithm that cannot settle a charge); an
    /// implementation's own error, e.g. [`Error::WrongType`] for a state another algorithm
    /// wrote.
    fn settle(
        &self,
        state: &mut MemoryState,
        now_us: u64,
        charge: &Charge,
        actual: u32,
    ) -> Result<bool, Error> {
        let _ = (state, now_us, charge, actual);
        Err(Error::Unsupported("this algorithm cannot settle a charge"))
    }

    /// This algorithm with its quota divided among `instances` processes, for
    /// [`FailurePolicy::Local`](crate::FailurePolicy::Local): each process then decides alone
    /// with its share, and the fleet stays near the global quota. Shares are rounded down, but
    /// never below one unit. `None` (the default) when the algorithm cannot be divided.
    fn local_share(&self, instances: NonZeroU32) -> Option<Arc<dyn Algorithm>> {
        let _ = instances;
        None
    }

    /// The same algorithm with another quota, validated as at construction: for quotas
    /// decided per request ([`RateLimiter::check_with_quota`](crate::RateLimiter::check_with_quota),
    /// [`RateLimitLayer::quota_fn`](crate::RateLimitLayer::quota_fn)). The key's state stays
    /// the same, read under the new quota (see
    /// [Quotas per request](crate::guide::operating#quotas-per-request) in the guide).
    ///
    /// The default is a [`ConfigError`] naming `quota`: an algorithm with no single quota
    /// to replace ([`MultiLimit`], a custom one) does not take one per request.
    ///
    /// # Errors
    ///
    /// By default a [`ConfigError`] naming `quota`; for the built-in algorithms, a quota that
    /// does not build the algorithm, naming the quota's field.
    fn with_quota(&self, quota: Quota) -> Result<Box<dyn Algorithm>, ConfigError> {
        let _ = quota;
        Err(ConfigError::new(
            "quota",
            format!("{} does not take a quota per request", self.name()),
        ))
    }
}

/// What a store runs to decide a check: a built-in algorithm, or a custom script.
///
/// Opaque: the built-ins' parameters are theirs and their stores' business. A custom
/// algorithm returns [`Rule::script`] with its Lua implementation (see [`Scripted`]).
#[derive(Clone, Copy)]
pub struct Rule<'a>(Kind<'a>);

/// Which algorithm a [`Rule`] runs: each built-in by reference (its in-memory twin and its
/// Redis calls are implemented on its type, in its own files), or a custom script.
#[derive(Clone, Copy)]
pub(crate) enum Kind<'a> {
    Gcra(&'a Gcra),
    TokenBucket(&'a TokenBucket),
    SlidingWindow(&'a SlidingWindow),
    FixedWindow(&'a FixedWindow),
    /// One GCRA per limit, in the order of [`Algorithm::parts`].
    Multi(&'a MultiLimit),
    Script(&'a dyn Scripted),
}

impl<'a> Rule<'a> {
    /// A custom algorithm's rule: its Lua implementation.
    ///
    /// ```
    /// use tower_redis_ratelimit::algorithm::{Rule, Scripted};
    ///
    /// struct Once;
    /// impl Scripted for Once {
    ///     fn source(&self) -> &'static str { "return { 1, 0, 0, 0 }" }
    ///     fn key_suffixes(&self) -> &[&'static str] { &[] }
    ///     fn args(&self, _cost: u32) -> Vec<u64> { Vec::new() }
    /// }
    /// let rule = Rule::script(&Once);
    /// ```
    pub fn script(script: &'a dyn Scripted) -> Self {
        Self(Kind::Script(script))
    }

    pub(crate) const fn builtin(kind: Kind<'a>) -> Self {
        Self(kind)
    }

    /// Which algorithm this runs.
    pub(crate) const fn kind(self) -> Kind<'a> {
        self.0
    }

    /// Whether this is a custom script (whose checks read no ban).
    pub(crate) const fn is_script(self) -> bool {
        matches!(self.0, Kind::Script(_))
    }

    /// Whether a charge of this algorithm can be settled after the fact
    /// ([`Algorithm::settle`]): GCRA, the token bucket, the two windows and budgets
    /// ([`MultiLimit::budgets`]).
    pub(crate) const fn settles(self) -> bool {
        match self.0 {
            Kind::Gcra(_)
            | Kind::TokenBucket(_)
            | Kind::SlidingWindow(_)
            | Kind::FixedWindow(_) => true,
            Kind::Multi(m) => m.settles(),
            Kind::Script(_) => false,
        }
    }

    /// The bucket rate of GCRA or the token bucket; `None` for any other algorithm.
    pub(crate) fn bucket_rate(self) -> Option<BucketRate> {
        match self.0 {
            Kind::Gcra(g) => Some(g.rate()),
            Kind::TokenBucket(t) => Some(t.rate()),
            Kind::SlidingWindow(_) | Kind::FixedWindow(_) | Kind::Multi(_) | Kind::Script(_) => {
                None
            }
        }
    }

    /// The in-memory twin's reads and resets; `None` for a custom script.
    pub(crate) fn twin(self) -> Option<&'a dyn Twin> {
        match self.0 {
            Kind::Gcra(g) => Some(g),
            Kind::TokenBucket(t) => Some(t),
            Kind::SlidingWindow(w) => Some(w),
            Kind::FixedWindow(w) => Some(w),
            Kind::Multi(m) => Some(m),
            Kind::Script(_) => None,
        }
    }
}

impl fmt::Debug for Rule<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Kind::Gcra(g) => f.debug_tuple("Gcra").field(&g.rate()).finish(),
            Kind::TokenBucket(t) => f.debug_tuple("TokenBucket").field(&t.rate()).finish(),
            Kind::SlidingWindow(w) => f.debug_tuple("SlidingWindow").field(&w.rate()).finish(),
            Kind::FixedWindow(w) => f.debug_tuple("FixedWindow").field(w).finish(),
            Kind::Multi(m) => f
                .debug_tuple("Multi")
                .field(&m.rates())
                .field(&m.costs(0).collect::<Vec<_>>())
                .field(&m.settles())
                .finish(),
            // The source's digest tells scripts apart (limiters on one namespace with two
            // scripts are two policies).
            Kind::Script(s) => f
                .debug_struct("Script")
                .field(
                    "sha1",
                    &sha1_smol::Sha1::from(s.source()).digest().to_string(),
                )
                .field("key_suffixes", &s.key_suffixes())
                .finish(),
        }
    }
}

/// A built-in algorithm's in-memory twin beyond [`Algorithm::decide`] and
/// [`Algorithm::refund`]: a read without a check, and what a reset leaves. Each built-in
/// implements it beside its `decide`.
pub(crate) trait Twin {
    /// The state as a check at `now_us` would see it, spending nothing: the same arithmetic
    /// as a check of a cost no limit can fit (which never writes), so its numbers are the
    /// next check's. `remaining` and `reset_after_us` are what a check of cost 0 would show;
    /// the outcome is a denial.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] for a state another algorithm wrote.
    fn peek(&self, state: &mut MemoryState, now_us: u64) -> Result<Outcome, Error>;

    /// What a reset leaves of a key's state (the twin of `lua/reset.lua`).
    fn reset(&self) -> Reset;
}

/// What a reset leaves of a key's state.
pub(crate) enum Reset {
    /// The state goes; each limit's refund ledger becomes a floor just after now, kept as
    /// long as a charge admitted before may hold part of that limit's time (its lead).
    Floors(Vec<u64>),
    /// The log empties, keeping its newest time and last sequence number, so that no entry
    /// written after bears the name of one written before.
    EmptyLog,
    /// The window's count goes to zero under a new id, so that a refund of a check admitted
    /// before gives nothing back.
    Window,
}

/// Never holds more than a check of this cost can: the cost a peek checks.
pub(crate) const NEVER: u64 = u64::MAX;

/// The state of a key under `algorithm` as a check at `now_us` would see it, spending
/// nothing (see [`Twin::peek`]); [`Error::Unsupported`] for a custom algorithm.
pub(crate) fn peek(
    algorithm: &dyn Algorithm,
    state: &mut MemoryState,
    now_us: u64,
) -> Result<Outcome, Error> {
    match algorithm.rule().twin() {
        Some(twin) => twin.peek(state, now_us),
        None => Err(Error::Unsupported(
            "a custom algorithm cannot be read without a check",
        )),
    }
}

/// A shared algorithm is an algorithm: lets an algorithm be chosen at run time
/// (`Arc<dyn Algorithm>`), e.g. from configuration.
///
/// ```
/// use std::sync::Arc;
/// use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter, SlidingWindow, algorithm::Algorithm};
///
/// # fn run(exact: bool) -> Result<(), tower_redis_ratelimit::ConfigError> {
/// let quota = Quota::per_minute(100);
/// let algorithm: Arc<dyn Algorithm> = if exact {
///     Arc::new(SlidingWindow::new(quota)?)
/// } else {
///     Arc::new(Gcra::new(quota)?)
/// };
/// let limiter = RateLimiter::builder(MemoryStore::new(), algorithm).build()?;
/// # Ok(()) }
/// ```
impl<T: Algorithm + ?Sized> Algorithm for Arc<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn quota(&self) -> u64 {
        (**self).quota()
    }

    fn window(&self) -> Duration {
        (**self).window()
    }

    fn parts(&self) -> &[PartInfo] {
        (**self).parts()
    }

    fn rule(&self) -> Rule<'_> {
        (**self).rule()
    }

    fn decide(&self, state: &mut MemoryState, now_us: u64, cost: u32) -> Result<Outcome, Error> {
        (**self).decide(state, now_us, cost)
    }

    fn refund(&self, state: &mut MemoryState, now_us: u64, charge: &Charge) -> Result<bool, Error> {
        (**self).refund(state, now_us, charge)
    }

    fn settle(
        &self,
        state: &mut MemoryState,
        now_us: u64,
        charge: &Charge,
        actual: u32,
    ) -> Result<bool, Error> {
        (**self).settle(state, now_us, charge, actual)
    }

    fn local_share(&self, instances: NonZeroU32) -> Option<Arc<dyn Algorithm>> {
        (**self).local_share(instances)
    }

    fn with_quota(&self, quota: Quota) -> Result<Box<dyn Algorithm>, ConfigError> {
        (**self).with_quota(quota)
    }
}
