//! Unit leases: hot keys that are allowed, decided in this process from units reserved in
//! the store in advance.
//!
//! A key with a high limit served by many instances (one tenant at 50,000 a second over four
//! gateways) costs a store call per request. With
//! [`RateLimiterBuilder::lease`](crate::rate_limit::RateLimiterBuilder::lease), a limiter reserves a block
//! of a hot key's units in one call (as many as the key has, up to the block's size, at least
//! the check's cost) and hands them out itself; when the block is used up it reserves the
//! next one, and when the lease's lifetime ends, what it did not hand out goes back to the
//! store (a refund of what those units still hold of the key's time: the reservation's units
//! lie on it in the order they are handed out, so the unused ones are the last; units whose
//! share has drained meanwhile give nothing back).
//!
//! - **Exact in count, shifted in time**: the store counts every unit of a block when it
//!   grants it, so the fleet never admits more than the algorithm grants. A unit is handed
//!   out at most the lifetime after its reservation was *sent*, so in any window of the
//!   quota's period the fleet admits at most what the algorithm admits in period + lifetime
//!   (see [`UnitLease`]'s "The bound").
//! - **Sizes adapt**: a block is the key's demand per lifetime since the last reservation
//!   (averaged with the previous estimate) and a quarter more, capped at an eighth of the
//!   burst (or [`UnitLease::max_units`]) so that one instance does not take what the others
//!   need. A key seen fewer than 4 times within the last lifetime (a new key, a key that
//!   rested, whatever it did before) is cold: each of its checks is an ordinary check of the
//!   store (batched, if the store batches), exactly as without leases, and nothing is given
//!   back; its past demand is forgotten.
//! - **One reservation per key in flight**: concurrent checks of the key wait for it and then
//!   take from the new lease; if it holds nothing for them, they ask the store one by one.
//! - **Denials stay exact**: a denied reservation is the store's denial of the check (the
//!   deny cache and the headers work as without leases), and the key turns cold.
//! - **Failures** are store errors, handled by the limiter's failure policy; a reservation
//!   dropped by the store timeout loses the units it may have taken (fewer admissions, never
//!   more), and so does a return that fails. On a Redis Cluster, a reservation the client
//!   sends again after a cut connection may take its units twice: fewer admissions again.
//! - **Decisions from a lease** are `allowed`, with `remaining` = what Redis had left at the
//!   reservation plus what the lease still holds (an estimate: other instances spend too),
//!   and the reset time of the reservation.
//! - **Bounded**: at most [`UnitLease::max_keys`] keys are tracked; a new key takes the
//!   place of a cold one holding nothing, so keys checked now and then never shut hot ones
//!   out; keys beyond it (every tracked key hot or holding units) are checked one request at
//!   a time until idle keys make room.
//!
//! GCRA and the token bucket can be leased, in a store that reserves
//! ([`RedisStore`](crate::RedisStore)); another algorithm is a
//! [`ConfigError`](crate::ConfigError) naming `lease`. In a store that decides at once (a
//! [`MemoryStore`](crate::MemoryStore)) a lease changes nothing, and a store without
//! [`Store::reserve`](crate::store::Store::reserve) checks each request as before.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_redis_ratelimit::{Gcra, Quota, RateLimiter, RedisStore, rate_limit::UnitLease};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let limiter = RateLimiter::builder(store, Gcra::new(Quota::per_second(50_000))?)
//!     .lease(UnitLease::up_to(Duration::from_millis(50)))
//!     .build()?;
//! let decision = limiter.check("tenant-1", 1).await?;
//! # let _ = decision;
//! # Ok(()) }
//! ```

mod config;
mod table;

pub use self::config::UnitLease;

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Instant,
};

use self::table::{before_the_last, Step, Table, Unspent};
use super::Core;
use crate::{
    algorithm::{Algorithm, Outcome, Position},
    decision::{Charge, Source},
    error::{Error, ErrorChain},
    extract::Key,
    store::{KeyBuf, Reserved, StoreKey},
};

