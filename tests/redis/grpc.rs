//! A real tonic client against a tonic server behind the limiter, over 127.0.0.1, keyed by
//! the `x-api-key` metadata: the client sees `Code::ResourceExhausted` with retry metadata.

#[allow(dead_code)]
#[path = "../../examples/tonic.rs"]
mod example;

use std::time::Duration;

use crate::common::limiter;
use crate::servers::RedisServer;
use tonic::{transport::Channel, Code};
use tower_redis_ratelimit::{Gcra, Quota};

#[tokio::test]
async fn over_quota_is_resource_exhausted_with_retry_metadata() {
    let redis = RedisServer::start();
    let l = limiter(
        redis.store().await,
        Gcra::new(Quota::per_minute(2)).unwrap(),
        "grpc",
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(example::serve(listener, l));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();

    for _ in 0..2 {
        let res = example::say_hello(channel.clone(), "key-a", "a")
            .await
            .unwrap();
        assert!(
            res.metadata().get("ratelimit").is_some(),
            "{:?}",
            res.metadata()
        );
        assert_eq!(res.into_inner(), "hello, a");
    }
    let status = example::say_hello(channel.clone(), "key-a", "a")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let retry: u64 = status
        .metadata()
        .get("retry-after")
        .expect("retry-after metadata")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry), "{retry}");
    let ratelimit = status
        .metadata()
        .get("ratelimit")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(ratelimit.starts_with("\"default\";r=0;t="), "{ratelimit}");

    // Another key has its own quota.
    let res = example::say_hello(channel, "key-b", "b").await.unwrap();
    assert_eq!(res.into_inner(), "hello, b");
    server.abort();
}

/// `PeerIp` keys a tonic call by the peer address tonic's server puts in the request
/// extensions (`TcpConnectInfo`): two clients on different loopback addresses get a quota each,
/// whatever metadata they send. Keyless calls pass unlimited here, so without that address
/// nothing would be limited at all.
#[cfg(feature = "tonic")]
#[tokio::test]
async fn peer_ip_keys_tonic_calls_by_the_client_address() {
    use std::net::IpAddr;

    use tonic::transport::{server::TcpIncoming, Server};
    use tower_redis_ratelimit::{extract::MissingKey, PeerIp, RateLimitLayer};

    let redis = RedisServer::start();
    let l = limiter(
        redis.store().await,
        Gcra::new(Quota::per_minute(2)).unwrap(),
        "grpc-peer",
    );
    let client_1: IpAddr = [127, 0, 0, 1].into();
    let client_2: IpAddr = [127, 0, 0, 2].into();
    let stored = [l.storage_key(client_1), l.storage_key(client_2)];
    let layer = RateLimitLayer::new(l, PeerIp).on_missing_key(MissingKey::Allow);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(example::Greeter)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let endpoint = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    let connect_from = |ip: IpAddr| endpoint.clone().local_address(Some(ip));
    let channel_1 = connect_from(client_1).connect().await.unwrap();
    let channel_2 = connect_from(client_2).connect().await.unwrap();

    // The same API key from both: PeerIp does not look at it.
    for remaining in [1, 0] {
        let res = example::say_hello(channel_1.clone(), "shared", "one")
            .await
            .unwrap();
        let ratelimit = res
            .metadata()
            .get("ratelimit")
            .expect("a keyed, limited call");
        let ratelimit = ratelimit.to_str().unwrap();
        assert!(
            ratelimit.starts_with(&format!("\"default\";r={remaining};t=")),
            "{ratelimit}"
        );
    }
    let status = example::say_hello(channel_1.clone(), "shared", "one")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.metadata().get("retry-after").is_some(), "{status:?}");

    // Another address: its own quota, untouched by the first client's.
    let res = example::say_hello(channel_2.clone(), "shared", "two")
        .await
        .unwrap();
    assert_eq!(res.into_inner(), "hello, two");
    let status = example::say_hello(channel_1, "shared", "one")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // One counter per address in Redis, under the IP (not a text key).
    let keys: Vec<String> = tower_redis_ratelimit::redis::cmd("KEYS")
        .arg("{grpc-peer:*")
        .query(&mut redis.conn())
        .unwrap();
    for base in &stored {
        assert!(
            keys.iter().any(|k| k.starts_with(base.as_str())),
            "{base}: {keys:?}"
        );
    }
    assert_eq!(keys.len(), 2, "{keys:?}");
    server.abort();
}
