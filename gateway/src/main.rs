//! The gateway: an HTTP server that rate-limits every route, in front of a service
//! (`--upstream`) or, by itself, answering demo routes: `GET /` with `200 ok`,
//! `GET /status/{code}` with that status (100-599, else 400) and `GET /sleep/{ms}` with 200
//! after sleeping that long (at most 60,000 ms, else 400).
//!
//! Built from the repository's root with `cargo build --release --bin gateway` (into
//! `target/release/gateway`), run with `cargo run --bin gateway -- FLAGS`.
//!
//! ```text
//! gateway [--listen 127.0.0.1:3000] [--redis redis://HOST:PORT]
//!     [--redis-cluster redis://HOST:PORT,redis://HOST:PORT,...]
//!     [--redis-sentinel redis://HOST:PORT,redis://HOST:PORT,... --sentinel-master NAME]
//!     [--redis-ca FILE] [--redis-cert FILE --redis-key FILE] [--connect-timeout-ms N]
//!     [--lazy-connect]
//!     [--algorithm token-bucket|gcra|sliding-window|fixed-window] [--limit N] [--per 1s|60s|1m|1h]
//!     [--burst N] [--key global|ip|header:NAME] [--trusted-proxy CIDR]... [--ipv6-prefix N]
//!     [--on-redis-error open|closed|local] [--local-share N] [--timeout-ms N]
//!     [--headers ietf|legacy|both|none]
//!     [--plan KEY=N/PERIOD]... [--count-only LIST] [--concurrency N [--lease-ms M]]
//!     [--unit-lease-ms N] [--prefix P] [--log error|warn|info|debug|trace] [--shadow] [--batch]
//!     [--no-limit] [--admin-listen ADDR [--admin-token TOKEN | --admin-token-file FILE]]
//!     [--allow LIST] [--deny LIST] [--config FILE] [--check-config FILE]
//!     [--region NAME --regions NAME=URL,NAME=URL,... [--region-share F]] [--drain-ms N]
//!     [--upstream http://HOST:PORT[/PREFIX] [--upstream-timeout-ms N]]
//! gateway --help | --version
//! ```
//!
//! `--config FILE`: the limit settings in TOML, one key per flag with the flag's name
//! (dashes as underscores): `algorithm`, `limit`, `per`, `burst`, `key`, `trusted_proxy` (a
//! list), `ipv6_prefix`, `on_redis_error`, `local_share`, `timeout_ms`, `headers`, `plans` (a
//! table, `gold = "100/1m"`), `count_only`, `concurrency`, `lease_ms`, `unit_lease_ms`,
//! `shadow`, `allow` and `deny` (lists). An absent key takes the flag's default; with
//! `--config`, any of these given as a flag (in the file or not) is refused at start-up; every
//! other flag stays a flag, and is refused in the file. The file is read again on `SIGHUP` and
//! when it changes (looked at every 50 ms), once it has settled: its size, modification time
//! and inode unchanged across two looks at least 100 ms apart, so a finished file is in force
//! within 1 s of its last write or of `SIGHUP` (a writer that needs its file read whole at
//! once writes another file and renames it into place). Looks, reads and checks run off the
//! threads that serve requests. Each read gives one stderr line: `config reloaded: FILE: limit
//! QUOTA`, or `config refused: REASON`, when the file is empty, is not a regular file (a FIFO,
//! a device), is over 8 MiB, does not parse or changes a setting
//! other than `limit`, `per`, `burst`, `plans`, `shadow`, `allow` and `deny` (the
//! algorithm, the key and the rest need a restart): the running limits stay. A reload takes
//! effect for the next request, drops no connection and keeps every counter (a key's state
//! is read under the new quota, see the guide's quotas per request).
//! `--check-config FILE` prints `ok` and exits 0 when the file would start the gateway, or
//! prints the error (the line and the field, for a value that does not read and for a
//! setting that cannot work alike) on stderr and exits 1. `GET /keys/{key}` shows a key under
//! the quota its checks get: its plan's, and the limits in force after a reload.
//!
//! `--allow LIST` and `--deny LIST` (comma-separated keys, addresses and CIDRs, e.g.
//! `vip,10.0.0.0/8,2001:db8::/32`): requests whose key, or whose client address (as `--key ip`
//! finds it, `--trusted-proxy` included, whatever `--key` is), is on the allow list are served
//! without a store call and without rate-limit fields; those on the deny list get 403. Deny
//! wins over allow, allow over a ban, a ban over the limit. Not with `--concurrency`, which
//! would still count allowed keys.
//!
//! `--plan KEY=N/PERIOD` (repeatable, with `--key header:NAME`) gives requests whose key is
//! KEY a quota of N per PERIOD; other keys get `--limit`/`--per`. Each KEY has one plan; with
//! `--algorithm sliding-window` or `fixed-window`, PERIOD is `--per`'s (a window takes only
//! quotas of its own period). A plan the limiter would refuse stops the gateway at start-up.
//!
//! `--count-only LIST` (codes and classes, e.g. `401,403,5xx`): only responses whose status is
//! in LIST spend quota; the others give their units back before they are answered.
//!
//! `--concurrency N` (with `--lease-ms M`, default 30,000): at most N requests of one key in
//! flight at once across every instance sharing the store, on top of the rate limit; over it,
//! 429. A slot is held under a lease renewed while the request runs, so the slots of a
//! gateway that dies come back within M ms.
//!
//! `--unit-lease-ms N` (GCRA and token bucket): a hot key that is allowed is answered from
//! blocks of its units reserved in the store in one call, each handed out for at most N ms
//! after its reservation was sent; what is left goes back. The limit then holds in count,
//! shifted in time by at most N ms (see `UnitLease`).
//!
//! `--shadow` never rejects and changes nothing a client sees: every request is served, no
//! response gets a rate-limit field, and each over-limit request is logged ("would deny") at
//! `info`, counted (`decision="would_deny"`) and its key listed by `/top`.
//!
//! `--admin-listen ADDR` opens a second listener for operators (off by default; bind it to a
//! loopback or private address: it names keys), printed as `admin listening on http://ADDR`
//! after the `listening on` line:
//! - `GET /metrics`: the crate's metrics in the Prometheus text format, among them
//!   `ratelimit_decisions_total{policy, decision, source}` (`decision`: `allowed`, `denied`,
//!   `would_deny`, `unavailable`; `source`: `store`, `deny_cache`, `unit_lease`, `local`,
//!   `failure_policy`);
//! - `GET /top?n=N` (default 10): this instance's most denied keys since it started, as JSON,
//!   `[{"key": "...", "encoding": "utf8", "policy": "default", "denied": N, "would_deny": M},
//!   ...]` (a key that is not UTF-8 percent-encoded, with `"encoding": "percent"`), sorted by
//!   `denied + would_deny`, highest first; exact while fewer than 128 keys were denied;
//! - `GET /keys/{key}`: the key's state, spending nothing, as JSON, `{"key": "...", "policy":
//!   "default", "limit": N, "remaining": N, "reset_ms": N, "banned_ms": N}` (`remaining` and
//!   `reset_ms` as a check of cost 0 would show them; `banned_ms` 0 when not banned);
//! - `DELETE /keys/{key}` (204): forgets what the key spent (not its ban) and frees its
//!   concurrency slots; every gateway sharing the store decides it afresh within 1 s;
//! - `PUT /bans/{key}?seconds=N` (1 to 86,400, else 400; 204): every gateway sharing the store
//!   answers the key 429 with `Retry-After` until the ban ends, within 1 s;
//!   `DELETE /bans/{key}` (204) lifts it, everywhere within 1 s.
//!
//! `{key}` is the bytes the key extractor produces, percent-encoded (any bytes: a key that is
//! not UTF-8 is named as `/top` shows it): a header's value with
//! `--key header:NAME`, the client address with `--key ip` (an IPv6 client as its network,
//! `2001:db8::/64`; a whole IPv6 address is taken to its network), `global` with `--key
//! global`. `--admin-token TOKEN` or `--admin-token-file FILE` (the token on the file's first
//! line, out of sight of `ps`): every admin request needs `Authorization: Bearer TOKEN` (the
//! scheme in any case), else 401; one of them is required when `--admin-listen` is not a
//! loopback address. Each change is logged once at `info` (`admin:` what, the key
//! percent-encoded so that no byte of it can write a line of its own, the peer's address).
//! The admin listener never shares the public one: without `--admin-listen`, none of this is
//! reachable. Each listener closes a connection whose request headers take over 10 s and
//! holds at most 512 (public) or 64 (admin) connections at once (more wait in the kernel's
//! queue), so a flood of idle connections on one cannot take the process's descriptors.
//! `--allow` and `--deny` entries are read as bytes (a key that is not UTF-8 can be listed).
//!
//! `--region NAME --regions NAME=URL,NAME=URL,...` (several regions, see the guide's chapter
//! "Several regions"): one limit per key across regions, each gateway deciding against its own
//! region's Redis (NAME's URL) and reaching the others only in the background. Every region's
//! Redis is listed, in the same order on every gateway; the first is the home, which keeps the
//! exact algorithm and grants the regions blocks of units. `--regions` replaces `--redis`
//! (both, or `--redis-cluster`/`--redis-sentinel`, are refused). `--region-share F` (0 < F ≤ 1,
//! default 1/the number of regions): the share of each key's limit a region decides from while
//! it cannot reach the others (logged, and the gauge `ratelimit_region_cut_off{region}` on
//! `/metrics`). Refused with `--regions`, as they do not work across regions yet:
//! `--algorithm sliding-window` and `fixed-window` (GCRA and the token bucket only), `--unit-lease-ms` (the
//! region's pool is a lease already), `--count-only` (refunds), `--concurrency`, `--batch`.
//! Not used across regions: the deny cache (a region's denial is not final, a refill may come).
//! Per region, not global: `--allow`/`--deny` (per gateway, as always). The admin listener's
//! `/keys` and `/bans` answer 503 (peeks, resets and bans are not supported across regions);
//! `GET /region` answers this region's state as JSON (`{"region", "home", "cut_off", "cuts",
//! "grants", "units_granted", "units_charged", "failed_grants"}`).
//!
//! `rediss://` URLs use TLS (the system's roots, or `--redis-ca`). Without `--lazy-connect`, a
//! gateway that cannot connect, authenticate or verify Redis exits non-zero within the connect
//! timeout, with one line on stderr naming the cause, before it listens.
//!
//! Every flag, with its default:
//!
//! - `--listen ADDR` (`127.0.0.1:3000`): where to serve.
//! - `--redis URL`: one Redis server (`redis://`, `rediss://` for TLS, `redis+unix://`;
//!   passwords and ACL users in the URL). `--redis-cluster URL,URL,...`: a Redis Cluster
//!   through any of its nodes. `--redis-sentinel URL,URL,... --sentinel-master NAME`: the
//!   primary the Sentinels name for NAME. Without any of them, the in-memory store.
//! - `--redis-ca FILE`: trust this CA instead of the system's roots (with any of the three);
//!   `--redis-cert FILE --redis-key FILE`: mutual TLS. `--connect-timeout-ms N` (3,000): the
//!   bound on each connection attempt. `--lazy-connect`: start without Redis (not with
//!   `--redis-cluster`); the failure policy answers until Redis does.
//! - `--algorithm gcra|token-bucket|sliding-window|fixed-window` (`gcra`), `--limit N` (10) and `--per
//!   DURATION` (`1s`; `ms`, `s`, `m`, `h`, `d`): N requests per DURATION (for the buckets:
//!   capacity N, refilled at N per DURATION); `--burst N`: another capacity.
//! - `--key ip|global|header:NAME` (`ip`): per client address, one key for everybody, or
//!   per value of a header. `--trusted-proxy CIDR` (repeatable): read `X-Forwarded-For`
//!   from these proxies. `--ipv6-prefix N` (64): IPv6 clients grouped by their /N.
//! - `--on-redis-error open|closed|local` (`open`), `--local-share N` (1): the failure
//!   policy, and the number of instances a `local` limit is divided among.
//!   `--timeout-ms N` (100): the store timeout.
//! - `--headers ietf|legacy|both|none` (`ietf`): which rate-limit headers to send.
//! - `--prefix P` (`gateway`): the first part of every Redis key.
//! - `--log LEVEL` (`info`): the log level.
//! - `--batch`: exact batching of Redis calls. `--no-limit`: serve without the layer (to
//!   measure its overhead).
//! - `--upstream http://HOST:PORT[/PREFIX]`: stand in front of a service. Every request the
//!   limiter lets through goes to the upstream with its method, its path and query byte for
//!   byte (after PREFIX), its headers (hop-by-hop ones dropped, `x-forwarded-for` appended with
//!   the client's address) and its body (its `content-length` kept), streamed both ways over
//!   pooled connections; the upstream's status, headers and body come back with the
//!   rate-limit fields added, and `--count-only` reads the upstream's status. A refused
//!   request never reaches the upstream. An upstream that cannot be reached answers 502; one
//!   whose response headers take longer than `--upstream-timeout-ms N` (30,000), 504. Printed
//!   at start-up as `upstream: http://HOST:PORT[/PREFIX]`. Without `--upstream`, the demo routes.
//! - `--drain-ms N` (10,000): on `SIGTERM` or `SIGINT`, the gateway stops accepting, lets the
//!   requests in flight finish (their concurrency slots go back as each ends) for at most N ms,
//!   and exits 0.
//! - `--help` prints the usage on stdout and exits 0; `--version` prints `gateway VERSION`.
//!
//! `SIGHUP` reloads `--config`'s file; without `--config` it is logged (at most once a
//! second) and ignored, so that a fleet-wide reload signal leaves the other gateways running.
//!
//! `GET /status/{code}` answers with that status; an informational 1xx other than 101 cannot
//! end an HTTP response, and hyper answers it with 500.
//!
//! Without `--redis` it uses the in-memory store. Try it:
//! `for i in $(seq 12); do curl -si 127.0.0.1:3000/ | head -1; done`.

