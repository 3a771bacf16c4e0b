//! The lease table: per key, the lease this limiter holds, the reservation in flight, and
//! the key's observed demand that sizes the next lease. Bounded: split over lock shards,
//! each holding at most its share of the keys; idle keys make room for new ones.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use tokio::sync::{futures::OwnedNotified, Notify};

use crate::{
    algorithm::{Outcome, Placed, Position},
    store::Sharded,
};

const SHARDS: usize = 16;

/// A lease grows only for keys seen at least this many times within one lifetime: a colder
/// key asks the store for each check, exactly (batched like any check), with no units to
/// give back.
const HOT: usize = 4;

/// Keys a new key looks at, in a full shard, for a cold one to take the place of.
const EVICTION_SCAN: usize = 32;

/// The leases of one limiter: keys (compact bytes) to their state, on the crate's sharded
/// map. A full shard of keys that are all busy is swept at most once per lifetime, so a new
/// key does not pay a sweep each time.
pub(crate) struct Table {
    keys: Sharded<Tracked>,
    lifetime: Duration,
    /// The most units one lease holds.
    cap: u64,
    /// The key's emission interval: a leased unit's share of the key's time.
    emission_us: u64,
    /// The last lease's number, across keys: a key forgotten and tracked again never reuses
    /// the number of a lease whose return is still pending.
    generations: AtomicU64,
}

/// One key's state.
struct Tracked {
    lease: Lease,
    /// Woken when the reservation in flight lands (or fails, or is dropped).
    in_flight: Option<Arc<Notify>>,
    /// When the last reservation was sent.
    since: Instant,
    /// Units asked for since then (handed out, waited for, or sent to the store).
    demand: u64,
    /// Units this key uses per lifetime: an average over the reservations.
    per_lifetime: u64,
    /// Numbers the leases of this key apart, so a lease's return finds only its own units.
    generation: u64,
    /// When the last `HOT` checks of this key came (a ring; `None` before there were so many):
    /// the key is hot while the oldest of them is less than a lifetime old.
    seen: [Option<Instant>; HOT],
    next_seen: usize,
}

/// Units in hand: `left` of them, to hand out before `until`.
#[derive(Clone)]
struct Lease {
    left: u64,
    until: Instant,
    /// What the store said was left besides this lease, at the reservation.
    remaining: u64,
    reset_after_us: u64,
    /// Where the reservation's units lie on the key's time: handed out in order, so those
    /// left are the last of them.
    placed: Option<Placed>,
}

/// Units of a lease that go back to the store, and where they lie on the key's time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unspent {
    pub(crate) units: u64,
    pub(crate) placed: Option<Placed>,
}

impl Lease {
    /// The rest of this lease, taken out of it.
    fn take_rest(&mut self) -> Unspent {
        Unspent {
            units: std::mem::take(&mut self.left),
            placed: self.placed.clone(),
        }
    }
}

/// `placed` (a reservation's units) with `left` of its last units not counted: where the
/// units handed out before them lie.
pub(crate) fn before_the_last(
    placed: Option<Placed>,
    left: u64,
    emission_us: u64,
) -> Option<Placed> {
    placed.map(|p| {
        let end = p.ends().first().copied().unwrap_or(0);
        Placed::new(
            p.at_us,
            &[end.saturating_sub(left.saturating_mul(emission_us))],
        )
    })
}

/// What a check does, as the table says.
pub(crate) enum Step {
    /// Answered from the lease.
    Taken(Outcome),
    /// A reservation of this key is in flight: wait for it, then try the lease once more.
    /// (Registered under the table's lock, so the reservation cannot land unseen.)
    Wait(OwnedNotified),
    /// Send a reservation of up to `up_to` units (at least the cost); first give the rest of
    /// the previous lease back to the store.
    Reserve { up_to: u64, give_back: Unspent },
    /// Not tracked (the table is full): check in the store, as without leases.
    Untracked,
    /// A cold key (or a cost no lease would add to): check in the store, exactly as without
    /// leases, after giving the rest of the previous lease back.
    Exact { give_back: Unspent },
}

