//! The decision for one check, with everything a header writer needs, and what an allowed
//! check took.

use std::{fmt, sync::Arc, time::Duration};

use crate::{
    algorithm::{Outcome, PartInfo, Position},
    quota::Quota,
};

/// The decision for one check: whether it was allowed, and the numbers for the
/// `RateLimit` headers.
///
/// Decisions come from a limiter ([`RateLimiter::check`](crate::RateLimiter::check), or the
/// layer); the struct may gain fields, so it cannot be built by hand.
///
/// ```
/// # use tower_redis_ratelimit::rate_limit::Decision;
/// fn describe(d: &Decision) -> String {
///     match (d.allowed, d.retry_after) {
///         (true, _) => format!("ok, {} of {} left", d.remaining, d.capacity),
///         (false, Some(wait)) => format!("slow down, retry in {wait:?}"),
///         (false, None) => "this request can never fit the quota".to_owned(),
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the request may go ahead (its cost was taken from the quota).
    pub allowed: bool,
    /// Units available when the key is fully rested: the quota's burst (`q` in
    /// `RateLimit-Policy`), not [`Quota::limit`](crate::Quota::limit) (units per period).
    pub capacity: u64,
    /// Units left now (`r` in `RateLimit`).
    pub remaining: u64,
    /// Time until the full quota is available again.
    pub reset_after: Duration,
    /// When denied: how long until the same request can succeed; `None` when allowed, or when
    /// the request's cost exceeds the quota so that it can never succeed (see
    /// [`Decision::is_never`]).
    pub retry_after: Option<Duration>,
    /// The quota's window: the time in which `capacity` units are restored (`w`).
    pub window: Duration,
    /// The cost this check asked for.
    pub cost: u32,
    /// The policy name shown in the headers.
    pub policy: Arc<str>,
    /// True when the store was unavailable and this decision was made in this process at the
    /// local share of the quota ([`FailurePolicy::Local`](crate::FailurePolicy::Local)).
    pub degraded: bool,
    /// Every limit's state when the algorithm decides several at once
    /// ([`MultiLimit`](crate::algorithm::MultiLimit)); the fields above then describe the binding one
    /// (when denied: the longest wait; when allowed: the fewest units left). Empty otherwise.
    pub limits: Vec<LimitState>,
    /// What answered the check: the store, the deny cache, a unit lease, or the local share.
    pub source: Source,
    /// Whether the decision's policy is in shadow mode: a denial is then only reported
    /// ([`Verdict::WouldDeny`]), and the request goes on. Never set on a ban's denial: a ban
    /// is enforced in shadow mode too.
    pub shadow: bool,
    /// True when the key is banned ([`RateLimiter::ban`](crate::RateLimiter::ban)): the
    /// request was denied without taking anything, `retry_after` is the time the ban has
    /// left, and `remaining` is 0. `source` still says what answered (the store, or the deny
    /// cache repeating the store's answer).
    pub banned: bool,
    /// How long the request waited for its units before it was allowed: zero unless its
    /// policy delays requests over the limit instead of refusing them
    /// ([`RateLimiterBuilder::delay`](crate::rate_limit::RateLimiterBuilder::delay)).
    pub delayed: Duration,
    /// The index in `limits` of the limit the fields above describe.
    /// (At most 8 limits: a byte keeps the decision small.)
    pub(crate) binding: u8,
    /// What an allowed check took, for [`RateLimiter::refund`](crate::RateLimiter::refund).
    pub(crate) charge: Option<Charge>,
}

/// What answered a check: the label `source` of the metric `ratelimit_decisions_total`, the
/// field `source` of the decision's `tracing` event, and [`Decision::source`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The store (Redis, or the in-memory store), asked for this check.
    Store,
    /// The local deny cache: a denial the store gave for this key, still valid, answered
    /// without asking the store again.
    DenyCache,
    /// Units of the key reserved ahead in the store (a unit lease).
    UnitLease,
    /// The local share of the limit, in this process, because the store was unavailable
    /// ([`FailurePolicy::Local`](crate::FailurePolicy::Local)).
    Local,
    /// No decision could be made (the store failed); the failure policy answered:
    /// [`Verdict::Allowed`] under `open` or in shadow mode, [`Verdict::Unavailable`] otherwise.
    FailurePolicy,
}

