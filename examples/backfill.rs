//! Throttling a service's own calls to a third-party API, as the seeds' Gmail sync does:
//! per-operation costs, and a lower quota for the bulk back-fill job so that interactive calls
//! are never starved.
//!
//! Both clients check the *same* sliding-window log per user; the back-fill limiter stops at
//! a lower threshold (10 of the 30 units a second), so it only runs on what interactive use
//! leaves: interactive traffic pushes it back, never the other way round.
//!
//! ```text
//! cargo run --example backfill                                    # in-memory store
//! cargo run --example backfill -- --redis redis://127.0.0.1:6379 --secs 5
//! ```
//!
//! It starts a local stand-in for the API on 127.0.0.1, runs both clients for `--secs`
//! seconds, and prints what each got.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use axum::{routing::any, Router};
use bytes::Bytes;
use http::{request::Parts, Method, Request};
use http_body_util::Full;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    store::Store, throttle::ThrottleLayer, MemoryStore, Quota, RateLimiter, RedisStore,
    SlidingWindow,
};

/// Units per operation, as the provider charges them.
fn cost(parts: &Parts) -> u32 {
    match (&parts.method, parts.uri.path()) {
        (&Method::POST, "/gmail/v1/send") => 5,
        (_, "/gmail/v1/messages") => 2,
        _ => 1,
    }
}

/// The user whose quota a call spends.
fn user(parts: &Parts) -> Option<String> {
    parts
        .headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut redis = None;
    let mut secs = 5u64;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--redis" => redis = Some(value),
            "--secs" => secs = value.parse().map_err(|_| "--secs: a whole number")?,
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }

    // The stand-in API: counts the units it is charged.
    let charged = Arc::new(AtomicU64::new(0));
    let api = {
        let charged = charged.clone();
        Router::new().fallback(any(move |req: Request<axum::body::Body>| {
            let charged = charged.clone();
            async move {
                charged.fetch_add(u64::from(cost(&req.into_parts().0)), Ordering::Relaxed);
                "{}"
            }
        }))
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api_addr: SocketAddr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, api).await });

    let store: Arc<dyn Store> = match &redis {
        Some(url) => Arc::new(RedisStore::connect(url).await?),
        None => Arc::new(MemoryStore::new()),
    };
    // 30 units a second per user in all; back-fill may use at most 10 of them. Both count on
    // one sliding-window log (the same policy name, shared on purpose), so back-fill only
    // spends what interactive calls leave below its lower threshold.
    let window = Duration::from_secs(1);
    let interactive =
        RateLimiter::builder(store.clone(), SlidingWindow::new(Quota::new(30, window))?)
            .policy_name("gmail")
            .common_counters()
            .build()?;
    let backfill = RateLimiter::builder(store, SlidingWindow::new(Quota::new(10, window))?)
        .policy_name("gmail")
        .common_counters()
        .build()?;

    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let interactive_client = ServiceBuilder::new()
        .layer(
            ThrottleLayer::new(interactive, user)
                .cost(cost)
                .max_wait(Duration::from_secs(2))?,
        )
        .service(http.clone());
    let backfill_client = ServiceBuilder::new()
        .layer(
            ThrottleLayer::new(backfill, user)
                .cost(cost)
                .max_wait(Duration::from_secs(5))?,
        )
        .service(http);

    let request = move |method: Method, path: &str| {
        Request::builder()
            .method(method)
            .uri(format!("http://{api_addr}{path}"))
            .header("x-user", "user-7f3a")
            .body(Full::new(Bytes::new()))
            .expect("valid request")
    };
    let deadline = Instant::now() + Duration::from_secs(secs);

    // The back-fill job: lists messages as fast as its quota allows.
    let backfill_task = {
        let mut client = backfill_client;
        tokio::spawn(async move {
            let (mut calls, mut failed) = (0u64, 0u64);
            while Instant::now() < deadline {
                let svc = client.ready().await.expect("client ready");
                match svc.call(request(Method::GET, "/gmail/v1/messages")).await {
                    Ok(_) => calls += 1,
                    Err(_) => failed += 1,
                }
            }
            (calls, failed)
        })
    };

    // Interactive use: a send (5 units) every 250 ms, 20 units a second.
    let (mut sent, mut failed, mut max_wait) = (0u64, 0u64, Duration::ZERO);
    let mut client = interactive_client;
    while Instant::now() < deadline {
        let started = Instant::now();
        let svc = client.ready().await?;
        match svc.call(request(Method::POST, "/gmail/v1/send")).await {
            Ok(res) if res.status().is_success() => sent += 1,
            Ok(_) | Err(_) => failed += 1,
        }
        max_wait = max_wait.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(250).saturating_sub(started.elapsed())).await;
    }
    let (backfill_calls, backfill_failed) = backfill_task.await?;

    println!(
        "interactive: {sent} sent, {failed} failed, slowest {} ms",
        max_wait.as_millis()
    );
    println!(
        "backfill: {backfill_calls} calls ({} units), {backfill_failed} failed",
        backfill_calls * 2
    );
    println!(
        "api charged {} units in {secs} s (interactive quota 30/s, back-fill at most 10/s of it)",
        charged.load(Ordering::Relaxed)
    );
    Ok(())
}
