//! The multi-limit's calls (`lua/multi_gcra.lua`, and GCRA's peek and refund scripts, which
//! take several limits; budgets' refunds and settlements by `lua/multi_gcra_settle.lua`): one
//! GCRA per limit, each under `:q:NAME`.

use std::sync::LazyLock;

use redis::Script;

use super::{
    gcra, parse_banned, reply, scripts, Args, Calls, Keys, ResetCall, ScriptCall, Scripts,
};
use crate::{
    algorithm::{Algorithm, BucketRate, Change, MultiLimit, Outcome, Placed, Position},
    decision::Charge,
    error::Error,
    store::Pace,
};

static CHECK: Scripts = scripts!("multi_gcra.lua", after "gcra_core.lua");
/// Budgets' settlements and refunds: each limit with its own cost and figure.
static SETTLE: LazyLock<Script> = prelude_script!(
    "multi_gcra_settle.lua",
    after "refund_ledger.lua",
    "gcra_state.lua",
    "settle.lua"
);

/// Each limit's emission interval and burst, after `first`.
fn rates_after(first: Option<u64>, rates: &[BucketRate], extra: usize) -> Vec<u64> {
    let mut args = Vec::with_capacity(1 + 2 * rates.len() + extra);
    args.extend(first);
    for r in rates {
        args.extend([r.emission_us(), r.burst()]);
    }
    args
}

impl<'a> Calls<'a> for &'a MultiLimit {
    fn check(self, cost: u32) -> ScriptCall<'a> {
        let cost = u64::from(cost);
        let mut args = rates_after(Some(cost), self.rates(), self.rates().len());
        if self.has_fixed_costs() {
            args.extend(self.costs(cost));
        }
        ScriptCall::builtin_check(&CHECK, Keys::Parts(self.parts()), Args::List(args))
    }

    fn parse(self, _cost: u32, reply: redis::Value) -> Result<Outcome, Error> {
        match parse_banned(&reply) {
            Some(banned) => banned,
            None => parse_multi(reply),
        }
    }

    fn refund(self, charge: &Charge, resendable: bool) -> Result<Option<ScriptCall<'a>>, Error> {
        if self.has_fixed_costs() {
            let each: Vec<_> = self
                .costs(u64::from(charge.cost()))
                .map(|c| (c, 0))
                .collect();
            return Ok(settle_call(self, charge, &each, resendable));
        }
        let rates = self.rates();
        let Some(p) = charge
            .position
            .placed()
            .filter(|p| p.ends().len() == rates.len())
        else {
            return Ok(None); // not placed on these limits' times: nothing it provably holds
        };
        let mut args = rates_after(Some(u64::from(charge.cost())), rates, 1 + rates.len());
        args.push(p.at_us);
        args.extend(p.ends());
        let keys = Keys::PartsAndLedgers(self.parts());
        Ok(Some(
            ScriptCall::alone(&gcra::REFUND, keys, args).marked(resendable),
        ))
    }

    fn settle(
        self,
        charge: &Charge,
        actual: u32,
        resendable: bool,
    ) -> Result<Option<ScriptCall<'a>>, Error> {
        if !self.settles() {
            return Err(super::not_settled());
        }
        if Change::of(charge.cost(), actual) == Change::None {
            return Ok(None);
        }
        let each = self.settled(charge.cost(), actual);
        Ok(settle_call(self, charge, &each, resendable))
    }

    fn peek(self) -> Result<ScriptCall<'a>, Error> {
        let args = rates_after(None, self.rates(), 0);
        Ok(ScriptCall::alone(&gcra::PEEK, Keys::Parts(self.parts()), args).with_ban())
    }

    fn reset(self) -> ResetCall<'a> {
        let leads = std::iter::once(0).chain(self.rates().iter().map(BucketRate::tolerance_us));
        ScriptCall::reset(Keys::PartsAndLedgers(self.parts()), leads.collect())
    }

    fn reserve(self, _cost: u32, _up_to: u32) -> Result<ScriptCall<'a>, Error> {
        Err(super::not_reserved())
    }

    fn schedule(self, _cost: u32, _budget_us: u64, _pace: Pace) -> Result<ScriptCall<'a>, Error> {
        Err(super::not_scheduled())
    }
}

/// Budgets' settlement of each limit's charge `(cost, actual)` (a refund: every limit to 0):
/// where the charge lies on each limit's time, which settling down needs; `None` below a
/// charge the store did not place.
fn settle_call<'a>(
    multi: &'a MultiLimit,
    charge: &Charge,
    each: &[(u64, u64)],
    resendable: bool,
) -> Option<ScriptCall<'a>> {
    let rates = multi.rates();
    let placed = charge
        .position
        .placed()
        .filter(|p| p.ends().len() == rates.len());
    let down = each.iter().any(|(c, a)| a < c);
    if down && placed.is_none() {
        return None; // not placed on these limits' times: nothing it provably holds
    }
    let mut args = Vec::with_capacity(1 + 5 * rates.len());
    args.push(placed.map_or(0, |p| p.at_us));
    for (i, (r, &(cost, actual))) in rates.iter().zip(each).enumerate() {
        let end = placed.map_or(0, |p| p.ends()[i]);
        args.extend([r.emission_us(), r.burst(), cost, actual, end]);
    }
    let keys = Keys::PartsAndLedgers(multi.parts());
    Some(ScriptCall::alone(&SETTLE, keys, args).marked(resendable))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::algorithms::ints;
    use redis::Value::{self, Int};

    #[test]
    fn an_admission_names_when_it_was_admitted() {
        let multi = parse_multi(ints(&[1, 3, 0, 10, 1, 5, 0, 20, 3, 0, 10, 7_000])).unwrap();
        assert_eq!(multi.position.placed().unwrap().ends(), &[7_020, 7_010]);
        assert_eq!(multi.binding, 1);
    }

    #[test]
    fn broken_replies_are_errors() {
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
            assert!(parse_multi(other.clone()).is_err(), "{other:?}");
        }
    }
}
