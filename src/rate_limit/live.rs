//! Limits that change while a layer runs: its quota, per-key plans, allow and deny lists and
//! shadow mode, swapped atomically.

use std::{collections::HashMap, fmt, sync::Arc, time::Duration};

use arc_swap::ArcSwap;

use super::{
    engine::{LiveQuotas, Quoted, RateEngine},
    lists::{AccessList, Lists},
};
use crate::{
    decision::KeyState,
    error::{ConfigError, Error},
    extract::{ClientIp, Key},
    quota::Quota,
};

/// What a layer's [`LiveLimits`] hold: the default policy's quota, quotas per key (plans),
/// the allow and deny lists, and shadow mode. Built and checked whole, then swapped in at
/// once ([`LiveLimits::replace`]).
///
/// Each setting has one place: the quota a layer starts with is the limiter's algorithm's
/// (giving [`RateLimitLayer::live`](super::RateLimitLayer::live) another one is a
/// [`ConfigError`]; a [`replace`](LiveLimits::replace) changes it), and shadow mode left
/// unset here is the limiter's ([`RateLimiterBuilder::shadow`](super::RateLimiterBuilder::shadow)),
/// in the limits a layer starts with and in every replacement.
///
/// ```
/// use tower_redis_ratelimit::{rate_limit::{AccessList, Limits}, Quota};
///
/// let limits = Limits::new(Quota::per_minute(100))
///     .plan("gold", Quota::per_minute(1_000))
///     .allow(AccessList::parse(["10.0.0.0/8"])?)
///     .shadow(false);
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Limits {
    quota: Quota,
    plans: HashMap<Box<[u8]>, Quota>,
    allow: AccessList,
    deny: AccessList,
    /// `None`: the limiter's.
    shadow: Option<bool>,
    /// The longest wait of a request over the limit; `None`: the limiter's; zero: none.
    delay: Option<Duration>,
}

impl Limits {
    /// `quota` for every key without a plan; no plan, empty lists, shadow mode as the limiter
    /// has it.
    pub fn new(quota: Quota) -> Self {
        Self {
            quota,
            plans: HashMap::new(),
            allow: AccessList::new(),
            deny: AccessList::new(),
            shadow: None,
            delay: None,
        }
    }

    /// `quota` for requests whose key is `key` (its text as the key extractor produces it).
    pub fn plan(mut self, key: impl AsRef<[u8]>, quota: Quota) -> Self {
        self.plans.insert(key.as_ref().into(), quota);
        self
    }

    /// Keys and networks never limited (see [`RateLimitLayer::allow`](super::RateLimitLayer::allow)).
    pub fn allow(mut self, list: AccessList) -> Self {
        self.allow = list;
        self
    }

    /// Keys and networks always refused (see [`RateLimitLayer::deny`](super::RateLimitLayer::deny)).
    pub fn deny(mut self, list: AccessList) -> Self {
        self.deny = list;
        self
    }

    /// Shadow mode (see [`RateLimiterBuilder::shadow`](super::RateLimiterBuilder::shadow)).
    /// Unset, it is the limiter's, in the limits a layer starts with and in a replacement.
    /// Turning off here the shadow mode the limiter's builder turned on is a [`ConfigError`]
    /// naming `shadow` in the limits a layer starts with (the same setting given twice and
    /// different); a replacement may (a shadow rollout ends).
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = Some(on);
        self
    }

    /// Requests over the limit wait up to `max` for their units instead of being refused
    /// (see [`Delay`](super::Delay); zero: refused at once, as without a delay). Unset, the
    /// limiter's ([`RateLimiterBuilder::delay`](super::RateLimiterBuilder::delay)). A delay
    /// above an hour, or one the limiter's algorithm or store cannot keep, is a
    /// [`ConfigError`] naming `delay.up_to` or `delay`.
    pub fn delay_up_to(mut self, max: Duration) -> Self {
        self.delay = Some(max);
        self
    }

    /// The longest wait of a request over the limit: for the limits in force, the one in
    /// force (zero: none); for limits being built, the one set, if any.
    pub fn delay(&self) -> Option<Duration> {
        self.delay
    }

    /// The quota of keys without a plan.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// The plans: each key with a quota of its own (its text as the key extractor produces
    /// it), in no particular order.
    ///
    /// ```
    /// use tower_redis_ratelimit::{rate_limit::Limits, Quota};
    ///
    /// let limits = Limits::new(Quota::per_second(10)).plan("gold", Quota::per_second(100));
    /// let plans: Vec<_> = limits.plans().collect();
    /// assert_eq!(plans, [(&b"gold"[..], Quota::per_second(100))]);
    /// ```
    pub fn plans(&self) -> impl Iterator<Item = (&[u8], Quota)> + '_ {
        self.plans.iter().map(|(key, quota)| (&**key, *quota))
    }

    /// Whether shadow mode is on: for the limits in force ([`LiveLimits::limits`]), whether
    /// it is; for limits being built, whether it was set on.
    pub fn is_shadow(&self) -> bool {
        self.shadow == Some(true)
    }
}

