//! Each algorithm's Lua wire format: which script decides a check, refunds, reads, resets,
//! reserves or schedules, its keys, its arguments, and how its reply reads. Each built-in
//! algorithm has one file here implementing [`Calls`]; a custom script's is `custom.rs`.
//!
//! The scripts live in `lua/`. GCRA's check (`gcra.lua`) and its batch form (`gcra_batch.lua`)
//! stand alone and take the least a check needs (see `gcra::check_args`); GCRA's reservation
//! and the multi-limit (`gcra_reserve.lua`, `multi_gcra.lua`) follow the GCRA core,
//! `gcra_core.lua`; the other scripts follow `prelude.lua`. All but GCRA get their batch form
//! from `batch.lua`. Every script but GCRA's check takes the time, then the cost, then the
//! algorithm's parameters, then what the call adds.
//! Keys derive from the check's base key by a suffix (see `keys.rs`), so every key of one
//! check carries the base key's hash tag and lands on one cluster slot.

mod custom;
mod fixed_window;
mod gcra;
mod multi;
mod sliding_window;
mod token_bucket;

use std::sync::LazyLock;

use redis::Script;

use super::{
    batch::{batch_form, Layout},
    keys,
    link::{evalsha_keys, evalsha_sized},
    reply,
};
use crate::{
    algorithm::{Outcome, PartInfo, PartOutcome},
    decision::Charge,
    error::Error,
    extract::Out,
    store::{KeyBuf, Pace, Peeked, StoreKey},
    unique_id,
};

/// One algorithm's calls to Redis, implemented on a reference to the algorithm (a built-in's
/// type, or a custom script), so that every call borrows what it needs for as long as the
/// algorithm lives. `on!` picks the implementation of a rule.
pub(crate) trait Calls<'a>: Copy {
    /// A check of `cost` (at least 1).
    fn check(self, cost: u32) -> ScriptCall<'a>;

    /// Reads a check's reply.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidReply`] for a reply no check of `cost` can give.
    fn parse(self, cost: u32, reply: redis::Value) -> Result<Outcome, Error>;

    /// A refund of `charge`: `Ok(None)` when there is nothing to give back (a charge not
    /// placed on the key's time, or without its log entry).
    ///
    /// `resendable`: the connection may send the call again after it ran (the cluster client
    /// does, after a cut connection); a refund that a second run would repeat then carries a
    /// marker key (see `first_run` in `lua/prelude.lua`).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for an algorithm that cannot give units back.
    fn refund(self, charge: &Charge, resendable: bool) -> Result<Option<ScriptCall<'a>>, Error>;

    /// A settlement of `charge` to `actual` units (its reply: [`parse_refund`], 1 when the
    /// state changed): `Ok(None)` when there is nothing to do (the figure is the charge, or
    /// below it for a charge the store did not place). `resendable` as for a refund: a
    /// settlement that a second run would repeat carries a marker key then.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for an algorithm that cannot settle a charge.
    fn settle(
        self,
        charge: &Charge,
        actual: u32,
        resendable: bool,
    ) -> Result<Option<ScriptCall<'a>>, Error>;

    /// A read of the key without a check (its reply: [`parse_peek`]).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for an algorithm that cannot be read without a check.
    fn peek(self) -> Result<ScriptCall<'a>, Error>;

    /// What a reset of the key sends.
    fn reset(self) -> ResetCall<'a>;

    /// A reservation of up to `up_to` units, at least `cost` (its reply:
    /// [`super::reserve::parse`]).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for an algorithm that cannot be leased.
    fn reserve(self, cost: u32, up_to: u32) -> Result<ScriptCall<'a>, Error>;

    /// A place of `cost` units in the key's time, paced by `pace`, within `budget_us` (its reply:
    /// [`super::reserve::parse_schedule`]).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for an algorithm that cannot schedule; [`Error::InvalidInput`]
    /// for a cost of 0.
    fn schedule(self, cost: u32, budget_us: u64, pace: Pace) -> Result<ScriptCall<'a>, Error>;
}

