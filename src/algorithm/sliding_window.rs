//! Sliding-window log with per-request cost and a running total.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use super::{
    bucket::divided,
    outcome::{LogEntry, Outcome, Position},
    rate::WindowRate,
    settle::Change,
    state::{Log, MemoryState},
    Algorithm, Kind, Reset, Rule, Twin, NEVER,
};
use crate::{
    decision::Charge,
    error::{ConfigError, Error},
    quota::{Quota, MAX_EXACT},
};

/// Sliding-window log: at most `quota.limit()` units admitted in any window of
/// `quota.period()`, each request weighing its cost. Exact, with no boundary bursts; the price
/// is one log entry (~100 bytes in Redis) per admitted request, kept for one window.
///
/// Each call costs O(log n) in Redis: the script keeps a running total instead of summing the
/// log, and removes only expired entries. A refund ([`RateLimiter::refund`](crate::RateLimiter::refund))
/// costs O(log n) commands and rewrites at most 64 entries, however long the log: an entry
/// with more than 64 others on both sides is not given back at once, its units move onto the
/// entry 64 places older and leave the window with it.
///
/// ```
/// use tower_redis_ratelimit::{Quota, SlidingWindow};
///
/// // Google Calendar-style: 300 units a minute, requests costing 1-5 units.
/// let window = SlidingWindow::new(Quota::per_minute(300))?;
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct SlidingWindow {
    quota: Quota,
    rate: WindowRate,
}

impl SlidingWindow {
    /// Validates the quota. A window under 1 ms, a zero limit, or a burst different from the
    /// limit (a sliding window has no separate burst) is rejected.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the quota's field (`quota.limit`, `quota.period`,
    /// `quota.burst`) when the quota cannot be run exactly (see [`Quota`](crate::Quota)).
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        let window_us = quota.period_us()?;
        if matches!(quota.explicit_burst(), Some(b) if b != quota.limit()) {
            return Err(ConfigError::new(
                "quota.burst",
                "a sliding window has no separate burst; its limit is the most a window admits",
            ));
        }
        Ok(Self {
            quota,
            rate: WindowRate {
                window_us,
                limit: u64::from(quota.limit()),
            },
        })
    }

    /// The quota this was built from.
    pub fn quota_config(&self) -> Quota {
        self.quota
    }

    /// The validated window the stores run.
    pub(crate) fn rate(&self) -> WindowRate {
        self.rate
    }
}

impl Twin for SlidingWindow {
    /// A log drops the entries that left the window, as a check does: that changes nothing
    /// any check can see.
    fn peek(&self, state: &mut MemoryState, now_us: u64) -> Result<Outcome, Error> {
        let WindowRate { window_us, limit } = self.rate;
        if state.is_empty() {
            return Ok(Outcome::single(false, limit, None, 0));
        }
        Ok(decide(window_us, limit, state.log()?, now_us, NEVER).0)
    }

    fn reset(&self) -> Reset {
        Reset::EmptyLog
    }
}

/// In-memory twin of `lua/sliding_window.lua`; mutates `log` exactly as the script does and
/// returns the outcome and whether the log must be (re)written with a full-window expiry.
pub(crate) fn decide(
    window: u64,
    limit: u64,
    log: &mut Log,
    now: u64,
    cost: u64,
) -> (Outcome, bool) {
    let now = now.max(log.last);
    let cutoff = now.saturating_sub(window);
    let expired = log
        .entries
        .partition_point(|&(ts, ..)| ts <= cutoff && now >= window);
    if expired > 0 {
        log.removed = log.entries[expired - 1].1;
        log.entries.drain(..expired);
    }
    if log.entries.is_empty() {
        log.removed = log.added;
    }
    let used = log.added - log.removed;
    let remaining = limit.saturating_sub(used);
    let reset_after = log.entries.back().map_or(0, |&(ts, ..)| ts + window - now);
    if cost > limit || used + cost > limit {
        let retry = (cost <= limit).then(|| {
            let target = log.removed + used + cost - limit;
            let i = log.entries.partition_point(|&(_, cum, _)| cum < target);
            log.entries[i].0 + window - now
        });
        return (Outcome::single(false, remaining, retry, reset_after), false);
    }
    log.added += cost;
    log.seq += 1;
    log.entries.push_back((now, log.added, log.seq));
    log.last = now;
    let mut o = Outcome::single(true, remaining - cost, Some(0), window);
    o.position = Position::Logged(LogEntry {
        at_us: now,
        seq: log.seq,
    });
    (o, true)
}

/// The most log entries a refund rewrites (see [`refund`]).
pub(crate) const REWRITE: usize = 64;

/// What a refund did to a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refunded {
    /// True when the entry's units were given back.
    pub(crate) given: bool,
    /// Entries whose running totals were rewritten (at most [`REWRITE`]).
    pub(crate) rewritten: usize,
}

