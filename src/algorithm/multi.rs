//! Several GCRA limits on one key, decided atomically together.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use super::{
    bucket::divided,
    gcra,
    held::Placed,
    outcome::{Outcome, PartInfo, PartOutcome, Position},
    rate::BucketRate,
    settle::{bucket_charged, Change},
    Algorithm, Kind, MemoryState, Reset, Rule, Twin, NEVER,
};
use crate::{
    decision::Charge,
    error::{ConfigError, Error},
    quota::Quota,
};

/// Several limits on one key at once, e.g. a burst of 10 a second *and* 1,000 a day, decided
/// in one atomic script call: a request is admitted only if every limit admits it, and a request
/// refused by any limit takes nothing from the others. (Limiters that check stacked limits one
/// by one overshoot: the limits that passed were already spent.)
///
/// Each limit is a GCRA bucket (capacity `burst`, refilled at `limit` per `period`) stored as
/// one integer. Every limit appears in the `RateLimit-Policy` and `RateLimit` headers as its own
/// item, under its name; `Retry-After` covers the longest wait; the [`Decision`](crate::rate_limit::Decision)
/// fields describe the binding limit and [`Decision::limits`](crate::rate_limit::Decision::limits) all of them.
///
/// ```
/// use tower_redis_ratelimit::{Quota, algorithm::MultiLimit};
///
/// let limits = MultiLimit::new([
///     ("burst", Quota::per_second(10)),
///     ("daily", Quota::per_day(1_000)),
/// ])?;
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
///
/// Built with [`new`](Self::new), every limit takes the request's cost and a charge is not
/// settled after the fact (refunds only). Built with [`budgets`](Self::budgets), each limit
/// takes its own cost ([`LimitCost`]) and a charge *is* settled, on the limits that take the
/// request's cost alone: requests per minute beside tokens per minute, decided together.
#[derive(Debug, Clone)]
pub struct MultiLimit {
    quotas: Vec<(Arc<str>, Quota)>,
    rates: Vec<BucketRate>,
    parts: Vec<PartInfo>,
    /// Each limit's fixed cost; `None`: the request's cost.
    fixed: Vec<Option<u32>>,
    /// Built as budgets: a charge settles on the limits taking the request's cost.
    settles: bool,
}

/// What a request costs one limit of a [`MultiLimit`] built with
/// [`budgets`](MultiLimit::budgets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitCost {
    /// The request's cost (the layer's [`cost`](crate::RateLimitLayer::cost), the `cost`
    /// of [`RateLimiter::check`](crate::RateLimiter::check)): an estimate, settled after the
    /// fact ([`RateLimiter::settle`](crate::RateLimiter::settle), the layer's
    /// `settle_from_*`), e.g. the tokens of a model's answer.
    Request,
    /// The same units for every request, whatever its cost, never settled: e.g. 1 for a
    /// budget of requests.
    Fixed(u32),
}

impl MultiLimit {
    /// The limits, by name. Names are 1 to 32 characters from `A-Z a-z 0-9 - _`, unique; there
    /// must be 1 to 8 limits; each quota is validated as for [`Gcra`](crate::Gcra).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `limits` for a count outside 1 to 8, a name that is empty, too
    /// long, not from `A-Z a-z 0-9 - _` or given twice, and naming the quota's field for a
    /// quota that does not build a [`Gcra`](crate::Gcra).
    pub fn new<N: AsRef<str>>(
        limits: impl IntoIterator<Item = (N, Quota)>,
    ) -> Result<Self, ConfigError> {
        let limits = limits.into_iter().map(|(n, q)| (n, q, LimitCost::Request));
        Self::build(limits, false)
    }

