//! The Lua wire format of each algorithm: which script decides a check, its keys, its
//! arguments, and how its reply reads.
//!
//! The scripts live in `lua/`. GCRA's check (`gcra.lua`) and its batch form (`gcra_batch.lua`)
//! stand alone and take the least a check needs (see [`gcra_args`]); GCRA's reservation and the
//! multi-limit (`gcra_reserve.lua`, `multi_gcra.lua`) follow the GCRA core, `gcra_core.lua`; the
//! other scripts follow `prelude.lua`. All but GCRA get their batch form from `batch.lua`. Every
//! script but GCRA's check takes the time, then the cost, then the algorithm's parameters, then
//! what the call adds.
//! Keys derive from the check's base key by a suffix (see `keys.rs`), so every key of one
//! check carries the base key's hash tag and lands on one cluster slot.

use std::sync::LazyLock;

use redis::Script;

use super::{
    batch::{batch_form, Layout},
    custom, keys,
    link::{evalsha_keys, evalsha_sized},
    reply,
};
use crate::{
    algorithm::{
        Algorithm, BucketRate, LogEntry, Outcome, PartInfo, PartOutcome, Placed, Position, Rule,
        Scripted,
    },
    decision::Charge,
    error::Error,
    extract::Out,
    store::{KeyBuf, Peeked, StoreKey},
    unique_id,
};

/// A script and its batch form, each built (and hashed) once.
struct Scripts {
    single: LazyLock<Script>,
    batch: LazyLock<Script>,
}

macro_rules! scripts {
    // After `library` (the prelude, or the GCRA core); the batch form from `batch.lua`.
    ($file:literal, after $library:literal) => {
        Scripts {
            single: LazyLock::new(|| {
                Script::new(concat!(
                    include_str!(concat!("../../../lua/", $library)),
                    include_str!(concat!("../../../lua/", $file))
                ))
            }),
            batch: LazyLock::new(|| {
                batch_form(
                    include_str!(concat!("../../../lua/", $library)),
                    include_str!(concat!("../../../lua/", $file)),
                )
            }),
        }
    };
    // GCRA's check: a batch form of its own, both standing alone.
    ($file:literal, alone, batch: $batch:literal) => {
        Scripts {
            single: LazyLock::new(|| Script::new(include_str!(concat!("../../../lua/", $file)))),
            batch: LazyLock::new(|| Script::new(include_str!(concat!("../../../lua/", $batch)))),
        }
    };
}

/// GCRA has a batch script of its own (one `MGET` for the whole batch instead of a `GET` per
/// check, its checks' arguments once per run of checks that share them: see
/// `batch::Layout::Gcra`).
static GCRA: Scripts = scripts!("gcra.lua", alone, batch: "gcra_batch.lua");
static TOKEN_BUCKET: Scripts = scripts!("token_bucket.lua", after "prelude.lua");
static SLIDING_WINDOW: Scripts = scripts!("sliding_window.lua", after "prelude.lua");
static MULTI_GCRA: Scripts = scripts!("multi_gcra.lua", after "gcra_core.lua");

/// The peek scripts: a key read without a check (one call each, never batched).
static GCRA_PEEK: LazyLock<Script> = prelude_script!("gcra_peek.lua", after "gcra_state.lua");
static TOKEN_BUCKET_PEEK: LazyLock<Script> = prelude_script!("token_bucket_peek.lua");
static SLIDING_WINDOW_PEEK: LazyLock<Script> = prelude_script!("sliding_window_peek.lua");
/// A ban, and the deletion of a key's custom state, ban or holders.
pub(crate) static BAN: LazyLock<Script> = prelude_script!("ban.lua", after "gcra_state.lua");
pub(crate) static FORGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/forget.lua")));
/// A reset of a key's state under a built-in algorithm (see [`Wire::reset`]).
static RESET: LazyLock<Script> = prelude_script!("reset.lua", after "gcra_state.lua");

/// The refund scripts (one call each, never batched).
static GCRA_REFUND: LazyLock<Script> =
    prelude_script!("gcra_refund.lua", after "refund_ledger.lua", "gcra_state.lua");
static TOKEN_BUCKET_REFUND: LazyLock<Script> =
    prelude_script!("token_bucket_refund.lua", after "refund_ledger.lua");
static SLIDING_WINDOW_REFUND: LazyLock<Script> = prelude_script!("sliding_window_refund.lua");

