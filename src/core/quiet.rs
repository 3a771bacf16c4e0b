//! Logs that stay quiet in an incident: at most one line per policy and cause in a period,
//! saying how many were left out since the last. A store that fails fails every request; a
//! shadow policy would deny every request of a flooded key: one line a second (or ten) says
//! as much as thousands.

use std::{
    collections::HashMap,
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

/// A cause of log lines, with the least time between two of its lines for one policy.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Cause {
    /// The store failed a check (a line a second).
    StoreFailed,
    /// A shadow policy would have denied (a line every ten seconds, with the count).
    WouldDeny,
}

impl Cause {
    const fn every(self) -> Duration {
        match self {
            Cause::StoreFailed => Duration::from_secs(1),
            Cause::WouldDeny => Duration::from_secs(10),
        }
    }
}

/// Policies × causes remembered at most; past it, the table starts afresh (policies are
/// configured, so a real one never gets there).
const MAX_ENTRIES: usize = 4_096;

/// When each (policy, cause) last wrote, and how many it left out since.
type Table = HashMap<(Box<str>, Cause), (Instant, u64)>;

/// Whether a line of `cause` for `policy` may be written now: `Some(left_out)`, the lines left
/// out since the last one written (0 for the first), or `None` to stay quiet (counted). Only
/// called on the paths that log (failures, would-be denials), never on a decided request.
pub(crate) fn may_log(policy: &str, cause: Cause) -> Option<u64> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    let mut table = TABLE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    if let Some((last, left_out)) = table.get_mut(&(policy.into(), cause)) {
        if now.duration_since(*last) < cause.every() {
            *left_out += 1;
            return None;
        }
        let said = *left_out;
        *last = now;
        *left_out = 0;
        return Some(said);
    }
    if table.len() >= MAX_ENTRIES {
        table.clear();
    }
    table.insert((policy.into(), cause), (now, 0));
    Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_policy_and_cause_then_quiet_with_a_count() {
        assert_eq!(may_log("quiet-a", Cause::StoreFailed), Some(0));
        for _ in 0..5 {
            assert_eq!(may_log("quiet-a", Cause::StoreFailed), None);
        }
        // Another cause or another policy has a line of its own.
        assert_eq!(may_log("quiet-a", Cause::WouldDeny), Some(0));
        assert_eq!(may_log("quiet-b", Cause::StoreFailed), Some(0));
        assert_eq!(may_log("quiet-a", Cause::WouldDeny), None);
    }
}