    /// Budgets on one key decided together, each limit with its own cost: a request is
    /// admitted only when every limit has room for its cost on that limit, in one atomic store
    /// call, and a request refused by any takes nothing from any. A settlement of the
    /// request's charge ([`RateLimiter::settle`](crate::RateLimiter::settle), the layer's
    /// [`settle_from_header`](crate::RateLimitLayer::settle_from_header),
    /// [`settle_from_handle`](crate::RateLimitLayer::settle_from_handle) and
    /// [`settle_from_trailer`](crate::RateLimitLayer::settle_from_trailer)) moves only the
    /// limits that take [`LimitCost::Request`], as a settlement of [`Gcra`](crate::Gcra)
    /// does: below the estimate, at most what the charge still holds of each is given back;
    /// above it, the excess is a debt on those limits alone. A refund (the layer's
    /// [`count_if`](crate::RateLimitLayer::count_if)) gives every limit back its own cost.
    ///
    /// The [`Decision`](crate::rate_limit::Decision)'s `cost` and
    /// [`Charge`](crate::rate_limit::Charge) are the request's cost.
    ///
    /// ```
    /// use tower_redis_ratelimit::{algorithm::{LimitCost, MultiLimit}, *};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Per API key: 3 requests and 1,000 tokens a minute, each request admitted on an
    /// // estimate of 100 tokens.
    /// let budgets = MultiLimit::budgets([
    ///     ("requests", Quota::per_minute(3), LimitCost::Fixed(1)),
    ///     ("tokens", Quota::per_minute(1_000), LimitCost::Request),
    /// ])?;
    /// let limiter = RateLimiter::new(MemoryStore::new(), budgets)?;
    /// let mut d = limiter.check("key-1", 100).await?;
    /// assert_eq!(d.limits[0].remaining, 2); // requests
    /// assert_eq!(d.limits[1].remaining, 900); // tokens
    ///
    /// // The answer used 700 tokens: 600 more, on the tokens alone.
    /// limiter.settle("key-1", &mut d, 700).await?;
    /// let state = limiter.peek("key-1").await?;
    /// assert_eq!((state.limits[0].remaining, state.limits[1].remaining), (2, 300));
    ///
    /// // An estimate the tokens cannot cover is refused and spends no request.
    /// assert!(!limiter.check("key-1", 400).await?.allowed);
    /// assert_eq!(limiter.peek("key-1").await?.limits[0].remaining, 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), and a [`ConfigError`] naming `limits.cost` for a
    /// [`LimitCost::Fixed`] of 0 or above its limit's burst (no request would be admitted).
    pub fn budgets<N: AsRef<str>>(
        limits: impl IntoIterator<Item = (N, Quota, LimitCost)>,
    ) -> Result<Self, ConfigError> {
        Self::build(limits, true)
    }

    fn build<N: AsRef<str>>(
        limits: impl IntoIterator<Item = (N, Quota, LimitCost)>,
        settles: bool,
    ) -> Result<Self, ConfigError> {
        let mut quotas: Vec<(Arc<str>, Quota)> = Vec::new();
        let mut fixed = Vec::new();
        for (name, quota, cost) in limits {
            let name = name.as_ref();
            if name.is_empty()
                || name.len() > 32
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(ConfigError::new(
                    "limits.name",
                    format!("{name:?}: 1 to 32 characters from A-Z a-z 0-9 - _"),
                ));
            }
            if quotas.iter().any(|(n, _)| &**n == name) {
                return Err(ConfigError::new(
                    "limits.name",
                    format!("{name:?} is used twice"),
                ));
            }
            quotas.push((Arc::from(name), quota));
            fixed.push(match cost {
                LimitCost::Request => None,
                LimitCost::Fixed(units) => Some(units),
            });
        }
        if quotas.is_empty() || quotas.len() > 8 {
            return Err(ConfigError::new("limits", "give 1 to 8 limits"));
        }
        let rates = quotas
            .iter()
            .map(|(_, q)| BucketRate::from_quota(q))
            .collect::<Result<Vec<_>, _>>()?;
        let parts = quotas
            .iter()
            .zip(&rates)
            .map(|((name, q), r)| PartInfo {
                name: Arc::clone(name),
                quota: r.burst,
                window: q.burst_window(),
            })
            .collect();
        for ((name, _), (rate, units)) in quotas.iter().zip(rates.iter().zip(&fixed)) {
            if let Some(units) = *units {
                if units == 0 || u64::from(units) > rate.burst {
                    return Err(ConfigError::new(
                        "limits.cost",
                        format!("{name:?}: a fixed cost of 1 to the limit's burst"),
                    ));
                }
            }
        }
        Ok(Self {
            quotas,
            rates,
            parts,
            fixed,
            settles,
        })
    }

    /// What a request of `cost` costs each limit, in the order of [`Algorithm::parts`].
    pub(crate) fn costs(&self, cost: u64) -> impl Iterator<Item = u64> + '_ {
        self.fixed.iter().map(move |f| f.map_or(cost, u64::from))
    }

    /// Whether some limit takes a fixed cost (the check then names each limit's cost).
    pub(crate) fn has_fixed_costs(&self) -> bool {
        self.fixed.iter().any(Option::is_some)
    }

    /// Whether a charge settles (built as budgets).
    pub(crate) const fn settles(&self) -> bool {
        self.settles
    }

    /// What each limit of a charge of `cost` settled to `actual` units goes to: the limits
    /// taking a fixed cost stay as charged.
    pub(crate) fn settled(&self, cost: u32, actual: u32) -> Vec<(u64, u64)> {
        let cost = u64::from(cost);
        self.costs(cost)
            .zip(&self.fixed)
            .map(|(c, f)| (c, if f.is_some() { c } else { u64::from(actual) }))
            .collect()
    }
}

