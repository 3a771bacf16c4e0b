//! Errors with which a live Redis refuses *every* key (`OOM`, `READONLY`, `NOAUTH`, `BUSY`,
//! `LOADING`) are the store being unavailable, not a problem of one key: under each failure
//! policy a request gets what that policy promises for an unavailable store (`Open`: through,
//! `Closed`: 503, `Local`: decided in-process at the local share), and the circuit breaker
//! opens on them. Each refusal is provoked on a real `redis-server`.

use std::{
    sync::{atomic::AtomicUsize, Arc},
    thread::JoinHandle,
    time::Duration,
};

use crate::common::counting;
use crate::servers::RedisServer;
use axum::body::Body;
use http::Request;
use tower::{ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    redis, store::CircuitBreaker, FailurePolicy, Gcra, HeaderKey, Quota, RateLimitLayer,
    RateLimiter, RedisStore,
};

#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// `maxmemory` reached with `noeviction`.
    Oom,
    /// A primary demoted to a replica (what a failover leaves behind).
    ReadOnly,
    /// A password required and the connection not authenticated.
    NoAuth,
    /// Another client's script runs past `busy-reply-threshold` (`lua-time-limit`).
    Busy,
    /// The dataset is being (re)loaded.
    Loading,
}

/// What must be undone, or kept alive, while the refusal lasts.
#[derive(Default)]
struct Provoked {
    /// The primary a demoted server replicates from.
    primary: Option<RedisServer>,
    /// The client thread running a blocking command (`BUSY`, `LOADING`).
    blocked: Option<JoinHandle<()>>,
}

fn config_set(conn: &mut redis::Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(conn)
        .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}"));
}

/// Runs `cmd` on a connection of its own in a thread (it blocks the server).
fn in_background(redis: &RedisServer, cmd: redis::Cmd) -> JoinHandle<()> {
    let mut conn = redis.conn();
    let handle = std::thread::spawn(move || {
        let _ = cmd.query::<redis::Value>(&mut conn);
    });
    // Let it reach the server and start blocking.
    std::thread::sleep(Duration::from_millis(300));
    handle
}

fn provoke(redis: &RedisServer, refusal: Refusal) -> Provoked {
    let mut conn = redis.conn();
    let mut provoked = Provoked::default();
    match refusal {
        Refusal::Oom => {
            config_set(&mut conn, "maxmemory-policy", "noeviction");
            config_set(&mut conn, "maxmemory", "1");
        }
        Refusal::ReadOnly => {
            let primary = RedisServer::start();
            let _: () = redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(primary.port)
                .query(&mut conn)
                .unwrap();
            provoked.primary = Some(primary);
        }
        Refusal::NoAuth => {
            config_set(&mut conn, "requirepass", "s3cret");
            // Redis before 6.0 takes this connection's authentication away with it.
            let _: () = redis::cmd("AUTH").arg("s3cret").query(&mut conn).unwrap();
            // Connections authenticated before stay so: drop them, so that the store's next
            // connection is made without the password.
            let _: redis::Value = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("normal")
                .query(&mut conn)
                .unwrap();
        }
        Refusal::Busy => {
            // `busy-reply-threshold` since Redis 7.0, which keeps this name for it.
            config_set(&mut conn, "lua-time-limit", "50");
            let mut spin = redis::cmd("EVAL");
            spin.arg("local i = 0 while true do i = i + 1 end").arg(0);
            provoked.blocked = Some(in_background(redis, spin));
        }
        Refusal::Loading => {
            let _: () = redis::cmd("DEBUG")
                .arg("POPULATE")
                .arg(20_000)
                .query(&mut conn)
                .unwrap();
            // 1 ms per key while loading (20 s), answering other clients between keys.
            config_set(&mut conn, "key-load-delay", "1000");
            config_set(&mut conn, "loading-process-events-interval-bytes", "1024");
            let mut reload = redis::cmd("DEBUG");
            reload.arg("RELOAD");
            provoked.blocked = Some(in_background(redis, reload));
        }
    }
    provoked
}

