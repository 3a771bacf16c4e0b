//! The Lua side shared by every script: the reply shape, the batch form, and what a custom
//! algorithm provides to run in a store that runs scripts ([`RedisStore`](crate::RedisStore)).

use redis::Script;

use crate::{Error, Outcome};

/// A custom algorithm's Lua implementation, for [`Rule::Script`](crate::Rule::Script).
///
/// The script must be atomic (one script call decides), read the clock with `TIME` unless
/// `ARGV[1]` carries an explicit time (`''` otherwise), set an expiry on every key it writes,
/// declare every key it touches in `KEYS`, and, to use the default reply parsing, answer
/// `{allowed (0|1), remaining, retry_after_us (-1 = never), reset_after_us}`.
///
/// ```
/// use std::{sync::LazyLock, time::Duration};
/// use tower_redis_ratelimit::{redis::Script, Algorithm, Rule, Scripted};
///
/// /// A fixed window: at most 10 per window of 60 s (the key expires with its window).
/// struct FixedWindow;
///
/// static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(r"
///     local n = redis.call('INCRBY', KEYS[1], ARGV[2])
///     if n == tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], 60000) end
///     local ttl = redis.call('PTTL', KEYS[1]) * 1000
///     if n > 10 then
///       redis.call('DECRBY', KEYS[1], ARGV[2])
///       return { 0, math.max(0, 10 - n + tonumber(ARGV[2])), ttl, ttl }
///     end
///     return { 1, 10 - n, 0, ttl }
/// "));
///
/// impl Scripted for FixedWindow {
///     fn script(&self) -> &Script { &SCRIPT }
///     fn keys(&self, base: &str) -> Vec<String> { vec![format!("{base}:fw")] }
///     fn args(&self, cost: u32) -> Vec<u64> { vec![u64::from(cost)] }
/// }
///
/// impl Algorithm for FixedWindow {
///     fn name(&self) -> &'static str { "fixed-window" }
///     fn quota(&self) -> u64 { 10 }
///     fn window(&self) -> Duration { Duration::from_secs(60) }
///     fn rule(&self) -> Rule<'_> { Rule::Script(self) }
/// }
/// ```
pub trait Scripted: Send + Sync {
    /// The script deciding one check. It is run with `EVALSHA`, falling back to loading it.
    fn script(&self) -> &Script;

    /// The same script in batch form (see [`batch_script`]), deciding several checks in one
    /// call. A [`RedisStore`](crate::RedisStore) with batching on sends concurrent checks
    /// together through it; `None` (the default) sends each check alone.
    fn batch_script(&self) -> Option<&'static Script> {
        None
    }

    /// The Redis keys of one check, derived from the limiter's base key (which carries a hash
    /// tag, so keys derived by appending a suffix share one cluster slot).
    fn keys(&self, base: &str) -> Vec<String>;

    /// The script's arguments after `ARGV[1]` (the explicit time or `''`), for a check of
    /// `cost`.
    fn args(&self, cost: u32) -> Vec<u64>;

    /// Reads the script's reply; the default reads the shared shape (see
    /// [`Outcome::from_redis`]).
    fn parse_reply(&self, reply: redis::Value) -> Result<Outcome, Error> {
        Outcome::from_redis(reply)
    }
}

/// Wraps a one-check script into its batch form, for [`Scripted::batch_script`].
///
/// `source` is a script as [`Scripted::script`] runs it: it reads only `KEYS` and `ARGV`
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
        include_str!("../lua/batch.lua")
    ))
}
