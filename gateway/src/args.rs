//! The command line: every flag, its default and its refusals, and the usage.

use super::*;
use clap::ArgAction;
use std::ffi::OsString;
use tower_redis_ratelimit::rate_limit::file::parse_duration;

/// The usage's text, after `usage: `: the first line of `--help` and of every refusal.
pub(crate) const USAGE: &str = "gateway [--listen ADDR] [--redis URL] [--redis-cluster URL,URL,...] \
[--redis-sentinel URL,URL,... --sentinel-master NAME] [--redis-ca FILE] \
[--redis-cert FILE --redis-key FILE] [--connect-timeout-ms N] [--lazy-connect] \
[--algorithm token-bucket|gcra|sliding-window|fixed-window] [--limit N] [--per DURATION] [--burst N] \
[--key global|ip|header:NAME] [--trusted-proxy CIDR]... [--ipv6-prefix 1-128] \
[--on-redis-error open|closed|local] [--local-share N] [--timeout-ms N] \
[--headers ietf|legacy|both|none] [--plan KEY=N/PERIOD]... [--count-only LIST] [--cost N] \
[--concurrency N [--lease-ms M]] [--unit-lease-ms N] \
[--ban-after N [--ban-within DURATION] [--ban-for DURATION] [--ban-escalate F]] \
[--delay-up-to DURATION] [--prefix P] [--log LEVEL] [--shadow] \
[--batch] [--no-limit] [--admin-listen ADDR [--admin-token TOKEN | --admin-token-file FILE]] \
[--allow LIST] [--deny LIST] [--config FILE] [--check-config FILE] \
[--region NAME --regions NAME=URL,NAME=URL,... [--region-share F]] [--drain-ms N] \
[--upstream http://HOST:PORT[/PREFIX] [--upstream-timeout-ms N] [--settle-header NAME]] [--threads N] \
[--rls-listen ADDR --rls-config PATH [--rls-algorithm fixed-window|gcra|sliding-window]]
       gateway --help | --version";

