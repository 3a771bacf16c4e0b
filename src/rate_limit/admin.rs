//! The operators' console as an axum router (feature `admin`): mount it next to an app's own
//! routes, on a listener of its own, and every instance answers the same routes.
//!
//! | route | answers |
//! |---|---|
//! | `GET /metrics` | the text a metrics recorder renders ([`Admin::metrics`]), `text/plain; version=0.0.4`; 404 without one |
//! | `GET /top?n=N&scope=instance\|fleet` | the keys denied most, as JSON `[{"key", "encoding", "policy", "denied", "would_deny"}]`: this instance's ([`RateLimiter::top_keys`]), or the fleet's ([`RateLimiter::fleet_top_keys`]); `n` 1 to 10,000 (default 10) |
//! | `GET /keys/{key}?policy=NAME` | the key's state, spending nothing: `{"key", "encoding", "policy", "limit", "remaining", "reset_ms", "banned_ms"}` |
//! | `DELETE /keys/{key}?policy=NAME` | 204: forgets what the key spent (not its ban) and frees its concurrency slots |
//! | `PUT /bans/{key}?seconds=N&policy=NAME` | 204: bans the key for N seconds, 1 to 86,400 |
//! | `DELETE /bans/{key}?policy=NAME` | 204: lifts the key's ban |
//! | `GET /limits` | the limits in force: `{"generation", "policies": [{"policy", "algorithm", "limit", "per_ms", "burst", "shadow"}]}`, each plan a policy named `plan:KEY` |
//! | `GET /healthz` | `200 ok` while the store answers a read within the store timeout, else `503` and the reason on one line |
//! | `GET /region` | with [`Admin::region`], the region's state as JSON; else 404 |
//!
//! With [`Admin::policies`], the console steers more limiters than its own (the rules of an
//! [`RlsService`](crate::rate_limit::rls::RlsService), each a policy): `/keys/{key}` and
//! `/bans/{key}` name one with `?policy=NAME` (without it, or with the console's own
//! policy, its own limiter: 404 for a policy it does not know), `/top` lists the keys of
//! every policy together (highest count first), and `/limits` lists each policy.
//!
//! `{key}` is the key's bytes as the key extractor produces them, percent-encoded (`%FF` is
//! the byte 0xFF): any key can be named, and `/top` names keys the same way (text as is when it
//! is UTF-8, `"encoding": "utf8"`; else percent-encoded, `"encoding": "percent"`). With
//! [`Admin::ip_keys`], a key is an address (an IPv6 address taken to its network) or a network
//! `ADDRESS/BITS`, as [`ClientIp`](crate::ClientIp) keys clients. A key that names none is 400;
//! a store that fails, 503 with the reason. Each change (a reset, a ban, an unban) is logged
//! at `info` with the key's digest (`key_sha1`: a key can be a credential) and the caller's
//! address when the server gives it (axum's `ConnectInfo`), and at `trace` with the key
//! percent-encoded.
//!
//! With [`Admin::token`], every route wants `Authorization: Bearer TOKEN` (401 otherwise),
//! compared in constant time. Without one, bind the router's listener to a loopback or private
//! address: it names keys, and it can ban and reset them.
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{rate_limit::admin::Admin, Gcra, MemoryStore, Quota, RateLimiter};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let quota = Quota::per_second(10);
//! let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(quota)?)?;
//! let console: axum::Router = Admin::new(limiter.clone())
//!     .quota(quota)
//!     .token("s3cret-token")?
//!     .router();
//! // `axum::serve(admin_listener, console)` beside the app's own listener.
//! # let _ = console;
//! # Ok(()) }
//! ```

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use axum::{
    extract::{ConnectInfo, Query, State},
    http::{header, Extensions, StatusCode, Uri},
    response::{IntoResponse, Response},
    routing::{get, put},
    Router,
};

use crate::{
    algorithm::Algorithm,
    concurrency::ConcurrencyLimiter,
    error::{ConfigError, Error, ErrorChain},
    extract::Key,
    quota::Quota,
    rate_limit::{LiveLimits, RateLimiter},
    telemetry::KeyCount,
};

