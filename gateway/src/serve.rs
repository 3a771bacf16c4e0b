//! Serving: the public listener (the demo routes, or the proxy), the signals, the drain.

use super::*;
use std::sync::atomic::{AtomicU32, Ordering};

use tower::Layer as _;

/// The rate limit on the public listener, what the admin routes show of it, and with
/// `--config` the file and the limits it reloads.
struct Limited {
    layer: Layer,
    quotas: Quotas,
    /// With `--config`: the file, and what a reload changes (the limits, the cost).
    reloaded: Option<(String, (LiveLimits, Arc<AtomicU32>))>,
}

/// The rate limit on the public listener, as the flags (or the limits file) set it, with
/// what the admin routes show of it and, with `--config`, the limits the file reloads.
fn rate_limit_layer(
    args: &Args,
    limiter: RateLimiter<Arc<dyn Algorithm>>,
) -> Result<Limited, BoxError> {
    if let Some(max) = args.delay_up_to {
        println!("delay: a request over the limit waits up to {max:?} for its units, in time with the limit");
    }
    if let Some(lifetime) = args.unit_lease {
        println!(
            "unit leases: hot allowed keys answered from reserved blocks, each handed out for at most {} ms",
            lifetime.as_millis()
        );
    }
    let mut layer = RateLimitLayer::new(limiter, key_extractor(args)?).headers(args.headers);
    // Each request's first charge, which a reload of the file may change.
    let cost = Arc::new(AtomicU32::new(args.cost));
    if args.cost != 1 || args.config.is_some() {
        let cost = Arc::clone(&cost);
        layer = layer.cost(move |_| cost.load(Ordering::Relaxed));
    }
    layer = lists_and_counting(args, layer)?;
    if let Some(path) = &args.config {
        // The limits from the file, replaced on each reload (plans and lists included).
        let (live_layer, live) = layer.live(limits_of(args))?;
        println!("config: {path} (reloaded on SIGHUP and when it changes)");
        return Ok(Limited {
            layer: live_layer,
            quotas: Quotas::Live(live.clone()),
            reloaded: Some((path.clone(), (live, cost))),
        });
    }
    let Some(header) = args
        .key
        .strip_prefix("header:")
        .filter(|_| !args.plans.is_empty())
    else {
        return Ok(Limited {
            layer,
            quotas: Quotas::Own,
            reloaded: None,
        });
    };
    let header = http::HeaderName::from_bytes(header.as_bytes())?;
    let plans: Arc<HashMap<Vec<u8>, Quota>> = Arc::new(
        args.plans
            .iter()
            .map(|(key, quota, _)| (key.as_bytes().to_vec(), *quota))
            .collect(),
    );
    let layer = layer.quota_fn({
        let plans = Arc::clone(&plans);
        move |parts| {
            let key = parts.headers.get(&header)?;
            plans.get(key.as_bytes()).copied()
        }
    });
    Ok(Limited {
        layer,
        quotas: Quotas::Plans(plans),
        reloaded: None,
    })
}

/// The allow and deny lists, the settlement from a header and counting by status, as the
/// flags set them, each said on stdout.
fn lists_and_counting(args: &Args, mut layer: Layer) -> Result<Layer, BoxError> {
    if lists_addresses(args) {
        layer = layer.list_addresses(client_ip(args)?);
    }
    if let Some(list) = args.allow.clone() {
        println!(
            "allow list: {} keys and {} networks served without a limit",
            list.keys(),
            list.networks()
        );
        layer = layer.allow(list);
    }
    if let Some(list) = args.deny.clone() {
        println!(
            "deny list: {} keys and {} networks refused (403)",
            list.keys(),
            list.networks()
        );
        layer = layer.deny(list);
    }
    if let Some(name) = &args.settle_header {
        println!(
            "settling each charge to the whole number in the upstream's {name} header (--cost {} first)",
            args.cost
        );
        layer = layer.settle_from_header(name.clone())?;
    }
    if let Some(statuses) = args.count_only {
        println!(
            "counting only responses with status {statuses}; the others give their units back"
        );
        layer = layer.count_only(statuses)?;
    }
    Ok(layer)
}

