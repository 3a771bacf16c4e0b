//! The sliding window's calls (`lua/sliding_window*.lua`): a log of admitted units and its
//! running total.

use std::sync::LazyLock;

use redis::Script;

use super::{parse_banned, reply, scripts, Args, Calls, Keys, ResetCall, ScriptCall, Scripts};
use crate::{
    algorithm::{Change, LogEntry, Outcome, Position, SlidingWindow},
    decision::Charge,
    error::Error,
    store::redis::keys,
    store::Pace,
};

static CHECK: Scripts = scripts!("sliding_window.lua", after "prelude.lua");
static PEEK: LazyLock<Script> = prelude_script!("sliding_window_peek.lua");
static REFUND: LazyLock<Script> =
    prelude_script!("sliding_window_refund.lua", after "sliding_window_take.lua");
static SETTLE: LazyLock<Script> =
    prelude_script!("sliding_window_settle.lua", after "sliding_window_take.lua");

/// The log, then its running total.
const STATE: &[&str] = &[keys::LOG, keys::LOG_TOTALS];

impl<'a> Calls<'a> for &'a SlidingWindow {
    fn check(self, cost: u32) -> ScriptCall<'a> {
        let w = self.rate();
        ScriptCall::builtin_check(
            &CHECK,
            Keys::Suffixes(STATE),
            Args::Three([u64::from(cost), w.window_us(), w.limit()]),
        )
    }

    fn parse(self, _cost: u32, reply: redis::Value) -> Result<Outcome, Error> {
        match parse_banned(&reply) {
            Some(banned) => banned,
            None => parse_logged(reply),
        }
    }

    /// No marker: a second run finds its entry gone.
    fn refund(self, charge: &Charge, _resendable: bool) -> Result<Option<ScriptCall<'a>>, Error> {
        let w = self.rate();
        let Position::Logged(e) = charge.position else {
            return Ok(None); // no log entry: nothing it provably holds
        };
        let args = vec![
            u64::from(charge.cost()),
            w.window_us(),
            w.limit(),
            e.at_us,
            e.seq,
        ];
        Ok(Some(ScriptCall::alone(
            &REFUND,
            Keys::Suffixes(STATE),
            args,
        )))
    }

    fn settle(
        self,
        charge: &Charge,
        actual: u32,
        resendable: bool,
    ) -> Result<Option<ScriptCall<'a>>, Error> {
        let w = self.rate();
        let (at, seq) = match (Change::of(charge.cost(), actual), &charge.position) {
            (Change::None, _) => return Ok(None),
            (Change::Down(_), Position::Logged(e)) => (e.at_us, e.seq),
            (Change::Down(_), _) => return Ok(None), // no log entry: nothing it provably holds
            (Change::Up(_), _) => (0, 0),
        };
        let cost = u64::from(charge.cost());
        let args = vec![cost, w.window_us(), w.limit(), u64::from(actual), at, seq];
        let call = ScriptCall::alone(&SETTLE, Keys::Suffixes(STATE), args);
        Ok(Some(call.marked(resendable)))
    }

    fn peek(self) -> Result<ScriptCall<'a>, Error> {
        let w = self.rate();
        let args = vec![w.window_us(), w.limit()];
        Ok(ScriptCall::alone(&PEEK, Keys::Suffixes(STATE), args).with_ban())
    }

    fn reset(self) -> ResetCall<'a> {
        ScriptCall::reset(Keys::Suffixes(&[keys::LOG_TOTALS, keys::LOG]), vec![2])
    }

    fn reserve(self, _cost: u32, _up_to: u32) -> Result<ScriptCall<'a>, Error> {
        Err(super::not_reserved())
    }

    fn schedule(self, _cost: u32, _budget_us: u64, _pace: Pace) -> Result<ScriptCall<'a>, Error> {
        Err(super::not_scheduled())
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