/// `--lease-ms` when not given.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub(crate) struct Args {
    pub(crate) listen: SocketAddr,
    pub(crate) redis: Option<String>,
    pub(crate) redis_cluster: Option<Vec<String>>,
    pub(crate) redis_sentinel: Option<Vec<String>>,
    pub(crate) sentinel_master: Option<String>,
    pub(crate) redis_ca: Option<String>,
    pub(crate) redis_cert: Option<String>,
    pub(crate) redis_key: Option<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) lazy_connect: bool,
    pub(crate) algorithm: String,
    pub(crate) limit: u32,
    pub(crate) per: Duration,
    /// `--per 1w`, `1mo` or `1y`: calendar windows (`per` is their nominal length).
    pub(crate) calendar: Option<Calendar>,
    pub(crate) burst: Option<u32>,
    pub(crate) key: String,
    pub(crate) trusted: Vec<String>,
    /// `--key ip` keys IPv6 clients by this network prefix.
    pub(crate) ipv6_prefix: u8,
    pub(crate) on_error: FailurePolicy,
    pub(crate) local_share: u32,
    pub(crate) timeout: Duration,
    /// How long requests in flight may take to finish once a stop is asked for.
    pub(crate) drain: Duration,
    pub(crate) headers: HeaderStyle,
    pub(crate) prefix: String,
    pub(crate) log: tracing::Level,
    /// Serve without the limiter (to measure its overhead).
    pub(crate) no_limit: bool,
    /// Exact batching of concurrent checks (`RedisStore::with_batching`).
    pub(crate) batch: bool,
    /// Shadow mode: decide and report, never reject.
    pub(crate) shadow: bool,
    /// `--plan KEY=N/PERIOD`: a quota per key, with the flag's value as given.
    pub(crate) plans: Vec<(String, Quota, String)>,
    /// `--count-only LIST`: the statuses that spend quota.
    pub(crate) count_only: Option<StatusSet>,
    /// `--cost N`: each request's first charge.
    pub(crate) cost: u32,
    /// `--settle-header NAME`: the upstream's response header that settles the charge.
    pub(crate) settle_header: Option<http::HeaderName>,
    /// `--concurrency N`: at most N requests of a key in flight.
    pub(crate) concurrency: Option<u32>,
    /// `--lease-ms M`: the lease of a concurrency slot.
    pub(crate) lease: Option<Duration>,
    /// `--unit-lease-ms N`: unit leases for hot allowed keys, handed out for at most N ms.
    pub(crate) unit_lease: Option<Duration>,
    /// `--admin-listen ADDR`: the operators' listener (`/metrics`, `/top`, `/keys`, `/bans`).
    pub(crate) admin_listen: Option<SocketAddr>,
    /// `--admin-token TOKEN`: what admin requests must carry.
    pub(crate) admin_token: Option<String>,
    /// `--admin-token-file FILE`: the same, read from a file.
    pub(crate) admin_token_file: Option<String>,
    /// `--allow LIST`: keys and networks never limited.
    pub(crate) allow: Option<AccessList>,
    /// `--deny LIST`: keys and networks always refused.
    pub(crate) deny: Option<AccessList>,
    /// `--config FILE`: the limit settings, reloaded while the gateway runs.
    pub(crate) config: Option<String>,
    /// `--check-config FILE`: check the file and exit.
    pub(crate) check_config: Option<String>,
    /// `--region NAME`: this gateway's region.
    pub(crate) region: Option<String>,
    /// `--regions NAME=URL,...`: every region's Redis, the home first.
    pub(crate) regions: Option<Vec<(String, String)>>,
    /// `--region-share F`: the share of each limit a region uses while cut off.
    pub(crate) region_share: Option<f64>,
    /// `--upstream`: where requests go; `None`, the demo routes.
    pub(crate) upstream: Option<proxy::Upstream>,
    /// How long the upstream has to answer with its headers.
    pub(crate) upstream_timeout: Duration,
    /// `--threads N`: the runtime's threads; `None`, one per CPU.
    pub(crate) threads: Option<usize>,
    /// `--rls-listen ADDR`: where Envoy's rate limit service is served.
    pub(crate) rls_listen: Option<SocketAddr>,
    /// `--rls-config PATH`: its rules.
    pub(crate) rls_config: Option<String>,
    /// `--rls-algorithm`: its algorithm.
    pub(crate) rls_algorithm: RlsAlgorithm,
    /// `--ban-after` and its settings: automatic bans.
    pub(crate) bans: Bans,
    /// `--delay-up-to DURATION`: a request over the limit waits up to this long for its
    /// units instead of being refused.
    pub(crate) delay_up_to: Option<Duration>,
    /// The flags given on the command line (the file may not give them again).
    pub(crate) given: Vec<String>,
}

/// Redis URLs as printed (stdout, stderr): each with `***` in place of its password.
pub(crate) fn shown(urls: &[String]) -> String {
    urls.iter()
        .map(|url| RedisStore::redact_url(url))
        .collect::<Vec<_>>()
        .join(",")
}

pub(crate) fn url_list(value: &str) -> Option<Vec<String>> {
    let urls: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    (!urls.is_empty()).then_some(urls)
}

