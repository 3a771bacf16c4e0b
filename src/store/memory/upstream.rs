//! The in-memory twin of `lua/upstream_take.lua`, `lua/upstream_learn.lua` and
//! `lua/upstream_settle.lua`, on this store's clock: the same fields, the same rules.

use std::time::Duration;

use super::MemoryStore;
use crate::store::{
    micros,
    upstream::{Gate, Learned, Ledger, Sent, MAX_RATE_QUOTA, MAX_RATE_WINDOW},
    Expiring, KeyBuf, StoreKey,
};

/// What one upstream key said (the fields of the script's hash).
#[derive(Default)]
pub(super) struct Said {
    /// `p`: paused until.
    paused: u64,
    /// `r` and `e`: the units left in the upstream's window, and its end.
    window: Option<(u64, u64)>,
    /// `q`: a call is learning the next window until then.
    probe: Option<u64>,
    /// `b` and `s`: calls sent blind since then.
    blind: Option<(u64, u64)>,
    /// `n` and `w`: the upstream's rate (units per window, µs).
    rate: Option<(u64, u64)>,
    /// `t`: the next free place in the upstream's pace.
    pace: u64,
    /// `x`: the rate was estimated from a 429.
    estimated: bool,
    /// `a` and `c`: calls answered without a word since then (while nothing is known).
    answered: u64,
    count_start: Option<u64>,
    /// The key's expiry.
    keep_until: u64,
}

/// One unit's place in the pace of `n` units per `w` µs, a little below the upstream's rate
/// (as the scripts).
fn interval(n: u64, w: u64) -> u64 {
    (w.saturating_mul(100)).div_ceil(n.saturating_mul(97))
}

/// As the scripts.
const PROBE_US: u64 = 1_000_000;
const POLL_US: u64 = 20_000;
const BLIND_US: u64 = 10_000_000;
const KEEP_US: u64 = 60_000_000;
/// The largest time the scripts keep (2^52 µs).
const MAX: u64 = 1 << 52;

impl Expiring for Said {
    fn expires_at(&self) -> u64 {
        self.keep_until
    }
}

/// The kind of the in-process map's keys, per ledger.
fn kind(ledger: Ledger) -> &'static str {
    match ledger {
        Ledger::Requests => "upstream",
        Ledger::Tokens => "upstream-tokens",
    }
}

impl Said {
    /// The blind count, if its calls are recent enough to be on their way.
    fn recent_blind(&self, now: u64) -> u64 {
        match self.blind {
            Some((count, since)) if since >= now.saturating_sub(BLIND_US) => count,
            _ => 0,
        }
    }

    /// As `upstream_take.lua`.
    fn take(&mut self, now: u64, cost: u64, budget: u64) -> Gate {
        if self.paused > now {
            return Gate::new(false, Duration::from_micros(self.paused - now));
        }
        if let Some((n, w)) = self.rate {
            let slot = self.pace.max(now);
            let wait = slot - now;
            if wait > budget {
                return Gate::new(false, Duration::from_micros(wait));
            }
            self.pace = slot
                .saturating_add(interval(n, w).saturating_mul(cost))
                .min(MAX);
            self.keep_until = self.pace.saturating_add(KEEP_US);
            return Gate::new(true, Duration::from_micros(wait));
        }
        let mut blind = Sent::Blind;
        if let Some((left, ends)) = &mut self.window {
            if *ends > now {
                if *left < cost {
                    return Gate::new(false, Duration::from_micros(*ends - now));
                }
                *left -= cost;
                return Gate::new(true, Duration::ZERO);
            }
            if let Some(q) = self.probe.filter(|&q| q > now) {
                return Gate::new(false, Duration::from_micros((q - now).min(POLL_US)));
            }
            self.probe = Some(now + PROBE_US);
            blind = Sent::Probe;
        }
        self.blind = match self.blind {
            Some((count, since)) if since >= now.saturating_sub(BLIND_US) => {
                Some((count.saturating_add(cost), since))
            }
            _ => Some((cost, now)),
        };
        if blind == Sent::Blind && self.count_start.is_none() {
            self.count_start = Some(now);
        }
        if self.keep_until <= now {
            self.keep_until = now + KEEP_US;
        }
        Gate::new(true, Duration::ZERO).blind(blind)
    }

