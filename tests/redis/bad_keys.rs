//! A bad key is a bad key: foreign data under one rate key (a list, a corrupted value) is an
//! error about that key on every Redis version the crate supports. It never counts towards the
//! circuit breaker, so the other keys stay limited; and under `Local` it is refused, never
//! decided at an invented local share.
//!
//! Redis 5 and 6 answer every error raised in a script as `ERR Error running script …`, with
//! the raised message after it; Redis 7 and later answer with the message itself (`WRONGTYPE
//! …`, `ERR tower-redis-ratelimit: …`). `scripts/compat` runs this suite on each.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::body::Body;
use http::{Request, StatusCode};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    algorithm::Algorithm,
    redis,
    store::{redis::Batching, CircuitBreaker, ErrorScope},
    Error, FailurePolicy, HeaderKey, Quota, RateLimitLayer, RateLimiter, RedisStore,
};

use crate::common::{counting, each_algorithm};
use crate::servers::{command_calls, RedisServer};

/// Opens after 3 store failures and stays open for a minute: longer than any test here, so
/// a breaker that opened is still open when the good key is checked.
const BREAKER: CircuitBreaker = CircuitBreaker::new(3, Duration::from_secs(60));

/// The key a check of `algorithm` writes its state under (see `store::redis::keys`).
fn state_key(base: &str, algorithm: &str) -> String {
    let suffix = match algorithm {
        "gcra" => ":g",
        "token-bucket" => ":b",
        "sliding-window" => ":l2",
        other => panic!("no state key known for {other}"),
    };
    format!("{base}{suffix}")
}

fn rpush(conn: &mut redis::Connection, key: &str) {
    let _: () = redis::cmd("RPUSH").arg(key).arg("x").query(conn).unwrap();
}

/// Checks `bad` ten times (more than the breaker's threshold): each is an error about the key
/// (`what` names the case); then a good key is still decided by Redis, up to its limit.
async fn bad_key_then_good_key(
    limiter: &RateLimiter<Arc<dyn Algorithm>>,
    conn: &mut redis::Connection,
    what: &str,
) {
    for i in 0..10 {
        let e = limiter
            .check("bad", 1)
            .await
            .expect_err(&format!("{what}: check {i} of the bad key was decided"));
        assert!(
            !matches!(e, Error::CircuitOpen),
            "{what}: the breaker opened after {i} checks of one bad key"
        );
        assert_eq!(e.scope(), ErrorScope::Key, "{what}: {e:?}");
        assert!(!e.is_unavailable(), "{what}: {e:?}");
    }
    let before = command_calls(conn, |c| c.starts_with("eval"));
    let first = limiter.check("good", 1).await;
    let first = first.unwrap_or_else(|e| panic!("{what}: the good key was not decided: {e:?}"));
    assert!(first.allowed && !first.degraded, "{what}: {first:?}");
    assert!(limiter.check("good", 1).await.unwrap().allowed, "{what}");
    let third = limiter.check("good", 1).await.unwrap();
    assert!(
        !third.allowed,
        "{what}: past its limit the good key got {third:?}"
    );
    assert!(
        command_calls(conn, |c| c.starts_with("eval")) >= before + 3,
        "{what}: the good key's checks did not reach Redis"
    );
}

#[tokio::test]
async fn a_list_under_a_rate_key_is_that_keys_error_and_never_opens_the_breaker() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let plain = redis.store().await;
    let batched = redis.store().await.with_batching(Batching::new()).unwrap();
    for (store, how) in [(plain, "plain"), (batched, "batched")] {
        for (name, algorithm) in each_algorithm(Quota::per_hour(2)) {
            let prefix = format!("bad-list-{how}-{name}");
            let limiter = RateLimiter::builder(store.clone(), algorithm)
                .prefix(&prefix)
                .store_timeout(Duration::from_secs(5))
                .circuit_breaker(BREAKER)
                .build()
                .unwrap();
            rpush(&mut conn, &state_key(&limiter.storage_key("bad"), name));
            bad_key_then_good_key(&limiter, &mut conn, &format!("{how} {name}")).await;
        }
    }
}