impl Table {
    pub(crate) fn new(max_keys: usize, lifetime: Duration, cap: u64, emission_us: u64) -> Self {
        Self {
            keys: Sharded::new(SHARDS, max_keys),
            lifetime,
            cap: cap.max(1),
            emission_us,
            generations: AtomicU64::new(0),
        }
    }

    /// Units of `key`'s live lease, if it holds `cost` of them now; counts the demand either way.
    pub(crate) fn take(&self, key: &[u8], cost: u32, now: Instant) -> Option<Outcome> {
        let at = self.keys.slot(key);
        let mut shard = self.keys.lock(at);
        let tracked = shard.get_mut(at, key)?;
        tracked.demand += u64::from(cost);
        tracked.saw(now);
        tracked.take(cost, now, self.emission_us)
    }

    /// The next step of a check of `key` that found no units in hand ([`take`](Self::take)).
    /// `waited`: this check already waited for a reservation, and does not start one.
    pub(crate) fn step(&self, key: &[u8], cost: u32, now: Instant, waited: bool) -> Step {
        let at = self.keys.slot(key);
        let mut guard = self.keys.lock(at);
        let shard = &mut *guard;
        if !shard.contains(at, key) {
            let lifetime = self.lifetime;
            if shard.len() >= shard.max() {
                // Room for a new key: a cold one that holds nothing (a few looked at, so a new
                // key never pays for a whole shard); hot keys keep theirs.
                shard.forget_one(EVICTION_SCAN, |s| s.evictable(now, lifetime));
            }
            let due = shard
                .swept_at
                .is_none_or(|at| now.saturating_duration_since(at) >= lifetime);
            if shard.len() >= shard.max() && due {
                shard.retain(|s| !s.idle(now, lifetime) && !s.evictable(now, lifetime));
                shard.swept_at = Some(now);
            }
            if shard.len() >= shard.max() {
                return Step::Untracked;
            }
            // As if the last reservation were a lifetime ago: a first check reads as cold.
            let mut tracked = Tracked {
                lease: Lease {
                    left: 0,
                    until: now,
                    remaining: 0,
                    reset_after_us: 0,
                    placed: None,
                },
                in_flight: None,
                since: now.checked_sub(self.lifetime).unwrap_or(now),
                demand: u64::from(cost),
                per_lifetime: 0,
                generation: 0,
                seen: [None; HOT],
                next_seen: 0,
            };
            tracked.saw(now);
            shard.insert(at, key, tracked);
        }
        let Some(tracked) = shard.get_mut(at, key) else {
            return Step::Untracked;
        };
        if let Some(outcome) = tracked.take(cost, now, self.emission_us) {
            return Step::Taken(outcome);
        }
        if let Some(notify) = &tracked.in_flight {
            return match waited {
                false => Step::Wait(Arc::clone(notify).notified_owned()),
                true => Step::Untracked,
            };
        }
        if waited {
            return Step::Untracked;
        }
        tracked.next_lease(cost, now, self.lifetime, self.cap)
    }

    /// A reservation of `key` sent at `sent` landed with `extra` units beyond the check's
    /// cost: they are handed out until `sent` + the lifetime. The lease's generation, for
    /// [`expire`](Self::expire); waiters are woken.
    pub(crate) fn install(&self, key: &[u8], sent: Instant, extra: u64, outcome: &Outcome) -> u64 {
        let at = self.keys.slot(key);
        let mut shard = self.keys.lock(at);
        let Some(tracked) = shard.get_mut(at, key) else {
            return 0;
        };
        tracked.generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        tracked.lease = Lease {
            left: extra,
            until: sent + self.lifetime,
            remaining: outcome.remaining,
            reset_after_us: outcome.reset_after_us,
            placed: outcome.position.placed().cloned(),
        };
        if let Some(notify) = tracked.in_flight.take() {
            notify.notify_waiters();
        }
        tracked.generation
    }

