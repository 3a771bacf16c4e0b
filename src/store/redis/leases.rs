//! Concurrency slots in Redis: one script per operation (`lua/semaphore_*.lua`) on a ZSET of
//! holders scored by their deadline, under the key's holders key (`:c`, see `keys.rs`), so it
//! shares the rate limit's hash tag and cluster slot. Always sent alone, also by a batching
//! store: slots are taken once per request, not once per check of a flood.
//!
//! Acquires and renewals also keep the epoch marker (one per server, or per hash slot on a
//! cluster), by which a limiter that saw the old epoch notices that Redis lost its slots
//! (`lua/semaphore_epoch.lua`). Holders released while a renewal of theirs got no answer are
//! kept (`:cx`) for a lease, so that renewal does not put them back.

use std::{sync::LazyLock, time::Duration};

use redis::{Script, Value};

use super::{keys, link::evalsha, RedisStore};
use crate::{
    error::Error,
    store::{micros, Acquired, BoxFuture, KeyBuf, SlotTerms, StoreKey},
};

/// A script that follows the prelude and the epoch's functions.
macro_rules! epoch_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../../lua/prelude.lua"),
                include_str!("../../../lua/semaphore_epoch.lua"),
                include_str!(concat!("../../../lua/", $file))
            ))
        })
    };
}

static ACQUIRE: LazyLock<Script> = epoch_script!("semaphore_acquire.lua");
static RENEW: LazyLock<Script> = epoch_script!("semaphore_renew.lua");
static RELEASE: LazyLock<Script> = prelude_script!("semaphore_release.lua");

/// The keys of one call on `key`'s slots: its holders, and the epoch marker of the server (on a
/// cluster, of the holders' hash slot, so that one script reaches both).
struct Keys {
    holders: KeyBuf,
    marker: KeyBuf,
    /// What the marker stands for: 0 for a server, the hash slot on a cluster.
    unit: u16,
}

impl Keys {
    fn new(key: StoreKey<'_>, cluster: bool) -> Self {
        let mut holders = KeyBuf::new();
        keys::write_key(key, keys::HOLDERS, &mut holders);
        let unit = if cluster {
            keys::slot(holders.as_bytes())
        } else {
            0
        };
        let mut marker = KeyBuf::new();
        keys::write_epoch(key.namespace(), cluster.then_some(unit), &mut marker);
        Self {
            holders,
            marker,
            unit,
        }
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

/// An acquire's answer, the epoch, and how long admissions stay paused (µs).
fn parse_acquired(reply: Value) -> Result<(Acquired, u64, u64), Error> {
    let bad = |r: &Value| {
        Error::InvalidReply(format!(
            "acquire: expected {{0|1, holders, epoch, paused}}: {r:?}"
        ))
    };
    let Value::Array(items) = &reply else {
        return Err(bad(&reply));
    };
    let [admitted, holders, epoch, paused] = items.as_slice() else {
        return Err(bad(&reply));
    };
    match (int(admitted), int(holders), int(epoch), int(paused)) {
        (Some(a @ (0 | 1)), Some(n), Some(e), Some(p)) if n >= 0 && e > 0 && p >= 0 => {
            Ok((Acquired::new(a == 1, n as u64), e as u64, p as u64))
        }
        _ => Err(bad(&reply)),
    }
}

/// A renewal's answer (1: renewed; 0: put back; 2: released, not put back) and the epoch.
fn parse_renewed(reply: Value) -> Result<(i64, u64), Error> {
    let bad = |r: &Value| Error::InvalidReply(format!("renew: expected {{0|1|2, epoch}}: {r:?}"));
    let Value::Array(items) = &reply else {
        return Err(bad(&reply));
    };
    match items.as_slice() {
        [held, epoch] => match (int(held), int(epoch)) {
            (Some(h @ 0..=2), Some(e)) if e > 0 => Ok((h, e as u64)),
            _ => Err(bad(&reply)),
        },
        _ => Err(bad(&reply)),
    }
}

fn parse_released(reply: Value) -> Result<(), Error> {
    match int(&reply) {
        Some(0 | 1) => Ok(()),
        _ => Err(Error::InvalidReply(format!(
            "release: expected 0 or 1: {reply:?}"
        ))),
    }
}

/// The concurrency-slot calls of [`Backend`](crate::store::Backend) on a [`RedisStore`].
impl RedisStore {
    pub(super) fn acquire_holder<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        terms: &'a SlotTerms,
    ) -> BoxFuture<'a, Result<Acquired, Error>> {
        let keys = Keys::new(key, self.link.is_cluster());
        let mut cmd = evalsha(
            &ACQUIRE,
            2,
            |cmd| {
                cmd.arg(keys.holders.as_bytes()).arg(keys.marker.as_bytes());
            },
            None,
        );
        cmd.arg(terms.limit())
            .arg(micros(terms.ttl()))
            .arg(holder)
            .arg(terms.known_epoch(keys.unit))
            .arg(micros(terms.pause()));
        let unit = keys.unit;
        Box::pin(async move {
            let (acquired, epoch, paused) = parse_acquired(self.link.eval(&ACQUIRE, &cmd).await?)?;
            if terms.saw_epoch(unit, epoch) && paused > 0 {
                tracing::warn!(
                    namespace = key.namespace(),
                    paused = ?Duration::from_micros(paused),
                    "concurrency limit: redis lost the permits held (a restart, a flush); admitting no new request while the running ones put theirs back"
                );
            }
            Ok(acquired)
        })
    }