/// In-memory twin of `lua/sliding_window_refund.lua`: removes `entry` from `log` and moves the
/// running totals on its shorter side by `cost` when that side holds at most [`REWRITE`]
/// entries (its units are given back); otherwise moves its units onto the entry `REWRITE`
/// places older (they leave the window with it). Nothing when the entry is gone or out of the
/// window.
#[cfg(test)]
pub(crate) fn refund(window: u64, log: &mut Log, now: u64, cost: u64, entry: LogEntry) -> Refunded {
    take_off(window, log, now, (cost, false), entry)
}

/// Takes `units` off the log entry `entry` at `now`: with `keep` false, removes it (a
/// refund, `units` its cost); with `keep`, leaves it with the rest of its units (a
/// settlement down to at least one unit). The twin of `lua/sliding_window_refund.lua` and of
/// `lua/sliding_window_settle.lua` settling down: the totals on one side of it move by
/// `units` (see `lua/sliding_window_refund.lua`).
pub(crate) fn take_off(
    window: u64,
    log: &mut Log,
    now: u64,
    (units, keep): (u64, bool),
    entry: LogEntry,
) -> Refunded {
    let none = Refunded {
        given: false,
        rewritten: 0,
    };
    let now = now.max(log.last);
    if now >= window && entry.at_us <= now - window {
        return none;
    }
    // Entries are in (time, sequence number) order: a binary search finds it.
    let key = (entry.at_us, entry.seq);
    let i = log.entries.partition_point(|&(ts, _, seq)| (ts, seq) < key);
    if log
        .entries
        .get(i)
        .is_none_or(|&(ts, _, seq)| (ts, seq) != key)
    {
        return none;
    }
    // Never more than the entry holds (a settlement of a copy of a settled decision finds it
    // holding less than its charge), and a kept entry keeps a unit.
    let before = match i {
        0 => log.removed,
        _ => log.entries[i - 1].1,
    };
    let holds = log.entries[i].1.saturating_sub(before);
    let units = units.min(holds.saturating_sub(u64::from(keep)));
    if units == 0 {
        return none;
    }
    let newer = log.entries.len() - 1 - i;
    if !keep {
        log.entries.remove(i);
    }
    // The same side as the script rewrites: the older entries and the expired total, or the
    // newer entries (and a kept entry itself) and the admitted total; or, deep inside, the
    // REWRITE entries before it.
    if i <= newer && i <= REWRITE {
        for e in log.entries.range_mut(..i) {
            e.1 += units;
        }
        log.removed += units;
        return Refunded {
            given: true,
            rewritten: i,
        };
    }
    if newer < i && newer <= REWRITE {
        for e in log.entries.range_mut(i..) {
            e.1 = e.1.saturating_sub(units);
        }
        log.added = log.added.saturating_sub(units);
        if newer == 0 && !keep {
            // It was the newest: the log's time goes back to the newest left.
            if let Some(&(ts, ..)) = log.entries.back() {
                log.last = ts;
            }
        }
        return Refunded {
            given: true,
            rewritten: newer + usize::from(keep),
        };
    }
    for e in log.entries.range_mut(i - REWRITE..i) {
        e.1 += units;
    }
    Refunded {
        given: false,
        rewritten: REWRITE,
    }
}

/// The twin of `lua/sliding_window_settle.lua` settling up: `excess` more units logged at
/// `now` (or the log's newest time, if later) in an entry of their own, whatever the limit;
/// they leave the window with it. The log's total never passes 2^52: what would is not
/// logged. False when nothing was.
pub(crate) fn log_more(log: &mut Log, now: u64, excess: u64) -> bool {
    let excess = excess.min(MAX_EXACT.saturating_sub(log.added));
    if excess == 0 {
        return false;
    }
    let now = now.max(log.last);
    log.added += excess;
    log.seq += 1;
    log.entries.push_back((now, log.added, log.seq));
    log.last = now;
    true
}

