//! `--rls-listen`: Envoy's rate limit service beside the HTTP listener, on the same store:
//! gRPC `ShouldRateLimit` over HTTP/2 cleartext and `POST /json` on one port, its rules
//! (`--rls-config`) read again on `SIGHUP` and when they change.

use super::*;
use std::time::SystemTime;
use tower_redis_ratelimit::rate_limit::rls::{
    json_request, json_response, RlsGrpc, RlsRules, RlsService, SHOULD_RATE_LIMIT,
};

/// The most connections the service's listener holds at once.
const MAX_RLS_CONNECTIONS: usize = 1024;
/// How often the rules' files are looked at.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Refuses what cannot work with the service, before anything connects.
pub(crate) fn check(args: &Args) -> Result<(), Refusal> {
    match (&args.rls_listen, &args.rls_config) {
        (Some(_), None) => return Err("--rls-listen needs --rls-config PATH (its rules)".into()),
        (None, Some(_)) => return Err("--rls-config goes with --rls-listen ADDR".into()),
        _ => {}
    }
    // (`--algorithm fixed-window` with `--regions` is refused with the other algorithms
    // that do not run across regions.)
    if args.regions.is_some() && args.rls_listen.is_some() {
        return Err("--rls-listen does not work with --regions: give one or the other".into());
    }
    Ok(())
}

/// The service, bound and ready: [`Prepared::serve`] says where it listens and serves.
pub(crate) struct Prepared {
    listener: tokio::net::TcpListener,
    app: axum::Router,
    /// The service, for the operators' listener.
    pub(crate) service: RlsService,
}

impl Prepared {
    /// Says where it listens (`rls listening on http://ADDR`, after the gateway's other
    /// listeners) and serves there for as long as the process runs.
    pub(crate) fn serve(self) -> std::io::Result<()> {
        println!("rls listening on http://{}", self.listener.local_addr()?);
        tokio::spawn(serve_both(self.listener, self.app));
        Ok(())
    }
}

/// Loads the rules, builds the service on `store` and binds `addr`; reloads the rules on
/// `SIGHUP` and when they change from now on.
pub(crate) async fn prepare(
    args: &Args,
    addr: SocketAddr,
    store: Arc<dyn Store>,
) -> Result<Prepared, BoxError> {
    let path = args
        .rls_config
        .clone()
        .expect("checked: --rls-config goes with --rls-listen");
    let rules = RlsRules::load(&path).map_err(|e| format!("--rls-config {e}"))?;
    let domains = rules.domains();
    let service = RlsService::builder(store)
        .algorithm(args.rls_algorithm)
        .prefix(args.prefix.clone())
        .store_timeout(args.timeout)
        .on_store_error(args.on_error)
        .local_share(args.local_share)
        .build(rules)
        .map_err(|e| format!("--rls-config {path}: {e}"))?;
    println!("rls config: {path}: {domains} domains");
    watch(path, service.clone())?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = axum::Router::new()
        .route_service(SHOULD_RATE_LIMIT, RlsGrpc::new(service.clone()))
        .route("/json", axum::routing::post(json))
        .with_state(service.clone());
    Ok(Prepared {
        listener,
        app,
        service,
    })
}

/// `POST /json`: the request in proto3's JSON mapping, answered in the same mapping, 200 when
/// `OK`, 429 when `OVER_LIMIT`; 400 for a body that does not read, 503 when the store fails
/// under `--on-redis-error closed`.
async fn json(
    axum::extract::State(service): axum::extract::State<RlsService>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let request = match json_request(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    match service.should_rate_limit(&request).await {
        Ok(response) => {
            let status = match response.overall_code() {
                tower_redis_ratelimit::rate_limit::rls::proto::Code::OverLimit => {
                    StatusCode::TOO_MANY_REQUESTS
                }
                _ => StatusCode::OK,
            };
            (
                status,
                [(http::header::CONTENT_TYPE, "application/json")],
                json_response(&response),
            )
                .into_response()
        }
        Err(e) => {
            let status = match e.code() {
                tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            (status, format!("{}\n", e.message())).into_response()
        }
    }
}

/// Serves `app` over HTTP/1.1 and HTTP/2 cleartext (gRPC) on `listener`, at most
/// [`MAX_RLS_CONNECTIONS`] at once.
async fn serve_both(listener: tokio::net::TcpListener, app: axum::Router) {
    use hyper_util::{
        rt::{TokioExecutor, TokioIo},
        server::conn::auto::Builder,
        service::TowerToHyperService,
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_RLS_CONNECTIONS));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "rls: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let _ = Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// What the rules' files look like: each file's name, length and modification time.
fn fingerprint(path: &str) -> Vec<(String, u64, Option<SystemTime>)> {
    let look = |p: &std::path::Path| {
        std::fs::metadata(p)
            .map(|m| (p.display().to_string(), m.len(), m.modified().ok()))
            .ok()
    };
    let root = std::path::Path::new(path);
    match std::fs::read_dir(root) {
        Ok(entries) => {
            let mut files: Vec<_> = entries
                .filter_map(Result::ok)
                .filter_map(|e| look(&e.path()))
                .collect();
            files.sort();
            files
        }
        Err(_) => look(root).into_iter().collect(),
    }
}

/// Reloads the rules on `SIGHUP` (always one line) and when their files change and have
/// settled (the same for two looks in a row), off the threads that serve requests.
fn watch(path: String, service: RlsService) -> std::io::Result<()> {
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move {
        let mut loaded = fingerprint(&path);
        let mut last = loaded.clone();
        let mut tick = tokio::time::interval(LOOK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let signalled = tokio::select! {
                Some(()) = hangup.recv() => true,
                _ = tick.tick() => false,
            };
            let (p, s) = (path.clone(), service.clone());
            let looked = tokio::task::spawn_blocking(move || {
                let now = fingerprint(&p);
                (now, p, s)
            })
            .await;
            let Ok((now, p, s)) = looked else { return };
            let settled = now == last;
            last = now.clone();
            if !signalled && (now == loaded || !settled) {
                continue;
            }
            loaded = now;
            let outcome = tokio::task::spawn_blocking(move || {
                RlsRules::load(&p)
                    .and_then(|rules| {
                        let n = rules.domains();
                        s.replace(rules).map(|()| n)
                    })
                    .map_err(|e| e.to_string())
            })
            .await;
            match outcome {
                Ok(Ok(n)) => eprintln!("rls config reloaded: {path}: {n} domains"),
                Ok(Err(reason)) => eprintln!("rls config refused: {reason}"),
                Err(e) => eprintln!("rls config refused: {e}"),
            }
        }
    });
    Ok(())
}