/// The time leases run on: tokio's clock, on which their returns sleep (the monotonic clock
/// in production; a test's paused clock under `start_paused` or `time::pause`).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// A limiter's unit leases: the table of the keys it tracks, and whether its store reserves.
pub(crate) struct Leasing {
    table: Arc<Table>,
    /// The store cannot reserve: every check goes to it.
    unsupported: AtomicBool,
}

/// Units of a lease going back to the store: the rest of a lease, now or when its lifetime
/// ends. The limiter sends it in a task of its own (see [`Leasing::check`]).
pub(crate) struct PendingReturn {
    key: Option<Key<'static>>,
    /// When to take the rest out of the lease (its end), with the lease's number; `None`:
    /// the rest is taken already.
    at: Option<(Instant, Box<[u8]>, u64)>,
    rest: Unspent,
    table: Arc<Table>,
}

impl PendingReturn {
    /// Waits for the lease's end if there is one to wait for, then gives what is left back
    /// through `core` (through the circuit breaker, within the store timeout):
    /// what the units still hold of the key's time; units whose share of the time has
    /// drained give nothing back. A failed return leaves the units spent: fewer admitted,
    /// never more.
    pub(crate) async fn send(self, core: &Core, algorithm: &dyn Algorithm) {
        let rest = match self.at {
            Some((until, id, generation)) => {
                tokio::time::sleep_until(until.into()).await;
                self.table.expire(&id, generation)
            }
            None => self.rest,
        };
        if rest.units == 0 {
            return;
        }
        let charge = Charge {
            cost: u32::try_from(rest.units).unwrap_or(u32::MAX),
            quota: None,
            local: false,
            position: rest.placed.map_or(Position::Unknown, Position::Placed),
        };
        let key = core.store_key(self.key.as_ref());
        let call = || core.store.refund(algorithm, key, &charge, None);
        if let Err(e) = core.call(call).await {
            tracing::debug!(error = %ErrorChain(&e), units = rest.units, policy = %core.policy, "rate limit: lease not returned");
        }
    }
}

impl Leasing {
    /// Leases of at most `cap` units, each handed out within `lease`'s lifetime, for keys
    /// of an algorithm whose emission interval is `emission_us`.
    pub(crate) fn new(lease: &UnitLease, cap: u32, emission_us: u64) -> Self {
        Self {
            table: Arc::new(Table::new(
                lease.tracked_keys(),
                lease.lifetime(),
                u64::from(cap),
                emission_us,
            )),
            unsupported: AtomicBool::new(false),
        }
    }

    /// Whether checks may be answered from leases (the store reserves).
    pub(crate) fn active(&self) -> bool {
        !self.unsupported.load(Ordering::Relaxed)
    }

    /// Drops `key`'s lease in this process (the key was reset or banned in the store).
    pub(crate) fn forget(&self, key: StoreKey<'_>) {
        let mut compact = KeyBuf::new();
        key.write_key_compact(&mut compact);
        self.table.forget(compact.as_bytes());
    }

    /// A check of `cost` answered from `key`'s live lease, if it holds that many units now.
    pub(crate) fn take(&self, key: StoreKey<'_>, cost: u32) -> Option<Outcome> {
        let mut compact = KeyBuf::new();
        key.write_key_compact(&mut compact);
        self.table.take(compact.as_bytes(), cost, now())
    }