/// Why the arguments stop the gateway before it starts.
pub(crate) enum Stop {
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

pub(crate) fn parse_args() -> Result<Args, Stop> {
    parse_from(std::env::args_os())
}

/// [`parse_args`] on the arguments `args` (the program's name first).
fn parse_from<I: IntoIterator<Item = T>, T: Into<OsString>>(args: I) -> Result<Args, Stop> {
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
        calendar: None,
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
        cost: 1,
        settle_header: None,
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
        threads: None,
        rls_listen: None,
        rls_config: None,
        rls_algorithm: RlsAlgorithm::FixedWindow,
        bans: Bans::default(),
        delay_up_to: None,
        given: Vec::new(),
    };
    // Arguments as the OS gives them: any bytes, never a panic. clap reads the command line
    // (which flags, their values, `--flag=value`); each flag's meaning and refusals are
    // `apply_flag`'s, in the order given, as for a `--config` file. A list (`--allow`,
    // `--deny`) is read as bytes, so that it can name a key that is not UTF-8; every other
    // value is text.
    for (flag, value) in command_line(args.into_iter().map(Into::into))? {
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

/// Every flag of the command line, as clap reads it: its name, its value's name and its help
/// line. Values are kept as the OS gives them; what each means, and its refusals, is
/// [`apply_flag`]'s (shared with the `--config` file), applied in the order given.
#[derive(clap::Parser)]
#[command(
    name = "gateway",
    version,
    disable_help_flag = true,
    disable_version_flag = true,
    override_usage = USAGE,
    help_template = "usage: {usage}\n\n{about}\n\n{all-args}",
    args_override_self = true,
    about = "An HTTP rate-limiting gateway: in front of a service (--upstream) or answering demo \
routes, with its limits in memory or in Redis shared by every instance."
)]
struct CommandLine {
    /// Print this help and exit.
    #[arg(short, long, action = ArgAction::SetTrue)]
    help: bool,
    /// Print the version and exit.
    #[arg(short = 'V', long, action = ArgAction::SetTrue)]
    version: bool,
    /// The address to serve on [default: 127.0.0.1:3000].
    #[arg(long, value_name = "ADDR", help_heading = "Serving")]
    listen: Vec<OsString>,
    /// Send every request let through to this service: http://HOST:PORT[/PREFIX].
    #[arg(long, value_name = "URL", help_heading = "Serving")]
    upstream: Vec<OsString>,
    /// How long the upstream may go without progress before a 504 [default: 30000].
    #[arg(long, value_name = "N", help_heading = "Serving")]
    upstream_timeout_ms: Vec<OsString>,
    /// Settle each request's charge to the whole number in the upstream's response header NAME.
    #[arg(long, value_name = "NAME", help_heading = "Serving")]
    settle_header: Vec<OsString>,
    /// How long requests in flight may take to finish on SIGTERM [default: 10000].
    #[arg(long, value_name = "N", help_heading = "Serving")]
    drain_ms: Vec<OsString>,
    /// The runtime's threads; 1 runs everything on one thread [default: one per CPU].
    #[arg(long, value_name = "N", help_heading = "Serving")]
    threads: Vec<OsString>,
    /// The log level: error, warn, info, debug or trace [default: info].
    #[arg(long, value_name = "LEVEL", help_heading = "Serving")]
    log: Vec<OsString>,
    /// One Redis shared by every instance (redis:// or rediss://) [default: in memory].
    #[arg(long, value_name = "URL", help_heading = "Store")]
    redis: Vec<OsString>,
    /// A Redis Cluster: some of its nodes, comma-separated.
    #[arg(long, value_name = "URL,URL,...", help_heading = "Store")]
    redis_cluster: Vec<OsString>,
    /// Redis behind Sentinels: the Sentinels, comma-separated (with --sentinel-master).
    #[arg(long, value_name = "URL,URL,...", help_heading = "Store")]
    redis_sentinel: Vec<OsString>,
    /// The name of the master the Sentinels watch.
    #[arg(long, value_name = "NAME", help_heading = "Store")]
    sentinel_master: Vec<OsString>,
    /// The certificate authority (PEM) a rediss:// server is checked against.
    #[arg(long, value_name = "FILE", help_heading = "Store")]
    redis_ca: Vec<OsString>,
    /// The client certificate (PEM) for a server that asks for one (with --redis-key).
    #[arg(long, value_name = "FILE", help_heading = "Store")]
    redis_cert: Vec<OsString>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", help_heading = "Store")]
    redis_key: Vec<OsString>,
    /// How long a connection to the store may take [default: 3000].
    #[arg(long, value_name = "N", help_heading = "Store")]
    connect_timeout_ms: Vec<OsString>,
    /// Start without waiting for the store; connect on first use.
    #[arg(long, action = ArgAction::SetTrue, help_heading = "Store")]
    lazy_connect: bool,
    /// The keys' prefix in the store [default: gateway].
    #[arg(long, value_name = "P", help_heading = "Store")]
    prefix: Vec<OsString>,
    /// Exact batching of concurrent checks into one store call.
    #[arg(long, action = ArgAction::SetTrue, help_heading = "Store")]
    batch: bool,
    /// Several regions: this gateway's region (with --regions).
    #[arg(long, value_name = "NAME", help_heading = "Store")]
    region: Vec<OsString>,
    /// Every region's Redis, the home first: NAME=URL,NAME=URL,...
    #[arg(long, value_name = "NAME=URL,...", help_heading = "Store")]
    regions: Vec<OsString>,
    /// The share of each limit a region uses while cut off from the others (0 < F <= 1).
    #[arg(long, value_name = "F", help_heading = "Store")]
    region_share: Vec<OsString>,
    /// The algorithm: token-bucket, gcra, sliding-window or fixed-window [default: gcra].
    #[arg(long, value_name = "NAME", help_heading = "Limit")]
    algorithm: Vec<OsString>,
    /// Requests per period [default: 10].
    #[arg(long, value_name = "N", help_heading = "Limit")]
    limit: Vec<OsString>,
    /// The period: 1s, 60s, 1m, 1h, ..., or 1w, 1mo, 1y (calendar windows in UTC, with
    /// --algorithm fixed-window) [default: 1s].
    #[arg(long, value_name = "DURATION", help_heading = "Limit")]
    per: Vec<OsString>,
    /// The burst [default: the limit].
    #[arg(long, value_name = "N", help_heading = "Limit")]
    burst: Vec<OsString>,
    /// What a request is counted by: global, ip or header:NAME [default: ip].
    #[arg(long, value_name = "KEY", help_heading = "Limit")]
    key: Vec<OsString>,
    /// A proxy whose x-forwarded-for is believed (repeatable).
    #[arg(long, value_name = "CIDR", help_heading = "Limit")]
    trusted_proxy: Vec<OsString>,
    /// --key ip counts IPv6 clients by this network prefix [default: 64].
    #[arg(long, value_name = "1-128", help_heading = "Limit")]
    ipv6_prefix: Vec<OsString>,
    /// When the store fails: open, closed or local [default: open].
    #[arg(long, value_name = "POLICY", help_heading = "Limit")]
    on_redis_error: Vec<OsString>,
    /// With --on-redis-error local: the number of instances sharing the limit [default: 1].
    #[arg(long, value_name = "N", help_heading = "Limit")]
    local_share: Vec<OsString>,
    /// How long a store call may take before the failure policy answers [default: 100].
    #[arg(long, value_name = "N", help_heading = "Limit")]
    timeout_ms: Vec<OsString>,
    /// The rate-limit fields: ietf, legacy, both or none [default: ietf].
    #[arg(long, value_name = "STYLE", help_heading = "Limit")]
    headers: Vec<OsString>,
    /// A quota for the requests whose key is KEY, e.g. gold=100/1m (repeatable).
    #[arg(long, value_name = "KEY=N/PERIOD", help_heading = "Limit")]
    plan: Vec<OsString>,
    /// Spend quota only on these statuses, e.g. 2xx,404.
    #[arg(long, value_name = "LIST", help_heading = "Limit")]
    count_only: Vec<OsString>,
    /// Units each request is charged first (settled by --settle-header) [default: 1].
    #[arg(long, value_name = "N", help_heading = "Limit")]
    cost: Vec<OsString>,
    /// At most N requests of a key in flight.
    #[arg(long, value_name = "N", help_heading = "Limit")]
    concurrency: Vec<OsString>,
    /// The lease of a concurrency slot [default: 30000].
    #[arg(long, value_name = "M", help_heading = "Limit")]
    lease_ms: Vec<OsString>,
    /// Unit leases for hot allowed keys, handed out for at most N ms.
    #[arg(long, value_name = "N", help_heading = "Limit")]
    unit_lease_ms: Vec<OsString>,
    /// Ban a key refused N times within --ban-within, on every gateway sharing the store.
    #[arg(long, value_name = "N", help_heading = "Limit")]
    ban_after: Vec<OsString>,
    /// The window in which --ban-after counts refusals [default: 60s].
    #[arg(long, value_name = "DURATION", help_heading = "Limit")]
    ban_within: Vec<OsString>,
    /// How long a key is banned [default: 300s].
    #[arg(long, value_name = "DURATION", help_heading = "Limit")]
    ban_for: Vec<OsString>,
    /// A key banned again within a day is banned F times longer, at most a day [default: 2].
    #[arg(long, value_name = "F", help_heading = "Limit")]
    ban_escalate: Vec<OsString>,
    /// Serve a request over the limit late, in time with the limit, when its units come within DURATION (gcra, token-bucket).
    #[arg(long, value_name = "DURATION", help_heading = "Limit")]
    delay_up_to: Vec<OsString>,
    /// Decide and report, never refuse.
    #[arg(long, action = ArgAction::SetTrue, help_heading = "Limit")]
    shadow: bool,
    /// Serve without the limiter.
    #[arg(long, action = ArgAction::SetTrue, help_heading = "Limit")]
    no_limit: bool,
    /// Keys and networks never limited, comma-separated.
    #[arg(long, value_name = "LIST", help_heading = "Limit")]
    allow: Vec<OsString>,
    /// Keys and networks always refused (403), comma-separated.
    #[arg(long, value_name = "LIST", help_heading = "Limit")]
    deny: Vec<OsString>,
    /// The limit settings in TOML, reloaded on SIGHUP and when the file changes.
    #[arg(long, value_name = "FILE", help_heading = "Limit")]
    config: Vec<OsString>,
    /// Check a limits file: print ok and exit 0, or the error and exit 1.
    #[arg(long, value_name = "FILE", help_heading = "Limit")]
    check_config: Vec<OsString>,
    /// Serve Envoy's rate limit service here: gRPC ShouldRateLimit (HTTP/2) and POST /json.
    #[arg(long, value_name = "ADDR", help_heading = "Rate limit service")]
    rls_listen: Vec<OsString>,
    /// The service's rules: an envoyproxy/ratelimit YAML file or a directory of them.
    #[arg(long, value_name = "PATH", help_heading = "Rate limit service")]
    rls_config: Vec<OsString>,
    /// The service's algorithm: fixed-window, gcra or sliding-window [default: fixed-window].
    #[arg(long, value_name = "NAME", help_heading = "Rate limit service")]
    rls_algorithm: Vec<OsString>,
    /// The operators' console: /metrics, /top, /keys, /bans, /limits, /healthz, /region.
    #[arg(long, value_name = "ADDR", help_heading = "Operators")]
    admin_listen: Vec<OsString>,
    /// The bearer token the console asks for.
    #[arg(long, value_name = "TOKEN", help_heading = "Operators")]
    admin_token: Vec<OsString>,
    /// The same, read from a file.
    #[arg(long, value_name = "FILE", help_heading = "Operators")]
    admin_token_file: Vec<OsString>,
}

