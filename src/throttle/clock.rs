//! The throttle's time: the wall clock, or the [`ManualClock`] of the store it runs on, so
//! that a test of an outbound client waits on the test's clock instead of in real time.

use std::{
    sync::OnceLock,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::store::{memory::ManualClock, micros};

/// Where the throttle reads the time and waits.
#[derive(Debug, Clone, Default)]
pub(crate) enum Clock {
    /// Real time: `Instant`s and `tokio::time::sleep`.
    #[default]
    Wall,
    /// A test's clock: waits end when the test advances it.
    Manual(ManualClock),
}

/// The process's first reading of the wall clock, so that wall-clock moments are durations
/// like manual ones.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl Clock {
    /// The time on this clock (from an origin of its own: compare only with itself).
    pub(crate) fn now(&self) -> Duration {
        match self {
            Clock::Wall => origin().elapsed(),
            Clock::Manual(c) => c.now(),
        }
    }

    /// The time of day, for the absolute times in an upstream's headers.
    pub(crate) fn system_now(&self) -> SystemTime {
        match self {
            Clock::Wall => SystemTime::now(),
            Clock::Manual(c) => UNIX_EPOCH + c.now(),
        }
    }

    /// Waits `d` on this clock.
    pub(crate) async fn sleep(&self, d: Duration) {
        match self {
            Clock::Wall => tokio::time::sleep(d).await,
            Clock::Manual(c) => {
                let until = c.now_us().saturating_add(micros(d));
                c.sleep_until_us(until).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_wait_ends_when_it_is_advanced() {
        let manual = ManualClock::starting_at(Duration::from_secs(100));
        let clock = Clock::Manual(manual.clone());
        assert_eq!(clock.now(), Duration::from_secs(100));
        assert_eq!(clock.system_now(), UNIX_EPOCH + Duration::from_secs(100));
        let c = clock.clone();
        let wait = tokio::spawn(async move { c.sleep(Duration::from_millis(500)).await });
        while manual.sleepers() == 0 {
            tokio::task::yield_now().await;
        }
        manual.advance(Duration::from_millis(499));
        tokio::task::yield_now().await;
        assert!(!wait.is_finished());
        manual.advance(Duration::from_millis(1));
        wait.await.unwrap();
    }
}