/// The console's settings and the limiters it steers; [`router`](Self::router) serves them.
pub struct Admin<A> {
    limiter: RateLimiter<A>,
    concurrency: Option<ConcurrencyLimiter>,
    ip_keys: Option<u8>,
    token: Option<Arc<[u8]>>,
    metrics: Option<Arc<dyn Fn() -> String + Send + Sync>>,
    region: Option<Arc<dyn Fn() -> serde_json::Value + Send + Sync>>,
    quota: Option<Quota>,
    quotas: Quotas,
    policies: Option<Arc<dyn PolicyLimiters>>,
}

/// Limiters a console steers besides its own, found by their policy name
/// ([`RateLimiter::policy_name`]): the rules of an
/// [`RlsService`](crate::rate_limit::rls::RlsService), or any set of limiters an app runs.
/// See [`Admin::policies`].
pub trait PolicyLimiters: Send + Sync + 'static {
    /// The limiter whose policy is `policy`, if there is one.
    fn limiter(&self, policy: &str) -> Option<RateLimiter<Arc<dyn Algorithm>>>;

    /// Every limiter, for `/top` and `/limits`.
    fn limiters(&self) -> Vec<RateLimiter<Arc<dyn Algorithm>>>;
}

/// The limiter a route works on: the console's own, or another policy's.
enum Target<'a, A> {
    Own(&'a RateLimiter<A>),
    Other(RateLimiter<Arc<dyn Algorithm>>),
}

/// Where a key's quota comes from, so that a peek shows what a check would.
#[derive(Clone)]
enum Quotas {
    Own,
    Plans(Arc<HashMap<Vec<u8>, Quota>>),
    Live(LiveLimits),
}

impl<A: Algorithm> std::fmt::Debug for Admin<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("policy", &self.limiter.policy_name())
            .field("guarded", &self.token.is_some())
            .finish_non_exhaustive()
    }
}