type Layer = RateLimitLayer<Arc<dyn KeyExtractor>, Arc<dyn Algorithm>>;

/// The demo routes: `/`, `/status/{code}`, `/sleep/{ms}`.
fn demo_routes() -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/status/{code}", get(status))
        .route("/sleep/{ms}", get(sleep))
        .fallback(|| async { (http::StatusCode::NOT_FOUND, "not found") })
}

#[allow(clippy::too_many_arguments)] // The stores and settings `run` made, each once.
pub(crate) async fn serve(
    base: Args,
    args: Args,
    file: Option<FileWatch>,
    store: Arc<dyn Store>,
    slots: Option<Arc<dyn SlotStore>>,
    algorithm: Arc<dyn Algorithm>,
    metrics: Option<PrometheusHandle>,
    regional: Option<RegionalStore>,
    rls: Option<rls::Prepared>,
) -> Result<(), BoxError> {
    let concurrency = concurrency_limiter(&args, slots)?;
    let limiter = rate_limiter(&args, store, algorithm)?;
    let Limited {
        layer,
        quotas,
        reloaded,
    } = rate_limit_layer(&args, limiter.clone())?;
    if args.redis.is_some() || args.redis_cluster.is_some() || args.redis_sentinel.is_some() {
        let rules = rls.as_ref().map(|r| r.service.clone());
        watch_store(limiter.clone(), rules);
    }
    let admin = metrics.map(|metrics| AdminState {
        metrics,
        limiter,
        concurrency: concurrency.clone(),
        ip_keys: (args.key == "ip").then_some(args.ipv6_prefix),
        token: None,
        regional,
        quotas,
        quota: quota_of(&args),
        rls: rls.as_ref().map(|r| r.service.clone()),
    });
    announce(&args);
    let layer = if args.no_limit {
        println!("limiter: off (--no-limit)");
        None
    } else {
        Some(layer)
    };
    let concurrency = match concurrency.filter(|_| !args.no_limit) {
        Some(limiter) => {
            println!(
                "concurrency: at most {} requests per key in flight (lease {} ms)",
                limiter.max_in_flight(),
                limiter.permit_ttl().as_millis()
            );
            Some(ConcurrencyLimitLayer::new(limiter, key_extractor(&args)?))
        }
        None => None,
    };
    if let (Some((path, live)), Some(file)) = (reloaded, file) {
        watch(base, path, file, args.clone(), live);
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    // The signals are ours before anyone is told where we listen.
    if args.config.is_none() && args.rls_config.is_none() {
        ignore_hangups()?;
    }
    let terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    println!("listening on http://{}", listener.local_addr()?);
    if let (Some(addr), Some(mut admin)) = (args.admin_listen, admin) {
        admin.token = admin_token(&args)?;
        spawn_admin(addr, admin).await?;
    }
    if let Some(rls) = rls {
        rls.serve()?;
    }
    let stop = Shutdown {
        signal: stop_signal(args.drain, terminate),
        drain: args.drain,
        // Past the drain time, the slots of the requests cut off get a store call's time (and
        // a little more) to go back.
        settle: args.timeout + Duration::from_millis(250),
    };
    if !serve_public(&args, listener, layer, concurrency, stop).await {
        tracing::warn!("requests still in flight after the drain time; exiting");
    }
    Ok(())
}

/// The lines that say where requests go and whether they are refused.
fn announce(args: &Args) {
    if let Some(upstream) = &args.upstream {
        println!("upstream: {}", upstream.describe());
    }
    if args.shadow && !args.no_limit {
        println!("shadow mode: over-limit requests are served (and logged), never rejected");
    }
}

/// The admin listener on `addr`, in a task of its own, for as long as the process runs.
async fn spawn_admin(addr: SocketAddr, admin: AdminState) -> Result<(), BoxError> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("admin listening on http://{}", listener.local_addr()?);
    let app = admin_router(admin)?;
    let stop = Shutdown {
        signal: std::future::pending(),
        drain: Duration::ZERO,
        settle: Duration::ZERO,
    };
    let make = move |_| app.clone();
    tokio::spawn(serve_http(
        listener,
        make,
        true,
        MAX_ADMIN_CONNECTIONS,
        stop,
    ));
    Ok(())
}

