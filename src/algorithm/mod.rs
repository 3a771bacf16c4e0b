//! Rate-limiting algorithms.
//!
//! Each algorithm is one Lua script (in `lua/`, run atomically in Redis) and an in-memory twin
//! that makes exactly the same decisions, used by [`MemoryStore`](crate::MemoryStore).
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

/// The script in `lua/$file` with the shared prelude prepended, built (and its SHA-1
/// computed) once.
macro_rules! lua_script {
    ($file:literal) => {{
        static SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
            redis::Script::new(concat!(
                include_str!("../../lua/prelude.lua"),
                include_str!(concat!("../../lua/", $file))
            ))
        });
        &SCRIPT
    }};
    // A script that does without the prelude.
    ($file:literal, standalone) => {{
        static SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
            redis::Script::new(include_str!(concat!("../../lua/", $file)))
        });
        &SCRIPT
    }};
}

/// The batch form of `lua/$file` (see [`batch_script`]), built once. The prelude's functions
/// are defined once per call, outside the per-check function.
macro_rules! lua_batch_script {
    ($file:literal) => {{
        static SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
            crate::algorithm::batch_form(
                include_str!("../../lua/prelude.lua"),
                include_str!(concat!("../../lua/", $file)),
            )
        });
        Some(&*SCRIPT)
    }};
    ($file:literal, standalone) => {{
        static SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
            crate::algorithm::batch_form("", include_str!(concat!("../../lua/", $file)))
        });
        Some(&*SCRIPT)
    }};
}

/// Wraps a one-check script into its batch form, for [`Algorithm::batch_script`].
///
/// `source` is a script as [`Algorithm::script`] runs it: it reads only `KEYS` and `ARGV`
/// (with `ARGV[1]` the explicit time or `''`), defines no globals, and returns its reply. The
/// batch form runs it once per check, in order, inside one atomic call, with one clock reading
/// shared by all, and answers an array of the single replies (an error entry for a check
/// that raised one).
///
/// ```
/// use std::sync::LazyLock;
/// use tower_redis_ratelimit::{batch_script, redis::Script};
///
/// const SOURCE: &str = "local n = redis.call('INCRBY', KEYS[1], ARGV[2]) return { n }";
/// static BATCH: LazyLock<Script> = LazyLock::new(|| batch_script(SOURCE));
/// assert_ne!(BATCH.get_hash(), Script::new(SOURCE).get_hash());
/// ```
pub fn batch_script(source: &str) -> Script {
    batch_form("", source)
}

/// `KEYS` and `ARGV` become locals that the driver points at each check's slice in turn; code
/// in `shared` (defined once) and in `body` (run once per check) both see the current check's.
pub(crate) fn batch_form(shared: &str, body: &str) -> Script {
    Script::new(&format!(
        "local KEYS, ARGV = KEYS, ARGV\n{shared}\nlocal function decide()\n{body}\nend\n{}",
        include_str!("../../lua/batch.lua")
    ))
}

mod gcra;
mod multi;
mod sliding_window;
mod token_bucket;

pub use gcra::Gcra;
pub use multi::MultiLimit;
pub use sliding_window::SlidingWindow;
pub use token_bucket::TokenBucket;

use std::{any::Any, num::NonZeroU32, time::Duration};

use redis::Script;

use crate::{decision::PartInfo, Error, Outcome};

