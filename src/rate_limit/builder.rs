//! Building a [`RateLimiter`]: every option validated at once, with an error naming the field.

use std::{
    fmt,
    sync::{atomic::AtomicBool, Arc},
};

use arc_swap::ArcSwapOption;

use super::{
    autoban::{self, AutoBan},
    banner::Banner,
    delay::{Delay, Delays},
    engine::RateEngine,
    limiter::RateLimiter,
};
use crate::{
    algorithm::Algorithm,
    core::report::KeyMeters,
    core::{common_options, Core, DenyCache, Leasing, Options, TopKeys, UnitLease},
    error::ConfigError,
    extract::Key,
    store::FailurePolicy,
    store::{compact_prefix, MemoryStore, Store},
};

/// The most keys [`RateLimiterBuilder::top_keys`] takes.
const MAX_TOP_KEYS: usize = 100_000;

impl<A: Algorithm> RateLimiter<A> {
    /// The policy name of a limiter not given one.
    pub const DEFAULT_POLICY_NAME: &'static str = "default";

    /// The number of live denials the deny cache of a limiter not told otherwise holds.
    pub const DEFAULT_DENY_CACHE_KEYS: usize = 100_000;

    /// A limiter with the default prefix (`rl`), policy name (`default`), store timeout
    /// (100 ms), key length bound (128 bytes) and failure policy ([`FailurePolicy::Open`]).
    ///
    /// Fails, naming `policy_name`, when another limiter on the same store already counts
    /// under the default namespace (`rl:default`) with another algorithm or quota: give each
    /// its own [`policy_name`](RateLimiterBuilder::policy_name) with
    /// [`builder`](Self::builder).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `policy_name` when another limiter on the same store already
    /// counts under the same prefix and policy name with another algorithm or quota.
    pub fn new(store: impl Store, algorithm: A) -> Result<Self, ConfigError> {
        Self::builder(store, algorithm).build()
    }

    /// How many keys a limiter tracks for [`top_keys`](Self::top_keys) unless told otherwise
    /// ([`RateLimiterBuilder::top_keys`]).
    pub const DEFAULT_TOP_KEYS: usize = 128;

    /// A builder for the other options.
    pub fn builder(store: impl Store, algorithm: A) -> RateLimiterBuilder<A> {
        RateLimiterBuilder {
            store: Arc::new(store),
            algorithm,
            options: Options::new(Self::DEFAULT_POLICY_NAME),
            deny_cache: Self::DEFAULT_DENY_CACHE_KEYS,
            common_counters: false,
            shadow: false,
            shadow_headers: false,
            top_keys: Self::DEFAULT_TOP_KEYS,
            metric_keys: Vec::new(),
            lease: None,
            ban_after: None,
            delay: None,
        }
    }
}

/// Options for a [`RateLimiter`]; [`build`](Self::build) validates them.
pub struct RateLimiterBuilder<A> {
    store: Arc<dyn Store>,
    algorithm: A,
    options: Options,
    deny_cache: usize,
    common_counters: bool,
    shadow: bool,
    shadow_headers: bool,
    top_keys: usize,
    metric_keys: Vec<Key<'static>>,
    lease: Option<UnitLease>,
    ban_after: Option<AutoBan>,
    delay: Option<Delay>,
}

impl<A: Algorithm> fmt::Debug for RateLimiterBuilder<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiterBuilder")
            .field("algorithm", &self.algorithm.name())
            .field("prefix", &self.options.prefix)
            .field("policy", &self.options.policy)
            .finish_non_exhaustive()
    }
}

impl<A: Algorithm> RateLimiterBuilder<A> {
    common_options!();

    /// Every common option (prefix, policy name, store timeout, ...) at once, e.g. another builder's.
    #[cfg(feature = "rls")]
    pub(crate) fn with_options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    /// Counts in common with other limiters of the same namespace (prefix and policy name)
    /// that decide with another algorithm or quota, on purpose: e.g. a back-fill job with a
    /// lower threshold on the same sliding-window log as interactive calls, so that bulk work
    /// only uses what interactive calls leave. Every limiter counting in common must call it;
    /// otherwise building the second one is a [`ConfigError`] naming `policy_name`.
    pub fn common_counters(mut self) -> Self {
        self.common_counters = true;
        self
    }

