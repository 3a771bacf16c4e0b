//! Per-IP rate limiting for an axum app: 5 requests a minute, bursts of 2.
//!
//! `REDIS_URL=redis://127.0.0.1:6379 cargo run --example axum` shares the limit through Redis;
//! without `REDIS_URL` the in-memory store is used.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{routing::get, Router};
use tower_redis_ratelimit::{
    store::Store, Gcra, MemoryStore, PeerIp, Quota, RateLimitLayer, RateLimiter, RedisStore,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: Arc<dyn Store> = match std::env::var("REDIS_URL") {
        Ok(url) => Arc::new(RedisStore::connect(&url).await?),
        Err(_) => Arc::new(MemoryStore::new()),
    };
    let limiter = RateLimiter::builder(store, Gcra::new(Quota::per_minute(5).burst(2))?)
        .prefix("axum-example")
        .store_timeout(Duration::from_millis(50))
        .build()?;

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(limiter, PeerIp));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    // PeerIp needs the connection info.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
