//! A third-party API with a limit of its own, for `scripts/bench-outbound`: the limits the
//! outbound tests use (`tests/common/upstream_limits.rs`: fixed window, rolling window, token
//! bucket, or only `Retry-After`; told in the IETF fields, `RateLimit-*` or `X-RateLimit-*`),
//! on the wall clock, on 127.0.0.1.
//!
//! ```text
//! upstream --port P --kind fixed|rolling|bucket|retry-after --style ietf|draft|x-unix|x-delta
//!          --quota N [--window-secs W]
//! ```
//!
//! `GET /` is answered by the limit; `GET /stats` with `ok N, limited M` (the calls answered
//! 200 and 429 so far).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{
    http::{HeaderMap, HeaderName, StatusCode},
    routing::get,
    Router,
};

#[path = "../../tests/common/upstream_limits.rs"]
mod upstream_limits;

use upstream_limits::{Kind, Limits, Style};

const USAGE: &str = "usage: upstream --port P --kind fixed|rolling|bucket|retry-after \
--style ietf|draft|x-unix|x-delta --quota N [--window-secs W]";

fn args() -> Result<(u16, Limits), String> {
    let (mut port, mut kind, mut style, mut quota, mut window) = (None, None, None, None, 1);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = || format!("{flag}: {value:?} is not valid");
        match flag.as_str() {
            "--port" => port = Some(value.parse().map_err(|_| bad())?),
            "--kind" => kind = Some(Kind::parse(&value).ok_or_else(bad)?),
            "--style" => style = Some(Style::parse(&value).ok_or_else(bad)?),
            "--quota" => quota = Some(value.parse().ok().filter(|&q| q > 0).ok_or_else(bad)?),
            "--window-secs" => window = value.parse().ok().filter(|&w| w > 0).ok_or_else(bad)?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    let limits = Limits::new(
        kind.ok_or("--kind is required")?,
        style.ok_or("--style is required")?,
        quota.ok_or("--quota is required")?,
        Duration::from_secs(window),
    );
    Ok((port.ok_or("--port is required")?, limits))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let (port, limits) = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
    let limits = Arc::new(Mutex::new(limits));
    let (answer, stats) = (limits.clone(), limits);
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let limits = answer.clone();
                async move {
                    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
                    let a = limits.lock().unwrap().call(now);
                    let mut h = HeaderMap::new();
                    for (name, value) in a.headers {
                        h.insert(HeaderName::from_static(name), value.parse().unwrap());
                    }
                    let date = httpdate::fmt_http_date(UNIX_EPOCH + now);
                    h.insert("date", date.parse().unwrap());
                    let status = if a.allowed {
                        StatusCode::OK
                    } else {
                        StatusCode::TOO_MANY_REQUESTS
                    };
                    (status, h, "upstream")
                }
            }),
        )
        .route(
            "/stats",
            get(move || {
                let limits = stats.clone();
                async move {
                    let l = limits.lock().unwrap();
                    format!("ok {}, limited {}\n", l.ok, l.limited)
                }
            }),
        );
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:{port}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match axum::serve(listener, app).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
