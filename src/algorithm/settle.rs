//! What the built-in algorithms share when a charge is settled after the fact to the units
//! really used: which way it goes, and how far a bucket's debt may run.
//!
//! Settling down gives the difference back as a refund of part of the charge would: at most
//! what the charge still holds (`held.rs`). Settling up charges the difference at the time of
//! the settlement, whatever the limit: a debt that the key's next admissions wait out. A
//! bucket's debt (GCRA's TAT, the token bucket's full-again time) is capped at
//! [`DEBT_QUOTAS`] full quotas; a window's debt ends with its window.

use super::rate::BucketRate;
use crate::quota::MAX_EXACT;

/// How many full quotas a GCRA or token-bucket key may owe after a settlement: its time runs
/// at most that many bursts' worth past a key with nothing left (a hostile or broken figure
/// holds the key for at most about a hundred of its windows, never for years).
pub(crate) const DEBT_QUOTAS: u64 = 100;

/// Which way a charge of `cost` settled to `actual` goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// The figure is the charge: nothing to do.
    None,
    /// Below the charge: this many units are due back.
    Down(u64),
    /// Above the charge: this many more units are charged, past the limit if need be.
    Up(u64),
}

impl Change {
    pub(crate) fn of(cost: u32, actual: u32) -> Self {
        Self::of_units(u64::from(cost), u64::from(actual))
    }

    /// [`of`](Self::of) on any units (a limit's own cost, for budgets).
    pub(crate) fn of_units(cost: u64, actual: u64) -> Self {
        match actual.cmp(&cost) {
            std::cmp::Ordering::Equal => Self::None,
            std::cmp::Ordering::Less => Self::Down(cost - actual),
            std::cmp::Ordering::Greater => Self::Up(actual - cost),
        }
    }
}

/// A bucket's time `base` (never before `now`) moved on by `excess` units at `now`, but never
/// past [`DEBT_QUOTAS`] bursts beyond a key with nothing left, nor past 2^52 µs (the twin of
/// `bucket_charged` in `lua/settle.lua`).
pub(crate) fn bucket_charged(rate: BucketRate, base: u64, now: u64, excess: u64) -> u64 {
    let cap = now
        .saturating_add(rate.tolerance_us().saturating_mul(DEBT_QUOTAS + 1))
        .min(MAX_EXACT);
    base.saturating_add(excess.saturating_mul(rate.emission_us))
        .min(cap)
        .max(base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    #[test]
    fn a_debt_is_capped_and_never_overflows() {
        // 10 a second, burst 5: emission 100 ms, tolerance 500 ms.
        let rate = BucketRate::from_quota(&Quota::per_second(10).burst(5)).unwrap();
        let now = 1_700_000_000_000_000;
        assert_eq!(bucket_charged(rate, now, now, 3), now + 300_000);
        let cap = now + 101 * 500_000;
        assert_eq!(bucket_charged(rate, now, now, u64::MAX), cap);
        assert_eq!(bucket_charged(rate, cap, now, 1), cap);
        assert_eq!(bucket_charged(rate, MAX_EXACT, MAX_EXACT, 1), MAX_EXACT);
        assert_eq!(Change::of(5, 5), Change::None);
        assert_eq!(Change::of(5, 0), Change::Down(5));
        assert_eq!(Change::of(5, u32::MAX), Change::Up(u64::from(u32::MAX) - 5));
    }
}