/// A rate-limiting algorithm: a Redis script, how to call it, and an in-memory twin.
///
/// Implement it for a custom algorithm; the built-ins are [`Gcra`], [`TokenBucket`] and
/// [`SlidingWindow`]. The script must be atomic (one script call decides), read the clock with
/// `TIME` unless `ARGV[1]` carries an explicit time, set an expiry on every key it writes, and
/// declare every key it touches in `KEYS`.
pub trait Algorithm: Send + Sync + 'static {
    /// A short name for logs, e.g. `"gcra"`.
    fn name(&self) -> &'static str;

    /// Units a fully rested key has (`q` in `RateLimit-Policy`).
    fn quota(&self) -> u64;

    /// Time in which the full quota is restored (`w` in `RateLimit-Policy`).
    fn window(&self) -> Duration;

    /// The script deciding one check. It is run with `EVALSHA`, falling back to loading it.
    fn script(&self) -> &Script;

    /// The same script in batch form (see [`batch_script`]), deciding several checks in one
    /// call. A [`RedisStore`](crate::RedisStore) with batching on sends concurrent checks of
    /// this algorithm together through it; `None` (the default) sends each check alone.
    fn batch_script(&self) -> Option<&'static Script> {
        None
    }

    /// The Redis keys of one check, derived from the limiter's base key (which carries a hash
    /// tag, so keys derived by appending a suffix share one cluster slot).
    fn redis_keys(&self, base: &str) -> Vec<String>;

    /// For algorithms deciding several limits at once: each limit's name, quota and window, in
    /// the order of [`Outcome::parts`]. Empty (the default) for a single limit.
    fn parts(&self) -> &[PartInfo] {
        &[]
    }

    /// The script's arguments after `ARGV[1]` (the explicit time or `''`), for a check of `cost`.
    fn script_args(&self, cost: u32) -> Vec<u64>;

    /// Reads the script's reply. The default reads the shared shape (see [`Outcome::from_redis`]).
    fn parse_reply(&self, reply: redis::Value) -> Result<Outcome, Error> {
        Outcome::from_redis(reply)
    }

    /// This algorithm with its quota divided among `instances` processes, for
    /// [`FailurePolicy::Local`](crate::FailurePolicy::Local): each process then decides alone
    /// with its share, and the fleet stays near the global quota. Shares are rounded down, but
    /// never below one unit. `None` (the default) when the algorithm cannot be divided.
    fn local_share(&self, instances: NonZeroU32) -> Option<Self>
    where
        Self: Sized,
    {
        let _ = instances;
        None
    }

    /// Decides one check in memory, at time `now_us` (microseconds), on this key's state.
    ///
    /// The default returns [`Error::Unsupported`].
    fn check_in_memory(
        &self,
        state: &mut MemoryState,
        now_us: u64,
        cost: u32,
    ) -> Result<Outcome, Error> {
        let _ = (state, now_us, cost);
        Err(Error::Unsupported(
            "this algorithm has no in-memory implementation",
        ))
    }
}

/// One key's state in a [`MemoryStore`](crate::MemoryStore), with its expiry.
///
/// Like a Redis key, it holds a value of one type or nothing, and it expires: an algorithm
/// stores its state with [`MemoryState::put`] and a time to live, and finds nothing after that.
#[derive(Debug, Default)]
pub struct MemoryState {
    value: Option<Box<dyn Any + Send>>,
    expires_at_us: u64,
    /// Log entries the value holds (a sliding-window log), for the store's memory bound.
    entries: usize,
}

impl MemoryState {
    /// The stored value, if any; an error if a value of another type is stored under this key
    /// (two algorithms sharing a key prefix), like Redis' `WRONGTYPE`.
    pub fn get_mut<T: Any + Send>(&mut self) -> Result<Option<&mut T>, Error> {
        match self.value.as_mut() {
            None => Ok(None),
            Some(v) => v.downcast_mut::<T>().map(Some).ok_or(Error::InvalidReply(
                "key holds another algorithm's state".to_owned(),
            )),
        }
    }

    /// Stores `value` until `now_us + ttl_us`.
    pub fn put<T: Any + Send>(&mut self, value: T, now_us: u64, ttl_us: u64) {
        // Overwrite in place when the key already holds a `T`: no allocation per check.
        match self.value.as_mut().and_then(|v| v.downcast_mut::<T>()) {
            Some(slot) => *slot = value,
            None => self.value = Some(Box::new(value)),
        }
        self.expires_at_us = now_us.saturating_add(ttl_us);
    }

    /// Clears the value if it expired at or before `now_us`.
    pub(crate) fn expire(&mut self, now_us: u64) {
        if self.value.is_some() && self.expires_at_us <= now_us {
            self.value = None;
            self.entries = 0;
        }
    }

    /// Log entries the stored value holds (0 unless an algorithm says otherwise).
    pub(crate) fn entries(&self) -> usize {
        self.entries
    }

    /// Records how many log entries the stored value holds.
    pub(crate) fn set_entries(&mut self, entries: usize) {
        self.entries = entries;
    }

    pub(crate) fn expires_at(&self) -> u64 {
        self.expires_at_us
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.value.is_none()
    }
}

/// `quota` with its limit and burst divided by `instances`, rounded down, at least 1.
pub(crate) fn divided(quota: crate::Quota, instances: NonZeroU32) -> crate::Quota {
    let share = |units: u32| (units / instances.get()).max(1);
    let q = crate::Quota::new(share(quota.limit()), quota.period());
    match quota.explicit_burst() {
        Some(b) => q.burst(share(b)),
        None => q,
    }
}