    /// As `upstream_learn.lua`.
    fn learn(&mut self, now: u64, learned: Learned, (how, cost): (Sent, u64)) {
        let probed = how == Sent::Probe;
        let mut blind = self.recent_blind(now);
        if how != Sent::Counted && blind > 0 {
            // This call's answer is back: it is no longer on its way.
            blind = blind.saturating_sub(cost);
            if let Some((count, _)) = &mut self.blind {
                *count = blind;
            }
        }
        // As the script: a count without its reset is not known.
        let remaining = learned.remaining.filter(|_| learned.reset.is_some());
        let rate_told = learned.rate.filter(|r| r.quota > 0 && !r.window.is_zero());
        let had_rate = self.rate.is_some();
        let was_estimated = self.estimated;
        if let Some(rate) = rate_told {
            let quota = rate.quota.min(MAX_RATE_QUOTA);
            let mut window = micros(rate.window.min(MAX_RATE_WINDOW));
            let known = self.rate.map(|(_, w)| w);
            if self.estimated {
                self.estimated = false;
            } else if !rate.stated {
                window = window.max(known.unwrap_or(0));
            }
            self.rate = Some((quota, window));
            if let (None, Some(r)) = (known, remaining) {
                // The pace starts (as the script says why).
                let spent = (quota.saturating_sub(r) + blind).min(quota);
                self.pace = now
                    .saturating_add(spent.saturating_mul(interval(quota, window)))
                    .min(MAX);
            }
        }
        if let (Some(0), Some((n, w))) = (remaining, self.rate) {
            self.pace = self.pace.max(now).saturating_add(interval(n, w)).min(MAX);
        }
        let pause = learned.pause.map(micros).filter(|&p| p > 0);
        if let Some(p) = pause {
            self.paused = self.paused.max(now.saturating_add(p).min(MAX));
        }
        // As the script: a rate estimated from an upstream that tells nothing but pauses.
        if rate_told.is_none() && remaining.is_none() && !had_rate {
            if pause.is_some() {
                match (self.answered, self.count_start) {
                    (answered @ 1.., Some(start)) => {
                        let w = self.paused.saturating_sub(start).max(1);
                        self.rate = Some((answered, w));
                        self.estimated = true;
                        self.pace = self.paused;
                        self.answered = 0;
                        self.count_start = None;
                    }
                    _ => self.count_start = Some(self.paused),
                }
            } else if how != Sent::Counted {
                self.answered += 1;
            }
        } else if let (None, true, Some((n, w))) = (rate_told, was_estimated, self.rate) {
            if pause.is_some() && how == Sent::Counted {
                self.rate = Some(((n - n / 8).max(1), w));
            } else if pause.is_none() && how != Sent::Counted && remaining.is_none() {
                self.rate = Some(((n + 1).min(MAX), w));
            }
        }
        self.learn_window(now, &learned, probed, blind);
        if probed || self.window.is_some_and(|(_, ends)| ends > now) {
            self.probe = None;
        }
        let until = self.paused.max(self.window.map_or(0, |w| w.1));
        self.keep_until = until.max(now) + KEEP_US;
    }
}

impl Said {
    /// As `upstream_settle.lua`: the pace (and a known window's count) moved by what the
    /// call used beyond, or below, what it took.
    fn settle(&mut self, now: u64, taken: u64, used: u64) {
        if taken == used {
            return;
        }
        if let Some((n, w)) = self.rate {
            let i = interval(n, w);
            if used > taken {
                let debt = (used - taken).saturating_mul(i).min(MAX);
                self.pace = self.pace.max(now).saturating_add(debt).min(MAX);
            } else if self.pace > now {
                let back = (taken - used).saturating_mul(i).min(MAX);
                self.pace = self.pace.saturating_sub(back).max(now);
            }
            let keep = self.pace.max(now) + KEEP_US;
            self.keep_until = self.keep_until.max(keep);
        }
        if let Some((left, ends)) = &mut self.window {
            if *ends > now {
                *left = if used > taken {
                    left.saturating_sub(used - taken)
                } else {
                    left.saturating_add(taken - used).min(MAX)
                };
            }
        }
    }