    /// Decides a check that no lease answered at once: waits for the reservation of `key`
    /// in flight, sends one sized to the key's demand, or checks the key exactly (a cold
    /// key), each store call through `core`. Units to give back are handed to `returns`,
    /// to be sent without the check waiting. The answer comes with what gave it: a lease
    /// (one that landed meanwhile, or the reservation sent) or the store (an exact check).
    pub(crate) async fn check(
        &self,
        core: &Core,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        cost: u32,
        returns: impl Fn(PendingReturn),
    ) -> Result<(Outcome, Source), Error> {
        let mut compact = KeyBuf::new();
        key.write_key_compact(&mut compact);
        let id = compact.as_bytes();
        let mut waited = false;
        let give_back = |rest: Unspent| {
            if rest.units > 0 {
                returns(self.returned(key, None, rest));
            }
        };
        let up_to = loop {
            match self.table.step(id, cost, now(), waited) {
                Step::Taken(outcome) => return Ok((outcome, Source::UnitLease)),
                Step::Wait(landed) => {
                    landed.await;
                    waited = true;
                }
                Step::Untracked => {
                    let call = core.call(|| core.store.check(algorithm, key, cost, None));
                    return Ok((call.await?, Source::Store));
                }
                Step::Exact { give_back: rest } => {
                    give_back(rest);
                    let call = core.call(|| core.store.check(algorithm, key, cost, None));
                    return Ok((call.await?, Source::Store));
                }
                Step::Reserve {
                    up_to,
                    give_back: rest,
                } => {
                    give_back(rest);
                    break up_to;
                }
            }
        };
        let reserved = self.reserve(core, algorithm, key, id, cost, up_to, returns);
        Ok((reserved.await?, Source::UnitLease))
    }

    /// Sends a reservation of up to `up_to` units (at least `cost`) and installs the lease
    /// it brings; the lease's rest goes back when its lifetime is over.
    #[allow(clippy::too_many_arguments)]
    async fn reserve(
        &self,
        core: &Core,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        id: &[u8],
        cost: u32,
        up_to: u64,
        returns: impl Fn(PendingReturn),
    ) -> Result<Outcome, Error> {
        // Dropped before the reply (the store timeout): waiters go to the store, and the
        // units the reservation may have taken are lost (fewer admitted, never more).
        let mut pending = InFlight {
            table: &self.table,
            id,
            denied: false,
            armed: true,
        };
        let up_to = u32::try_from(up_to).unwrap_or(u32::MAX);
        // The lifetime runs from here, so it bounds hand-outs however slow the reply.
        let sent = now();
        let reserved = core
            .call(|| core.store.reserve(algorithm, key, cost, up_to, None))
            .await;
        let reserved = match reserved {
            Ok(reserved) => reserved,
            Err(Error::Unsupported(_)) => {
                self.unsupported.store(true, Ordering::Relaxed);
                drop(pending);
                return core
                    .call(|| core.store.check(algorithm, key, cost, None))
                    .await;
            }
            Err(e) => return Err(e),
        };
        let Reserved {
            mut outcome,
            granted,
            ..
        } = reserved;
        if !outcome.allowed {
            pending.denied = true;
            return Ok(outcome);
        }
        pending.armed = false;
        let extra = u64::from(granted - cost.min(granted));
        let generation = self.table.install(id, sent, extra, &outcome);
        // As a check answered from the lease would say: what Redis has left and what the
        // lease holds; its charge is the reservation's first units.
        outcome.remaining = outcome.remaining.saturating_add(extra);
        let placed = outcome.position.placed().cloned();
        if let Some(placed) = before_the_last(placed, extra, self.table.emission_us()) {
            outcome.position = Position::Placed(placed);
        }
        if extra > 0 {
            let until = sent + self.table.lifetime();
            let rest = Unspent {
                units: 0,
                placed: None,
            };
            returns(self.returned(key, Some((until, id.into(), generation)), rest));
        }
        Ok(outcome)
    }

    fn returned(
        &self,
        key: StoreKey<'_>,
        at: Option<(Instant, Box<[u8]>, u64)>,
        rest: Unspent,
    ) -> PendingReturn {
        PendingReturn {
            key: key.key().cloned().map(Key::into_owned),
            at,
            rest,
            table: Arc::clone(&self.table),
        }
    }
}

/// A reservation in flight; when it ends without a lease, the key's waiters are woken.
struct InFlight<'a> {
    table: &'a Table,
    id: &'a [u8],
    denied: bool,
    armed: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.table.abandon(self.id, self.denied);
        }
    }
}
