//! Several GCRA limits on one key, decided atomically together.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use super::{
    bucket::divided,
    gcra,
    held::Placed,
    outcome::{Outcome, PartInfo, PartOutcome, Position},
    rate::BucketRate,
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
#[derive(Debug, Clone)]
pub struct MultiLimit {
    quotas: Vec<(Arc<str>, Quota)>,
    rates: Vec<BucketRate>,
    parts: Vec<PartInfo>,
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
        let mut quotas: Vec<(Arc<str>, Quota)> = Vec::new();
        for (name, quota) in limits {
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
        Ok(Self {
            quotas,
            rates,
            parts,
        })
    }
}

/// In-memory twin of `lua/multi_gcra.lua`. `tats` holds each limit's stored TAT; returns the
/// outcome and whether the TATs were advanced (admitted).
pub(crate) fn decide(
    rates: &[BucketRate],
    tats: &mut [Option<u64>],
    now: u64,
    cost: u64,
) -> Outcome {
    let tat: Vec<u64> = tats.iter().map(|t| t.map_or(now, |t| t.max(now))).collect();
    let retry: Vec<Option<u64>> = rates
        .iter()
        .zip(&tat)
        .map(|(r, &t)| {
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
            t += cost * r.emission_us;
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
}

impl Twin for MultiLimit {
    fn peek(&self, state: &mut MemoryState, now_us: u64) -> Result<Outcome, Error> {
        let n = self.rates.len();
        let mut tats = [None; 8];
        if let Some(stored) = state.tats(n)? {
            tats[..n].copy_from_slice(stored);
        }
        let mut o = decide(&self.rates, &mut tats[..n], now_us, NEVER);
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
        let outcome = decide(&self.rates, tats, now_us, u64::from(cost));
        if outcome.allowed {
            // The state lives as long as its longest-lived limit.
            let ttl = tats.iter().flatten().map(|t| t - now_us).max().unwrap_or(0);
            state.put_tats(tats, now_us, ttl);
        }
        Ok(outcome)
    }

    /// Each limit's TAT moved back as [`Gcra`](crate::Gcra)'s is, by what the charge still
    /// holds of it (`lua/gcra_refund.lua`).
    fn refund(&self, state: &mut MemoryState, now_us: u64, charge: &Charge) -> Result<bool, Error> {
        let n = self.rates.len();
        let Some(placed) = charge.position.placed().filter(|p| p.ends().len() == n) else {
            return Ok(false); // not placed on these limits' times: nothing it provably holds
        };
        let mut tats = [None; 8];
        match state.tats(n)? {
            Some(stored) => tats[..n].copy_from_slice(stored),
            None => return Ok(false),
        }
        let tats = &mut tats[..n];
        let mut ledgers = state.take_ledgers(n, now_us);
        let cost = u64::from(charge.cost());
        let mut given = false;
        for (i, (tat, rate)) in tats.iter_mut().zip(&self.rates).enumerate() {
            let at = (placed.at_us, placed.ends()[i]);
            if let Some(g) = gcra::refund(*rate, *tat, &mut ledgers[i], now_us, cost, at) {
                *tat = g.tat;
                given |= g.given;
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
        Ok(given)
    }

    fn local_share(&self, instances: NonZeroU32) -> Option<Arc<dyn Algorithm>> {
        let divided = Self::new(
            self.quotas
                .iter()
                .map(|(name, q)| (name.to_string(), divided(*q, instances))),
        )
        .ok()?;
        Some(Arc::new(divided))
    }
}
