//! A real tonic client against a tonic server behind the limiter, over 127.0.0.1, keyed by
//! the `x-api-key` metadata: the client sees `Code::ResourceExhausted` with retry metadata.

mod common;
#[allow(dead_code)]
#[path = "../examples/tonic.rs"]
mod example;

use std::time::Duration;

use common::{limiter, RedisServer};
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
