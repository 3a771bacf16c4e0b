//! Logs that stay quiet in an incident: at most one line per policy and cause in a period,
//! saying how many were left out since the last. A store that fails fails every request; a
//! shadow policy would deny every request of a flooded key: one line a second (or ten) says
//! as much as thousands.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, OnceLock,
    },
    time::{Duration, Instant},
};

/// A cause of log lines, with the least time between two of its lines for one policy.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Cause {
    /// The store failed a check (a line a second).
    StoreFailed,
    /// A shadow policy would have denied (a line every ten seconds, with the count).
    WouldDeny,
    /// A usage figure a response carried does not read as a whole number (a line a second).
    UnreadableFigure,
    /// The store failed a settlement (a line a second).
    SettleFailed,
    /// A refusal could not be counted toward an automatic ban: its queue was full, or the
    /// store failed (a line a second).
    RefusalNotCounted,
    /// A request over the limit could not wait: too many wait already (a line a second).
    WaitingFull,
}

impl Cause {
    const ALL: [Cause; 6] = [
        Cause::StoreFailed,
        Cause::WouldDeny,
        Cause::UnreadableFigure,
        Cause::SettleFailed,
        Cause::RefusalNotCounted,
        Cause::WaitingFull,
    ];

    const fn every(self) -> Duration {
        match self {
            Cause::StoreFailed
            | Cause::UnreadableFigure
            | Cause::SettleFailed
            | Cause::RefusalNotCounted
            | Cause::WaitingFull => Duration::from_secs(1),
            Cause::WouldDeny => Duration::from_secs(10),
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// One policy's log gates, one per cause, without a lock: a would-be denial of a flooded key
/// asks on every request.
#[derive(Debug)]
pub(crate) struct Quiet {
    start: Instant,
    /// When each cause may write next, in ms since `start` (0: at once).
    next_ms: [AtomicU64; Cause::ALL.len()],
    /// The lines each cause left out since it last wrote.
    left_out: [AtomicU64; Cause::ALL.len()],
}

impl Default for Quiet {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            next_ms: Default::default(),
            left_out: Default::default(),
        }
    }
}

impl Quiet {
    /// Whether a line of `cause` may be written now: `Some(left_out)`, the lines left out since
    /// the last one written (0 for the first), or `None` to stay quiet (counted).
    pub(crate) fn may_log(&self, cause: Cause) -> Option<u64> {
        let i = cause.index();
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms[i].load(Ordering::Relaxed);
        let every = cause.every().as_millis() as u64;
        if now < next
            || self.next_ms[i]
                .compare_exchange(
                    next,
                    now.saturating_add(every),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            self.left_out[i].fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.left_out[i].swap(0, Ordering::Relaxed))
    }
}

/// Policies remembered at most by [`may_log`]; past it, the table starts afresh (policies are
/// configured, so a real one never gets there).
const MAX_POLICIES: usize = 1_024;

/// [`Quiet::may_log`] for a place that knows only the policy's name (an error on its way to
/// the response): one gate per policy, kept for the process. Called on failures only.
pub(crate) fn may_log(policy: &str, cause: Cause) -> Option<u64> {
    static TABLE: OnceLock<Mutex<HashMap<Box<str>, Quiet>>> = OnceLock::new();
    let mut table = TABLE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(quiet) = table.get(policy) {
        return quiet.may_log(cause);
    }
    if table.len() >= MAX_POLICIES {
        table.clear();
    }
    table.entry(policy.into()).or_default().may_log(cause)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_cause_then_quiet_with_a_count() {
        let quiet = Quiet::default();
        assert_eq!(quiet.may_log(Cause::StoreFailed), Some(0));
        for _ in 0..5 {
            assert_eq!(quiet.may_log(Cause::StoreFailed), None);
        }
        // Another cause has a line of its own.
        assert_eq!(quiet.may_log(Cause::WouldDeny), Some(0));
        assert_eq!(quiet.may_log(Cause::WouldDeny), None);
        // Once the period has passed, the next line says how many it left out.
        let earlier = Quiet {
            start: Instant::now() - Duration::from_secs(5),
            ..Quiet::default()
        };
        earlier.next_ms[0].store(1, Ordering::Relaxed);
        earlier.left_out[0].store(7, Ordering::Relaxed);
        assert_eq!(earlier.may_log(Cause::StoreFailed), Some(7));
        assert_eq!(earlier.may_log(Cause::StoreFailed), None);
    }

    #[test]
    fn policies_known_by_name_have_gates_of_their_own() {
        assert_eq!(may_log("quiet-a", Cause::StoreFailed), Some(0));
        assert_eq!(may_log("quiet-a", Cause::StoreFailed), None);
        assert_eq!(may_log("quiet-b", Cause::StoreFailed), Some(0));
    }
}