impl Source {
    /// Every source, in the order of their indexes.
    pub const ALL: [Source; 5] = [
        Source::Store,
        Source::DenyCache,
        Source::UnitLease,
        Source::Local,
        Source::FailurePolicy,
    ];

    /// The label: `store`, `deny_cache`, `unit_lease`, `local`, `failure_policy`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Source::Store => "store",
            Source::DenyCache => "deny_cache",
            Source::UnitLease => "unit_lease",
            Source::Local => "local",
            Source::FailurePolicy => "failure_policy",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a check's answer meant for its request: the label `decision` of the metric
/// `ratelimit_decisions_total`, and of the decision's `tracing` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// The request goes on (its units were taken, or the store failed and the failure
    /// policy lets requests through).
    Allowed,
    /// The request is refused (`429`, gRPC `RESOURCE_EXHAUSTED`).
    Denied,
    /// The request would have been refused, but its policy is in shadow mode: it goes on,
    /// and nothing the client sees changes.
    WouldDeny,
    /// The store failed and the failure policy refuses the request (`503`, gRPC
    /// `UNAVAILABLE`).
    Unavailable,
}

impl Verdict {
    /// Every verdict, in the order of their indexes.
    pub const ALL: [Verdict; 4] = [
        Verdict::Allowed,
        Verdict::Denied,
        Verdict::WouldDeny,
        Verdict::Unavailable,
    ];

    /// The label: `allowed`, `denied`, `would_deny`, `unavailable`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Denied => "denied",
            Verdict::WouldDeny => "would_deny",
            Verdict::Unavailable => "unavailable",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an allowed check took from a key's quota, so that it can be given back: the cost,
/// the quota it was taken under, where it was decided, and where the store put it (for a
/// sliding window the log entry it wrote; for GCRA, the token bucket and the multi-limit when
/// it was admitted and the key's time it left, so that a refund gives back only what the
/// charge still holds). Read it with [`Decision::charge`]; give it back with
/// [`RateLimiter::refund`](crate::RateLimiter::refund).
///
/// Two charges are equal when they took the same units under the same quota in the same
/// place; where the store put them is its bookkeeping and is not compared (Redis and the
/// in-memory twin number their log entries apart, and read different clocks).
#[derive(Debug, Clone)]
pub struct Charge {
    pub(crate) cost: u32,
    /// The quota given for the check, when not the limiter's own.
    pub(crate) quota: Option<Quota>,
    /// Decided at the local share (the store was unavailable): given back there too.
    pub(crate) local: bool,
    pub(crate) position: Position,
}

impl PartialEq for Charge {
    fn eq(&self, other: &Self) -> bool {
        (self.cost, self.quota, self.local) == (other.cost, other.quota, other.local)
    }
}

impl Eq for Charge {}

impl Charge {
    /// The units taken.
    pub fn cost(&self) -> u32 {
        self.cost
    }

    /// The quota the units were taken under, when the check was given one
    /// ([`RateLimiter::check_with_quota`](crate::RateLimiter::check_with_quota)).
    pub fn quota(&self) -> Option<Quota> {
        self.quota
    }
}

/// What a settlement did ([`RateLimiter::settle`](crate::RateLimiter::settle)): an allowed
/// check's charge (its estimate, [`Charge::cost`]) settled after the fact to the units its
/// request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// Nothing was settled: the decision holds no charge (a denial, a shadow-mode denial
    /// included; an answer of the deny cache; a charge already settled or refunded).
    NoCharge,
    /// The figure was the charge: nothing changed.
    AsCharged,
    /// Settled below the charge: `units` (the charge less the figure) were due back, and
    /// `given` says whether the key got any back. A charge gives back at most what it still
    /// holds, as a [refund](crate::RateLimiter::refund) does: nothing once it has drained,
    /// nor from a key reset since (a fixed window: from a window that has ended).
    GaveBack {
        /// Units due back: the charge less the figure.
        units: u64,
        /// True when the key got units back.
        given: bool,
    },
    /// Settled above the charge: `units` (the figure less the charge) were charged at the
    /// settlement, past the limit if need be: a debt that the key's next checks wait out
    /// (GCRA and the token bucket: at most 100 full quotas of it; a window's debt ends with
    /// the window).
    Charged {
        /// Units charged: the figure less the charge.
        units: u64,
    },
}