    /// The exact local deny cache: once the store denies a cost-1 check of a key with no units
    /// left, this limiter denies further cost-1 checks of that key itself until one unit is
    /// free again, without a round trip. Exact (nothing but time frees capacity, and the
    /// deadline is measured from when the check was sent), so it never allows what the store
    /// would deny nor denies what it would allow; the flood case then costs no Redis calls.
    /// Holds at most `max_keys` live denials (default 100,000); 0 switches it off. An entry
    /// answers for at most one second before the store is asked again, so state lost in Redis
    /// (a restart, `FLUSHDB`) is noticed within a second.
    pub fn deny_cache(mut self, max_keys: usize) -> Self {
        self.deny_cache = max_keys;
        self
    }

    /// Shadow (dry-run) mode, to roll a new limit out without risk (default off). The limiter
    /// decides and records everything as usual (the [`Decision`](crate::rate_limit::Decision),
    /// its counters, tracing and metrics), but a [`RateLimitLayer`](crate::RateLimitLayer)
    /// under this policy changes nothing a client sees:
    ///
    /// - every request goes on to the inner service, and its response gets no rate-limit
    ///   field (`RateLimit`, `RateLimit-Policy`, `X-RateLimit-*`, `Retry-After`) from this
    ///   policy, unless [`shadow_headers`](Self::shadow_headers) turns them on;
    /// - a request over its limit is a would-be denial: [`Verdict::WouldDeny`](crate::telemetry::Verdict::WouldDeny) in the
    ///   decision ([`Decision::verdict`](crate::rate_limit::Decision::verdict)), counted
    ///   ([`LimiterStats::would_deny`](crate::telemetry::LimiterStats::would_deny), the metric
    ///   `ratelimit_decisions_total{decision="would_deny"}`), its key in
    ///   [`RateLimiter::top_keys`](crate::RateLimiter::top_keys), and logged: each one with
    ///   its key at `trace`, and at `info` a line every ten seconds per policy with how many
    ///   there were ("rate limit: would deny (shadow mode)", `would_deny=N`; a key can be a
    ///   credential, so no line above `trace` names it);
    /// - a store failure lets the request through, whatever
    ///   [`on_store_error`](Self::on_store_error) says (it is still logged and counted).
    ///
    /// A [`ThrottleLayer`](crate::throttle::ThrottleLayer) on such a limiter never waits nor
    /// fails: a denial is counted and logged the same way, and the request goes out at once.
    ///
    /// A denied request spends nothing, as when enforcing, so the counts are the ones the
    /// limit would see if it were enforced. [`RateLimiter::check`](crate::RateLimiter::check)
    /// still returns the real decision (`allowed: false`, with
    /// [`shadow`](crate::rate_limit::Decision::shadow) set): direct callers read it.
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// let trial = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_minute(60))?)
    ///     .policy_name("new-limit")
    ///     .shadow(true)
    ///     .build()?;
    /// assert!(trial.is_shadow());
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// In [shadow mode](Self::shadow), whether responses still get this policy's rate-limit
    /// fields (default off: shadow mode changes nothing a client sees). When on, a response
    /// gets the fields of its decision, a would-be denial's included (`r=0`, and `t` until
    /// it would have been allowed), but never a `Retry-After`. Off of shadow mode, it changes
    /// nothing.
    pub fn shadow_headers(mut self, on: bool) -> Self {
        self.shadow_headers = on;
        self
    }

    /// How many keys this limiter tracks for [`RateLimiter::top_keys`] (default 128; 0
    /// switches the tracking off; at most 100,000): the keys it denies (or, in shadow mode,
    /// would deny) most, counted approximately in fixed memory (about 400 bytes per key
    /// tracked) whatever the number of keys. Counts are exact while fewer keys than this
    /// were denied.
    ///
    /// [`RateLimiter::top_keys`]: crate::RateLimiter::top_keys
    pub fn top_keys(mut self, capacity: usize) -> Self {
        self.top_keys = capacity;
        self
    }

