//! The in-memory twin of `lua/upstream_take.lua` and `lua/upstream_learn.lua`, on this
//! store's clock.

use std::time::Duration;

use super::MemoryStore;
use crate::{
    store::{
        upstream::{micros, Gate, Learned, Upstreams},
        BoxFuture, Expiring, KeyBuf, StoreKey,
    },
    Error,
};

/// What one upstream key said: paused until, the units left in a window ending when, and
/// until when a call is probing the next window.
#[derive(Default)]
pub(super) struct Said {
    paused: u64,
    window: Option<(u64, u64)>,
    probe: u64,
    /// Calls sent blind (no window known) since the last window was learned.
    blind: u64,
    /// Kept until then (a minute past the pause and the window, as the script keeps the key).
    keep_until: u64,
}

/// As the scripts: how long a probe of the next window holds the others back, the longest
/// they wait before asking again, and how long the state outlives its window.
const PROBE_US: u64 = 1_000_000;
const POLL_US: u64 = 20_000;
const KEEP_US: u64 = 60_000_000;

impl Expiring for Said {
    fn expires_at(&self) -> u64 {
        self.keep_until
    }
}

const KIND: &str = "upstream";

impl MemoryStore {
    fn with_said<T>(&self, key: StoreKey<'_>, f: impl FnOnce(&mut Said, u64) -> T) -> T {
        let now = self.now_us();
        let mut compact = KeyBuf::new();
        key.write_compact(KIND, &mut compact);
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
        let out = f(said, now);
        if said.expires_at() <= now {
            shard.remove(slot, key);
        }
        out
    }

    fn take_now(&self, key: StoreKey<'_>, cost: u32) -> Gate {
        self.with_said(key, |s, now| {
            if s.paused > now {
                return Gate::new(false, Duration::from_micros(s.paused - now));
            }
            if let Some((left, ends)) = &mut s.window {
                if *ends > now {
                    if *left < u64::from(cost) {
                        return Gate::new(false, Duration::from_micros(*ends - now));
                    }
                    *left -= u64::from(cost);
                    return Gate::new(true, Duration::ZERO);
                }
                if s.probe > now {
                    return Gate::new(false, Duration::from_micros((s.probe - now).min(POLL_US)));
                }
                s.probe = now + PROBE_US;
            }
            s.blind += 1;
            if s.keep_until <= now {
                s.keep_until = now + KEEP_US;
            }
            Gate::new(true, Duration::ZERO)
        })
    }

    fn learn_now(&self, key: StoreKey<'_>, learned: Learned) {
        self.with_said(key, |s, now| {
            if let Some(p) = learned.pause.map(micros) {
                if p > 0 {
                    s.paused = s.paused.max(now.saturating_add(p));
                }
            }
            if let (Some(r), Some(t)) = (learned.remaining, learned.reset.map(micros)) {
                let e = now.saturating_add(t);
                s.window = match s.window {
                    Some((left, ends)) if ends > now && e <= ends + 1_000_000 => {
                        if e >= ends.saturating_sub(1_000_000) {
                            Some((left.min(r), ends.min(e)))
                        } else {
                            Some((left, ends)) // stale
                        }
                    }
                    _ => {
                        let r = r.saturating_sub(s.blind.saturating_sub(1));
                        s.blind = 0;
                        Some((r, e))
                    }
                };
                if s.window.is_some_and(|w| w.1 > now) {
                    s.probe = 0;
                }
            }
            let until = s.paused.max(s.window.map_or(0, |w| w.1));
            s.keep_until = until.max(now).saturating_add(KEEP_US);
        });
    }
}

impl Upstreams for MemoryStore {
    fn take<'a>(&'a self, key: StoreKey<'a>, cost: u32) -> BoxFuture<'a, Result<Gate, Error>> {
        Box::pin(std::future::ready(Ok(self.take_now(key, cost))))
    }

    fn learn<'a>(
        &'a self,
        key: StoreKey<'a>,
        learned: Learned,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.learn_now(key, learned);
        Box::pin(std::future::ready(Ok(())))
    }
}