impl<A: Algorithm + 'static> Admin<A> {
    /// A console for `limiter`: its top keys, peeks, resets and bans, its health.
    pub fn new(limiter: RateLimiter<A>) -> Self {
        Self {
            limiter,
            concurrency: None,
            ip_keys: None,
            token: None,
            metrics: None,
            region: None,
            quota: None,
            quotas: Quotas::Own,
            policies: None,
        }
    }

    /// More limiters to steer, each by its policy name (`?policy=NAME` on `/keys` and
    /// `/bans`), their keys in `/top` and their policies in `/limits`: e.g. an
    /// [`RlsService`](crate::rate_limit::rls::RlsService)'s rules, whose policy names are
    /// their paths (`edge.remote_address`) and whose keys are descriptors
    /// (`remote_address=10.0.0.1`).
    pub fn policies(mut self, limiters: impl PolicyLimiters) -> Self {
        self.policies = Some(Arc::new(limiters));
        self
    }

    /// Requires `Authorization: Bearer TOKEN` on every route.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `admin.token` unless the token is 1 to 4,096 visible ASCII
    /// characters.
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        let token = token.as_ref();
        if token.is_empty() || token.len() > 4096 || !token.iter().all(u8::is_ascii_graphic) {
            return Err(ConfigError::new(
                "admin.token",
                "must be 1 to 4096 visible ASCII characters (no spaces)",
            ));
        }
        self.token = Some(token.into());
        Ok(self)
    }

    /// `GET /metrics` answers what `render` returns, e.g. a Prometheus recorder's text
    /// (`metrics-exporter-prometheus`' `PrometheusHandle::render`).
    pub fn metrics(mut self, render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.metrics = Some(Arc::new(render));
        self
    }

    /// A reset frees the key's concurrency slots in `limiter` too.
    pub fn concurrency(mut self, limiter: ConcurrencyLimiter) -> Self {
        self.concurrency = Some(limiter);
        self
    }

    /// Keys are client addresses, as [`ClientIp`](crate::ClientIp) with this IPv6 prefix
    /// writes them: a path names an address (an IPv6 one taken to its /`ipv6_prefix`
    /// network) or a network `ADDRESS/BITS`.
    pub fn ip_keys(mut self, ipv6_prefix: u8) -> Self {
        self.ip_keys = Some(ipv6_prefix);
        self
    }

    /// `GET /region` answers what `state` returns, as JSON: a regional store's
    /// `move || store.stats()`.
    pub fn region<T: serde::Serialize>(
        mut self,
        state: impl Fn() -> T + Send + Sync + 'static,
    ) -> Self {
        self.region = Some(Arc::new(move || {
            serde_json::to_value(state()).unwrap_or(serde_json::Value::Null)
        }));
        self
    }

    /// The limiter's quota, as `GET /limits` shows it (without it, and without
    /// [`live`](Self::live), the policy is listed with its algorithm and capacity only).
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quota = Some(quota);
        self
    }

    /// Plans: keys with a quota of their own (the layer's `quota_fn` giving them), so that a
    /// peek shows the quota a check of the key gets, and `/limits` lists each.
    pub fn plans(mut self, plans: impl IntoIterator<Item = (Vec<u8>, Quota)>) -> Self {
        self.quotas = Quotas::Plans(Arc::new(plans.into_iter().collect()));
        self
    }

    /// The layer's live limits ([`RateLimitLayer::live`](crate::RateLimitLayer::live)): peeks
    /// and `/limits` follow each replacement.
    pub fn live(mut self, live: LiveLimits) -> Self {
        self.quotas = Quotas::Live(live);
        self
    }

    /// The console's routes, for any app state.
    pub fn router<S: Clone + Send + Sync + 'static>(self) -> Router<S> {
        let guard = self.token.clone();
        let state = Arc::new(self);
        Router::new()
            .route("/metrics", get(metrics::<A>))
            .route("/top", get(top::<A>))
            .route("/limits", get(limits::<A>))
            .route("/healthz", get(healthz::<A>))
            .route("/region", get(region::<A>))
            .route("/keys/{*key}", get(peek_key::<A>).delete(reset_key::<A>))
            .route("/bans/{*key}", put(ban_key::<A>).delete(unban_key::<A>))
            .layer(axum::middleware::from_fn(
                move |req: axum::extract::Request, next: axum::middleware::Next| {
                    let guard = guard.clone();
                    async move {
                        match guard {
                            Some(token) if !authorized(&req, &token) => (
                                StatusCode::UNAUTHORIZED,
                                [(header::WWW_AUTHENTICATE, "Bearer")],
                                "an admin token is required: Authorization: Bearer TOKEN\n",
                            )
                                .into_response(),
                            _ => next.run(req).await,
                        }
                    }
                },
            ))
            .with_state(state)
    }

    /// The limiter `?policy=` names and the key `named` names in it, or the answer saying
    /// why there is none (400 for a key that names none, 404 for a policy it does not know).
    #[allow(clippy::result_large_err)] // The answer to send: built once, on the way out.
    fn target(
        &self,
        query: &HashMap<String, String>,
        named: &[u8],
    ) -> Result<(Target<'_, A>, Key<'static>), Response> {
        match query.get("policy") {
            Some(policy) if policy != self.limiter.policy_name() => {
                let other = self
                    .policies
                    .as_ref()
                    .and_then(|p| p.limiter(policy))
                    .ok_or_else(|| {
                        failed(StatusCode::NOT_FOUND, format!("no policy named {policy:?}"))
                    })?;
                // Another policy's keys are its own text, not addresses.
                Ok((Target::Other(other), Key::bytes(named.to_vec())))
            }
            _ => {
                let key = self
                    .key(named)
                    .map_err(|e| failed(StatusCode::BAD_REQUEST, e))?;
                Ok((Target::Own(&self.limiter), key))
            }
        }
    }

    /// The key `named` names (an admin path's last part, percent-decoded), or why it names
    /// none.
    fn key(&self, named: &[u8]) -> Result<Key<'static>, String> {
        let Some(ipv6_prefix) = self.ip_keys else {
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

type Shared<A> = State<Arc<Admin<A>>>;

/// Whether `req` carries `Authorization: Bearer TOKEN` (the scheme in any case, as HTTP
/// says), the token compared in constant time (no timing tells how much of a guess was
/// right).
fn authorized(req: &axum::extract::Request, token: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    let Some(space) = value.iter().position(|&b| b == b' ') else {
        return false;
    };
    let (scheme, given) = (&value[..space], value[space..].trim_ascii_start());
    scheme.eq_ignore_ascii_case(b"bearer") && bool::from(given.ct_eq(token))
}

/// A call that failed: 400 for a key that names none, 503 when the store failed.
fn failed(status: StatusCode, e: impl std::fmt::Display) -> Response {
    (status, format!("{e}\n")).into_response()
}

/// The caller's address, when the server put it in the request (`ConnectInfo`).
fn caller(extensions: &Extensions) -> String {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "-".to_owned(), |c| c.0.to_string())
}

