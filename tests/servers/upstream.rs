//! A third-party API for the outbound tests: an axum server on loopback that enforces its own
//! limit (a fixed window aligned to whole seconds) and tells it in one of several header
//! styles, with a limit its clients are not told and that can change while they run; and
//! [`Fixed`], an upstream giving every call the same answer.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU32, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{http::HeaderMap, response::IntoResponse, routing::any, Router};
use http::StatusCode;

// Its own copy of the limits, so that a binary compiling `servers` without `common` (a bench)
// has them too.
#[path = "../common/upstream_limits.rs"]
mod upstream_limits;

#[allow(unused_imports)]
pub use upstream_limits::{Kind, Limits, Style as Telling};

/// How the upstream tells its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// `RateLimit-Policy` and `RateLimit: "up";r=R;t=T`.
    Ietf,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (seconds).
    Draft,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (a Unix time).
    XEpoch,
    /// Nothing but a 429 (with `Retry-After`) when over.
    Silent,
    /// Hostile values: negative counts, resets years away, a `Retry-After` in the year 9999.
    Hostile,
}

#[derive(Default)]
pub struct Counts {
    pub ok: AtomicU64,
    pub limited: AtomicU64,
    /// Per window (its index), the 200s and 429s.
    pub windows: Mutex<Vec<(u64, u64, u64)>>,
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub limit: Arc<AtomicU32>,
    pub window: Duration,
    pub counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

impl Upstream {
    /// `limit` requests per `window` (a whole number of seconds).
    pub async fn start(style: Style, limit: u32, window: Duration) -> Self {
        let limit = Arc::new(AtomicU32::new(limit));
        let counts = Arc::new(Counts::default());
        let state = Arc::new(Mutex::new((0u64, 0u32)));
        let (l, c) = (limit.clone(), counts.clone());
        let app = Router::new().route(
            "/",
            any(move || {
                let (limit, counts, state) = (l.clone(), c.clone(), state.clone());
                async move { answer(style, window, &limit, &counts, &state) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            limit,
            window,
            counts,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Sleeps until the next window starts.
    pub async fn until_next_window(&self) {
        let w = self.window.as_micros();
        let n = now().as_micros();
        let next = (n / w + 1) * w;
        tokio::time::sleep(Duration::from_micros((next - n) as u64)).await;
    }

    pub fn ok(&self) -> u64 {
        self.counts.ok.load(Ordering::SeqCst)
    }

    pub fn limited(&self) -> u64 {
        self.counts.limited.load(Ordering::SeqCst)
    }

    /// (window index, 200s, 429s), in order.
    pub fn windows(&self) -> Vec<(u64, u64, u64)> {
        self.counts.windows.lock().unwrap().clone()
    }
}

fn answer(
    style: Style,
    window: Duration,
    limit: &AtomicU32,
    counts: &Counts,
    state: &Mutex<(u64, u32)>,
) -> impl IntoResponse {
    let limit = limit.load(Ordering::SeqCst);
    let t = now();
    let w = window.as_micros();
    let index = (t.as_micros() / w) as u64;
    let end = Duration::from_micros(((index + 1) as u128 * w) as u64);
    let (allowed, left) = {
        let mut s = state.lock().unwrap();
        if s.0 != index {
            *s = (index, 0);
        }
        let allowed = s.1 < limit;
        if allowed {
            s.1 += 1;
        }
        (allowed, limit.saturating_sub(s.1))
    };
    {
        let mut windows = counts.windows.lock().unwrap();
        if windows.last().is_none_or(|w| w.0 != index) {
            windows.push((index, 0, 0));
        }
        let last = windows.last_mut().unwrap();
        if allowed {
            last.1 += 1;
        } else {
            last.2 += 1;
        }
    }
    let counter = if allowed { &counts.ok } else { &counts.limited };
    counter.fetch_add(1, Ordering::SeqCst);
    // Seconds to the reset, rounded up.
    let reset = (end - t).as_micros().div_ceil(1_000_000) as u64;
    let mut h = HeaderMap::new();
    let mut put = |k: &'static str, v: String| {
        h.insert(k, v.parse().unwrap());
    };
    match style {
        Style::Ietf => {
            put(
                "ratelimit-policy",
                format!("\"up\";q={limit};w={}", window.as_secs()),
            );
            put("ratelimit", format!("\"up\";r={left};t={reset}"));
        }
        Style::Draft => {
            put("ratelimit-limit", limit.to_string());
            put("ratelimit-remaining", left.to_string());
            put("ratelimit-reset", reset.to_string());
        }
        Style::XEpoch => {
            put("x-ratelimit-limit", limit.to_string());
            put("x-ratelimit-remaining", left.to_string());
            put("x-ratelimit-reset", end.as_secs().to_string());
        }
        Style::Silent => {}
        Style::Hostile => {
            put("x-ratelimit-remaining", "-5".to_owned());
            put("x-ratelimit-reset", "99999999999".to_owned());
            put("ratelimit", "\"up\";r=NaN;t=-1".to_owned());
        }
    }
    if allowed {
        return (StatusCode::OK, h, "ok");
    }
    match style {
        Style::Hostile => put("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT".to_owned()),
        _ => put("retry-after", reset.to_string()),
    }
    (StatusCode::TOO_MANY_REQUESTS, h, "slow down")
}

/// An upstream that answers every call with `status` and `headers`, whatever was asked.
pub struct Fixed {
    pub addr: SocketAddr,
    calls: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fixed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fixed {
    pub async fn start(status: StatusCode, headers: &[(&str, &str)]) -> Self {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        let app = Router::new().route(
            "/",
            any(move || {
                c.fetch_add(1, Ordering::SeqCst);
                let h = h.clone();
                async move { (status, h, "fixed answer") }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, calls, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Calls that reached it so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

/// An upstream on loopback answering by [`Limits`] on the wall clock (each kind of limit, each
/// way of telling it), with its `Date`.
pub struct Told {
    pub addr: SocketAddr,
    pub limits: Arc<Mutex<Limits>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Told {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Told {
    pub async fn start(limits: Limits) -> Self {
        let limits = Arc::new(Mutex::new(limits));
        let l = limits.clone();
        let app = Router::new().route(
            "/",
            any(move || {
                let limits = l.clone();
                async move {
                    let t = now();
                    let answer = limits.lock().unwrap().call(t);
                    let mut h = HeaderMap::new();
                    for (name, value) in answer.headers {
                        h.insert(name, value.parse().unwrap());
                    }
                    let date = httpdate::fmt_http_date(UNIX_EPOCH + t);
                    h.insert("date", date.parse().unwrap());
                    let status = if answer.allowed {
                        StatusCode::OK
                    } else {
                        StatusCode::TOO_MANY_REQUESTS
                    };
                    (status, h, "told")
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, limits, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Calls it answered 200, and 429.
    pub fn counts(&self) -> (u64, u64) {
        let l = self.limits.lock().unwrap();
        (l.ok, l.limited)
    }
}
