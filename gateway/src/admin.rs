//! The operators' listener (`--admin-listen`): `/metrics`, `/top`, `/keys`, `/bans`, the regions.

use super::*;

/// What the operators' listener serves from: the metrics, the limiters, how a key is
/// written, and the token its requests must carry.
#[derive(Clone)]
pub(crate) struct AdminState {
    pub(crate) metrics: PrometheusHandle,
    pub(crate) limiter: RateLimiter<Arc<dyn Algorithm>>,
    pub(crate) concurrency: Option<ConcurrencyLimiter>,
    pub(crate) keys: KeyText,
    pub(crate) token: Option<Arc<[u8]>>,
    /// With `--regions`: this region's store, for `GET /region`.
    pub(crate) regional: Option<RegionalStore>,
    /// Each key's quota, as the layer finds it: the live limits of `--config`, or the
    /// `--plan`s.
    pub(crate) quotas: Quotas,
    /// The quota of keys without a plan, as the flags (or the file at start-up) set it.
    pub(crate) quota: Quota,
    /// `--algorithm`, as given.
    pub(crate) algorithm: String,
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

/// How the key extractor writes a key, so that an operator's text names the same key.
#[derive(Clone, Copy)]
pub(crate) enum KeyText {
    /// `--key ip`: an address, an IPv6 client as its /N network.
    Ip { ipv6_prefix: u8 },
    /// `--key header:NAME` and `--key global`: the text itself.
    Text,
}

impl KeyText {
    pub(crate) fn of(args: &Args) -> Self {
        match args.key.as_str() {
            "ip" => KeyText::Ip {
                ipv6_prefix: args.ipv6_prefix,
            },
            _ => KeyText::Text,
        }
    }

    /// The key `named` names (the bytes of an admin path's last part, percent-decoded), or
    /// why it names none.
    fn key(self, named: &[u8]) -> Result<Key<'static>, String> {
        let KeyText::Ip { ipv6_prefix } = self else {
            return Ok(Key::bytes(named.to_vec()));
        };
        let not = || {
            format!(
                "\"{}\" is not an address or ADDRESS/BITS",
                percent_encoded(named)
            )
        };
        let text = std::str::from_utf8(named).map_err(|_| not())?;
        match text.split_once('/') {
            Some((ip, bits)) => {
                let ip: IpAddr = ip.parse().map_err(|_| not())?;
                let max = if ip.is_ipv4() { 32 } else { 128 };
                match bits.parse::<u8>() {
                    Ok(bits) if bits <= max => Ok(Key::network(ip, bits)),
                    _ => Err(not()),
                }
            }
            None => match text.parse::<IpAddr>().map_err(|_| not())? {
                // As the extractor keys a client: an IPv6 address by its network.
                ip @ IpAddr::V6(_) => Ok(Key::network(ip, ipv6_prefix)),
                ip => Ok(Key::ip(ip)),
            },
        }
    }
}

/// The operators' listener: `/metrics` (Prometheus text), `/top?n=N` (JSON), `/keys/{key}`
/// (`GET` the state, `DELETE` to reset), `/bans/{key}` (`PUT ?seconds=N`, `DELETE`),
/// `/healthz`, `/limits` (JSON) and `/region`, every route behind the token when there is one.
pub(crate) fn admin_router(state: AdminState) -> Router {
    let guard = state.token.clone();
    Router::new()
        .route(
            "/metrics",
            get(|State(s): State<AdminState>| async move {
                (
                    [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    s.metrics.render(),
                )
            }),
        )
        .route(
            "/top",
            get(
                |State(s): State<AdminState>, Query(query): Query<HashMap<String, String>>| async move {
                    let n = query.get("n").map(String::as_str);
                    top(&s.limiter, n, query.get("scope").map(String::as_str)).await
                },
            ),
        )
        .route("/region", get(region_state))
        .route("/healthz", get(healthz))
        .route("/limits", get(limits))
        .route("/keys/{*key}", get(peek_key).delete(reset_key))
        .route("/bans/{*key}", put(ban_key).delete(unban_key))
        .layer(axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
            let guard = guard.clone();
            async move {
                match guard {
                    Some(token) if !authorized(&req, &token) => (
                        StatusCode::UNAUTHORIZED,
                        [(http::header::WWW_AUTHENTICATE, "Bearer")],
                        "an admin token is required: Authorization: Bearer TOKEN\n",
                    )
                        .into_response(),
                    _ => next.run(req).await,
                }
            }
        }))
        .with_state(state)
}

