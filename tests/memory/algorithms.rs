//! The algorithms in memory: explicit times beyond the exact integers are refused, two
//! algorithms under one prefix keep apart, and a multi-limit that cannot work is a
//! configuration error.

use tower_redis_ratelimit::{
    algorithm::Algorithm, Gcra, MemoryStore, Quota, RateLimiter, SlidingWindow, TokenBucket,
};

use crate::common::limiter;

#[tokio::test]
async fn explicit_times_beyond_exact_integers_are_rejected() {
    let l = limiter(
        MemoryStore::new(),
        Gcra::new(Quota::per_second(10).burst(5)).unwrap(),
        "big",
    );
    for t in [u64::MAX, (1 << 52) + 1] {
        assert!(matches!(
            l.check_at("k", 1, t).await,
            Err(tower_redis_ratelimit::Error::InvalidInput(_))
        ));
    }
    assert!(l.check_at("k", 1, 1 << 52).await.unwrap().allowed);
}

/// Two algorithms under one prefix keep separate state in MemoryStore, as they do in Redis.
#[tokio::test]
async fn memory_store_keeps_algorithms_apart() {
    let store = MemoryStore::new();
    let g = limiter(store.clone(), Gcra::new(Quota::per_hour(1)).unwrap(), "rl");
    let tb = limiter(
        store.clone(),
        TokenBucket::new(Quota::per_hour(1)).unwrap(),
        "rl",
    );
    let sw = limiter(store, SlidingWindow::new(Quota::per_hour(1)).unwrap(), "rl");
    for l in [&g as &dyn Check, &tb, &sw] {
        assert!(l.allowed("k").await);
        assert!(!l.allowed("k").await);
    }
}

/// Object-safe view of "a limiter", to loop over limiters of different algorithms.
trait Check {
    fn allowed<'a>(
        &'a self,
        key: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + 'a>>;
}

#[test]
fn multi_limit_rejects_bad_configuration() {
    use tower_redis_ratelimit::algorithm::MultiLimit;
    let q = Quota::per_second(1);
    let field = |r: Result<MultiLimit, tower_redis_ratelimit::ConfigError>| r.unwrap_err().field();
    assert_eq!(
        field(MultiLimit::new(Vec::<(&str, Quota)>::new())),
        "limits"
    );
    assert_eq!(field(MultiLimit::new([("a", q), ("a", q)])), "limits.name");
    assert_eq!(field(MultiLimit::new([("a b", q)])), "limits.name");
    assert_eq!(
        field(MultiLimit::new([("a", Quota::per_second(0))])),
        "quota.limit"
    );
}

impl<A: Algorithm> Check for RateLimiter<A> {
    fn allowed<'a>(
        &'a self,
        key: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + 'a>> {
        Box::pin(async move { self.check(key, 1).await.unwrap().allowed })
    }
}