    /// A reservation of `key` ended without a lease (denied, failed, or dropped): waiters go
    /// to the store. A denied key turns cold, so it is checked exactly until it is hot again.
    pub(crate) fn abandon(&self, key: &[u8], denied: bool) {
        let at = self.keys.slot(key);
        let mut shard = self.keys.lock(at);
        let Some(tracked) = shard.get_mut(at, key) else {
            return;
        };
        if denied {
            tracked.per_lifetime = 0;
        }
        if let Some(notify) = tracked.in_flight.take() {
            notify.notify_waiters();
        }
    }

    /// Ends lease `generation` of `key` (its lifetime is over): the units it still held, to
    /// give back (none when that lease is gone or used up).
    pub(crate) fn expire(&self, key: &[u8], generation: u64) -> Unspent {
        let at = self.keys.slot(key);
        let mut shard = self.keys.lock(at);
        match shard.get_mut(at, key) {
            Some(tracked) if tracked.generation == generation => tracked.lease.take_rest(),
            _ => Unspent {
                units: 0,
                placed: None,
            },
        }
    }

    /// Drops `key`'s lease and its demand (the key was reset or banned): the units it held
    /// are not handed out, nor given back (they may no longer exist in the store).
    pub(crate) fn forget(&self, key: &[u8]) {
        let at = self.keys.slot(key);
        let mut shard = self.keys.lock(at);
        if let Some(tracked) = shard.get_mut(at, key) {
            let _ = tracked.lease.take_rest();
            tracked.per_lifetime = 0;
        }
    }

    /// The key's emission interval.
    pub(crate) fn emission_us(&self) -> u64 {
        self.emission_us
    }

    /// How long a lease's units may be handed out after its reservation was sent.
    pub(crate) fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// Keys tracked.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.keys.each().map(|s| s.len()).sum()
    }
}

impl Tracked {
    /// A check of this key came at `now`.
    fn saw(&mut self, now: Instant) {
        self.seen[self.next_seen] = Some(now);
        self.next_seen = (self.next_seen + 1) % HOT;
    }

    /// Seen at least `HOT` times within the last lifetime.
    fn hot(&self, now: Instant, lifetime: Duration) -> bool {
        // The oldest of the last HOT checks is the one the ring writes next.
        self.seen[self.next_seen].is_some_and(|at| now.saturating_duration_since(at) < lifetime)
    }

    /// `cost` units from the lease, if it is live and holds them: the next units of the
    /// reservation, in order.
    fn take(&mut self, cost: u32, now: Instant, emission_us: u64) -> Option<Outcome> {
        let l = &mut self.lease;
        let cost = u64::from(cost);
        if l.left < cost || now >= l.until {
            return None;
        }
        l.left -= cost;
        let mut outcome = Outcome::single(
            true,
            l.remaining.saturating_add(l.left),
            Some(0),
            l.reset_after_us,
        );
        if let Some(placed) = before_the_last(l.placed.clone(), l.left, emission_us) {
            outcome.position = Position::Placed(placed);
        }
        Some(outcome)
    }

    /// Cold (seen fewer than `HOT` times in the last lifetime), nothing in hand, nothing in
    /// flight: a new key may take its place.
    fn evictable(&self, now: Instant, lifetime: Duration) -> bool {
        self.lease.left == 0 && self.in_flight.is_none() && !self.hot(now, lifetime)
    }

    /// Nothing in hand, nothing in flight, and not asked for in a lifetime: can be forgotten.
    fn idle(&self, now: Instant, lifetime: Duration) -> bool {
        self.lease.left == 0
            && self.in_flight.is_none()
            && now.saturating_duration_since(self.since) > lifetime
    }
}

