//! The recipe: an axum app where every route is limited per client (API key, else IP), `/login`
//! has a stricter limit of its own that fails closed, and a denied request gets a JSON body.
//!
//! ```text
//! cargo run --example recipe                                   # in-memory store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example recipe  # shared through Redis
//! cargo run --example recipe -- --listen 127.0.0.1:8080
//! curl -si 127.0.0.1:3000/ ; curl -si -X POST 127.0.0.1:3000/login
//! ```

use std::net::SocketAddr;

use axum::{
    response::IntoResponse,
    routing::{get, post},
    Router,
};
use http::{header::CONTENT_TYPE, StatusCode};
use tokio::net::TcpListener;
use tower_redis_ratelimit::{
    rate_limit::{Class, Decision},
    store::Store,
    ClientIp, ConfigError, FailurePolicy, Gcra, HeaderKey, KeyExtractor, MemoryStore, Quota,
    RateLimitLayer, RateLimiter, RedisStore, SlidingWindow,
};

/// Every route but `/login`: 100 requests a minute per client, in bursts of up to 20.
pub const BROWSE: Quota = Quota::per_minute(100).burst(20);
/// `/login`: 5 attempts in any minute per client.
pub const LOGIN: Quota = Quota::per_minute(5);

/// The app, limited with `store` (a `RedisStore` to share the limits between instances).
pub fn app(store: impl Store + Clone) -> Result<Router, ConfigError> {
    let browse = RateLimiter::builder(store.clone(), Gcra::new(BROWSE)?)
        .policy_name("browse")
        .build()?;
    // Its own policy name, so its own counters; with Redis away, refuse log-ins (503) rather
    // than let a password-guessing burst through.
    let login = RateLimiter::builder(store, SlidingWindow::new(LOGIN)?)
        .policy_name("login")
        .on_store_error(FailurePolicy::Closed)
        .build()?;

    // The API key if there is one, else the client's IP. The key is the client's to choose:
    // authenticate it before this layer, or a client can invent a fresh quota per request.
    // Behind a load balancer, trust it: `ClientIp::new().trust("10.0.0.0/8")?`.
    let key = HeaderKey::new("x-api-key")?.or(ClientIp::new());
    let mut layer = RateLimitLayer::new(browse, key).on_limited(too_many_requests);
    let login = layer.add_policy(login)?;
    let layer = layer.classify(move |parts| match parts.uri.path() {
        "/login" => Class::Policy(login),
        _ => Class::Default,
    });

    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/login", post(|| async { "welcome\n" }))
        .layer(layer))
}

/// The 429 body; the layer adds `Retry-After` and the `RateLimit` headers.
fn too_many_requests(d: &Decision) -> axum::response::Response {
    let retry_after_ms = d
        .retry_after
        .map_or("null".to_owned(), |t| t.as_millis().to_string());
    let body = format!(
        "{{\"error\":\"rate_limited\",\"policy\":\"{}\",\"retry_after_ms\":{retry_after_ms}}}\n",
        d.policy // policy names are plain ASCII, nothing to escape
    );
    let json = [(CONTENT_TYPE, "application/json")];
    (StatusCode::TOO_MANY_REQUESTS, json, body).into_response()
}

/// Serves `app` with the peer addresses `ClientIp` needs.
pub async fn serve(listener: TcpListener, app: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let listen = match (args.next().as_deref(), args.next()) {
        (None, _) => "127.0.0.1:3000".to_owned(),
        (Some("--listen"), Some(addr)) => addr,
        _ => return Err("usage: recipe [--listen ADDR]".into()),
    };
    let app = match std::env::var("REDIS_URL") {
        Ok(url) => app(RedisStore::connect(&url).await?)?,
        Err(_) => app(MemoryStore::new())?,
    };
    let listener = TcpListener::bind(&listen).await?;
    println!("listening on {}", listener.local_addr()?);
    serve(listener, app).await?;
    Ok(())
}