/// Ends at `SIGINT` or `SIGTERM`, saying the drain starts.
async fn stop_signal(drain: Duration, mut terminate: tokio::signal::unix::Signal) {
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    tracing::info!(
        drain_ms = drain.as_millis() as u64,
        "stopping: draining the requests in flight"
    );
}

/// The public listener: the proxy with `--upstream`, else the demo routes, under the rate
/// limit (`layer`) and the concurrency limit, outermost, so that a request refused for
/// concurrency spends no units. `false` when requests were cut off by the drain time.
async fn serve_public(
    args: &Args,
    listener: tokio::net::TcpListener,
    layer: Option<Layer>,
    concurrency: Option<ConcurrencyLimitLayer<Arc<dyn KeyExtractor>>>,
    stop: Shutdown<impl std::future::Future<Output = ()>>,
) -> bool {
    let Some(upstream) = &args.upstream else {
        let mut app = demo_routes();
        if let Some(layer) = layer {
            app = app.layer(layer);
        }
        if let Some(concurrency) = concurrency {
            app = app.layer(concurrency);
        }
        return serve_http(listener, move |_| app.clone(), true, MAX_CONNECTIONS, stop).await;
    };
    // Each arm its own service type: no box between the layers and the proxy.
    let proxy = proxy::Proxy::new(upstream.clone(), args.upstream_timeout);
    let (max, addresses) = (MAX_CONNECTIONS, reads_client_address(args));
    match (layer, concurrency) {
        (None, _) => {
            let make = move |c| proxy.connection(c);
            serve_http(listener, make, false, max, stop).await
        }
        (Some(l), None) => {
            let make = move |c| l.layer(proxy.connection(c));
            serve_http(listener, make, addresses, max, stop).await
        }
        (Some(l), Some(k)) => {
            let make = move |c| k.layer(l.layer(proxy.connection(c)));
            serve_http(listener, make, addresses, max, stop).await
        }
    }
}

/// Looks every second whether the store lost the limit's state (a Redis restarted without
/// persistence, flushed, failed over to a replica without it), and then writes back the bans
/// this gateway knows (`RateLimiter::notice_reset`); publishes this gateway's most denied
/// keys every 2 s for the fleet's view (`/top?scope=fleet`); the same for each rule of the
/// rate limit service, `rules`, as they are at each turn. A store that does not answer is
/// the checks' to report.
fn watch_store(limiter: RateLimiter<Arc<dyn Algorithm>>, rules: Option<RlsService>) {
    use tower_redis_ratelimit::rate_limit::admin::PolicyLimiters;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for n in 0u64.. {
            tick.tick().await;
            let mut limiters = vec![limiter.clone()];
            if let Some(rules) = &rules {
                limiters.extend(rules.limiters());
            }
            for limiter in &limiters {
                let _ = limiter.notice_reset().await;
                if n % 2 == 0 {
                    let _ = limiter.publish_top_keys().await;
                }
            }
        }
    });
}

/// `SIGHUP` without `--config`: nothing to reload. Logged (at most once a second) and
/// ignored, instead of the default action that ends the process.
pub(crate) fn ignore_hangups() -> std::io::Result<()> {
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move {
        let mut logged: Option<tokio::time::Instant> = None;
        while hangup.recv().await.is_some() {
            if logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                tracing::info!("SIGHUP ignored: no --config file to reload");
                logged = Some(tokio::time::Instant::now());
            }
        }
    });
    Ok(())
}

