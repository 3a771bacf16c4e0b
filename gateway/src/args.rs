//! The command line: every flag, its default and its refusals, and the usage.

use super::*;
use tower_redis_ratelimit::rate_limit::file::parse_duration;

pub(crate) const USAGE: &str = "usage: gateway [--listen ADDR] [--redis URL] [--redis-cluster URL,URL,...] \
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
[--upstream http://HOST:PORT[/PREFIX] [--upstream-timeout-ms N]] [--threads N]
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
        threads: None,
        given: Vec::new(),
    };
    // Arguments as the OS gives them: any bytes, never a panic. clap reads the command line
    // (which flags, their values, `--flag=value`); each flag's meaning and refusals are
    // `apply_flag`'s, in the order given, as for a `--config` file. A list (`--allow`,
    // `--deny`) is read as bytes, so that it can name a key that is not UTF-8; every other
    // value is text.
    for (flag, value) in command_line(std::env::args_os())? {
        a.given.push(flag.to_owned());
        match value {
            Some(list) if flag == "--allow" || flag == "--deny" => {
                apply_list(&mut a, flag, list.as_bytes())?
            }
            Some(value) => {
                let value = value.into_string().map_err(|value| {
                    format!("{flag}: {:?} is not UTF-8", value.to_string_lossy())
                })?;
                apply_flag(&mut a, flag, Some(value))?
            }
            None => apply_flag(&mut a, flag, None)?,
        }
    }
    Ok(a)
}

/// The command line's flags, each with its value (`None` for a flag without one), in the
/// order given; `--help` and `--version` stop here.
fn command_line(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<Vec<(&'static str, Option<std::ffi::OsString>)>, Stop> {
    use clap::{Arg, ArgAction, Command};
    let mut command = Command::new("gateway")
        .disable_help_flag(true)
        .disable_version_flag(true)
        .arg(
            Arg::new("help")
                .short('h')
                .long("help")
                .action(ArgAction::SetTrue),
        )
        .arg(
            Arg::new("version")
                .short('V')
                .long("version")
                .action(ArgAction::SetTrue),
        );
    for &flag in BOOLEAN_FLAGS {
        command = command.arg(Arg::new(flag).long(&flag[2..]).action(ArgAction::Count));
    }
    for &flag in VALUE_FLAGS {
        command = command.arg(
            Arg::new(flag)
                .long(&flag[2..])
                .action(ArgAction::Append)
                .num_args(1)
                // The next argument is the value, whatever it looks like (`--ipv6-prefix -1`
                // is refused by `--ipv6-prefix`, not taken for a flag).
                .allow_hyphen_values(true)
                .value_parser(clap::value_parser!(std::ffi::OsString)),
        );
    }
    let matches = command.try_get_matches_from(args).map_err(refused)?;
    if matches.get_flag("help") {
        return Err(Stop::Help);
    }
    if matches.get_flag("version") {
        return Err(Stop::Version);
    }
    let mut given: Vec<(usize, &'static str, Option<std::ffi::OsString>)> = Vec::new();
    for &flag in BOOLEAN_FLAGS {
        if matches.get_count(flag) > 0 {
            for at in matches.indices_of(flag).into_iter().flatten() {
                given.push((at, flag, None));
            }
        }
    }
    for &flag in VALUE_FLAGS {
        let (Some(at), Some(values)) = (
            matches.indices_of(flag),
            matches.get_many::<std::ffi::OsString>(flag),
        ) else {
            continue;
        };
        given.extend(at.zip(values).map(|(at, v)| (at, flag, Some(v.clone()))));
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

/// The flags that take no value.
pub(crate) const BOOLEAN_FLAGS: &[&str] = &["--no-limit", "--batch", "--shadow", "--lazy-connect"];

/// The flags that take a value.
pub(crate) const VALUE_FLAGS: &[&str] = &[
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
    "--threads",
];

/// Sets what `flag` (with `value`, `None` for a flag without one) says in `a`.
pub(crate) fn apply_flag(a: &mut Args, flag: &str, value: Option<String>) -> Result<(), String> {
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
        _ => {
            let handled = store_flag(a, flag, value.clone())?
                || limit_flag(a, flag, value.clone())?
                || operating_flag(a, flag, value)?;
            assert!(handled, "{flag} is checked against VALUE_FLAGS");
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