mod proxy;

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    os::unix::ffi::OsStrExt,
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

use axum::{
    extract::{ConnectInfo, Path, Query, State},
    http::{StatusCode, Uri},
    response::{IntoResponse, Response},
    routing::{get, put},
    Router,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tower_redis_ratelimit::{
    algorithm::Algorithm,
    concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter},
    extract::Key,
    rate_limit::{
        file::{self, from_toml, FileError, FileWatch, Look},
        AccessList, HeaderStyle, Limits, LiveLimits, StatusSet, UnitLease,
    },
    store::redis::{Batching, RegionalStore},
    store::{SlotStore, Store},
    ClientIp, ConfigError, FailurePolicy, FixedWindow, Gcra, GlobalKey, HeaderKey, KeyExtractor,
    MemoryStore, Quota, RateLimitLayer, RateLimiter, RedisStore, SlidingWindow, TokenBucket,
};

const USAGE: &str = "usage: gateway [--listen ADDR] [--redis URL] [--redis-cluster URL,URL,...] \
[--redis-sentinel URL,URL,... --sentinel-master NAME] [--redis-ca FILE] \
[--redis-cert FILE --redis-key FILE] [--connect-timeout-ms N] [--lazy-connect] \
[--algorithm token-bucket|gcra|sliding-window|fixed-window] [--limit N] [--per DURATION] [--burst N] \
[--key global|ip|header:NAME] [--trusted-proxy CIDR]... [--ipv6-prefix 1-128] \
[--on-redis-error open|closed|local] [--local-share N] [--timeout-ms N] \
[--headers ietf|legacy|both|none] [--plan KEY=N/PERIOD]... [--count-only LIST] \
[--concurrency N [--lease-ms M]] [--unit-lease-ms N] [--prefix P] [--log LEVEL] [--shadow] \
[--batch] [--no-limit] [--admin-listen ADDR [--admin-token TOKEN | --admin-token-file FILE]] \
[--allow LIST] [--deny LIST] [--config FILE] [--check-config FILE] \
[--region NAME --regions NAME=URL,NAME=URL,... [--region-share F]] [--drain-ms N] \
[--upstream http://HOST:PORT[/PREFIX] [--upstream-timeout-ms N]]
       gateway --help | --version";

