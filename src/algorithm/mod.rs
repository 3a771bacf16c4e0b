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
pub(crate) mod gcra;
mod held;
mod multi;
mod outcome;
mod peek;
mod rate;
mod scripted;
mod sliding_window;
mod state;
mod token_bucket;

pub use self::{
    gcra::Gcra,
    multi::MultiLimit,
    outcome::{Outcome, PartInfo, PartOutcome},
    rate::{BucketRate, WindowRate},
    scripted::Scripted,
    sliding_window::SlidingWindow,
    state::MemoryState,
    token_bucket::TokenBucket,
};
pub(crate) use self::{
    held::Placed,
    outcome::{LogEntry, Position},
    peek::peek,
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
/// custom algorithm, return [`Rule::Script`] with its Lua implementation (see [`Scripted`])
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

/// What a store runs to decide a check: a built-in algorithm with its validated parameters,
/// or a custom script.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub enum Rule<'a> {
    /// [`Gcra`].
    Gcra(BucketRate),
    /// [`TokenBucket`].
    TokenBucket(BucketRate),
    /// [`SlidingWindow`].
    SlidingWindow(WindowRate),
    /// [`MultiLimit`]: one GCRA per limit, in the order of [`Algorithm::parts`].
    Multi(&'a [BucketRate]),
    /// A custom algorithm's Lua implementation (see [`Scripted`]).
    Script(&'a dyn Scripted),
}

impl fmt::Debug for Rule<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Gcra(r) => f.debug_tuple("Gcra").field(r).finish(),
            Rule::TokenBucket(r) => f.debug_tuple("TokenBucket").field(r).finish(),
            Rule::SlidingWindow(r) => f.debug_tuple("SlidingWindow").field(r).finish(),
            Rule::Multi(r) => f.debug_tuple("Multi").field(r).finish(),
            // The source's digest tells scripts apart (limiters on one namespace with two
            // scripts are two policies).
            Rule::Script(s) => f
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

    fn local_share(&self, instances: NonZeroU32) -> Option<Arc<dyn Algorithm>> {
        (**self).local_share(instances)
    }

    fn with_quota(&self, quota: Quota) -> Result<Box<dyn Algorithm>, ConfigError> {
        (**self).with_quota(quota)
    }
}
