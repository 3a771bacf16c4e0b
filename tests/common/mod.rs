//! Helpers for every test binary; none starts a server or a process (those are in
//! `tests/servers`, which the `memory` binary does not compile).
#![allow(dead_code, unreachable_pub)]

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
use tower::service_fn;
use tower_redis_ratelimit::{algorithm::Algorithm, store::Store, RateLimiter};

/// An error and its causes on one line, `error: cause: cause`, each cause once (redis-rs prints
/// its source in its own message: it is not repeated).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut last = out.clone();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !last.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        last = text;
        source = cause.source();
    }
    out
}

/// Each single-quota algorithm with `quota`, by name, for suites that must hold for all.
pub fn each_algorithm(
    quota: tower_redis_ratelimit::Quota,
) -> Vec<(&'static str, Arc<dyn Algorithm>)> {
    use tower_redis_ratelimit::{Gcra, SlidingWindow, TokenBucket};
    vec![
        ("gcra", Arc::new(Gcra::new(quota).unwrap())),
        ("token-bucket", Arc::new(TokenBucket::new(quota).unwrap())),
        (
            "sliding-window",
            Arc::new(SlidingWindow::new(quota).unwrap()),
        ),
    ]
}

/// A limiter with `prefix` and a store timeout generous enough for loaded CI machines.
pub fn limiter<A: Algorithm>(store: impl Store, algorithm: A, prefix: &str) -> RateLimiter<A> {
    RateLimiter::builder(store, algorithm)
        .prefix(prefix)
        .store_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// An inner service answering `200 hello` that counts its calls, to prove denied requests
/// never reach it.
pub fn counting(
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    service_fn(move |_req: Request<Body>| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Response::new(Body::from("hello")))
        }
    })
}

/// The value of the response header `name`, if it is there (panics if it is not visible
/// ASCII).
pub fn header<'a, B>(res: &'a Response<B>, name: &str) -> Option<&'a str> {
    res.headers().get(name).map(|v| v.to_str().unwrap())
}