/// Ends a refusal that would otherwise outlive the test's server (`BUSY`).
fn release(redis: &RedisServer, refusal: Refusal, provoked: Provoked) {
    if let Refusal::Busy = refusal {
        let _: redis::RedisResult<()> = redis::cmd("SCRIPT").arg("KILL").query(&mut redis.conn());
    }
    // LOADING: the server is stopped by PID when the test ends; the thread then returns.
    if let (Refusal::Busy, Some(t)) = (refusal, provoked.blocked) {
        t.join().unwrap();
    }
}

fn limiter(store: RedisStore, name: &str, policy: FailurePolicy) -> RateLimiter<Gcra> {
    // 4 an hour; 2 per instance under `Local` with a share of 2.
    RateLimiter::builder(store, Gcra::new(Quota::per_hour(4)).unwrap())
        .policy_name(name)
        .store_timeout(Duration::from_millis(500))
        .circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(60)))
        .on_store_error(policy)
        .local_share(2)
        .build()
        .unwrap()
}

/// Sends one request with `x-key: key`; returns the status and whether it had rate-limit
/// headers.
async fn send<S>(svc: &S, key: &str) -> (u16, bool)
where
    S: tower::Service<
            Request<Body>,
            Response = http::Response<tower_redis_ratelimit::rate_limit::ResponseBody<Body>>,
            Error = std::convert::Infallible,
        > + Clone,
{
    let req = Request::get("/").header("x-key", key).body(Body::empty());
    let res = svc.clone().oneshot(req.unwrap()).await.unwrap();
    (
        res.status().as_u16(),
        res.headers().contains_key("ratelimit"),
    )
}

async fn follows_each_policy(refusal: Refusal) {
    let redis = RedisServer::start();
    let store = redis.store().await;
    let policies = [
        FailurePolicy::Open,
        FailurePolicy::Closed,
        FailurePolicy::Local,
    ];
    let mut limiters = Vec::new();
    let mut services = Vec::new();
    for (i, policy) in policies.into_iter().enumerate() {
        let l = limiter(store.clone(), &format!("p{i}"), policy);
        limiters.push(l.clone());
        let layer = RateLimitLayer::new(l, HeaderKey::new("x-key").unwrap());
        services.push(
            ServiceBuilder::new()
                .layer(layer)
                .service(counting(Arc::new(AtomicUsize::new(0)))),
        );
    }
    // Healthy first: scripts loaded, each policy limits from Redis.
    for svc in &services {
        assert_eq!(send(svc, "warm-up").await, (200, true), "{refusal:?}");
    }

    let provoked = provoke(&redis, refusal);
    let [open, closed, local] = &services[..] else {
        unreachable!()
    };
    // Open: through, without headers (nothing was decided).
    assert_eq!(send(open, "fresh").await, (200, false), "{refusal:?}, open");
    // Closed: 503.
    assert_eq!(send(closed, "fresh").await.0, 503, "{refusal:?}, closed");
    // Local: decided in this process at the share (2 of 4), with headers.
    let local_statuses = [
        send(local, "fresh").await,
        send(local, "fresh").await,
        send(local, "fresh").await,
    ];
    assert_eq!(
        local_statuses,
        [(200, true), (200, true), (429, true)],
        "{refusal:?}, local"
    );
    assert_eq!(limiters[2].stats().degraded, 3, "{refusal:?}");
    // The breaker counts these failures and opens after 3 in a row.
    for _ in 0..3 {
        send(open, "more").await;
        send(closed, "more").await;
    }
    for (l, policy) in limiters.iter().zip(policies) {
        let stats = l.stats();
        assert!(
            stats.breaker_opened >= 1,
            "{refusal:?}, {policy:?}: breaker never opened: {stats:?}"
        );
    }
    release(&redis, refusal, provoked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory() {
    follows_each_policy(Refusal::Oom).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demoted_to_read_only_replica() {
    follows_each_policy(Refusal::ReadOnly).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_required() {
    follows_each_policy(Refusal::NoAuth).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_running_a_script() {
    follows_each_policy(Refusal::Busy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_the_dataset() {
    follows_each_policy(Refusal::Loading).await;
}