/// How one check of an algorithm goes to Redis.
pub(crate) struct Wire<'a> {
    /// The script deciding one check.
    pub(crate) script: &'static Script,
    /// Its batch form, when it has one.
    pub(crate) batch: Option<&'static Script>,
    keys: Keys<'a>,
    args: Args,
    /// A refund's marker key, `:rf:ID` after the state's keys, so that a resent refund gives
    /// nothing back (see `first_run` in `lua/prelude.lua`).
    marker: Option<String>,
    /// Whether the key's ban (`:x`) follows the state's keys: a built-in check but GCRA's (which
    /// reads the ban's copy in its state), or a peek.
    ban: bool,
    /// How the time goes: `ARGV[1]`, the explicit time or `''` (every script but GCRA's check),
    /// or after the arguments and only when explicit (GCRA's check, see `lua/gcra.lua`).
    time_last: bool,
    /// The arguments' layout in the batch form.
    pub(crate) layout: Layout,
}

/// A check's keys: the base key with suffixes (a built-in's, or a custom algorithm's).
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

impl<'a> Wire<'a> {
    /// The wire format of a check of `cost` on `key` under `algorithm`.
    pub(crate) fn of(algorithm: &'a dyn Algorithm, cost: u32) -> Self {
        let c = u64::from(cost);
        let builtin = |scripts: &'static Scripts, keys: Keys<'a>, args: Args| Wire {
            script: &scripts.single,
            batch: Some(&*scripts.batch),
            keys,
            args,
            marker: None,
            ban: true,
            time_last: false,
            layout: Layout::Generic,
        };
        match algorithm.rule() {
            Rule::Gcra(r) => Wire {
                ban: false,
                time_last: true,
                layout: Layout::Gcra,
                ..builtin(
                    &GCRA,
                    Keys::Suffixes(&[keys::GCRA]),
                    Args::Three(gcra_args(r, c)),
                )
            },
            Rule::TokenBucket(r) => builtin(
                &TOKEN_BUCKET,
                Keys::Suffixes(&[keys::BUCKET]),
                Args::Three([c, r.emission_us(), r.burst()]),
            ),
            Rule::SlidingWindow(w) => builtin(
                &SLIDING_WINDOW,
                Keys::Suffixes(&[keys::LOG, keys::LOG_TOTALS]),
                Args::Three([c, w.window_us(), w.limit()]),
            ),
            Rule::Multi(rates) => builtin(
                &MULTI_GCRA,
                Keys::Parts(algorithm.parts()),
                multi_args(c, rates),
            ),
            Rule::Script(s) => {
                let scripts = custom::scripts(s);
                Wire {
                    script: &scripts.single,
                    batch: s.batchable().then(|| scripts.batch()),
                    keys: Keys::Suffixes(s.key_suffixes()),
                    args: Args::List(s.args(cost)),
                    marker: None,
                    ban: false,
                    time_last: false,
                    layout: Layout::Generic,
                }
            }
        }
    }

