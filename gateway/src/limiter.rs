//! Building the limiter from the arguments: the key, the algorithm, the rate and concurrency
//! limiters, the regional store, and the refusals at start-up.

use super::*;

pub(crate) fn key_extractor(args: &Args) -> Result<Arc<dyn KeyExtractor>, Refusal> {
    Ok(match args.key.as_str() {
        "global" => Arc::new(GlobalKey),
        "ip" => Arc::new(client_ip(args)?),
        header => Arc::new(HeaderKey::new(&header["header:".len()..]).map_err(refusal("key"))?),
    })
}

/// Whether the limits keep lists that may name addresses: `--allow`, `--deny`, or those a
/// limits file may bring.
pub(crate) fn lists_addresses(args: &Args) -> bool {
    args.allow.is_some() || args.deny.is_some() || args.config.is_some()
}

/// Whether the limits read the client's address: `--key ip`, or lists of addresses.
pub(crate) fn reads_client_address(args: &Args) -> bool {
    args.key == "ip" || lists_addresses(args)
}

/// The client address as `--key ip` finds it: the peer, or what `--trusted-proxy` forwarded.
pub(crate) fn client_ip(args: &Args) -> Result<ClientIp, Refusal> {
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
pub(crate) struct Refusal {
    pub(crate) field: Option<String>,
    pub(crate) message: String,
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
pub(crate) fn refusal<E: std::fmt::Display>(field: impl Into<String>) -> impl FnOnce(E) -> Refusal {
    let field = field.into();
    move |e| Refusal {
        field: Some(field),
        message: e.to_string(),
    }
}

/// `--concurrency N --lease-ms M`: the concurrency limiter, checked before anything connects.
pub(crate) fn concurrency_limiter(
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
pub(crate) fn rate_limiter(
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
    if let Some(ban) = auto_ban(args) {
        builder = builder.ban_after(ban);
    }
    if let Some(max) = args.delay_up_to {
        builder = builder.delay(Delay::up_to(max));
    }
    builder.build().map_err(|e| match e.field() {
        f if f.starts_with("ban_after") => refusal("ban_after")(e),
        f if f.starts_with("delay") => refusal("delay_up_to")(format!(
            "--delay-up-to {:?} (--algorithm {}): {}",
            args.delay_up_to.unwrap_or_default(),
            args.algorithm,
            e.reason()
        )),
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

/// `--ban-after N` with its window, duration and escalation (their defaults: 60 s, 300 s, 2).
pub(crate) fn auto_ban(args: &Args) -> Option<AutoBan> {
    let within = args.bans.within.unwrap_or(Duration::from_secs(60));
    let duration = args.bans.duration.unwrap_or(Duration::from_secs(300));
    let ban = AutoBan::new(args.bans.after?, within, duration);
    Some(ban.escalate(args.bans.escalate.unwrap_or(2.0)))
}

/// The `--ban-*` flags that cannot work: the others without `--ban-after`, and automatic bans
/// across `--regions` (which keep no bans).
fn check_bans(args: &Args) -> Result<(), Refusal> {
    let given = [
        ("ban_within", args.bans.within.is_some()),
        ("ban_for", args.bans.duration.is_some()),
        ("ban_escalate", args.bans.escalate.is_some()),
    ];
    if let (None, Some((field, _))) = (args.bans.after, given.iter().find(|(_, on)| *on)) {
        let flag = format!("--{}", field.replace('_', "-"));
        return Err(refusal(*field)(format!(
            "{flag} is a setting of automatic bans: give --ban-after N"
        )));
    }
    if args.bans.after.is_some() && args.regions.is_some() {
        return Err(refusal("ban_after")(
            "--ban-after does not work across --regions (regions keep no bans)",
        ));
    }
    if args.delay_up_to.is_some() && args.regions.is_some() {
        return Err(refusal("delay_up_to")(
            "--delay-up-to does not work across --regions (a region's pool keeps no places in time)",
        ));
    }
    Ok(())
}

/// Everything that can be checked before connecting to anything: the quota and the algorithm
/// it builds, or the first setting that cannot work (at start-up, `--check-config`, a reload).
pub(crate) fn check(args: &Args) -> Result<(Quota, Arc<dyn Algorithm>), Refusal> {
    let (quota, algorithm) = algorithm_of(args)?;
    // Built to be refused or dropped: its gauges (the limit in force, the breaker) must not
    // overwrite those of the limiter serving requests, so it reports to no recorder.
    metrics::with_local_recorder(&metrics::NoopRecorder, || {
        rate_limiter(args, Arc::new(MemoryStore::new()), Arc::clone(&algorithm))
    })?;
    check_bans(args)?;
    key_extractor(args)?;
    admin_token(args)?;
    check_combinations(args)?;
    concurrency_limiter(args, Some(Arc::new(MemoryStore::new())))?;
    let uses_redis =
        args.redis.is_some() || args.redis_cluster.is_some() || args.redis_sentinel.is_some();
    check_regions(args, uses_redis)?;
    rls::check(args)?;
    cost_fits(args)?;
    check_plans(args, &*algorithm)?;
    Ok((quota, algorithm))
}

/// The quota the flags set and the algorithm it builds, or the setting that cannot work.
fn algorithm_of(args: &Args) -> Result<(Quota, Arc<dyn Algorithm>), Refusal> {
    let quota = quota_of(args);
    let quota_refusal = |e: ConfigError| {
        let field = match e.field() {
            "quota.limit" => "limit",
            "quota.burst" => "burst",
            "quota.period" => "per",
            _ => "algorithm",
        };
        refusal(field)(e)
    };
    if args.calendar.is_some() && args.algorithm != "fixed-window" {
        return Err(refusal("per")(format!(
            "--per {}: a calendar window (1w, 1mo, 1y) is counted by --algorithm fixed-window, not {}; give a duration (7d, 30d, 365d) for {}",
            period_text(args.per, args.calendar),
            args.algorithm,
            args.algorithm
        )));
    }
    let algorithm: Arc<dyn Algorithm> = match args.algorithm.as_str() {
        "token-bucket" => Arc::new(TokenBucket::new(quota).map_err(quota_refusal)?),
        "sliding-window" => Arc::new(SlidingWindow::new(quota).map_err(quota_refusal)?),
        "fixed-window" => {
            let window = FixedWindow::new(quota).map_err(quota_refusal)?;
            match args.calendar {
                Some(c) => Arc::new(FixedWindow::calendar(c, args.limit).map_err(quota_refusal)?),
                None => Arc::new(window),
            }
        }
        _ => Arc::new(Gcra::new(quota).map_err(quota_refusal)?),
    };
    Ok((quota, algorithm))
}

/// Flags that each work, given together where they cannot.
fn check_combinations(args: &Args) -> Result<(), Refusal> {
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
    if args.settle_header.is_some() && args.upstream.is_none() {
        return Err(refusal("settle_header")(
            "--settle-header NAME settles each charge from the upstream's answer: give --upstream URL",
        ));
    }
    if args.settle_header.is_some() && (args.unit_lease.is_some() || args.regions.is_some()) {
        return Err(refusal("settle_header")(
            "--settle-header settles charges in the store: not those answered from --unit-lease-ms, nor across --regions",
        ));
    }
    Ok(())
}

/// Each `--plan`: on a header key, given once per key, of `--per`'s calendar, and a quota
/// `algorithm` takes.
fn check_plans(args: &Args, algorithm: &dyn Algorithm) -> Result<(), Refusal> {
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
        // A calendar plan on calendar windows of the same kind only (a 30-day plan and a
        // calendar month have one nominal length, but not the same windows).
        if plan_calendar(given) != args.calendar {
            return Err(refusal(field)(format!(
                "--plan {given}: a plan's period is --per's ({})",
                period_text(args.per, args.calendar)
            )));
        }
        // The check the limiter makes of each request's quota (a sliding window takes only
        // quotas of its own period): a plan it would refuse is refused now.
        algorithm
            .with_quota(*plan)
            .map_err(|e| refusal(field)(format!("--plan {given}: {e}")))?;
    }
    Ok(())
}

/// `--cost N` fits in what a rested key holds (else every request would be refused).
pub(crate) fn cost_fits(args: &Args) -> Result<(), Refusal> {
    let capacity = quota_of(args).burst_size();
    if args.cost > capacity {
        return Err(refusal("cost")(format!(
            "--cost {} is more than a key ever holds ({capacity}): every request would be refused",
            args.cost
        )));
    }
    Ok(())
}

/// A quota as the start-up lines show it: `5 per 60s`, `1000 per calendar month (UTC)`.
pub(crate) fn quota_text(quota: &Quota, calendar: Option<Calendar>) -> String {
    let window = match calendar {
        Some(Calendar::Week) => "calendar week (from Monday, UTC)",
        Some(Calendar::Month) => "calendar month (UTC)",
        Some(Calendar::Year) => "calendar year (UTC)",
        _ => return quota.to_string(),
    };
    format!("{} per {window}", quota.limit())
}

/// A period as `--per` takes it: `1mo` for a calendar month, else the duration.
pub(crate) fn period_text(per: Duration, calendar: Option<Calendar>) -> String {
    match calendar {
        Some(Calendar::Week) => "1w".into(),
        Some(Calendar::Month) => "1mo".into(),
        Some(Calendar::Year) => "1y".into(),
        _ => format!("{per:?}"),
    }
}

/// With `--regions`: `--region` names one of them, and nothing that cannot work across
/// regions is given.
pub(crate) fn check_regions(args: &Args, uses_redis: bool) -> Result<(), Refusal> {
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
pub(crate) async fn regional_store(
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
        .map_err(|e| format!("--regions {name}={shown}: {}", ErrorChain(&e)))?;
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

/// The store flags given together, or the first combination that cannot work.
fn check_store_flags(args: &Args) -> Result<(), BoxError> {
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
    Ok(())
}

/// The stores the flags name, connected: the rate state's, the concurrency slots' (every
/// store but the regional one keeps them), and with `--regions` the regional store.
pub(crate) struct Connected {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) slots: Option<Arc<dyn SlotStore>>,
    pub(crate) regional: Option<RegionalStore>,
}

/// Connects the store the flags name, each connection refused with the flag at fault.
pub(crate) async fn connect_store(args: &Args) -> Result<Connected, BoxError> {
    check_store_flags(args)?;
    let builder = redis_builder(args)?;
    let batching = |store: RedisStore| -> Result<RedisStore, String> {
        if !args.batch {
            return Ok(store);
        }
        println!("batching: concurrent checks share one script call (exact)");
        store
            .with_batching(Batching::new())
            .map_err(|e| format!("--batch: {}", ErrorChain(&e)))
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
            let store = regional_store(args, builder).await?;
            regional = Some(store.clone());
            Arc::new(store)
        }
        (_, Some(nodes), _) => {
            let store = builder
                .connect_cluster(nodes)
                .await
                .map_err(|e| format!("--redis-cluster {}: {}", shown(nodes), ErrorChain(&e)))?;
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
                .map_err(|e| {
                    format!("--redis-sentinel {}: {}", shown(sentinels), ErrorChain(&e))
                })?;
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
                .map_err(|e| format!("--redis {shown}: {}", ErrorChain(&e)))?;
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
    Ok(Connected {
        store,
        slots,
        regional,
    })
}

/// The Redis connections' settings: the connect timeout, lazy connection, the TLS files.
fn redis_builder(
    args: &Args,
) -> Result<tower_redis_ratelimit::store::redis::RedisStoreBuilder, BoxError> {
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
    Ok(builder)
}