/// Calls `$method` of the [`Calls`] of `$algorithm`'s rule with these arguments: the one place
/// that matches on the built-in algorithms.
macro_rules! on {
    ($algorithm:expr, $method:ident($($arg:expr),*)) => {{
        use $crate::{algorithm::Kind, store::redis::algorithms::Calls};
        match $algorithm.rule().kind() {
            Kind::Gcra(c) => Calls::$method(c, $($arg),*),
            Kind::TokenBucket(c) => Calls::$method(c, $($arg),*),
            Kind::SlidingWindow(c) => Calls::$method(c, $($arg),*),
            Kind::FixedWindow(c) => Calls::$method(c, $($arg),*),
            Kind::Multi(c) => Calls::$method(c, $($arg),*),
            Kind::Script(c) => Calls::$method(c, $($arg),*),
        }
    }};
}
pub(crate) use on;

/// What a reset sends: a script call (`lua/reset.lua`, whose reply is how many states
/// existed), or, for a custom script, the deletion of its keys.
pub(crate) enum ResetCall<'a> {
    Script(ScriptCall<'a>),
    Delete(&'a [&'a str]),
}

/// A script and its batch form, each built (and hashed) once.
struct Scripts {
    single: LazyLock<Script>,
    batch: LazyLock<Script>,
}

macro_rules! scripts {
    // After the libraries (the prelude, or the GCRA core, and more); the batch form from
    // `batch.lua`.
    ($file:literal, after $($library:literal),+) => {
        Scripts {
            single: ::std::sync::LazyLock::new(|| {
                ::redis::Script::new(concat!(
                    $(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $library)),)+
                    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file))
                ))
            }),
            batch: ::std::sync::LazyLock::new(|| {
                super::batch_form(
                    concat!(
                        $(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $library)),)+
                    ),
                    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file)),
                )
            }),
        }
    };
    // GCRA's check: a batch form of its own, both standing alone.
    ($file:literal, alone, batch: $batch:literal) => {
        Scripts {
            single: ::std::sync::LazyLock::new(|| {
                ::redis::Script::new(include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/lua/",
                    $file
                )))
            }),
            batch: ::std::sync::LazyLock::new(|| {
                ::redis::Script::new(include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/lua/",
                    $batch
                )))
            }),
        }
    };
}
use scripts;

/// A ban, and the deletion of a key's custom state, ban or holders.
pub(crate) static BAN: LazyLock<Script> = prelude_script!("ban.lua", after "gcra_state.lua");
pub(crate) static FORGET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/lua/forget.lua"
    )))
});
/// A limit's marker: the token it holds, set when it holds none (`RateLimiter::notice_reset`).
pub(crate) static MARKER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/lua/store_marker.lua"
    )))
});
/// An instance's top keys published, and every instance's read (`RateLimiter::fleet_top_keys`).
pub(crate) static TOP_PUBLISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/lua/top_publish.lua"
    )))
});
pub(crate) static TOP_READ: LazyLock<Script> = LazyLock::new(|| {
    Script::new(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/lua/top_read.lua"
    )))
});
/// A reset of a key's state under a built-in algorithm: its state goes, and refunds of the
/// checks admitted before it give nothing back. Its arguments: the state's kind (0 a bucket,
/// 1 GCRA, 2 a log, 3 a fixed window), then each limit's lead (how long a charge admitted before now may hold
/// part of its time).
static RESET: LazyLock<Script> = prelude_script!("reset.lua", after "gcra_state.lua");

/// One call of a script: the script, its keys and its arguments.
pub(crate) struct ScriptCall<'a> {
    /// The script.
    pub(crate) script: &'static Script,
    /// Its batch form, when it has one (checks only).
    pub(crate) batch: Option<&'static Script>,
    keys: Keys<'a>,
    args: Args,
    /// A refund's marker key, `:rf:ID` after the state's keys, so that a resent refund gives
    /// nothing back (see `first_run` in `lua/prelude.lua`).
    marker: Option<String>,
    /// Whether the key's ban (`:x`) follows the state's keys: a built-in check but GCRA's (which
    /// reads the ban's copy in its state), a peek, a reservation.
    ban: bool,
    /// How the time goes: `ARGV[1]`, the explicit time or `''` (every script but GCRA's check),
    /// or after the arguments and only when explicit (GCRA's check, see `lua/gcra.lua`).
    time_last: bool,
    /// The arguments' layout in the batch form.
    pub(crate) layout: Layout,
}

