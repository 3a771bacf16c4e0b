//! What a custom algorithm gives a store that runs Lua scripts
//! ([`RedisStore`](crate::RedisStore)): its source, its keys and arguments, and how its reply
//! reads. No Redis types: the store loads and runs the script.

use super::outcome::Outcome;
use crate::error::Error;

/// A custom algorithm's Lua implementation, for [`Rule::script`](super::Rule::script).
///
/// The store runs [`source`](Self::source) as one script call per check (by its SHA-1, loading
/// it again when the server lost it). The script must be atomic (one call decides), read the
/// clock with `TIME` unless `ARGV[1]` carries an explicit time (`''` otherwise), set an expiry
/// on every key it writes, touch only the keys it is given in `KEYS`, define no globals, and
/// answer an array of integers; to use the default [`parse_reply`](Self::parse_reply), the
/// shared shape `{allowed (0|1), remaining, retry_after_us (-1 = never), reset_after_us}`.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::algorithm::{Algorithm, Rule, Scripted};
///
/// /// A fixed window: at most 10 per window of 60 s (the key expires with its window).
/// struct FixedWindow;
///
/// impl Scripted for FixedWindow {
///     fn source(&self) -> &'static str {
///         r"
///         local n = redis.call('INCRBY', KEYS[1], ARGV[2])
///         if n == tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], 60000) end
///         local ttl = redis.call('PTTL', KEYS[1]) * 1000
///         if n > 10 then
///           redis.call('DECRBY', KEYS[1], ARGV[2])
///           return { 0, math.max(0, 10 - n + tonumber(ARGV[2])), ttl, ttl }
///         end
///         return { 1, 10 - n, 0, ttl }
///         "
///     }
///     fn key_suffixes(&self) -> &[&'static str] { &[":fw"] }
///     fn args(&self, cost: u32) -> Vec<u64> { vec![u64::from(cost)] }
///     // Concurrent checks may share one script call (see `RedisStore::with_batching`).
///     fn batchable(&self) -> bool { true }
/// }
///
/// impl Algorithm for FixedWindow {
///     fn name(&self) -> &'static str { "fixed-window" }
///     fn quota(&self) -> u64 { 10 }
///     fn window(&self) -> Duration { Duration::from_secs(60) }
///     fn rule(&self) -> Rule<'_> { Rule::script(self) }
/// }
/// ```
pub trait Scripted: Send + Sync {
    /// The Lua source deciding one check. A store builds (and hashes) its script once per
    /// source, so return the same `&'static str` every time (a literal, a `static`).
    fn source(&self) -> &'static str;

    /// The script's keys, each the check's base key followed by one of these suffixes, in
    /// order (e.g. `[":fw"]`). The base key carries the check's hash tag, so all of a check's
    /// keys land on one Redis Cluster slot.
    fn key_suffixes(&self) -> &[&'static str];

    /// The script's arguments after `ARGV[1]` (the explicit time or `''`), for a check of
    /// `cost`.
    fn args(&self, cost: u32) -> Vec<u64>;

    /// Whether concurrent checks may share one script call, when the store batches
    /// ([`RedisStore::with_batching`](crate::RedisStore::with_batching)): the store then runs
    /// the source once per check, in order, inside one atomic call, with one clock reading
    /// shared by all (the script must read only `KEYS` and `ARGV`, define no globals, and
    /// return its reply). A check whose script raises an error, or returns something other
    /// than an array, fails alone. `false` (the default): each check is sent alone.
    fn batchable(&self) -> bool {
        false
    }

    /// Reads the script's reply, an array of integers; the default reads the shared shape
    /// (see [`Outcome::from_ints`]). A reply that is not an array of integers is an
    /// [`Error::InvalidReply`] before this is called.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidReply`] when the reply is not of the shape this reads (by default, the
    /// one [`Outcome::from_ints`] reads).
    fn parse_reply(&self, reply: &[i64]) -> Result<Outcome, Error> {
        Outcome::from_ints(reply)
    }
}
