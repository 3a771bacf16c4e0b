//! A circuit breaker in front of the store: after repeated failures, stop calling it for a
//! while, so a dead Redis costs no timeout per request.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use tokio::time::Instant;

use crate::store::CircuitBreaker;

/// The breaker's live state.
///
/// Its clock is tokio's (the system's monotonic clock, or a test's paused clock), the one the
/// store timeout runs on.
#[derive(Debug)]
pub(crate) struct BreakerState {
    config: CircuitBreaker,
    /// Times are microseconds since then, plus one (so that 0 can mean "closed").
    epoch: Instant,
    consecutive: AtomicU32,
    /// 0 when closed; otherwise the monotonic time (µs) until which checks are refused.
    open_until: AtomicU64,
    probing: AtomicBool,
    opened: AtomicU64,
    /// The policy whose gauge `ratelimit_breaker_open` shows this breaker's state (`None`:
    /// a limit that does not report).
    policy: Option<std::sync::Arc<str>>,
}

/// Permission to call the store; a probe resets the half-open state if it is dropped
/// unfinished (e.g. the caller went away).
#[derive(Debug)]
pub(crate) struct Attempt<'a> {
    state: &'a BreakerState,
    probe: bool,
    done: bool,
}

impl BreakerState {
    /// A closed breaker; with a `policy`, its gauge is registered at 0.
    pub(crate) fn new(config: CircuitBreaker, policy: Option<std::sync::Arc<str>>) -> Self {
        let state = Self {
            config,
            epoch: Instant::now(),
            consecutive: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            opened: AtomicU64::new(0),
            policy: policy.filter(|_| config.failures > 0),
        };
        state.show(false);
        state
    }

    /// Sets the policy's `ratelimit_breaker_open` gauge.
    fn show(&self, open: bool) {
        #[cfg(feature = "metrics")]
        if let Some(policy) = &self.policy {
            metrics::gauge!(super::report::BREAKER_OPEN, "policy" => policy.to_string())
                .set(if open { 1.0 } else { 0.0 });
        }
        #[cfg(not(feature = "metrics"))]
        let _ = open;
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64 + 1
    }

    /// How often the breaker opened.
    pub(crate) fn times_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// `None` when the breaker is open and this check must not call the store.
    pub(crate) fn attempt(&self) -> Option<Attempt<'_>> {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Some(Attempt {
                state: self,
                probe: false,
                done: false,
            });
        }
        if self.now_us() < until || self.probing.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(Attempt {
            state: self,
            probe: true,
            done: false,
        })
    }

    /// Opens the breaker for a cool-down: logged at `warn` when it was closed; a failed
    /// probe keeps it open, which is no change of state (`debug`).
    fn open(&self, why: &str, was_open: bool) {
        let until = self.now_us() + self.config.cool_down.as_micros() as u64;
        self.open_until.store(until, Ordering::Release);
        self.opened.fetch_add(1, Ordering::Relaxed);
        if was_open {
            tracing::debug!(
                cool_down = ?self.config.cool_down,
                "rate limit: circuit breaker stays open ({why})"
            );
            return;
        }
        self.show(true);
        tracing::warn!(
            cool_down = ?self.config.cool_down,
            "rate limit: circuit breaker open ({why}); not calling the store until the cool-down ends"
        );
    }
}

impl Attempt<'_> {
    /// Records the store's answer: `true` if it was reachable.
    pub(crate) fn finish(mut self, reachable: bool) {
        self.done = true;
        let s = self.state;
        if s.config.failures == 0 {
            return;
        }
        if reachable {
            s.consecutive.store(0, Ordering::Relaxed);
            if self.probe {
                s.open_until.store(0, Ordering::Release);
                s.probing.store(false, Ordering::Release);
                s.show(false);
                tracing::info!("rate limit: circuit breaker closed; the store answers again");
            }
            return;
        }
        let n = s
            .consecutive
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if self.probe {
            s.open("probe failed", true);
            s.probing.store(false, Ordering::Release);
        } else if n >= s.config.failures && s.open_until.load(Ordering::Acquire) == 0 {
            s.open(&format!("{n} store failures in a row"), false);
        }
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if self.probe && !self.done {
            // The probe never finished: let the next check probe.
            self.state.probing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::advance;

    #[tokio::test(start_paused = true)]
    async fn opens_after_failures_then_probes_once_and_closes() {
        let s = BreakerState::new(CircuitBreaker::new(3, Duration::from_millis(30)), None);
        for _ in 0..2 {
            s.attempt().unwrap().finish(false);
        }
        assert!(s.attempt().is_some(), "opened too early");
        s.attempt().unwrap().finish(false);
        assert!(s.attempt().is_none(), "did not open after 3 failures");
        assert_eq!(s.times_opened(), 1);
        advance(Duration::from_millis(29)).await;
        assert!(s.attempt().is_none(), "a probe before the cool-down ended");
        advance(Duration::from_millis(1)).await;
        let probe = s.attempt().expect("no probe after the cool-down");
        assert!(s.attempt().is_none(), "a second probe at the same time");
        probe.finish(false);
        assert!(s.attempt().is_none(), "a failed probe must re-open");
        assert_eq!(s.times_opened(), 2);
        advance(Duration::from_millis(30)).await;
        s.attempt().unwrap().finish(true);
        assert!(
            s.attempt().is_some() && s.attempt().is_some(),
            "did not close"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_probe_does_not_wedge_the_breaker() {
        let s = BreakerState::new(CircuitBreaker::new(1, Duration::from_millis(10)), None);
        s.attempt().unwrap().finish(false);
        advance(Duration::from_millis(10)).await;
        drop(s.attempt().unwrap());
        assert!(s.attempt().is_some());
    }

    #[test]
    fn success_resets_the_count_and_disabled_never_opens() {
        let s = BreakerState::new(CircuitBreaker::new(2, Duration::from_secs(60)), None);
        s.attempt().unwrap().finish(false);
        s.attempt().unwrap().finish(true);
        s.attempt().unwrap().finish(false);
        assert!(s.attempt().is_some());
        let off = BreakerState::new(CircuitBreaker::disabled(), None);
        for _ in 0..100 {
            off.attempt().unwrap().finish(false);
        }
        assert!(off.attempt().is_some());
        assert_eq!(
            CircuitBreaker::new(1, Duration::ZERO)
                .validate()
                .unwrap_err()
                .field(),
            "circuit_breaker.cool_down"
        );
    }
}