/// A call's keys: the base key with suffixes (a built-in's, or a custom algorithm's).
enum Keys<'a> {
    Suffixes(&'a [&'a str]),
    /// `:q:NAME` per limit.
    Parts(&'a [PartInfo]),
    /// `:q:NAME` per limit, then `:qr:NAME` (its refund ledger) per limit.
    PartsAndLedgers(&'a [PartInfo]),
}

/// The arguments after `ARGV[1]` (the explicit time or `''`).
enum Args {
    Three([u64; 3]),
    List(Vec<u64>),
}

impl<'a> ScriptCall<'a> {
    /// A built-in check: its script, its batch form, the key's ban after its keys.
    fn builtin_check(scripts: &'static Scripts, keys: Keys<'a>, args: Args) -> Self {
        Self {
            script: &scripts.single,
            batch: Some(&*scripts.batch),
            keys,
            args,
            marker: None,
            ban: true,
            time_last: false,
            layout: Layout::Generic,
        }
    }

    /// A call never batched, with no ban among its keys.
    fn alone(script: &'static Script, keys: Keys<'a>, args: Vec<u64>) -> Self {
        Self {
            script,
            batch: None,
            keys,
            args: Args::List(args),
            marker: None,
            ban: false,
            time_last: false,
            layout: Layout::Generic,
        }
    }

    /// This call with the key's ban after its keys (a peek, a reservation).
    fn with_ban(self) -> Self {
        Self { ban: true, ..self }
    }

    /// This call with a fresh marker key when the connection may resend it.
    fn marked(self, resendable: bool) -> Self {
        Self {
            marker: resendable.then(unique_id::next),
            ..self
        }
    }

    /// A reset by `lua/reset.lua` of the state `kind` under `keys`, with each limit's lead.
    fn reset(keys: Keys<'a>, args: Vec<u64>) -> ResetCall<'a> {
        ResetCall::Script(Self::alone(&RESET, keys, args))
    }

    /// The `EVALSHA` of this call on `key`, at `now_us` (`None`: the server's clock).
    pub(crate) fn command(&self, key: StoreKey<'_>, now_us: Option<u64>) -> redis::Cmd {
        let write_keys = |cmd: &mut redis::Cmd| {
            self.each_key(key, |k| {
                cmd.arg(k);
            })
        };
        let (keys, args) = (self.key_count(), self.args().len());
        // EVALSHA, the hash, the key count, the keys, the time, the arguments; keys of up to
        // about 80 bytes and arguments of up to 20 digits fit without growing.
        let capacity = (keys + args + 4, 64 + 80 * keys + 20 * args);
        if self.time_last {
            let mut cmd = evalsha_keys(self.script, keys, capacity, write_keys);
            for arg in self.args() {
                cmd.arg(*arg);
            }
            if let Some(now) = now_us {
                cmd.arg(now);
            }
            return cmd;
        }
        let mut cmd = evalsha_sized(self.script, keys, capacity, write_keys, now_us);
        for arg in self.args() {
            cmd.arg(*arg);
        }
        cmd
    }

    /// How many keys the call has.
    pub(crate) fn key_count(&self) -> usize {
        let state = match &self.keys {
            Keys::Suffixes(s) => s.len(),
            Keys::Parts(p) => p.len(),
            Keys::PartsAndLedgers(p) => 2 * p.len(),
        };
        state + usize::from(self.marker.is_some()) + usize::from(self.ban)
    }

    /// Calls `f` with each of the call's keys, in order.
    pub(crate) fn each_key(&self, key: StoreKey<'_>, mut f: impl FnMut(&[u8])) {
        let mut buf = KeyBuf::new();
        match &self.keys {
            Keys::Suffixes(suffixes) => {
                for suffix in *suffixes {
                    buf.clear();
                    keys::write_key(key, suffix, &mut buf);
                    f(buf.as_bytes());
                }
            }
            Keys::Parts(parts) => {
                for p in *parts {
                    buf.clear();
                    keys::write_key(key, keys::LIMIT, &mut buf);
                    buf.put(p.name.as_bytes());
                    f(buf.as_bytes());
                }
            }
            Keys::PartsAndLedgers(parts) => {
                for infix in [keys::LIMIT, keys::LIMIT_LEDGER] {
                    for p in *parts {
                        buf.clear();
                        keys::write_key(key, infix, &mut buf);
                        buf.put(p.name.as_bytes());
                        f(buf.as_bytes());
                    }
                }
            }
        }
        if let Some(marker) = &self.marker {
            buf.clear();
            keys::write_key(key, keys::REFUND_MARKER, &mut buf);
            buf.put(marker.as_bytes());
            f(buf.as_bytes());
        }
        if self.ban {
            buf.clear();
            keys::write_key(key, keys::BAN, &mut buf);
            f(buf.as_bytes());
        }
    }

    /// The arguments after `ARGV[1]`.
    pub(crate) fn args(&self) -> &[u64] {
        match &self.args {
            Args::Three(a) => a,
            Args::List(a) => a,
        }
    }
}

/// The keys of `key` with `suffixes` (a custom script's, which a reset deletes).
pub(crate) fn suffixed_keys(suffixes: &[&str], key: StoreKey<'_>) -> Vec<Vec<u8>> {
    suffixes
        .iter()
        .map(|suffix| {
            let mut buf = KeyBuf::new();
            keys::write_key(key, suffix, &mut buf);
            buf.as_bytes().to_vec()
        })
        .collect()
}

/// A built-in script's answer for a banned key, `{2, 0, left_us, left_us}` (`None`: another
/// answer).
pub(crate) fn parse_banned(reply: &redis::Value) -> Option<Result<Outcome, Error>> {
    use redis::Value::{Array, Int};
    let Array(items) = reply else { return None };
    if !matches!(items.first(), Some(Int(2))) {
        return None;
    }
    Some(match items.as_slice() {
        [_, Int(0), Int(left), Int(reset)] if *left > 0 && left == reset => {
            Ok(Outcome::banned(*left as u64))
        }
        _ => Err(Error::InvalidReply(format!("a ban answered {items:?}"))),
    })
}

/// Reads a peek script's reply for an algorithm of `parts` (empty: a single limit):
/// `{ban_left_us, then remaining, reset_after_us per limit}` as a denial that took nothing
/// (for several limits, the binding one is the one with the fewest units left).
pub(crate) fn parse_peek(parts: &[PartInfo], reply: redis::Value) -> Result<Peeked, Error> {
    let items = reply::ints(reply)?;
    let bad = || Error::InvalidReply(format!("a peek answered {items:?}"));
    let n = parts.len().max(1);
    let (&[banned], rest) = items.split_at(items.len().min(1)) else {
        return Err(bad());
    };
    if rest.len() != 2 * n || banned < 0 || rest.iter().any(|&i| i < 0) {
        return Err(bad());
    }
    let limits: Vec<PartOutcome> = rest
        .chunks_exact(2)
        .map(|p| PartOutcome {
            remaining: p[0] as u64,
            retry_after_us: None,
            reset_after_us: p[1] as u64,
        })
        .collect();
    let mut binding = 0;
    for (i, p) in limits.iter().enumerate() {
        if p.remaining < limits[binding].remaining {
            binding = i;
        }
    }
    let b = limits[binding];
    let mut outcome = Outcome::single(false, b.remaining, None, b.reset_after_us);
    if !parts.is_empty() {
        outcome.parts = limits;
        outcome.binding = binding;
    }
    Ok(Peeked {
        outcome,
        banned_us: banned as u64,
    })
}

/// Reads a refund script's reply: whether anything was given back.
pub(crate) fn parse_refund(reply: redis::Value) -> Result<bool, Error> {
    match redis::from_redis_value::<i64>(reply) {
        Ok(0) => Ok(false),
        Ok(1) => Ok(true),
        other => Err(Error::InvalidReply(format!(
            "a refund answers 0 or 1, not {other:?}"
        ))),
    }
}

/// The refusal of an algorithm that cannot settle a charge.
fn not_settled() -> Error {
    Error::Unsupported(
        "only GCRA, the token bucket and the sliding and fixed windows settle charges",
    )
}

/// The refusal of an algorithm that cannot be leased.
fn not_reserved() -> Error {
    Error::Unsupported("only GCRA and the token bucket reserve units")
}

/// The refusal of an algorithm that cannot schedule.
fn not_scheduled() -> Error {
    Error::Unsupported("only GCRA schedules calls")
}

#[cfg(test)]
pub(crate) fn ints(items: &[i64]) -> redis::Value {
    redis::Value::Array(items.iter().map(|&i| redis::Value::Int(i)).collect())
}