/// The help `--help` prints.
pub(crate) fn help() -> String {
    use clap::CommandFactory;
    CommandLine::command().render_help().to_string()
}

/// The command line's flags (`--name`), each with its value (`None` for a flag without one),
/// in the order given; `--help` and `--version` stop here.
fn command_line(
    args: impl IntoIterator<Item = OsString>,
) -> Result<Vec<(String, Option<OsString>)>, Stop> {
    use clap::CommandFactory;
    // The next argument is a flag's value, whatever it looks like (`--ipv6-prefix -1` is
    // refused by `--ipv6-prefix`, not taken for a flag).
    let command = CommandLine::command().mut_args(|arg| {
        let takes_values = arg.get_action().takes_values();
        arg.allow_hyphen_values(takes_values)
    });
    let matches = command
        .clone()
        .try_get_matches_from(args)
        .map_err(refused)?;
    if matches.get_flag("help") {
        return Err(Stop::Help);
    }
    if matches.get_flag("version") {
        return Err(Stop::Version);
    }
    let mut given: Vec<(usize, String, Option<OsString>)> = Vec::new();
    for arg in command.get_arguments() {
        let (id, Some(long)) = (arg.get_id().as_str(), arg.get_long()) else {
            continue;
        };
        // A flag without a value has a default (false) that the command line did not give.
        if matches.value_source(id) != Some(clap::parser::ValueSource::CommandLine) {
            continue;
        }
        let Some(at) = matches.indices_of(id) else {
            continue;
        };
        let flag = format!("--{long}");
        match matches.get_raw(id) {
            Some(values) if arg.get_action().takes_values() => given.extend(
                at.zip(values)
                    .map(|(at, v)| (at, flag.clone(), Some(v.to_owned()))),
            ),
            _ => given.extend(at.map(|at| (at, flag.clone(), None))),
        }
    }
    given.sort_by_key(|(at, ..)| *at);
    Ok(given
        .into_iter()
        .map(|(_, flag, value)| (flag, value))
        .collect())
}

