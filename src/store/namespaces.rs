//! Which limiters write which counters in a store, so that two limiters cannot share counters
//! by accident.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, Weak},
};

use crate::error::ConfigError;

/// The namespaces of the limiters built on one store, in this process.
///
/// A limiter's namespace is its prefix and policy name (`rl:default`); its counters live under
/// it, one kind of state per algorithm (GCRA's counters are not a token bucket's). Two
/// limiters on one store with the same namespace and algorithm but another quota would spend
/// each other's counters (a log-in limit spent by browsing): building the second is a
/// [`ConfigError`] unless both ask to share
/// ([`RateLimiterBuilder::common_counters`](crate::rate_limit::RateLimiterBuilder::common_counters)).
/// Limiters with the same algorithm and quota are the same policy and share freely, and so do
/// instances of the app in other processes (that is the point of a shared store).
///
/// [`RedisStore`](crate::RedisStore) and [`MemoryStore`](crate::MemoryStore) keep one, shared
/// by their clones (see [`Backend::namespaces`](super::Backend::namespaces)).
#[derive(Default)]
pub(crate) struct Namespaces {
    held: Mutex<HashMap<String, Vec<Weak<Claim>>>>,
}

impl fmt::Debug for Namespaces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_set().entries(held.keys()).finish()
    }
}

/// One limiter's hold on a namespace; released when the limiter is dropped.
#[derive(Debug)]
pub(crate) struct Claim {
    /// What the limiter decides with (algorithm and parameters).
    rule: String,
    share: bool,
}

impl Namespaces {
    /// An empty registry.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Claims the counters of algorithm `kind` in `namespace` for a limiter deciding with
    /// `rule`; an error names the limiter that holds them with another rule, unless both share.
    pub(crate) fn claim(
        &self,
        namespace: &str,
        kind: &str,
        rule: String,
        share: bool,
    ) -> Result<Arc<Claim>, ConfigError> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let claims = held.entry(format!("{namespace} {kind}")).or_default();
        claims.retain(|c| c.strong_count() > 0);
        for other in claims.iter().filter_map(Weak::upgrade) {
            if other.rule != rule && !(share && other.share) {
                return Err(ConfigError::new(
                    "policy_name",
                    format!(
                        "another {kind} limiter on this store already counts under \
                         {namespace:?} with {}; this one would spend its counters with {rule}. \
                         Give it its own policy name (or prefix), or call common_counters() on \
                         both to share one set of counters on purpose",
                        other.rule
                    ),
                ));
            }
        }
        let claim = Arc::new(Claim { rule, share });
        claims.push(Arc::downgrade(&claim));
        Ok(claim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_rule_shares_other_rules_conflict_unless_both_share() {
        let n = Namespaces::new();
        let a = n.claim("rl:default", "gcra", "5/s".into(), false).unwrap();
        let _same = n.claim("rl:default", "gcra", "5/s".into(), false).unwrap();
        let err = n
            .claim("rl:default", "gcra", "1/s".into(), false)
            .unwrap_err();
        assert_eq!(err.field(), "policy_name");
        assert!(err.reason().contains("rl:default"), "{err}");
        // Another namespace, or another algorithm's counters, are free.
        n.claim("rl:login", "gcra", "1/s".into(), false).unwrap();
        n.claim("rl:default", "token-bucket", "1/s".into(), false)
            .unwrap();
        // Both sharing: allowed.
        let s1 = n.claim("jobs:calls", "window", "100".into(), true).unwrap();
        n.claim("jobs:calls", "window", "60".into(), true).unwrap();
        assert!(n.claim("jobs:calls", "window", "30".into(), false).is_err());
        drop((a, _same, s1));
        // Released with the limiters that held it.
        let _ = n.claim("rl:default", "gcra", "1/s".into(), false).unwrap();
    }
}
