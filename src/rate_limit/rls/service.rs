//! The rate limit service: a request's descriptors matched to rules and decided together.

use std::{collections::HashMap, fmt, sync::Arc, time::Duration};

use arc_swap::ArcSwap;

use super::{
    config::{RlsRule, RlsRules},
    proto::{
        Code, DescriptorStatus, ProtoDuration, RateLimit, RateLimitDescriptor, RateLimitRequest,
        RateLimitResponse, Unit,
    },
};
use crate::{
    algorithm::{Algorithm, Calendar, FixedWindow},
    core::{common_options, Options},
    decision::{Decision, KeyState},
    error::{ConfigError, Error},
    quota::Quota,
    rate_limit::RateLimiter,
    store::{FailurePolicy, Store},
    Gcra, SlidingWindow,
};

/// The algorithm every rule of an [`RlsService`] decides with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RlsAlgorithm {
    /// [`FixedWindow`]: a counter per window of the rule's unit (weeks from Monday, calendar
    /// months and years, in UTC): the numbers envoyproxy/ratelimit gives.
    #[default]
    FixedWindow,
    /// [`Gcra`]: `requests_per_unit` spread over the unit, with a burst of all of them.
    Gcra,
    /// [`SlidingWindow`]: at most `requests_per_unit` in any unit's span.
    SlidingWindow,
}

/// A rule's limiter.
type RuleLimiter = RateLimiter<Arc<dyn Algorithm>>;

/// The rules in force and a limiter per limited rule.
struct Table {
    rules: RlsRules,
    /// By the rule's path.
    limiters: HashMap<String, (Arc<RlsRule>, RuleLimiter)>,
}

/// A builder of an [`RlsService`]: the store's options as for a
/// [`RateLimiter`](crate::RateLimiter) (prefix, store timeout, failure policy, ...), which
/// every rule's limiter takes.
pub struct RlsServiceBuilder {
    store: Arc<dyn Store>,
    algorithm: RlsAlgorithm,
    options: Options,
}

impl fmt::Debug for RlsServiceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RlsServiceBuilder")
            .field("algorithm", &self.algorithm)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RlsServiceBuilder {
    common_options!();

    /// The algorithm of every rule (default [`RlsAlgorithm::FixedWindow`]).
    pub fn algorithm(mut self, algorithm: RlsAlgorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The service, deciding by `rules`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the option (`prefix`, `store_timeout`, ...) that does not
    /// build a limiter.
    pub fn build(self, rules: RlsRules) -> Result<RlsService, ConfigError> {
        let service = RlsService {
            inner: Arc::new(Inner {
                store: self.store,
                algorithm: self.algorithm,
                options: self.options,
                table: ArcSwap::from_pointee(Table {
                    rules: RlsRules::default(),
                    limiters: HashMap::new(),
                }),
            }),
        };
        service.replace(rules)?;
        Ok(service)
    }
}

struct Inner {
    store: Arc<dyn Store>,
    algorithm: RlsAlgorithm,
    options: Options,
    table: ArcSwap<Table>,
}

/// Envoy's rate limit service on a store: [`should_rate_limit`](Self::should_rate_limit)
/// decides a request by the [`RlsRules`] in force, which [`replace`](Self::replace) changes
/// while it runs. Cheap to clone (a handle). Serve it over gRPC with [`RlsGrpc`](super::RlsGrpc).
/// See the [module](super) for what it decides and how.
#[derive(Clone)]
pub struct RlsService {
    inner: Arc<Inner>,
}

impl fmt::Debug for RlsService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RlsService")
            .field("algorithm", &self.inner.algorithm)
            .field("domains", &self.inner.table.load().rules.domains())
            .finish_non_exhaustive()
    }
}

/// One descriptor of a request, as decided.
enum Outcome {
    /// No rule, a rule replaced by another: `OK`, nothing else.
    Free,
    /// An unlimited rule.
    Unlimited,
    /// Decided by its rule.
    Decided(Arc<RlsRule>, Decision),
    /// Looked at (a `hits_addend` of 0): `OK` unless the key is banned.
    Peeked(Arc<RlsRule>, KeyState),
    /// Over its rule at once: a rule of 0 requests per unit.
    Blocked(Arc<RlsRule>),
    /// The store failed and the policy lets it through.
    Failed(Arc<RlsRule>),
}