/// Whether `req` carries `Authorization: Bearer TOKEN` (the scheme in any case, as HTTP
/// says), the token compared in constant time (no timing tells how much of a guess was
/// right).
pub(crate) fn authorized(req: &axum::extract::Request, token: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    let Some(value) = req.headers().get(http::header::AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    let Some(space) = value.iter().position(|&b| b == b' ') else {
        return false;
    };
    let (scheme, given) = (&value[..space], value[space..].trim_ascii_start());
    scheme.eq_ignore_ascii_case(b"bearer") && bool::from(given.ct_eq(token))
}

/// An admin call that failed: 400 for a key that names none, 503 when the store failed.
pub(crate) fn admin_error(status: StatusCode, e: impl std::fmt::Display) -> Response {
    (status, format!("{e}\n")).into_response()
}

/// `GET /region`: this region's state and grants, as JSON; 404 without `--regions`.
pub(crate) async fn region_state(State(s): State<AdminState>) -> Response {
    let Some(store) = &s.regional else {
        return admin_error(StatusCode::NOT_FOUND, "no --regions");
    };
    let r = store.stats();
    axum::Json(serde_json::json!({
        "region": r.region,
        "home": r.home,
        "cut_off": r.cut_off,
        "cuts": r.cuts,
        "grants": r.grants,
        "units_granted": r.units_granted,
        "units_charged": r.units_charged,
        "failed_grants": r.failed_grants,
        "first_grants_awaited": r.first_grants_awaited,
    }))
    .into_response()
}

/// The bytes an admin path names after `/keys/` or `/bans/`, percent-decoded: any bytes, so
/// that every key can be named (`%FF` is the byte 0xFF; a `%` not followed by two hex digits
/// stands for itself).
pub(crate) fn named_key(uri: &Uri) -> Vec<u8> {
    let rest = uri.path().splitn(3, '/').nth(2).unwrap_or_default();
    let hex = |b: Option<&u8>| b.and_then(|&b| (b as char).to_digit(16));
    let bytes = rest.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (b, ..) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// `bytes` percent-encoded: every byte other than an ASCII letter, a digit, `-`, `.`, `_`,
/// `~` and `:` as `%XX`. What an admin path takes back as those bytes, and what an audit line
/// writes (one line, no control character, whatever the key).
pub(crate) fn percent_encoded(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b':' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A key as `/top` and `/keys/{key}` show it: `(text, "utf8")` when its bytes are UTF-8,
/// else `(percent-encoded, "percent")`.
pub(crate) fn shown_key(bytes: &[u8]) -> (String, &'static str) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_owned(), "utf8"),
        Err(_) => (percent_encoded(bytes), "percent"),
    }
}

/// `GET /keys/{key}`: the key's state, spending nothing.
pub(crate) async fn peek_key(State(s): State<AdminState>, uri: Uri) -> Response {
    let named = named_key(&uri);
    let key = match s.keys.key(&named) {
        Ok(key) => key,
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, e),
    };
    let ms = |d: Duration| d.as_micros().div_ceil(1_000) as u64;
    let peeked = match &s.quotas {
        Quotas::Live(live) => live.peek(key).await,
        Quotas::Plans(plans) => match plans.get(&named) {
            Some(quota) => s.limiter.peek_with_quota(key, *quota).await,
            None => s.limiter.peek(key).await,
        },
        Quotas::Own => s.limiter.peek(key).await,
    };
    let (text, encoding) = shown_key(&named);
    match peeked {
        Ok(state) => axum::Json(serde_json::json!({
            "key": text,
            "encoding": encoding,
            "policy": &*state.policy,
            "limit": state.capacity,
            "remaining": state.remaining,
            "reset_ms": ms(state.reset_after),
            "banned_ms": state.banned_for.map_or(0, ms),
        }))
        .into_response(),
        Err(e) => admin_error(StatusCode::SERVICE_UNAVAILABLE, ErrorChain(&e)),
    }
}

/// `GET /healthz`: `200 ok` when the store answers a read within the store timeout (always,
/// in memory), else `503` with the reason on one line. The read is a peek of a key no
/// request has (`#healthz`); a store that cannot be read without a check (several regions)
/// is asked a check of that key instead.
pub(crate) async fn healthz(State(s): State<AdminState>) -> Response {
    const PROBE: &str = "#healthz";
    let answered = match s.limiter.peek(PROBE).await {
        Err(tower_redis_ratelimit::Error::Unsupported(_)) => {
            s.limiter.check(PROBE, 1).await.map(|_| ())
        }
        other => other.map(|_| ()),
    };
    match answered {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store did not answer: {}\n", ErrorChain(&e)),
        )
            .into_response(),
    }
}

/// `DELETE /keys/{key}`: forgets what the key spent, and its concurrency slots.
pub(crate) async fn reset_key(
    State(s): State<AdminState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    uri: Uri,
) -> Response {
    let named = named_key(&uri);
    let key = match s.keys.key(&named) {
        Ok(key) => key,
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, e),
    };
    if let Err(e) = s.limiter.reset(key.clone()).await {
        return admin_error(StatusCode::SERVICE_UNAVAILABLE, ErrorChain(&e));
    }
    if let Some(concurrency) = &s.concurrency {
        if let Err(e) = concurrency.reset(key).await {
            return admin_error(StatusCode::SERVICE_UNAVAILABLE, ErrorChain(&e));
        }
    }
    tracing::info!(key = %percent_encoded(&named), peer = %peer, "admin: key reset");
    StatusCode::NO_CONTENT.into_response()
}

