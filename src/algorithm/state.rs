//! One key's state in a [`MemoryStore`](crate::MemoryStore), with its expiry.

use std::{any::Any, collections::VecDeque};

use super::held::Ledger;
use crate::error::Error;

/// One key's state in a [`MemoryStore`](crate::MemoryStore), with its expiry.
///
/// Like a Redis key, it holds a value of one type or nothing, and it expires: an algorithm
/// stores its state with [`MemoryState::put`] and a time to live, and finds nothing after that.
/// The built-in algorithms keep their state inline (no allocation per key for GCRA and the
/// token bucket); a custom algorithm stores any `T: Any + Send`.
#[derive(Debug, Default)]
pub struct MemoryState {
    value: Value,
    expires_at_us: u64,
    /// Log entries the value holds (a sliding-window log), for the store's memory bound.
    entries: usize,
}

#[derive(Debug, Default)]
enum Value {
    #[default]
    Empty,
    Tat(u64),
    Bucket(Bucket),
    Window(Window),
    Tats(Box<[Option<u64>]>),
    /// Boxed: the largest state stays out of line, so the value of every other key is small.
    Log(Box<Log>),
    Any(Box<dyn Any + Send>),
    /// A GCRA, token-bucket or multi-limit state (or none, once rested) with the ledgers of
    /// its refunds, one per limit (see `held.rs`), which may outlive it.
    Ledgered(Box<Ledgered>),
}

#[derive(Debug)]
struct Ledgered {
    value: Value,
    ledgers: Vec<Ledger>,
}

/// Token-bucket state: whole tokens, and the time the last whole token was credited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub(crate) tokens: u64,
    pub(crate) ts: u64,
}

/// Fixed-window state: the units admitted in the current window, and the window's id (a time
/// inside it: its start, or the time just after the reset that zeroed it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) id: u64,
    pub(crate) count: u64,
}

/// Sliding-window state: the log (time, running total, sequence number) and the totals of
/// the Lua hash.
#[derive(Debug, Default, Clone)]
pub(crate) struct Log {
    pub(crate) entries: VecDeque<(u64, u64, u64)>,
    pub(crate) added: u64,
    pub(crate) removed: u64,
    pub(crate) last: u64,
    /// The last sequence number given.
    pub(crate) seq: u64,
}

impl MemoryState {
    /// The stored value, if any; [`Error::WrongType`] if a value of another type is stored
    /// under this key (two algorithms sharing a key), like Redis' `WRONGTYPE`.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when a value of another type is stored under this key.
    pub fn get_mut<T: Any + Send>(&mut self) -> Result<Option<&mut T>, Error> {
        match &mut self.value {
            Value::Empty => Ok(None),
            Value::Any(v) => v.downcast_mut::<T>().map(Some).ok_or(Error::WrongType),
            _ => Err(Error::WrongType),
        }
    }

    /// Stores `value` until `now_us + ttl_us`.
    pub fn put<T: Any + Send>(&mut self, value: T, now_us: u64, ttl_us: u64) {
        // Overwrite in place when the key already holds a `T`: no allocation per check.
        match &mut self.value {
            Value::Any(v) if v.is::<T>() => {
                if let Some(slot) = v.downcast_mut::<T>() {
                    *slot = value;
                }
            }
            _ => self.value = Value::Any(Box::new(value)),
        }
        self.expire_after(now_us, ttl_us);
    }

    fn expire_after(&mut self, now_us: u64, ttl_us: u64) {
        self.expires_at_us = now_us.saturating_add(ttl_us);
    }

    /// The stored value, ledgers aside.
    fn plain(&self) -> &Value {
        match &self.value {
            Value::Ledgered(l) => &l.value,
            v => v,
        }
    }

    /// Stores `value` until `now_us + ttl_us`, keeping the ledgers (and what they need kept).
    fn put_plain(&mut self, value: Value, now_us: u64, ttl_us: u64) {
        let mut expires = now_us.saturating_add(ttl_us);
        match &mut self.value {
            Value::Ledgered(l) => {
                l.value = value;
                expires = expires.max(l.ledgers.iter().map(|g| g.until).max().unwrap_or(0));
            }
            v => *v = value,
        }
        self.expires_at_us = expires;
    }