/// `--lease-ms` when not given.
const DEFAULT_LEASE: Duration = Duration::from_secs(30);

#[derive(Clone)]
struct Args {
    listen: SocketAddr,
    redis: Option<String>,
    redis_cluster: Option<Vec<String>>,
    redis_sentinel: Option<Vec<String>>,
    sentinel_master: Option<String>,
    redis_ca: Option<String>,
    redis_cert: Option<String>,
    redis_key: Option<String>,
    connect_timeout: Duration,
    lazy_connect: bool,
    algorithm: String,
    limit: u32,
    per: Duration,
    burst: Option<u32>,
    key: String,
    trusted: Vec<String>,
    /// `--key ip` keys IPv6 clients by this network prefix.
    ipv6_prefix: u8,
    on_error: FailurePolicy,
    local_share: u32,
    timeout: Duration,
    /// How long requests in flight may take to finish once a stop is asked for.
    drain: Duration,
    headers: HeaderStyle,
    prefix: String,
    log: tracing::Level,
    /// Serve without the limiter (to measure its overhead).
    no_limit: bool,
    /// Exact batching of concurrent checks (`RedisStore::with_batching`).
    batch: bool,
    /// Shadow mode: decide and report, never reject.
    shadow: bool,
    /// `--plan KEY=N/PERIOD`: a quota per key, with the flag's value as given.
    plans: Vec<(String, Quota, String)>,
    /// `--count-only LIST`: the statuses that spend quota.
    count_only: Option<StatusSet>,
    /// `--concurrency N`: at most N requests of a key in flight.
    concurrency: Option<u32>,
    /// `--lease-ms M`: the lease of a concurrency slot.
    lease: Option<Duration>,
    /// `--unit-lease-ms N`: unit leases for hot allowed keys, handed out for at most N ms.
    unit_lease: Option<Duration>,
    /// `--admin-listen ADDR`: the operators' listener (`/metrics`, `/top`, `/keys`, `/bans`).
    admin_listen: Option<SocketAddr>,
    /// `--admin-token TOKEN`: what admin requests must carry.
    admin_token: Option<String>,
    /// `--admin-token-file FILE`: the same, read from a file.
    admin_token_file: Option<String>,
    /// `--allow LIST`: keys and networks never limited.
    allow: Option<AccessList>,
    /// `--deny LIST`: keys and networks always refused.
    deny: Option<AccessList>,
    /// `--config FILE`: the limit settings, reloaded while the gateway runs.
    config: Option<String>,
    /// `--check-config FILE`: check the file and exit.
    check_config: Option<String>,
    /// `--region NAME`: this gateway's region.
    region: Option<String>,
    /// `--regions NAME=URL,...`: every region's Redis, the home first.
    regions: Option<Vec<(String, String)>>,
    /// `--region-share F`: the share of each limit a region uses while cut off.
    region_share: Option<f64>,
    /// `--upstream`: where requests go; `None`, the demo routes.
    upstream: Option<proxy::Upstream>,
    /// How long the upstream has to answer with its headers.
    upstream_timeout: Duration,
    /// The flags given on the command line (the file may not give them again).
    given: Vec<String>,
}

fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..split].parse().ok()?;
    let unit = match &s[split..] {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    Some(Duration::from_millis(n.checked_mul(unit)?))
}

/// Redis URLs as printed (stdout, stderr): each with `***` in place of its password.
fn shown(urls: &[String]) -> String {
    urls.iter()
        .map(|url| RedisStore::redact_url(url))
        .collect::<Vec<_>>()
        .join(",")
}

fn url_list(value: &str) -> Option<Vec<String>> {
    let urls: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    (!urls.is_empty()).then_some(urls)
}

/// Why the arguments stop the gateway before it starts.
enum Stop {
    /// `--help`: the usage, on stdout, exit 0.
    Help,
    /// `--version`: the version, on stdout, exit 0.
    Version,
    /// A refusal: the reason (none for a bare usage), then the usage on stderr, exit 2.
    Refused(String),
}

impl From<String> for Stop {
    fn from(reason: String) -> Self {
        Stop::Refused(reason)
    }
}

fn parse_args() -> Result<Args, Stop> {
    let mut a = Args {
        listen: "127.0.0.1:3000".parse().unwrap(),
        redis: None,
        redis_cluster: None,
        redis_sentinel: None,
        sentinel_master: None,
        redis_ca: None,
        redis_cert: None,
        redis_key: None,
        connect_timeout: tower_redis_ratelimit::store::redis::DEFAULT_CONNECT_TIMEOUT,
        lazy_connect: false,
        algorithm: "gcra".into(),
        limit: 10,
        per: Duration::from_secs(1),
        burst: None,
        key: "ip".into(),
        trusted: Vec::new(),
        ipv6_prefix: 64,
        on_error: FailurePolicy::Open,
        local_share: 1,
        timeout: Duration::from_millis(100),
        drain: Duration::from_secs(10),
        headers: HeaderStyle::Ietf,
        prefix: "gateway".into(),
        log: tracing::Level::INFO,
        no_limit: false,
        batch: false,
        shadow: false,
        plans: Vec::new(),
        count_only: None,
        concurrency: None,
        lease: None,
        unit_lease: None,
        admin_listen: None,
        admin_token: None,
        admin_token_file: None,
        allow: None,
        deny: None,
        config: None,
        check_config: None,
        region: None,
        regions: None,
        region_share: None,
        upstream: None,
        upstream_timeout: Duration::from_secs(30),
        given: Vec::new(),
    };
    // Arguments as the OS gives them: any bytes, never a panic. A list (`--allow`,
    // `--deny`) is read as bytes, so that it can name a key that is not UTF-8; every other
    // value is text.
    let mut it = std::env::args_os().skip(1);
    while let Some(flag) = it.next() {
        let Some(flag) = flag.to_str().map(str::to_owned) else {
            return Err(format!("unknown flag {}", flag.to_string_lossy()).into());
        };
        if flag == "--help" || flag == "-h" {
            return Err(Stop::Help);
        }
        if flag == "--version" || flag == "-V" {
            return Err(Stop::Version);
        }
        let value = if BOOLEAN_FLAGS.contains(&flag.as_str()) {
            None
        } else if VALUE_FLAGS.contains(&flag.as_str()) {
            Some(it.next().ok_or_else(|| format!("{flag} needs a value"))?)
        } else {
            return Err(format!("unknown flag {flag}").into());
        };
        a.given.push(flag.clone());
        match value {
            Some(list) if flag == "--allow" || flag == "--deny" => {
                apply_list(&mut a, &flag, list.as_bytes())?
            }
            Some(value) => {
                let value = value.into_string().map_err(|value| {
                    format!("{flag}: {:?} is not UTF-8", value.to_string_lossy())
                })?;
                apply_flag(&mut a, &flag, Some(value))?
            }
            None => apply_flag(&mut a, &flag, None)?,
        }
    }
    Ok(a)
}

/// Sets `--allow` or `--deny` (`flag`) from `value`: comma-separated entries of any bytes
/// (see `AccessList::entry_bytes`).
fn apply_list(a: &mut Args, flag: &str, value: &[u8]) -> Result<(), String> {
    let list = value
        .split(|&b| b == b',')
        .try_fold(AccessList::new(), |list, entry| list.entry_bytes(entry))
        .map_err(|e| format!("{flag} {}: {e}", String::from_utf8_lossy(value)))?;
    match flag {
        "--allow" => a.allow = Some(list),
        _ => a.deny = Some(list),
    }
    Ok(())
}

/// The flags that take no value.
const BOOLEAN_FLAGS: &[&str] = &["--no-limit", "--batch", "--shadow", "--lazy-connect"];

