//! Calling an upstream HTTP API through the client-side throttle: N GET requests to a URL,
//! C in flight, throttled by a configured limit and, with `--adaptive`, by what the
//! upstream's answers say about its own limits (shared by every copy pointed at one Redis).
//!
//! ```text
//! cargo run --example outbound -- --upstream URL --requests N --concurrency C
//!     [--redis URL] [--key NAME] [--limit N --per P] [--adaptive] [--max-wait-ms N]
//! ```
//!
//! - `--key NAME`: the throttle's key (default `upstream`); copies with the same key and Redis
//!   share one limit.
//! - `--limit N --per P` (P as `1s`, `500ms`, `1m`): the configured limit. Without it the
//!   throttle has no configured limit (only what it learns, with `--adaptive`).
//! - `--adaptive`: learn the upstream's limit from its answers (`RateLimit-Policy`,
//!   `RateLimit`, `X-RateLimit-*`, `Retry-After`), share it through the store, pace the calls
//!   at the upstream's rate, and send a call the upstream answered 429 again after its pause
//!   (within the maximum wait).
//! - `--max-wait-ms N`: the longest a request waits for its quota (default 10,000).
//!
//! - With `--adaptive` and without `--limit`/`--per`, the throttle only learns: no configured
//!   limit, only what the upstream says (its `RateLimit-Policy`, its windows, its pauses).
//!
//! The second-to-last line is `waits p50 X ms, p99 Y ms, max Z ms`: how long calls waited,
//! from asking to go until their request was sent (whole milliseconds, over the calls that
//! were sent; 0 when none was). The last line is exactly `sent N, ok X, limited Y, failed Z
//! in S s`: X answers 2xx, Y answers 429, Z transport errors, waits over `--max-wait-ms`, store
//! failures, calls with no answer within `--max-wait-ms` + 5 s, and other statuses; S seconds
//! with one decimal.
//!
//! The earlier scenario (interactive calls next to a back-fill job, sharing one quota) is
//! `examples/backfill.rs`.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::Empty;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tower::{util::BoxCloneService, Service, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    store::UpstreamStore, telemetry::ErrorChain, throttle::ThrottleLayer, Gcra, MemoryStore, Quota,
    RateLimiter, RedisStore,
};

const USAGE: &str = "usage: outbound --upstream URL --requests N --concurrency C [--redis URL] \
[--key NAME] [--limit N --per P] [--adaptive] [--max-wait-ms N]";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a call may take beyond `--max-wait-ms` (its wait for quota) before it is failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

struct Args {
    upstream: Uri,
    requests: u64,
    concurrency: u64,
    redis: Option<String>,
    key: String,
    limit: Option<(u32, Duration)>,
    adaptive: bool,
    max_wait: Duration,
}

fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..split].parse().ok()?;
    let ms = match &s[split..] {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    Some(Duration::from_millis(n.checked_mul(ms)?)).filter(|d| !d.is_zero())
}

