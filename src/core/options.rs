//! The options every limit has, set on each limiter's builder and validated here, once.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use super::{
    breaker::BreakerState, names, Core, Counters, DEFAULT_MAX_KEY_LEN, DEFAULT_PREFIX,
    DEFAULT_TIMEOUT,
};
use crate::{
    error::ConfigError,
    store::{namespace_id, CircuitBreaker, FailurePolicy, Store},
};

/// The options of a limit that are not about what it limits.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) prefix: String,
    pub(crate) policy: String,
    pub(crate) timeout: Duration,
    pub(crate) max_key_len: usize,
    pub(crate) breaker: CircuitBreaker,
    pub(crate) failure: FailurePolicy,
    pub(crate) local_share: u32,
}

impl Options {
    /// The defaults, with `policy` as the policy name.
    pub(crate) fn new(policy: &str) -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            policy: policy.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            breaker: CircuitBreaker::default(),
            failure: FailurePolicy::default(),
            local_share: 1,
        }
    }

    /// `prefix:policy`.
    pub(crate) fn namespace(&self) -> String {
        format!("{}:{}", self.prefix, self.policy)
    }

    /// Validates the options (the error names the field) and claims the namespace in
    /// `store` for a limit of `kind` deciding with `rule` (see
    /// [`Namespaces`](crate::store::Namespaces)); `shared`: the limit shares its counters
    /// with other rules on purpose.
    pub(crate) fn build(
        self,
        store: Arc<dyn Store>,
        kind: &str,
        rule: String,
        shared: bool,
    ) -> Result<Core, ConfigError> {
        self.breaker.validate()?;
        names::check(&self.prefix, &self.policy)?;
        if self.timeout.is_zero() {
            return Err(ConfigError::new("store_timeout", "must be more than zero"));
        }
        if self.max_key_len < 16 {
            return Err(ConfigError::new("max_key_len", "must be at least 16"));
        }
        let Some(share) = NonZeroU32::new(self.local_share) else {
            return Err(ConfigError::new("local_share", "must be at least 1"));
        };
        let namespace = self.namespace();
        let claim = match store.namespaces() {
            Some(namespaces) => Some(namespaces.claim(&namespace, kind, rule, shared)?),
            None => None,
        };
        super::report::describe();
        let policy: Arc<str> = self.policy.into();
        Ok(Core {
            store,
            namespace_id: namespace_id(&namespace),
            namespace: namespace.into(),
            timeout: self.timeout,
            max_key_len: self.max_key_len,
            breaker: BreakerState::new(self.breaker, Some(Arc::clone(&policy))),
            policy,
            failure: self.failure,
            share,
            counters: Counters::default(),
            meters: Default::default(),
            quiet: super::quiet::Quiet::default(),
            reports: true,
            _claim: claim,
        })
    }
}

/// The setters of [`Options`] on a builder with an `options` field.
macro_rules! common_options {
    () => {
        /// The first part of this limit's namespace (default `rl`): its keys are stored
        /// under `{prefix:policy:key}`. Handy to keep apps or environments sharing one Redis
        /// apart. 1 to 64 visible ASCII characters, without `{` and `}`.
        pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
            self.options.prefix = prefix.into();
            self
        }

        /// The policy name: the second part of this limit's namespace, and its name in the
        /// `RateLimit` headers, the logs and the metrics. 1 to 64 characters from
        /// `A-Z a-z 0-9 - _ . :`.
        pub fn policy_name(mut self, name: impl Into<String>) -> Self {
            self.options.policy = name.into();
            self
        }

        /// Bound on one store call, including waiting for a pooled connection (default
        /// 100 ms). More than zero.
        pub fn store_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.options.timeout = timeout;
            self
        }

        /// Keys longer than this many bytes are stored as a hash (default 128, at least 16).
        pub fn max_key_len(mut self, len: usize) -> Self {
            self.options.max_key_len = len;
            self
        }

        /// When to stop calling a failing store (default: after 5 failures in a row, for
        /// 1 s; see [`CircuitBreaker`](crate::store::CircuitBreaker)).
        pub fn circuit_breaker(mut self, breaker: $crate::store::CircuitBreaker) -> Self {
            self.options.breaker = breaker;
            self
        }

        /// What a check gets when the store fails or times out (default
        /// [`FailurePolicy::Open`](crate::FailurePolicy::Open)). With
        /// [`FailurePolicy::Local`](crate::FailurePolicy::Local), also set
        /// [`local_share`](Self::local_share).
        pub fn on_store_error(mut self, policy: $crate::store::FailurePolicy) -> Self {
            self.options.failure = policy;
            self
        }

        /// The number of instances that share the limit, for
        /// [`FailurePolicy::Local`](crate::FailurePolicy::Local): while the store is
        /// unavailable, each instance decides alone with the limit divided by `instances`,
        /// rounded down but never below one (default 1: the whole limit per instance). At
        /// least 1.
        pub fn local_share(mut self, instances: u32) -> Self {
            self.options.local_share = instances;
            self
        }
    };
}

pub(crate) use common_options;
