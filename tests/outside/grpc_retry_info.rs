//! gRPC clients read the wait of a denial: `google.rpc.RetryInfo` in
//! `grpc-status-details-bin` and `grpc-retry-pushback-ms`, beside `retry-after`. The tonic
//! example runs as a process (`--listen`) and two clients call it: tonic with
//! `tonic_types::StatusExt`, and one written by hand on HTTP/2 frames that reads the protobuf
//! itself. A request that can never succeed is told not to retry.

#[allow(dead_code)]
#[path = "../../examples/tonic.rs"]
mod example;

use std::time::Duration;

use crate::common::limiter;
use crate::servers::{
    grpc::{self, RawGrpcClient, TonicExample},
    RedisServer,
};
use axum::body::Body;
use http::Request;
use tonic::{transport::Channel, Code};
use tonic_types::StatusExt as _;
use tower::{ServiceBuilder, ServiceExt as _};
use tower_redis_ratelimit::{Gcra, HeaderKey, Quota, RateLimitLayer};

const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The example's quota is 3 calls a minute (GCRA): a fourth call at once waits for the next
/// emission, at most 20 s away.
const EMISSION_INTERVAL: Duration = Duration::from_secs(20);

/// Whole milliseconds, rounded up.
fn ceil_ms(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap()
}

/// Whole seconds, rounded up.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A header's value as an integer.
fn int(headers: &http::HeaderMap, name: &str) -> i64 {
    let value = headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name}: {headers:?}"));
    value
        .to_str()
        .unwrap()
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {value:?}: {e}"))
}

/// The pushback and `retry-after` agree with the RetryInfo delay: the same wait in whole
/// milliseconds and whole seconds, rounded up.
fn assert_same_wait(delay: Duration, headers: &http::HeaderMap) {
    assert!(
        !delay.is_zero() && delay <= EMISSION_INTERVAL,
        "RetryInfo delay {delay:?} outside (0, {EMISSION_INTERVAL:?}]"
    );
    assert_eq!(
        int(headers, "grpc-retry-pushback-ms"),
        ceil_ms(delay) as i64,
        "pushback vs RetryInfo {delay:?}"
    );
    assert_eq!(
        int(headers, "retry-after"),
        ceil_secs(delay) as i64,
        "retry-after vs RetryInfo {delay:?}"
    );
}

#[tokio::test]
async fn tonic_client_reads_retry_info_from_the_example() {
    let server = TonicExample::start();
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();

    for _ in 0..3 {
        let res = example::say_hello(channel.clone(), "tonic-client", "tonic")
            .await
            .unwrap();
        assert_eq!(res.into_inner(), "hello, tonic");
    }
    let status = example::say_hello(channel, "tonic-client", "tonic")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let info = status
        .get_details_retry_info()
        .unwrap_or_else(|| panic!("no RetryInfo in {status:?}"));
    let delay = info.retry_delay.expect("a retry delay");
    assert_same_wait(delay, status.metadata().as_ref());
    stop_served_until_now(server).await;
}

/// The example served until it was stopped, stops on SIGTERM, and printed nothing on stdout
/// but its first line. (The wait runs off the test's runtime, which drives the clients'
/// connections as they close.)
async fn stop_served_until_now(mut server: TonicExample) {
    let (status, rest) = tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(rest.is_empty(), "stdout after the first line: {rest:?}");
}

/// `SayHello("h2")` with the API key `raw-client`.
async fn say_hello(client: &mut RawGrpcClient) -> grpc::RawResponse {
    client
        .unary(example::SAY_HELLO, &[("x-api-key", "raw-client")], b"h2")
        .await
}

