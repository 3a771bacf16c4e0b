//! A fake model API for the outbound tests: an axum server on loopback with a budget of
//! tokens per window (a fixed window aligned to whole windows, the window standing in for the
//! API's minute so that a test runs in seconds), answering 429 when a call's tokens do not fit
//! what is left, and telling its budgets in OpenAI's fields (`x-ratelimit-*-tokens`,
//! `x-ratelimit-*-requests`, resets as durations like `350ms`) with the usage of each call in
//! `x-usage-total-tokens`. A call says how many tokens it will use in `x-tokens` (the length of
//! its completion, known to the test and not to the throttle).

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{http::HeaderMap, routing::any, Router};
use http::StatusCode;

/// The header a call's tokens are asked in.
pub const ASKED: &str = "x-tokens";
/// The header a call's usage is answered in.
pub const USAGE: &str = "x-usage-total-tokens";

/// Per window (its index): tokens served, 200s, 429s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    pub index: u64,
    pub tokens: u64,
    pub ok: u64,
    pub limited: u64,
}

#[derive(Default)]
struct State {
    /// The current window's index and tokens spent in it.
    current: (u64, u64),
    windows: Vec<Window>,
}

pub struct ModelApi {
    pub addr: SocketAddr,
    /// Tokens per window.
    pub tokens: u64,
    pub window: Duration,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ModelApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

/// A duration as OpenAI writes it: `1.25s`, `350ms`.
fn go_duration(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{}s", d.as_secs_f64())
    } else {
        format!("{}ms", d.as_millis())
    }
}

impl ModelApi {
    /// `tokens` per `window`; requests are limited far above what the tests send.
    pub async fn start(tokens: u64, window: Duration) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let s = state.clone();
        let app = Router::new().route(
            "/",
            any(move |headers: HeaderMap| {
                let state = s.clone();
                async move { answer(tokens, window, &state, &headers) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            tokens,
            window,
            state,
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

    /// Every window seen so far, in order.
    pub fn windows(&self) -> Vec<Window> {
        self.state.lock().unwrap().windows.clone()
    }
}

const REQUESTS: u64 = 100_000;

fn answer(
    limit: u64,
    window: Duration,
    state: &Mutex<State>,
    headers: &HeaderMap,
) -> (StatusCode, HeaderMap, &'static str) {
    let asked: u64 = headers
        .get(ASKED)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1);
    let t = now();
    let w = window.as_micros();
    let index = (t.as_micros() / w) as u64;
    let end = Duration::from_micros(((u128::from(index) + 1) * w) as u64);
    let (allowed, left) = {
        let mut s = state.lock().unwrap();
        if s.current.0 != index {
            s.current = (index, 0);
        }
        let allowed = s.current.1 + asked <= limit;
        if allowed {
            s.current.1 += asked;
        }
        let left = limit - s.current.1;
        if s.windows.last().is_none_or(|w| w.index != index) {
            s.windows.push(Window {
                index,
                ..Window::default()
            });
        }
        let last = s.windows.last_mut().unwrap();
        if allowed {
            last.tokens += asked;
            last.ok += 1;
        } else {
            last.limited += 1;
        }
        (allowed, left)
    };
    let reset = go_duration(end - t);
    let mut h = HeaderMap::new();
    let mut put = |k: &'static str, v: String| {
        h.insert(k, v.parse().unwrap());
    };
    put("x-ratelimit-limit-tokens", limit.to_string());
    put("x-ratelimit-remaining-tokens", left.to_string());
    put("x-ratelimit-reset-tokens", reset.clone());
    put("x-ratelimit-limit-requests", REQUESTS.to_string());
    put("x-ratelimit-remaining-requests", (REQUESTS - 1).to_string());
    put("x-ratelimit-reset-requests", reset);
    if allowed {
        put(USAGE, asked.to_string());
        return (StatusCode::OK, h, "completion");
    }
    (
        StatusCode::TOO_MANY_REQUESTS,
        h,
        "rate limit reached for tokens",
    )
}
