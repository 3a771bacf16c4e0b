//! A store's answer to a reservation: several units taken at once, for a unit lease (see
//! [`UnitLease`](crate::rate_limit::UnitLease)).

use crate::algorithm::{Outcome, Placed, Position};

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
