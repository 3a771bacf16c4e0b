//! What an algorithm answers for one check, in microseconds: the store's raw answer before
//! it becomes a [`Decision`](crate::rate_limit::Decision), and what an algorithm says about its limits.

use std::{sync::Arc, time::Duration};

use super::held::Placed;
use crate::error::Error;

/// A store's raw answer for one check, in microseconds.
///
/// Every built-in script replies `{allowed, remaining, retry_after_us, reset_after_us}`, with
/// `retry_after_us = -1` meaning "never": the cost exceeds the capacity. When they admit, they
/// add where they put the units, for a refund (the store reads that part itself).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outcome {
    /// Whether the units were taken.
    pub allowed: bool,
    /// Units left after this check.
    pub remaining: u64,
    /// `Some(0)` when allowed; `Some(t)` when the same check can succeed in `t` µs;
    /// `None` when it can never succeed (cost above capacity).
    pub retry_after_us: Option<u64>,
    /// Microseconds until the full quota is available again.
    pub reset_after_us: u64,
    /// For algorithms deciding several limits at once ([`MultiLimit`](super::MultiLimit)):
    /// which part is binding (the one the fields above describe), and every part's state in
    /// the order of [`Algorithm::parts`](super::Algorithm::parts). Empty otherwise.
    pub parts: Vec<PartOutcome>,
    /// Index of the binding part in `parts` (0 when there are none).
    pub binding: usize,
    /// True when the key is banned: nothing was taken, and `retry_after_us` is the time the
    /// ban has left (see [`RateLimiter::ban`](crate::RateLimiter::ban)).
    pub banned: bool,
    /// Where the store put the units of an admitted check, for a refund.
    pub(crate) position: Position,
}

/// Where a store put an admitted check's units, so that a refund finds them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Position {
    /// Not said (a denial, a custom script, a store that does not say).
    #[default]
    Unknown,
    /// A sliding window: the log entry the check wrote (its time and sequence number), so
    /// that a refund removes exactly that entry.
    Logged(LogEntry),
    /// GCRA, the token bucket, the multi-limit: where the charge lies on the key's time, so
    /// that a refund gives back only what it still holds.
    Placed(Placed),
    /// A fixed window: the id of the window that counted the charge, so that a refund gives
    /// back only to that window, unreset.
    Window { id: u64 },
}

impl Position {
    /// The charge's place on the key's time, if the store said.
    pub(crate) fn placed(&self) -> Option<&Placed> {
        match self {
            Position::Placed(p) => Some(p),
            _ => None,
        }
    }
}

/// One admitted request's entry in a sliding-window log: the time it was logged at and its
/// sequence number in that log (unique per key, never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogEntry {
    pub(crate) at_us: u64,
    pub(crate) seq: u64,
}

/// One limit's state in a multi-limit [`Outcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartOutcome {
    /// Units left under this limit.
    pub remaining: u64,
    /// `Some(0)` when this limit alone would admit the request; `Some(t)` when it would in `t`
    /// µs; `None` when the cost can never fit it.
    pub retry_after_us: Option<u64>,
    /// Microseconds until this limit's quota is full again.
    pub reset_after_us: u64,
}

