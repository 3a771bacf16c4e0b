//! Production Redis: TLS and mutual TLS with certificates made here, AUTH and ACL users,
//! connecting that is bounded and says why it failed, lazy start, bring-your-own connections,
//! and the gateway demo's flags for all of these, run from outside.

use std::{
    net::TcpListener,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::servers::{
    tls::{Certs, TlsRedis},
    RedisServer,
};
use tower_redis_ratelimit::{
    redis, store::redis::ConnectErrorKind, store::ErrorScope, Error, Gcra, Quota, RateLimiter,
    RedisStore,
};

fn connect_kind(result: Result<RedisStore, Error>) -> (ConnectErrorKind, String) {
    match result {
        Err(Error::Connect(e)) => (e.kind(), crate::common::chain(&e)),
        Err(other) => panic!("expected a connect error, got {other:?}"),
        Ok(_) => panic!("connected, but should have failed"),
    }
}

fn limiter(store: RedisStore, limit: u32) -> RateLimiter<Gcra> {
    RateLimiter::builder(
        store,
        Gcra::new(Quota::new(limit, Duration::from_secs(3600))).unwrap(),
    )
    .prefix("prod")
    .build()
    .unwrap()
}

/// Several limiters, each with its own TLS connection, share one exact limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_limits_are_exact_across_instances() {
    let certs = Certs::make("test CA");
    let redis = TlsRedis::start(&certs, false, &[]);
    let mut limiters = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::builder()
            .ca_pem(Certs::read(&certs.ca))
            .connect(&redis.url())
            .await
            .expect("TLS connect with the test CA");
        limiters.push(Arc::new(limiter(store, 25)));
    }
    let mut tasks = Vec::new();
    for i in 0..60 {
        let limiter = Arc::clone(&limiters[i % 3]);
        tasks.push(tokio::spawn(
            async move { limiter.check("tls-key", 1).await },
        ));
    }
    let mut allowed = 0;
    for t in tasks {
        if t.await.unwrap().expect("check over TLS").allowed {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 25);
}

/// A certificate from a CA the client does not trust fails at connect, naming TLS; so does
/// TLS spoken to a plain-text port.
#[tokio::test]
async fn untrusted_or_missing_tls_fails_at_connect() {
    let certs = Certs::make("server CA");
    let other = Certs::make("some other CA");
    let redis = TlsRedis::start(&certs, false, &[]);

    let (kind, message) = connect_kind(
        RedisStore::builder()
            .ca_pem(Certs::read(&other.ca))
            .connect(&redis.url())
            .await,
    );
    assert_eq!(kind, ConnectErrorKind::Tls, "{message}");
    assert!(message.contains("certificate"), "{message}");

    // The system roots do not hold the test CA either.
    let (kind, message) = connect_kind(RedisStore::connect(&redis.url()).await);
    assert_eq!(kind, ConnectErrorKind::Tls, "{message}");

    // rediss:// to the plain-text port: Redis waits for the end of a command line that never
    // comes, and the timeout names the step.
    let plain = format!("rediss://127.0.0.1:{}", redis.server.port);
    let (kind, message) = connect_kind(
        RedisStore::builder()
            .connect_timeout(Duration::from_millis(300))
            .ca_pem(Certs::read(&certs.ca))
            .connect(&plain)
            .await,
    );
    assert_eq!(kind, ConnectErrorKind::TimedOut, "{message}");
    assert!(message.contains("TLS handshake"), "{message}");

    // A CA file that holds no certificate is a configuration error naming the option.
    match RedisStore::builder()
        .ca_pem(b"not a certificate".to_vec())
        .connect(&redis.url())
        .await
    {
        Err(Error::Config(e)) => assert_eq!(e.field(), "ca_pem"),
        other => panic!("{other:?}"),
    }
}

/// Plain text to a TLS port fails within the connect timeout instead of hanging.
#[tokio::test]
async fn plain_text_to_a_tls_port_fails_within_the_connect_timeout() {
    let certs = Certs::make("test CA");
    let redis = TlsRedis::start(&certs, false, &[]);
    let timeout = Duration::from_millis(500);
    let started = Instant::now();
    let result = RedisStore::builder()
        .connect_timeout(timeout)
        .connect(&format!("redis://127.0.0.1:{}", redis.tls_port))
        .await;
    let elapsed = started.elapsed();
    let (_, message) = connect_kind(result);
    assert!(message.contains("rediss://"), "{message}");
    assert!(elapsed < timeout + Duration::from_secs(1), "{elapsed:?}");
}

/// `--tls-auth-clients yes`: the client certificate opens the door; without it, connect fails.
#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let certs = Certs::make("test CA");
    let redis = TlsRedis::start(&certs, true, &[]);

    let store = RedisStore::builder()
        .ca_pem(Certs::read(&certs.ca))
        .client_cert_pem(
            Certs::read(&certs.client_cert),
            Certs::read(&certs.client_key),
        )
        .connect(&redis.url())
        .await
        .expect("mutual TLS with the client certificate");
    assert!(limiter(store, 1).check("m", 1).await.unwrap().allowed);

    let (kind, message) = connect_kind(
        RedisStore::builder()
            .ca_pem(Certs::read(&certs.ca))
            .connect(&redis.url())
            .await,
    );
    assert_eq!(kind, ConnectErrorKind::Tls, "{message}");

    // A key that does not match is a configuration error, found before connecting.
    match RedisStore::builder()
        .ca_pem(Certs::read(&certs.ca))
        .client_cert_pem(Certs::read(&certs.client_cert), b"no key here".to_vec())
        .connect(&redis.url())
        .await
    {
        Err(Error::Config(e)) => assert_eq!(e.field(), "client_key"),
        other => panic!("{other:?}"),
    }
}