#[tokio::test]
async fn hand_written_h2_client_reads_retry_info_from_the_example() {
    let server = TonicExample::start();
    let mut client = RawGrpcClient::connect(server.addr).await;
    for _ in 0..3 {
        let res = say_hello(&mut client).await;
        assert_eq!(res.status, 200);
        assert_eq!(res.grpc("grpc-status"), Some("0"), "{res:?}");
        assert_eq!(res.messages, [&b"hello, h2"[..]], "{res:?}");
    }
    let res = say_hello(&mut client).await;
    // Trailers-only: the status and its details are in the response headers, nothing follows.
    assert_eq!(res.status, 200);
    assert_eq!(res.headers["grpc-status"], "8", "{res:?}");
    assert!(res.messages.is_empty() && res.trailers.is_none(), "{res:?}");
    let message = res.headers["grpc-message"].to_str().unwrap();

    let details = grpc::binary_metadata(
        res.headers
            .get("grpc-status-details-bin")
            .unwrap_or_else(|| panic!("no grpc-status-details-bin: {res:?}"))
            .to_str()
            .unwrap(),
    );
    let status = grpc::decode_status(&details);
    assert_eq!(status.code, 8, "{status:?}");
    // The same text as grpc-message (plain ASCII, so its percent-encoding is itself).
    assert_eq!(status.message, message);
    assert_eq!(status.details.len(), 1, "{status:?}");
    let (type_url, retry_info) = &status.details[0];
    assert_eq!(type_url, RETRY_INFO_TYPE_URL);
    let delay = grpc::decode_retry_delay(retry_info);
    assert_same_wait(delay, &res.headers);
    stop_served_until_now(server).await;
}

/// Through the layer in process, on Redis: a denial's RetryInfo is the decision's wait, and a
/// request costing more than the whole quota is told not to retry (`-1`), with no details.
#[tokio::test]
async fn layer_writes_retry_info_and_never_retry_on_redis() {
    let redis = RedisServer::start();
    let l = limiter(
        redis.store().await,
        Gcra::new(Quota::per_minute(3)).unwrap(),
        "grpc-retry-info",
    );
    let cost = |parts: &http::request::Parts| -> u32 {
        parts
            .headers
            .get("x-cost")
            .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
    };
    let layer = RateLimitLayer::new(l, HeaderKey::new("x-api-key").unwrap()).cost(cost);
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(|_req: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("served")))
        }));
    let grpc_call = |key: &str, cost: u32| {
        Request::post("/demo.Greeter/SayHello")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("x-api-key", key)
            .header("x-cost", cost.to_string())
            .body(Body::empty())
            .unwrap()
    };

    // A cost over the quota (4 > 3) can never be allowed.
    let res = svc.clone().oneshot(grpc_call("never", 4)).await.unwrap();
    let h = res.headers();
    assert_eq!(h["grpc-status"], "8", "{h:?}");
    assert_eq!(h["grpc-retry-pushback-ms"], "-1", "{h:?}");
    assert!(!h.contains_key("grpc-status-details-bin"), "{h:?}");
    let status = tonic::Status::from_header_map(h).unwrap();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.get_details_retry_info().is_none(), "{status:?}");

    // Within the quota: the fourth call waits, and says so.
    for _ in 0..3 {
        let res = svc.clone().oneshot(grpc_call("waits", 1)).await.unwrap();
        assert!(!res.headers().contains_key("grpc-status"), "{res:?}");
    }
    let res = svc.clone().oneshot(grpc_call("waits", 1)).await.unwrap();
    let h = res.headers();
    let status = tonic::Status::from_header_map(h).unwrap();
    assert_eq!(status.code(), Code::ResourceExhausted, "{h:?}");
    let delay = status
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
        .unwrap_or_else(|| panic!("no RetryInfo: {h:?}"));
    assert_same_wait(delay, h);
}

/// The example's command line: anything but `--listen ADDR` is refused with a usage line on
/// stderr and a non-zero exit, before anything is printed on stdout.
#[test]
fn tonic_example_refuses_unknown_arguments() {
    for args in [
        &["--bogus"][..],
        &["--listen"],
        &["--listen", "not-an-address"],
    ] {
        let (success, stdout, stderr) = grpc::run_example("tonic", args);
        assert!(!success, "{args:?} accepted");
        assert!(
            stderr.contains("usage: tonic [--listen ADDR]"),
            "{args:?}: {stderr}"
        );
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }
}
