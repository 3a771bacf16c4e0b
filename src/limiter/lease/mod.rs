//! Unit leases: hot keys that are allowed, decided in this process from units reserved in
//! the store in advance.
//!
//! A key with a high limit served by many instances (one tenant at 50,000 a second over four
//! gateways) costs a store call per request. With
//! [`RateLimiterBuilder::lease`](crate::RateLimiterBuilder::lease), a limiter reserves a block
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
//! [`Store::reserve`](crate::Store::reserve) checks each request as before.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_redis_ratelimit::{Gcra, Quota, RateLimiter, RedisStore, UnitLease};
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
mod store;
mod table;

pub use self::config::UnitLease;
pub(crate) use self::store::LeasedStore;
