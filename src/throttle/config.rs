//! What a [`ThrottleLayer`](super::ThrottleLayer) and its services share.

use std::{sync::Arc, time::Duration};

use super::{adaptive::Adaptive, clock::Clock, line::Lines, tokens::TokenBudget};
use crate::{extract::CostFn, rate_limit::RateLimiter};

/// The limiter, the key and cost of a request, the longest wait, and what is learned from
/// the upstream.
pub(crate) struct Settings<K, A> {
    pub(crate) limiter: RateLimiter<A>,
    pub(crate) key: Arc<K>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) max_wait: Duration,
    /// The cap on a pause or a reset learned from a header.
    pub(crate) max_pause: Duration,
    pub(crate) adaptive: Option<Adaptive>,
    /// Where waits are counted: the manual clock of the limiter's (or the adaptive) store,
    /// or real time.
    pub(crate) clock: Clock,
    /// False for a throttle that only learns: the limiter's quota is not asked, it only names
    /// where the upstream's state is kept.
    pub(crate) configured: bool,
    /// Each key's callers in this process, in the order they asked.
    pub(crate) lines: Arc<Lines>,
    /// The upstream's token budget, learned and respected beside its requests.
    pub(crate) tokens: Option<Arc<TokenBudget>>,
}

impl<K, A> Clone for Settings<K, A> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: Arc::clone(&self.key),
            cost: self.cost.clone(),
            max_wait: self.max_wait,
            max_pause: self.max_pause,
            adaptive: self.adaptive.clone(),
            clock: self.clock.clone(),
            configured: self.configured,
            lines: Arc::clone(&self.lines),
            tokens: self.tokens.clone(),
        }
    }
}

/// A throttle that does not send a request again (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRetry;

/// A throttle that sends a request the upstream answered 429 again, after the pause it
/// learned, within the maximum wait, when its method is idempotent (see
/// [`ThrottleLayer::retry_rate_limited`](super::ThrottleLayer::retry_rate_limited)).
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryIdempotent;