/// The flags that take a value.
const VALUE_FLAGS: &[&str] = &[
    "--listen",
    "--redis",
    "--redis-cluster",
    "--redis-sentinel",
    "--sentinel-master",
    "--redis-ca",
    "--redis-cert",
    "--redis-key",
    "--connect-timeout-ms",
    "--drain-ms",
    "--algorithm",
    "--limit",
    "--per",
    "--burst",
    "--key",
    "--trusted-proxy",
    "--ipv6-prefix",
    "--on-redis-error",
    "--local-share",
    "--timeout-ms",
    "--headers",
    "--prefix",
    "--log",
    "--plan",
    "--count-only",
    "--concurrency",
    "--lease-ms",
    "--unit-lease-ms",
    "--admin-listen",
    "--admin-token",
    "--admin-token-file",
    "--allow",
    "--deny",
    "--config",
    "--check-config",
    "--region",
    "--regions",
    "--region-share",
    "--upstream",
    "--upstream-timeout-ms",
];

/// Sets what `flag` (with `value`, `None` for a flag without one) says in `a`.
fn apply_flag(a: &mut Args, flag: &str, value: Option<String>) -> Result<(), String> {
    let Some(value) = value else {
        match flag {
            "--no-limit" => a.no_limit = true,
            "--batch" => a.batch = true,
            "--shadow" => a.shadow = true,
            "--lazy-connect" => a.lazy_connect = true,
            _ => unreachable!("checked against BOOLEAN_FLAGS"),
        }
        return Ok(());
    };
    let bad = |what: &str| format!("{flag}: {value:?} is not {what}");
    match flag {
        "--listen" => {
            a.listen = value
                .parse()
                .map_err(|_| bad("an address like 127.0.0.1:3000"))?
        }
        "--admin-listen" => {
            a.admin_listen = Some(
                value
                    .parse()
                    .map_err(|_| bad("an address like 127.0.0.1:9000"))?,
            )
        }
        "--allow" | "--deny" => apply_list(a, flag, value.as_bytes())?,
        "--config" => a.config = Some(value),
        "--check-config" => a.check_config = Some(value),
        "--admin-token" => a.admin_token = Some(value),
        "--admin-token-file" => a.admin_token_file = Some(value),
        "--redis" => a.redis = Some(value),
        "--redis-cluster" => {
            a.redis_cluster =
                Some(url_list(&value).ok_or_else(|| bad("a comma-separated list of node URLs"))?)
        }
        "--redis-sentinel" => {
            a.redis_sentinel = Some(
                url_list(&value).ok_or_else(|| bad("a comma-separated list of Sentinel URLs"))?,
            )
        }
        "--sentinel-master" => a.sentinel_master = Some(value),
        "--redis-ca" => a.redis_ca = Some(value),
        "--redis-cert" => a.redis_cert = Some(value),
        "--redis-key" => a.redis_key = Some(value),
        "--connect-timeout-ms" => {
            a.connect_timeout = Duration::from_millis(
                value
                    .parse()
                    .ok()
                    .filter(|&n: &u64| n > 0)
                    .ok_or_else(|| bad("a whole number of milliseconds, at least 1"))?,
            )
        }
        "--algorithm" => match value.as_str() {
            "token-bucket" | "gcra" | "sliding-window" | "fixed-window" => a.algorithm = value,
            _ => return Err(bad("token-bucket, gcra, sliding-window or fixed-window")),
        },
        "--limit" => a.limit = value.parse().map_err(|_| bad("a whole number"))?,
        "--per" => {
            a.per = parse_duration(&value).ok_or_else(|| bad("a duration like 1s, 60s, 1m, 1h"))?
        }
        "--burst" => a.burst = Some(value.parse().map_err(|_| bad("a whole number"))?),
        "--key" => match value.as_str() {
            "global" | "ip" => a.key = value,
            v if v.starts_with("header:") && v.len() > 7 => a.key = value,
            _ => return Err(bad("global, ip or header:NAME")),
        },
        "--trusted-proxy" => a.trusted.push(value),
        "--ipv6-prefix" => {
            a.ipv6_prefix = value
                .parse()
                .ok()
                .filter(|n| (1..=128).contains(n))
                .ok_or_else(|| bad("a prefix length from 1 to 128"))?
        }
        "--on-redis-error" => {
            a.on_error = match value.as_str() {
                "open" => FailurePolicy::Open,
                "closed" => FailurePolicy::Closed,
                "local" => FailurePolicy::Local,
                _ => return Err(bad("open, closed or local")),
            }
        }
        "--local-share" => {
            a.local_share = value
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| bad("a whole number of instances, at least 1"))?
        }
        "--timeout-ms" => {
            a.timeout = Duration::from_millis(value.parse().map_err(|_| bad("a whole number"))?)
        }
        "--drain-ms" => {
            a.drain = Duration::from_millis(value.parse().map_err(|_| bad("a whole number"))?)
        }
        "--headers" => {
            a.headers = match value.as_str() {
                "ietf" => HeaderStyle::Ietf,
                "legacy" => HeaderStyle::Legacy,
                "both" => HeaderStyle::Both,
                "none" => HeaderStyle::None,
                _ => return Err(bad("ietf, legacy, both or none")),
            }
        }
        "--prefix" => a.prefix = value,
        "--plan" => {
            let plan = value.rsplit_once('=').and_then(|(key, quota)| {
                let (n, per) = quota.split_once('/')?;
                let quota = Quota::new(n.parse().ok()?, parse_duration(per)?);
                (!key.is_empty()).then(|| (key.to_owned(), quota, value.clone()))
            });
            a.plans
                .push(plan.ok_or_else(|| bad("KEY=N/PERIOD, e.g. gold=100/1m"))?);
        }
        "--count-only" => {
            let set: StatusSet = value.parse().map_err(|e| format!("--count-only: {e}"))?;
            a.count_only = Some(set);
        }
        "--concurrency" => {
            a.concurrency = Some(
                value
                    .parse()
                    .ok()
                    .filter(|&n: &u32| n > 0)
                    .ok_or_else(|| bad("a whole number of requests, at least 1"))?,
            )
        }
        "--lease-ms" => {
            a.lease = Some(Duration::from_millis(
                value
                    .parse()
                    .map_err(|_| bad("a whole number of milliseconds"))?,
            ))
        }
        "--unit-lease-ms" => {
            a.unit_lease = Some(Duration::from_millis(
                value
                    .parse()
                    .map_err(|_| bad("a whole number of milliseconds"))?,
            ))
        }
        "--log" => a.log = value.parse().map_err(|_| bad("a log level"))?,
        "--region" => a.region = Some(value),
        "--regions" => {
            let regions: Option<Vec<(String, String)>> = url_list(&value).and_then(|list| {
                list.iter()
                    .map(|item| {
                        let (name, url) = item.split_once('=')?;
                        (!name.is_empty() && !url.is_empty())
                            .then(|| (name.to_owned(), url.to_owned()))
                    })
                    .collect()
            });
            a.regions = Some(regions.ok_or_else(|| bad("a list NAME=URL,NAME=URL,..."))?);
        }
        "--upstream" => {
            a.upstream =
                Some(proxy::Upstream::parse(&value).map_err(|e| format!("--upstream {e}"))?)
        }
        "--upstream-timeout-ms" => {
            a.upstream_timeout = value
                .parse()
                .ok()
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis)
                .ok_or_else(|| bad("a whole number of milliseconds, at least 1"))?
        }
        "--region-share" => {
            a.region_share = Some(
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite() && *f > 0.0 && *f <= 1.0)
                    .ok_or_else(|| bad("a decimal F with 0 < F <= 1"))?,
            )
        }
        _ => unreachable!("checked against VALUE_FLAGS"),
    }
    Ok(())
}

/// The keys of a `--config` file: the limit settings' flags, dashes as underscores.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFlags {
    algorithm: Option<String>,
    limit: Option<u32>,
    per: Option<String>,
    burst: Option<u32>,
    key: Option<String>,
    trusted_proxy: Option<Vec<String>>,
    ipv6_prefix: Option<u8>,
    on_redis_error: Option<String>,
    local_share: Option<u32>,
    timeout_ms: Option<u64>,
    headers: Option<String>,
    plans: Option<std::collections::BTreeMap<String, String>>,
    count_only: Option<String>,
    concurrency: Option<u32>,
    lease_ms: Option<u64>,
    unit_lease_ms: Option<u64>,
    shadow: Option<bool>,
    allow: Option<Vec<String>>,
    deny: Option<Vec<String>>,
}

