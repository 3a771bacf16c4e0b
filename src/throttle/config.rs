//! What a [`ThrottleLayer`](super::ThrottleLayer) and its services share.

use std::{sync::Arc, time::Duration};

use crate::{extract::CostFn, RateLimiter};

/// The limiter, the key and cost of a request, and the longest wait.
pub(crate) struct Settings<K, A> {
    pub(crate) limiter: RateLimiter<A>,
    pub(crate) key: Arc<K>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) max_wait: Duration,
}

impl<K, A> Clone for Settings<K, A> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: Arc::clone(&self.key),
            cost: self.cost.clone(),
            max_wait: self.max_wait,
        }
    }
}