impl Outcome {
    /// Reads the shared reply shape of the built-in scripts (what a custom script answers by
    /// default, see [`Scripted::parse_reply`](super::Scripted::parse_reply)):
    /// `{allowed (0|1), remaining, retry_after_us (-1 = never), reset_after_us}`, then for
    /// several limits the binding limit's index and three integers per limit
    /// (`remaining, retry_after_us, reset_after_us`).
    ///
    /// Anything else (wrong length, negative values, an allowed reply with a retry time) is an
    /// [`Error::InvalidReply`], never a panic and never an "allowed".
    ///
    /// # Errors
    ///
    /// [`Error::InvalidReply`] when `items` is not of the shape above (too short, or a value
    /// out of its range).
    ///
    /// ```
    /// use tower_redis_ratelimit::algorithm::Outcome;
    ///
    /// let o = Outcome::from_ints(&[0, 0, 250, 900]).unwrap();
    /// assert_eq!((o.allowed, o.retry_after_us), (false, Some(250)));
    /// assert!(Outcome::from_ints(&[1, 0, 250, 900]).is_err());
    /// ```
    pub fn from_ints(items: &[i64]) -> Result<Self, Error> {
        let bad = |what: &str| Err(Error::InvalidReply(format!("{what} in {items:?}")));
        let (&[allowed, remaining, retry, reset], rest) = items.split_at(items.len().min(4)) else {
            return bad("expected 4 integers");
        };
        // Multi-limit replies go on: the binding part's index, then 3 integers per part.
        let (binding, parts) = match rest {
            [] => (0, Vec::new()),
            [binding, parts @ ..] if !parts.is_empty() && parts.len() % 3 == 0 => {
                let mut out = Vec::with_capacity(parts.len() / 3);
                for p in parts.chunks_exact(3) {
                    let (Ok(remaining), Ok(reset_after_us)) =
                        (u64::try_from(p[0]), u64::try_from(p[2]))
                    else {
                        return bad("negative count in a part");
                    };
                    let retry_after_us = match p[1] {
                        -1 => None,
                        t if t >= 0 => Some(t as u64),
                        _ => return bad("retry time of a part"),
                    };
                    out.push(PartOutcome {
                        remaining,
                        retry_after_us,
                        reset_after_us,
                    });
                }
                match usize::try_from(*binding) {
                    Ok(b) if b < out.len() => (b, out),
                    _ => return bad("binding part out of range"),
                }
            }
            _ => return bad("expected 4 integers, or 5 + 3 per part"),
        };
        let allowed = match allowed {
            0 => false,
            1 => true,
            _ => return bad("allowed flag is not 0 or 1"),
        };
        let (Ok(remaining), Ok(reset_after_us)) = (u64::try_from(remaining), u64::try_from(reset))
        else {
            return bad("negative count");
        };
        let retry_after_us = match retry {
            -1 if !allowed => None,
            0 if allowed => Some(0),
            t if t > 0 && !allowed => Some(t as u64),
            _ => return bad("retry time does not match the decision"),
        };
        Ok(Self {
            allowed,
            remaining,
            retry_after_us,
            reset_after_us,
            parts,
            binding,
            banned: false,
            position: Position::Unknown,
        })
    }

    /// A denial because the key is banned for `left_us` more microseconds: nothing left, and
    /// the request can go again (and the key is rested, as far as the ban says) when the ban
    /// ends.
    pub(crate) fn banned(left_us: u64) -> Self {
        let mut o = Self::single(false, 0, Some(left_us), left_us);
        o.banned = true;
        o
    }

    /// A single-limit outcome.
    pub fn single(
        allowed: bool,
        remaining: u64,
        retry_after_us: Option<u64>,
        reset_after_us: u64,
    ) -> Self {
        Self {
            allowed,
            remaining,
            retry_after_us,
            reset_after_us,
            parts: Vec::new(),
            binding: 0,
            banned: false,
            position: Position::Unknown,
        }
    }
}

/// What an algorithm says about one of its limits (see [`Algorithm::parts`](super::Algorithm::parts)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartInfo {
    /// The limit's name.
    pub name: Arc<str>,
    /// Its quota.
    pub quota: u64,
    /// Its window.
    pub window: Duration,
}

#[cfg(test)]
mod tests {
    use super::Outcome;
    use crate::error::Error;

    #[test]
    fn parses_the_shared_shape() {
        let o = Outcome::from_ints(&[1, 4, 0, 900]).unwrap();
        assert_eq!(o, Outcome::single(true, 4, Some(0), 900));
        let multi = Outcome::from_ints(&[0, 0, 50, 60, 1, 3, 0, 10, 0, 50, 60]).unwrap();
        assert_eq!(multi.binding, 1);
        assert_eq!(multi.parts.len(), 2);
        assert_eq!(multi.parts[0].retry_after_us, Some(0));
        assert_eq!(multi.parts[1].retry_after_us, Some(50));
        let never = Outcome::from_ints(&[0, 4, -1, 900]).unwrap();
        assert_eq!(never.retry_after_us, None);
        assert_eq!(
            Outcome::from_ints(&[0, 0, 250, 900])
                .unwrap()
                .retry_after_us,
            Some(250)
        );
    }

    #[test]
    fn rejects_broken_replies() {
        for bad in [
            &[][..],
            &[1, 2, 0],
            &[1, 2, 0, 4, 5],
            &[2, 0, 0, 0],
            &[1, -1, 0, 0],
            &[1, 0, 5, 0],
            &[0, 0, 0, 0],
            &[0, 0, -2, 0],
            &[1, 0, -1, 0],
            &[0, 1, 1, -5],
            &[0, 0, 50, 60, 2, 3, 0, 10, 0, 50, 60],
            &[0, 0, 50, 60, 0, 3, 0],
            &[0, 0, 50, 60, 0],
            &[0, 0, 50, 60, 0, 3, -2, 10],
        ] {
            assert!(
                matches!(Outcome::from_ints(bad), Err(Error::InvalidReply(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn an_outcome_moves_without_a_memcpy_call() {
        // Every check returns one and moves it a few times: at most 128 bytes, which the
        // compiler copies in place.
        assert!(std::mem::size_of::<Outcome>() <= 128);
    }
}