    /// How a refund of `charge` on `key` under `algorithm` goes to Redis: `Ok(None)` when
    /// there is nothing to give back (a sliding-window charge without its log entry, a GCRA,
    /// token-bucket or multi-limit charge not placed on the key's time), an
    /// [`Error::Unsupported`] for a custom script.
    ///
    /// `resendable`: the connection may send the call again after it ran (the cluster client
    /// does, after a cut connection). GCRA, the token bucket and the multi-limit then carry a
    /// marker key, so that a second run gives nothing back; a sliding window needs none (a
    /// second run finds its entry gone).
    pub(crate) fn refund(
        algorithm: &'a dyn Algorithm,
        charge: &Charge,
        resendable: bool,
    ) -> Result<Option<Self>, Error> {
        let c = u64::from(charge.cost());
        let alone = |script: &'static Script, keys: Keys<'a>, args: Vec<u64>| {
            Ok(Some(Wire {
                script,
                batch: None,
                keys,
                args: Args::List(args),
                marker: resendable.then(unique_id::next),
                ban: false,
                time_last: false,
                layout: Layout::Generic,
            }))
        };
        // Where the charge lies on each limit's time: when admitted, and the time it left.
        let placed = |limits: usize| {
            charge
                .position
                .placed()
                .filter(|p| p.ends().len() == limits)
        };
        match algorithm.rule() {
            Rule::Gcra(r) => match placed(1) {
                Some(p) => alone(
                    &GCRA_REFUND,
                    Keys::Suffixes(&[keys::GCRA, keys::GCRA_LEDGER]),
                    vec![c, r.emission_us(), r.burst(), p.at_us, p.ends()[0]],
                ),
                None => Ok(None),
            },
            Rule::TokenBucket(r) => match placed(1) {
                Some(p) => alone(
                    &TOKEN_BUCKET_REFUND,
                    Keys::Suffixes(&[keys::BUCKET, keys::BUCKET_LEDGER]),
                    vec![c, r.emission_us(), r.burst(), p.at_us, p.ends()[0]],
                ),
                None => Ok(None),
            },
            Rule::SlidingWindow(w) => match charge.position {
                Position::Logged(e) => Ok(Some(Wire {
                    script: &SLIDING_WINDOW_REFUND,
                    batch: None,
                    keys: Keys::Suffixes(&[keys::LOG, keys::LOG_TOTALS]),
                    args: Args::List(vec![c, w.window_us(), w.limit(), e.at_us, e.seq]),
                    marker: None,
                    ban: false,
                    time_last: false,
                    layout: Layout::Generic,
                })),
                _ => Ok(None),
            },
            Rule::Multi(rates) => match placed(rates.len()) {
                Some(p) => {
                    let mut args = Vec::with_capacity(2 + 3 * rates.len());
                    args.push(c);
                    for r in rates {
                        args.extend([r.emission_us(), r.burst()]);
                    }
                    args.push(p.at_us);
                    args.extend(p.ends());
                    alone(&GCRA_REFUND, Keys::PartsAndLedgers(algorithm.parts()), args)
                }
                None => Ok(None),
            },
            Rule::Script(_) => Err(Error::Unsupported("a custom script cannot give units back")),
        }
    }

    /// How a peek of `key` under `algorithm` goes to Redis (its reply: [`parse_peek`]); an
    /// [`Error::Unsupported`] for a custom script.
    pub(crate) fn peek(algorithm: &'a dyn Algorithm) -> Result<Self, Error> {
        let read = |script: &'static Script, keys: Keys<'a>, args: Vec<u64>| {
            Ok(Wire {
                script,
                batch: None,
                keys,
                args: Args::List(args),
                marker: None,
                ban: true,
                time_last: false,
                layout: Layout::Generic,
            })
        };
        match algorithm.rule() {
            Rule::Gcra(r) => read(
                &GCRA_PEEK,
                Keys::Suffixes(&[keys::GCRA]),
                vec![r.emission_us(), r.burst()],
            ),
            Rule::TokenBucket(r) => read(
                &TOKEN_BUCKET_PEEK,
                Keys::Suffixes(&[keys::BUCKET]),
                vec![r.emission_us(), r.burst()],
            ),
            Rule::SlidingWindow(w) => read(
                &SLIDING_WINDOW_PEEK,
                Keys::Suffixes(&[keys::LOG, keys::LOG_TOTALS]),
                vec![w.window_us(), w.limit()],
            ),
            Rule::Multi(rates) => read(
                &GCRA_PEEK,
                Keys::Parts(algorithm.parts()),
                rates
                    .iter()
                    .flat_map(|r| [r.emission_us(), r.burst()])
                    .collect(),
            ),
            Rule::Script(_) => Err(Error::Unsupported(
                "a custom algorithm cannot be read without a check",
            )),
        }
    }

    /// How a reset of a key under a built-in algorithm goes to Redis (`lua/reset.lua`, its
    /// reply: how many states existed): its state goes, and refunds of the checks admitted
    /// before it give nothing back. A custom script's instead, whose keys a reset deletes (see
    /// [`Wire::script_keys`]).
    pub(crate) fn reset(algorithm: &'a dyn Algorithm) -> Result<Self, &'a dyn Scripted> {
        let wire = |keys: Keys<'a>, args: Vec<u64>| {
            Ok(Wire {
                script: &RESET,
                batch: None,
                keys,
                args: Args::List(args),
                marker: None,
                ban: false,
                time_last: false,
                layout: Layout::Generic,
            })
        };
        // Each limit's lead: how long a charge admitted before now may hold part of its time.
        match algorithm.rule() {
            Rule::Gcra(r) => wire(
                Keys::Suffixes(&[keys::GCRA, keys::GCRA_LEDGER]),
                vec![1, r.tolerance_us()],
            ),
            Rule::TokenBucket(r) => wire(
                Keys::Suffixes(&[keys::BUCKET, keys::BUCKET_LEDGER]),
                vec![0, r.tolerance_us()],
            ),
            Rule::SlidingWindow(_) => wire(Keys::Suffixes(&[keys::LOG_TOTALS, keys::LOG]), vec![2]),
            Rule::Multi(rates) => wire(
                Keys::PartsAndLedgers(algorithm.parts()),
                std::iter::once(0)
                    .chain(rates.iter().map(BucketRate::tolerance_us))
                    .collect(),
            ),
            Rule::Script(script) => Err(script),
        }
    }

