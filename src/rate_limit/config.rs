//! What a [`RateLimitLayer`](super::RateLimitLayer) and its services share: the policies,
//! the key and cost functions, and how to answer.

use std::{
    borrow::Cow,
    num::NonZeroU32,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use http::request::Parts;

use super::response::Responder;
use crate::{extract::CostFn, Algorithm, FailurePolicy, RateLimiter};

/// What the layer does with a request whose [`KeyExtractor`] found no key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// All keyless requests share one quota (a key no client can produce). The default: a misconfigured
    /// extractor (e.g. [`PeerIp`](crate::PeerIp) without connection info) still limits,
    /// and the first such request logs a warning.
    #[default]
    Shared,
    /// Keyless requests are not limited and get no rate-limit headers.
    Allow,
}

pub(crate) type ClassifyFn = dyn Fn(&Parts) -> Class + Send + Sync;

/// Which policy a request falls under, as decided by [`RateLimitLayer::classify`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Class {
    /// The layer's first (default) policy.
    Default,
    /// The policy with this name (see [`RateLimiterBuilder::policy_name`](crate::RateLimiterBuilder::policy_name)),
    /// added with [`RateLimitLayer::policy`]. An unknown name falls back to the default
    /// policy, with a warning.
    Policy(Cow<'static, str>),
    /// Not limited at all, and no rate-limit headers (health checks, internal callers).
    Bypass,
}

impl Class {
    /// The policy named `name`.
    pub fn policy(name: impl Into<Cow<'static, str>>) -> Self {
        Class::Policy(name.into())
    }
}

/// Everything a layer and its services share.
pub(crate) struct Config<K, A> {
    /// The default policy first, then the ones `classify` can pick by name.
    pub(crate) policies: Vec<Policy<A>>,
    pub(crate) classify: Option<Arc<ClassifyFn>>,
    pub(crate) key: Arc<K>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) missing_key: MissingKey,
    pub(crate) failure: FailurePolicy,
    pub(crate) local_share: NonZeroU32,
    pub(crate) partition_secret: Option<Arc<[u8]>>,
    pub(crate) responder: Arc<Responder>,
}

/// One policy: its limiter and, under `FailurePolicy::Local`, its local-share twin.
pub(crate) struct Policy<A> {
    pub(crate) limiter: RateLimiter<A>,
    pub(crate) local: Option<RateLimiter<A>>,
}

impl<A> Clone for Policy<A> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            local: self.local.clone(),
        }
    }
}

impl<K, A> Clone for Config<K, A> {
    fn clone(&self) -> Self {
        Self {
            policies: self.policies.clone(),
            classify: self.classify.clone(),
            key: Arc::clone(&self.key),
            cost: self.cost.clone(),
            missing_key: self.missing_key,
            failure: self.failure,
            local_share: self.local_share,
            partition_secret: self.partition_secret.clone(),
            responder: Arc::clone(&self.responder),
        }
    }
}

impl<K, A: Algorithm> Config<K, A> {
    /// The policy a request falls under; `None` to bypass limiting.
    pub(crate) fn policy_for(&self, parts: &Parts) -> Option<&Policy<A>> {
        let class = self.classify.as_ref().map_or(Class::Default, |f| f(parts));
        match class {
            Class::Bypass => None,
            Class::Default => self.policies.first(),
            Class::Policy(name) => self
                .policies
                .iter()
                .find(|p| p.limiter.policy_name() == name)
                .or_else(|| {
                    if !WARNED_UNKNOWN_POLICY.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            policy = %name,
                            "rate limit: classify named an unknown policy; using the default"
                        );
                    }
                    self.policies.first()
                }),
        }
    }
}

static WARNED_UNKNOWN_POLICY: AtomicBool = AtomicBool::new(false);
