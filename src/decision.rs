//! The answer to one check, with everything a header writer needs.

use std::{sync::Arc, time::Duration};

use crate::{algorithm::Placed, Error, Quota};

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
    /// For algorithms deciding several limits at once ([`MultiLimit`](crate::MultiLimit)):
    /// which part is binding (the one the fields above describe), and every part's state in
    /// the order of [`Algorithm::parts`](crate::Algorithm::parts). Empty otherwise.
    pub parts: Vec<PartOutcome>,
    /// Index of the binding part in `parts` (0 when there are none).
    pub binding: usize,
    /// Where the store put the units of an admitted check, for a refund.
    pub(crate) position: Position,
}

/// Where a store put an admitted check's units, so that a refund finds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
    /// Parses the shared reply shape of the built-in scripts (what a custom script answers
    /// by default, see [`Scripted::parse_reply`](crate::Scripted::parse_reply)).
    ///
    /// Anything else (wrong length, non-integers, negative values, an allowed reply with a
    /// retry time) is an [`Error::InvalidReply`], never a panic and never an "allowed".
    pub fn from_redis(value: redis::Value) -> Result<Self, Error> {
        let items: Vec<i64> = redis::from_redis_value(value)
            .map_err(|e| Error::InvalidReply(format!("expected 4 integers: {e}")))?;
        Self::from_ints(&items)
    }

    /// Reads the shared reply shape from integers: `{allowed, remaining, retry_after_us,
    /// reset_after_us}`, then for several limits the binding limit's index and three
    /// integers per limit (see [`Outcome::from_redis`]).
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
            position: Position::Unknown,
        })
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
            position: Position::Unknown,
        }
    }
}

/// The decision for one check: whether it was allowed, and the numbers for the
/// `RateLimit` headers.
///
/// Decisions come from a limiter ([`RateLimiter::check`](crate::RateLimiter::check), or the
/// layer); the struct may gain fields, so it cannot be built by hand.
///
/// ```
/// # use tower_redis_ratelimit::Decision;
/// fn describe(d: &Decision) -> String {
///     match (d.allowed, d.retry_after) {
///         (true, _) => format!("ok, {} of {} left", d.remaining, d.limit),
///         (false, Some(wait)) => format!("slow down, retry in {wait:?}"),
///         (false, None) => "this request can never fit the quota".to_owned(),
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the request may go ahead (its cost was taken from the quota).
    pub allowed: bool,
    /// The quota: units available when the key is fully rested (`q` in `RateLimit-Policy`).
    pub limit: u64,
    /// Units left now (`r` in `RateLimit`).
    pub remaining: u64,
    /// Time until the full quota is available again.
    pub reset_after: Duration,
    /// When denied: how long until the same request can succeed; `None` when allowed, or when
    /// the request's cost exceeds the quota so that it can never succeed (see
    /// [`Decision::is_never`]).
    pub retry_after: Option<Duration>,
    /// The quota's window: the time in which `limit` units are restored (`w`).
    pub window: Duration,
    /// The cost this check asked for.
    pub cost: u32,
    /// The policy name shown in the headers.
    pub policy: Arc<str>,
    /// True when the store was unavailable and this decision was made in this process at the
    /// local share of the quota ([`FailurePolicy::Local`](crate::FailurePolicy::Local)).
    pub degraded: bool,
    /// Every limit's state when the algorithm decides several at once
    /// ([`MultiLimit`](crate::MultiLimit)); the fields above then describe the binding one
    /// (when denied: the longest wait; when allowed: the fewest units left). Empty otherwise.
    pub limits: Vec<LimitState>,
    /// What an allowed check took, for [`RateLimiter::refund`](crate::RateLimiter::refund).
    pub(crate) charge: Option<Charge>,
}

/// What an allowed check took from a key's quota, so that it can be given back: the cost,
/// the quota it was taken under, where it was decided, and where the store put it (for a
/// sliding window the log entry it wrote; for GCRA, the token bucket and the multi-limit when
/// it was admitted and the key's time it left, so that a refund gives back only what the
/// charge still holds). Read it with [`Decision::charge`]; give it back with
/// [`RateLimiter::refund`](crate::RateLimiter::refund).
///
/// Two charges are equal when they took the same units under the same quota in the same
/// place; where the store put them is its bookkeeping and is not compared (Redis and the
/// in-memory twin number their log entries apart, and read different clocks).
#[derive(Debug, Clone, Copy)]
pub struct Charge {
    pub(crate) cost: u32,
    /// The quota given for the check, when not the limiter's own.
    pub(crate) quota: Option<Quota>,
    /// Decided at the local share (the store was unavailable): given back there too.
    pub(crate) local: bool,
    pub(crate) position: Position,
}