impl RlsService {
    /// A builder on `store` (a [`MemoryStore`](crate::MemoryStore), a
    /// [`RedisStore`](crate::RedisStore), or an `Arc` of one shared with other limiters).
    pub fn builder(store: impl Store) -> RlsServiceBuilder {
        RlsServiceBuilder {
            store: Arc::new(store),
            algorithm: RlsAlgorithm::default(),
            options: Options::new(RateLimiter::<Gcra>::DEFAULT_POLICY_NAME),
        }
    }

    /// Puts `rules` in force for the next request. A rule whose path, limit and shadow mode
    /// are unchanged keeps its limiter (its circuit breaker, deny cache and top keys); the
    /// counters in the store are kept for every rule whose path is unchanged.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when a rule's limiter does not build; the rules in force stay.
    pub fn replace(&self, rules: RlsRules) -> Result<(), ConfigError> {
        let old = self.inner.table.load();
        let mut limiters = HashMap::new();
        for rule in rules.rules() {
            if rule.unlimited || rule.requests_per_unit == 0 {
                continue;
            }
            let limiter = match old.limiters.get(&rule.path) {
                Some((was, limiter)) if **was == **rule => limiter.clone(),
                _ => self.limiter_of(rule)?,
            };
            limiters.insert(rule.path.clone(), (rule.clone(), limiter));
        }
        self.inner.table.store(Arc::new(Table { rules, limiters }));
        Ok(())
    }

    /// The number of domains in force.
    pub fn domains(&self) -> usize {
        self.inner.table.load().rules.domains()
    }

    /// The limiter of the rule at `path` (e.g. `edge.remote_address`), to peek, reset or ban
    /// a descriptor's key (see the [module](super) for how a key is written).
    pub fn limiter(&self, path: &str) -> Option<RateLimiter<Arc<dyn Algorithm>>> {
        let table = self.inner.table.load();
        table.limiters.get(path).map(|(_, l)| l.clone())
    }

    fn limiter_of(&self, rule: &RlsRule) -> Result<RuleLimiter, ConfigError> {
        let n = rule.requests_per_unit;
        let period = nominal(rule.unit);
        let algorithm: Arc<dyn Algorithm> = match self.inner.algorithm {
            RlsAlgorithm::FixedWindow => match rule.unit {
                Unit::Week => Arc::new(FixedWindow::calendar(Calendar::Week, n)?),
                Unit::Month => Arc::new(FixedWindow::calendar(Calendar::Month, n)?),
                Unit::Year => Arc::new(FixedWindow::calendar(Calendar::Year, n)?),
                _ => Arc::new(FixedWindow::new(Quota::new(n, period))?),
            },
            RlsAlgorithm::Gcra => Arc::new(Gcra::new(Quota::new(n, period))?),
            RlsAlgorithm::SlidingWindow => Arc::new(SlidingWindow::new(Quota::new(n, period))?),
        };
        let mut options = self.inner.options.clone();
        options.policy = policy_name(&rule.path);
        RateLimiter::builder(self.inner.store.clone(), algorithm)
            .with_options(options)
            .common_counters()
            .shadow(rule.shadow)
            .build()
    }