/// clap's refusal of a command line, in the gateway's words: `unknown flag X`, `X needs a
/// value`, or clap's own message.
fn refused(e: clap::Error) -> Stop {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let context = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    // `--limit <N>` as clap names an argument: the flag alone.
    let flag = context(ContextKind::InvalidArg)
        .map(|a| a.split_whitespace().next().unwrap_or_default().to_owned());
    let reason = match (e.kind(), flag) {
        (ErrorKind::UnknownArgument | ErrorKind::InvalidUtf8, Some(flag)) => {
            format!("unknown flag {flag}")
        }
        (ErrorKind::InvalidValue | ErrorKind::NoEquals, Some(flag))
            if context(ContextKind::InvalidValue).is_none_or(|v| v.is_empty()) =>
        {
            format!("{flag} needs a value")
        }
        _ => {
            let text = e
                .kind()
                .as_str()
                .unwrap_or("the command line does not read");
            let mut shown = text.to_owned();
            if let Some(arg) = context(ContextKind::InvalidArg) {
                shown = format!("{arg}: {shown}");
            }
            shown
        }
    };
    Stop::Refused(reason)
}

/// Sets `--allow` or `--deny` (`flag`) from `value`: comma-separated entries of any bytes
/// (see `AccessList::entry_bytes`).
pub(crate) fn apply_list(a: &mut Args, flag: &str, value: &[u8]) -> Result<(), String> {
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

/// Sets what `flag` (with `value`, `None` for a flag without one) says in `a`.
pub(crate) fn apply_flag(a: &mut Args, flag: &str, value: Option<String>) -> Result<(), String> {
    let Some(value) = value else {
        match flag {
            "--no-limit" => a.no_limit = true,
            "--batch" => a.batch = true,
            "--shadow" => a.shadow = true,
            "--lazy-connect" => a.lazy_connect = true,
            _ => return Err(format!("{flag} needs a value")),
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
        "--rls-config" => a.rls_config = Some(value),
        "--rls-listen" => {
            a.rls_listen = Some(
                value
                    .parse()
                    .map_err(|_| bad("an address like 127.0.0.1:8081"))?,
            )
        }
        "--rls-algorithm" => {
            a.rls_algorithm = match value.as_str() {
                "fixed-window" => RlsAlgorithm::FixedWindow,
                "gcra" => RlsAlgorithm::Gcra,
                "sliding-window" => RlsAlgorithm::SlidingWindow,
                _ => return Err(bad("fixed-window, gcra or sliding-window")),
            }
        }
        "--check-config" => a.check_config = Some(value),
        "--admin-token" => a.admin_token = Some(value),
        "--admin-token-file" => a.admin_token_file = Some(value),
        _ => {
            let handled = store_flag(a, flag, value.clone())?
                || limit_flag(a, flag, value.clone())?
                || ban_flag(a, flag, value.clone())?
                || operating_flag(a, flag, value)?;
            if !handled {
                return Err(format!("unknown flag {flag}"));
            }
        }
    }
    Ok(())
}

/// Sets a flag of the store: Redis, Cluster, Sentinel, TLS, the connection. Whether `flag` is one of them.
fn store_flag(a: &mut Args, flag: &str, value: String) -> Result<bool, String> {
    let bad = |what: &str| format!("{flag}: {value:?} is not {what}");
    match flag {
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
        _ => return Ok(false),
    }
    Ok(true)
}

/// A period as `--per` and `--plan` take it: a duration (`90s`, `1m`, `1d`), or a calendar
/// window, `1w` (from Monday), `1mo` or `1y`, in UTC (with the calendar's nominal length:
/// 7, 30, 365 days). Calendar windows are a fixed window's only; [`check`] refuses them with
/// another algorithm.
pub(crate) fn parse_per(text: &str) -> Option<(Duration, Option<Calendar>)> {
    let calendar = match text {
        "1w" => Calendar::Week,
        "1mo" => Calendar::Month,
        "1y" => Calendar::Year,
        _ => return parse_duration(text).map(|d| (d, None)),
    };
    Some((calendar.nominal(), Some(calendar)))
}

/// A `--plan KEY=N/PERIOD`: the key, its quota, and the flag's value as given.
fn plan_of(value: &str) -> Option<(String, Quota, String)> {
    let (key, quota) = value.rsplit_once('=')?;
    let (n, per) = quota.split_once('/')?;
    let quota = Quota::new(n.parse().ok()?, parse_per(per)?.0);
    (!key.is_empty()).then(|| (key.to_owned(), quota, value.to_owned()))
}

/// The calendar of a `--plan` as given (`KEY=N/1mo`), if its period is one.
pub(crate) fn plan_calendar(given: &str) -> Option<Calendar> {
    let (_, quota) = given.rsplit_once('=')?;
    let (_, per) = quota.split_once('/')?;
    parse_per(per)?.1
}

/// Sets a flag of the limit: the algorithm, the quota, the key, the failure policy, the headers, plans. Whether `flag` is one of them.
fn limit_flag(a: &mut Args, flag: &str, value: String) -> Result<bool, String> {
    let bad = |what: &str| format!("{flag}: {value:?} is not {what}");
    match flag {
        "--algorithm" => match value.as_str() {
            "token-bucket" | "gcra" | "sliding-window" | "fixed-window" => a.algorithm = value,
            _ => return Err(bad("token-bucket, gcra, sliding-window or fixed-window")),
        },
        "--limit" => a.limit = value.parse().map_err(|_| bad("a whole number"))?,
        "--per" => {
            (a.per, a.calendar) = parse_per(&value)
                .ok_or_else(|| bad("a duration like 1s, 60s, 1m, 1h, or 1w, 1mo, 1y"))?
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
        "--plan" => a
            .plans
            .push(plan_of(&value).ok_or_else(|| bad("KEY=N/PERIOD, e.g. gold=100/1m"))?),
        "--count-only" => {
            let set: StatusSet = value.parse().map_err(|e| format!("--count-only: {e}"))?;
            a.count_only = Some(set);
        }
        "--cost" => {
            a.cost = value
                .parse()
                .ok()
                .filter(|&n: &u32| n > 0)
                .ok_or_else(|| bad("a whole number of units, at least 1"))?
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The `--ban-*` flags as given.
#[derive(Clone, Copy, Default)]
pub(crate) struct Bans {
    /// `--ban-after N`: a key refused N times within `--ban-within` is banned.
    pub(crate) after: Option<u32>,
    /// `--ban-within DURATION` (60s unless given).
    pub(crate) within: Option<Duration>,
    /// `--ban-for DURATION` (300s unless given).
    pub(crate) duration: Option<Duration>,
    /// `--ban-escalate F` (2 unless given).
    pub(crate) escalate: Option<f64>,
}

/// Sets a flag of automatic bans (`--ban-*`). Whether `flag` is one of them.
fn ban_flag(a: &mut Args, flag: &str, value: String) -> Result<bool, String> {
    let bad = |what: &str| format!("{flag}: {value:?} is not {what}");
    let duration = || {
        parse_duration(&value)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| bad("a duration like 500ms, 10s, 5m, 1h"))
    };
    match flag {
        "--ban-after" => {
            a.bans.after = Some(
                value
                    .parse()
                    .ok()
                    .filter(|&n: &u32| n > 0)
                    .ok_or_else(|| bad("a whole number of refusals, at least 1"))?,
            )
        }
        "--ban-within" => a.bans.within = Some(duration()?),
        "--delay-up-to" => a.delay_up_to = Some(duration()?),
        "--ban-for" => a.bans.duration = Some(duration()?),
        "--ban-escalate" => {
            a.bans.escalate = Some(
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|f| (1.0..=1000.0).contains(f))
                    .ok_or_else(|| bad("a factor F with 1 <= F <= 1000"))?,
            )
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// Sets a flag of how the gateway runs: concurrency, leases, the log, regions, the upstream. Whether `flag` is one of them.
fn operating_flag(a: &mut Args, flag: &str, value: String) -> Result<bool, String> {
    let bad = |what: &str| format!("{flag}: {value:?} is not {what}");
    match flag {
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
        "--threads" => {
            a.threads = Some(
                value
                    .parse()
                    .ok()
                    .filter(|&n| (1..=1024).contains(&n))
                    .ok_or_else(|| bad("a number of threads from 1 to 1024"))?,
            )
        }
        "--upstream" => {
            a.upstream =
                Some(proxy::Upstream::parse(&value).map_err(|e| format!("--upstream {e}"))?)
        }
        "--settle-header" => {
            a.settle_header = Some(
                http::HeaderName::from_bytes(value.as_bytes()).map_err(|_| bad("a header name"))?,
            )
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
        _ => return Ok(false),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_flag_clap_reads_has_a_meaning() {
        let base = parse_from(["gateway"]).ok().unwrap();
        let mut flags = 0;
        for arg in CommandLine::command().get_arguments() {
            let long = format!("--{}", arg.get_long().unwrap());
            if long == "--help" || long == "--version" {
                continue;
            }
            flags += 1;
            let value = arg.get_action().takes_values().then(|| "x".to_owned());
            let mut a = base.clone();
            if let Err(e) = apply_flag(&mut a, &long, value) {
                assert!(e.starts_with(&long), "{long}: {e}");
            }
        }
        assert!(flags > 40, "{flags}");
    }

    #[test]
    fn flags_apply_in_the_order_given_and_a_repeated_one_takes_the_last() {
        let a = parse_from([
            "gateway",
            "--limit",
            "5",
            "--shadow",
            "--plan",
            "a=1/1s",
            "--limit=7",
            "--shadow",
            "--plan",
            "b=2/1m",
            "--key",
            "header:x",
        ])
        .ok()
        .unwrap();
        assert_eq!(a.limit, 7);
        assert!(a.shadow);
        let plans: Vec<&str> = a.plans.iter().map(|(k, ..)| k.as_str()).collect();
        assert_eq!(plans, ["a", "b"]);
        // A flag without a value given twice counts once, where it was given last.
        assert_eq!(
            a.given,
            ["--limit", "--plan", "--limit", "--shadow", "--plan", "--key"]
        );
        // The first refusal in the order given is the one reported.
        let Err(Stop::Refused(e)) = parse_from(["gateway", "--per", "x", "--limit", "y"]) else {
            panic!("refused");
        };
        assert!(e.starts_with("--per:"), "{e}");
    }
}
