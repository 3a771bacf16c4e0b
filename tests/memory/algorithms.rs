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

/// A memory store holds bans within its key cap: a new ban is refused (an error, never a ban
/// silently lost) once its lock shard is full, a little under the cap; the bans it holds keep
/// holding, and lifting one makes room for another.
#[tokio::test]
async fn a_memory_store_refuses_bans_beyond_its_key_cap_and_keeps_the_others() {
    use std::time::Duration;
    const CAP: usize = 16_000;
    let store = MemoryStore::builder().max_keys(CAP).build().unwrap();
    let l = limiter(store, Gcra::new(Quota::per_second(10)).unwrap(), "bans");
    let hour = Duration::from_secs(3600);
    let mut held = 0;
    let refused = loop {
        match l.ban(format!("k{held}").as_str(), hour).await {
            Ok(()) => held += 1,
            Err(e) => break e,
        }
        assert!(held <= CAP, "more bans than the key cap");
    };
    assert!(
        matches!(refused, tower_redis_ratelimit::Error::Unsupported(_)),
        "{refused:?}"
    );
    // A shard fills a little before the whole cap does (16 shards of CAP / 16).
    assert!(held >= CAP * 9 / 10, "refused after only {held} bans");
    for i in [0, held / 2, held - 1] {
        let d = l.check(format!("k{i}").as_str(), 1).await.unwrap();
        assert!(d.banned && !d.allowed, "k{i}: {d:?}");
    }
    // Room again once a ban in the full shard is lifted: the refused key's shard.
    let refused_key = format!("k{held}");
    let mut freed = false;
    for i in 0..held {
        l.unban(format!("k{i}").as_str()).await.unwrap();
        if l.ban(refused_key.as_str(), hour).await.is_ok() {
            freed = true;
            break;
        }
    }
    assert!(freed, "no unban made room for the refused ban");
    assert!(l.check(refused_key.as_str(), 1).await.unwrap().banned);
}
