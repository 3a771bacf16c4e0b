//! [`RlsService`] over gRPC: a tower service answering `ShouldRateLimit`.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use tonic::{
    server::{Grpc, NamedService, UnaryService},
    Status,
};
use tonic_prost::ProstCodec;

use super::{
    proto::{RateLimitRequest, RateLimitResponse},
    RlsService,
};

/// The gRPC path of `ShouldRateLimit`.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// [`RlsService`] as a gRPC service (`envoy.service.ratelimit.v3.RateLimitService`), for any
/// tonic server (`Server::builder().add_service(RlsGrpc::new(service))`) or any HTTP/2
/// server that takes a tower service. Other paths are answered `UNIMPLEMENTED`.
///
/// ```no_run
/// # async fn run(service: tower_redis_ratelimit::rate_limit::rls::RlsService) -> Result<(), Box<dyn std::error::Error>> {
/// use tower_redis_ratelimit::rate_limit::rls::RlsGrpc;
///
/// tonic::transport::Server::builder()
///     .add_service(RlsGrpc::new(service))
///     .serve("127.0.0.1:8081".parse()?)
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RlsGrpc {
    service: RlsService,
}

impl RlsGrpc {
    /// The gRPC face of `service`.
    pub fn new(service: RlsService) -> Self {
        Self { service }
    }
}

impl NamedService for RlsGrpc {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

struct Method(RlsService);

impl UnaryService<RateLimitRequest> for Method {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Result<tonic::Response<RateLimitResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            service
                .should_rate_limit(request.get_ref())
                .await
                .map(tonic::Response::new)
        })
    }
}

impl<B> tower_service::Service<http::Request<B>> for RlsGrpc
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let service = self.service.clone();
        Box::pin(async move {
            if request.uri().path() == SHOULD_RATE_LIMIT {
                let codec = ProstCodec::<RateLimitResponse, RateLimitRequest>::default();
                Ok(Grpc::new(codec).unary(Method(service), request).await)
            } else {
                Ok(Status::unimplemented(request.uri().path().to_owned()).into_http())
            }
        })
    }
}
