//! GCRA's calls (`lua/gcra*.lua`): one integer per key, the theoretical arrival time.

use std::sync::LazyLock;

use redis::Script;

use super::{parse_banned, scripts, Args, Calls, Keys, ResetCall, ScriptCall, Scripts};
use crate::{
    algorithm::{BucketRate, Change, Gcra, Outcome, Placed, Position},
    decision::Charge,
    error::Error,
    store::redis::{batch::Layout, keys},
    store::Pace,
};

/// GCRA has a batch script of its own (one `MGET` for the whole batch instead of a `GET` per
/// check, its checks' arguments once per run of checks that share them: see
/// `batch::Layout::Gcra`).
static CHECK: Scripts = scripts!("gcra.lua", alone, batch: "gcra_batch.lua");
/// A read without a check, of one limit or several (the multi-limit's).
pub(super) static PEEK: LazyLock<Script> = prelude_script!("gcra_peek.lua", after "gcra_state.lua");
/// A refund, of one limit or several (the multi-limit's).
pub(super) static REFUND: LazyLock<Script> =
    prelude_script!("gcra_refund.lua", after "refund_ledger.lua", "gcra_state.lua");
/// A settlement of a check's charge (one limit).
static SETTLE: LazyLock<Script> = prelude_script!(
    "gcra_settle.lua",
    after "refund_ledger.lua",
    "gcra_state.lua",
    "settle.lua"
);
static RESERVE: LazyLock<Script> = gcra_script!("gcra_reserve.lua");
static SCHEDULE: LazyLock<Script> = gcra_script!("gcra_schedule.lua");

impl<'a> Calls<'a> for &'a Gcra {
    fn check(self, cost: u32) -> ScriptCall<'a> {
        ScriptCall {
            ban: false,
            time_last: true,
            layout: Layout::Gcra,
            ..ScriptCall::builtin_check(
                &CHECK,
                Keys::Suffixes(&[keys::GCRA]),
                Args::Three(check_args(self.rate(), u64::from(cost))),
            )
        }
    }

    fn parse(self, cost: u32, reply: redis::Value) -> Result<Outcome, Error> {
        parse_gcra(reply, self.rate(), u64::from(cost))
    }

    fn refund(self, charge: &Charge, resendable: bool) -> Result<Option<ScriptCall<'a>>, Error> {
        let state = &[keys::GCRA, keys::GCRA_LEDGER];
        Ok(bucket_refund(
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
        let state = &[keys::GCRA, keys::GCRA_LEDGER];
        Ok(bucket_settle(
            &SETTLE,
            state,
            self.rate(),
            (charge, actual),
            resendable,
        ))
    }

    fn peek(self) -> Result<ScriptCall<'a>, Error> {
        Ok(bucket_peek(&PEEK, &[keys::GCRA], self.rate()))
    }

    fn reset(self) -> ResetCall<'a> {
        let keys = Keys::Suffixes(&[keys::GCRA, keys::GCRA_LEDGER]);
        ScriptCall::reset(keys, vec![1, self.rate().tolerance_us()])
    }

    fn reserve(self, cost: u32, up_to: u32) -> Result<ScriptCall<'a>, Error> {
        Ok(reserve(&RESERVE, &[keys::GCRA], self.rate(), cost, up_to))
    }

    fn schedule(self, cost: u32, budget_us: u64, pace: Pace) -> Result<ScriptCall<'a>, Error> {
        schedule(
            &SCHEDULE,
            &[keys::GCRA],
            self.rate(),
            (cost, budget_us),
            pace,
        )
    }
}

// What GCRA and the token bucket share: their refunds, peeks and reservations take the same
// arguments, on their own state keys.

/// A place in a bucket's time (see [`Pace`]) by its script, on its state key `state`.
pub(super) fn schedule(
    script: &'static Script,
    state: &'static [&'static str],
    rate: BucketRate,
    (cost, budget_us): (u32, u64),
    pace: Pace,
) -> Result<ScriptCall<'static>, Error> {
    if cost == 0 {
        return Err(Error::InvalidInput("cost must be at least 1"));
    }
    let args = vec![
        u64::from(cost),
        rate.emission_us(),
        rate.burst(),
        budget_us.min(crate::quota::MAX_EXACT),
        pace.arg(),
    ];
    Ok(ScriptCall::alone(script, Keys::Suffixes(state), args).with_ban())
}

/// A refund of `charge` by a bucket's script (on its state and its ledger, `state`): where the
/// charge lies on the key's time; `None` when the store did not say.
pub(super) fn bucket_refund(
    script: &'static Script,
    state: &'static [&'static str],
    rate: BucketRate,
    charge: &Charge,
    resendable: bool,
) -> Option<ScriptCall<'static>> {
    // Not placed on this key's time: nothing it provably holds.
    let p = charge.position.placed().filter(|p| p.ends().len() == 1)?;
    let args = vec![
        u64::from(charge.cost()),
        rate.emission_us(),
        rate.burst(),
        p.at_us,
        p.ends()[0],
    ];
    Some(ScriptCall::alone(script, Keys::Suffixes(state), args).marked(resendable))
}