/// The default quota and shadow mode of `resolved`, in force for `engine`'s policy, in the
/// metrics: the capacity and window of the algorithm that runs it, as at build.
fn in_force(engine: &RateEngine, resolved: &Resolved) {
    let algorithm = match &resolved.quotas.own {
        Some(quoted) => quoted.algorithm(),
        None => &*engine.algorithm,
    };
    crate::core::report::policy_in_force(
        &engine.core.policy,
        algorithm.quota(),
        algorithm.window(),
        resolved.limits.is_shadow(),
    );
}

/// The limits a layer reads on every request, replaced atomically while it runs: made by
/// [`RateLimitLayer::live`](super::RateLimitLayer::live). Cloning shares them.
///
/// A replacement is checked whole before anything changes (every quota must build the
/// limiter's algorithm, as a quota per request must), then swapped in at once: a request is
/// decided entirely under the old limits or entirely under the new. Counters carry over, as
/// for [quotas per request](crate::guide::operating#quotas-per-request): a key's state in the
/// store stays, read under the new quota.
#[derive(Clone)]
pub struct LiveLimits {
    inner: Arc<Inner>,
}

struct Inner {
    current: ArcSwap<Resolved>,
    /// The default policy's engine: what quotas are checked against, and whose shadow mode
    /// follows the limits.
    engine: Arc<RateEngine>,
    /// How the lists find a client's address.
    client: ClientIp,
    /// Shadow mode as the limiter's builder set it: the limits' when they leave it unset.
    shadow: bool,
    /// The delay as the limiter's builder set it (zero: none): the limits' when they leave
    /// it unset.
    delay: Duration,
    /// How many replacements were put in force.
    generation: std::sync::atomic::AtomicU64,
}

/// Limits checked and ready: each quota as the algorithm that runs it.
pub(crate) struct Resolved {
    /// With shadow mode set (as resolved).
    pub(crate) limits: Limits,
    quotas: Arc<LiveQuotas>,
    pub(crate) lists: Option<Lists>,
}

impl fmt::Debug for LiveLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveLimits")
            .field("limits", &self.inner.current.load().limits)
            .finish()
    }
}

