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
            // Beyond the maximum wait: its place in the schedule, or (on a loaded machine)
            // while it waited in line behind the calls before it.
            Err(e) => assert!(
                matches!(
                    e.downcast_ref::<ThrottleError>(),
                    Some(ThrottleError::WouldExceedMaxWait { .. } | ThrottleError::InLine { .. })
                ),
                "{e}"
            ),
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

/// Two instances (two layers on two connections to one Redis), eight callers each, sharing
/// a GCRA quota of 20 a second: each instance gets about half the calls (places in the
/// schedule are kept in the order the store sees the callers, whichever instance they are
/// in), none waits beyond the maximum wait, and no rolling second holds more than the quota's
/// 20 calls (some room is left for a loaded machine's late wake-ups, which can only bring
/// calls closer together).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_a_configured_quota_fairly_and_within_it() {
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    };
    const TOTAL: usize = 120;
    let redis = RedisServer::start();
    let asked = Arc::new(AtomicUsize::new(0));
    let sent: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let mut instances = Vec::new();
    for _ in 0..2 {
        let l = limiter(
            redis.store().await,
            Gcra::new(Quota::per_second(20)).unwrap(),
            "thr-fair",
        );
        let sent = sent.clone();
        let upstream = service_fn(move |_req: Request<()>| {
            sent.lock().unwrap().push(Instant::now());
            async { Ok::<_, Infallible>(Response::new(())) }
        });
        let client = ServiceBuilder::new()
            .layer(
                ThrottleLayer::new(l, |_: &http::request::Parts| Some("api".to_owned()))
                    .max_wait(Duration::from_secs(5))
                    .unwrap(),
            )
            .service(upstream);
        instances.push(client);
    }
    let mut callers = Vec::new();
    for (i, client) in instances.iter().enumerate() {
        for _ in 0..8 {
            let (client, asked) = (client.clone(), asked.clone());
            callers.push(tokio::spawn(async move {
                let (mut ok, mut failed) = (0usize, Vec::new());
                while asked.fetch_add(1, Ordering::Relaxed) < TOTAL {
                    match client
                        .clone()
                        .oneshot(Request::get("/").body(()).unwrap())
                        .await
                    {
                        Ok(_) => ok += 1,
                        Err(e) => failed.push(e.to_string()),
                    }
                }
                (i, ok, failed)
            }));
        }
    }
    let mut per_instance = [0usize; 2];
    let mut failed = Vec::new();
    for c in callers {
        let (i, ok, f) = c.await.unwrap();
        per_instance[i] += ok;
        failed.extend(f);
    }
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(per_instance.iter().sum::<usize>(), TOTAL);
    assert!(
        per_instance.iter().all(|&n| n >= TOTAL * 35 / 100),
        "calls per instance: {per_instance:?}"
    );
    let mut sent = sent.lock().unwrap().clone();
    sent.sort();
    let most = (0..sent.len())
        .map(|i| {
            sent[i..]
                .iter()
                .take_while(|t| t.duration_since(sent[i]) < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap();
    assert!(
        most <= 24,
        "{most} calls within one rolling second at 20 a second"
    );
}