#[tokio::test]
async fn a_corrupted_value_raised_by_a_script_is_that_keys_error_and_never_opens_the_breaker() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let plain = redis.store().await;
    let batched = redis.store().await.with_batching(Batching::new()).unwrap();
    for (store, how) in [(plain, "plain"), (batched, "batched")] {
        // The token bucket's script reads its hash with the shared prelude, which raises the
        // script's own error (`tower-redis-ratelimit: corrupted token count …`).
        let (name, algorithm) = each_algorithm(Quota::per_hour(2))
            .into_iter()
            .find(|(name, _)| *name == "token-bucket")
            .unwrap();
        let limiter = RateLimiter::builder(store, algorithm)
            .prefix(format!("bad-value-{how}"))
            .store_timeout(Duration::from_secs(5))
            .circuit_breaker(BREAKER)
            .build()
            .unwrap();
        let _: () = redis::cmd("HSET")
            .arg(state_key(&limiter.storage_key("bad"), name))
            .arg("n")
            .arg("-3")
            .arg("t")
            .arg("1")
            .query(&mut conn)
            .unwrap();
        let e = limiter.check("bad", 1).await.unwrap_err();
        assert!(
            format!("{e:?}").contains("tower-redis-ratelimit: corrupted token count"),
            "{how}: the script's own message is lost: {e:?}"
        );
        bad_key_then_good_key(&limiter, &mut conn, &format!("{how} corrupted {name}")).await;
    }
}

/// One request with `x-key: key` through `svc`: its status and whether it carries
/// `RateLimit` numbers.
async fn request<S, B>(svc: &mut S, key: &str) -> (StatusCode, bool)
where
    S: Service<Request<Body>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
{
    let req = Request::get("/")
        .header("x-key", key)
        .body(Body::empty())
        .unwrap();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    (res.status(), res.headers().contains_key("ratelimit"))
}

/// Through the layer, as the gateway runs it: with a list under one key, requests for that key
/// follow the failure policy as a key's error (`Open` lets them through, `Local` refuses them
/// without invented numbers), and every other key stays limited by Redis.
#[tokio::test]
async fn through_the_layer_a_bad_key_leaves_the_other_keys_limited() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let store: RedisStore = redis.store().await;
    for policy in [FailurePolicy::Open, FailurePolicy::Local] {
        let (name, algorithm) = each_algorithm(Quota::per_hour(2)).remove(0);
        let limiter = RateLimiter::builder(store.clone(), algorithm)
            .prefix(format!("bad-layer-{policy:?}"))
            .store_timeout(Duration::from_secs(5))
            .circuit_breaker(BREAKER)
            .on_store_error(policy)
            .local_share(1)
            .build()
            .unwrap();
        rpush(&mut conn, &state_key(&limiter.storage_key("bad"), name));
        let calls = Arc::new(AtomicUsize::new(0));
        let mut svc = ServiceBuilder::new()
            .layer(RateLimitLayer::new(
                limiter,
                HeaderKey::new("x-key").unwrap(),
            ))
            .service(counting(calls.clone()));
        for _ in 0..10 {
            let (status, numbers) = request(&mut svc, "bad").await;
            let expected = match policy {
                FailurePolicy::Local => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::OK,
            };
            assert_eq!(status, expected, "{policy:?}");
            assert!(
                !numbers,
                "{policy:?}: a bad key got invented RateLimit numbers"
            );
        }
        let served_bad = calls.load(Ordering::SeqCst);
        let good: Vec<_> = [
            request(&mut svc, "good").await,
            request(&mut svc, "good").await,
            request(&mut svc, "good").await,
        ]
        .into();
        assert_eq!(
            good,
            [
                (StatusCode::OK, true),
                (StatusCode::OK, true),
                (StatusCode::TOO_MANY_REQUESTS, true)
            ],
            "{policy:?}: the good key was not limited by Redis after the bad key's requests"
        );
        assert_eq!(calls.load(Ordering::SeqCst), served_bad + 2, "{policy:?}");
    }
}