/// `--requirepass` and an ACL user: the right credentials work; a missing or wrong password
/// fails at connect with a message that says so.
#[tokio::test]
async fn passwords_and_acl_users_are_checked_at_connect() {
    let redis = RedisServer::start_with(&[
        "--requirepass",
        "s3cret",
        "--user",
        "limiter",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
    ]);
    let port = redis.port;

    let store = RedisStore::connect(&format!("redis://:s3cret@127.0.0.1:{port}"))
        .await
        .expect("default user with the right password");
    assert!(limiter(store, 1).check("a", 1).await.unwrap().allowed);
    let store = RedisStore::connect(&format!("redis://limiter:pw@127.0.0.1:{port}"))
        .await
        .expect("ACL user with the right password");
    assert!(limiter(store, 1).check("b", 1).await.unwrap().allowed);

    let (kind, message) = connect_kind(RedisStore::connect(&redis.url()).await);
    assert_eq!(kind, ConnectErrorKind::AuthRequired, "{message}");
    assert!(message.contains("authentication required"), "{message}");

    for url in [
        format!("redis://:wrong@127.0.0.1:{port}"),
        format!("redis://limiter:wrong@127.0.0.1:{port}"),
        format!("redis://nobody:pw@127.0.0.1:{port}"),
    ] {
        let (kind, message) = connect_kind(RedisStore::connect(&url).await);
        assert_eq!(kind, ConnectErrorKind::AuthFailed, "{url}: {message}");
        assert!(
            !message.contains("wrong@"),
            "the message leaks the password: {message}"
        );
    }

    // A lazy store starts, then each check fails as the store being unavailable, saying why.
    let lazy = RedisStore::connect_lazy(&redis.url()).unwrap();
    let err = limiter(lazy, 1).check("c", 1).await.unwrap_err();
    assert_eq!(err.scope(), ErrorScope::Store, "{err}");
    let err = crate::common::chain(&err);
    assert!(err.contains("authentication required"), "{err}");
}

/// A listener that accepts and never answers: connect fails with `TimedOut` within the
/// timeout the user set.
#[tokio::test]
async fn a_silent_server_fails_within_the_connect_timeout() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let (kind, message) = connect_kind(
        RedisStore::builder()
            .connect_timeout(timeout)
            .connect(&url)
            .await,
    );
    let elapsed = started.elapsed();
    assert_eq!(kind, ConnectErrorKind::TimedOut, "{message}");
    assert!(elapsed >= timeout, "{elapsed:?}");
    assert!(elapsed < timeout + Duration::from_secs(1), "{elapsed:?}");

    let (kind, _) = connect_kind(RedisStore::connect(&crate::servers::dead_redis_url()).await);
    assert_eq!(kind, ConnectErrorKind::Unreachable);
    match RedisStore::builder()
        .connect_timeout(Duration::ZERO)
        .connect(&url)
        .await
    {
        Err(Error::Config(e)) => assert_eq!(e.field(), "connect_timeout"),
        other => panic!("{other:?}"),
    }
}

/// A lazy store starts without Redis, applies the failure policy, and serves once Redis is up.
#[tokio::test]
async fn a_lazy_store_connects_once_redis_answers() {
    let port = crate::servers::free_port();
    let store = RedisStore::builder()
        .lazy(true)
        .connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect("lazy start needs no Redis");
    let limiter = limiter(store, 2);
    let err = limiter.check("k", 1).await.unwrap_err();
    assert_eq!(err.scope(), ErrorScope::Store);
    let _redis = RedisServer::start_with_port(port);
    // The failed attempt is remembered briefly so a dead Redis is not dialled per request.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(limiter.check("k", 1).await.unwrap().allowed);
    }
    assert_eq!(seen, [true, true, false]);
}

/// Connections the application built: a redis-rs client, a `ConnectionManager`, a plain
/// multiplexed connection.
#[tokio::test]
async fn bring_your_own_connection() {
    let redis = RedisServer::start();
    let client = redis::Client::open(redis.url()).unwrap();

    let store = RedisStore::builder()
        .connect_client(client.clone())
        .await
        .unwrap();
    let a = limiter(store, 2);
    let manager = client.get_connection_manager().await.unwrap();
    let b = limiter(RedisStore::from_connection(manager), 2);
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let c = limiter(RedisStore::from_connection(conn), 2);
    // All three share one counter.
    let mut allowed = 0;
    for l in [&a, &b, &c, &a, &b, &c] {
        allowed += l.check("byo", 1).await.unwrap().allowed as u32;
    }
    assert_eq!(allowed, 2);
}