impl Algorithm for SlidingWindow {
    fn name(&self) -> &'static str {
        "sliding-window"
    }

    fn quota(&self) -> u64 {
        self.rate.limit
    }

    fn window(&self) -> Duration {
        Duration::from_micros(self.rate.window_us)
    }

    fn rule(&self) -> Rule<'_> {
        Rule::builtin(Kind::SlidingWindow(self))
    }

    fn decide(&self, state: &mut MemoryState, now_us: u64, cost: u32) -> Result<Outcome, Error> {
        let was_empty = state.is_empty();
        let WindowRate { window_us, limit } = self.rate;
        let log = state.log()?;
        let (outcome, write) = decide(window_us, limit, log, now_us, u64::from(cost));
        if !write && was_empty {
            // Denied on a key that held nothing: keep nothing, as the script writes nothing.
            state.clear();
            return Ok(outcome);
        }
        // A log that emptied out gives its memory back; the store bounds what is held.
        let entries = &mut log.entries;
        if entries.capacity() > 64 && entries.capacity() > 4 * entries.len() {
            entries.shrink_to(2 * entries.len());
        }
        // The log lives one window past its newest entry, as the Redis keys do.
        let ttl = (log.last + window_us).saturating_sub(now_us);
        state.keep_log(now_us, ttl);
        Ok(outcome)
    }

    fn refund(&self, state: &mut MemoryState, now_us: u64, charge: &Charge) -> Result<bool, Error> {
        self.settle(state, now_us, charge, 0)
    }

    /// Settling down takes the difference off the check's own log entry (all of it, the
    /// entry removed, for a settlement to 0), as a refund does; settling up logs the
    /// difference at `now_us` in an entry of its own, whatever the limit: it leaves the window
    /// a window later.
    fn settle(
        &self,
        state: &mut MemoryState,
        now_us: u64,
        charge: &Charge,
        actual: u32,
    ) -> Result<bool, Error> {
        let window_us = self.rate.window_us;
        match Change::of(charge.cost(), actual) {
            Change::None => Ok(false),
            Change::Down(back) => {
                let Position::Logged(entry) = charge.position else {
                    return Ok(false);
                };
                if state.is_empty() {
                    return Ok(false);
                }
                let log = state.log()?;
                Ok(take_off(window_us, log, now_us, (back, actual > 0), entry).given)
            }
            Change::Up(excess) => {
                let was_empty = state.is_empty();
                let log = state.log()?;
                let logged = log_more(log, now_us, excess);
                let ttl = (log.last + window_us).saturating_sub(now_us);
                if logged {
                    state.keep_log(now_us, ttl);
                } else if was_empty {
                    state.clear(); // nothing was there, nothing was written
                }
                Ok(logged)
            }
        }
    }

    fn local_share(&self, instances: NonZeroU32) -> Option<Arc<dyn Algorithm>> {
        Some(Arc::new(Self::new(divided(self.quota, instances)).ok()?))
    }

    /// Only with this window's period: a check under a shorter window would drop the log
    /// entries a longer one still counts (and a longer one would count entries already
    /// dropped), so another period is a [`ConfigError`] naming `quota.period`.
    fn with_quota(&self, quota: Quota) -> Result<Box<dyn Algorithm>, ConfigError> {
        if quota.period() != self.quota.period() {
            return Err(ConfigError::new(
                "quota.period",
                format!(
                    "a sliding window takes quotas per request with its own period ({:?}), not {:?}",
                    self.quota.period(),
                    quota.period()
                ),
            ));
        }
        Ok(Box::new(Self::new(quota)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the sizes a client can reach (100,000 per 120 s, a log of 40,000 entries), 100
    /// refunds parked in the middle each rewrite at most `REWRITE` entries, whatever the log's
    /// size; their units leave the window with older entries, never later than their own.
    #[test]
    fn a_refund_rewrites_a_bounded_number_of_entries() {
        let (window, limit) = (120_000_000, 100_000);
        let t0 = 1_700_000_000_000_000;
        let mut log = Log::default();
        let mut parked = Vec::new();
        for i in 0..40_100u64 {
            let (o, _) = decide(window, limit, &mut log, t0 + i, 1);
            assert!(o.allowed);
            if (20_000..20_100).contains(&i) {
                let Position::Logged(entry) = o.position else {
                    panic!("an admission names its entry");
                };
                parked.push(entry);
            }
        }
        let now = t0 + 50_000;
        for entry in parked {
            let r = refund(window, &mut log, now, 1, entry);
            assert!(r.rewritten <= REWRITE, "{r:?}");
            assert!(
                !r.given,
                "deep inside: moved onto an older entry, not given back"
            );
        }
        assert!(log
            .entries
            .iter()
            .zip(log.entries.iter().skip(1))
            .all(|(a, b)| a.1 < b.1));
        // Nothing given back now; the units leave the window with the entries they moved to
        // (each refund moves its units 64 entries back, onto those logged at t0 + 19,936 to
        // t0 + 19,999), before the entries they were parked at (t0 + 20,000 on).
        let used = |log: &mut Log, at| limit - decide(window, limit, log, at, 1).0.remaining - 1;
        assert_eq!(used(&mut log.clone(), now), 40_100);
        assert_eq!(
            used(&mut log.clone(), t0 + window + 19_935),
            40_100 - 19_936
        );
        assert_eq!(
            used(&mut log.clone(), t0 + window + 19_999),
            40_100 - 20_000 - 100
        );
        // Near either end, a refund rewrites the shorter side and gives the units back.
        let newest = LogEntry {
            at_us: t0 + 40_099,
            seq: 40_100,
        };
        let r = refund(window, &mut log, now, 1, newest);
        assert_eq!((r.given, r.rewritten), (true, 0));
    }
}
