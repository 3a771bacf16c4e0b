//! Sliding-window log with per-request cost and a running total.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use super::{
    bucket::divided,
    rate::WindowRate,
    state::{Log, MemoryState},
    Algorithm, Rule,
};
use crate::{
    decision::{LogEntry, Position},
    Charge, ConfigError, Error, Outcome, Quota,
};

/// Sliding-window log: at most `quota.limit()` units admitted in any window of
/// `quota.period()`, each request weighing its cost. Exact, with no boundary bursts; the price
/// is one log entry (~100 bytes in Redis) per admitted request, kept for one window.
///
/// Each call costs O(log n) in Redis: the script keeps a running total instead of summing the
/// log, and removes only expired entries.
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

/// In-memory twin of `lua/sliding_window_refund.lua`: removes `entry` from `log` and moves
/// the running totals on its shorter side by `cost`. False when the entry is gone or out of
/// the window.
pub(crate) fn refund(window: u64, log: &mut Log, now: u64, cost: u64, entry: LogEntry) -> bool {
    let now = now.max(log.last);
    if now >= window && entry.at_us <= now - window {
        return false;
    }
    let first = log.entries.partition_point(|&(ts, ..)| ts < entry.at_us);
    let Some(i) = (first..log.entries.len())
        .take_while(|&i| log.entries[i].0 == entry.at_us)
        .find(|&i| log.entries[i].2 == entry.seq)
    else {
        return false;
    };
    let newer = log.entries.len() - 1 - i;
    log.entries.remove(i);
    // The same side as the script rewrites: the older members and the expired total, or the
    // newer members and the admitted total.
    if i <= newer {
        for e in log.entries.range_mut(..i) {
            e.1 += cost;
        }
        log.removed += cost;
        return true;
    }
    for e in log.entries.range_mut(i..) {
        e.1 = e.1.saturating_sub(cost);
    }
    log.added = log.added.saturating_sub(cost);
    if newer == 0 {
        // It was the newest: the log's time goes back to the newest left.
        if let Some(&(ts, ..)) = log.entries.back() {
            log.last = ts;
        }
    }
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
        Rule::SlidingWindow(self.rate)
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
        let Position::Logged(entry) = charge.position else {
            return Ok(false);
        };
        if state.is_empty() {
            return Ok(false);
        }
        let log = state.log()?;
        Ok(refund(
            self.rate.window_us,
            log,
            now_us,
            u64::from(charge.cost()),
            entry,
        ))
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
