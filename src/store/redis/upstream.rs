//! What upstreams said, in Redis: `lua/upstream_take.lua` and `lua/upstream_learn.lua` on a
//! hash under `{prefix:policy:key}:u` (the throttle's hash tag and cluster slot).

use std::{sync::LazyLock, time::Duration};

use redis::{Cmd, Script, Value};

use super::{backend::evalsha, RedisStore};
use crate::{
    store::{
        micros,
        upstream::{Blind, Gate, Learned, Upstreams},
        BoxFuture, KeyBuf, StoreKey,
    },
    Error,
};

static TAKE: LazyLock<Script> = prelude_script!("upstream_take.lua");
static LEARN: LazyLock<Script> = prelude_script!("upstream_learn.lua");

/// The largest time a script takes: 2^52 µs, as the prelude checks.
const MAX_US: u64 = 1 << 52;

fn call(script: &Script, key: StoreKey<'_>) -> Cmd {
    let mut buf = KeyBuf::new();
    key.write_base_with(b":u", &mut buf);
    evalsha(
        script,
        1,
        |cmd| {
            cmd.arg(buf.as_bytes());
        },
        None,
    )
}

fn parse_gate(reply: Value) -> Result<Gate, Error> {
    let bad =
        |why: String| Error::InvalidReply(format!("take: expected {{0|1, wait, 0|1|2}}: {why}"));
    let items: Vec<i64> = redis::from_redis_value(reply.clone()).map_err(|e| bad(e.to_string()))?;
    match items.as_slice() {
        [1, 0, how @ (0..=2)] => {
            let how = [Blind::Counted, Blind::Blind, Blind::Probe][*how as usize];
            Ok(Gate::new(true, Duration::ZERO).blind(how))
        }
        [0, wait, 0] if *wait > 0 => Ok(Gate::new(false, Duration::from_micros(*wait as u64))),
        _ => Err(bad(format!("{reply:?}"))),
    }
}

impl Upstreams for RedisStore {
    fn take<'a>(&'a self, key: StoreKey<'a>, cost: u32) -> BoxFuture<'a, Result<Gate, Error>> {
        let mut cmd = call(&TAKE, key);
        cmd.arg(cost);
        Box::pin(async move { parse_gate(self.backend.eval(&TAKE, &cmd).await?) })
    }

    fn learn<'a>(
        &'a self,
        key: StoreKey<'a>,
        learned: Learned,
        how: Blind,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let mut cmd = call(&LEARN, key);
        let us = |d: Option<Duration>| d.map_or(0, |d| micros(d).min(MAX_US));
        cmd.arg(us(learned.pause));
        match (learned.remaining, learned.reset) {
            (Some(r), Some(t)) => cmd.arg(r.min(MAX_US)).arg(us(Some(t))),
            _ => cmd.arg(-1).arg(-1),
        };
        cmd.arg(match how {
            Blind::Counted => 0,
            Blind::Blind => 1,
            Blind::Probe => 2,
        });
        Box::pin(async move {
            self.backend.eval(&LEARN, &cmd).await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_replies_are_checked() {
        let arr = |v: Vec<i64>| Value::Array(v.into_iter().map(Value::Int).collect());
        assert!(parse_gate(arr(vec![1, 0, 0])).unwrap().go);
        assert_eq!(parse_gate(arr(vec![1, 0, 1])).unwrap().blind, Blind::Blind);
        assert_eq!(parse_gate(arr(vec![1, 0, 2])).unwrap().blind, Blind::Probe);
        assert_eq!(
            parse_gate(arr(vec![0, 1500, 0])).unwrap(),
            Gate::new(false, Duration::from_micros(1500))
        );
        for bad in [
            arr(vec![0, 0, 0]),
            arr(vec![1, 5, 0]),
            arr(vec![2, 0, 0]),
            arr(vec![0, -3, 0]),
            arr(vec![1, 0]),
            arr(vec![1, 0, 3]),
        ] {
            assert!(parse_gate(bad).is_err());
        }
    }
}