/// An operator's change, logged: at `info` with the key's digest (`key_sha1`, the first 16
/// hex digits of its SHA-1: a key can be a credential, and no line above `trace` holds one),
/// at `trace` with the key itself, percent-encoded (one line, whatever its bytes).
fn audit(named: &[u8], peer: &str, seconds: Option<u64>, what: &'static str) {
    let digest = sha1_smol::Sha1::from(named).digest().to_string();
    let key_sha1 = &digest[..16];
    match seconds {
        Some(seconds) => tracing::info!(key_sha1, seconds, peer = %peer, "{what}"),
        None => tracing::info!(key_sha1, peer = %peer, "{what}"),
    }
    tracing::trace!(key = %percent_encoded(named), key_sha1, "{what}");
}

/// The bytes an admin path names after `/keys/` or `/bans/`, percent-decoded: any bytes, so
/// that every key can be named (`%FF` is the byte 0xFF; a `%` not followed by two hex digits
/// stands for itself).
fn named_key(uri: &Uri) -> Vec<u8> {
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
pub fn percent_encoded(bytes: &[u8]) -> String {
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
fn shown_key(bytes: &[u8]) -> (String, &'static str) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_owned(), "utf8"),
        Err(_) => (percent_encoded(bytes), "percent"),
    }
}

async fn metrics<A: Algorithm + 'static>(State(s): Shared<A>) -> Response {
    match &s.metrics {
        Some(render) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            render(),
        )
            .into_response(),
        None => failed(StatusCode::NOT_FOUND, "no metrics recorder"),
    }
}

/// `GET /top?n=N&scope=instance|fleet`.
async fn top<A: Algorithm + 'static>(
    State(s): Shared<A>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let n = match query.get("n").map(|n| n.parse::<usize>()) {
        None => 10,
        Some(Ok(n)) if (1..=10_000).contains(&n) => n,
        Some(_) => {
            return failed(
                StatusCode::BAD_REQUEST,
                "n is a whole number from 1 to 10000",
            )
        }
    };
    let others = s
        .policies
        .as_ref()
        .map(|p| p.limiters())
        .unwrap_or_default();
    let mut counts = match query.get("scope").map(String::as_str) {
        None | Some("instance") => {
            let mut counts = s.limiter.top_keys(n);
            for other in &others {
                counts.extend(other.top_keys(n));
            }
            counts
        }
        Some("fleet") => {
            let fleet = async {
                let mut counts = s.limiter.fleet_top_keys(n).await?;
                for other in &others {
                    counts.extend(other.fleet_top_keys(n).await?);
                }
                Ok::<_, Error>(counts)
            };
            match fleet.await {
                Ok(counts) => counts,
                Err(e) => {
                    let why = format!("the fleet's top keys cannot be read: {}", ErrorChain(&e));
                    return failed(StatusCode::SERVICE_UNAVAILABLE, why);
                }
            }
        }
        Some(_) => return failed(StatusCode::BAD_REQUEST, "scope is instance or fleet"),
    };
    // Each policy's list is in its order already; together, by the count each was ranked by.
    counts.sort_by_key(|c| std::cmp::Reverse(c.denied.max(c.would_deny)));
    counts.truncate(n);
    let items: Vec<serde_json::Value> = counts.iter().map(shown_count).collect();
    axum::Json(items).into_response()
}

