//! Delay instead of refusal: a request over its limit waits for its units, up to a bound
//! ([`RateLimiterBuilder::delay`](super::RateLimiterBuilder::delay)).
//!
//! How a delayed request is decided: one store call keeps the request's place in its key's
//! time (`lua/gcra_schedule.lua`, `lua/token_bucket_schedule.lua`, burst pace): a request
//! within the burst is admitted at once, exactly as a check admits it; one beyond it is
//! admitted at the time its units come, when that is within the bound, and the key's time
//! moves on by its cost in the same atomic step. So every instance sharing the store sees
//! the place taken, the admissions follow the limit exactly, and nothing polls. The request
//! then waits here until its time. If it goes away first (its future dropped: the client
//! hung up), its units are given back, as a refund gives them back.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use crate::{
    core::{
        quiet::{self, Cause},
        report,
    },
    decision::Charge,
    error::ConfigError,
    extract::Key,
};

/// The longest delay: an hour (a delayed request holds its connection that long).
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(3_600);

/// How a policy delays requests over its limit instead of refusing them: each may wait up to
/// [`up_to`](Self::up_to) for its units, then goes on; one whose units come later is refused
/// as without a delay. In the manner of NGINX's `limit_req` with `burst` and `delay`: a short
/// burst above the limit is smoothed instead of answered `429`, which suits clients that do
/// not retry well (browsers, webhooks, batch jobs).
///
/// GCRA and the token bucket delay (the request's place is kept in the store with the check,
/// so the limit holds exactly across instances); a sliding or fixed window cannot (a
/// window's units have no time of their own), nor can a policy that takes units from unit
/// leases. Shadow mode never delays.
///
/// A delayed request holds its connection (and, in a server, a task) while it waits, so
/// waiting requests are bounded on each instance: per key, at most the quota's burst (the
/// units a rested key holds) wait at once, and at most
/// [`waiting_at_most`](Self::waiting_at_most) in all (10,000 unless set). A request that would
/// wait beyond either bound is refused, its units given back. The store bounds the rest: a
/// key's waiting requests, on every instance together, hold at most `up_to` of its time.
///
/// ```
/// # use std::time::Duration;
/// # use tower_redis_ratelimit::{rate_limit::Delay, *};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_second(100).burst(10))?)
///     .delay(Delay::up_to(Duration::from_millis(50)))
///     .build()?;
/// for _ in 0..10 {
///     assert!(limiter.check("job-42", 1).await?.allowed); // within the burst: at once
/// }
/// let late = limiter.check("job-42", 1).await?; // waits about 10 ms for its unit
/// assert!(late.allowed && late.delayed > Duration::ZERO);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delay {
    up_to: Duration,
    waiting: usize,
}

impl Delay {
    /// How many requests may wait at once, on each instance, unless set.
    pub const DEFAULT_WAITING: usize = 10_000;

    /// Requests over the limit wait up to `max` for their units (at most an hour).
    pub fn up_to(max: Duration) -> Self {
        Self {
            up_to: max,
            waiting: Self::DEFAULT_WAITING,
        }
    }

    /// At most `n` requests wait at once on this instance, whatever their keys (at least 1).
    pub fn waiting_at_most(mut self, n: usize) -> Self {
        self.waiting = n;
        self
    }

    /// The longest wait.
    pub fn max(&self) -> Duration {
        self.up_to
    }

    /// The terms, checked: a [`ConfigError`] naming `delay.up_to` or `delay.waiting`.
    pub(crate) fn checked(self) -> Result<Self, ConfigError> {
        check_up_to(self.up_to)?;
        if self.waiting == 0 {
            return Err(ConfigError::new("delay.waiting", "must be at least 1"));
        }
        Ok(self)
    }
}

/// A longest wait that can work: above zero, at most [`MAX_DELAY`].
pub(crate) fn check_up_to(up_to: Duration) -> Result<(), ConfigError> {
    if up_to.is_zero() || up_to > MAX_DELAY {
        return Err(ConfigError::new(
            "delay.up_to",
            format!(
                "must be above 0 and at most {}s (got {up_to:?})",
                MAX_DELAY.as_secs()
            ),
        ));
    }
    Ok(())
}

/// A policy's delay, as its engine runs it: the longest wait (changed by live limits) and the
/// requests waiting now.
pub(crate) struct Delays {
    /// The longest wait in µs; 0: requests over the limit are refused at once.
    max_us: AtomicU64,
    seats: Arc<Seats>,
}

/// The requests waiting now, per key (the deny cache's key: the quota's tag and the store
/// key) and in all.
struct Seats {
    per_key: Mutex<HashMap<Box<[u8]>, u32>>,
    total: AtomicUsize,
    most: usize,
    policy: Arc<str>,
}

