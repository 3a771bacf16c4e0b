//! The operators' listener (`--admin-listen`): the library's console
//! (`tower_redis_ratelimit::admin`), set up from the flags.

use super::*;

use tower_redis_ratelimit::rate_limit::admin::Admin;

/// What the operators' listener serves from: the metrics, the limiters, how a key is
/// written, and the token its requests must carry.
#[derive(Clone)]
pub(crate) struct AdminState {
    pub(crate) metrics: PrometheusHandle,
    pub(crate) limiter: RateLimiter<Arc<dyn Algorithm>>,
    pub(crate) concurrency: Option<ConcurrencyLimiter>,
    /// `--key ip`: keys are addresses, an IPv6 client as its network of this prefix.
    pub(crate) ip_keys: Option<u8>,
    pub(crate) token: Option<Arc<[u8]>>,
    /// With `--regions`: this region's store, for `GET /region`.
    pub(crate) regional: Option<RegionalStore>,
    /// Each key's quota, as the layer finds it: the live limits of `--config`, or the
    /// `--plan`s.
    pub(crate) quotas: Quotas,
    /// The quota of keys without a plan, as the flags set it.
    pub(crate) quota: Quota,
    /// `--rls-listen`: the rate limit service, whose rules the console steers too.
    pub(crate) rls: Option<RlsService>,
}

/// Where the layer finds a key's quota, so that a peek shows what a check would.
#[derive(Clone)]
pub(crate) enum Quotas {
    /// The limiter's own for every key.
    Own,
    /// `--plan`s: a quota per key, else the limiter's own.
    Plans(Arc<HashMap<Vec<u8>, Quota>>),
    /// `--config`: the limits in force (reloaded), plans included.
    Live(LiveLimits),
}

/// The operators' listener: the library's console (`/metrics`, `/top`, `/keys/{key}`,
/// `/bans/{key}`, `/limits`, `/healthz`, `/region`), every route behind the token when there
/// is one; with `--rls-listen`, the rules of the rate limit service too (`?policy=PATH`).
pub(crate) fn admin_router(state: AdminState) -> Result<Router, BoxError> {
    let metrics = state.metrics;
    let mut admin = Admin::new(state.limiter)
        .quota(state.quota)
        .metrics(move || metrics.render());
    if let Some(prefix) = state.ip_keys {
        admin = admin.ip_keys(prefix);
    }
    if let Some(concurrency) = state.concurrency {
        admin = admin.concurrency(concurrency);
    }
    if let Some(regional) = state.regional {
        admin = admin.region(move || regional.stats());
    }
    admin = match state.quotas {
        Quotas::Own => admin,
        Quotas::Plans(plans) => admin.plans(plans.iter().map(|(k, q)| (k.clone(), *q))),
        Quotas::Live(live) => admin.live(live),
    };
    if let Some(rls) = state.rls {
        admin = admin.policies(rls);
    }
    if let Some(token) = state.token {
        admin = admin.token(&*token)?;
    }
    Ok(admin.router())
}

/// The admin token: `--admin-token`, or the first line of `--admin-token-file`; required
/// when the admin listener is not on a loopback address.
pub(crate) fn admin_token(args: &Args) -> Result<Option<Arc<[u8]>>, String> {
    let token = match (&args.admin_token, &args.admin_token_file) {
        (Some(_), Some(_)) => return Err("give one of --admin-token and --admin-token-file".into()),
        (Some(token), None) => Some(token.clone()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--admin-token-file {path}: {e}"))?;
            Some(text.lines().next().unwrap_or_default().trim().to_owned())
        }
        (None, None) => None,
    };
    let Some(addr) = args.admin_listen else {
        if token.is_some() {
            return Err("--admin-token and --admin-token-file guard --admin-listen: give --admin-listen ADDR".into());
        }
        return Ok(None);
    };
    match token {
        Some(t) if t.is_empty() || t.len() > 4096 || t.bytes().any(|b| !b.is_ascii_graphic()) => Err(
            "the admin token must be 1 to 4096 visible ASCII characters (no spaces)".into(),
        ),
        Some(t) => Ok(Some(t.into_bytes().into())),
        None if addr.ip().is_loopback() => Ok(None),
        None => Err(format!(
            "--admin-listen {addr} is not a loopback address: give --admin-token or --admin-token-file"
        )),
    }
}