    /// Decides `request`: its overall code and a status per descriptor, in its order.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for a request without a domain or without descriptors;
    /// `UNAVAILABLE` when the store fails under [`FailurePolicy::Closed`].
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        if request.domain.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "rate limit domain must not be empty",
            ));
        }
        if request.descriptors.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "rate limit descriptor list must not be empty",
            ));
        }
        let table = self.inner.table.load_full();
        let matched: Vec<Option<&Arc<RlsRule>>> = request
            .descriptors
            .iter()
            .map(|d| {
                let entries: Vec<(&str, &str)> = d
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect();
                table.rules.find(&request.domain, &entries)
            })
            .collect();
        // A rule named in the `replaces` of another rule of the request does not apply.
        let replaced: Vec<&str> = matched
            .iter()
            .flatten()
            .flat_map(|r| r.replaces.iter().map(String::as_str))
            .collect();
        let replaced = &replaced;
        let table_ref = &table;
        let checks = request.descriptors.iter().zip(&matched).map(|(d, rule)| {
            let rule = rule.filter(|r| r.name.as_deref().is_none_or(|n| !replaced.contains(&n)));
            decide(table_ref, request, d, rule)
        });
        let outcomes: Vec<Outcome> = futures_join(checks)
            .await
            .into_iter()
            .collect::<Result<_, Error>>()
            .map_err(|e| tonic::Status::unavailable(format!("the store failed: {e}")))?;
        let over = outcomes.iter().any(|o| match o {
            Outcome::Decided(rule, d) => !d.allowed && !rule.shadow,
            Outcome::Blocked(rule) => !rule.shadow,
            Outcome::Peeked(rule, state) => state.banned_for.is_some() && !rule.shadow,
            _ => false,
        });
        let mut outcomes = outcomes;
        if over {
            self.give_back(request, &table, &mut outcomes).await;
        }
        Ok(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses: outcomes.iter().map(status).collect(),
            ..Default::default()
        })
    }

    /// Gives back what the descriptors of a refused request took.
    async fn give_back(&self, request: &RateLimitRequest, table: &Table, outcomes: &mut [Outcome]) {
        let refunds = request
            .descriptors
            .iter()
            .zip(outcomes.iter_mut())
            .filter_map(|(d, o)| match o {
                Outcome::Decided(rule, decision)
                    if decision.allowed && decision.charge.is_some() =>
                {
                    let (_, limiter) = table.limiters.get(&rule.path)?;
                    Some(async move {
                        let key = descriptor_key(d);
                        if let Ok(true) = limiter.refund(key.as_str(), decision).await {
                            decision.remaining = (decision.remaining + u64::from(decision.cost))
                                .min(decision.capacity);
                        }
                    })
                }
                _ => None,
            });
        futures_join(refunds).await;
    }
}

/// Decides one descriptor by `rule` (`None`: no rule, or one replaced).
async fn decide(
    table: &Table,
    request: &RateLimitRequest,
    d: &RateLimitDescriptor,
    rule: Option<&Arc<RlsRule>>,
) -> Result<Outcome, Error> {
    let Some(rule) = rule else {
        return Ok(Outcome::Free);
    };
    if rule.unlimited {
        return Ok(Outcome::Unlimited);
    }
    let hits = match &d.hits_addend {
        Some(h) => h.value,
        None => u64::from(request.hits_addend.max(1)),
    };
    let hits = u32::try_from(hits).unwrap_or(u32::MAX);
    let Some((_, limiter)) = table.limiters.get(&rule.path) else {
        return Ok(Outcome::Blocked(rule.clone()));
    };
    let key = descriptor_key(d);
    let result = if hits == 0 {
        limiter
            .peek(key.as_str())
            .await
            .map(|state| Outcome::Peeked(rule.clone(), state))
    } else {
        limiter
            .check(key.as_str(), hits)
            .await
            .map(|d| Outcome::Decided(rule.clone(), d))
    };
    match result {
        Ok(outcome) => Ok(outcome),
        Err(_) if rule.shadow => Ok(Outcome::Failed(rule.clone())),
        Err(e) => match limiter.failure_policy() {
            FailurePolicy::Closed => Err(e),
            _ => Ok(Outcome::Failed(rule.clone())),
        },
    }
}

/// Runs `futures` together, their outputs in their order.
async fn futures_join<F: std::future::Future>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        *out = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future finished"))
        .collect()
}