impl Delays {
    pub(crate) fn new(delay: Option<Delay>, policy: Arc<str>) -> Self {
        let max_us = delay.map_or(0, |d| micros(d.up_to));
        Self {
            max_us: AtomicU64::new(max_us),
            seats: Arc::new(Seats {
                per_key: Mutex::default(),
                total: AtomicUsize::new(0),
                most: delay.map_or(Delay::DEFAULT_WAITING, |d| d.waiting),
                policy,
            }),
        }
    }

    /// The longest wait now (zero: none).
    pub(crate) fn max(&self) -> Duration {
        Duration::from_micros(self.max_us())
    }

    /// The longest wait now, in µs (0: none).
    pub(crate) fn max_us(&self) -> u64 {
        self.max_us.load(Ordering::Relaxed)
    }

    /// Changes the longest wait (`None` or zero: requests over the limit are refused at
    /// once).
    pub(crate) fn set(&self, up_to: Option<Duration>) {
        self.max_us
            .store(up_to.map_or(0, micros), Ordering::Relaxed);
    }

    /// Whether a request of `key` may still wait on this instance, before its store call
    /// (a request that may not is decided without a delay): fewer than `burst` of its key
    /// and fewer than the total bound wait now.
    pub(crate) fn room(&self, key: &[u8], burst: u64) -> bool {
        let seats = &self.seats;
        let total = seats.total.load(Ordering::Relaxed);
        if total == 0 {
            return true;
        }
        if total >= seats.most {
            return false;
        }
        let per_key = seats.per_key.lock().unwrap_or_else(|e| e.into_inner());
        per_key.get(key).map_or(0, |&n| u64::from(n)) < burst
    }

    /// A seat for a request of `key` admitted to wait, if the bounds still leave one (two
    /// requests may both have found room before either took it): held while it waits.
    pub(crate) fn seat(&self, key: &[u8], burst: u64) -> Option<Seat> {
        let seats = &self.seats;
        let mut per_key = seats.per_key.lock().unwrap_or_else(|e| e.into_inner());
        if seats.total.load(Ordering::Relaxed) >= seats.most {
            drop(per_key);
            full(&seats.policy);
            return None;
        }
        let n = per_key.entry(key.into()).or_insert(0);
        if u64::from(*n) >= burst {
            drop(per_key);
            full(&seats.policy);
            return None;
        }
        *n += 1;
        seats.total.fetch_add(1, Ordering::Relaxed);
        waiting(&seats.policy, 1.0);
        Some(Seat {
            seats: Arc::clone(seats),
            key: key.into(),
        })
    }
}

/// A waiting request's place among the requests waiting on this instance: given up when
/// dropped.
pub(crate) struct Seat {
    seats: Arc<Seats>,
    key: Box<[u8]>,
}

impl Drop for Seat {
    fn drop(&mut self) {
        let seats = &self.seats;
        let mut per_key = seats.per_key.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = per_key.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                per_key.remove(&self.key);
            }
        }
        seats.total.fetch_sub(1, Ordering::Relaxed);
        drop(per_key);
        waiting(&seats.policy, -1.0);
    }
}

/// What gives back the units of a request that went away while it waited: the limit that
/// took them.
pub(crate) trait GiveBack: Send + Sync + 'static {
    /// The limit's policy name.
    fn policy(&self) -> &str;

    /// Gives back `charge` of `key`, without waiting (on a task of its own).
    fn give_back(self: Arc<Self>, key: Option<Key<'static>>, charge: Charge);
}

/// A request waiting for its units: its seat, and what it took, given back if it goes away
/// before its time (see [`Waiter::served`]).
pub(crate) struct Waiter {
    pub(crate) _seat: Seat,
    pub(crate) limit: Arc<dyn GiveBack>,
    pub(crate) key: Option<Key<'static>>,
    pub(crate) charge: Option<Charge>,
}

impl Waiter {
    /// Its time came: the request goes on with what it took.
    pub(crate) fn served(mut self) {
        self.charge = None;
        delayed(self.limit.policy(), "served");
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let Some(charge) = self.charge.take() else {
            return;
        };
        delayed(self.limit.policy(), "abandoned");
        Arc::clone(&self.limit).give_back(self.key.take(), charge);
    }
}

/// Whole microseconds of `d`, at most u64::MAX.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn delayed(policy: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(report::DELAYED, "policy" => policy.to_owned(), "outcome" => outcome)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (policy, outcome);
}

fn waiting(policy: &str, change: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(report::WAITING, "policy" => policy.to_owned()).increment(change);
    #[cfg(not(feature = "metrics"))]
    let _ = (policy, change);
}

/// A request refused because too many wait already: logged at most once a second.
fn full(policy: &str) {
    if let Some(left_out) = quiet::may_log(policy, Cause::WaitingFull) {
        tracing::warn!(
            policy,
            left_out,
            "rate limit: a request over the limit was refused: too many requests wait for their units on this instance"
        );
    }
}
