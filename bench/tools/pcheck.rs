//! One in-memory contender, N checks, in the shared peers harness's configuration (a `u64` id
//! in a request extension, an inner service answering an empty 200, the same quotas), on one
//! thread (or `MT=2`: 64 tasks on 2 workers). Instructions per check under callgrind are
//! repeatable on a loaded machine, where checks/s are not.
//!
//! Copy into the harness's build copy and build it there (it uses the harness's dependencies):
//!
//! ```text
//! cp bench/tools/pcheck.rs target/peers/src/bin/pcheck.rs
//! (cd target/peers && cargo build --release --no-default-features --features ours --bin pcheck)
//! valgrind --tool=callgrind target/peers/target/release/pcheck ours 200000 spread
//! ```
//!
//! `pcheck CONTENDER N WORKLOAD`: CONTENDER `none` (the loop and the request alone), `gov`
//! (tower_governor), `ours`, `ours-noheaders`, `ours-notop` (`top_keys(0)`); WORKLOAD `spread`
//! (100,000 ids), `hot-allowed` (one id, never limited) or `hot` (one id, 100/s).
use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};

#[derive(Clone, Copy, Debug)]
struct UserId(u64);

fn request(id: u64) -> Request<()> {
    let mut req = Request::new(());
    req.extensions_mut().insert(UserId(id));
    req
}
fn ok_ready(_req: Request<()>) -> std::future::Ready<Result<Response<Body>, Infallible>> {
    std::future::ready(Ok(Response::new(Body::empty())))
}
type Inner = tower::util::ServiceFn<fn(Request<()>) -> std::future::Ready<Result<Response<Body>, Infallible>>>;

#[derive(Clone, Copy)]
struct ExtKey;
impl tower_governor::key_extractor::KeyExtractor for ExtKey {
    type Key = u64;
    fn extract<T>(&self, req: &Request<T>) -> Result<u64, tower_governor::GovernorError> {
        req.extensions().get::<UserId>().map(|u| u.0).ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}
fn user_key(parts: &http::request::Parts) -> Option<u64> {
    parts.extensions.get::<UserId>().map(|u| u.0)
}
type KeyFn = fn(&http::request::Parts) -> Option<u64>;

async fn run<S, B>(svc: S, n: u64, wl: &str) -> u64
where
    S: Service<Request<()>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
    B: 'static,
{
    if std::env::var("MT").is_ok() {
        let wl = wl.to_string();
        let tasks: Vec<_> = (0..64u64).map(|t| {
            let svc = svc.clone();
            let wl = wl.clone();
            tokio::spawn(async move { run1(svc, n / 64, &wl, t).await })
        }).collect();
        let mut ok = 0;
        for t in tasks { ok += t.await.unwrap(); }
        return ok;
    }
    run1(svc, n, wl, 0).await
}

async fn run1<S, B>(mut svc: S, n: u64, wl: &str, seed: u64) -> u64
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let mut x: u64 = 0x9E3779B97F4A7C15 ^ (seed.wrapping_mul(0x2545F4914F6CDD1D) | 1);
    let mut ok = 0;
    for _ in 0..n {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        let id = if wl == "spread" { x % 100_000 } else { 0 };
        let r = svc.ready().await.unwrap().call(request(id)).await.unwrap();
        if r.status() == StatusCode::OK { ok += 1; }
    }
    ok
}

fn main() {
    let mut a = std::env::args().skip(1);
    let who = a.next().unwrap();
    let n: u64 = a.next().map_or(1_000_000, |s| s.parse().unwrap());
    let wl = a.next().unwrap_or_else(|| "spread".into());
    let mt: usize = std::env::var("MT").ok().map_or(0, |v| v.parse().unwrap());
    let rt = if mt > 0 {
        tokio::runtime::Builder::new_multi_thread().worker_threads(mt).enable_all().build().unwrap()
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    };
    let inner: Inner = tower::service_fn(ok_ready as fn(_) -> _);
    let hot = wl == "hot";
    let ok = rt.block_on(async {
        match who.as_str() {
            "none" => run(inner, n, &wl).await,
            "gov" => {
                use tower_governor::governor::GovernorConfigBuilder;
                let mut b = GovernorConfigBuilder::default().key_extractor(ExtKey);
                if hot { b.per_millisecond(10).burst_size(100); } else { b.per_nanosecond(1).burst_size(1_000_000); }
                let cfg = b.finish().unwrap();
                run(tower_governor::GovernorLayer::new(cfg).layer(inner), n, &wl).await
            }
            o => {
                use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimitLayer, RateLimiter};
                let quota = if hot { Quota::per_second(100) } else { Quota::per_second(1_000_000).burst(1_000_000_000) };
                let mut b = RateLimiter::builder(MemoryStore::new(), Gcra::new(quota).unwrap())
                    .prefix("pb:x:".to_string()).store_timeout(Duration::from_secs(1));
                if o.contains("notop") { b = b.top_keys(0); }
                let lim = b.build().unwrap();
                let mut layer = RateLimitLayer::new(lim, user_key as KeyFn);
                if o.contains("noheaders") { layer = layer.headers(tower_redis_ratelimit::rate_limit::HeaderStyle::None); }
                if o.contains("lean") { layer = layer.headers_on_denials_only(); }
                run(layer.layer(inner), n, &wl).await
            }
        }
    });
    eprintln!("{who} {wl} n={n} ok={ok}");
}
