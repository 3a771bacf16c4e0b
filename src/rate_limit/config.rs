//! What a [`RateLimitLayer`](super::RateLimitLayer) and its services share: the policies,
//! the key and cost functions, and how to answer.

use std::{
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use http::request::Parts;

use super::{
    counting::CountFn,
    engine::{Quoted, RateEngine},
    lists::{Listed, Lists},
    live::{LiveLimits, Resolved},
    usage::SettleFrom,
};
use crate::{
    decision::Decision,
    extract::{CostFn, Key, KeyExtractor, MissingKey},
    http::{headers::partition_key, PolicyField, Responder},
    quota::Quota,
    store::KeyBuf,
};

/// A policy of one layer, as [`RateLimitLayer::add_policy`](super::RateLimitLayer::add_policy)
/// returns it, for [`Class::Policy`]. A handle, not a name: a typo cannot silently select the
/// default policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyId {
    /// The layer that handed it out.
    layer: u64,
    index: usize,
}

impl PolicyId {
    pub(crate) fn new(layer: u64, index: usize) -> Self {
        Self { layer, index }
    }
}

/// Which policy a request falls under, as decided by
/// [`RateLimitLayer::classify`](super::RateLimitLayer::classify).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Class {
    /// The layer's first (default) policy.
    Default,
    /// A policy added with [`RateLimitLayer::add_policy`](super::RateLimitLayer::add_policy).
    ///
    /// A handle from another layer matches none of this layer's policies: the request is
    /// answered `503` (gRPC `UNAVAILABLE`) and an error logged every time, never decided
    /// under the wrong policy nor let through.
    Policy(PolicyId),
    /// Not limited at all, and no rate-limit headers (health checks, internal callers).
    Bypass,
}

pub(crate) type ClassifyFn = dyn Fn(&Parts) -> Class + Send + Sync;

/// A quota decided per request (see [`RateLimitLayer::quota_fn`](super::RateLimitLayer::quota_fn)).
pub(crate) type QuotaFn = dyn Fn(&Parts) -> Option<Quota> + Send + Sync;

/// A number for each layer, so that its policy handles are its own.
pub(crate) fn next_layer_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One policy of a layer: its limiter, and its `RateLimit-Policy` member rendered once.
#[derive(Clone)]
pub(crate) struct Policy {
    pub(crate) engine: Arc<RateEngine>,
    pub(crate) field: PolicyField,
}

impl Policy {
    pub(crate) fn new(engine: &Arc<RateEngine>) -> Self {
        let algorithm = &engine.algorithm;
        Self {
            engine: Arc::clone(engine),
            field: PolicyField::new(engine.policy(), algorithm.quota(), algorithm.window()),
        }
    }
}

/// Everything a layer and its services share.
pub(crate) struct Config<K> {
    pub(crate) id: u64,
    /// The default policy first, then those added with `add_policy`, in order.
    pub(crate) policies: Vec<Policy>,
    pub(crate) classify: Option<Arc<ClassifyFn>>,
    pub(crate) key: Arc<K>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) quota: Option<Arc<QuotaFn>>,
    /// Which responses spend quota; the others' units are given back.
    pub(crate) count: Option<Arc<CountFn>>,
    /// Where charges are settled from after the response, when they are.
    pub(crate) settle: Option<Arc<SettleFrom>>,
    pub(crate) missing_key: MissingKey,
    pub(crate) partition_secret: Option<Arc<[u8]>>,
    pub(crate) responder: Arc<Responder<Decision>>,
    /// Whether a request that goes on carries its decision in its extensions.
    pub(crate) extension: bool,
    /// Allow and deny lists, when the layer has any.
    pub(crate) lists: Option<Arc<Lists>>,
    /// Limits replaced while the layer runs (they hold its lists then).
    pub(crate) live: Option<LiveLimits>,
}

