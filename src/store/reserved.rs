//! A store's answer to a reservation: several units taken at once, for a unit lease (see
//! [`UnitLease`](crate::rate_limit::UnitLease)).

use crate::algorithm::{BucketRate, Outcome, Placed, Position};

/// What [`Backend::reserve`](super::Backend::reserve) took: up to the units asked for, at
/// least the check's cost, or a denial of that cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reserved {
    /// The decision for the check that asked (its cost): `remaining`, `reset_after_us` as
    /// after the whole reservation.
    pub(crate) outcome: Outcome,
    /// The units taken: 0 when denied, else at least the cost and at most the units asked for.
    pub(crate) granted: u32,
}

impl Reserved {
    /// Reads the reply of a reservation script, `{allowed, remaining, retry_after_us,
    /// reset_after_us, granted}` and, when granted, the time it was granted at (where the
    /// units lie on the key's time, for giving back what is not handed out), for a check of
    /// `cost` asking for at most `up_to` units. Anything else (a granted count outside
    /// `cost..=up_to` when allowed, or not 0 when denied) is an
    /// [`Error::InvalidReply`](crate::Error::InvalidReply): a broken reply never hands out more
    /// than was asked for.
    pub(crate) fn from_ints(
        items: &[i64],
        cost: u32,
        up_to: u32,
    ) -> Result<Self, crate::error::Error> {
        let bad = || crate::error::Error::InvalidReply(format!("a reservation answered {items:?}"));
        let (head, now) = match items {
            [head @ .., now] if items.len() == 6 => (head, Some(*now)),
            _ => (items, None),
        };
        let &[allowed, remaining, retry, reset, granted] = head else {
            return Err(bad());
        };
        let mut outcome = Outcome::from_ints(&[allowed, remaining, retry, reset])?;
        let granted = u32::try_from(granted).map_err(|_| bad())?;
        let fits = match (outcome.allowed, now) {
            (true, Some(now)) => {
                let resets = std::iter::once(outcome.reset_after_us);
                let placed = Placed::read(now, resets)?;
                outcome.position = Position::Placed(placed);
                (cost..=up_to.max(cost)).contains(&granted)
            }
            (false, None) => granted == 0,
            _ => false,
        };
        if !fits {
            return Err(bad());
        }
        Ok(Self { outcome, granted })
    }
}

/// How [`Backend::schedule`](super::Backend::schedule) places a call in its key's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pace {
    /// One after another, never in a burst: a call goes at the key's TAT (now when the key is
    /// rested). The outbound throttle's pacing.
    Steady,
    /// As a check admits, then in time with the limit: a call within the key's burst goes at
    /// once, one beyond it when its units come (the TAT it leaves is then a tolerance ahead).
    /// An inbound request's delay instead of a refusal.
    Burst,
}

impl Pace {
    /// The argument the scripts take (`lua/gcra_schedule.lua`, `lua/token_bucket_schedule.lua`).
    pub(crate) fn arg(self) -> u64 {
        match self {
            Pace::Steady => 0,
            Pace::Burst => 1,
        }
    }

    /// The wait of a call of `cost` units, `cost_us` of the key's time, on a key whose TAT is
    /// `tat` (not before `now`) and whose tolerance is `tolerance` (emission x burst).
    pub(crate) fn wait(self, tat: u64, now: u64, cost_us: u64, tolerance: u64) -> u64 {
        match self {
            Pace::Steady => tat - now,
            Pace::Burst => tat
                .saturating_add(cost_us)
                .saturating_sub(tolerance)
                .saturating_sub(now),
        }
    }
}

/// What [`Backend::schedule`](super::Backend::schedule) answered: the call's place in its
/// key's time, kept (`outcome.allowed`, and how long until the place), or why not (a place
/// beyond the caller's budget, a cost beyond the burst, a ban).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scheduled {
    /// Allowed when the place is kept (remaining and reset as after it, the units placed on
    /// the key's time as a check's are, so that they can be given back); else a denial whose
    /// `retry_after_us` is the wait for the place (`None`: the cost never fits).
    pub(crate) outcome: Outcome,
    /// When kept, the wait until the place (0: at once).
    pub(crate) wait_us: u64,
}

