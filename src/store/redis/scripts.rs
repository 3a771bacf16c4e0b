//! The Lua wire format of each algorithm: which script decides a check, its keys, its
//! arguments, and how its reply reads.
//!
//! The scripts live in `lua/`; all but `gcra.lua` (the hottest, kept standalone) share
//! `prelude.lua`. Keys derive from the limiter's base key by a suffix, so every key of one
//! check carries the base key's hash tag and lands on one cluster slot.

use std::sync::LazyLock;

use redis::Script;

use crate::{lua::batch_form, Algorithm, Error, Outcome, Rule};

/// A script and its batch form, each built (and hashed) once.
struct Scripts {
    single: LazyLock<Script>,
    batch: LazyLock<Script>,
}

macro_rules! scripts {
    ($file:literal) => {
        Scripts {
            single: LazyLock::new(|| {
                Script::new(concat!(
                    include_str!("../../../lua/prelude.lua"),
                    include_str!(concat!("../../../lua/", $file))
                ))
            }),
            batch: LazyLock::new(|| {
                batch_form(
                    include_str!("../../../lua/prelude.lua"),
                    include_str!(concat!("../../../lua/", $file)),
                )
            }),
        }
    };
    ($file:literal, standalone) => {
        Scripts {
            single: LazyLock::new(|| Script::new(include_str!(concat!("../../../lua/", $file)))),
            batch: LazyLock::new(|| batch_form("", include_str!(concat!("../../../lua/", $file)))),
        }
    };
}

static GCRA: Scripts = scripts!("gcra.lua", standalone);
static TOKEN_BUCKET: Scripts = scripts!("token_bucket.lua");
static SLIDING_WINDOW: Scripts = scripts!("sliding_window.lua");
static MULTI_GCRA: Scripts = scripts!("multi_gcra.lua");

/// How one check of an algorithm goes to Redis.
pub(crate) struct Wire<'a> {
    /// The script deciding one check.
    pub(crate) script: &'a Script,
    /// Its batch form, when it has one.
    pub(crate) batch: Option<&'static Script>,
    pub(crate) keys: Vec<String>,
    /// The arguments after `ARGV[1]` (the explicit time or `''`).
    pub(crate) args: Vec<u64>,
}

impl<'a> Wire<'a> {
    /// The wire format of a check of `cost` on `base` under `algorithm`.
    pub(crate) fn of(algorithm: &'a dyn Algorithm, base: &str, cost: u32) -> Result<Self, Error> {
        let cost = u64::from(cost);
        let builtin = |scripts: &'static Scripts, keys: Vec<String>, args: Vec<u64>| Wire {
            script: &scripts.single,
            batch: Some(&*scripts.batch),
            keys,
            args,
        };
        Ok(match algorithm.rule() {
            Rule::Gcra(r) => builtin(
                &GCRA,
                vec![format!("{base}:g")],
                vec![r.emission_us(), r.burst(), cost],
            ),
            Rule::TokenBucket(r) => builtin(
                &TOKEN_BUCKET,
                vec![format!("{base}:b")],
                vec![r.emission_us(), r.burst(), cost],
            ),
            Rule::SlidingWindow(w) => builtin(
                &SLIDING_WINDOW,
                vec![format!("{base}:l"), format!("{base}:m")],
                vec![w.window_us(), w.limit(), cost],
            ),
            Rule::Multi(rates) => {
                let keys = algorithm
                    .parts()
                    .iter()
                    .map(|p| format!("{base}:q:{}", p.name))
                    .collect();
                let mut args = Vec::with_capacity(1 + 2 * rates.len());
                args.push(cost);
                for r in rates {
                    args.push(r.emission_us());
                    args.push(r.burst());
                }
                builtin(&MULTI_GCRA, keys, args)
            }
            Rule::Script(s) => Wire {
                script: s.script(),
                batch: s.batch_script(),
                keys: s.keys(base),
                args: s.args(cost as u32),
            },
        })
    }
}

/// Reads a script's reply for `algorithm`.
pub(crate) fn parse(algorithm: &dyn Algorithm, reply: redis::Value) -> Result<Outcome, Error> {
    match algorithm.rule() {
        Rule::Script(s) => s.parse_reply(reply),
        _ => Outcome::from_redis(reply),
    }
}