    /// The window an answer tells, as `upstream_learn.lua` keeps it: the same window keeps
    /// the smaller count and the earlier end, a new one takes the calls still on their way
    /// (`blind`) off its count; a call that went first and learned nothing forgets the old.
    fn learn_window(&mut self, now: u64, learned: &Learned, probed: bool, blind: u64) {
        let known = self.window.is_some_and(|(_, ends)| ends > now);
        match (learned.remaining, learned.reset.map(micros)) {
            (Some(r), Some(t)) => {
                let e = now.saturating_add(t).min(MAX);
                match &mut self.window {
                    Some((left, ends)) if known => {
                        if e > *ends + 1_000_000 {
                            *left = (*left).min(r);
                        } else if e + 1_000_000 >= *ends {
                            *left = (*left).min(r);
                            *ends = (*ends).min(e);
                        }
                    }
                    _ => {
                        self.window = Some((r.saturating_sub(blind), e));
                        self.blind = None;
                    }
                }
            }
            _ if probed && !known => self.window = None,
            _ => {}
        }
    }
}

impl MemoryStore {
    /// Runs `f` on the state of `key`, fresh when it expired (as the Redis key would have),
    /// removed when left expired.
    fn with_said<T>(
        &self,
        key: StoreKey<'_>,
        ledger: Ledger,
        f: impl FnOnce(&mut Said, u64) -> T,
    ) -> T {
        let now = self.now_us();
        let mut compact = KeyBuf::new();
        key.write_compact(kind(ledger), &mut compact);
        let key = compact.as_bytes();
        let map = &self.inner.upstreams;
        let slot = map.slot(key);
        let mut shard = map.lock(slot);
        if shard.get_mut(slot, key).is_none() {
            shard.room(now);
        }
        let said = match shard.get_mut(slot, key) {
            Some(s) => s,
            None => shard.insert(slot, key, Said::default()),
        };
        if said.keep_until <= now {
            *said = Said::default();
        }
        let out = f(said, now);
        if said.keep_until <= now {
            shard.remove(slot, key);
        }
        out
    }
}

impl MemoryStore {
    /// Whether a call of `cost` may go now (see [`Backend::take`](crate::store::Backend::take)).
    pub(super) fn take_units(
        &self,
        key: StoreKey<'_>,
        ledger: Ledger,
        cost: u32,
        budget: Duration,
    ) -> Gate {
        let budget = micros(budget).min(MAX);
        self.with_said(key, ledger, |s, now| s.take(now, u64::from(cost), budget))
    }

    /// Records what an answer said (see [`Backend::learn`](crate::store::Backend::learn)).
    pub(super) fn learn_said(
        &self,
        key: StoreKey<'_>,
        ledger: Ledger,
        learned: Learned,
        how: Sent,
        cost: u32,
    ) {
        let answered = (how, u64::from(cost));
        self.with_said(key, ledger, |s, now| s.learn(now, learned, answered));
    }

    /// Settles a call's units (see [`Backend::settle`](crate::store::Backend::settle)); a
    /// state that expired is left alone, as the script leaves a missing key.
    pub(super) fn settle_used(&self, key: StoreKey<'_>, ledger: Ledger, taken: u64, used: u64) {
        let (taken, used) = (taken.min(MAX_RATE_QUOTA), used.min(MAX_RATE_QUOTA));
        self.with_said(key, ledger, |s, now| {
            if s.keep_until > now {
                s.settle(now, taken, used);
            }
        });
    }
}
