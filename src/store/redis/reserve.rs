//! The wire format of a reservation (a unit lease's call): which script takes several units
//! at once for an algorithm, its keys and arguments, and how its reply reads. Only GCRA and
//! the token bucket reserve; the scripts live in `lua/*_reserve.lua` and share the prelude.

use std::sync::LazyLock;

use redis::Script;

use super::backend::evalsha;
use crate::{
    store::{KeyBuf, Reserved},
    Algorithm, Error, Rule, StoreKey,
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
    let (script, suffix, rate): (&'static Script, &[u8], _) = match algorithm.rule() {
        Rule::Gcra(r) => (&GCRA_RESERVE, b":g", r),
        Rule::TokenBucket(r) => (&TOKEN_BUCKET_RESERVE, b":b", r),
        _ => {
            return Err(Error::Unsupported(
                "only GCRA and the token bucket reserve units",
            ))
        }
    };
    let mut buf = KeyBuf::new();
    key.write_base_with(suffix, &mut buf);
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
    let items: Vec<i64> = redis::from_redis_value(reply)
        .map_err(|e| Error::InvalidReply(format!("expected 5 integers: {e}")))?;
    Reserved::from_ints(&items, cost, up_to)
}