impl<K> Clone for Config<K> {
    fn clone(&self) -> Self {
        Self {
            id: self.id,
            policies: self.policies.clone(),
            classify: self.classify.clone(),
            key: Arc::clone(&self.key),
            cost: self.cost.clone(),
            quota: self.quota.clone(),
            count: self.count.clone(),
            settle: self.settle.clone(),
            missing_key: self.missing_key,
            partition_secret: self.partition_secret.clone(),
            responder: Arc::clone(&self.responder),
            extension: self.extension,
            lists: self.lists.clone(),
            live: self.live.clone(),
        }
    }
}

impl<K> fmt::Debug for Config<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let policies: Vec<(&str, _)> = self
            .policies
            .iter()
            .map(|p| (&**p.engine.policy(), p.engine.core.failure))
            .collect();
        f.debug_struct("RateLimitLayer")
            .field("policies", &policies)
            .field("missing_key", &self.missing_key)
            .field("responder", &self.responder)
            .finish_non_exhaustive()
    }
}

/// The policy a request falls under.
pub(crate) enum Selected<'a> {
    Policy(&'a Policy),
    Bypass,
    /// A handle of another layer.
    Foreign(PolicyId),
}

impl<K> Config<K> {
    pub(crate) fn policy_for(&self, parts: &Parts) -> Selected<'_> {
        let class = self.classify.as_ref().map_or(Class::Default, |f| f(parts));
        match class {
            Class::Bypass => Selected::Bypass,
            Class::Default => Selected::Policy(&self.policies[0]),
            Class::Policy(id) if id.layer == self.id => match self.policies.get(id.index) {
                Some(policy) => Selected::Policy(policy),
                None => Selected::Foreign(id),
            },
            Class::Policy(id) => Selected::Foreign(id),
        }
    }

    /// Whether the allow or deny list (the live limits', else the layer's) has the request.
    pub(crate) fn listed(&self, live: Option<&Resolved>, parts: &Parts) -> Listed
    where
        K: KeyExtractor,
    {
        let lists = match live {
            Some(live) => live.lists.as_ref(),
            None => self.lists.as_deref(),
        };
        let Some(lists) = lists else {
            return Listed::No;
        };
        let key = self.key.extract(parts);
        lists.check(parts, key.as_ref())
    }

    /// The quota a request of `key` under `policy` is decided by, when not the policy's own:
    /// the live limits' (the default policy's: a key's plan, or the quota in force), else the
    /// quota function's.
    pub(crate) fn quota_for(
        &self,
        live: Option<&Resolved>,
        policy: &Policy,
        key: Option<&Key<'_>>,
        parts: &Parts,
    ) -> Option<Arc<Quoted>> {
        if let Some(live) = live.filter(|_| std::ptr::eq(policy, &self.policies[0])) {
            return live.quoted(key).cloned();
        }
        let quota = self.quota.as_ref()?(parts)?;
        let engine = &policy.engine;
        engine
            .quoted(quota)
            .map(Arc::new)
            .inspect_err(|e| {
                tracing::warn!(
                    policy = %engine.policy(),
                    %quota,
                    error = %crate::error::ErrorChain(&e),
                    "rate limit: quota_fn gave a quota that cannot be used; deciding under the configured quota"
                );
            })
            .ok()
    }

    /// Whether a request admitted at once needs no decision: the layer writes none into the
    /// request, settles nothing after the response and writes no `pk` (see
    /// [`RateEngine::decide_lean`]).
    pub(crate) fn lean(&self) -> bool {
        self.count.is_none()
            && self.settle.is_none()
            && !self.extension
            && self.partition_secret.is_none()
    }

    /// The IETF `pk` of `key` under `engine`, when the layer has a partition secret.
    pub(crate) fn partition_key(
        &self,
        engine: &RateEngine,
        key: Option<&Key<'_>>,
    ) -> Option<String> {
        let secret = self.partition_secret.as_ref()?;
        let mut compact = KeyBuf::new();
        engine.store_key(key).write_key_compact(&mut compact);
        Some(partition_key(secret, compact.as_bytes()))
    }
}