impl Tracked {
    /// What a check that found no units in hand and no reservation in flight does next: an
    /// exact check for a cold key (seen fewer than `HOT` times in the last `lifetime`), else a
    /// reservation sized on the key's demand (at most `cap`), or an exact check when that is
    /// no more than the cost. Either way, what the old lease held is given back.
    fn next_lease(&mut self, cost: u32, now: Instant, lifetime: Duration, cap: u64) -> Step {
        // Seen fewer than HOT times in the last lifetime (a new key, a key that rested): cold,
        // and what it did before it rested says nothing about its next lifetime.
        if !self.hot(now, lifetime) {
            self.per_lifetime = 0;
            self.since = now;
            self.demand = 0;
            let give_back = self.lease.take_rest();
            return Step::Exact { give_back };
        }
        // The demand since the last reservation, per lifetime, averaged with the past.
        let elapsed = now.saturating_duration_since(self.since).as_micros().max(1);
        let sample = u128::from(self.demand) * lifetime.as_micros() / elapsed;
        let sample = u64::try_from(sample).unwrap_or(u64::MAX).min(cap * 4);
        self.per_lifetime = match self.per_lifetime {
            0 => sample,
            past => past / 2 + sample / 2,
        };
        self.since = now;
        self.demand = 0;
        // A quarter more than the expected use, so a lease usually lasts its lifetime.
        let extra = self.per_lifetime.saturating_add(self.per_lifetime / 4);
        let up_to = u64::from(cost)
            .saturating_add(extra)
            .min(cap.max(u64::from(cost)));
        let give_back = self.lease.take_rest();
        if up_to <= u64::from(cost) {
            return Step::Exact { give_back };
        }
        self.in_flight = Some(Arc::new(Notify::new()));
        Step::Reserve { up_to, give_back }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Duration = Duration::from_millis(50);

    fn reserve(step: Step) -> (u64, u64) {
        match step {
            Step::Reserve { up_to, give_back } => (up_to, give_back.units),
            _ => panic!("expected a reservation"),
        }
    }

    fn exact(step: Step) -> u64 {
        match step {
            Step::Exact { give_back } => give_back.units,
            _ => panic!("expected an exact check"),
        }
    }

    /// `n` checks of `key` at `now` that found no lease: the key is hot.
    fn heat(t: &Table, key: &[u8], now: Instant, n: usize) {
        if !matches!(
            t.step(key, 1, now, false),
            Step::Exact { .. } | Step::Untracked
        ) {
            panic!("a first check is exact");
        }
        for _ in 1..n {
            assert!(t.take(key, 1, now).is_none());
        }
    }

    #[test]
    fn a_cold_key_is_checked_exactly() {
        let t = Table::new(100, L, 1_000, 1_000);
        let mut now = Instant::now();
        for _ in 0..5 {
            t.take(b"k", 1, now);
            exact(t.step(b"k", 1, now, false));
            now += Duration::from_secs(1);
        }
        // Three checks in a row, and one with a cost of 8: still fewer than 4 checks.
        for cost in [1, 1, 8] {
            t.take(b"k", cost, now);
            exact(t.step(b"k", cost, now, false));
        }
    }

    #[test]
    fn a_key_that_rested_is_cold_again() {
        let t = Table::new(100, L, 1_000, 1_000);
        let now = Instant::now();
        heat(&t, b"k", now, 200);
        assert!(reserve(t.step(b"k", 1, now + Duration::from_millis(1), false)).0 > 1);
        t.abandon(b"k", false);
        let later = now + Duration::from_secs(3_600);
        assert!(t.take(b"k", 1, later).is_none());
        exact(t.step(b"k", 1, later, false));
    }

    #[test]
    fn a_hot_key_gets_leases_sized_to_its_rate_and_capped() {
        let t = Table::new(100, L, 1_000, 1_000);
        let now = Instant::now();
        // 200 checks in the next millisecond.
        heat(&t, b"k", now, 201);
        let (up_to, _) = reserve(t.step(b"k", 1, now + Duration::from_millis(1), false));
        assert_eq!(up_to, 1_000, "capped");
        let at = now + Duration::from_millis(1);
        let g = t.install(b"k", at, 999, &Outcome::single(true, 5, Some(0), 10));
        let o = t.take(b"k", 1, at).unwrap();
        assert_eq!((o.allowed, o.remaining), (true, 5 + 998));
        // Nothing handed out once the lifetime is over; the rest goes back once.
        assert!(t.take(b"k", 1, at + L).is_none());
        assert_eq!(t.expire(b"k", g).units, 998);
        assert_eq!(t.expire(b"k", g).units, 0);
    }

    #[test]
    fn a_denied_key_turns_cold() {
        let t = Table::new(100, L, 1_000, 1_000);
        let now = Instant::now();
        heat(&t, b"k", now, 201);
        assert!(reserve(t.step(b"k", 1, now, false)).0 > 1);
        t.abandon(b"k", true);
        t.take(b"k", 1, now + Duration::from_secs(1));
        exact(t.step(b"k", 1, now + Duration::from_secs(1), false));
    }

    #[test]
    fn checks_wait_for_the_reservation_in_flight_once() {
        let t = Table::new(100, L, 1_000, 1_000);
        let now = Instant::now();
        heat(&t, b"k", now, 10);
        reserve(t.step(b"k", 1, now, false));
        assert!(matches!(t.step(b"k", 1, now, false), Step::Wait(_)));
        assert!(matches!(t.step(b"k", 1, now, true), Step::Untracked));
    }

    #[test]
    fn the_table_is_bounded_and_forgets_idle_keys() {
        let t = Table::new(16, L, 1_000, 1_000);
        let now = Instant::now();
        let mut untracked = 0;
        for i in 0..1_000u32 {
            // Each is hot (and left in flight): never evicted, never idle.
            heat(&t, &i.to_le_bytes(), now, 5);
            if let Step::Untracked = t.step(&i.to_le_bytes(), 1, now, false) {
                untracked += 1;
            }
        }
        assert!(t.len() <= 16 && untracked >= 984, "{} {untracked}", t.len());
        // A lifetime later, with nothing in flight, old keys make room.
        for i in 0..1_000u32 {
            t.abandon(&i.to_le_bytes(), false);
        }
        let later = now + 3 * L;
        assert!(matches!(
            t.step(b"new", 1, later, false),
            Step::Exact { .. }
        ));
    }

    #[test]
    fn a_return_pending_for_a_forgotten_key_finds_nothing_of_its_next_lease() {
        let t = Table::new(16, L, 1_000, 1_000);
        let now = Instant::now();
        heat(&t, b"k", now, 5);
        reserve(t.step(b"k", 1, now, false));
        let old = t.install(b"k", now, 10, &Outcome::single(true, 5, Some(0), 10));
        while t.take(b"k", 1, now).is_some() {}
        // The key goes cold and a spray of keys pushes it out; it comes back, hot again.
        let later = now + 2 * L;
        for i in 0..1_000u32 {
            t.step(&i.to_le_bytes(), 1, later, false);
        }
        heat(&t, b"k", later, 5);
        reserve(t.step(b"k", 1, later, false));
        let new = t.install(b"k", later, 10, &Outcome::single(true, 5, Some(0), 10));
        // The old lease's return, late, takes nothing of the new one.
        assert_eq!(t.expire(b"k", old).units, 0);
        assert_eq!(t.expire(b"k", new).units, 10);
    }

    #[test]
    fn cold_keys_make_room_for_new_ones_hot_keys_stay() {
        let t = Table::new(16, L, 1_000, 1_000);
        let now = Instant::now();
        // A spray of keys checked once: cold, each taking the place of another.
        for i in 0..1_000u32 {
            assert!(matches!(
                t.step(&i.to_le_bytes(), 1, now, false),
                Step::Exact { .. }
            ));
        }
        assert!(t.len() <= 16);
        // A hot key gets in, and the spray does not push it out.
        heat(&t, b"hot", now, 5);
        for i in 1_000..2_000u32 {
            t.step(&i.to_le_bytes(), 1, now, false);
        }
        assert!(matches!(
            t.step(b"hot", 1, now, false),
            Step::Reserve { .. }
        ));
    }
}
