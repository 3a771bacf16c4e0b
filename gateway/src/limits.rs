//! `--config FILE`: the limit settings read from TOML, and `--check-config`.

use super::*;

/// The keys of a `--config` file: the limit settings' flags, dashes as underscores.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileFlags {
    pub(crate) algorithm: Option<String>,
    pub(crate) limit: Option<u32>,
    pub(crate) per: Option<String>,
    pub(crate) burst: Option<u32>,
    pub(crate) key: Option<String>,
    pub(crate) trusted_proxy: Option<Vec<String>>,
    pub(crate) ipv6_prefix: Option<u8>,
    pub(crate) on_redis_error: Option<String>,
    pub(crate) local_share: Option<u32>,
    pub(crate) timeout_ms: Option<u64>,
    pub(crate) headers: Option<String>,
    pub(crate) plans: Option<std::collections::BTreeMap<String, String>>,
    pub(crate) count_only: Option<String>,
    pub(crate) cost: Option<u32>,
    pub(crate) concurrency: Option<u32>,
    pub(crate) lease_ms: Option<u64>,
    pub(crate) unit_lease_ms: Option<u64>,
    pub(crate) shadow: Option<bool>,
    pub(crate) ban_after: Option<u32>,
    pub(crate) ban_within: Option<String>,
    pub(crate) ban_for: Option<String>,
    pub(crate) ban_escalate: Option<f64>,
    pub(crate) delay_up_to: Option<String>,
    pub(crate) allow: Option<Vec<String>>,
    pub(crate) deny: Option<Vec<String>>,
}

/// The keys of a `--config` file (the fields of [`FileFlags`]), in the order of the flags.
pub(crate) const FILE_KEYS: &[&str] = &[
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
    "cost",
    "concurrency",
    "lease_ms",
    "unit_lease_ms",
    "shadow",
    "ban_after",
    "ban_within",
    "ban_for",
    "ban_escalate",
    "delay_up_to",
    "allow",
    "deny",
];

/// The command-line flag of a file key (`plans` is the file's name for `--plan`).
pub(crate) fn flag_of(key: &str) -> String {
    match key {
        "plans" => "--plan".to_owned(),
        key => format!("--{}", key.replace('_', "-")),
    }
}

/// Flags that stay flags: refused in a file, with a word on where they go.
pub(crate) const NOT_IN_FILE: &[&str] = &[
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
    "upstream",
    "upstream_timeout_ms",
    "drain_ms",
    "threads",
];

/// The settings of `base` (the command line) with those of the file at `path`: every error
/// names the file, and the line and the field; a flag given on the command line and in the
/// file is refused.
pub(crate) fn with_file(base: &Args, path: &str) -> Result<Args, String> {
    let text = file::read(path).map_err(|e| format!("--config {path}: {e}"))?;
    with_text(base, path, &text)
}

/// [`with_file`], the file's text read already.
pub(crate) fn with_text(base: &Args, path: &str, text: &str) -> Result<Args, String> {
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
    let pairs = flag_values(&file);
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

/// A limits file's settings as flag values: (the file key, the field an error names:
/// `plans.KEY` for a plan, the value as the flag takes it).
fn flag_values(file: &FileFlags) -> Vec<(&'static str, String, Option<String>)> {
    let mut pairs = Vec::new();
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
    put_values!(count_only, cost, concurrency, lease_ms, unit_lease_ms);
    put_values!(ban_after, ban_within, ban_for, ban_escalate, delay_up_to);
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
    pairs
}

/// The settings a reload may change: those of [`Limits`]. The others (the algorithm, the key
/// and the rest) need a restart.
pub(crate) fn fixed(a: &Args) -> [(&'static str, String); 17] {
    [
        // Calendar windows and windows of a duration are not the same windows, even of one
        // nominal length (1mo and 30d).
        (
            "per",
            match a.calendar {
                Some(_) => period_text(a.per, a.calendar),
                None => "a duration".into(),
            },
        ),
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
        // The automatic bans are the limiter's, built once: a change needs a restart.
        ("ban_after", format!("{:?}", a.bans.after)),
        ("ban_within", format!("{:?}", a.bans.within)),
        ("ban_for", format!("{:?}", a.bans.duration)),
        ("ban_escalate", format!("{:?}", a.bans.escalate)),
    ]
}

/// The quota `--limit`, `--per` and `--burst` set (keys without a plan).
pub(crate) fn quota_of(a: &Args) -> Quota {
    let quota = Quota::new(a.limit, a.per);
    match a.burst {
        Some(b) => quota.burst(b),
        None => quota,
    }
}

/// The limits `a` sets, for the layer's live limits.
pub(crate) fn limits_of(a: &Args) -> Limits {
    let mut limits = Limits::new(quota_of(a))
        .shadow(a.shadow)
        .delay_up_to(a.delay_up_to.unwrap_or_default());
    for (key, plan, _) in &a.plans {
        limits = limits.plan(key, *plan);
    }
    limits
        .allow(a.allow.clone().unwrap_or_default())
        .deny(a.deny.clone().unwrap_or_default())
}

/// `--check-config FILE`: `ok` on stdout, or the error on stderr.
pub(crate) fn check_config(args: &Args, path: &str) -> ExitCode {
    match with_file(args, path)
        .map_err(BoxError::from)
        .and_then(|a| Ok(check(&a)?))
    {
        Ok(_) => {
            println!("ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", ErrorChain(&*e));
            ExitCode::FAILURE
        }
    }
}
