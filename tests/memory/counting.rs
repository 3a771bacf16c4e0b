//! Counting by response status needs an algorithm that can give units back and a set of
//! statuses that counts something: anything else is refused when the layer is built, naming
//! the field.

use std::time::Duration;

use tower_redis_ratelimit::{
    algorithm::{Algorithm, Rule, Scripted},
    Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter,
};

/// A custom script cannot give units back: counting by response is refused when the layer
/// is built, naming the field.
#[tokio::test]
async fn counting_needs_an_algorithm_that_can_give_back() {
    struct Fixed;
    impl Scripted for Fixed {
        fn source(&self) -> &'static str {
            "return {1, 0, 0, 0}"
        }
        fn key_suffixes(&self) -> &[&'static str] {
            &[""]
        }
        fn args(&self, _cost: u32) -> Vec<u64> {
            Vec::new()
        }
    }
    impl Algorithm for Fixed {
        fn name(&self) -> &'static str {
            "fixed"
        }
        fn quota(&self) -> u64 {
            1
        }
        fn window(&self) -> Duration {
            Duration::from_secs(1)
        }
        fn rule(&self) -> Rule<'_> {
            Rule::script(self)
        }
    }
    let store = MemoryStore::new();
    let custom = RateLimiter::builder(store.clone(), Fixed)
        .policy_name("custom")
        .build()
        .unwrap();
    let err = RateLimitLayer::new(custom, HeaderKey::new("x-account").unwrap())
        .count_only("401".parse().unwrap())
        .unwrap_err();
    assert_eq!(err.field(), "count_if");

    let gcra = RateLimiter::new(store.clone(), Gcra::new(Quota::per_hour(1)).unwrap()).unwrap();
    let custom = RateLimiter::builder(store, Fixed)
        .policy_name("custom2")
        .build()
        .unwrap();
    let mut layer = RateLimitLayer::new(gcra, HeaderKey::new("x-account").unwrap())
        .count_only("401".parse().unwrap())
        .unwrap();
    assert_eq!(layer.add_policy(custom).unwrap_err().field(), "count_if");
}

/// A set that counts nothing would limit nothing: refused, naming the field (a status class
/// beyond 5, `StatusSet::new().with_class(6)`, counts nothing).
#[test]
fn counting_nothing_is_a_config_error() {
    let limiter =
        RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(1)).unwrap()).unwrap();
    let err = RateLimitLayer::new(limiter, HeaderKey::new("x-account").unwrap())
        .count_only(tower_redis_ratelimit::rate_limit::StatusSet::new().with_class(6))
        .unwrap_err();
    assert_eq!(err.field(), "count_only");
}