/// `PUT /bans/{key}?seconds=N`: bans the key for N seconds, 1 to 86,400.
pub(crate) async fn ban_key(
    State(s): State<AdminState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let seconds = match query.get("seconds").map(|n| n.parse::<u64>()) {
        Some(Ok(n)) if (1..=86_400).contains(&n) => n,
        _ => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                "seconds is a whole number from 1 to 86400",
            )
        }
    };
    let named = named_key(&uri);
    let key = match s.keys.key(&named) {
        Ok(key) => key,
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, e),
    };
    if let Err(e) = s.limiter.ban(key, Duration::from_secs(seconds)).await {
        return admin_error(StatusCode::SERVICE_UNAVAILABLE, ErrorChain(&e));
    }
    tracing::info!(key = %percent_encoded(&named), seconds, peer = %peer, "admin: key banned");
    StatusCode::NO_CONTENT.into_response()
}

/// `DELETE /bans/{key}`: lifts the key's ban.
pub(crate) async fn unban_key(
    State(s): State<AdminState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    uri: Uri,
) -> Response {
    let named = named_key(&uri);
    let key = match s.keys.key(&named) {
        Ok(key) => key,
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, e),
    };
    if let Err(e) = s.limiter.unban(key).await {
        return admin_error(StatusCode::SERVICE_UNAVAILABLE, ErrorChain(&e));
    }
    tracing::info!(key = %percent_encoded(&named), peer = %peer, "admin: ban lifted");
    StatusCode::NO_CONTENT.into_response()
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

/// `GET /top?n=N`: the instance's most denied keys, as JSON; `n` from 1 to 10,000 (default
/// 10), anything else 400.
/// `GET /top?n=N&scope=instance|fleet`: the keys denied most, by this gateway (the default)
/// or by every gateway sharing the store (`fleet`: what each published in the last 10 s,
/// summed; 503 when the store cannot be read).
pub(crate) async fn top(
    limiter: &RateLimiter<Arc<dyn Algorithm>>,
    n: Option<&str>,
    scope: Option<&str>,
) -> Response {
    let n = match n.map(str::parse::<usize>) {
        None => 10,
        Some(Ok(n)) if (1..=10_000).contains(&n) => n,
        Some(_) => {
            return (
                StatusCode::BAD_REQUEST,
                "n is a whole number from 1 to 10000\n",
            )
                .into_response()
        }
    };
    let counts = match scope {
        None | Some("instance") => limiter.top_keys(n),
        Some("fleet") => match limiter.fleet_top_keys(n).await {
            Ok(counts) => counts,
            Err(e) => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the fleet's top keys cannot be read: {}\n", ErrorChain(&e)),
                )
                    .into_response()
            }
        },
        Some(_) => {
            return (StatusCode::BAD_REQUEST, "scope is instance or fleet\n").into_response()
        }
    };
    let items: Vec<serde_json::Value> = counts
        .into_iter()
        .map(|c| {
            let (key, encoding) = match &c.bytes {
                Some(bytes) => shown_key(bytes),
                None => (c.key.clone(), "utf8"),
            };
            let more = if c.cut { "…" } else { "" };
            serde_json::json!({
                "key": format!("{key}{more}"),
                "encoding": encoding,
                "policy": &*c.policy,
                "denied": c.denied,
                "would_deny": c.would_deny,
            })
        })
        .collect();
    axum::Json(items).into_response()
}

/// `GET /limits`: the limits in force, as JSON: `generation` (the reloads put in force since
/// the start) and one entry per policy: the default one, then each plan as `plan:KEY` (the
/// key as `/top` shows keys), sorted by key.
async fn limits(State(s): State<AdminState>) -> Response {
    let (quota, shadow, mut plans) = match &s.quotas {
        Quotas::Live(live) => {
            let limits = live.limits();
            let plans: Vec<(Vec<u8>, Quota)> =
                limits.plans().map(|(k, q)| (k.to_vec(), q)).collect();
            (limits.quota(), limits.is_shadow(), plans)
        }
        Quotas::Plans(plans) => (
            s.quota,
            s.limiter.is_shadow(),
            plans.iter().map(|(k, q)| (k.clone(), *q)).collect(),
        ),
        Quotas::Own => (s.quota, s.limiter.is_shadow(), Vec::new()),
    };
    plans.sort_by(|a, b| a.0.cmp(&b.0));
    let windowed = matches!(s.algorithm.as_str(), "sliding-window" | "fixed-window");
    let entry = |policy: String, quota: Quota| {
        serde_json::json!({
            "policy": policy,
            "algorithm": s.algorithm,
            "limit": quota.limit(),
            "per_ms": quota.period().as_millis() as u64,
            "burst": if windowed { quota.limit() } else { quota.burst_size() },
            "shadow": shadow,
        })
    };
    let mut policies = vec![entry(s.limiter.policy_name().to_owned(), quota)];
    for (key, quota) in plans {
        policies.push(entry(format!("plan:{}", percent_encoded(&key)), quota));
    }
    axum::Json(serde_json::json!({
        "generation": GENERATION.load(std::sync::atomic::Ordering::Relaxed),
        "policies": policies,
    }))
    .into_response()
}
