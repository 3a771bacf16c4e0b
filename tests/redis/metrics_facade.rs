//! With the `metrics` feature, decisions, store errors, degraded decisions and store latency
//! are recorded through the `metrics` facade.
#![cfg(feature = "metrics")]

use std::time::Duration;

use crate::servers::RedisServer;
use metrics_util::{
    debugging::{DebugValue, DebuggingRecorder},
    CompositeKey,
};
use tower_redis_ratelimit::{
    concurrency::ConcurrencyLimiter, store::CircuitBreaker, telemetry, FailurePolicy, Gcra,
    GlobalKey, Quota, RateLimitLayer, RateLimiter,
};

fn find(
    snapshot: &[(
        CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )],
    name: &str,
    labels: &[(&str, &str)],
) -> Option<Seen> {
    snapshot.iter().find_map(|(key, _, _, value)| {
        let k = key.key();
        let matches = k.name() == name
            && labels.iter().all(|(l, v)| {
                k.labels()
                    .any(|label| label.key() == *l && label.value() == *v)
            });
        let seen = match value {
            DebugValue::Counter(n) => Seen::Counter(*n),
            DebugValue::Histogram(v) => Seen::Histogram(v.len()),
            DebugValue::Gauge(_) => Seen::Gauge,
        };
        matches.then_some(seen)
    })
}

#[derive(Debug)]
enum Seen {
    #[allow(dead_code)] // read through its Debug form in failures
    Counter(u64),
    Histogram(usize),
    Gauge,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_errors_degraded_and_latency_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in this test binary");

    let mut redis = RedisServer::start();
    let limiter = RateLimiter::builder(redis.store().await, Gcra::new(Quota::per_hour(2)).unwrap())
        .policy_name("m")
        .store_timeout(Duration::from_millis(100))
        .circuit_breaker(CircuitBreaker::disabled())
        .on_store_error(FailurePolicy::Local)
        .local_share(2)
        .build()
        .unwrap();
    for _ in 0..3 {
        limiter.check("k", 1).await.unwrap();
    }
    let layer = RateLimitLayer::new(limiter.clone(), GlobalKey);
    redis.kill();
    // A key the deny cache does not know, so the check reaches the dead store and is decided
    // at the local share.
    assert!(limiter.check("k2", 1).await.unwrap().degraded);
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }));
    use tower::ServiceExt;
    let res = svc
        .oneshot(http::Request::get("/").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);

    let snapshot = snapshotter.snapshot().into_vec();
    // The sum of every series of `name` with `labels` (each decision series also has a
    // `source`).
    let counter = |name: &str, labels: &[(&str, &str)]| -> u64 {
        assert!(
            matches!(find(&snapshot, name, labels), Some(Seen::Counter(_))),
            "{name} {labels:?}"
        );
        snapshot
            .iter()
            .filter(|(key, ..)| {
                let k = key.key();
                k.name() == name
                    && labels.iter().all(|(l, v)| {
                        k.labels()
                            .any(|label| label.key() == *l && label.value() == *v)
                    })
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(n) => *n,
                other => panic!("{name}: {other:?}"),
            })
            .sum()
    };
    // 2 from Redis, and the 2 degraded ones (the direct check's and the layer's).
    assert_eq!(
        counter(
            telemetry::DECISIONS,
            &[("policy", "m"), ("decision", "allowed")]
        ),
        4
    );
    assert_eq!(
        counter(
            telemetry::DECISIONS,
            &[("policy", "m"), ("decision", "denied")]
        ),
        1
    );
    // Two failed checks (the direct one and the layer's), whatever their kind label. (The
    // recorder is the process's: other tests of this binary record into it too.)
    let store_errors: u64 = snapshot
        .iter()
        .filter(|(k, ..)| {
            k.key().name() == telemetry::STORE_ERRORS
                && k.key()
                    .labels()
                    .any(|l| l.key() == "policy" && l.value() == "m")
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum();
    assert_eq!(store_errors, 2);
    // The degraded ones, decided at the local share.
    assert_eq!(
        counter(
            telemetry::DECISIONS,
            &[("policy", "m"), ("source", "local")]
        ),
        2
    );
    // The three decisions Redis made, timed, and the two calls to the dead Redis too.
    match find(&snapshot, telemetry::STORE_LATENCY, &[("policy", "m")]) {
        Some(Seen::Histogram(n)) => assert!(n >= 5, "{n} latency samples"),
        other => panic!("latency histogram: {other:?}"),
    }

    // A concurrency limit's decisions go to the same metrics, under its policy: a permit
    // given is `allowed`, one refused `denied`, both from the store.
    let redis = RedisServer::start();
    let concurrency = ConcurrencyLimiter::builder(redis.store().await, 1)
        .policy_name("c")
        .build()
        .unwrap();
    let held = concurrency.acquire("k").await.unwrap();
    assert!(held.is_some());
    assert!(concurrency.acquire("k").await.unwrap().is_none());
    let snapshot = snapshotter.snapshot().into_vec();
    for (decision, n) in [("allowed", 1), ("denied", 1)] {
        let seen = find(
            &snapshot,
            telemetry::DECISIONS,
            &[("policy", "c"), ("decision", decision), ("source", "store")],
        );
        assert!(
            matches!(seen, Some(Seen::Counter(c)) if c == n),
            "{decision}: {seen:?}"
        );
    }
    let stats = concurrency.stats();
    assert_eq!((stats.allowed, stats.denied), (1, 1));
    drop(held);
}