impl Settled {
    /// The largest figure a charge settles to: the largest cost a check takes (`u32::MAX`).
    /// A larger one is an [`Error::InvalidInput`](crate::Error::InvalidInput), and the charge
    /// stands.
    pub const MAX_ACTUAL: u64 = u32::MAX as u64;
}

/// One limit of a multi-limit decision, for the headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitState {
    /// The limit's name (its policy item in the headers).
    pub name: Arc<str>,
    /// Its units when fully rested (`q`).
    pub capacity: u64,
    /// Its window (`w`).
    pub window: Duration,
    /// Units left under it (`r`).
    pub remaining: u64,
    /// Time until its quota is full again.
    pub reset_after: Duration,
    /// When the request was denied: `Some(ZERO)` if this limit alone would have admitted it,
    /// `Some(t)` if it would in `t`, `None` if the cost can never fit it. `None` when allowed.
    pub retry_after: Option<Duration>,
}

/// A key's state as a check would see it, read without spending anything
/// ([`RateLimiter::peek`](crate::RateLimiter::peek)).
///
/// `remaining` and `reset_after` are what a check of cost 0 would show: a key never seen (or
/// rested, or reset) has `remaining` = `capacity` and `reset_after` zero. A ban does not change
/// them (it takes nothing): `banned_for` says how long it has left.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// The policy name.
    pub policy: Arc<str>,
    /// Units available when the key is fully rested (for a multi-limit, those of the limit
    /// with the fewest units left).
    pub capacity: u64,
    /// Units a check could take now, ban aside.
    pub remaining: u64,
    /// Time until the full quota is available again.
    pub reset_after: Duration,
    /// The quota's window.
    pub window: Duration,
    /// The time the key's ban has left; `None` when it is not banned.
    pub banned_for: Option<Duration>,
    /// Every limit's state, for a [`MultiLimit`](crate::algorithm::MultiLimit); empty
    /// otherwise.
    pub limits: Vec<LimitState>,
    /// True when the store was unavailable and this is the local share's state in this
    /// process ([`FailurePolicy::Local`](crate::FailurePolicy::Local)).
    pub degraded: bool,
}

impl KeyState {
    pub(crate) fn from_outcome(
        o: Outcome,
        banned_us: u64,
        limit: u64,
        window: Duration,
        policy: Arc<str>,
        parts: &[PartInfo],
    ) -> Self {
        let d = Decision::from_outcome(
            o,
            limit,
            window,
            1,
            Arc::clone(&policy),
            parts,
            Source::Store,
        );
        Self {
            policy,
            capacity: d.capacity,
            remaining: d.remaining,
            reset_after: d.reset_after,
            window: d.window,
            banned_for: (banned_us > 0).then(|| Duration::from_micros(banned_us)),
            limits: d
                .limits
                .into_iter()
                .map(|mut l| {
                    l.retry_after = None;
                    l
                })
                .collect(),
            degraded: false,
        }
    }
}

impl LimitState {
    /// True when this limit is one of those that denied the request.
    pub fn violated(&self) -> bool {
        !matches!(self.retry_after, Some(Duration::ZERO))
    }
}

/// The numbers of an admitted check that its response's fields need: the decision's
/// `remaining`, `capacity`, `window` and `reset_after`, without the rest of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admitted {
    pub(crate) remaining: u64,
    pub(crate) capacity: u64,
    pub(crate) window: Duration,
    pub(crate) reset_after: Duration,
}

