//! Serving: the public listener (the demo routes, or the proxy), the signals, the drain.

use super::*;

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
) -> Result<(), BoxError> {
    let concurrency = concurrency_limiter(&args, slots)?;
    let limiter = rate_limiter(&args, store, algorithm)?;
    let watched = limiter.clone();
    let admin_concurrency = concurrency.clone();
    if let Some(lifetime) = args.unit_lease {
        println!(
            "unit leases: hot allowed keys answered from reserved blocks, each handed out for at most {} ms",
            lifetime.as_millis()
        );
    }
    let mut layer = RateLimitLayer::new(limiter, key_extractor(&args)?).headers(args.headers);
    if args.allow.is_some() || args.deny.is_some() || args.config.is_some() {
        layer = layer.list_addresses(client_ip(&args)?);
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
    if let Some(statuses) = args.count_only {
        println!(
            "counting only responses with status {statuses}; the others give their units back"
        );
        layer = layer.count_only(statuses)?;
    }
    let mut watched_file = None;
    let mut quotas = Quotas::Own;
    if let Some(path) = &args.config {
        // The limits from the file, replaced on each reload (plans and lists included).
        let (live_layer, live) = layer.live(limits_of(&args))?;
        layer = live_layer;
        println!("config: {path} (reloaded on SIGHUP and when it changes)");
        quotas = Quotas::Live(live.clone());
        watched_file = Some((path.clone(), live));
    } else if let Some(header) = args
        .key
        .strip_prefix("header:")
        .filter(|_| !args.plans.is_empty())
    {
        let header = http::HeaderName::from_bytes(header.as_bytes())?;
        let plans: Arc<HashMap<Vec<u8>, Quota>> = Arc::new(
            args.plans
                .iter()
                .map(|(key, quota, _)| (key.as_bytes().to_vec(), *quota))
                .collect(),
        );
        quotas = Quotas::Plans(Arc::clone(&plans));
        layer = layer.quota_fn(move |parts| {
            let key = parts.headers.get(&header)?;
            plans.get(key.as_bytes()).copied()
        });
    }
    let app = match &args.upstream {
        Some(upstream) => {
            println!("upstream: {}", upstream.describe());
            Router::new()
                .fallback(proxy::forward)
                .with_state(proxy::Proxy::new(upstream.clone(), args.upstream_timeout))
        }
        None => Router::new()
            .route("/", get(|| async { "ok" }))
            .route("/status/{code}", get(status))
            .route("/sleep/{ms}", get(sleep))
            .fallback(|| async { (http::StatusCode::NOT_FOUND, "not found") }),
    };
    if args.shadow && !args.no_limit {
        println!("shadow mode: over-limit requests are served (and logged), never rejected");
    }
    let app = if args.no_limit {
        println!("limiter: off (--no-limit)");
        app
    } else {
        app.layer(layer)
    };
    let app = match concurrency.filter(|_| !args.no_limit) {
        Some(limiter) => {
            println!(
                "concurrency: at most {} requests per key in flight (lease {} ms)",
                limiter.max_in_flight(),
                limiter.permit_ttl().as_millis()
            );
            // Outermost: a request refused for concurrency spends no rate-limit units.
            app.layer(ConcurrencyLimitLayer::new(limiter, key_extractor(&args)?))
        }
        None => app,
    };
    if let (Some((path, live)), Some(file)) = (watched_file, file) {
        watch(base, path, file, args.clone(), live);
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    // The signals are ours before anyone is told where we listen.
    if args.config.is_none() {
        ignore_hangups()?;
    }
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    println!("listening on http://{}", listener.local_addr()?);
    if let (Some(addr), Some(metrics)) = (args.admin_listen, metrics) {
        let admin = tokio::net::TcpListener::bind(addr).await?;
        println!("admin listening on http://{}", admin.local_addr()?);
        let app = admin_router(AdminState {
            metrics,
            limiter: watched,
            concurrency: admin_concurrency,
            keys: KeyText::of(&args),
            token: admin_token(&args)?,
            regional,
            quotas,
        });
        tokio::spawn(serve_http(
            admin,
            app,
            MAX_ADMIN_CONNECTIONS,
            std::future::pending(),
            (Duration::ZERO, Duration::ZERO),
        ));
    }
    let stop = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!(
            drain_ms = args.drain.as_millis() as u64,
            "stopping: draining the requests in flight"
        );
    };
    // Past the drain time, the slots of the requests cut off get a store call's time (and a
    // little more) to go back.
    let settle = args.timeout + Duration::from_millis(250);
    if !serve_http(listener, app, MAX_CONNECTIONS, stop, (args.drain, settle)).await {
        tracing::warn!("requests still in flight after the drain time; exiting");
    }
    Ok(())
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

/// Serves `app` over HTTP/1.1 on `listener`, with its client's address (`ConnectInfo`), at
/// most `max` connections at once, each closed when a request's headers take longer than
/// [`HEADER_READ_TIMEOUT`]. When `shutdown` ends, stops accepting, lets each connection finish
/// the request it serves, and returns once all are closed (`true`) or `drain` has passed
/// (`false`: the requests still running are dropped, and what they hold, such as concurrency
/// slots, gets `settle` to go back).
pub(crate) async fn serve_http(
    listener: tokio::net::TcpListener,
    app: Router,
    max: usize,
    shutdown: impl std::future::Future<Output = ()>,
    (drain, settle): (Duration, Duration),
) -> bool {
    use hyper_util::{
        rt::{TokioExecutor, TokioIo, TokioTimer},
        server::conn::auto::Builder,
        service::TowerToHyperService,
    };
    use tower::Service;

    let slots = Arc::new(tokio::sync::Semaphore::new(max));
    let mut connections = tokio::task::JoinSet::new();
    // HTTP/1 only: an HTTP/2 preface would be awaited with no timeout.
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let (stop, stopped) = tokio::sync::watch::channel(());
    let mut make = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = async {
                let slot = Arc::clone(&slots).acquire_owned().await.expect("never closed");
                (slot, listener.accept().await)
            } => accepted,
        };
        let (slot, (stream, addr)) = match accepted {
            (slot, Ok(conn)) => (slot, conn),
            (_, Err(e)) => {
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                ) {
                    // Out of descriptors, most likely: wait for some to close, one line a second.
                    tracing::error!(error = %e, "accept failed; trying again in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                continue;
            }
        };
        let service = match make.call(addr).await {
            Ok(service) => service,
            Err(never) => match never {},
        };
        let builder = builder.clone();
        let mut stopped = stopped.clone();
        // Finished connections are forgotten as new ones come.
        while connections.try_join_next().is_some() {}
        connections.spawn(async move {
            let conn = builder.serve_connection_with_upgrades(
                TokioIo::new(stream),
                TowerToHyperService::new(service),
            );
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stopped.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    let _ = stop.send(());
    // Every connection closed: each gave its slot back.
    let drained = tokio::time::timeout(drain, slots.acquire_many(max as u32))
        .await
        .is_ok();
    if !drained {
        // The requests still running are dropped here, and with them their concurrency
        // permits, each of which gives its slot back in a task of its own: those get `settle`
        // to reach the store before the process ends.
        connections.abort_all();
        while connections.join_next().await.is_some() {}
        tokio::time::sleep(settle).await;
    }
    drained
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
