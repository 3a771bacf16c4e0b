//! An axum app with its operators' console: the app on 127.0.0.1:3000, limited per API key
//! (`x-api-key`), and the console (`rate_limit::admin::Admin`) on 127.0.0.1:3001, behind a token.
//!
//! `cargo run --example admin --features admin`, then:
//! `curl -H 'x-api-key: bob' 127.0.0.1:3000/` a few times,
//! `curl -H 'authorization: Bearer change-me' 127.0.0.1:3001/top`,
//! `curl -X PUT -H 'authorization: Bearer change-me' '127.0.0.1:3001/bans/bob?seconds=60'`.
//! With `REDIS_URL`, every instance shares the limits, the bans and the fleet's top keys.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{routing::get, Router};
use tower_redis_ratelimit::{
    rate_limit::admin::Admin, store::Store, Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer,
    RateLimiter, RedisStore,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: Arc<dyn Store> = match std::env::var("REDIS_URL") {
        Ok(url) => Arc::new(RedisStore::connect(&url).await?),
        Err(_) => Arc::new(MemoryStore::new()),
    };
    let quota = Quota::per_minute(5);
    let limiter = RateLimiter::builder(store, Gcra::new(quota)?)
        .prefix("admin-example")
        .build()?;

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(
            limiter.clone(),
            HeaderKey::new("x-api-key")?,
        ));
    let stats = limiter.clone();
    let console: Router = Admin::new(limiter.clone())
        .quota(quota)
        .token("change-me")?
        // Any recorder's text; here the limiter's own counters.
        .metrics(move || format!("{:#?}\n", stats.stats()))
        .router();

    // Every instance publishes its top keys and watches for a store that lost its bans.
    let watched = limiter.clone();
    tokio::spawn(async move {
        loop {
            let _ = watched.notice_reset().await;
            let _ = watched.publish_top_keys().await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });

    let public = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    let operators = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    println!("listening on http://{}", public.local_addr()?);
    println!("admin listening on http://{}", operators.local_addr()?);
    let console = console.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(operators, console).await });
    axum::serve(public, app).await?;
    Ok(())
}