    /// The keys of `key` under a custom script (its key suffixes), which a reset deletes.
    pub(crate) fn script_keys(script: &dyn Scripted, key: StoreKey<'_>) -> Vec<Vec<u8>> {
        script
            .key_suffixes()
            .iter()
            .map(|suffix| {
                let mut buf = KeyBuf::new();
                keys::write_key(key, suffix, &mut buf);
                buf.as_bytes().to_vec()
            })
            .collect()
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

    /// Calls `f` with each of the check's keys, in order.
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

/// GCRA's check arguments (see `lua/gcra.lua`): the step (`cost` × the emission interval, or
/// the tolerance + 1 when the cost exceeds the burst, so that the check is denied), the
/// tolerance, and how long a rested key lives once charged (the step in whole ms, rounded up).
/// A [`BucketRate`] holds emission × burst to 2^52, so every value is at most 2^52 + 1.
pub(crate) fn gcra_args(rate: BucketRate, cost: u64) -> [u64; 3] {
    let tolerance = rate.tolerance_us();
    let step = if cost > rate.burst() {
        tolerance + 1
    } else {
        cost * rate.emission_us()
    };
    [step, tolerance, step.div_ceil(1_000)]
}

/// The arguments of several GCRA limits: the cost, then each limit's emission interval and
/// burst.
fn multi_args(cost: u64, rates: &[BucketRate]) -> Args {
    let mut args = Vec::with_capacity(1 + 2 * rates.len());
    args.push(cost);
    for r in rates {
        args.push(r.emission_us());
        args.push(r.burst());
    }
    Args::List(args)
}

/// Reads a script's reply for a check of `cost` under `algorithm`.
pub(crate) fn parse(
    algorithm: &dyn Algorithm,
    cost: u32,
    reply: redis::Value,
) -> Result<Outcome, Error> {
    let rule = algorithm.rule();
    if let Rule::Gcra(rate) = rule {
        return parse_gcra(reply, rate, u64::from(cost));
    }
    if !matches!(rule, Rule::Script(_)) {
        if let Some(banned) = parse_banned(&reply) {
            return banned;
        }
    }
    match rule {
        Rule::Script(s) => s.parse_reply(&reply::ints(reply)?),
        Rule::SlidingWindow(_) => parse_logged(reply),
        Rule::Multi(_) => parse_multi(reply),
        Rule::Gcra(_) | Rule::TokenBucket(_) => parse_placed(reply),
    }
}

/// GCRA's reply (see `lua/gcra.lua`) to a check of `cost` sent with `rate`'s arguments, as the
/// full outcome, with the in-memory twin's maths (`algorithm::gcra::decide`): admitted, the
/// string `TAT SECS USECS` (or, from a batch, `{TAT - now, now}`); denied, the integer
/// `now - TAT` (0 or less); banned, the shared `{2, 0, left, left}`. A reply that no check of
/// `cost` under `rate` can give is an [`Error::InvalidReply`].
fn parse_gcra(reply: redis::Value, rate: BucketRate, cost: u64) -> Result<Outcome, Error> {
    use redis::Value::{Array, BulkString, Int};
    let (emission, tolerance) = (rate.emission_us(), rate.tolerance_us());
    let bad = |reply: &redis::Value| {
        Err(Error::InvalidReply(format!(
            "a GCRA check of {cost} answered {reply:?}"
        )))
    };
    let admitted = |now: u64, tat: u64| {
        let reset = tat.checked_sub(now)?;
        // An admitted check moved the TAT by its step from now or later, and left it within the
        // tolerance of now.
        if cost > rate.burst() || reset < cost * emission || reset > tolerance {
            return None;
        }
        let mut o = Outcome::single(true, (tolerance - reset) / emission, Some(0), reset);
        o.position =
            Position::Placed(Placed::read(i64::try_from(now).ok()?, [reset].into_iter()).ok()?);
        Some(o)
    };
    let outcome = match &reply {
        Int(r) if *r <= 0 && r.unsigned_abs() <= crate::quota::MAX_EXACT => {
            let reset = r.unsigned_abs();
            let remaining = tolerance.saturating_sub(reset) / emission;
            let retry = if cost > rate.burst() {
                None
            } else {
                // Denied: the step from the TAT goes past the tolerance.
                match (reset + cost * emission).checked_sub(tolerance) {
                    Some(wait) if wait > 0 => Some(wait),
                    _ => return bad(&reply),
                }
            };
            Some(Outcome::single(false, remaining, retry, reset))
        }
        BulkString(text) => {
            let mut words = text.split(|&b| b == b' ').map(|w| {
                std::str::from_utf8(w)
                    .ok()
                    .filter(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|w| w.parse::<u64>().ok())
            });
            match (words.next(), words.next(), words.next(), words.next()) {
                (Some(Some(tat)), Some(Some(secs)), Some(Some(usecs)), None) => secs
                    .checked_mul(1_000_000)
                    .and_then(|s| s.checked_add(usecs))
                    .and_then(|now| admitted(now, tat)),
                _ => None,
            }
        }
        Array(items) => match items.as_slice() {
            [Int(reset), Int(now)] if *reset > 0 && *now >= 0 => {
                admitted(*now as u64, (*now as u64).saturating_add(*reset as u64))
            }
            _ => return parse_banned(&reply).unwrap_or_else(|| bad(&reply)),
        },
        _ => None,
    };
    outcome.map_or_else(|| bad(&reply), Ok)
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

/// A reply's integers, read without collecting them into a `Vec` when they are up to `N`
/// plain integers (GCRA's and the token bucket's, the most common).
fn small_ints<const N: usize>(reply: redis::Value) -> Result<([i64; N], usize), Error> {
    use redis::Value::{Array, Int};
    let mut ints = [0; N];
    if let Array(items) = &reply {
        if items.len() <= N && items.iter().all(|v| matches!(v, Int(_))) {
            for (slot, item) in ints.iter_mut().zip(items) {
                if let Int(i) = item {
                    *slot = *i;
                }
            }
            return Ok((ints, items.len()));
        }
    }
    let items = reply::ints(reply)?;
    match ints.get_mut(..items.len()) {
        Some(head) => {
            head.copy_from_slice(&items);
            Ok((ints, items.len()))
        }
        None => Err(Error::InvalidReply(format!(
            "expected at most {N} integers, got {items:?}"
        ))),
    }
}

/// GCRA's and the token bucket's reply: the shared 4 integers, then, when admitted, the time
/// the script admitted it at (a refund needs it). Anything else, such as an admission without
/// its time, is an [`Error::InvalidReply`].
fn parse_placed(reply: redis::Value) -> Result<Outcome, Error> {
    match small_ints::<5>(reply)? {
        ([allowed @ 0, remaining, retry, reset, _], 4) => {
            Outcome::from_ints(&[allowed, remaining, retry, reset])
        }
        ([allowed @ 1, remaining, retry, reset, now], 5) => {
            let mut o = Outcome::from_ints(&[allowed, remaining, retry, reset])?;
            o.position = Position::Placed(Placed::read(now, std::iter::once(o.reset_after_us))?);
            Ok(o)
        }
        (ints, n) => Err(Error::InvalidReply(format!(
            "expected 4 integers when denied, 5 when admitted: {:?}",
            &ints[..n]
        ))),
    }
}

/// The multi-limit's reply: the shared shape with its parts, then, when admitted, the time the
/// script admitted it at.
fn parse_multi(reply: redis::Value) -> Result<Outcome, Error> {
    let items = reply::ints(reply)?;
    match items.split_last() {
        Some((&now, rest)) if items.first() == Some(&1) => {
            let mut o = Outcome::from_ints(rest)?;
            if o.parts.is_empty() {
                return Err(Error::InvalidReply(format!("no limits in {items:?}")));
            }
            o.position =
                Position::Placed(Placed::read(now, o.parts.iter().map(|p| p.reset_after_us))?);
            Ok(o)
        }
        _ => Outcome::from_ints(&items),
    }
}

/// A sliding window's reply: the shared 4 integers, then, when admitted, the log entry's
/// time and sequence number.
fn parse_logged(reply: redis::Value) -> Result<Outcome, Error> {
    let items = reply::ints(reply)?;
    match *items.as_slice() {
        [allowed @ 1, remaining, retry, reset, at, seq] => {
            let (Ok(at_us), Ok(seq)) = (u64::try_from(at), u64::try_from(seq)) else {
                return Err(Error::InvalidReply(format!(
                    "negative log entry in {items:?}"
                )));
            };
            let mut o = Outcome::from_ints(&[allowed, remaining, retry, reset])?;
            o.position = Position::Logged(LogEntry { at_us, seq });
            Ok(o)
        }
        [_, _, _, _] => Outcome::from_ints(&items),
        _ => Err(Error::InvalidReply(format!(
            "expected 4 integers, or 6 when admitted, in {items:?}"
        ))),
    }
}

/// Reads a peek script's reply for `algorithm`: `{ban_left_us, then remaining,
/// reset_after_us per limit}` as a denial that took nothing (for several limits, the binding
/// one is the one with the fewest units left).
pub(crate) fn parse_peek(algorithm: &dyn Algorithm, reply: redis::Value) -> Result<Peeked, Error> {
    let items = reply::ints(reply)?;
    let bad = || Error::InvalidReply(format!("a peek answered {items:?}"));
    let n = algorithm.parts().len().max(1);
    let (&[banned], rest) = items.split_at(items.len().min(1)) else {
        return Err(bad());
    };
    if rest.len() != 2 * n || banned < 0 || rest.iter().any(|&i| i < 0) {
        return Err(bad());
    }
    let parts: Vec<PartOutcome> = rest
        .chunks_exact(2)
        .map(|p| PartOutcome {
            remaining: p[0] as u64,
            retry_after_us: None,
            reset_after_us: p[1] as u64,
        })
        .collect();
    let mut binding = 0;
    for (i, p) in parts.iter().enumerate() {
        if p.remaining < parts[binding].remaining {
            binding = i;
        }
    }
    let b = parts[binding];
    let mut outcome = Outcome::single(false, b.remaining, None, b.reset_after_us);
    if !algorithm.parts().is_empty() {
        outcome.parts = parts;
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

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value::{self, Int};

    fn ints(items: &[i64]) -> Value {
        Value::Array(items.iter().map(|&i| Int(i)).collect())
    }

    #[test]
    fn an_admission_names_when_it_was_admitted() {
        let o = parse_placed(ints(&[1, 4, 0, 900, 5_000])).unwrap();
        assert_eq!((o.allowed, o.remaining, o.reset_after_us), (true, 4, 900));
        let p = *o.position.placed().unwrap();
        assert_eq!((p.at_us, p.ends()), (5_000, &[5_900][..]));
        let denied = parse_placed(ints(&[0, 0, 250, 900])).unwrap();
        assert_eq!(
            (denied.allowed, denied.position),
            (false, Position::Unknown)
        );
        // Bulk-string integers read the same.
        let bulk = Value::Array(
            ["1", "4", "0", "900", "5000"]
                .iter()
                .map(|s| Value::BulkString(s.as_bytes().to_vec()))
                .collect(),
        );
        assert_eq!(parse_placed(bulk).unwrap(), o);
        let multi = parse_multi(ints(&[1, 3, 0, 10, 1, 5, 0, 20, 3, 0, 10, 7_000])).unwrap();
        assert_eq!(multi.position.placed().unwrap().ends(), &[7_020, 7_010]);
        assert_eq!(multi.binding, 1);
    }

    fn rate(per_second: u32, burst: u32) -> BucketRate {
        use crate::algorithm::Gcra;
        let g = Gcra::new(crate::Quota::per_second(per_second).burst(burst)).unwrap();
        let Rule::Gcra(r) = g.rule() else {
            unreachable!("a Gcra's rule is Rule::Gcra")
        };
        r
    }

    #[test]
    fn gcra_arguments_are_what_the_script_needs() {
        // 10 a second, burst 5: emission 100 ms, tolerance 500 ms.
        let r = rate(10, 5);
        assert_eq!(gcra_args(r, 1), [100_000, 500_000, 100]);
        assert_eq!(gcra_args(r, 5), [500_000, 500_000, 500]);
        // Above the burst: one more than the tolerance, never admitted.
        assert_eq!(gcra_args(r, 6), [500_001, 500_000, 501]);
        // A step under a millisecond lives a whole one.
        assert_eq!(gcra_args(rate(1_000_000, 1), 1), [1, 1, 1]);
    }

    /// GCRA's replies read as the in-memory twin's outcome of the same check.
    #[test]
    fn gcra_replies_read_as_the_twins_outcome() {
        use crate::algorithm::gcra::decide;
        let r = rate(10, 5);
        let now = 1_700_000_000_123_456u64;
        for stored in [
            None,
            Some(now - 7),
            Some(now + 150_000),
            Some(now + 450_000),
        ] {
            for cost in 1..=6u64 {
                let (want, write) = decide(r, stored, now, cost);
                let reply = match write {
                    Some(tat) => {
                        let text = format!("{tat} {} {}", now / 1_000_000, now % 1_000_000);
                        Value::BulkString(text.into_bytes())
                    }
                    None => Int(-(want.reset_after_us as i64)),
                };
                let got = parse_gcra(reply, r, cost).unwrap();
                assert_eq!(got, want, "{stored:?} {cost}");
                assert_eq!(got.position, want.position, "{stored:?} {cost}");
                if let Some(tat) = write {
                    // The batch form: {TAT - now, now}.
                    let batched = ints(&[(tat - now) as i64, now as i64]);
                    let got = parse_gcra(batched, r, cost).unwrap();
                    assert_eq!((got.clone(), got.position), (want.clone(), want.position));
                }
            }
        }
        let banned = parse_gcra(ints(&[2, 0, 700, 700]), r, 1).unwrap();
        assert!(banned.banned && !banned.allowed);
    }

    #[test]
    fn broken_gcra_replies_are_errors() {
        let r = rate(10, 5);
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        for (bad, cost) in [
            (Int(1), 1),                    // positive: admitted needs its time
            (Int(-300_000), 2),             // denied though the cost fits
            (Int(-(1 << 53)), 1),           // past 2^52
            (text("1000100000 1000 0"), 1), // TAT - now = 100 ms, fine, but ...
            (text("1000100000 1000 0"), 6), // ... not for a cost above the burst
            (text("1000050000 1000 0"), 1), // moved by less than the step
            (text("1000600000 1000 0"), 1), // beyond the tolerance
            (text("999000000 1000 0"), 1),  // before now
            (text("1000100000 1000"), 1),   // no microseconds
            (text("1000100000 1000 0 0"), 1),
            (text("1000100000  1000 0"), 1),
            (text("1000100000 -1000 0"), 1),
            (text("x 1000 0"), 1),
            (ints(&[100_000]), 1),
            (ints(&[0, 1_000_000_000]), 1),
            (ints(&[2, 0, 0, 0]), 1),
            (Value::Nil, 1),
        ] {
            let ok = cost == 1 && bad == text("1000100000 1000 0");
            assert_eq!(
                parse_gcra(bad.clone(), r, cost).is_ok(),
                ok,
                "{bad:?} {cost}"
            );
        }
    }

    #[test]
    fn broken_replies_are_errors() {
        for bad in [
            &[1, 4, 0, 900][..],      // admitted without its time
            &[0, 4, 250, 900, 1],     // a denial with one
            &[1, 4, 0, 900, -1],      // a negative time
            &[1, 4, 0, 900, 1 << 53], // past 2^52
            &[1, 4, 0, 900, 1, 2],
            &[1, 4, 0],
            &[2, 0, 0, 0, 5],
        ] {
            assert!(
                matches!(parse_placed(ints(bad)), Err(Error::InvalidReply(_))),
                "{bad:?}"
            );
        }
        for bad in [
            &[1, 3, 0, 10, 1, 5, 0, 20, 3, 0, 10][..], // admitted without its time
            &[1, 3, 0, 10, 7_000],                     // no limits
            &[0, 0, 50, 60, 1, 3, 0, 10, 0, 50, 60, 7_000],
        ] {
            assert!(
                matches!(parse_multi(ints(bad)), Err(Error::InvalidReply(_))),
                "{bad:?}"
            );
        }
        for other in [Value::Nil, Int(1), Value::Array(vec![Value::Nil; 5])] {
            assert!(parse_placed(other.clone()).is_err(), "{other:?}");
            assert!(parse_multi(other).is_err());
        }
    }
}
