//! The token bucket's calls (`lua/token_bucket*.lua`): whole tokens and the time of the last
//! credit, in one hash per key.

use std::sync::LazyLock;

use redis::Script;

use super::{
    gcra, parse_banned, reply, scripts, Args, Calls, Keys, ResetCall, ScriptCall, Scripts,
};
use crate::{
    algorithm::{Outcome, Placed, Position, TokenBucket},
    decision::Charge,
    error::Error,
    store::redis::keys,
    store::Pace,
};

static CHECK: Scripts = scripts!("token_bucket.lua", after "prelude.lua");
static PEEK: LazyLock<Script> = prelude_script!("token_bucket_peek.lua");
static REFUND: LazyLock<Script> =
    prelude_script!("token_bucket_refund.lua", after "refund_ledger.lua");
static SETTLE: LazyLock<Script> =
    prelude_script!("token_bucket_settle.lua", after "refund_ledger.lua", "settle.lua");
static RESERVE: LazyLock<Script> = prelude_script!("token_bucket_reserve.lua");
static SCHEDULE: LazyLock<Script> = prelude_script!("token_bucket_schedule.lua");

impl<'a> Calls<'a> for &'a TokenBucket {
    fn check(self, cost: u32) -> ScriptCall<'a> {
        let r = self.rate();
        ScriptCall::builtin_check(
            &CHECK,
            Keys::Suffixes(&[keys::BUCKET]),
            Args::Three([u64::from(cost), r.emission_us(), r.burst()]),
        )
    }

    fn parse(self, _cost: u32, reply: redis::Value) -> Result<Outcome, Error> {
        match parse_banned(&reply) {
            Some(banned) => banned,
            None => parse_placed(reply),
        }
    }

    fn refund(self, charge: &Charge, resendable: bool) -> Result<Option<ScriptCall<'a>>, Error> {
        let state = &[keys::BUCKET, keys::BUCKET_LEDGER];
        Ok(gcra::bucket_refund(
            &REFUND,
            state,
            self.rate(),
            charge,
            resendable,
        ))
    }

    fn settle(
        self,
        charge: &Charge,
        actual: u32,
        resendable: bool,
    ) -> Result<Option<ScriptCall<'a>>, Error> {
        let state = &[keys::BUCKET, keys::BUCKET_LEDGER];
        Ok(gcra::bucket_settle(
            &SETTLE,
            state,
            self.rate(),
            (charge, actual),
            resendable,
        ))
    }

    fn peek(self) -> Result<ScriptCall<'a>, Error> {
        Ok(gcra::bucket_peek(&PEEK, &[keys::BUCKET], self.rate()))
    }

    fn reset(self) -> ResetCall<'a> {
        let keys = Keys::Suffixes(&[keys::BUCKET, keys::BUCKET_LEDGER]);
        ScriptCall::reset(keys, vec![0, self.rate().tolerance_us()])
    }

    fn reserve(self, cost: u32, up_to: u32) -> Result<ScriptCall<'a>, Error> {
        Ok(gcra::reserve(
            &RESERVE,
            &[keys::BUCKET],
            self.rate(),
            cost,
            up_to,
        ))
    }

    fn schedule(self, cost: u32, budget_us: u64, pace: Pace) -> Result<ScriptCall<'a>, Error> {
        let r = self.rate();
        gcra::schedule(&SCHEDULE, &[keys::BUCKET], r, (cost, budget_us), pace)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::algorithms::ints;
    use redis::Value::{self, Int};

    #[test]
    fn an_admission_names_when_it_was_admitted() {
        let o = parse_placed(ints(&[1, 4, 0, 900, 5_000])).unwrap();
        assert_eq!((o.allowed, o.remaining, o.reset_after_us), (true, 4, 900));
        let p = o.position.placed().unwrap();
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
        for other in [Value::Nil, Int(1), Value::Array(vec![Value::Nil; 5])] {
            assert!(parse_placed(other.clone()).is_err(), "{other:?}");
        }
    }
}