fn shown_count(c: &KeyCount) -> serde_json::Value {
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
}

/// `GET /limits`.
async fn limits<A: Algorithm + 'static>(State(s): Shared<A>) -> Response {
    let (quota, shadow, mut plans, generation) = match &s.quotas {
        Quotas::Live(live) => {
            let limits = live.limits();
            let plans: Vec<(Vec<u8>, Quota)> =
                limits.plans().map(|(k, q)| (k.to_vec(), q)).collect();
            (
                Some(limits.quota()),
                limits.is_shadow(),
                plans,
                live.generation(),
            )
        }
        Quotas::Plans(plans) => (
            s.quota,
            s.limiter.is_shadow(),
            plans.iter().map(|(k, q)| (k.clone(), *q)).collect(),
            0,
        ),
        Quotas::Own => (s.quota, s.limiter.is_shadow(), Vec::new(), 0),
    };
    plans.sort_by(|a, b| a.0.cmp(&b.0));
    let algorithm = s.limiter.algorithm().name();
    let entry = |policy: String, quota: Option<Quota>| match quota {
        Some(quota) => serde_json::json!({
            "policy": policy,
            "algorithm": algorithm,
            "limit": quota.limit(),
            "per_ms": quota.period().as_millis() as u64,
            // As the algorithm runs the quota: a window's burst is its limit.
            "burst": s.limiter.algorithm().with_quota(quota).map_or(
                u64::from(quota.burst_size()),
                |running| running.quota(),
            ),
            "shadow": shadow,
        }),
        None => serde_json::json!({
            "policy": policy,
            "algorithm": algorithm,
            "capacity": s.limiter.algorithm().quota(),
            "shadow": shadow,
        }),
    };
    let mut policies = vec![entry(s.limiter.policy_name().to_owned(), quota)];
    for (key, quota) in plans {
        policies.push(entry(
            format!("plan:{}", percent_encoded(&key)),
            Some(quota),
        ));
    }
    for other in s
        .policies
        .as_ref()
        .map(|p| p.limiters())
        .unwrap_or_default()
    {
        policies.push(serde_json::json!({
            "policy": other.policy_name(),
            "algorithm": other.algorithm().name(),
            "capacity": other.algorithm().quota(),
            "shadow": other.is_shadow(),
        }));
    }
    axum::Json(serde_json::json!({ "generation": generation, "policies": policies }))
        .into_response()
}

/// `GET /healthz`: the read is a peek of a key no request has (`#healthz`); a store that
/// cannot be read without a check (several regions) is asked a check of that key instead.
async fn healthz<A: Algorithm + 'static>(State(s): Shared<A>) -> Response {
    const PROBE: &str = "#healthz";
    let answered = match s.limiter.peek(PROBE).await {
        Err(Error::Unsupported(_)) => s.limiter.check(PROBE, 1).await.map(|_| ()),
        other => other.map(|_| ()),
    };
    match answered {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => failed(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store did not answer: {}", ErrorChain(&e)),
        ),
    }
}

/// `GET /region`.
async fn region<A: Algorithm + 'static>(State(s): Shared<A>) -> Response {
    match &s.region {
        Some(state) => axum::Json(state()).into_response(),
        None => failed(StatusCode::NOT_FOUND, "no regional store"),
    }
}

