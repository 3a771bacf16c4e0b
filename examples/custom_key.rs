//! An API limited per API key (`x-api-key`), where routes cost different amounts and a denied
//! request gets a JSON body.
//!
//! ```text
//! cargo run --example custom_key
//! curl -si -H 'x-api-key: demo' -X POST 127.0.0.1:3000/messages/send
//! ```

use std::net::SocketAddr;

use axum::{
    response::IntoResponse,
    routing::{get, post},
    Router,
};
use http::{header::CONTENT_TYPE, request::Parts, Method, StatusCode};
use tower_redis_ratelimit::{
    extract::MissingKey, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter, SlidingWindow,
};

/// Units per operation, as a provider like Gmail charges them.
fn cost(parts: &Parts) -> u32 {
    match (&parts.method, parts.uri.path()) {
        (_, "/health") => 0, // free: never checked
        (&Method::POST, "/messages/send") => 5,
        (&Method::GET, "/messages") => 2,
        _ => 1,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 30 units a minute per API key, in any sliding minute.
    let limiter = RateLimiter::builder(
        MemoryStore::new(),
        SlidingWindow::new(Quota::per_minute(30))?,
    )
    .prefix("api")
    .policy_name("per-key")
    .build()?;

    let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-api-key")?)
        .cost(cost)
        // Requests without an API key share one small pool rather than going unlimited.
        .on_missing_key(MissingKey::Shared)
        .on_limited(|d| {
            let body = match d.retry_after {
                Some(wait) => format!(
                    "{{\"error\":\"rate_limited\",\"cost\":{},\"remaining\":{},\"retry_after_ms\":{}}}\n",
                    d.cost,
                    d.remaining,
                    wait.as_millis()
                ),
                None => format!(
                    "{{\"error\":\"cost_exceeds_quota\",\"cost\":{},\"quota\":{}}}\n",
                    d.cost, d.capacity
                ),
            };
            // Any response a handler could return: here axum's `IntoResponse`.
            (
                StatusCode::TOO_MANY_REQUESTS,
                [(CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response()
        });

    let app = Router::new()
        .route("/health", get(|| async { "up\n" }))
        .route("/messages", get(|| async { "[]\n" }))
        .route("/messages/send", post(|| async { "sent\n" }))
        .layer(layer);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
