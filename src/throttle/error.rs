//! Why a throttled call was not made.

use std::{fmt, time::Duration};

use crate::{decision::Decision, error::Error};

/// The error of a throttled call that could not get its quota in time.
#[derive(Debug)]
#[non_exhaustive]
pub enum ThrottleError {
    /// The quota would not be available within the maximum wait (or the request's cost can
    /// never fit: `retry_after` is `None`).
    #[non_exhaustive]
    WouldExceedMaxWait {
        /// The last decision.
        decision: Box<Decision>,
        /// How long the call had waited already (in line behind earlier calls of its key,
        /// for quota, for the upstream).
        waited: Duration,
    },
    /// The store failed (the policy for throttles is closed: the call is not made).
    Store(Error),
    /// The upstream said to pause (or its window has no units left) for longer than the
    /// maximum wait allows ([`ThrottleLayer::adaptive`](crate::throttle::ThrottleLayer::adaptive)).
    #[non_exhaustive]
    UpstreamPaused {
        /// How long until the call could go.
        wait: Duration,
        /// How long the call had waited already.
        waited: Duration,
    },
    /// The maximum wait ran out while the call waited in line behind earlier calls of the
    /// same key (callers of a key are served in the order they asked).
    #[non_exhaustive]
    InLine {
        /// How long the call waited (the maximum wait).
        waited: Duration,
    },
}

impl fmt::Display for ThrottleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThrottleError::WouldExceedMaxWait { decision, waited } => match decision.retry_after {
                Some(wait) => write!(
                    f,
                    "rate limit: waited {}, policy {:?} has units in {}, beyond the maximum wait",
                    Ms(*waited),
                    decision.policy,
                    Ms(wait)
                ),
                None => write!(
                    f,
                    "rate limit: cost {} can never fit policy {:?} ({} units when rested)",
                    decision.cost, decision.policy, decision.capacity
                ),
            },
            ThrottleError::Store(_) => f.write_str("rate limit: the store failed"),
            ThrottleError::UpstreamPaused { wait, waited } => write!(
                f,
                "rate limit: waited {}, the upstream's limit frees in {}, beyond the maximum wait",
                Ms(*waited),
                Ms(*wait)
            ),
            ThrottleError::InLine { waited } => write!(
                f,
                "rate limit: waited {} in line behind earlier calls of the key, the maximum wait",
                Ms(*waited)
            ),
        }
    }
}

impl std::error::Error for ThrottleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ThrottleError::Store(e) => Some(e),
            _ => None,
        }
    }
}

/// A duration in whole milliseconds, as people read waits.
struct Ms(Duration);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ms", self.0.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maximum_wait_errors_say_how_long_the_call_waited() {
        let paused = ThrottleError::UpstreamPaused {
            wait: Duration::from_millis(982),
            waited: Duration::from_millis(9_004),
        };
        assert_eq!(
            paused.to_string(),
            "rate limit: waited 9004 ms, the upstream's limit frees in 982 ms, beyond the maximum wait"
        );
        let in_line = ThrottleError::InLine {
            waited: Duration::from_secs(2),
        };
        assert!(in_line.to_string().contains("waited 2000 ms in line"));
    }
}