    /// A GCRA's theoretical arrival time, if one is stored.
    pub(crate) fn tat(&self) -> Result<Option<u64>, Error> {
        match *self.plain() {
            Value::Empty => Ok(None),
            Value::Tat(t) => Ok(Some(t)),
            _ => Err(Error::WrongType),
        }
    }

    /// A GCRA's state holding `tat`, which expires then.
    pub(crate) fn of_tat(tat: u64) -> Self {
        Self {
            value: Value::Tat(tat),
            expires_at_us: tat,
            entries: 0,
        }
    }

    /// What a GCRA key's state comes to at `now_us` (expired value cleared, refund ledgers
    /// dropped once every one may be forgotten, as [`take_ledgers`](Self::take_ledgers)
    /// would) when it is no more than its TAT: `Some(None)` when it holds nothing,
    /// `Some(Some(tat))` when a TAT alone, `None` otherwise.
    pub(crate) fn bare_tat_at(&mut self, now_us: u64) -> Option<Option<u64>> {
        self.expire(now_us);
        if let Value::Ledgered(l) = &mut self.value {
            if l.ledgers.iter().all(|g| g.until <= now_us) {
                self.value = std::mem::take(&mut l.value);
            }
        }
        match self.value {
            Value::Empty => Some(None),
            Value::Tat(t) => Some(Some(t)),
            _ => None,
        }
    }

    pub(crate) fn put_tat(&mut self, tat: u64, now_us: u64, ttl_us: u64) {
        self.put_plain(Value::Tat(tat), now_us, ttl_us);
    }

    /// A token bucket, if one is stored.
    pub(crate) fn bucket(&self) -> Result<Option<Bucket>, Error> {
        match *self.plain() {
            Value::Empty => Ok(None),
            Value::Bucket(b) => Ok(Some(b)),
            _ => Err(Error::WrongType),
        }
    }

    pub(crate) fn put_bucket(&mut self, bucket: Bucket, now_us: u64, ttl_us: u64) {
        self.put_plain(Value::Bucket(bucket), now_us, ttl_us);
    }

    /// A fixed window, if one is stored.
    pub(crate) fn window(&self) -> Result<Option<Window>, Error> {
        match *self.plain() {
            Value::Empty => Ok(None),
            Value::Window(w) => Ok(Some(w)),
            _ => Err(Error::WrongType),
        }
    }

    pub(crate) fn put_window(&mut self, window: Window, now_us: u64, ttl_us: u64) {
        self.put_plain(Value::Window(window), now_us, ttl_us);
    }

    /// Zeroes a fixed window (a reset) under a new id, just after `now_us` and after the
    /// stored one, keeping its expiry (see `lua/reset.lua`), so that a refund of a check
    /// admitted before gives nothing back; nothing if the key holds no window.
    pub(crate) fn zero_window(&mut self, now_us: u64) {
        if let Value::Window(w) = &mut self.value {
            *w = Window {
                id: now_us.max(w.id) + 1,
                count: 0,
            };
        }
    }

    /// Several GCRAs' arrival times, if `n` of them are stored.
    pub(crate) fn tats(&self, n: usize) -> Result<Option<&[Option<u64>]>, Error> {
        match self.plain() {
            Value::Empty => Ok(None),
            Value::Tats(t) if t.len() == n => Ok(Some(t)),
            Value::Tats(_) => Ok(None), // the limits were reconfigured: start afresh
            _ => Err(Error::WrongType),
        }
    }

    pub(crate) fn put_tats(&mut self, tats: &[Option<u64>], now_us: u64, ttl_us: u64) {
        let slot = match &mut self.value {
            Value::Ledgered(l) => &mut l.value,
            v => v,
        };
        let value = match std::mem::take(slot) {
            Value::Tats(mut t) if t.len() == tats.len() => {
                t.copy_from_slice(tats);
                Value::Tats(t)
            }
            _ => Value::Tats(tats.into()),
        };
        self.put_plain(value, now_us, ttl_us);
    }

    /// Takes the ledgers of this key's refunds out, `n` of them (one per limit): empty ones if
    /// the key has none (or another number), and in place of those that may be forgotten by
    /// `now_us`. Give them back with [`put_ledgers`](Self::put_ledgers).
    pub(crate) fn take_ledgers(&mut self, n: usize, now_us: u64) -> Vec<Ledger> {
        let ledgers = match std::mem::take(&mut self.value) {
            Value::Ledgered(l) => {
                self.value = l.value;
                l.ledgers
            }
            v => {
                self.value = v;
                Vec::new()
            }
        };
        if ledgers.len() != n {
            return vec![Ledger::default(); n];
        }
        let mut ledgers = ledgers;
        for ledger in &mut ledgers {
            if ledger.until <= now_us {
                *ledger = Ledger::default();
            }
        }
        ledgers
    }