impl LiveLimits {
    pub(crate) fn new(
        engine: Arc<RateEngine>,
        client: ClientIp,
        limits: Limits,
    ) -> Result<Self, ConfigError> {
        if engine.live.load().is_some() {
            return Err(ConfigError::new(
                "live",
                "this limiter's limits are already live in another layer; replace them through \
                 its LiveLimits",
            ));
        }
        let shadow = engine.shadow();
        if shadow && limits.shadow == Some(false) {
            return Err(ConfigError::new(
                "shadow",
                "the limiter's builder sets shadow(true) and the live limits shadow(false): \
                 set it in one place",
            ));
        }
        let delay = engine.delays.max();
        let resolved = resolve(&engine, &client, limits, (shadow, delay))?;
        if resolved.quotas.own.is_some() {
            return Err(ConfigError::new(
                "quota",
                format!(
                    "the live limits' quota ({}) differs from the limiter's {} ({} per {:?}): \
                     give the same quota to both, and change it later with LiveLimits::replace",
                    resolved.limits.quota,
                    engine.algorithm.name(),
                    engine.algorithm.quota(),
                    engine.algorithm.window()
                ),
            ));
        }
        engine.live.store(Some(Arc::clone(&resolved.quotas)));
        engine.shadow.store(
            resolved.limits.is_shadow(),
            std::sync::atomic::Ordering::Relaxed,
        );
        engine.delays.set(resolved.limits.delay);
        in_force(&engine, &resolved);
        Ok(Self {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(resolved),
                engine,
                client,
                shadow,
                delay,
                generation: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    /// Replaces the limits, or leaves them as they are and says why not: a quota (the
    /// default or a plan's) that the limiter's algorithm does not take is a [`ConfigError`]
    /// naming the quota's field (`quota.limit`, ...) or `plans` (with the plan's key).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `quota.limit`, `quota.period` or `quota.burst` for the default
    /// quota, or `plans` (with the plan's key) for a plan, when the limiter's algorithm does
    /// not take it; nothing changes then.
    pub fn replace(&self, limits: Limits) -> Result<(), ConfigError> {
        let engine = &self.inner.engine;
        let base = (self.inner.shadow, self.inner.delay);
        let resolved = resolve(engine, &self.inner.client, limits, base)?;
        let shadow = resolved.limits.is_shadow();
        engine.live.store(Some(Arc::clone(&resolved.quotas)));
        engine.delays.set(resolved.limits.delay);
        self.inner.current.store(Arc::new(resolved));
        engine
            .shadow
            .store(shadow, std::sync::atomic::Ordering::Relaxed);
        self.inner
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        in_force(engine, &self.inner.current.load());
        Ok(())
    }

    /// How many replacements were put in force since the layer started (a refused one is
    /// not counted).
    pub fn generation(&self) -> u64 {
        self.inner
            .generation
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `key`'s state as the layer would decide it now, spending nothing: under its plan's
    /// quota when it has one, else under the quota in force (see
    /// [`RateLimiter::peek`](super::RateLimiter::peek)). `key` is the text (or value) the
    /// layer's key extractor produces.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::peek`](super::RateLimiter::peek).
    ///
    /// ```
    /// # use tower_redis_ratelimit::{rate_limit::Limits, *};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(10))?)?;
    /// let layer = RateLimitLayer::new(limiter.clone(), HeaderKey::new("x-api-key")?);
    /// let (layer, live) = layer.live(Limits::new(Quota::per_minute(10)).plan("gold", Quota::per_minute(100)))?;
    /// assert_eq!(live.peek("gold").await?.capacity, 100);
    /// assert_eq!(live.peek("anyone").await?.capacity, 10);
    /// // The limiter shows what the layer enforces, after a replacement too.
    /// live.replace(Limits::new(Quota::per_minute(20)))?;
    /// assert_eq!(limiter.peek("anyone").await?.capacity, 20);
    /// # drop(layer); Ok(()) }
    /// ```
    pub async fn peek<'k>(&self, key: impl Into<Key<'k>>) -> Result<KeyState, Error> {
        let key = key.into();
        let quoted = self.load().quoted(Some(&key)).cloned();
        self.inner
            .engine
            .peek(Some(&key), quoted.as_deref(), None)
            .await
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.inner.current.load().limits.clone()
    }

    pub(crate) fn load(&self) -> arc_swap::Guard<Arc<Resolved>> {
        self.inner.current.load()
    }
}

impl Resolved {
    /// The quota for a request of `key` (`None`: the limiter's own).
    pub(crate) fn quoted(&self, key: Option<&Key<'_>>) -> Option<&Arc<Quoted>> {
        self.quotas.quoted(key)
    }
}

/// Checks `limits` against `engine`'s algorithm and builds what requests will use; shadow
/// mode and the delay left unset are the limiter's (`base`).
fn resolve(
    engine: &RateEngine,
    client: &ClientIp,
    mut limits: Limits,
    (shadow, delay): (bool, Duration),
) -> Result<Resolved, ConfigError> {
    limits.shadow = Some(limits.shadow.unwrap_or(shadow));
    limits.delay = Some(limits.delay.unwrap_or(delay));
    if let Some(delay) = limits.delay.filter(|d| !d.is_zero()) {
        super::delay::check_up_to(delay)?;
        super::builder::delayable(&*engine.algorithm, &*engine.core.store)?;
        if engine.leasing.is_some() {
            return Err(ConfigError::new(
                "delay",
                "a delay keeps each request's place in the store: it cannot take units from unit leases",
            ));
        }
    }
    let own = Arc::new(engine.quoted(limits.quota)?);
    // The limiter's own quota needs no quota per request (and keeps its unit leases).
    let own = (!own.same_rule(&*engine.algorithm)).then_some(own);
    let mut plans = HashMap::with_capacity(limits.plans.len());
    for (key, quota) in &limits.plans {
        let quoted = engine.quoted(*quota).map_err(|e| {
            ConfigError::new(
                "plans",
                format!("plan {:?}: {e}", String::from_utf8_lossy(key)),
            )
        })?;
        plans.insert(key.clone(), Arc::new(quoted));
    }
    let lists = (!limits.allow.is_empty() || !limits.deny.is_empty()).then(|| Lists {
        allow: limits.allow.clone(),
        deny: limits.deny.clone(),
        client: client.clone(),
    });
    Ok(Resolved {
        limits,
        quotas: Arc::new(LiveQuotas { own, plans }),
        lists,
    })
}
