//! The client-side ThrottleLayer: waits for quota, gives up beyond the maximum wait, and
//! keeps interactive calls flowing while a back-fill job shares the quota (the outbound
//! example, run as a user runs it, against real Redis and a local HTTP server).

use std::{
    convert::Infallible,
    time::{Duration, Instant},
};

use crate::common::limiter;
use crate::servers::RedisServer;
use http::{Request, Response};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    throttle::{ThrottleError, ThrottleLayer},
    Gcra, Quota,
};

fn echo(
) -> impl tower::Service<Request<()>, Response = Response<()>, Error = Infallible, Future = impl Send>
       + Clone {
    service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new(())) })
}

#[tokio::test]
async fn waits_for_quota_then_gives_up_beyond_max_wait() {
    let redis = RedisServer::start();
    // 10 a second, burst 1: each further call waits ~100 ms.
    let l = limiter(
        redis.store().await,
        Gcra::new(Quota::per_second(10).burst(1)).unwrap(),
        "thr",
    );
    let client = ServiceBuilder::new()
        .layer(
            ThrottleLayer::new(l, |_: &http::request::Parts| Some("api".to_owned()))
                .cost(|parts| if parts.uri.path() == "/big" { 2 } else { 1 })
                .max_wait(Duration::from_millis(500))
                .unwrap(),
        )
        .service(echo());
    let started = Instant::now();
    for _ in 0..4 {
        client
            .clone()
            .oneshot(Request::get("/").body(()).unwrap())
            .await
            .unwrap();
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(290),
        "4 calls at 10/s took only {took:?}"
    );

    // Cost 2 with a burst of 1 can never fit: fails at once, without waiting.
    let started = Instant::now();
    let err = client
        .clone()
        .oneshot(Request::get("/big").body(()).unwrap())
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(200));
    match err.downcast_ref::<ThrottleError>() {
        Some(ThrottleError::WouldExceedMaxWait { decision, .. }) => assert!(decision.is_never()),
        other => panic!("{other:?}"),
    }

    // A queue of 10 concurrent calls: those that would wait past 500 ms fail fast.
    let mut handles = Vec::new();
    for _ in 0..10 {
        let c = client.clone();
        handles.push(tokio::spawn(async move {
            c.oneshot(Request::get("/").body(()).unwrap()).await
        }));
    }
    let mut ok = 0;
    for h in handles {
        match h.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => assert!(matches!(
                e.downcast_ref::<ThrottleError>(),
                Some(ThrottleError::WouldExceedMaxWait { .. })
            )),
        }
    }
    assert!(
        (3..=7).contains(&ok),
        "{ok} of 10 got through within 500 ms at 10/s"
    );
}

#[tokio::test]
async fn a_dead_store_fails_the_call_instead_of_exceeding_the_limit() {
    let store =
        tower_redis_ratelimit::RedisStore::connect_lazy(&crate::servers::dead_redis_url()).unwrap();
    let l = limiter(store, Gcra::new(Quota::per_second(10)).unwrap(), "thr-dead");
    let err = ServiceBuilder::new()
        .layer(ThrottleLayer::new(l, |_: &http::request::Parts| {
            Some("api".to_owned())
        }))
        .service(echo())
        .oneshot(Request::get("/").body(()).unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<ThrottleError>(),
            Some(ThrottleError::Store(_))
        ),
        "{err}"
    );
}
