//! The answer to one check, with everything a header writer needs.

use std::{sync::Arc, time::Duration};

use crate::Error;

/// A store's raw answer for one check, in microseconds.
///
/// Every built-in script replies `{allowed, remaining, retry_after_us, reset_after_us}`, with
/// `retry_after_us = -1` meaning "never": the cost exceeds the capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

impl Outcome {
    /// Parses the shared reply shape of the built-in scripts.
    ///
    /// Anything else (wrong length, non-integers, negative values, an allowed reply with a
    /// retry time) is an [`Error::InvalidReply`], never a panic and never an "allowed".
    pub fn from_redis(value: redis::Value) -> Result<Self, Error> {
        let items: Vec<i64> = redis::from_redis_value(value)
            .map_err(|e| Error::InvalidReply(format!("expected 4 integers: {e}")))?;
        Self::from_ints(&items)
    }

    pub(crate) fn from_ints(items: &[i64]) -> Result<Self, Error> {
        let bad = |what: &str| Err(Error::InvalidReply(format!("{what} in {items:?}")));
        let &[allowed, remaining, retry, reset] = items else {
            return bad("expected 4 integers");
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
        })
    }
}

/// The decision for one check: whether it was allowed, and the numbers for the
/// `RateLimit` headers.
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
    /// The IETF `pk` partition key, base64 (sf-binary content), when the layer is configured
    /// with [`RateLimitLayer::partition_key`](crate::RateLimitLayer::partition_key): a keyed
    /// hash of the rate-limit key, never the key itself.
    pub partition_key: Option<String>,
}

impl Decision {
    pub(crate) fn from_outcome(
        o: Outcome,
        limit: u64,
        window: Duration,
        cost: u32,
        policy: Arc<str>,
    ) -> Self {
        Self {
            allowed: o.allowed,
            limit,
            remaining: o.remaining.min(limit),
            reset_after: Duration::from_micros(o.reset_after_us),
            retry_after: match o.retry_after_us {
                Some(t) if !o.allowed => Some(Duration::from_micros(t)),
                _ => None,
            },
            window,
            cost,
            policy,
            degraded: false,
            partition_key: None,
        }
    }

    /// True when the request was denied and can never succeed: its cost exceeds the quota.
    pub fn is_never(&self) -> bool {
        !self.allowed && self.retry_after.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_shared_shape() {
        let o = Outcome::from_ints(&[1, 4, 0, 900]).unwrap();
        assert_eq!(
            o,
            Outcome {
                allowed: true,
                remaining: 4,
                retry_after_us: Some(0),
                reset_after_us: 900
            }
        );
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
