//! The fixed window's calls (`lua/fixed_window*.lua`, after `fixed_window_core.lua`): one
//! string per key, the current window's id and count.

use std::sync::LazyLock;

use redis::Script;

use super::{parse_banned, reply, scripts, Args, Calls, Keys, ResetCall, ScriptCall, Scripts};
use crate::{
    algorithm::{Change, FixedWindow, Outcome, Position},
    decision::Charge,
    error::Error,
    store::redis::keys,
    store::Pace,
};

static CHECK: Scripts = scripts!("fixed_window.lua", after "prelude.lua", "fixed_window_core.lua");
static PEEK: LazyLock<Script> =
    prelude_script!("fixed_window_peek.lua", after "fixed_window_core.lua");
static REFUND: LazyLock<Script> =
    prelude_script!("fixed_window_refund.lua", after "fixed_window_core.lua");
static SETTLE: LazyLock<Script> =
    prelude_script!("fixed_window_settle.lua", after "fixed_window_core.lua");

/// The arguments every fixed-window script takes: the cost, the limit, the period (0 for a
/// calendar window) and the calendar (0 for a period).
fn args(window: &FixedWindow, cost: u64) -> [u64; 4] {
    let [period, calendar] = window.span_args();
    [cost, window.limit(), period, calendar]
}

impl<'a> Calls<'a> for &'a FixedWindow {
    fn check(self, cost: u32) -> ScriptCall<'a> {
        ScriptCall::builtin_check(
            &CHECK,
            Keys::Suffixes(&[keys::WINDOW]),
            Args::List(args(self, u64::from(cost)).to_vec()),
        )
    }

    fn parse(self, _cost: u32, reply: redis::Value) -> Result<Outcome, Error> {
        match parse_banned(&reply) {
            Some(banned) => banned,
            None => parse_counted(reply),
        }
    }

    fn refund(self, charge: &Charge, resendable: bool) -> Result<Option<ScriptCall<'a>>, Error> {
        let Position::Window { id } = charge.position else {
            return Ok(None); // no window: nothing it provably holds
        };
        let mut args = args(self, u64::from(charge.cost())).to_vec();
        args.push(id);
        let keys = Keys::Suffixes(&[keys::WINDOW]);
        Ok(Some(
            ScriptCall::alone(&REFUND, keys, args).marked(resendable),
        ))
    }

    fn settle(
        self,
        charge: &Charge,
        actual: u32,
        resendable: bool,
    ) -> Result<Option<ScriptCall<'a>>, Error> {
        let id = match (Change::of(charge.cost(), actual), &charge.position) {
            (Change::None, _) => return Ok(None),
            (Change::Down(_), Position::Window { id }) => *id,
            (Change::Down(_), _) => return Ok(None), // no window: nothing it provably holds
            (Change::Up(_), _) => 0,
        };
        let mut args = args(self, u64::from(charge.cost())).to_vec();
        args.extend([u64::from(actual), id]);
        let keys = Keys::Suffixes(&[keys::WINDOW]);
        Ok(Some(
            ScriptCall::alone(&SETTLE, keys, args).marked(resendable),
        ))
    }

    fn peek(self) -> Result<ScriptCall<'a>, Error> {
        let args = args(self, 1).to_vec();
        Ok(ScriptCall::alone(&PEEK, Keys::Suffixes(&[keys::WINDOW]), args).with_ban())
    }

    fn reset(self) -> ResetCall<'a> {
        ScriptCall::reset(Keys::Suffixes(&[keys::WINDOW]), vec![3])
    }

    fn reserve(self, _cost: u32, _up_to: u32) -> Result<ScriptCall<'a>, Error> {
        Err(super::not_reserved())
    }

    fn schedule(self, _cost: u32, _budget_us: u64, _pace: Pace) -> Result<ScriptCall<'a>, Error> {
        Err(super::not_scheduled())
    }
}

/// A fixed window's reply: the shared 4 integers, then, when admitted, the window's id.
fn parse_counted(reply: redis::Value) -> Result<Outcome, Error> {
    let items = reply::ints(reply)?;
    match *items.as_slice() {
        [allowed @ 1, remaining, retry, reset, id] => {
            let Ok(id) = u64::try_from(id) else {
                return Err(Error::InvalidReply(format!("negative window in {items:?}")));
            };
            let mut o = Outcome::from_ints(&[allowed, remaining, retry, reset])?;
            o.position = Position::Window { id };
            Ok(o)
        }
        [0, _, _, _] => Outcome::from_ints(&items),
        _ => Err(Error::InvalidReply(format!(
            "expected 4 integers when denied, 5 when admitted: {items:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::algorithms::ints;

    #[test]
    fn an_admission_names_its_window_and_broken_replies_are_errors() {
        let o = parse_counted(ints(&[1, 4, 0, 900, 5_000])).unwrap();
        assert_eq!(
            (o.allowed, o.remaining, o.position),
            (true, 4, Position::Window { id: 5_000 })
        );
        assert!(!parse_counted(ints(&[0, 0, 900, 900])).unwrap().allowed);
        for bad in [
            &[1, 4, 0, 900][..],
            &[0, 4, 900, 900, 1],
            &[1, 4, 0, 900, -1],
            &[2, 0, 5, 5, 1],
            &[1, 4, 0],
        ] {
            assert!(
                matches!(parse_counted(ints(bad)), Err(Error::InvalidReply(_))),
                "{bad:?}"
            );
        }
    }
}
