//! A gRPC service behind the rate limiter, keyed by the `x-api-key` metadata: 3 calls a
//! minute per key (GCRA, in memory). A client over its quota gets `Code::ResourceExhausted`
//! with the wait in three forms: `google.rpc.RetryInfo` in `grpc-status-details-bin` (read
//! it with `tonic_types::StatusExt::get_details_retry_info`), `grpc-retry-pushback-ms` (read
//! by gRPC retry policies) and `retry-after` in seconds, besides the `ratelimit` fields.
//!
//! ```text
//! cargo run --example tonic
//! cargo run --example tonic -- --listen 127.0.0.1:50051
//! ```
//!
//! Without arguments it starts the server on a free port, makes four calls with one key and
//! prints what each got. With `--listen ADDR` it serves `/demo.Greeter/SayHello` on ADDR
//! until it is stopped (ctrl-c, SIGTERM: calls still open then get 5 s to finish), so that
//! any gRPC client can call it: it prints `listening on http://ADDR` on stdout first (the
//! bound address: port 0 gives the real one), and logs on stderr. Any other argument: a
//! usage line on stderr, exit status 2.
//!
//! The service and codec are hand-written: a message is its UTF-8 text as the raw bytes of
//! the gRPC frame (not protobuf), so the example needs no `protoc`; a tonic-build service
//! plugs in the same way. `SayHello` answers `NAME` with `hello, NAME`.

use std::{
    convert::Infallible,
    error::Error,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    process::ExitCode,
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
    serve_until(listener, limiter, std::future::pending()).await
}

/// [`serve`] until `stop` completes; calls in flight are finished first.
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    limiter: RateLimiter<Gcra>,
    stop: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let key = HeaderKey::new("x-api-key").expect("a valid header name");
    Server::builder()
        .layer(RateLimitLayer::new(limiter, key))
        .add_service(Greeter)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), stop)
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

const USAGE: &str = "usage: tonic [--listen ADDR]";

/// What the command line asks for.
enum Mode {
    /// Four calls against a server on a free port, then exit.
    Demo,
    /// Serve on this address until stopped.
    Listen(SocketAddr),
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Mode, String> {
    let mut mode = Mode::Demo;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => {
                let addr = args.next().ok_or("--listen needs an address")?;
                let addr = addr
                    .parse()
                    .map_err(|e| format!("--listen {addr:?}: {e}"))?;
                mode = Mode::Listen(addr);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(mode)
}

/// 3 calls per minute per API key.
fn limiter() -> Result<RateLimiter<Gcra>, Box<dyn Error>> {
    Ok(RateLimiter::new(
        MemoryStore::new(),
        Gcra::new(Quota::per_minute(3))?,
    )?)
}

/// Starts the server on a free port and makes four calls with one key: three are served, the
/// fourth is over the quota.
async fn demo() -> Result<(), Box<dyn Error>> {
    let limiter = limiter()?;
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

/// How long calls and connections still open when the server is stopped get to finish.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Serves on `addr` until ctrl-c or SIGTERM, then lets open calls finish for at most
/// [`STOP_GRACE`] (a client that never closes its connection cannot hold the stop).
async fn listen(addr: SocketAddr) -> Result<(), Box<dyn Error>> {
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let limiter = limiter()?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    tracing::info!("serving {SAY_HELLO}, 3 calls a minute per x-api-key");
    let (stop, stopping) = tokio::sync::oneshot::channel();
    let server = serve_until(listener, limiter, async {
        stopped().await;
        let _ = stop.send(());
    });
    let grace_over = async {
        let _ = stopping.await;
        tokio::time::sleep(STOP_GRACE).await;
    };
    tokio::select! {
        served = server => served?,
        () = grace_over => tracing::warn!(
            "connections still open {} s after the stop: closed",
            STOP_GRACE.as_secs()
        ),
    }
    tracing::info!("stopped");
    Ok(())
}

/// Completes on ctrl-c or, on Unix, SIGTERM.
async fn stopped() {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("ctrl-c: stopping"),
        () = terminate => tracing::info!("SIGTERM: stopping"),
    }
}

#[tokio::main]
#[allow(dead_code)]
async fn main() -> ExitCode {
    let mode = match parse_args(std::env::args().skip(1)) {
        Ok(mode) => mode,
        Err(e) => {
            eprintln!("error: {e}");
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match mode {
        Mode::Demo => demo().await,
        Mode::Listen(addr) => listen(addr).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