impl Decision {
    pub(crate) fn from_outcome(
        o: Outcome,
        limit: u64,
        window: Duration,
        cost: u32,
        policy: Arc<str>,
        parts: &[PartInfo],
        source: Source,
    ) -> Self {
        let us = Duration::from_micros;
        let (limit, window) = parts
            .get(o.binding)
            .map_or((limit, window), |p| (p.quota, p.window));
        // A single limit (the common case) has no parts: no iterator to build.
        let limits = match parts.is_empty() {
            true => Vec::new(),
            false => parts
                .iter()
                .zip(&o.parts)
                .map(|(info, p)| LimitState {
                    name: Arc::clone(&info.name),
                    capacity: info.quota,
                    window: info.window,
                    remaining: p.remaining.min(info.quota),
                    reset_after: us(p.reset_after_us),
                    retry_after: if o.allowed {
                        None
                    } else {
                        p.retry_after_us.map(us)
                    },
                })
                .collect(),
        };
        Self {
            allowed: o.allowed,
            capacity: limit,
            remaining: o.remaining.min(limit),
            reset_after: us(o.reset_after_us),
            retry_after: match o.retry_after_us {
                Some(t) if !o.allowed => Some(us(t)),
                _ => None,
            },
            window,
            cost,
            policy,
            degraded: false,
            source,
            shadow: false,
            banned: o.banned,
            delayed: Duration::ZERO,
            binding: u8::try_from(o.binding).unwrap_or(u8::MAX),
            charge: o.allowed.then_some(Charge {
                cost,
                quota: None,
                local: false,
                position: o.position,
            }),
            limits,
        }
    }

    /// A denial with nothing left, known without asking the store (the deny cache).
    pub(crate) fn cached_denial(
        limit: u64,
        window: Duration,
        policy: Arc<str>,
        retry_after: Duration,
        reset_after: Duration,
    ) -> Self {
        Self {
            allowed: false,
            capacity: limit,
            remaining: 0,
            reset_after,
            retry_after: Some(retry_after),
            window,
            cost: 1,
            policy,
            degraded: false,
            source: Source::DenyCache,
            shadow: false,
            banned: false,
            delayed: Duration::ZERO,
            binding: 0,
            limits: Vec::new(),
            charge: None,
        }
    }

    /// What the decision means for its request: allowed, denied, or (a denial under a policy
    /// in shadow mode) would be denied.
    pub fn verdict(&self) -> Verdict {
        match (self.allowed, self.shadow) {
            (true, _) => Verdict::Allowed,
            (false, false) => Verdict::Denied,
            (false, true) => Verdict::WouldDeny,
        }
    }

    /// For a multi-limit ([`MultiLimit`](crate::algorithm::MultiLimit)), the limit the
    /// decision's fields describe: when denied, the one the request waits longest for (the
    /// rule that fired); when allowed, the one with the fewest units left. `None` for a single
    /// limit, whose name is the [`policy`](Self::policy).
    pub fn binding(&self) -> Option<&LimitState> {
        self.limits.get(usize::from(self.binding))
    }

    /// A single-limit decision of the store, for tests: a test sets the fields it needs
    /// and takes the others from here (`Decision { allowed: false, ..Decision::sample() }`).
    #[cfg(test)]
    pub(crate) fn sample() -> Self {
        Self {
            allowed: true,
            capacity: 10,
            remaining: 10,
            reset_after: Duration::ZERO,
            retry_after: None,
            window: Duration::from_secs(1),
            cost: 1,
            policy: Arc::from("default"),
            degraded: false,
            source: Source::Store,
            shadow: false,
            banned: false,
            delayed: Duration::ZERO,
            binding: 0,
            limits: Vec::new(),
            charge: None,
        }
    }

    /// True when the request was denied and can never succeed: its cost exceeds the quota.
    pub fn is_never(&self) -> bool {
        !self.allowed && self.retry_after.is_none()
    }

    /// What this check took from the quota, when it was allowed: what
    /// [`RateLimiter::refund`](crate::RateLimiter::refund) gives back. `None` for a denial,
    /// and once the charge was refunded.
    pub fn charge(&self) -> Option<&Charge> {
        self.charge.as_ref()
    }
}