impl PartialEq for Charge {
    fn eq(&self, other: &Self) -> bool {
        (self.cost, self.quota, self.local) == (other.cost, other.quota, other.local)
    }
}

impl Eq for Charge {}

impl Charge {
    /// The units taken.
    pub fn cost(&self) -> u32 {
        self.cost
    }

    /// The quota the units were taken under, when the check was given one
    /// ([`RateLimiter::check_with_quota`](crate::RateLimiter::check_with_quota)).
    pub fn quota(&self) -> Option<Quota> {
        self.quota
    }
}

/// One limit of a multi-limit decision, for the headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitState {
    /// The limit's name (its policy item in the headers).
    pub name: Arc<str>,
    /// Its quota (`q`).
    pub limit: u64,
    /// Its window (`w`).
    pub window: Duration,
    /// Units left under it (`r`).
    pub remaining: u64,
    /// Time until its quota is full again.
    pub reset_after: Duration,
    /// When the request was denied: `Some(ZERO)` if this limit alone would have admitted it,
    /// `Some(t)` if it would in `t`, `None` if the cost can never fit it. `None` when allowed.
    pub retry_after: Option<Duration>,
}

impl LimitState {
    /// True when this limit is one of those that denied the request.
    pub fn violated(&self) -> bool {
        !matches!(self.retry_after, Some(Duration::ZERO))
    }
}

/// What an algorithm says about one of its limits (see [`Algorithm::parts`](crate::Algorithm::parts)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartInfo {
    /// The limit's name.
    pub name: Arc<str>,
    /// Its quota.
    pub quota: u64,
    /// Its window.
    pub window: Duration,
}

impl Decision {
    pub(crate) fn from_outcome(
        o: Outcome,
        limit: u64,
        window: Duration,
        cost: u32,
        policy: Arc<str>,
        parts: &[PartInfo],
    ) -> Self {
        let us = Duration::from_micros;
        let (limit, window) = parts
            .get(o.binding)
            .map_or((limit, window), |p| (p.quota, p.window));
        let limits = parts
            .iter()
            .zip(&o.parts)
            .map(|(info, p)| LimitState {
                name: Arc::clone(&info.name),
                limit: info.quota,
                window: info.window,
                remaining: p.remaining.min(info.quota),
                reset_after: us(p.reset_after_us),
                retry_after: if o.allowed {
                    None
                } else {
                    p.retry_after_us.map(us)
                },
            })
            .collect();
        Self {
            allowed: o.allowed,
            limit,
            remaining: o.remaining.min(limit),
            reset_after: us(o.reset_after_us),
            retry_after: match o.retry_after_us {
                Some(t) if !o.allowed => Some(us(t)),
                _ => None,
            },
            window,
            cost,
            policy,
            degraded: false,
            charge: o.allowed.then_some(Charge {
                cost,
                quota: None,
                local: false,
                position: o.position,
            }),
            limits,
        }
    }

    /// A denial with nothing left, known without asking the store (the deny cache).
    pub(crate) fn cached_denial(
        limit: u64,
        window: Duration,
        policy: Arc<str>,
        retry_after: Duration,
        reset_after: Duration,
    ) -> Self {
        Self {
            allowed: false,
            limit,
            remaining: 0,
            reset_after,
            retry_after: Some(retry_after),
            window,
            cost: 1,
            policy,
            degraded: false,
            limits: Vec::new(),
            charge: None,
        }
    }

    /// True when the request was denied and can never succeed: its cost exceeds the quota.
    pub fn is_never(&self) -> bool {
        !self.allowed && self.retry_after.is_none()
    }

    /// What this check took from the quota, when it was allowed: what
    /// [`RateLimiter::refund`](crate::RateLimiter::refund) gives back. `None` for a denial,
    /// and once the charge was refunded.
    pub fn charge(&self) -> Option<&Charge> {
        self.charge.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for v in [
            redis::Value::Nil,
            redis::Value::Int(1),
            redis::Value::Array(vec![redis::Value::Nil; 4]),
            redis::Value::SimpleString("OK".into()),
        ] {
            assert!(Outcome::from_redis(v).is_err());
        }
    }
}