impl Scheduled {
    /// Reads the reply of a schedule script, `{allowed, remaining, retry_after_us,
    /// reset_after_us, wait_us}` and, when kept, the time it was kept at; a wait with a
    /// denial, a kept place with a retry time or without its time is an
    /// [`Error::InvalidReply`](crate::error::Error::InvalidReply).
    pub(crate) fn from_ints(items: &[i64]) -> Result<Self, crate::error::Error> {
        let bad = || crate::error::Error::InvalidReply(format!("a schedule answered {items:?}"));
        let (head, now) = match items {
            [head @ .., now] if items.len() == 6 => (head, Some(*now)),
            _ => (items, None),
        };
        let &[allowed, remaining, retry, reset, wait] = head else {
            return Err(bad());
        };
        if allowed == 2 && remaining == 0 && retry > 0 && retry == reset && wait == 0 {
            if now.is_some() {
                return Err(bad());
            }
            return Ok(Self {
                outcome: Outcome::banned(retry as u64),
                wait_us: 0,
            });
        }
        let mut outcome = Outcome::from_ints(&[allowed, remaining, retry, reset])?;
        let wait_us = u64::try_from(wait).map_err(|_| bad())?;
        match (outcome.allowed, now) {
            (true, Some(now)) => {
                let placed = Placed::read(now, std::iter::once(outcome.reset_after_us))?;
                outcome.position = Position::Placed(placed);
            }
            (false, None) if wait_us == 0 => {}
            _ => return Err(bad()),
        }
        Ok(Self { outcome, wait_us })
    }

    /// A kept place: `outcome` (allowed, its units placed) after a wait of `wait_us`.
    fn kept(outcome: Outcome, wait_us: u64) -> Self {
        Self { outcome, wait_us }
    }

    /// A place not kept: `outcome` (a denial).
    fn refused(outcome: Outcome) -> Self {
        Self {
            outcome,
            wait_us: 0,
        }
    }
}

/// The in-memory twin of `lua/gcra_schedule.lua` on a stored TAT (`None`: a rested key): what
/// it answers for a call of `cost` at `now` paced by `pace` that may wait `budget_us`, and the
/// TAT to store when the place is kept.
pub(crate) fn gcra_schedule(
    rate: BucketRate,
    stored_tat: Option<u64>,
    now: u64,
    (cost, budget_us): (u64, u64),
    pace: Pace,
) -> (Scheduled, Option<u64>) {
    let emission = rate.emission_us;
    let tolerance = rate.tolerance_us();
    let tat = stored_tat.map_or(now, |t| t.max(now));
    let units_left = |t: u64| (now + tolerance).saturating_sub(t) / emission;
    let denied =
        |retry| Scheduled::refused(Outcome::single(false, units_left(tat), retry, tat - now));
    if cost > rate.burst {
        return (denied(None), None);
    }
    let cost_us = cost.saturating_mul(emission);
    let wait = pace.wait(tat, now, cost_us, tolerance);
    if wait > budget_us {
        return (denied(Some(wait)), None);
    }
    let new_tat = tat.saturating_add(cost_us);
    let mut outcome = Outcome::single(true, units_left(new_tat), Some(0), new_tat - now);
    outcome.position = Position::Placed(Placed::new(now, &[new_tat]));
    (Scheduled::kept(outcome, wait), Some(new_tat))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_reservation_and_rejects_what_it_did_not_ask_for() {
        let r = Reserved::from_ints(&[1, 5, 0, 900, 40, 7_000], 1, 40).unwrap();
        assert_eq!(
            (r.outcome.allowed, r.outcome.remaining, r.granted),
            (true, 5, 40)
        );
        assert_eq!(r.outcome.position.placed().unwrap().ends(), &[7_900]);
        let denied = Reserved::from_ints(&[0, 0, 250, 900, 0], 2, 40).unwrap();
        assert_eq!((denied.outcome.allowed, denied.granted), (false, 0));
        for bad in [
            &[1, 5, 0, 900, 41, 7_000][..], // more than asked for
            &[1, 5, 0, 900, 1, 7_000],      // less than the cost
            &[1, 5, 0, 900, -1, 7_000],
            &[1, 5, 0, 900, 40], // granted without its time
            &[1, 5, 0, 900, 40, -7],
            &[0, 0, 250, 900, 3], // a denial that grants
            &[0, 0, 250, 900, 0, 7_000],
            &[1, 5, 0, 900],
            &[1, 5, 0, 900, 4, 4, 4],
        ] {
            assert!(Reserved::from_ints(bad, 2, 40).is_err(), "{bad:?}");
        }
    }
}