/// A descriptor's status in the response.
fn status(outcome: &Outcome) -> DescriptorStatus {
    let limit = |rule: &RlsRule| RateLimit {
        name: rule.name.clone().unwrap_or_default(),
        requests_per_unit: rule.requests_per_unit,
        unit: rule.unit as i32,
    };
    match outcome {
        Outcome::Free => DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        },
        Outcome::Unlimited => DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..Default::default()
        },
        Outcome::Failed(rule) => DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(limit(rule)),
            ..Default::default()
        },
        Outcome::Blocked(rule) => DescriptorStatus {
            code: if rule.shadow {
                Code::Ok
            } else {
                Code::OverLimit
            } as i32,
            current_limit: Some(limit(rule)),
            limit_remaining: 0,
            duration_until_reset: Some(seconds(nominal(rule.unit))),
        },
        Outcome::Peeked(rule, state) => DescriptorStatus {
            code: if state.banned_for.is_none() || rule.shadow {
                Code::Ok
            } else {
                Code::OverLimit
            } as i32,
            current_limit: Some(limit(rule)),
            limit_remaining: u32::try_from(state.remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(seconds(state.reset_after)),
        },
        Outcome::Decided(rule, d) => DescriptorStatus {
            // A shadow rule's refusal is answered OK, its numbers kept.
            code: if d.allowed || rule.shadow {
                Code::Ok
            } else {
                Code::OverLimit
            } as i32,
            current_limit: Some(limit(rule)),
            limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(seconds(d.reset_after)),
        },
    }
}

/// A duration in whole seconds, rounded up (at least 1 s for any wait).
fn seconds(d: Duration) -> ProtoDuration {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    ProtoDuration {
        seconds: i64::try_from(s).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// A unit's length (a calendar unit's nominal one: 7, 30, 365 days).
fn nominal(unit: Unit) -> Duration {
    const DAY: u64 = 86_400;
    Duration::from_secs(match unit {
        Unit::Second | Unit::Unknown => 1,
        Unit::Minute => 60,
        Unit::Hour => 3_600,
        Unit::Day => DAY,
        Unit::Week => 7 * DAY,
        Unit::Month => 30 * DAY,
        Unit::Year => 365 * DAY,
    })
}

/// The console steers every rule's limiter, each by its policy name (the rule's path, e.g.
/// `edge.remote_address`), through `/keys/{key}?policy=NAME` and `/bans/{key}?policy=NAME`
/// with the descriptor's key (`remote_address=10.0.0.1`).
#[cfg(feature = "admin")]
impl crate::rate_limit::admin::PolicyLimiters for RlsService {
    fn limiter(&self, policy: &str) -> Option<RateLimiter<Arc<dyn Algorithm>>> {
        let table = self.inner.table.load();
        table
            .limiters
            .values()
            .find(|(_, l)| l.policy_name() == policy)
            .map(|(_, l)| l.clone())
    }

    fn limiters(&self) -> Vec<RateLimiter<Arc<dyn Algorithm>>> {
        let table = self.inner.table.load();
        let mut limiters: Vec<_> = table.limiters.values().map(|(_, l)| l.clone()).collect();
        limiters.sort_by(|a, b| a.policy_name().cmp(b.policy_name()));
        limiters
    }
}

/// A descriptor's key: `key=value` entries joined by `,`, with `%`, `,` and `=` escaped.
pub(crate) fn descriptor_key(d: &super::proto::RateLimitDescriptor) -> String {
    let mut key = String::new();
    for (i, e) in d.entries.iter().enumerate() {
        if i > 0 {
            key.push(',');
        }
        escape_into(&mut key, &e.key);
        key.push('=');
        escape_into(&mut key, &e.value);
    }
    key
}

fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            ',' => out.push_str("%2C"),
            '=' => out.push_str("%3D"),
            c => out.push(c),
        }
    }
}

/// A policy name for the rule at `path`: the path with every character a policy name cannot
/// hold as `_`, and, when that changed it or it is over 64 characters, cut to 47 and
/// followed by `:` and 16 hex digits of the path's hash, so that two rules never share one.
fn policy_name(path: &str) -> String {
    let clean: String = path
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.:".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean == path && clean.len() <= 64 {
        return clean;
    }
    // FNV-1a, 64 bits: stable across processes and versions.
    let hash = path.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let cut: String = clean.chars().take(47).collect();
    format!("{cut}:{hash:016x}")
}
