//! Shadow mode in memory: the inner service's own `Retry-After` is kept, and a throttle on a
//! shadow limiter never waits.

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::body::Body;
use http::{Request, Response};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter};

use crate::common::counting;

/// The inner service's own `Retry-After` (say, a 503 of its own) is kept on a response a
/// shadow denial let through.
#[tokio::test]
async fn the_inner_services_retry_after_is_kept() {
    let limiter = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_hour(1)).unwrap())
        .shadow(true)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            limiter.clone(),
            HeaderKey::new("x-key").unwrap(),
        ))
        .service(service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(503)
                    .header("retry-after", "7")
                    .body(Body::empty())
                    .unwrap(),
            )
        }));
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let req = Request::builder()
            .header("x-key", "k")
            .body(Body::empty())
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        statuses.push((
            res.status().as_u16(),
            res.headers()["retry-after"].to_str().unwrap().to_owned(),
            res.headers()["ratelimit"].to_str().unwrap().to_owned(),
        ));
    }
    assert_eq!(statuses[0].1, "7");
    assert_eq!(statuses[1].1, "7", "{statuses:?}");
    assert!(statuses[1].2.contains(";r=0;"), "{statuses:?}");
    assert_eq!(limiter.stats().shadow_denials, 1);
}

/// A `ThrottleLayer` on a shadow limiter never waits nor fails: each denial is counted and
/// the call goes out at once (an enforcing throttle with this `max_wait` fails the second
/// call).
#[tokio::test]
async fn a_throttle_in_shadow_mode_never_waits() {
    let limiter = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_hour(1)).unwrap())
        .shadow(true)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(
            tower_redis_ratelimit::throttle::ThrottleLayer::new(
                limiter.clone(),
                HeaderKey::new("x-key").unwrap(),
            )
            .max_wait(Duration::from_millis(1))
            .unwrap(),
        )
        .service(counting(calls.clone()));
    for _ in 0..3 {
        let req = Request::builder()
            .header("x-key", "k")
            .body(Body::empty())
            .unwrap();
        svc.clone().oneshot(req).await.unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(limiter.stats().shadow_denials, 2);
}