    pub(super) fn renew_holder<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        terms: &'a SlotTerms,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let keys = Keys::new(key, self.link.is_cluster());
        let mut released = KeyBuf::new();
        keys::write_key(key, keys::RELEASED, &mut released);
        let mut cmd = evalsha(
            &RENEW,
            3,
            |cmd| {
                cmd.arg(keys.holders.as_bytes())
                    .arg(keys.marker.as_bytes())
                    .arg(released.as_bytes());
            },
            None,
        );
        cmd.arg(micros(terms.ttl()))
            .arg(holder)
            .arg(terms.known_epoch(keys.unit))
            .arg(micros(terms.pause()));
        let unit = keys.unit;
        Box::pin(async move {
            let (held, epoch) = parse_renewed(self.link.eval(&RENEW, &cmd).await?)?;
            terms.saw_epoch(unit, epoch);
            Ok(held == 1)
        })
    }

    pub(super) fn release_holder<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        late_renewal: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let mut holders = KeyBuf::new();
        keys::write_key(key, keys::HOLDERS, &mut holders);
        let mut released = KeyBuf::new();
        if late_renewal.is_some() {
            keys::write_key(key, keys::RELEASED, &mut released);
        }
        let mut cmd = evalsha(
            &RELEASE,
            if late_renewal.is_some() { 2 } else { 1 },
            |cmd| {
                cmd.arg(holders.as_bytes());
                if late_renewal.is_some() {
                    cmd.arg(released.as_bytes());
                }
            },
            None,
        );
        cmd.arg(holder);
        if let Some(guard) = late_renewal {
            cmd.arg(micros(guard).max(1));
        }
        Box::pin(async move { parse_released(self.link.eval(&RELEASE, &cmd).await?) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_checked() {
        let arr = |v: Vec<i64>| Value::Array(v.into_iter().map(Value::Int).collect());
        assert_eq!(
            parse_acquired(arr(vec![1, 3, 7, 0])).unwrap(),
            (Acquired::new(true, 3), 7, 0)
        );
        assert_eq!(
            parse_acquired(arr(vec![0, 5, 7, 900])).unwrap(),
            (Acquired::new(false, 5), 7, 900)
        );
        for bad in [
            arr(vec![2, 1, 7, 0]),
            arr(vec![1, -1, 7, 0]),
            arr(vec![1, 1, 0, 0]),
            arr(vec![1, 1, 7, -1]),
            arr(vec![1, 3]),
            Value::Int(1),
        ] {
            assert!(matches!(parse_acquired(bad), Err(Error::InvalidReply(_))));
        }
        assert_eq!(parse_renewed(arr(vec![1, 7])).unwrap(), (1, 7));
        assert_eq!(parse_renewed(arr(vec![0, 7])).unwrap(), (0, 7));
        assert_eq!(parse_renewed(arr(vec![2, 7])).unwrap(), (2, 7));
        for bad in [
            arr(vec![3, 7]),
            arr(vec![1, 0]),
            arr(vec![1]),
            Value::Int(1),
        ] {
            assert!(matches!(parse_renewed(bad), Err(Error::InvalidReply(_))));
        }
        assert!(parse_released(Value::Int(1)).is_ok());
        assert!(parse_released(Value::Int(0)).is_ok());
        assert!(parse_released(Value::Int(7)).is_err());
    }

    #[test]
    fn the_epoch_marker_shares_the_holders_slot() {
        let k = crate::extract::Key::from("user-42");
        let keys = Keys::new(StoreKey::bounded("rl:concurrency", Some(&k), 128), true);
        assert_eq!(keys.holders.as_bytes(), b"{rl:concurrency:user-42}:c");
        let slot = keys::slot;
        assert_eq!(slot(keys.marker.as_bytes()), slot(keys.holders.as_bytes()));
        assert_eq!(keys.unit, slot(keys.holders.as_bytes()));
        let one = Keys::new(StoreKey::bounded("rl:concurrency", Some(&k), 128), false);
        assert_eq!(one.marker.as_bytes(), b"{rl:concurrency:#epoch}:c");
        assert_eq!(one.unit, 0);
    }
}
