//! A gRPC service behind the rate limiter, keyed by the `x-api-key` metadata. A client over its
//! quota gets `Code::ResourceExhausted`, with `retry-after` (and the `ratelimit` fields) in the
//! response metadata.
//!
//! ```text
//! cargo run --example tonic
//! ```
//!
//! The service and codec are hand-written (a UTF-8 string message instead of protobuf), so the
//! example needs no `protoc`; a tonic-build service plugs in the same way.

use std::{
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Buf, BufMut};
use tonic::{
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    server::{NamedService, UnaryService},
    transport::{server::TcpIncoming, Channel, Server},
    Status,
};
use tower_redis_ratelimit::{Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter};

/// A codec for UTF-8 string messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct Utf8Codec;

impl Codec for Utf8Codec {
    type Encode = String;
    type Decode = String;
    type Encoder = Utf8Codec;
    type Decoder = Utf8Codec;

    fn encoder(&mut self) -> Self::Encoder {
        Utf8Codec
    }

    fn decoder(&mut self) -> Self::Decoder {
        Utf8Codec
    }
}

impl Encoder for Utf8Codec {
    type Item = String;
    type Error = Status;

    fn encode(&mut self, item: String, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(item.as_bytes());
        Ok(())
    }
}

impl Decoder for Utf8Codec {
    type Item = String;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<String>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|_| Status::invalid_argument("not UTF-8"))
    }
}

/// `demo.Greeter/SayHello`: answers "hello, NAME".
#[derive(Debug, Clone, Copy, Default)]
pub struct Greeter;

/// The gRPC path of the one method.
pub const SAY_HELLO: &str = "/demo.Greeter/SayHello";

impl NamedService for Greeter {
    const NAME: &'static str = "demo.Greeter";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

struct SayHello;

impl UnaryService<String> for SayHello {
    type Response = String;
    type Future = BoxFuture<Result<tonic::Response<String>, Status>>;

    fn call(&mut self, request: tonic::Request<String>) -> Self::Future {
        let name = request.into_inner();
        Box::pin(async move { Ok(tonic::Response::new(format!("hello, {name}"))) })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Greeter {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            if req.uri().path() == SAY_HELLO {
                Ok(tonic::server::Grpc::new(Utf8Codec)
                    .unary(SayHello, req)
                    .await)
            } else {
                Ok(Status::unimplemented(req.uri().path().to_owned()).into_http())
            }
        })
    }
}

/// Serves the greeter on `listener`, limited per `x-api-key` by `limiter`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    limiter: RateLimiter<Gcra>,
) -> Result<(), tonic::transport::Error> {
    let key = HeaderKey::new("x-api-key").expect("a valid header name");
    Server::builder()
        .layer(RateLimitLayer::new(limiter, key))
        .add_service(Greeter)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await
}

/// Calls `SayHello` with `name` and `api_key`.
pub async fn say_hello(
    channel: Channel,
    api_key: &str,
    name: &str,
) -> Result<tonic::Response<String>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(name.to_owned());
    request
        .metadata_mut()
        .insert("x-api-key", api_key.parse().expect("ASCII key"));
    grpc.unary(
        request,
        http::uri::PathAndQuery::from_static(SAY_HELLO),
        Utf8Codec,
    )
    .await
}

#[tokio::main]
#[allow(dead_code)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 3 calls per minute per API key.
    let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(3))?)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    println!("listening on http://{addr}");
    tokio::spawn(serve(listener, limiter));

    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    for i in 1..=4 {
        match say_hello(channel.clone(), "demo-key", "gRPC").await {
            Ok(res) => println!("call {i}: {}", res.into_inner()),
            Err(status) => println!(
                "call {i}: {:?} ({}), retry-after: {:?}",
                status.code(),
                status.message(),
                status.metadata().get("retry-after")
            ),
        }
    }
    Ok(())
}
