//! The wire format of a reservation (a unit lease's call): which script takes several units
//! at once for an algorithm, its keys and arguments, and how its reply reads. Only GCRA and
//! the token bucket reserve; the scripts live in `lua/*_reserve.lua` and share the prelude.

use std::sync::LazyLock;

use redis::Script;

use super::{keys, link::evalsha, reply};
use crate::{
    algorithm::{Algorithm, Rule},
    error::Error,
    store::{KeyBuf, Reserved, StoreKey},
};

static GCRA_RESERVE: LazyLock<Script> = prelude_script!("gcra_reserve.lua");
static TOKEN_BUCKET_RESERVE: LazyLock<Script> = prelude_script!("token_bucket_reserve.lua");

/// A reservation of up to `up_to` units (at least `cost`) of `key` under `algorithm`: its
/// script and its `EVALSHA`; an [`Error::Unsupported`] for an algorithm that cannot be leased.
pub(crate) fn command(
    algorithm: &dyn Algorithm,
    key: StoreKey<'_>,
    cost: u32,
    up_to: u32,
    now_us: Option<u64>,
) -> Result<(&'static Script, redis::Cmd), Error> {
    let (script, suffix, rate): (&'static Script, _, _) = match algorithm.rule() {
        Rule::Gcra(r) => (&GCRA_RESERVE, keys::GCRA, r),
        Rule::TokenBucket(r) => (&TOKEN_BUCKET_RESERVE, keys::BUCKET, r),
        _ => {
            return Err(Error::Unsupported(
                "only GCRA and the token bucket reserve units",
            ))
        }
    };
    let mut buf = KeyBuf::new();
    keys::write_key(key, suffix, &mut buf);
    let mut cmd = evalsha(
        script,
        1,
        |cmd| {
            cmd.arg(buf.as_bytes());
        },
        now_us,
    );
    cmd.arg(rate.emission_us())
        .arg(rate.burst())
        .arg(cost)
        .arg(up_to);
    Ok((script, cmd))
}

/// Reads a reservation's reply (see [`Reserved::from_ints`]).
pub(crate) fn parse(reply: redis::Value, cost: u32, up_to: u32) -> Result<Reserved, Error> {
    Reserved::from_ints(&reply::ints(reply)?, cost, up_to)
}