/// The keys of a `--config` file (the fields of [`FileFlags`]), in the order of the flags.
const FILE_KEYS: &[&str] = &[
    "algorithm",
    "limit",
    "per",
    "burst",
    "key",
    "trusted_proxy",
    "ipv6_prefix",
    "on_redis_error",
    "local_share",
    "timeout_ms",
    "headers",
    "plans",
    "count_only",
    "concurrency",
    "lease_ms",
    "unit_lease_ms",
    "shadow",
    "allow",
    "deny",
];

/// The command-line flag of a file key (`plans` is the file's name for `--plan`).
fn flag_of(key: &str) -> String {
    match key {
        "plans" => "--plan".to_owned(),
        key => format!("--{}", key.replace('_', "-")),
    }
}

/// Flags that stay flags: refused in a file, with a word on where they go.
const NOT_IN_FILE: &[&str] = &[
    "listen",
    "admin_listen",
    "admin_token",
    "admin_token_file",
    "redis",
    "redis_cluster",
    "redis_sentinel",
    "sentinel_master",
    "redis_ca",
    "redis_cert",
    "redis_key",
    "connect_timeout_ms",
    "lazy_connect",
    "prefix",
    "log",
    "batch",
    "no_limit",
    "config",
    "check_config",
    "region",
    "regions",
    "region_share",
];

/// The settings of `base` (the command line) with those of the file at `path`: every error
/// names the file, and the line and the field; a flag given on the command line and in the
/// file is refused.
fn with_file(base: &Args, path: &str) -> Result<Args, String> {
    let text = file::read(path).map_err(|e| format!("--config {path}: {e}"))?;
    with_text(base, path, &text)
}

/// [`with_file`], the file's text read already.
fn with_text(base: &Args, path: &str, text: &str) -> Result<Args, String> {
    let text = text.to_owned();
    let in_file = |e: FileError| format!("--config {path}: {e}");
    let file: FileFlags = from_toml(&text).map_err(|mut e| {
        if let Some(field) = e.field().filter(|f| NOT_IN_FILE.contains(f)) {
            let flag = format!("--{}", field.replace('_', "-"));
            e = FileError::field_error(
                &text,
                field,
                format!("{flag} stays a flag: give it on the command line"),
            );
        }
        in_file(e)
    })?;
    // (the file key, the field an error names: `plans.KEY` for a plan, the value)
    let mut pairs: Vec<(&str, String, Option<String>)> = Vec::new();
    let mut put =
        |key: &'static str, value: Option<String>| pairs.push((key, key.to_owned(), value));
    // The fields that are one flag's value as written.
    macro_rules! put_values {
        ($($field:ident),*) => {$(
            if let Some(v) = &file.$field {
                put(stringify!($field), Some(v.to_string()));
            }
        )*};
    }
    put_values!(algorithm, limit, per, burst, key);
    for v in file.trusted_proxy.iter().flatten() {
        put("trusted_proxy", Some(v.to_string()));
    }
    put_values!(
        ipv6_prefix,
        on_redis_error,
        local_share,
        timeout_ms,
        headers
    );
    put_values!(count_only, concurrency, lease_ms, unit_lease_ms);
    if file.shadow == Some(true) {
        put("shadow", None);
    }
    if let Some(v) = &file.allow {
        put("allow", Some(v.join(",")));
    }
    if let Some(v) = &file.deny {
        put("deny", Some(v.join(",")));
    }
    for (k, v) in file.plans.iter().flatten() {
        pairs.push(("plans", format!("plans.{k}"), Some(format!("{k}={v}"))));
    }
    let mut a = base.clone();
    for (key, field, value) in pairs {
        let flag = flag_of(key);
        if base.given.contains(&flag) {
            return Err(in_file(FileError::field_error(
                &text,
                key,
                format!("{flag} is given on the command line too: give it in one place"),
            )));
        }
        apply_flag(&mut a, &flag, value).map_err(|e| {
            // The flag's own message, without the flag's name: the field says which.
            let e = e
                .strip_prefix(&format!("{flag}: "))
                .map_or(e.clone(), str::to_owned);
            in_file(FileError::field_error(&text, &field, e))
        })?;
    }
    // A limit setting is the file's alone, whether the file gives it or takes its default.
    if let Some(flag) = FILE_KEYS
        .iter()
        .map(|key| (key, flag_of(key)))
        .find(|(_, flag)| base.given.contains(flag))
    {
        let (key, flag) = flag;
        return Err(format!(
            "--config {path}: {flag} is a limit setting: with --config, give it in the file (`{key}`), not on the command line"
        ));
    }
    // What cannot work, named by its line and field.
    check(&a).map_err(|r| match &r.field {
        Some(field) => in_file(FileError::field_error(&text, field, r.message)),
        None => format!("--config {path}: {}", r.message),
    })?;
    Ok(a)
}