/// A settlement of `charge` to `actual` units by a bucket's script (on its state and its
/// ledger, `state`): where the charge lies on the key's time, which settling down needs;
/// `None` when there is nothing to do (the figure is the charge, or below a charge the store
/// did not place).
pub(super) fn bucket_settle(
    script: &'static Script,
    state: &'static [&'static str],
    rate: BucketRate,
    (charge, actual): (&Charge, u32),
    resendable: bool,
) -> Option<ScriptCall<'static>> {
    let placed = charge.position.placed().filter(|p| p.ends().len() == 1);
    let (at, end) = match Change::of(charge.cost(), actual) {
        Change::None => return None,
        Change::Down(_) => placed.map(|p| (p.at_us, p.ends()[0]))?,
        Change::Up(_) => (0, 0),
    };
    let args = vec![
        u64::from(charge.cost()),
        rate.emission_us(),
        rate.burst(),
        u64::from(actual),
        at,
        end,
    ];
    Some(ScriptCall::alone(script, Keys::Suffixes(state), args).marked(resendable))
}

/// A read of a bucket's `state` without a check, the key's ban after it.
pub(super) fn bucket_peek(
    script: &'static Script,
    state: &'static [&'static str],
    rate: BucketRate,
) -> ScriptCall<'static> {
    let args = vec![rate.emission_us(), rate.burst()];
    ScriptCall::alone(script, Keys::Suffixes(state), args).with_ban()
}

/// A reservation of a bucket rate's units (GCRA's or the token bucket's script, on the state
/// under `state`), the key's ban after it.
pub(super) fn reserve(
    script: &'static Script,
    state: &'static [&'static str],
    rate: BucketRate,
    cost: u32,
    up_to: u32,
) -> ScriptCall<'static> {
    let args = vec![
        u64::from(cost),
        rate.emission_us(),
        rate.burst(),
        u64::from(up_to),
    ];
    ScriptCall::alone(script, Keys::Suffixes(state), args).with_ban()
}

/// GCRA's check arguments (see `lua/gcra.lua`): the step (`cost` × the emission interval, or
/// the tolerance + 1 when the cost exceeds the burst, so that the check is denied), the
/// tolerance, and how long a rested key lives once charged (the step in whole ms, rounded up).
/// A [`BucketRate`] holds emission × burst to 2^52, so every value is at most 2^52 + 1.
pub(crate) fn check_args(rate: BucketRate, cost: u64) -> [u64; 3] {
    let tolerance = rate.tolerance_us();
    let step = if cost > rate.burst() {
        tolerance + 1
    } else {
        cost * rate.emission_us()
    };
    [step, tolerance, step.div_ceil(1_000)]
}