/// In-memory twin of `lua/multi_gcra.lua`. `tats` holds each limit's stored TAT, `costs`
/// what the request costs each limit; returns the outcome, the TATs advanced when admitted.
pub(crate) fn decide(
    rates: &[BucketRate],
    tats: &mut [Option<u64>],
    now: u64,
    costs: &[u64],
) -> Outcome {
    let tat: Vec<u64> = tats.iter().map(|t| t.map_or(now, |t| t.max(now))).collect();
    let retry: Vec<Option<u64>> = rates
        .iter()
        .zip(&tat)
        .zip(costs)
        .map(|((r, &t), &cost)| {
            if cost > r.burst {
                return None;
            }
            let allow_at = (t + cost * r.emission_us).saturating_sub(r.tolerance_us());
            Some(allow_at.saturating_sub(now))
        })
        .collect();
    let allowed = retry.iter().all(|r| *r == Some(0));
    let mut parts = Vec::with_capacity(rates.len());
    for (i, r) in rates.iter().enumerate() {
        let mut t = tat[i];
        if allowed {
            t += costs[i] * r.emission_us;
            tats[i] = Some(t);
        }
        parts.push(PartOutcome {
            remaining: (now + r.tolerance_us()).saturating_sub(t) / r.emission_us,
            retry_after_us: retry[i],
            reset_after_us: t - now,
        });
    }
    let mut b = 0;
    for i in 1..parts.len() {
        let better = if allowed {
            parts[i].remaining < parts[b].remaining
        } else {
            match (parts[b].retry_after_us, parts[i].retry_after_us) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(rb), Some(ri)) => ri > rb,
            }
        };
        if better {
            b = i;
        }
    }
    let p = parts[b];
    let placed = allowed.then(|| {
        let mut ends = [0; 8];
        for (end, t) in ends.iter_mut().zip(tats.iter()) {
            *end = t.unwrap_or(now);
        }
        Placed::new(now, &ends[..tats.len()])
    });
    Outcome {
        allowed,
        remaining: p.remaining,
        retry_after_us: if allowed { Some(0) } else { p.retry_after_us },
        reset_after_us: p.reset_after_us,
        parts,
        binding: b,
        banned: false,
        position: placed.map_or(Position::Unknown, Position::Placed),
    }
}

impl MultiLimit {
    /// Each limit's validated rate, in the order of [`Algorithm::parts`].
    pub(crate) fn rates(&self) -> &[BucketRate] {
        &self.rates
    }

    /// Each limit's charge `(cost, actual)` settled on `state` (the twin of
    /// `lua/multi_gcra_settle.lua`; a refund settles every limit to 0): below its cost, at
    /// most what the charge still holds of the difference is given back (not placed on these
    /// limits' times: nothing); above it, the excess is a debt from now or the TAT.
    fn settle_parts(
        &self,
        state: &mut MemoryState,
        now_us: u64,
        charge: &Charge,
        each: &[(u64, u64)],
    ) -> Result<bool, Error> {
        let n = self.rates.len();
        let placed = charge.position.placed().filter(|p| p.ends().len() == n);
        let down = each.iter().any(|(c, a)| a < c);
        let up = each.iter().any(|(c, a)| a > c);
        let (placed, stored) = match (placed, state.tats(n)?) {
            (Some(p), stored) => (Some(p), stored),
            (None, stored) if !down => (None, stored),
            (None, _) => return Ok(false), // nothing it provably holds
        };
        let mut tats = [None; 8];
        match stored {
            Some(stored) => tats[..n].copy_from_slice(stored),
            None if !up => return Ok(false),
            None => {}
        }
        let tats = &mut tats[..n];
        let mut ledgers = state.take_ledgers(n, now_us);
        let mut changed = false;
        for (i, (tat, rate)) in tats.iter_mut().zip(&self.rates).enumerate() {
            let (cost, actual) = each[i];
            match Change::of_units(cost, actual) {
                Change::None => {}
                Change::Down(back) => {
                    let Some(p) = placed else { continue };
                    let at = (p.at_us, p.ends()[i]);
                    let given =
                        gcra::refund_part(*rate, *tat, &mut ledgers[i], now_us, (cost, back), at);
                    if let Some(g) = given {
                        *tat = g.tat;
                        changed |= g.given;
                    }
                }
                Change::Up(excess) => {
                    let base = tat.map_or(now_us, |t| t.max(now_us));
                    *tat = Some(bucket_charged(*rate, base, now_us, excess));
                    changed = true;
                }
            }
        }
        let ttl = tats
            .iter()
            .flatten()
            .map(|t| t.saturating_sub(now_us))
            .max();
        match ttl {
            Some(ttl) if ttl > 0 => state.put_tats(tats, now_us, ttl),
            _ => state.clear(),
        }
        state.put_ledgers(ledgers, now_us);
        Ok(changed)
    }
}