/// `GET /keys/{key}`.
async fn peek_key<A: Algorithm + 'static>(
    State(s): Shared<A>,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let named = named_key(&uri);
    let (target, key) = match s.target(&query, &named) {
        Ok(target) => target,
        Err(answer) => return answer,
    };
    let ms = |d: Duration| d.as_micros().div_ceil(1_000) as u64;
    let peeked = match (target, &s.quotas) {
        (Target::Other(other), _) => other.peek(key).await,
        (Target::Own(_), Quotas::Live(live)) => live.peek(key).await,
        (Target::Own(own), Quotas::Plans(plans)) => match plans.get(&named) {
            Some(quota) => own.peek_with_quota(key, *quota).await,
            None => own.peek(key).await,
        },
        (Target::Own(own), Quotas::Own) => own.peek(key).await,
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
        Err(e) => failed(StatusCode::SERVICE_UNAVAILABLE, ErrorChain(&e)),
    }
}

/// `DELETE /keys/{key}`.
async fn reset_key<A: Algorithm + 'static>(
    State(s): Shared<A>,
    extensions: Extensions,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let named = named_key(&uri);
    let (target, key) = match s.target(&query, &named) {
        Ok(target) => target,
        Err(answer) => return answer,
    };
    let reset = match &target {
        Target::Own(own) => own.reset(key.clone()).await,
        Target::Other(other) => other.reset(key.clone()).await,
    };
    if let Err(e) = reset {
        return failed(StatusCode::SERVICE_UNAVAILABLE, ErrorChain(&e));
    }
    if let (Target::Own(_), Some(concurrency)) = (&target, &s.concurrency) {
        if let Err(e) = concurrency.reset(key).await {
            return failed(StatusCode::SERVICE_UNAVAILABLE, ErrorChain(&e));
        }
    }
    let peer = caller(&extensions);
    audit(&named, &peer, None, "admin: key reset");
    StatusCode::NO_CONTENT.into_response()
}

/// `PUT /bans/{key}?seconds=N`.
async fn ban_key<A: Algorithm + 'static>(
    State(s): Shared<A>,
    extensions: Extensions,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let seconds = match query.get("seconds").map(|n| n.parse::<u64>()) {
        Some(Ok(n)) if (1..=86_400).contains(&n) => n,
        _ => {
            return failed(
                StatusCode::BAD_REQUEST,
                "seconds is a whole number from 1 to 86400",
            )
        }
    };
    let named = named_key(&uri);
    let (target, key) = match s.target(&query, &named) {
        Ok(target) => target,
        Err(answer) => return answer,
    };
    let banned = match target {
        Target::Own(own) => own.ban(key, Duration::from_secs(seconds)).await,
        Target::Other(other) => other.ban(key, Duration::from_secs(seconds)).await,
    };
    if let Err(e) = banned {
        return failed(StatusCode::SERVICE_UNAVAILABLE, ErrorChain(&e));
    }
    let peer = caller(&extensions);
    audit(&named, &peer, Some(seconds), "admin: key banned");
    StatusCode::NO_CONTENT.into_response()
}

/// `DELETE /bans/{key}`.
async fn unban_key<A: Algorithm + 'static>(
    State(s): Shared<A>,
    extensions: Extensions,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let named = named_key(&uri);
    let (target, key) = match s.target(&query, &named) {
        Ok(target) => target,
        Err(answer) => return answer,
    };
    let unbanned = match target {
        Target::Own(own) => own.unban(key).await,
        Target::Other(other) => other.unban(key).await,
    };
    if let Err(e) = unbanned {
        return failed(StatusCode::SERVICE_UNAVAILABLE, ErrorChain(&e));
    }
    let peer = caller(&extensions);
    audit(&named, &peer, None, "admin: ban lifted");
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_named_by_their_percent_encoded_bytes() {
        let uri: Uri = "/keys/a%2Fb%FF%zz".parse().unwrap();
        assert_eq!(named_key(&uri), b"a/b\xff%zz");
        assert_eq!(percent_encoded(b"a/b\xff:~"), "a%2Fb%FF:~");
        assert_eq!(shown_key(b"k\xff"), ("k%FF".to_owned(), "percent"));
        assert_eq!(shown_key("é".as_bytes()), ("é".to_owned(), "utf8"));
    }
}
