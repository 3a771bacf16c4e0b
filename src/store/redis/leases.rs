//! Concurrency slots in Redis: one script per operation (`lua/semaphore_*.lua`) on a ZSET of
//! holders scored by lease deadline, under `{prefix:policy:key}:c`, so it shares the rate
//! limit's hash tag and cluster slot. Always sent alone, also by a batching store: slots are
//! taken once per request, not once per check of a flood.

use std::{sync::LazyLock, time::Duration};

use redis::{Cmd, Script, Value};

use super::{backend::evalsha, RedisStore};
use crate::{
    store::{micros, BoxFuture, KeyBuf, Leases, StoreKey},
    Acquired, Error,
};

static ACQUIRE: LazyLock<Script> = prelude_script!("semaphore_acquire.lua");
static RENEW: LazyLock<Script> = prelude_script!("semaphore_renew.lua");
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/semaphore_release.lua")));

/// The suffix of the holders key.
const SUFFIX: &[u8] = b":c";

/// `EVALSHA` of `script` on `key`'s holders, with the server's clock.
fn call(script: &Script, key: StoreKey<'_>) -> Cmd {
    let mut buf = KeyBuf::new();
    key.write_base_with(SUFFIX, &mut buf);
    evalsha(
        script,
        1,
        |cmd| {
            cmd.arg(buf.as_bytes());
        },
        None,
    )
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

fn parse_acquired(reply: Value) -> Result<Acquired, Error> {
    let bad = |r: &Value| Error::InvalidReply(format!("acquire: expected {{0|1, holders}}: {r:?}"));
    let Value::Array(items) = &reply else {
        return Err(bad(&reply));
    };
    match items.as_slice() {
        [admitted, holders] => match (int(admitted), int(holders)) {
            (Some(a @ (0 | 1)), Some(n)) if n >= 0 => Ok(Acquired::new(a == 1, n as u64)),
            _ => Err(bad(&reply)),
        },
        _ => Err(bad(&reply)),
    }
}

fn parse_flag(what: &str, reply: Value) -> Result<bool, Error> {
    match int(&reply) {
        Some(0) => Ok(false),
        Some(1) => Ok(true),
        _ => Err(Error::InvalidReply(format!(
            "{what}: expected 0 or 1: {reply:?}"
        ))),
    }
}

impl Leases for RedisStore {
    fn acquire<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        limit: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Acquired, Error>> {
        let mut cmd = call(&ACQUIRE, key);
        cmd.arg(limit).arg(micros(lease)).arg(holder);
        Box::pin(async move { parse_acquired(self.backend.eval(&ACQUIRE, &cmd).await?) })
    }

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let mut cmd = call(&RENEW, key);
        cmd.arg(micros(lease)).arg(holder);
        Box::pin(async move { parse_flag("renew", self.backend.eval(&RENEW, &cmd).await?) })
    }

    fn release<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let mut cmd = call(&RELEASE, key);
        cmd.arg(holder);
        Box::pin(async move {
            parse_flag("release", self.backend.eval(&RELEASE, &cmd).await?).map(drop)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_checked() {
        let arr = |v: Vec<i64>| Value::Array(v.into_iter().map(Value::Int).collect());
        assert_eq!(
            parse_acquired(arr(vec![1, 3])).unwrap(),
            Acquired::new(true, 3)
        );
        assert_eq!(
            parse_acquired(arr(vec![0, 5])).unwrap(),
            Acquired::new(false, 5)
        );
        for bad in [
            arr(vec![2, 1]),
            arr(vec![1, -1]),
            arr(vec![1]),
            Value::Int(1),
        ] {
            assert!(matches!(parse_acquired(bad), Err(Error::InvalidReply(_))));
        }
        assert!(parse_flag("renew", Value::Int(1)).unwrap());
        assert!(!parse_flag("renew", Value::Int(0)).unwrap());
        assert!(parse_flag("renew", Value::Int(7)).is_err());
    }
}
