//! Envoy's rate limit service (`ShouldRateLimit` over gRPC) served by limitador, the library
//! behind Kuadrant's limitador-server, for scripts/bench-rls.
//!
//! ```text
//! limitador-rls --listen 127.0.0.1:0 --redis redis://127.0.0.1:6379 --limits FILE
//!     [--storage redis|redis-cached]
//! ```
//!
//! `--limits FILE`: limitador-server's limits file (a YAML list of `namespace`, `max_value`,
//! `seconds`, `conditions`, `variables`). `--storage redis` (the default) is limitador's
//! `AsyncRedisStorage`, every decision read from and written to Redis;
//! `redis-cached` is its `CachedRedisStorage`, which decides from counters cached in this
//! process and writes them to Redis in batches (not exact across instances). Prints
//! `listening on http://ADDR` once it accepts connections.
//!
//! A request is decided as limitador-server's `envoy_rls` server decides it
//! (limitador-server/src/envoy_rls/server.rs): the domain is the namespace (an empty one is
//! answered `UNKNOWN`), the descriptors are bound as the CEL list `descriptors` (each a map
//! of its entries), `hits_addend` 0 counts as 1, `check_rate_limited_and_update` decides, and
//! a storage error is `UNAVAILABLE`. Left out: limitador-server's Prometheus metrics, its
//! tracing spans and the `x-ratelimit-*` headers (off by default there too).

use std::{
    collections::HashMap,
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context as TaskContext, Poll},
};

use bytes::Bytes;
use limitador::{
    limit::{Context, Limit, Namespace},
    storage::redis::{AsyncRedisStorage, CachedRedisStorageBuilder},
    AsyncRateLimiter,
};
use tonic::{
    server::{Grpc, NamedService, UnaryService},
    Status,
};
use tonic_prost::ProstCodec;
use tower_redis_ratelimit::rate_limit::rls::{
    proto::{Code, RateLimitRequest, RateLimitResponse},
    SHOULD_RATE_LIMIT,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

struct Args {
    listen: String,
    redis: String,
    limits: String,
    cached: bool,
}

fn args() -> Result<Args, String> {
    let mut listen = None;
    let mut redis = None;
    let mut limits = None;
    let mut cached = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => listen = Some(value()?),
            "--redis" => redis = Some(value()?),
            "--limits" => limits = Some(value()?),
            "--storage" => {
                cached = match value()?.as_str() {
                    "redis" => false,
                    "redis-cached" => true,
                    other => return Err(format!("--storage {other}: redis or redis-cached")),
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Args {
        listen: listen.ok_or("--listen ADDR is required")?,
        redis: redis.ok_or("--redis URL is required")?,
        limits: limits.ok_or("--limits FILE is required")?,
        cached,
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = args().map_err(|e| format!("limitador-rls: {e}"))?;
    let text = std::fs::read_to_string(&args.limits)
        .map_err(|e| format!("--limits {}: {e}", args.limits))?;
    let limits: Vec<Limit> =
        serde_saphyr::from_str(&text).map_err(|e| format!("--limits {}: {e}", args.limits))?;
    let limiter = if args.cached {
        let storage = CachedRedisStorageBuilder::new(&args.redis).build().await?;
        AsyncRateLimiter::new_with_storage(Box::new(storage))
    } else {
        let storage = AsyncRedisStorage::new(&args.redis).await?;
        AsyncRateLimiter::new_with_storage(Box::new(storage))
    };
    for limit in limits {
        limiter.add_limit(limit);
    }
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    tonic::transport::Server::builder()
        .add_service(Rls(Arc::new(limiter)))
        .serve_with_incoming(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
        )
        .await?;
    Ok(())
}

/// `ShouldRateLimit`, as limitador-server's `MyRateLimiter::should_rate_limit` answers it.
async fn should_rate_limit(
    limiter: &AsyncRateLimiter,
    req: RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    let answer = |code: Code| RateLimitResponse {
        overall_code: code.into(),
        statuses: vec![],
        response_headers_to_add: vec![],
        request_headers_to_add: vec![],
    };
    if req.domain.is_empty() {
        return Ok(answer(Code::Unknown));
    }
    let namespace: Namespace = req.domain.into();
    let values: Vec<HashMap<String, String>> = req
        .descriptors
        .iter()
        .map(|descriptor| {
            descriptor
                .entries
                .iter()
                .map(|entry| (entry.key.clone(), entry.value.clone()))
                .collect()
        })
        .collect();
    // "hits_addend" is optional and defaults to 1 (0 in the generated structs).
    let hits_addend = u64::from(req.hits_addend.max(1));
    let mut ctx = Context::default();
    ctx.list_binding("descriptors".to_string(), values);
    match limiter
        .check_rate_limited_and_update(&namespace, &ctx, hits_addend)
        .await
    {
        Ok(result) if result.limited => Ok(answer(Code::OverLimit)),
        Ok(_) => Ok(answer(Code::Ok)),
        Err(e) => {
            eprintln!("limitador-rls: {e:?}");
            Err(Status::unavailable("Service unavailable"))
        }
    }
}

#[derive(Clone)]
struct Rls(Arc<AsyncRateLimiter>);

impl NamedService for Rls {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

struct Method(Arc<AsyncRateLimiter>);

impl UnaryService<RateLimitRequest> for Method {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Result<tonic::Response<RateLimitResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let limiter = Arc::clone(&self.0);
        Box::pin(async move {
            should_rate_limit(&limiter, request.into_inner())
                .await
                .map(tonic::Response::new)
        })
    }
}

impl<B> tower::Service<http::Request<B>> for Rls
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let limiter = Arc::clone(&self.0);
        Box::pin(async move {
            if request.uri().path() == SHOULD_RATE_LIMIT {
                let codec = ProstCodec::<RateLimitResponse, RateLimitRequest>::default();
                Ok(Grpc::new(codec).unary(Method(limiter), request).await)
            } else {
                Ok(Status::unimplemented(request.uri().path().to_owned()).into_http())
            }
        })
    }
}