impl Twin for MultiLimit {
    fn peek(&self, state: &mut MemoryState, now_us: u64) -> Result<Outcome, Error> {
        let n = self.rates.len();
        let mut tats = [None; 8];
        if let Some(stored) = state.tats(n)? {
            tats[..n].copy_from_slice(stored);
        }
        let mut o = decide(&self.rates, &mut tats[..n], now_us, &[NEVER; 8][..n]);
        // The binding limit of a peek: the one with the fewest units left (the first of
        // equals), as the peek script's reply is read.
        let mut b = 0;
        for (i, p) in o.parts.iter().enumerate() {
            if p.remaining < o.parts[b].remaining {
                b = i;
            }
        }
        o.binding = b;
        o.remaining = o.parts[b].remaining;
        o.reset_after_us = o.parts[b].reset_after_us;
        Ok(o)
    }

    fn reset(&self) -> Reset {
        Reset::Floors(self.rates.iter().map(BucketRate::tolerance_us).collect())
    }
}

impl Algorithm for MultiLimit {
    fn name(&self) -> &'static str {
        "multi-gcra"
    }

    fn quota(&self) -> u64 {
        self.parts[0].quota
    }

    fn window(&self) -> Duration {
        self.parts[0].window
    }

    fn parts(&self) -> &[PartInfo] {
        &self.parts
    }

    fn rule(&self) -> Rule<'_> {
        Rule::builtin(Kind::Multi(self))
    }

    fn decide(&self, state: &mut MemoryState, now_us: u64, cost: u32) -> Result<Outcome, Error> {
        let n = self.rates.len();
        let mut tats = [None; 8];
        if let Some(stored) = state.tats(n)? {
            tats[..n].copy_from_slice(stored);
        }
        let tats = &mut tats[..n];
        let mut costs = [0; 8];
        for (c, each) in costs.iter_mut().zip(self.costs(u64::from(cost))) {
            *c = each;
        }
        let outcome = decide(&self.rates, tats, now_us, &costs[..n]);
        if outcome.allowed {
            // The state lives as long as its longest-lived limit.
            let ttl = tats.iter().flatten().map(|t| t - now_us).max().unwrap_or(0);
            state.put_tats(tats, now_us, ttl);
        }
        Ok(outcome)
    }

    /// Each limit's TAT moved back as [`Gcra`](crate::Gcra)'s is, by what the charge still
    /// holds of it (`lua/gcra_refund.lua`; `lua/multi_gcra_settle.lua` for budgets, each
    /// limit giving back its own cost).
    fn refund(&self, state: &mut MemoryState, now_us: u64, charge: &Charge) -> Result<bool, Error> {
        let cost = u64::from(charge.cost());
        let each: Vec<(u64, u64)> = self.costs(cost).map(|c| (c, 0)).collect();
        self.settle_parts(state, now_us, charge, &each)
    }

    /// Budgets only: the limits taking the request's cost settled as [`Gcra`](crate::Gcra)'s
    /// charge is (`lua/multi_gcra_settle.lua`), the others left as they are.
    fn settle(
        &self,
        state: &mut MemoryState,
        now_us: u64,
        charge: &Charge,
        actual: u32,
    ) -> Result<bool, Error> {
        if !self.settles {
            return Err(Error::Unsupported(
                "a MultiLimit settles only when built with MultiLimit::budgets",
            ));
        }
        if Change::of(charge.cost(), actual) == Change::None {
            return Ok(false);
        }
        let each = self.settled(charge.cost(), actual);
        self.settle_parts(state, now_us, charge, &each)
    }

    fn local_share(&self, instances: NonZeroU32) -> Option<Arc<dyn Algorithm>> {
        let divided = Self::build(
            self.quotas.iter().zip(&self.fixed).map(|((name, q), f)| {
                let cost = f.map_or(LimitCost::Request, LimitCost::Fixed);
                (name.to_string(), divided(*q, instances), cost)
            }),
            self.settles,
        )
        .ok()?;
        Some(Arc::new(divided))
    }
}