fn parse_args() -> Result<Args, String> {
    let (mut upstream, mut requests, mut concurrency) = (None, None, None);
    let (mut redis, mut key, mut limit, mut per) = (None, "upstream".to_owned(), None, None);
    let (mut adaptive, mut max_wait) = (false, Duration::from_secs(10));
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--adaptive" {
            adaptive = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |what: &str| format!("{flag}: {value:?} is not {what}");
        let positive = |v: &str| v.parse::<u64>().ok().filter(|&n| n > 0);
        let count = |v: &str| v.parse::<u64>().ok();
        match flag.as_str() {
            "--upstream" => {
                let uri: Uri = value.parse().map_err(|_| bad("a URL"))?;
                if uri.scheme_str() != Some("http") || uri.host().is_none() {
                    return Err(bad("an http:// URL"));
                }
                upstream = Some(uri);
            }
            "--requests" => requests = Some(count(&value).ok_or_else(|| bad("a whole number"))?),
            "--concurrency" => {
                concurrency = Some(positive(&value).ok_or_else(|| bad("at least 1"))?)
            }
            "--redis" => redis = Some(value),
            "--key" if !value.is_empty() => key = value,
            "--limit" => {
                limit = Some(
                    value
                        .parse::<u32>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| bad("at least 1"))?,
                )
            }
            "--per" => per = Some(parse_duration(&value).ok_or_else(|| bad("a duration like 1s"))?),
            "--max-wait-ms" => {
                max_wait = Duration::from_millis(value.parse().map_err(|_| bad("a whole number"))?)
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    let limit = match (limit, per) {
        (Some(n), per) => Some((n, per.unwrap_or(Duration::from_secs(1)))),
        (None, Some(_)) => return Err("--per goes with --limit".to_owned()),
        (None, None) => None,
    };
    Ok(Args {
        upstream: upstream.ok_or("--upstream is required")?,
        requests: requests.ok_or("--requests is required")?,
        concurrency: concurrency.ok_or("--concurrency is required")?,
        redis,
        key,
        limit,
        adaptive,
        max_wait,
    })
}

/// The throttled client, answering each request with its status.
type Throttled = BoxCloneService<Request<Empty<Bytes>>, StatusCode, BoxError>;

/// When a call asked to go (a request extension), and when its request was first sent.
#[derive(Clone)]
struct Asked(Instant, Arc<OnceLock<Instant>>);

/// Notes when a call's request is first sent.
fn note_sent(req: Request<Empty<Bytes>>) -> Request<Empty<Bytes>> {
    if let Some(Asked(_, sent)) = req.extensions().get::<Asked>() {
        let _ = sent.set(Instant::now());
    }
    req
}

/// The HTTP client, throttled as the flags say.
fn client<S: UpstreamStore + Clone>(args: &Args, store: S) -> Result<Throttled, BoxError> {
    let http = ServiceBuilder::new()
        .map_request(note_sent)
        .service(Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>());
    if args.limit.is_none() && !args.adaptive {
        let plain = http.map_response(|r| r.status()).map_err(BoxError::from);
        return Ok(BoxCloneService::new(plain));
    }
    let key = args.key.clone();
    let key = move |_: &http::request::Parts| Some(key.clone());
    // Adaptive: a GET the upstream answered 429 is sent again after its pause, within the
    // maximum wait.
    let Some((n, per)) = args.limit else {
        // --adaptive without --limit: only what the upstream says holds.
        let layer = ThrottleLayer::learning(store, "outbound", key)?
            .max_wait(args.max_wait)?
            .retry_rate_limited();
        let throttled = ServiceBuilder::new().layer(layer).service(http);
        return Ok(BoxCloneService::new(throttled.map_response(|r| r.status())));
    };
    let limiter = RateLimiter::builder(store.clone(), Gcra::new(Quota::new(n, per))?)
        .policy_name("outbound")
        .store_timeout(Duration::from_secs(1))
        .build()?;
    let layer = ThrottleLayer::new(limiter, key).max_wait(args.max_wait)?;
    if !args.adaptive {
        let throttled = ServiceBuilder::new().layer(layer).service(http);
        return Ok(BoxCloneService::new(throttled.map_response(|r| r.status())));
    }
    let layer = layer.adaptive(store).retry_rate_limited();
    let throttled = ServiceBuilder::new().layer(layer).service(http);
    Ok(BoxCloneService::new(throttled.map_response(|r| r.status())))
}

/// The `p`th percentile (0 to 100) of sorted `waits`, nearest rank; 0 when there are none.
fn percentile(waits: &[Duration], p: usize) -> u128 {
    if waits.is_empty() {
        return 0;
    }
    let rank = (waits.len() * p).div_ceil(100).clamp(1, waits.len());
    waits[rank - 1].as_millis()
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    limited: AtomicU64,
    failed: AtomicU64,
}

async fn run(args: Args) -> Result<(), BoxError> {
    // Connects on the first call: a Redis that cannot be reached fails calls (counted as
    // failed: the throttle does not let calls out unlimited), it does not stop the run.
    let client = match &args.redis {
        Some(url) => client(&args, RedisStore::connect_lazy(url)?)?,
        None => client(&args, MemoryStore::new())?,
    };
    // A call that gets no answer within the maximum wait and then this long is failed.
    let call_timeout = args.max_wait + CALL_TIMEOUT;
    println!(
        "upstream: {}, {} requests, {} in flight, key {:?}, limit: {}, adaptive: {}",
        args.upstream,
        args.requests,
        args.concurrency,
        args.key,
        args.limit
            .map_or("none".to_owned(), |(n, per)| format!("{n} per {per:?}")),
        if args.adaptive { "on" } else { "off" }
    );
    let next = Arc::new(AtomicU64::new(0));
    let tally = Arc::new(Tally::default());
    let waits = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.min(args.requests) {
        let (mut client, next, tally) = (client.clone(), next.clone(), tally.clone());
        let (uri, requests, waits) = (args.upstream.clone(), args.requests, waits.clone());
        workers.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                let asked = Asked(Instant::now(), Arc::default());
                let req = Request::get(uri.clone())
                    .extension(asked.clone())
                    .body(Empty::new())
                    .expect("a valid request");
                let call = async {
                    let svc = client.ready().await?;
                    svc.call(req).await
                };
                let counter = match tokio::time::timeout(call_timeout, call).await {
                    Ok(Ok(status)) if status.is_success() => &tally.ok,
                    Ok(Ok(StatusCode::TOO_MANY_REQUESTS)) => &tally.limited,
                    Ok(_) | Err(_) => &tally.failed,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if let Some(sent) = asked.1.get() {
                    waits.lock().unwrap().push(sent.duration_since(asked.0));
                }
            }
        }));
    }
    for w in workers {
        w.await?;
    }
    let (ok, limited, failed) = (
        tally.ok.load(Ordering::Relaxed),
        tally.limited.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
    );
    let mut waits = std::mem::take(&mut *waits.lock().unwrap());
    waits.sort();
    println!(
        "waits p50 {} ms, p99 {} ms, max {} ms",
        percentile(&waits, 50),
        percentile(&waits, 99),
        waits.last().map_or(0, Duration::as_millis)
    );
    println!(
        "sent {}, ok {ok}, limited {limited}, failed {failed} in {:.1} s",
        ok + limited + failed,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", ErrorChain(&*e));
            std::process::ExitCode::FAILURE
        }
    }
}
