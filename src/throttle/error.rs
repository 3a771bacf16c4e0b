//! Why a throttled call was not made.

use std::fmt;

use crate::{decision::Decision, error::Error};

/// The error of a throttled call that could not get its quota in time.
#[derive(Debug)]
#[non_exhaustive]
pub enum ThrottleError {
    /// The quota would not be available within the maximum wait (or the request's cost can
    /// never fit: `retry_after` is `None`).
    WouldExceedMaxWait {
        /// The last decision.
        decision: Decision,
    },
    /// The store failed (the policy for throttles is closed: the call is not made).
    Store(Error),
    /// The upstream said to pause (or its window has no units left) for longer than the
    /// maximum wait allows ([`ThrottleLayer::adaptive`](crate::throttle::ThrottleLayer::adaptive)).
    UpstreamPaused {
        /// How long until the call could go.
        wait: std::time::Duration,
    },
}

impl fmt::Display for ThrottleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThrottleError::WouldExceedMaxWait { decision } => match decision.retry_after {
                Some(wait) => write!(
                    f,
                    "rate limit: quota {:?} available in {wait:?}, beyond the maximum wait",
                    decision.policy
                ),
                None => write!(
                    f,
                    "rate limit: cost {} can never fit quota {:?} of {}",
                    decision.cost, decision.policy, decision.limit
                ),
            },
            ThrottleError::Store(_) => f.write_str("rate limit: the store failed"),
            ThrottleError::UpstreamPaused { wait } => write!(
                f,
                "rate limit: the upstream's limit frees in {wait:?}, beyond the maximum wait"
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