/// GCRA's reply (see `lua/gcra.lua`) to a check of `cost` sent with `rate`'s arguments, as the
/// full outcome, with the in-memory twin's maths (`algorithm::gcra::decide`): admitted, the
/// string `TAT SECS USECS` (or, from a batch, `{TAT - now, now}`); denied, the integer
/// `now - TAT` (0 or less); banned, the shared `{2, 0, left, left}`. A reply that no check of
/// `cost` under `rate` can give is an [`Error::InvalidReply`].
fn parse_gcra(reply: redis::Value, rate: BucketRate, cost: u64) -> Result<Outcome, Error> {
    use redis::Value::{Array, BulkString, Int};
    let (emission, tolerance) = (rate.emission_us(), rate.tolerance_us());
    let bad = |reply: &redis::Value| {
        Err(Error::InvalidReply(format!(
            "a GCRA check of {cost} answered {reply:?}"
        )))
    };
    let admitted = |now: u64, tat: u64| {
        let reset = tat.checked_sub(now)?;
        // An admitted check moved the TAT by its step from now or later, and left it within the
        // tolerance of now.
        if cost > rate.burst() || reset < cost * emission || reset > tolerance {
            return None;
        }
        let mut o = Outcome::single(true, (tolerance - reset) / emission, Some(0), reset);
        o.position =
            Position::Placed(Placed::read(i64::try_from(now).ok()?, [reset].into_iter()).ok()?);
        Some(o)
    };
    let outcome = match &reply {
        Int(r) if *r <= 0 && r.unsigned_abs() <= crate::quota::MAX_EXACT => {
            let reset = r.unsigned_abs();
            let remaining = tolerance.saturating_sub(reset) / emission;
            let retry = if cost > rate.burst() {
                None
            } else {
                // Denied: the step from the TAT goes past the tolerance.
                match (reset + cost * emission).checked_sub(tolerance) {
                    Some(wait) if wait > 0 => Some(wait),
                    _ => return bad(&reply),
                }
            };
            Some(Outcome::single(false, remaining, retry, reset))
        }
        BulkString(text) => {
            let mut words = text.split(|&b| b == b' ').map(|w| {
                std::str::from_utf8(w)
                    .ok()
                    .filter(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|w| w.parse::<u64>().ok())
            });
            match (words.next(), words.next(), words.next(), words.next()) {
                (Some(Some(tat)), Some(Some(secs)), Some(Some(usecs)), None) => secs
                    .checked_mul(1_000_000)
                    .and_then(|s| s.checked_add(usecs))
                    .and_then(|now| admitted(now, tat)),
                _ => None,
            }
        }
        Array(items) => match items.as_slice() {
            [Int(reset), Int(now)] if *reset > 0 && *now >= 0 => {
                admitted(*now as u64, (*now as u64).saturating_add(*reset as u64))
            }
            _ => return parse_banned(&reply).unwrap_or_else(|| bad(&reply)),
        },
        _ => None,
    };
    outcome.map_or_else(|| bad(&reply), Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::algorithms::ints;
    use redis::Value::{self, Int};

    fn rate(per_second: u32, burst: u32) -> BucketRate {
        Gcra::new(crate::Quota::per_second(per_second).burst(burst))
            .unwrap()
            .rate()
    }

    #[test]
    fn check_arguments_are_what_the_script_needs() {
        // 10 a second, burst 5: emission 100 ms, tolerance 500 ms.
        let r = rate(10, 5);
        assert_eq!(check_args(r, 1), [100_000, 500_000, 100]);
        assert_eq!(check_args(r, 5), [500_000, 500_000, 500]);
        // Above the burst: one more than the tolerance, never admitted.
        assert_eq!(check_args(r, 6), [500_001, 500_000, 501]);
        // A step under a millisecond lives a whole one.
        assert_eq!(check_args(rate(1_000_000, 1), 1), [1, 1, 1]);
    }

    /// GCRA's replies read as the in-memory twin's outcome of the same check.
    #[test]
    fn gcra_replies_read_as_the_twins_outcome() {
        use crate::algorithm::gcra::decide;
        let r = rate(10, 5);
        let now = 1_700_000_000_123_456u64;
        for stored in [
            None,
            Some(now - 7),
            Some(now + 150_000),
            Some(now + 450_000),
        ] {
            for cost in 1..=6u64 {
                let (want, write) = decide(r, stored, now, cost);
                let reply = match write {
                    Some(tat) => {
                        let text = format!("{tat} {} {}", now / 1_000_000, now % 1_000_000);
                        Value::BulkString(text.into_bytes())
                    }
                    None => Int(-(want.reset_after_us as i64)),
                };
                let got = parse_gcra(reply, r, cost).unwrap();
                assert_eq!(got, want, "{stored:?} {cost}");
                assert_eq!(got.position, want.position, "{stored:?} {cost}");
                if let Some(tat) = write {
                    // The batch form: {TAT - now, now}.
                    let batched = ints(&[(tat - now) as i64, now as i64]);
                    let got = parse_gcra(batched, r, cost).unwrap();
                    assert_eq!((got.clone(), got.position), (want.clone(), want.position));
                }
            }
        }
        let banned = parse_gcra(ints(&[2, 0, 700, 700]), r, 1).unwrap();
        assert!(banned.banned && !banned.allowed);
    }

    #[test]
    fn broken_gcra_replies_are_errors() {
        let r = rate(10, 5);
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        for (bad, cost) in [
            (Int(1), 1),                    // positive: admitted needs its time
            (Int(-300_000), 2),             // denied though the cost fits
            (Int(-(1 << 53)), 1),           // past 2^52
            (text("1000100000 1000 0"), 1), // TAT - now = 100 ms, fine, but ...
            (text("1000100000 1000 0"), 6), // ... not for a cost above the burst
            (text("1000050000 1000 0"), 1), // moved by less than the step
            (text("1000600000 1000 0"), 1), // beyond the tolerance
            (text("999000000 1000 0"), 1),  // before now
            (text("1000100000 1000"), 1),   // no microseconds
            (text("1000100000 1000 0 0"), 1),
            (text("1000100000  1000 0"), 1),
            (text("1000100000 -1000 0"), 1),
            (text("x 1000 0"), 1),
            (ints(&[100_000]), 1),
            (ints(&[0, 1_000_000_000]), 1),
            (ints(&[2, 0, 0, 0]), 1),
            (Value::Nil, 1),
        ] {
            let ok = cost == 1 && bad == text("1000100000 1000 0");
            assert_eq!(
                parse_gcra(bad.clone(), r, cost).is_ok(),
                ok,
                "{bad:?} {cost}"
            );
        }
    }
}