    /// Keeps `ledgers` with the stored value (and the key until they may be forgotten), unless
    /// they may already be at `now_us`.
    pub(crate) fn put_ledgers(&mut self, ledgers: Vec<Ledger>, now_us: u64) {
        let until = ledgers.iter().map(|g| g.until).max().unwrap_or(0);
        if until <= now_us {
            return;
        }
        let value = std::mem::take(&mut self.value);
        self.value = Value::Ledgered(Box::new(Ledgered { value, ledgers }));
        self.expires_at_us = self.expires_at_us.max(until);
    }

    /// Forgets the value (a reset), leaving per limit a refund ledger whose floor is just
    /// after `now_us`, for that limit's lead (see `lua/reset.lua`): a refund of a check
    /// admitted at or before `now_us` gives nothing back.
    pub(crate) fn rest_with_floors(&mut self, leads: &[u64], now_us: u64) {
        let ledgers = leads
            .iter()
            .map(|&lead| Ledger {
                until: now_us.saturating_add(lead),
                floor: now_us + 1,
                records: Vec::new(),
            })
            .collect();
        self.clear();
        self.expires_at_us = now_us;
        self.put_ledgers(ledgers, now_us);
    }

    /// Empties a sliding-window log (a reset), keeping its newest time, its last sequence
    /// number and its expiry (see `lua/reset.lua`); nothing if the key holds no log.
    pub(crate) fn empty_log(&mut self) {
        if let Value::Log(log) = &mut self.value {
            log.entries = VecDeque::new();
            log.removed = log.added;
            self.entries = 0;
        }
    }

    /// The sliding-window log, created empty if the key holds nothing.
    pub(crate) fn log(&mut self) -> Result<&mut Log, Error> {
        if let Value::Empty = self.value {
            self.value = Value::Log(Box::default());
        }
        match &mut self.value {
            Value::Log(log) => Ok(log),
            _ => Err(Error::WrongType),
        }
    }

    /// Keeps the log until `now_us + ttl_us` and records how many entries it holds.
    pub(crate) fn keep_log(&mut self, now_us: u64, ttl_us: u64) {
        if let Value::Log(log) = &self.value {
            self.entries = log.entries.capacity();
        }
        self.expire_after(now_us, ttl_us);
    }

    /// Forgets the value (an algorithm that found nothing worth keeping).
    pub(crate) fn clear(&mut self) {
        self.value = Value::Empty;
        self.entries = 0;
    }

    /// Clears the value if it expired at or before `now_us`.
    pub(crate) fn expire(&mut self, now_us: u64) {
        if !self.is_empty() && self.expires_at_us <= now_us {
            self.clear();
        }
    }

    pub(crate) fn expires_at(&self) -> u64 {
        self.expires_at_us
    }

    pub(crate) fn is_empty(&self) -> bool {
        matches!(self.value, Value::Empty)
    }

    /// Log entries the stored value holds (as allocated).
    pub(crate) fn entries(&self) -> usize {
        self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorScope;

    /// Two algorithms storing different types under one key: an error about that key, as
    /// Redis answers `WRONGTYPE`, never a reply error or a reset state.
    #[test]
    fn another_algorithms_state_is_a_wrong_type() {
        let mut state = MemoryState::default();
        state.put(7u64, 0, 1_000);
        assert!(matches!(state.get_mut::<String>(), Err(Error::WrongType)));
        assert!(matches!(state.tat(), Err(Error::WrongType)));
        assert!(matches!(state.log(), Err(Error::WrongType)));
        assert_eq!(Error::WrongType.scope(), ErrorScope::Key);
        assert_eq!(state.get_mut::<u64>().unwrap(), Some(&mut 7));
        let mut gcra = MemoryState::default();
        gcra.put_tat(5, 0, 1_000);
        assert!(matches!(gcra.bucket(), Err(Error::WrongType)));
        assert!(matches!(gcra.get_mut::<u64>(), Err(Error::WrongType)));
    }
}
