//! A clock that stands still until a test moves it.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::quota::MAX_EXACT;

/// Time for a [`MemoryStore`](crate::MemoryStore) that moves only when you say: test your own
/// limits without sleeping ([`MemoryStoreBuilder::clock`](crate::store::memory::MemoryStoreBuilder::clock)).
///
/// It starts at the wall-clock time it was made (so reset times in headers look like real
/// ones) and then stands still; [`advance`](Self::advance) moves it forward. Clones share one
/// time. A store on a manual clock decides everything on it (the limiters built on such a
/// store keep no deny cache, whose deadlines would be in real time). A
/// [`ThrottleLayer`](crate::throttle::ThrottleLayer) sleeps in real time for its quota, so it does not
/// belong on a manual clock: it would wait for time that never comes, then fail.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter, store::memory::ManualClock};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = ManualClock::new();
/// let store = MemoryStore::builder().clock(clock.clone()).build()?;
/// let limiter = RateLimiter::new(store, Gcra::new(Quota::per_minute(2))?)?;
/// assert!(limiter.check("k", 1).await?.allowed);
/// assert!(limiter.check("k", 1).await?.allowed);
/// assert!(!limiter.check("k", 1).await?.allowed);
/// clock.advance(Duration::from_secs(30)); // one unit comes back every 30 s
/// assert!(limiter.check("k", 1).await?.allowed);
/// assert!(!limiter.check("k", 1).await?.allowed);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    now_us: Arc<AtomicU64>,
    wake: Arc<Wake>,
}

/// Who waits on a manual clock.
#[derive(Debug, Default)]
struct Wake {
    notify: tokio::sync::Notify,
    /// The sleepers' wake-up times (µs), with how many wait for each.
    sleepers: Mutex<BTreeMap<u64, usize>>,
}

/// Counts a sleeper until its future ends or is dropped.
struct Sleeper<'a> {
    wake: &'a Wake,
    until_us: u64,
}

impl<'a> Sleeper<'a> {
    fn new(wake: &'a Wake, until_us: u64) -> Self {
        *wake.sleepers().entry(until_us).or_default() += 1;
        Self { wake, until_us }
    }
}

impl Drop for Sleeper<'_> {
    fn drop(&mut self) {
        let mut sleepers = self.wake.sleepers();
        if let Some(n) = sleepers.get_mut(&self.until_us) {
            *n -= 1;
            if *n == 0 {
                sleepers.remove(&self.until_us);
            }
        }
    }
}

impl Wake {
    fn sleepers(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, usize>> {
        self.sleepers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    /// A clock at the current wall-clock time, standing still.
    pub fn new() -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Self::starting_at(now)
    }

    /// A clock at `since_epoch` after the Unix epoch (at most 2^52 microseconds), standing
    /// still.
    pub fn starting_at(since_epoch: Duration) -> Self {
        Self {
            now_us: Arc::new(AtomicU64::new(micros(since_epoch).min(MAX_EXACT))),
            wake: Arc::default(),
        }
    }

    /// Moves the clock forward by `by` (to the microsecond). A clock never goes back, and
    /// stops at 2^52 microseconds after the epoch (in the year 2112), the limit of the
    /// algorithms' exact arithmetic.
    pub fn advance(&self, by: Duration) {
        let by = micros(by);
        let _ = self
            .now_us
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(by).min(MAX_EXACT))
            });
        self.wake.notify.notify_waiters();
    }

    /// How many tasks are waiting for this clock to move (throttled calls waiting for their
    /// quota, or for what an upstream said): a test can wait until the calls it started all
    /// wait, then [`advance`](Self::advance) the clock. A task whose time has come is not
    /// counted, even before it has run again: a test does not move the clock past it.
    pub fn sleepers(&self) -> usize {
        let now = self.now_us();
        self.wake.sleepers().range(now + 1..).map(|(_, n)| n).sum()
    }

    /// Waits until the clock reads `until_us` microseconds after the epoch or later.
    pub(crate) async fn sleep_until_us(&self, until_us: u64) {
        let until_us = until_us.min(MAX_EXACT);
        if self.now_us() >= until_us {
            return;
        }
        let _sleeper = Sleeper::new(&self.wake, until_us);
        loop {
            let mut notified = std::pin::pin!(self.wake.notify.notified());
            // Registered before the clock is read again, so no advance is missed.
            notified.as_mut().enable();
            if self.now_us() >= until_us {
                return;
            }
            notified.await;
        }
    }

    /// The time since the Unix epoch.
    pub fn now(&self) -> Duration {
        Duration::from_micros(self.now_us())
    }

    pub(crate) fn now_us(&self) -> u64 {
        self.now_us.load(Ordering::Acquire)
    }
}

/// `d` in whole microseconds, `u64::MAX` beyond.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stands_still_until_advanced_and_clones_share_it() {
        let clock = ManualClock::starting_at(Duration::from_secs(1_000));
        let other = clock.clone();
        assert_eq!(clock.now(), Duration::from_secs(1_000));
        other.advance(Duration::from_millis(1_500));
        assert_eq!(clock.now(), Duration::from_micros(1_001_500_000));
        clock.advance(Duration::MAX);
        assert_eq!(clock.now_us(), MAX_EXACT);
    }

    #[tokio::test]
    async fn a_sleeper_wakes_when_the_clock_reaches_its_time() {
        let clock = ManualClock::starting_at(Duration::from_secs(1_000));
        let until = clock.now_us() + 2_000_000;
        let c = clock.clone();
        let sleeper = tokio::spawn(async move { c.sleep_until_us(until).await });
        while clock.sleepers() == 0 {
            tokio::task::yield_now().await;
        }
        clock.advance(Duration::from_secs(1));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        assert_eq!(clock.sleepers(), 1);
        clock.advance(Duration::from_secs(1));
        sleeper.await.unwrap();
        assert_eq!(clock.sleepers(), 0);
    }
}