/// The settings a reload may change: those of [`Limits`]. The others (the algorithm, the key
/// and the rest) need a restart.
fn fixed(a: &Args) -> [(&'static str, String); 12] {
    [
        ("algorithm", a.algorithm.clone()),
        ("key", a.key.clone()),
        ("trusted_proxy", format!("{:?}", a.trusted)),
        ("ipv6_prefix", a.ipv6_prefix.to_string()),
        ("on_redis_error", format!("{:?}", a.on_error)),
        ("local_share", a.local_share.to_string()),
        ("timeout_ms", format!("{:?}", a.timeout)),
        ("headers", format!("{:?}", a.headers)),
        (
            "count_only",
            a.count_only.map(|s| s.to_string()).unwrap_or_default(),
        ),
        ("concurrency", format!("{:?}", a.concurrency)),
        ("lease_ms", format!("{:?}", a.lease)),
        ("unit_lease_ms", format!("{:?}", a.unit_lease)),
    ]
}

/// The limits `a` sets, for the layer's live limits.
fn limits_of(a: &Args) -> Limits {
    let mut quota = Quota::new(a.limit, a.per);
    if let Some(b) = a.burst {
        quota = quota.burst(b);
    }
    let mut limits = Limits::new(quota).shadow(a.shadow);
    for (key, plan, _) in &a.plans {
        limits = limits.plan(key, *plan);
    }
    limits
        .allow(a.allow.clone().unwrap_or_default())
        .deny(a.deny.clone().unwrap_or_default())
}

/// Puts the file's new text in force, or says why not (the running limits stay). One stderr
/// line either way. Runs off the async runtime: a file of many plans takes its time.
fn reload(
    base: &Args,
    path: &str,
    text: Result<String, FileError>,
    running: &mut Args,
    live: &LiveLimits,
) {
    let outcome = text
        .map_err(|e| format!("--config {path}: {e}"))
        .and_then(|text| with_text(base, path, &text))
        .and_then(|next| {
            for ((field, now), (_, then)) in fixed(running).iter().zip(fixed(&next).iter()) {
                if now != then {
                    return Err(format!(
                        "{field} cannot change without a restart ({now} in force, {then} in the file)"
                    ));
                }
            }
            live.replace(limits_of(&next)).map_err(|e| e.to_string())?;
            Ok(next)
        });
    match outcome {
        Ok(next) => {
            *running = next;
            eprintln!(
                "config reloaded: {path}: limit {}",
                limits_of(running).quota()
            );
        }
        Err(reason) => eprintln!("config refused: {reason}"),
    }
}

/// How often the watched file is looked at.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// Reloads the file on SIGHUP and when it changes, once it has settled (its size and
/// modification time unchanged across two looks 100 ms apart, see `FileWatch`), for as long
/// as the gateway runs. Each look, read and check runs on tokio's blocking threads, never on
/// the threads that serve requests.
fn watch(base: Args, path: String, file: FileWatch, running: Args, live: LiveLimits) {
    tokio::spawn(async move {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("config: no SIGHUP reloads ({e}); the file is still watched");
                None
            }
        };
        let fixed = Arc::new((base, path, live));
        let mut state = Some((file, running));
        let mut tick = tokio::time::interval(LOOK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let signalled = tokio::select! {
                Some(()) = async { match &mut hangup { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
                _ = tick.tick() => false,
            };
            let Some((mut file, mut running)) = state.take() else {
                return;
            };
            if signalled {
                file.ask();
            }
            let fixed = Arc::clone(&fixed);
            let looked = tokio::task::spawn_blocking(move || {
                if let Look::Read(text) = file.look(std::time::Instant::now()) {
                    let (base, path, live) = &*fixed;
                    reload(base, path, text, &mut running, live);
                }
                (file, running)
            })
            .await;
            match looked {
                Ok(next) => state = Some(next),
                Err(e) => {
                    eprintln!("config: reloads stopped ({e})");
                    return;
                }
            }
        }
    });
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An error and its causes on one line, `error: cause: cause`, each cause once (an error that
/// prints its cause in its own message, as redis-rs' does, is not followed by it again).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut last = out.clone();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !last.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        last = text;
        source = cause.source();
    }
    out
}

fn key_extractor(args: &Args) -> Result<Arc<dyn KeyExtractor>, Refusal> {
    Ok(match args.key.as_str() {
        "global" => Arc::new(GlobalKey),
        "ip" => Arc::new(client_ip(args)?),
        header => Arc::new(HeaderKey::new(&header["header:".len()..]).map_err(refusal("key"))?),
    })
}

/// The client address as `--key ip` finds it: the peer, or what `--trusted-proxy` forwarded.
fn client_ip(args: &Args) -> Result<ClientIp, Refusal> {
    let mut ip = ClientIp::new()
        .ipv6_prefix(args.ipv6_prefix)
        .map_err(refusal("ipv6_prefix"))?;
    for cidr in &args.trusted {
        ip = ip.trust(cidr).map_err(refusal("trusted_proxy"))?;
    }
    Ok(ip)
}

/// A setting that cannot work: why, and the `--config` file key of the setting at fault
/// (`plans.KEY` for a plan), so that a file's error names its line and field.
#[derive(Debug)]
struct Refusal {
    field: Option<String>,
    message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refusal {}

impl From<String> for Refusal {
    /// A refusal of no file setting (the command line's flags).
    fn from(message: String) -> Self {
        Self {
            field: None,
            message,
        }
    }
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

/// Names `field` (a file key) as the setting an error refuses.
fn refusal<E: std::fmt::Display>(field: impl Into<String>) -> impl FnOnce(E) -> Refusal {
    let field = field.into();
    move |e| Refusal {
        field: Some(field),
        message: e.to_string(),
    }
}

/// `--concurrency N --lease-ms M`: the concurrency limiter, checked before anything connects.
fn concurrency_limiter(
    args: &Args,
    store: Option<Arc<dyn SlotStore>>,
) -> Result<Option<ConcurrencyLimiter>, Refusal> {
    let Some(n) = args.concurrency else {
        return Ok(None);
    };
    let Some(store) = store else {
        return Err(refusal("concurrency")(
            "--concurrency does not work across regions",
        ));
    };
    let lease = args.lease.unwrap_or(DEFAULT_LEASE);
    ConcurrencyLimiter::builder(store, n)
        .prefix(&args.prefix)
        .permit_ttl(lease)
        .store_timeout(args.timeout)
        .on_store_error(args.on_error)
        .local_share(args.local_share)
        .build()
        .map(Some)
        .map_err(|e| {
            let field = if e.field() == "permit_ttl" {
                "lease_ms"
            } else {
                "concurrency"
            };
            refusal(field)(format!(
                "--concurrency {n} --lease-ms {}: {e}",
                lease.as_millis()
            ))
        })
}

/// The rate limiter, checked before anything connects (with a `MemoryStore`) and built again
/// on the real store.
fn rate_limiter(
    args: &Args,
    store: Arc<dyn Store>,
    algorithm: Arc<dyn Algorithm>,
) -> Result<RateLimiter<Arc<dyn Algorithm>>, Refusal> {
    let mut builder = RateLimiter::builder(store, algorithm)
        .prefix(&args.prefix)
        .store_timeout(args.timeout)
        .on_store_error(args.on_error)
        .local_share(args.local_share)
        .shadow(args.shadow);
    if let Some(lifetime) = args.unit_lease {
        builder = builder.lease(UnitLease::up_to(lifetime));
    }
    builder.build().map_err(|e| match e.field() {
        f if f.starts_with("lease") => refusal("unit_lease_ms")(format!(
            "--unit-lease-ms {} (--algorithm {}): {e}",
            args.unit_lease.unwrap_or_default().as_millis(),
            args.algorithm
        )),
        "store_timeout" => refusal("timeout_ms")(e),
        "local_share" => refusal("local_share")(e),
        _ => e.to_string().into(),
    })
}

/// What the operators' listener serves from: the metrics, the limiters, how a key is
/// written, and the token its requests must carry.
#[derive(Clone)]
struct AdminState {
    metrics: PrometheusHandle,
    limiter: RateLimiter<Arc<dyn Algorithm>>,
    concurrency: Option<ConcurrencyLimiter>,
    keys: KeyText,
    token: Option<Arc<[u8]>>,
    /// With `--regions`: this region's store, for `GET /region`.
    regional: Option<RegionalStore>,
    /// Each key's quota, as the layer finds it: the live limits of `--config`, or the
    /// `--plan`s.
    quotas: Quotas,
}

/// Where the layer finds a key's quota, so that a peek shows what a check would.
#[derive(Clone)]
enum Quotas {
    /// The limiter's own for every key.
    Own,
    /// `--plan`s: a quota per key, else the limiter's own.
    Plans(Arc<HashMap<Vec<u8>, Quota>>),
    /// `--config`: the limits in force (reloaded), plans included.
    Live(LiveLimits),
}

/// How the key extractor writes a key, so that an operator's text names the same key.
#[derive(Clone, Copy)]
enum KeyText {
    /// `--key ip`: an address, an IPv6 client as its /N network.
    Ip { ipv6_prefix: u8 },
    /// `--key header:NAME` and `--key global`: the text itself.
    Text,
}

impl KeyText {
    fn of(args: &Args) -> Self {
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
/// (`GET` the state, `DELETE` to reset) and `/bans/{key}` (`PUT ?seconds=N`, `DELETE`),
/// every route behind the token when there is one.
fn admin_router(state: AdminState) -> Router {
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
                    top(&s.limiter, query.get("n").map(String::as_str))
                },
            ),
        )
        .route("/region", get(region_state))
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
fn authorized(req: &axum::extract::Request, token: &[u8]) -> bool {
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
fn admin_error(status: StatusCode, e: impl std::fmt::Display) -> Response {
    (status, format!("{e}\n")).into_response()
}

/// `GET /region`: this region's state and grants, as JSON; 404 without `--regions`.
async fn region_state(State(s): State<AdminState>) -> Response {
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
fn percent_encoded(bytes: &[u8]) -> String {
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

/// `GET /keys/{key}`: the key's state, spending nothing.
async fn peek_key(State(s): State<AdminState>, uri: Uri) -> Response {
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
        Err(e) => admin_error(StatusCode::SERVICE_UNAVAILABLE, chain(&e)),
    }
}

/// `DELETE /keys/{key}`: forgets what the key spent, and its concurrency slots.
async fn reset_key(
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
        return admin_error(StatusCode::SERVICE_UNAVAILABLE, chain(&e));
    }
    if let Some(concurrency) = &s.concurrency {
        if let Err(e) = concurrency.reset(key).await {
            return admin_error(StatusCode::SERVICE_UNAVAILABLE, chain(&e));
        }
    }
    tracing::info!(key = %percent_encoded(&named), peer = %peer, "admin: key reset");
    StatusCode::NO_CONTENT.into_response()
}

/// `PUT /bans/{key}?seconds=N`: bans the key for N seconds, 1 to 86,400.
async fn ban_key(
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
        return admin_error(StatusCode::SERVICE_UNAVAILABLE, chain(&e));
    }
    tracing::info!(key = %percent_encoded(&named), seconds, peer = %peer, "admin: key banned");
    StatusCode::NO_CONTENT.into_response()
}

/// `DELETE /bans/{key}`: lifts the key's ban.
async fn unban_key(
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
        return admin_error(StatusCode::SERVICE_UNAVAILABLE, chain(&e));
    }
    tracing::info!(key = %percent_encoded(&named), peer = %peer, "admin: ban lifted");
    StatusCode::NO_CONTENT.into_response()
}

/// The admin token: `--admin-token`, or the first line of `--admin-token-file`; required
/// when the admin listener is not on a loopback address.
fn admin_token(args: &Args) -> Result<Option<Arc<[u8]>>, String> {
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
fn top(limiter: &RateLimiter<Arc<dyn Algorithm>>, n: Option<&str>) -> Response {
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
    let items: Vec<serde_json::Value> = limiter
        .top_keys(n)
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

#[allow(clippy::too_many_arguments)] // The stores and settings `run` made, each once.
async fn serve(
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
            Duration::ZERO,
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
    if !serve_http(listener, app, MAX_CONNECTIONS, stop, args.drain).await {
        tracing::warn!("requests still in flight after the drain time; exiting");
    }
    Ok(())
}

/// `SIGHUP` without `--config`: nothing to reload. Logged (at most once a second) and
/// ignored, instead of the default action that ends the process.
fn ignore_hangups() -> std::io::Result<()> {
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
const MAX_CONNECTIONS: usize = 512;
/// The most connections the admin listener holds at once.
const MAX_ADMIN_CONNECTIONS: usize = 64;
/// How long a client has to send a request's headers, on either listener: from the
/// connection's start, and from the end of the previous response on a kept-alive one.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` over HTTP/1.1 on `listener`, with its client's address (`ConnectInfo`), at
/// most `max` connections at once, each closed when a request's headers take longer than
/// [`HEADER_READ_TIMEOUT`]. When `shutdown` ends, stops accepting, lets each connection finish
/// the request it serves, and returns once all are closed (`true`) or `drain` has passed
/// (`false`).
async fn serve_http(
    listener: tokio::net::TcpListener,
    app: Router,
    max: usize,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) -> bool {
    use hyper_util::{
        rt::{TokioExecutor, TokioIo, TokioTimer},
        server::conn::auto::Builder,
        service::TowerToHyperService,
    };
    use tower::Service;

    let slots = Arc::new(tokio::sync::Semaphore::new(max));
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
        tokio::spawn(async move {
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
    drained
}

/// `GET /status/{code}`: that status, 100 to 599; anything else 400. (An informational 1xx
/// other than 101 cannot end a response: hyper turns it into a 500.)
async fn status(Path(code): Path<String>) -> Response {
    match code.parse::<u16>().ok().filter(|c| (100..=599).contains(c)) {
        Some(c) => {
            let status = StatusCode::from_u16(c).expect("100-599 is a status code");
            (status, format!("{c}\n")).into_response()
        }
        None => (StatusCode::BAD_REQUEST, "a status code is 100 to 599\n").into_response(),
    }
}

/// `GET /sleep/{ms}`: 200 after `ms` milliseconds, at most 60,000; anything else 400.
async fn sleep(Path(ms): Path<String>) -> Response {
    match ms.parse::<u64>().ok().filter(|&ms| ms <= 60_000) {
        Some(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            (StatusCode::OK, format!("slept {ms} ms\n")).into_response()
        }
        None => (StatusCode::BAD_REQUEST, "sleep 0 to 60000 ms\n").into_response(),
    }
}

/// Everything that can be checked before connecting to anything: the quota and the algorithm
/// it builds, or the first setting that cannot work (at start-up, `--check-config`, a reload).
fn check(args: &Args) -> Result<(Quota, Arc<dyn Algorithm>), Refusal> {
    let mut quota = Quota::new(args.limit, args.per);
    if let Some(b) = args.burst {
        quota = quota.burst(b);
    }
    // Reject a bad configuration before connecting to anything.
    let quota_refusal = |e: ConfigError| {
        let field = match e.field() {
            "quota.limit" => "limit",
            "quota.burst" => "burst",
            "quota.period" => "per",
            _ => "algorithm",
        };
        refusal(field)(e)
    };
    let algorithm: Arc<dyn Algorithm> = match args.algorithm.as_str() {
        "token-bucket" => Arc::new(TokenBucket::new(quota).map_err(quota_refusal)?),
        "sliding-window" => Arc::new(SlidingWindow::new(quota).map_err(quota_refusal)?),
        "fixed-window" => Arc::new(FixedWindow::new(quota).map_err(quota_refusal)?),
        _ => Arc::new(Gcra::new(quota).map_err(quota_refusal)?),
    };
    rate_limiter(args, Arc::new(MemoryStore::new()), Arc::clone(&algorithm))?;
    key_extractor(args)?;
    admin_token(args)?;
    if args.shadow && args.concurrency.is_some() {
        return Err(refusal("shadow")(
            "--shadow covers the rate limit only: --concurrency has no shadow mode and would still answer 429; give one or the other",
        ));
    }
    if (args.allow.is_some() || args.deny.is_some()) && args.concurrency.is_some() {
        let field = if args.allow.is_some() {
            "allow"
        } else {
            "deny"
        };
        return Err(refusal(field)(
            "--allow and --deny cover the rate limit only: --concurrency would still count and refuse listed keys; give one or the other",
        ));
    }
    if args.lease.is_some() && args.concurrency.is_none() {
        return Err(refusal("lease_ms")(
            "--lease-ms is the lease of --concurrency: give --concurrency N",
        ));
    }
    concurrency_limiter(args, Some(Arc::new(MemoryStore::new())))?;
    let uses_redis =
        args.redis.is_some() || args.redis_cluster.is_some() || args.redis_sentinel.is_some();
    check_regions(args, uses_redis)?;
    if !args.plans.is_empty() && !args.key.starts_with("header:") {
        return Err(refusal("plans")(
            "--plan gives a quota per key of --key header:NAME",
        ));
    }
    // Each plan's key and its flag as given, for a key given twice (in linear time: a file
    // may hold many plans).
    let mut first_given: HashMap<&str, &str> = HashMap::with_capacity(args.plans.len());
    for (key, plan, given) in &args.plans {
        let field = format!("plans.{key}");
        if let Some(first) = first_given.get(key.as_str()) {
            return Err(refusal(field)(format!(
                "--plan {given}: the key {key:?} has a plan already (--plan {first})"
            )));
        }
        first_given.insert(key, given);
        // The check the limiter makes of each request's quota (a sliding window takes only
        // quotas of its own period): a plan it would refuse is refused now.
        algorithm
            .with_quota(*plan)
            .map_err(|e| refusal(field)(format!("--plan {given}: {e}")))?;
    }
    Ok((quota, algorithm))
}

/// `--check-config FILE`: `ok` on stdout, or the error on stderr.
fn check_config(args: &Args, path: &str) -> ExitCode {
    match with_file(args, path)
        .map_err(BoxError::from)
        .and_then(|a| Ok(check(&a)?))
    {
        Ok(_) => {
            println!("ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", chain(&*e));
            ExitCode::FAILURE
        }
    }
}

async fn run(base: Args) -> Result<(), BoxError> {
    // The file as read at start-up; the watcher reports only changes from it.
    let mut file = base.config.as_ref().map(FileWatch::new);
    let args = match (&base.config, &mut file) {
        (Some(path), Some(file)) => {
            let text = file.read().map_err(|e| format!("--config {path}: {e}"))?;
            with_text(&base, path, &text)?
        }
        _ => base.clone(),
    };
    let (quota, algorithm) = check(&args)?;
    let redis_flags = [
        args.redis.is_some(),
        args.redis_cluster.is_some(),
        args.redis_sentinel.is_some(),
    ];
    let uses_redis = redis_flags.contains(&true);
    if redis_flags.iter().filter(|&&f| f).count() > 1 {
        return Err("give one of --redis, --redis-cluster and --redis-sentinel".into());
    }
    if args.redis_sentinel.is_some() != args.sentinel_master.is_some() {
        return Err("--redis-sentinel and --sentinel-master go together".into());
    }
    if args.redis_cert.is_some() != args.redis_key.is_some() {
        return Err("--redis-cert and --redis-key go together".into());
    }
    if !uses_redis
        && args.regions.is_none()
        && (args.redis_ca.is_some() || args.redis_cert.is_some() || args.lazy_connect)
    {
        return Err(
            "--redis-ca, --redis-cert, --redis-key and --lazy-connect are for Redis: give --redis, --redis-cluster, --redis-sentinel or --regions"
                .into(),
        );
    }
    if args.batch && !uses_redis {
        return Err(
            "--batch batches Redis calls: give --redis, --redis-cluster or --redis-sentinel".into(),
        );
    }
    let read = |flag: &str, path: &Option<String>| -> Result<Option<Vec<u8>>, String> {
        path.as_ref()
            .map(|p| std::fs::read(p).map_err(|e| format!("{flag} {p}: {e}")))
            .transpose()
    };
    let mut builder = RedisStore::builder()
        .connect_timeout(args.connect_timeout)
        .lazy(args.lazy_connect);
    if let Some(ca) = read("--redis-ca", &args.redis_ca)? {
        builder = builder.ca_pem(ca);
    }
    if let (Some(cert), Some(key)) = (
        read("--redis-cert", &args.redis_cert)?,
        read("--redis-key", &args.redis_key)?,
    ) {
        builder = builder.client_cert_pem(cert, key);
    }
    let batching = |store: RedisStore| -> Result<RedisStore, String> {
        if !args.batch {
            return Ok(store);
        }
        println!("batching: concurrent checks share one script call (exact)");
        store
            .with_batching(Batching::new())
            .map_err(|e| format!("--batch: {}", chain(&e)))
    };
    let lazy = if args.lazy_connect {
        " (lazy: connects on the first check)"
    } else {
        ""
    };
    let mut regional = None;
    // The store's concurrency slots: every store but the regional one keeps them.
    let mut slots: Option<Arc<dyn SlotStore>> = None;
    let store: Arc<dyn Store> = match (&args.redis, &args.redis_cluster, &args.redis_sentinel) {
        _ if args.regions.is_some() => {
            let store = regional_store(&args, builder).await?;
            regional = Some(store.clone());
            Arc::new(store)
        }
        (_, Some(nodes), _) => {
            let store = builder
                .connect_cluster(nodes)
                .await
                .map_err(|e| format!("--redis-cluster {}: {}", shown(nodes), chain(&e)))?;
            println!(
                "store: redis cluster via {} (shared by every instance pointing at it)",
                shown(nodes)
            );
            let store = Arc::new(batching(store)?);
            slots = Some(store.clone());
            store
        }
        (_, _, Some(sentinels)) => {
            let master = args.sentinel_master.as_deref().unwrap_or_default();
            let store = builder
                .connect_sentinel(sentinels, master)
                .await
                .map_err(|e| format!("--redis-sentinel {}: {}", shown(sentinels), chain(&e)))?;
            println!(
                "store: redis primary of {master:?} via sentinels {}{lazy} (shared by every instance pointing at it)",
                shown(sentinels)
            );
            let store = Arc::new(batching(store)?);
            slots = Some(store.clone());
            store
        }
        (Some(url), _, _) => {
            let shown = RedisStore::redact_url(url);
            let store = builder
                .connect(url)
                .await
                .map_err(|e| format!("--redis {shown}: {}", chain(&e)))?;
            println!("store: redis at {shown}{lazy} (shared by every instance pointing at it)");
            let store = Arc::new(batching(store)?);
            slots = Some(store.clone());
            store
        }
        (None, None, None) => {
            println!("store: in-memory (no --redis given; limits hold for this process only)");
            let store = Arc::new(MemoryStore::new());
            slots = Some(store.clone());
            store
        }
    };
    println!(
        "limit: {quota} per key ({}), key: {}, on store error: {:?}{}",
        args.algorithm,
        args.key,
        args.on_error,
        if args.on_error == FailurePolicy::Local {
            format!(" (1/{} of the quota per instance)", args.local_share)
        } else {
            String::new()
        }
    );
    for (key, plan, _) in &args.plans {
        println!("plan: key {key:?} gets {plan}");
    }
    // Installed before the limiter decides anything: its metric handles are taken from the
    // recorder on its first decision.
    let metrics = match args.admin_listen {
        Some(_) => Some(
            PrometheusBuilder::new()
                .install_recorder()
                .map_err(|e| format!("--admin-listen: {}", chain(&e)))?,
        ),
        None => None,
    };
    serve(base, args, file, store, slots, algorithm, metrics, regional).await
}

/// With `--regions`: `--region` names one of them, and nothing that cannot work across
/// regions is given.
fn check_regions(args: &Args, uses_redis: bool) -> Result<(), Refusal> {
    let Some(regions) = &args.regions else {
        if args.region.is_some() || args.region_share.is_some() {
            return Err("--region and --region-share go with --regions NAME=URL,...".into());
        }
        return Ok(());
    };
    if uses_redis {
        return Err(
            "--regions replaces --redis, --redis-cluster and --redis-sentinel: give one".into(),
        );
    }
    let Some(region) = &args.region else {
        return Err("--regions needs --region NAME: this gateway's region".into());
    };
    if !regions.iter().any(|(name, _)| name == region) {
        let names: Vec<&str> = regions.iter().map(|(n, _)| n.as_str()).collect();
        return Err(format!(
            "--region {region} is not one of --regions ({})",
            names.join(", ")
        )
        .into());
    }
    // (given, what, the file key)
    let refused = [
        (
            args.algorithm == "sliding-window",
            "--algorithm sliding-window (GCRA and the token bucket run across regions)",
            Some("algorithm"),
        ),
        (
            args.algorithm == "fixed-window",
            "--algorithm fixed-window (GCRA and the token bucket run across regions)",
            Some("algorithm"),
        ),
        (
            args.unit_lease.is_some(),
            "--unit-lease-ms (a region's pool is a lease already)",
            Some("unit_lease_ms"),
        ),
        (
            args.count_only.is_some(),
            "--count-only (refunds)",
            Some("count_only"),
        ),
        (
            args.concurrency.is_some(),
            "--concurrency",
            Some("concurrency"),
        ),
        (args.batch, "--batch", None),
    ];
    match refused.iter().find(|(given, ..)| *given) {
        Some((_, what, field)) => {
            let message = format!("{what} does not work across regions yet: not with --regions");
            Err(match field {
                Some(field) => refusal(*field)(message),
                None => message.into(),
            })
        }
        None => Ok(()),
    }
}

/// `--region NAME --regions NAME=URL,...`: this region's Redis connected now (it decides every
/// request), the others lazily (a region away at start-up is what the share is for).
async fn regional_store(
    args: &Args,
    builder: tower_redis_ratelimit::store::redis::RedisStoreBuilder,
) -> Result<RegionalStore, String> {
    let (Some(regions), Some(own)) = (&args.regions, &args.region) else {
        unreachable!("checked by check_regions");
    };
    let mut store = RegionalStore::builder(own.clone());
    for (name, url) in regions {
        let shown = RedisStore::redact_url(url);
        let redis = if name == own {
            builder.clone().connect(url).await
        } else {
            builder.clone().lazy(true).connect(url).await
        }
        .map_err(|e| format!("--regions {name}={shown}: {}", chain(&e)))?;
        store = store.region(name.clone(), redis);
    }
    if let Some(share) = args.region_share {
        store = store.share(share);
    }
    let store = store.build().map_err(|e| format!("--regions: {e}"))?;
    let listed: Vec<String> = regions
        .iter()
        .enumerate()
        .map(|(i, (name, url))| {
            let role = match (i, name == own) {
                (0, true) => " (home, this region)",
                (0, false) => " (home)",
                (_, true) => " (this region)",
                _ => "",
            };
            format!("{name}={}{role}", RedisStore::redact_url(url))
        })
        .collect();
    println!(
        "store: regions {}; share {} of each limit while cut off",
        listed.join(", "),
        store.share()
    );
    Ok(store)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(Stop::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(Stop::Version) => {
            println!("gateway {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(Stop::Refused(e)) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(path) = &args.check_config {
        return check_config(&args, path);
    }
    tracing_subscriber::fmt()
        .with_max_level(args.log)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", chain(&*e));
            ExitCode::FAILURE
        }
    }
}
