//! The contenders: every one is a [`CheckFn`] deciding one request for one key, built on the
//! same quota (100 per second, burst 100) and, for the layers, the same trivial inner service.

use std::{
    convert::Infallible,
    fmt::Debug,
    future::{ready, Ready},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, LazyLock,
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tower::{Service, ServiceExt};
use tower_redis_ratelimit::{
    algorithm::Algorithm, rate_limit::HeaderStyle, redis, redis::Script, store::redis::bb8,
    store::redis::bb8_redis::RedisConnectionManager, store::Store, FailurePolicy, Gcra, HeaderKey,
    MemoryStore, Quota, RateLimitLayer, RateLimiter, RedisStore, SlidingWindow, TokenBucket,
};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// One check: is this request for this key allowed?
pub type CheckFn = Arc<dyn Fn(String) -> BoxFuture<'static, bool> + Send + Sync>;

/// The quota of every contender: 100 per second per key, burst 100.
pub const PER_SECOND: u32 = 100;
/// Every layer takes its key from this request header.
pub const KEY_HEADER: &str = "k";
/// Store timeout of our limiters and of tower-rate-limit-redis: generous, so that a stall of
/// this shared machine shows as latency, not as errors.
const TIMEOUT: Duration = Duration::from_secs(5);
/// bb8 pool size (ours and the raw script through bb8 share one pool).
const POOL_SIZE: u32 = 8;

pub struct Contender {
    pub name: String,
    /// Counts Redis commands per check (`INFO commandstats`); in-memory contenders do not.
    pub uses_redis: bool,
    /// The contender this one's checks/s are divided by in the table ("vs baseline").
    pub baseline: Option<String>,
    /// Layers only: how many times the inner service was called.
    pub inner_calls: Option<Arc<AtomicU64>>,
    pub check: CheckFn,
}

/// Collects the contenders, each with its own key prefix, keeping those the filter selects.
pub struct Contenders {
    list: Vec<Contender>,
    filter: Vec<String>,
    prefixes: usize,
}

impl Contenders {
    /// `filter`: keep contenders whose name contains any of these (case-insensitive); empty
    /// keeps all.
    pub fn new(filter: Vec<String>) -> Self {
        Self {
            list: Vec::new(),
            filter: filter.into_iter().map(|f| f.to_lowercase()).collect(),
            prefixes: 0,
        }
    }

    pub fn into_vec(self) -> Vec<Contender> {
        self.list
    }

    fn prefix(&mut self) -> String {
        self.prefixes += 1;
        format!("c{}", self.prefixes)
    }

    fn push(
        &mut self,
        name: String,
        uses_redis: bool,
        baseline: Option<String>,
        inner_calls: Option<Arc<AtomicU64>>,
        check: CheckFn,
    ) {
        let lower = name.to_lowercase();
        if self.filter.is_empty() || self.filter.iter().any(|f| lower.contains(f.as_str())) {
            self.list.push(Contender {
                name,
                uses_redis,
                baseline,
                inner_calls,
                check,
            });
        }
    }
}

fn quota() -> Quota {
    Quota::per_second(PER_SECOND)
}

/// Our algorithms, all on the same quota.
#[derive(Clone, Copy)]
pub enum Alg {
    Gcra,
    TokenBucket,
    SlidingWindow,
}

pub const ALL_ALGS: [Alg; 3] = [Alg::Gcra, Alg::TokenBucket, Alg::SlidingWindow];

/// How the raw-script ceiling reaches Redis: the same connection kind as the store it bounds.
#[derive(Clone)]
pub enum RawConn {
    Multiplexed(redis::aio::ConnectionManager),
    Pool(bb8::Pool<RedisConnectionManager>),
}

/// A multiplexed connection like `RedisStore::connect`'s (a redis-rs `ConnectionManager`).
pub async fn multiplexed(url: &str) -> RawConn {
    let client = redis::Client::open(url).expect("redis url");
    RawConn::Multiplexed(
        redis::aio::ConnectionManager::new(client)
            .await
            .expect("cannot connect to the benchmark redis"),
    )
}

/// A bb8-redis pool without bb8's check-out `PING`.
pub async fn pool(url: &str) -> bb8::Pool<RedisConnectionManager> {
    bb8::Pool::builder()
        .max_size(POOL_SIZE)
        .test_on_check_out(false)
        .build(RedisConnectionManager::new(url).expect("redis url"))
        .await
        .expect("cannot build the bb8 pool")
}

/// Ours on Redis, for each algorithm of `algs`: the raw script through `raw` (the ceiling;
/// not run if `None`), then `RateLimiter::check` and the full layer, each with the deny cache
/// on (the default) and off. `conn` names the connection kind in the contender names; every
/// row's baseline is the raw script row of connection kind `raw_conn` (run here or earlier).
pub fn ours_redis(
    c: &mut Contenders,
    conn: &str,
    store: &RedisStore,
    raw: Option<&RawConn>,
    raw_conn: &str,
    algs: &[Alg],
) {
    for alg in algs {
        match alg {
            Alg::Gcra => ours_redis_alg(c, conn, store, raw, raw_conn, "gcra", || {
                Gcra::new(quota()).unwrap()
            }),
            Alg::TokenBucket => {
                ours_redis_alg(c, conn, store, raw, raw_conn, "token-bucket", || {
                    TokenBucket::new(quota()).unwrap()
                })
            }
            Alg::SlidingWindow => {
                ours_redis_alg(c, conn, store, raw, raw_conn, "sliding-window", || {
                    SlidingWindow::new(quota()).unwrap()
                })
            }
        }
    }
}

fn ours_redis_alg<A: Algorithm>(
    c: &mut Contenders,
    conn: &str,
    store: &RedisStore,
    raw: Option<&RawConn>,
    raw_conn: &str,
    alg: &str,
    make: impl Fn() -> A,
) {
    let raw_name = format!("raw {alg} script ({raw_conn})");
    let baseline = Some(raw_name.clone());
    if let Some(raw) = raw {
        let prefix = c.prefix();
        c.push(
            raw_name,
            true,
            None,
            None,
            raw_script(raw.clone(), make(), prefix),
        );
    }
    for deny_cache in [true, false] {
        let variant = if deny_cache {
            format!("({conn})")
        } else {
            format!("({conn}, deny cache off)")
        };
        let prefix = c.prefix();
        let check = via_check(limiter(store.clone(), make(), prefix, deny_cache));
        c.push(
            format!("ours {alg} check {variant}"),
            true,
            baseline.clone(),
            None,
            check,
        );
        let prefix = c.prefix();
        let (check, calls) = ours_layer(limiter(store.clone(), make(), prefix, deny_cache));
        c.push(
            format!("ours {alg} layer {variant}"),
            true,
            baseline.clone(),
            Some(calls),
            check,
        );
    }
}

/// Ours on `MemoryStore` (GCRA), check and layer, deny cache on and off; checks against
/// `check_baseline` (governor's `check_key`), layers against `layer_baseline` (tower_governor).
pub fn ours_memory(c: &mut Contenders, check_baseline: &str, layer_baseline: &str) {
    for deny_cache in [true, false] {
        let variant = if deny_cache { "" } else { " (deny cache off)" };
        let prefix = c.prefix();
        let check = via_check(limiter(
            MemoryStore::new(),
            Gcra::new(quota()).unwrap(),
            prefix,
            deny_cache,
        ));
        c.push(
            format!("ours memory gcra check{variant}"),
            false,
            Some(check_baseline.to_owned()),
            None,
            check,
        );
        let prefix = c.prefix();
        let (check, calls) = ours_layer(limiter(
            MemoryStore::new(),
            Gcra::new(quota()).unwrap(),
            prefix,
            deny_cache,
        ));
        c.push(
            format!("ours memory gcra layer{variant}"),
            false,
            Some(layer_baseline.to_owned()),
            Some(calls),
            check,
        );
    }
    // The cost of the headers: the same layer writing none (tower_governor's default writes
    // none on allowed responses), and writing them on denials only, as tower_governor does.
    type Settings = fn(RateLimitLayer<HeaderKey, Gcra>) -> RateLimitLayer<HeaderKey, Gcra>;
    let variants: [(&str, Settings); 2] = [
        ("headers off", |layer| layer.headers(HeaderStyle::None)),
        ("fields on denials only", |layer| {
            layer.headers_on_denials_only()
        }),
    ];
    for (variant, settings) in variants {
        let prefix = c.prefix();
        let limiter = limiter(
            MemoryStore::new(),
            Gcra::new(quota()).unwrap(),
            prefix,
            true,
        );
        let (check, calls) = ours_layer_with(limiter, settings);
        c.push(
            format!("ours memory gcra layer ({variant})"),
            false,
            Some(layer_baseline.to_owned()),
            Some(calls),
            check,
        );
    }
}

fn limiter<A: Algorithm>(
    store: impl Store,
    algorithm: A,
    prefix: String,
    deny_cache: bool,
) -> RateLimiter<A> {
    // Failing closed, so that a store error cannot pass as "allowed" (the layer answers 503
    // and `check` an error, which stops the benchmark).
    let builder = RateLimiter::builder(store, algorithm)
        .prefix(prefix)
        .store_timeout(TIMEOUT)
        .on_store_error(FailurePolicy::Closed);
    let builder = if deny_cache {
        builder // the default
    } else {
        builder.deny_cache(0)
    };
    builder.build().expect("limiter config")
}

/// `RateLimiter::check(key, 1)`.
fn via_check<A: Algorithm>(limiter: RateLimiter<A>) -> CheckFn {
    Arc::new(move |key: String| {
        let limiter = limiter.clone();
        Box::pin(async move { limiter.check(&key, 1).await.expect("check failed").allowed })
    })
}

/// Our full layer with its defaults (IETF `RateLimit` headers on every response), keyed by
/// the request header like the peers.
fn ours_layer<A: Algorithm>(limiter: RateLimiter<A>) -> (CheckFn, Arc<AtomicU64>) {
    ours_layer_with(limiter, |layer| layer)
}

/// [`ours_layer`], the layer given `settings` first.
fn ours_layer_with<A: Algorithm>(
    limiter: RateLimiter<A>,
    settings: impl FnOnce(RateLimitLayer<HeaderKey, A>) -> RateLimitLayer<HeaderKey, A>,
) -> (CheckFn, Arc<AtomicU64>) {
    let (inner, calls) = Inner::new();
    let layer = settings(RateLimitLayer::new(
        limiter,
        HeaderKey::new(KEY_HEADER).unwrap(),
    ));
    (
        via_service(tower::ServiceBuilder::new().layer(layer).service(inner)),
        calls,
    )
}

/// The script our store runs for a check of one unit under `algorithm` on [`quota`] (from the crate's
/// `lua/`), the suffixes of its keys, and its arguments: GCRA's check takes the step, the
/// tolerance and a rested key's lifetime (no time: the script reads Redis' TIME); the others
/// `''` (no explicit time), the cost and two parameters.
fn raw_wire(algorithm: &dyn Algorithm) -> (&'static Script, &'static [&'static str], Vec<String>) {
    static GCRA: LazyLock<Script> =
        LazyLock::new(|| Script::new(include_str!("../../lua/gcra.lua")));
    static BUCKET: LazyLock<Script> = LazyLock::new(|| {
        Script::new(concat!(
            include_str!("../../lua/prelude.lua"),
            include_str!("../../lua/token_bucket.lua")
        ))
    });
    static WINDOW: LazyLock<Script> = LazyLock::new(|| {
        Script::new(concat!(
            include_str!("../../lua/prelude.lua"),
            include_str!("../../lua/sliding_window.lua")
        ))
    });
    let args = |a: &[u64]| a.iter().map(u64::to_string).collect();
    // The parameters as the crate validates the quota: the emission interval is the period
    // over the limit, rounded up; the tolerance, the emission interval times the burst.
    let q = quota();
    let period_us = q.period().as_micros() as u64;
    let (limit, burst) = (u64::from(q.limit()), u64::from(q.burst_size()));
    let emission = period_us.div_ceil(limit);
    match algorithm.name() {
        "gcra" => {
            let wire = args(&[emission, emission * burst, emission.div_ceil(1_000)]);
            (&GCRA, &[":g"], wire)
        }
        "token-bucket" => {
            let mut wire = vec![String::new()];
            wire.extend(args(&[1, emission, burst]));
            (&BUCKET, &[":b"], wire)
        }
        "sliding-window" => {
            let mut wire = vec![String::new()];
            wire.extend(args(&[1, period_us, limit]));
            (&WINDOW, &[":l2", ":m2"], wire)
        }
        other => panic!("no raw script for {other}"),
    }
}

/// The same script as our store runs, invoked directly through redis-rs (`EVALSHA`, loading
/// it on `NOSCRIPT`) with no limiter around it: the ceiling for that connection kind.
fn raw_script<A: Algorithm>(conn: RawConn, algorithm: A, prefix: String) -> CheckFn {
    let (script, suffixes, args) = raw_wire(&algorithm);
    let args: Arc<[String]> = args.into();
    let prefix: Arc<str> = prefix.into();
    Arc::new(move |key: String| {
        let (conn, prefix, args) = (conn.clone(), prefix.clone(), args.clone());
        Box::pin(async move {
            let mut invocation = script.prepare_invoke();
            for suffix in suffixes {
                invocation.key(format!("{{{prefix}:{key}}}{suffix}"));
            }
            for a in args.iter() {
                invocation.arg(a.as_str());
            }
            let reply: redis::Value = match conn {
                RawConn::Multiplexed(mut conn) => invocation.invoke_async(&mut conn).await,
                RawConn::Pool(pool) => {
                    // As `RedisStore::from_pool` does: a multiplexed connection is a cheap
                    // handle, so clone it and give the pooled one back at once (holding it
                    // for the round trip would queue 64 tasks on 8 connections).
                    let mut conn = pool.get().await.expect("bb8 check-out failed").clone();
                    invocation.invoke_async(&mut conn).await
                }
            }
            .expect("script failed");
            // GCRA's check admits with a string (`TAT SECS USECS`) and denies with an integer;
            // the others answer {allowed, ...}.
            match reply {
                redis::Value::BulkString(_) => true,
                redis::Value::Array(items) => matches!(items.first(), Some(redis::Value::Int(1))),
                _ => false,
            }
        })
    })
}

/// tower-rate-limit-redis: its layer on a redis 0.32 `MultiplexedConnection` (the only
/// connection it takes; it does not reconnect), GCRA with capacity 100 and an emission
/// interval of 10 ms (= 100 per second, burst 100), our store timeout, and its default
/// `fail_open(false)` (an error is a 500, which stops the benchmark).
pub async fn tower_rate_limit_redis(c: &mut Contenders, url: &str, baseline: Option<String>) {
    #[derive(Clone)]
    struct FromHeader;
    impl tower_rate_limit_redis::KeyResolver for FromHeader {
        type Key = String;
        type ErrorBody = Body;
        fn key<T>(&self, req: &Request<T>) -> Result<String, Response<Body>> {
            // Namespaced like ours (`{prefix:key}`), so its keys cannot meet another's.
            req.headers()
                .get(KEY_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(|k| format!("trlr:{k}"))
                .ok_or_else(|| {
                    let mut res = Response::new(Body::empty());
                    *res.status_mut() = StatusCode::BAD_REQUEST;
                    res
                })
        }
    }
    let conn = redis_peer::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("cannot connect to the benchmark redis");
    let layer = tower_rate_limit_redis::RateLimitLayer::builder()
        .conn(conn)
        .key_resolver(FromHeader)
        .capacity(PER_SECOND as u16)
        .emission_interval(Duration::from_secs(1) / PER_SECOND)
        .timeout(TIMEOUT)
        .build();
    let (inner, calls) = Inner::new();
    c.push(
        "tower-rate-limit-redis layer".to_owned(),
        true,
        baseline,
        Some(calls),
        via_service(tower::ServiceBuilder::new().layer(layer).service(inner)),
    );
}

/// tower_governor: its layer, in memory (governor's keyed GCRA on a DashMap), one cell every
/// 10 ms with a burst of 100 (= 100 per second, burst 100), keyed by the same header through a
/// custom key extractor; its default middleware (no `x-ratelimit-*` headers on allowed
/// responses, `retry-after` on 429s).
pub fn tower_governor(c: &mut Contenders, name: &str) {
    use tower_governor::{governor::GovernorConfigBuilder, GovernorLayer};
    let config = GovernorConfigBuilder::default()
        .period(Duration::from_secs(1) / PER_SECOND)
        .burst_size(PER_SECOND)
        .key_extractor(StringKey)
        .finish()
        .expect("governor config");
    let (inner, calls) = Inner::new();
    c.push(
        name.to_owned(),
        false,
        None,
        Some(calls),
        via_service(
            tower::ServiceBuilder::new()
                .layer(GovernorLayer::new(config))
                .service(inner),
        ),
    );
}

/// tower_governor's limiter alone (governor's keyed `check_key`, no layer, no response):
/// the in-memory counterpart of `RateLimiter::check`, configured as in [`tower_governor`].
pub fn governor_check_key(c: &mut Contenders, name: &str) {
    use tower_governor::governor::GovernorConfigBuilder;
    // The same keyed limiter the layer builds, keyed by the header value (a `String`).
    let limiter = GovernorConfigBuilder::default()
        .period(Duration::from_secs(1) / PER_SECOND)
        .burst_size(PER_SECOND)
        .key_extractor(StringKey)
        .finish()
        .expect("governor config")
        .limiter()
        .clone();
    c.push(
        name.to_owned(),
        false,
        None,
        None,
        Arc::new(move |key: String| {
            let allowed = limiter.check_key(&key).is_ok();
            Box::pin(ready(allowed))
        }),
    );
}

/// tower_governor's key extractor for our header (also keys [`governor_check_key`]).
#[derive(Clone)]
struct StringKey;

impl tower_governor::key_extractor::KeyExtractor for StringKey {
    type Key = String;
    fn extract<T>(&self, req: &Request<T>) -> Result<String, tower_governor::GovernorError> {
        req.headers()
            .get(KEY_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

/// The trivial inner service behind every layer: an empty 200, counting its calls.
#[derive(Clone)]
struct Inner {
    calls: Arc<AtomicU64>,
}

impl Inner {
    /// An inner service adding to `calls` (shared by several instances).
    fn shared(calls: Arc<AtomicU64>) -> (Self, Arc<AtomicU64>) {
        (
            Self {
                calls: calls.clone(),
            },
            calls,
        )
    }

    fn new() -> (Self, Arc<AtomicU64>) {
        let calls = Arc::new(AtomicU64::new(0));
        (
            Self {
                calls: calls.clone(),
            },
            calls,
        )
    }
}

impl<B> Service<Request<B>> for Inner {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<B>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::Relaxed);
        ready(Ok(Response::new(Body::new(http_body_util::Empty::<
            bytes::Bytes,
        >::new()))))
    }
}

/// A layered service called like a server would: `ready().call()` on a clone, with the key in
/// the request header. 200 is allowed, 429 denied; anything else stops the benchmark.
fn via_service<S, B>(svc: S) -> CheckFn
where
    S: Service<Request<()>, Response = Response<B>> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Error: Debug,
    B: Send + 'static,
{
    Arc::new(move |key: String| {
        let mut svc = svc.clone();
        Box::pin(async move {
            let req = Request::get("/").header(KEY_HEADER, key).body(()).unwrap();
            let res = svc
                .ready()
                .await
                .expect("service not ready")
                .call(req)
                .await
                .expect("service failed");
            match res.status() {
                StatusCode::OK => true,
                StatusCode::TOO_MANY_REQUESTS => false,
                other => panic!("unexpected status {other}"),
            }
        })
    })
}

/// The `hot-allowed` workload's quota: far above what this machine can offer (at most one unit
/// per microsecond, with a burst of over an hour of it), so every check is allowed.
pub const HOT_ALLOWED_PER_SECOND: u32 = 1_000_000;
const HOT_ALLOWED_BURST: u32 = 4_000_000_000;
/// Instances sharing one Redis in the `hot-allowed` workload.
pub const HOT_ALLOWED_INSTANCES: usize = 4;
/// The lease lifetime of our leased contenders.
pub const LEASE_LIFETIME: Duration = Duration::from_millis(50);

fn hot_allowed_quota() -> Quota {
    Quota::per_second(HOT_ALLOWED_PER_SECOND).burst(HOT_ALLOWED_BURST)
}

/// A check spread round-robin over `instances`, as a load balancer would.
fn round_robin(instances: Vec<CheckFn>) -> CheckFn {
    let next = Arc::new(AtomicU64::new(0));
    Arc::new(move |key: String| {
        let i = next.fetch_add(1, Ordering::Relaxed) as usize % instances.len();
        instances[i](key)
    })
}

/// The contenders of the `hot-allowed` workload: four instances sharing one Redis, checks
/// spread over them round-robin, one key far below its limit. Ours with and without unit
/// leases (check and layer, GCRA; the token bucket leased), tower-rate-limit-redis, and
/// tower_governor (in memory, so each instance has its own counter: not a shared limit).
pub async fn hot_allowed(c: &mut Contenders, url: &str) {
    async fn stores(url: &str) -> Vec<RedisStore> {
        let mut out = Vec::new();
        for _ in 0..HOT_ALLOWED_INSTANCES {
            out.push(
                RedisStore::connect(url)
                    .await
                    .expect("cannot connect to the benchmark redis"),
            );
        }
        out
    }
    fn ours<A: Algorithm>(
        stores: &[RedisStore],
        prefix: &str,
        lease: bool,
        layer: bool,
        make: impl Fn() -> A,
    ) -> (CheckFn, Option<Arc<AtomicU64>>) {
        let calls = Arc::new(AtomicU64::new(0));
        let instances = stores
            .iter()
            .map(|store| {
                let builder = RateLimiter::builder(store.clone(), make())
                    .prefix(prefix)
                    .store_timeout(TIMEOUT)
                    .on_store_error(FailurePolicy::Closed);
                let builder = match lease {
                    true => builder.lease(tower_redis_ratelimit::rate_limit::UnitLease::up_to(
                        LEASE_LIFETIME,
                    )),
                    false => builder,
                };
                let limiter = builder.build().expect("limiter config");
                match layer {
                    true => {
                        let (inner, _) = Inner::shared(calls.clone());
                        let layer =
                            RateLimitLayer::new(limiter, HeaderKey::new(KEY_HEADER).unwrap());
                        via_service(tower::ServiceBuilder::new().layer(layer).service(inner))
                    }
                    false => via_check(limiter),
                }
            })
            .collect();
        (round_robin(instances), layer.then_some(calls))
    }
    let stores = stores(url).await;
    let unleased_layer = "ours gcra layer (4 instances)".to_owned();
    let variants: [(&str, bool, bool); 4] = [
        ("ours gcra check, leased (4 instances)", true, false),
        ("ours gcra layer, leased (4 instances)", true, true),
        ("ours gcra check (4 instances)", false, false),
        ("ours gcra layer (4 instances)", false, true),
    ];
    for (name, lease, layer) in variants {
        let prefix = format!("ha-{}", c.prefix());
        let (check, calls) = ours(&stores, &prefix, lease, layer, || {
            Gcra::new(hot_allowed_quota()).unwrap()
        });
        let baseline = (name != unleased_layer).then(|| unleased_layer.clone());
        c.push(
            format!("hot-allowed {name}"),
            true,
            baseline.map(|b| format!("hot-allowed {b}")),
            calls,
            check,
        );
    }
    let prefix = format!("ha-{}", c.prefix());
    let (check, _) = ours(&stores, &prefix, true, false, || {
        TokenBucket::new(hot_allowed_quota()).unwrap()
    });
    c.push(
        "hot-allowed ours token-bucket check, leased (4 instances)".to_owned(),
        true,
        Some(format!("hot-allowed {unleased_layer}")),
        None,
        check,
    );

    // tower-rate-limit-redis: its largest capacity (u16) at its fastest rate (one unit per
    // millisecond). That limit would bind within a round, so its key moves on every 50,000
    // checks (below the capacity): every check is allowed, still on one hot key at a time.
    let calls = Arc::new(AtomicU64::new(0));
    let epoch = Arc::new(AtomicU64::new(0));
    let mut instances = Vec::new();
    for _ in 0..HOT_ALLOWED_INSTANCES {
        let conn = redis_peer::Client::open(url)
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("cannot connect to the benchmark redis");
        let layer = tower_rate_limit_redis::RateLimitLayer::builder()
            .conn(conn)
            .key_resolver(PeerKey(epoch.clone()))
            .capacity(u16::MAX)
            .emission_interval(Duration::from_millis(1))
            .timeout(TIMEOUT)
            .build();
        let (inner, _) = Inner::shared(calls.clone());
        instances.push(via_service(
            tower::ServiceBuilder::new().layer(layer).service(inner),
        ));
    }
    c.push(
        "hot-allowed tower-rate-limit-redis layer (4 instances)".to_owned(),
        true,
        Some(format!("hot-allowed {unleased_layer}")),
        Some(calls),
        round_robin(instances),
    );

    // tower_governor: in memory, one counter per instance.
    use tower_governor::{governor::GovernorConfigBuilder, GovernorLayer};
    let calls = Arc::new(AtomicU64::new(0));
    let instances = (0..HOT_ALLOWED_INSTANCES)
        .map(|_| {
            let config = GovernorConfigBuilder::default()
                .period(Duration::from_secs(1) / HOT_ALLOWED_PER_SECOND)
                .burst_size(HOT_ALLOWED_BURST)
                .key_extractor(StringKey)
                .finish()
                .expect("governor config");
            let (inner, _) = Inner::shared(calls.clone());
            via_service(
                tower::ServiceBuilder::new()
                    .layer(GovernorLayer::new(config))
                    .service(inner),
            )
        })
        .collect();
    c.push(
        "hot-allowed tower_governor layer (4 instances, not shared)".to_owned(),
        false,
        Some(format!("hot-allowed {unleased_layer}")),
        Some(calls),
        round_robin(instances),
    );
}

/// tower-rate-limit-redis's key resolver for the `hot-allowed` workload (namespaced like
/// [`tower_rate_limit_redis`]'s): the key, with a suffix that moves on every 50,000 checks
/// (counted across the instances).
#[derive(Clone)]
struct PeerKey(Arc<AtomicU64>);

impl tower_rate_limit_redis::KeyResolver for PeerKey {
    type Key = String;
    type ErrorBody = Body;
    fn key<T>(&self, req: &Request<T>) -> Result<String, Response<Body>> {
        req.headers()
            .get(KEY_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|k| {
                let epoch = self.0.fetch_add(1, Ordering::Relaxed) / 50_000;
                format!("trlr-ha:{k}:{epoch}")
            })
            .ok_or_else(|| {
                let mut res = Response::new(Body::empty());
                *res.status_mut() = StatusCode::BAD_REQUEST;
                res
            })
    }
}