/// The most connections the public listener holds at once; those beyond wait in the
/// kernel's accept queue, holding no descriptor of the gateway's.
pub(crate) const MAX_CONNECTIONS: usize = 512;
/// The most connections the admin listener holds at once.
pub(crate) const MAX_ADMIN_CONNECTIONS: usize = 64;
/// How long a client has to send a request's headers, on either listener: from the
/// connection's start, and from the end of the previous response on a kept-alive one.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The public listener's shutdown: the signal that starts it, how long requests in flight get
/// (`drain`), and how long what the requests cut off hold gets to go back (`settle`).
pub(crate) struct Shutdown<F> {
    pub(crate) signal: F,
    pub(crate) drain: Duration,
    pub(crate) settle: Duration,
}

/// The next connection, once fewer than the most are open, with the slot it holds. Failures
/// to accept are waited out: a connection reset before it was taken is skipped, and anything
/// else (out of descriptors, most likely) waits a second for some to close, logged once.
async fn accept(
    listener: &tokio::net::TcpListener,
    slots: &Arc<tokio::sync::Semaphore>,
) -> (
    tokio::sync::OwnedSemaphorePermit,
    (tokio::net::TcpStream, SocketAddr),
) {
    loop {
        let slot = Arc::clone(slots)
            .acquire_owned()
            .await
            .expect("never closed");
        match listener.accept().await {
            Ok(connection) => return (slot, connection),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                ) => {}
            Err(e) => {
                tracing::error!(error = %e, "accept failed; trying again in 1 s");
                drop(slot);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// One client connection's service: `service`, with the client's address in each request's
/// extensions (`ConnectInfo`, where the key extractors and the admin routes find it) when
/// something reads it.
#[derive(Clone)]
struct WithClient<S> {
    service: S,
    client: Option<SocketAddr>,
}

impl<S, B> hyper::service::Service<http::Request<hyper::body::Incoming>> for WithClient<S>
where
    S: tower::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>> + Clone,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = tower::util::Oneshot<S, http::Request<hyper::body::Incoming>>;

    fn call(&self, mut req: http::Request<hyper::body::Incoming>) -> Self::Future {
        use tower::ServiceExt;
        if let Some(client) = self.client {
            req.extensions_mut().insert(ConnectInfo(client));
        }
        self.service.clone().oneshot(req)
    }
}

/// Serves HTTP/1.1 on `listener`, each connection with the service `make` gives for its
/// client's address (and that address in each request's extensions if `addresses`), at most `max` connections at once, each closed when a request's headers
/// take longer than [`HEADER_READ_TIMEOUT`]. When `stop.signal` ends, stops accepting, lets
/// each connection finish the request it serves, and returns once all are closed (`true`) or
/// `stop.drain` has passed (`false`: the requests still running are dropped, and what they
/// hold, such as concurrency slots, gets `stop.settle` to go back).
pub(crate) async fn serve_http<S, B>(
    listener: tokio::net::TcpListener,
    mut make: impl FnMut(SocketAddr) -> S,
    addresses: bool,
    max: usize,
    stop: Shutdown<impl std::future::Future<Output = ()>>,
) -> bool
where
    S: tower::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    use hyper_util::rt::TokioIo;

    let slots = Arc::new(tokio::sync::Semaphore::new(max));
    let mut connections = tokio::task::JoinSet::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(crate::timer::KeptTimer::default())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        // Heads and small bodies copied into one buffer, written by one `write`.
        .writev(false);
    let stopping = Arc::new(Stop::default());
    let shutdown = stop.signal;
    tokio::pin!(shutdown);
    loop {
        let (slot, (stream, client)) = tokio::select! {
            () = &mut shutdown => break,
            accepted = accept(&listener, &slots) => accepted,
        };
        let _ = stream.set_nodelay(true);
        let service = WithClient {
            service: make(client),
            client: addresses.then_some(client),
        };
        let builder = builder.clone();
        let stopped = Stopped::new(&stopping);
        // Finished connections are forgotten as new ones come.
        while connections.try_join_next().is_some() {}
        // Without Tokio's budget: hyper's dispatcher yields on its own after 16 turns.
        connections.spawn(tokio::task::coop::unconstrained(async move {
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                biased;
                _ = conn.as_mut() => {}
                () = stopped => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(slot);
        }));
    }
    drop(listener);
    stopping.stop();
    // Every connection closed: each gave its slot back.
    let drained = tokio::time::timeout(stop.drain, slots.acquire_many(max as u32))
        .await
        .is_ok();
    if !drained {
        // The requests still running are dropped here, and with them their concurrency
        // permits, each of which gives its slot back in a task of its own: those get `settle`
        // to reach the store before the process ends.
        connections.abort_all();
        while connections.join_next().await.is_some() {}
        tokio::time::sleep(stop.settle).await;
    }
    drained
}

/// The stop of a listener's connections: a flag, and the tasks to wake when it is set.
#[derive(Default)]
struct Stop {
    stopping: std::sync::atomic::AtomicBool,
    /// The tasks of the connections, by a number of each's own; the last number given.
    tasks: std::sync::Mutex<(u64, HashMap<u64, std::task::Waker>)>,
}

impl Stop {
    fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let tasks = std::mem::take(&mut crate::locked(&self.tasks).1);
        for task in tasks.into_values() {
            task.wake();
        }
    }
}

