//! What a [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer) and its services share.

use std::{fmt, sync::Arc};

use super::{limiter::ConcurrencyLimiter, Busy};
use crate::{extract::MissingKey, http::Responder};

/// Everything a layer and its services share.
pub(crate) struct Config<K> {
    pub(crate) limiter: ConcurrencyLimiter,
    pub(crate) key: Arc<K>,
    pub(crate) missing_key: MissingKey,
    pub(crate) responder: Arc<Responder<Busy>>,
}

impl<K> Clone for Config<K> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: Arc::clone(&self.key),
            missing_key: self.missing_key,
            responder: Arc::clone(&self.responder),
        }
    }
}

impl<K> fmt::Debug for Config<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("limiter", &self.limiter)
            .field("missing_key", &self.missing_key)
            .field("responder", &self.responder)
            .finish_non_exhaustive()
    }
}
