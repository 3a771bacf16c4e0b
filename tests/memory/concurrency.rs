//! The concurrency limit's answers and configuration, in memory: refusals follow the rate
//! limit's conventions (headers, problem details, gRPC), a custom rejection answers refused
//! requests, and a configuration that cannot work is an error naming the field.

use std::{convert::Infallible, time::Duration};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{service_fn, Layer, ServiceExt};
use tower_redis_ratelimit::{
    concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter},
    Gcra, GlobalKey, MemoryStore, Quota, RateLimiter,
};

#[tokio::test]
async fn refusals_follow_the_rate_limits_conventions() {
    let l = ConcurrencyLimiter::builder(MemoryStore::new(), 1)
        .policy_name("reports")
        .build()
        .unwrap();
    let ok = || {
        service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::from("ok")))
        })
    };
    let held = l.acquire("global").await.unwrap().unwrap();
    let get = || Request::get("/").body(Body::empty()).unwrap();

    // Plain text, headers with the unit, no Retry-After.
    let res = ConcurrencyLimitLayer::new(l.clone(), GlobalKey)
        .layer(ok())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = res.headers();
    assert_eq!(
        h["ratelimit-policy"],
        r#""reports";q=1;qu="concurrent-requests""#
    );
    assert_eq!(h["ratelimit"], r#""reports";r=0"#);
    assert!(h.get("retry-after").is_none());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "concurrency limit exceeded\n");

    // Problem details.
    let res = ConcurrencyLimitLayer::new(l.clone(), GlobalKey)
        .problem_details()
        .layer(ok())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert!(
        body.contains(r#""violated-policies":["reports"]"#),
        "{body}"
    );
    assert!(body.contains("quota-exceeded"), "{body}");

    // gRPC: trailers-only RESOURCE_EXHAUSTED.
    let grpc = Request::post("/pkg.Svc/Call")
        .header("content-type", "application/grpc")
        .body(Body::empty())
        .unwrap();
    let res = ConcurrencyLimitLayer::new(l.clone(), GlobalKey)
        .layer(ok())
        .oneshot(grpc)
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["grpc-status"], "8");
    assert_eq!(res.headers()["content-type"], "application/grpc");

    // Admitted: the slots left when it was admitted.
    drop(held);
    let res = ConcurrencyLimitLayer::new(l.clone(), GlobalKey)
        .layer(ok())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["ratelimit"], r#""reports";r=0"#);
}

/// A custom rejection answers refused requests (not gRPC ones) with its own body and status,
/// and gets the concurrency headers it did not set itself.
#[tokio::test]
async fn a_custom_rejection_answers_refused_requests() {
    let l = ConcurrencyLimiter::builder(MemoryStore::new(), 1)
        .policy_name("exports")
        .build()
        .unwrap();
    let held = l.acquire("global").await.unwrap().unwrap();
    let layer = ConcurrencyLimitLayer::new(l.clone(), GlobalKey).on_limited(|busy| {
        let body = format!(
            "{{\"policy\":\"{}\",\"max_in_flight\":{}}}",
            busy.policy, busy.max_in_flight
        );
        Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .header("content-type", "application/json")
            .header("ratelimit", "\"mine\";r=7")
            .body(Body::from(body))
            .unwrap()
    });
    let ok = service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::from("ok")))
    });
    let svc = layer.layer(ok);
    let res = svc
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["content-type"], "application/json");
    assert_eq!(
        res.headers()["ratelimit-policy"],
        r#""exports";q=1;qu="concurrent-requests""#
    );
    let own: Vec<_> = res.headers().get_all("ratelimit").iter().collect();
    assert_eq!(own, [r#""mine";r=7"#], "the rejection's own field wins");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, r#"{"policy":"exports","max_in_flight":1}"#);

    // gRPC requests keep the trailers-only RESOURCE_EXHAUSTED.
    let grpc = Request::post("/pkg.Svc/Call")
        .header("content-type", "application/grpc")
        .body(Body::empty())
        .unwrap();
    let res = svc.clone().oneshot(grpc).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "8");

    drop(held);
    let res = svc
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[test]
fn bad_configuration_is_an_error_naming_the_field() {
    let b = |n: u32| ConcurrencyLimiter::builder(MemoryStore::new(), n);
    let field =
        |r: Result<ConcurrencyLimiter, tower_redis_ratelimit::ConfigError>| r.unwrap_err().field();
    assert_eq!(field(b(0).build()), "max_in_flight");
    assert_eq!(field(b(2_000_000).build()), "max_in_flight");
    assert_eq!(
        field(b(1).permit_ttl(Duration::from_millis(50)).build()),
        "permit_ttl"
    );
    assert_eq!(
        field(b(1).permit_ttl(Duration::from_secs(7200)).build()),
        "permit_ttl"
    );
    // Under three store timeouts (100 ms by default).
    assert_eq!(
        field(b(1).permit_ttl(Duration::from_millis(250)).build()),
        "permit_ttl"
    );
    assert!(b(1).permit_ttl(Duration::from_millis(300)).build().is_ok());
    assert_eq!(
        field(b(1).store_timeout(Duration::ZERO).build()),
        "store_timeout"
    );
    assert_eq!(field(b(1).prefix("a{b").build()), "prefix");
    assert_eq!(field(b(1).policy_name("a b").build()), "policy_name");
    assert_eq!(field(b(1).local_share(0).build()), "local_share");
    assert_eq!(field(b(1).max_key_len(3).build()), "max_key_len");
    assert_eq!(
        field(
            b(1).circuit_breaker(tower_redis_ratelimit::store::CircuitBreaker::new(
                1,
                Duration::ZERO
            ))
            .build()
        ),
        "circuit_breaker.cool_down"
    );

    // Namespaces: another limit under the same name conflicts; the same limit shares; a rate
    // policy of the same name keeps its own keys.
    let store = MemoryStore::new();
    let two = ConcurrencyLimiter::builder(store.clone(), 2).policy_name("api");
    let _two = two.build().unwrap();
    let three = ConcurrencyLimiter::builder(store.clone(), 3).policy_name("api");
    assert_eq!(field(three.build()), "policy_name");
    let _again = ConcurrencyLimiter::builder(store.clone(), 2)
        .policy_name("api")
        .build()
        .unwrap();
    RateLimiter::builder(store, Gcra::new(Quota::per_second(1)).unwrap())
        .policy_name("api")
        .build()
        .unwrap();
}