    /// Keys whose decisions get metrics of their own (feature `metrics`; default none): the
    /// counter `ratelimit_key_decisions_total{policy, key, decision}` for each key listed, the
    /// key written as the key extractor gives it (`"tenant-42"`, `"203.0.113.9"`,
    /// `"2001:db8::/64"`). Only the keys listed get a label, so the number of series stays
    /// what you chose, whatever keys clients send. For the keys nobody listed, see
    /// [`top_keys`](Self::top_keys).
    ///
    /// ```
    /// # use tower_redis_ratelimit::*;
    /// let limiter = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_minute(600))?)
    ///     .metric_keys(["big-customer", "partner-api"])
    ///     .build()?;
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn metric_keys<'k>(mut self, keys: impl IntoIterator<Item = impl Into<Key<'k>>>) -> Self {
        self.metric_keys = keys.into_iter().map(|k| k.into().into_owned()).collect();
        self
    }

    /// Unit leases for hot keys that are allowed (default off): this limiter reserves blocks
    /// of a hot key's units in one store call and hands them out itself, within the lease's
    /// lifetime of sending the reservation, and gives back what it did not hand out. Exact in
    /// count, shifted in time by at most the lifetime: in any window of the quota's period,
    /// all instances together admit at most what the algorithm admits in period + lifetime.
    /// Decisions answered from a lease carry approximate `remaining` and reset times. See
    /// [`UnitLease`].
    ///
    /// Only [`Gcra`](crate::Gcra) and [`TokenBucket`](crate::TokenBucket) can be leased
    /// (else a [`ConfigError`] naming `lease`); on a [`MemoryStore`] it changes nothing.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_redis_ratelimit::*;
    /// use tower_redis_ratelimit::rate_limit::UnitLease;
    ///
    /// let limiter = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_second(50_000))?)
    ///     .lease(UnitLease::up_to(Duration::from_millis(50)))
    ///     .build()?;
    /// let window = RateLimiter::builder(MemoryStore::new(), SlidingWindow::new(Quota::per_second(10))?)
    ///     .lease(UnitLease::up_to(Duration::from_millis(50)))
    ///     .build();
    /// assert_eq!(window.unwrap_err().field(), "lease");
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn lease(mut self, lease: UnitLease) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Bans a key refused too often, by itself: see [`AutoBan`] (the terms, and how the
    /// refusals are counted). The ban is the one [`RateLimiter::ban`] sets, shared by every
    /// instance on the store. In shadow mode, the ban that would be set is logged, never set.
    ///
    /// [`build`](Self::build) refuses terms that cannot work (a [`ConfigError`] naming
    /// `ban_after.after`, `ban_after.within`, `ban_after.duration` or `ban_after.escalate`),
    /// and `ban_after` across regions or with a custom algorithm (neither keeps bans).
    pub fn ban_after(mut self, terms: AutoBan) -> Self {
        self.ban_after = Some(terms);
        self
    }

    /// Lets a request over the limit wait for its units, up to [`Delay::up_to`], instead of
    /// refusing it: see [`Delay`] (how the wait is kept exactly across instances, and what
    /// bounds the requests waiting). [`Decision::delayed`](super::Decision::delayed) says how
    /// long a request waited. A request that goes away while it waits gives its units back.
    ///
    /// [`build`](Self::build) refuses a delay that cannot work: a [`ConfigError`] naming
    /// `delay.up_to` or `delay.waiting` for its terms, or `delay` with an algorithm other
    /// than GCRA and the token bucket, with unit leases, or on a store that does not keep
    /// places (across regions).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_redis_ratelimit::{rate_limit::Delay, *};
    /// let window = RateLimiter::builder(MemoryStore::new(), SlidingWindow::new(Quota::per_second(10))?)
    ///     .delay(Delay::up_to(Duration::from_secs(1)))
    ///     .build();
    /// assert_eq!(window.unwrap_err().field(), "delay");
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn delay(mut self, delay: Delay) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Validates the options; the error names the field.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first setting that cannot work (the store timeout, the
    /// failure policy, unit leases, top keys, a setting the store cannot run).
    pub fn build(self) -> Result<RateLimiter<A>, ConfigError> {
        if self.top_keys > MAX_TOP_KEYS {
            return Err(ConfigError::new(
                "top_keys",
                format!("must be at most {MAX_TOP_KEYS}"),
            ));
        }
        let regional = self.store.regional();
        let banner = self.banner(regional)?;
        self.check_delay()?;
        if regional {
            refuse_across_regions(&self.algorithm, self.lease.is_some())?;
        }
        self.store.check_timeout(self.options.timeout)?;
        let cap = match &self.lease {
            Some(lease) => Some(lease.validate(self.algorithm.rule())?),
            None => None,
        };
        let algorithm = Arc::new(self.algorithm);
        let manual_clock = self.store.manual_clock();
        let namespace = self.options.namespace();
        let rule = fingerprint(&*algorithm);
        let core = self
            .options
            .build(self.store, algorithm.name(), rule, self.common_counters)?;
        let local = match core.failure {
            FailurePolicy::Local => Some(local_engine(&*algorithm, &core, &namespace)?),
            _ => None,
        };
        let dyn_algorithm: Arc<dyn Algorithm> = algorithm.clone();
        // A store on a manual clock decides on its own time; the cache's is real.
        // Across regions, a refill may free units at any time: a denial is not exact.
        let deny_cache = (self.deny_cache > 0 && !manual_clock && !regional)
            .then(|| DenyCache::new(self.deny_cache));
        let leasing = match (&self.lease, cap) {
            (Some(lease), Some(cap)) => {
                // Any other algorithm is refused by `UnitLease::validate`.
                let emission_us = dyn_algorithm
                    .rule()
                    .bucket_rate()
                    .map_or(0, |r| r.emission_us());
                Some(Leasing::new(lease, cap, emission_us))
            }
            _ => None,
        };
        let prefix = compact_prefix(&core.namespace, algorithm.name());
        register_series(&core, self.shadow, deny_cache.is_some(), leasing.is_some());
        if core.reports {
            crate::core::report::policy_in_force(
                &core.policy,
                algorithm.quota(),
                algorithm.window(),
                self.shadow,
            );
        }
        let delays = Delays::new(self.delay, Arc::clone(&core.policy));
        let engine = RateEngine {
            core,
            algorithm: dyn_algorithm,
            deny_cache,
            leasing,
            shadow: AtomicBool::new(self.shadow),
            shadow_headers: self.shadow_headers,
            top: (self.top_keys > 0).then(|| TopKeys::new(self.top_keys)),
            key_meters: KeyMeters::new(self.metric_keys),
            local,
            prefix,
            live: ArcSwapOption::empty(),
            watch: Default::default(),
            banner,
            delays,
        };
        let engine = Arc::new(engine);
        autoban::bind(&engine);
        Ok(RateLimiter { engine, algorithm })
    }
}

/// Registers at 0 the decisions' series a dashboard reads from the start: allowed and
/// denied (`would_deny` in shadow mode) by the store, and by the deny cache and unit leases
/// when they are on. The rest appear on their first decision.
impl<A: Algorithm> RateLimiterBuilder<A> {
    /// The automatic bans, their terms checked.
    fn banner(&self, regional: bool) -> Result<Option<Banner>, ConfigError> {
        let Some(ban_after) = &self.ban_after else {
            return Ok(None);
        };
        let terms = ban_after.terms()?;
        if regional {
            return Err(ConfigError::new(
                "ban_after",
                "automatic bans do not work across regions (a RegionalStore keeps no bans)",
            ));
        }
        if self.algorithm.rule().is_script() {
            return Err(ConfigError::new(
                "ban_after",
                "a custom algorithm's script reads no ban",
            ));
        }
        Ok(Some(Banner::new(terms)))
    }
}

impl<A: Algorithm> RateLimiterBuilder<A> {
    /// The delay, if any, checked against the algorithm, the store and unit leases.
    fn check_delay(&self) -> Result<(), ConfigError> {
        let Some(delay) = self.delay else {
            return Ok(());
        };
        delay.checked()?;
        delayable(&self.algorithm, &*self.store)?;
        if self.lease.is_some() {
            return Err(ConfigError::new(
                "delay",
                "a delay keeps each request's place in the store: it cannot take units from unit leases",
            ));
        }
        Ok(())
    }
}

/// Whether `algorithm` on `store` can delay requests: GCRA and the token bucket keep places,
/// on a store that keeps them.
pub(super) fn delayable(algorithm: &dyn Algorithm, store: &dyn Store) -> Result<(), ConfigError> {
    use crate::algorithm::Kind;
    if !matches!(
        algorithm.rule().kind(),
        Kind::Gcra(_) | Kind::TokenBucket(_)
    ) {
        return Err(ConfigError::new(
            "delay",
            format!(
                "{} cannot delay requests (a window's units have no time of their own): use GCRA or the token bucket",
                algorithm.name()
            ),
        ));
    }
    if !store.schedules() {
        return Err(ConfigError::new(
            "delay",
            "this store keeps no places for delayed requests (a RegionalStore)",
        ));
    }
    Ok(())
}

fn register_series(core: &Core, shadow: bool, deny_cache: bool, leasing: bool) {
    use crate::decision::{Source, Verdict};
    if !core.reports {
        return;
    }
    let refused = match shadow {
        true => Verdict::WouldDeny,
        false => Verdict::Denied,
    };
    let mut expected = vec![(Verdict::Allowed, Source::Store), (refused, Source::Store)];
    if deny_cache {
        expected.push((refused, Source::DenyCache));
    }
    if leasing {
        expected.push((Verdict::Allowed, Source::UnitLease));
    }
    core.meters.register(&core.policy, &expected);
}

/// Under [`FailurePolicy::Local`]: the same algorithm at the local share, in memory.
fn local_engine(
    algorithm: &dyn Algorithm,
    core: &Core,
    namespace: &str,
) -> Result<Arc<RateEngine>, ConfigError> {
    let Some(shared) = algorithm.local_share(core.share) else {
        return Err(ConfigError::new(
            "on_store_error",
            format!(
                "FailurePolicy::Local needs an algorithm whose quota can be divided among \
                 instances; {} cannot",
                algorithm.name()
            ),
        ));
    };
    let prefix = compact_prefix(namespace, shared.name());
    Ok(Arc::new(RateEngine {
        core: Core::local(Arc::new(MemoryStore::new()), namespace, &core.policy),
        algorithm: shared,
        deny_cache: None,
        leasing: None,
        shadow: AtomicBool::new(false),
        shadow_headers: false,
        top: None,
        key_meters: KeyMeters::default(),
        local: None,
        prefix,
        live: ArcSwapOption::empty(),
        watch: Default::default(),
        banner: None,
        delays: Delays::new(None, Arc::clone(&core.policy)),
    }))
}

/// What a limiter on a store spread across regions cannot do: an algorithm other than GCRA
/// or the token bucket, unit leases.
fn refuse_across_regions(algorithm: &dyn Algorithm, leased: bool) -> Result<(), ConfigError> {
    if algorithm.rule().bucket_rate().is_none() {
        return Err(ConfigError::new(
            "algorithm",
            format!(
                "only GCRA and the token bucket run across regions, not {}",
                algorithm.name()
            ),
        ));
    }
    if leased {
        return Err(ConfigError::new(
            "lease",
            "unit leases do not work across regions (each region's pool already is one)",
        ));
    }
    Ok(())
}

/// What a limiter decides with, to tell two limiters of one namespace apart.
fn fingerprint(algorithm: &dyn Algorithm) -> String {
    let parts: Vec<&str> = algorithm.parts().iter().map(|p| &*p.name).collect();
    match parts.is_empty() {
        true => format!("{:?}", algorithm.rule()),
        false => format!("{:?} {parts:?}", algorithm.rule()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{algorithm::Gcra, error::Error, quota::Quota};
    use std::time::Duration;

    fn builder() -> RateLimiterBuilder<Gcra> {
        RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_second(1)).unwrap())
    }

    #[test]
    fn rejects_bad_options_naming_the_field() {
        let field = |b: RateLimiterBuilder<Gcra>| b.build().unwrap_err().field();
        assert_eq!(field(builder().prefix("")), "prefix");
        assert_eq!(field(builder().prefix("a{b")), "prefix");
        assert_eq!(field(builder().prefix("a b")), "prefix");
        assert_eq!(field(builder().policy_name("x\"y")), "policy_name");
        assert_eq!(field(builder().policy_name("")), "policy_name");
        assert_eq!(
            field(builder().store_timeout(Duration::ZERO)),
            "store_timeout"
        );
        assert_eq!(field(builder().max_key_len(3)), "max_key_len");
        assert_eq!(field(builder().local_share(0)), "local_share");
        assert!(builder()
            .prefix("api:v1")
            .policy_name("free-tier")
            .build()
            .is_ok());
    }

    #[test]
    fn long_and_marker_keys_are_hashed() {
        let l = builder().build().unwrap();
        let long = "k".repeat(129);
        let hashed = l.storage_key(long.as_str());
        assert!(
            hashed.starts_with("{rl:default:#") && hashed.len() == 54,
            "{hashed}"
        );
        assert_eq!(
            l.storage_key("k".repeat(128)),
            format!("{{rl:default:{}}}", "k".repeat(128))
        );
        // A client cannot pick a raw key equal to another key's hashed form.
        let forged = &hashed[12..hashed.len() - 1];
        assert_ne!(l.storage_key(forged), hashed);
    }

    #[tokio::test]
    async fn zero_cost_is_an_error() {
        let l = builder().build().unwrap();
        assert!(matches!(l.check("k", 0).await, Err(Error::InvalidInput(_))));
    }
}