/// Ends when the connection it is given to is to stop. Its task is registered with the
/// [`Stop`] once (and again only if it changes): a poll reads one flag.
struct Stopped {
    stop: Arc<Stop>,
    /// The number and the waker it registered.
    registered: Option<(u64, std::task::Waker)>,
}

impl Stopped {
    fn new(stop: &Arc<Stop>) -> Self {
        Self {
            stop: Arc::clone(stop),
            registered: None,
        }
    }
}

impl std::future::Future for Stopped {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.stop.stopping.load(Ordering::SeqCst) {
            return std::task::Poll::Ready(());
        }
        if !matches!(&self.registered, Some((_, task)) if task.will_wake(cx.waker())) {
            let stop = Arc::clone(&self.stop);
            let mut tasks = crate::locked(&stop.tasks);
            let id = match &self.registered {
                Some((id, _)) => *id,
                None => {
                    tasks.0 += 1;
                    tasks.0
                }
            };
            tasks.1.insert(id, cx.waker().clone());
            drop(tasks);
            self.registered = Some((id, cx.waker().clone()));
            // Set while it registered: `stop` may have taken the tasks before.
            if self.stop.stopping.load(Ordering::SeqCst) {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some((id, _)) = self.registered.take() {
            crate::locked(&self.stop.tasks).1.remove(&id);
        }
    }
}

/// `GET /status/{code}`: that status, 100 to 599; anything else 400. (An informational 1xx
/// other than 101 cannot end a response: hyper turns it into a 500.)
pub(crate) async fn status(Path(code): Path<String>) -> Response {
    match code.parse::<u16>().ok().filter(|c| (100..=599).contains(c)) {
        Some(c) => {
            let status = StatusCode::from_u16(c).expect("100-599 is a status code");
            (status, format!("{c}\n")).into_response()
        }
        None => (StatusCode::BAD_REQUEST, "a status code is 100 to 599\n").into_response(),
    }
}

/// `GET /sleep/{ms}`: 200 after `ms` milliseconds, at most 60,000; anything else 400.
pub(crate) async fn sleep(Path(ms): Path<String>) -> Response {
    match ms.parse::<u64>().ok().filter(|&ms| ms <= 60_000) {
        Some(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            (StatusCode::OK, format!("slept {ms} ms\n")).into_response()
        }
        None => (StatusCode::BAD_REQUEST, "sleep 0 to 60000 ms\n").into_response(),
    }
}
