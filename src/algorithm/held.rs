//! What a GCRA or token-bucket refund may give back: the part of a charge still held.
//!
//! A key's stored time (GCRA's theoretical arrival time, the token bucket's equivalent: when
//! the bucket would be full again) is a queue of charges, each taking `cost × emission` of
//! it, draining one after the other as time passes. A check admitted at `at` that moved the
//! time to `end` placed its charge at `[end − span, end]`; at a refund at `now`, what it still
//! holds is the part of that interval after `now`, and only that may be given back: a refund
//! of more would hand out units that counted requests admitted since were charged.
//!
//! The check's `end` is exact until another refund moves the time back: charges admitted
//! after the refunded one then move back with it, and their `end` runs late. So each key
//! keeps a [`Ledger`] of the refunds that moved charges (at most [`RECORDS`] of them, older
//! ones merged into one that bounds them all), and a refund takes the moves of the refunds of
//! earlier charges made while its own was in flight off its `end`. Whatever the ledger cannot
//! tell apart counts as moved, so the estimate is never late: a refund gives back what its
//! charge provably still holds, never more (a charge never starts draining before it was
//! admitted, so `at + span` is a floor of its end as well).
//!
//! The same arithmetic runs in `lua/refund_ledger.lua`; the ledger is stored there as a
//! string of integers: `until floor` then `at moved_at back until` per record.

use std::sync::Arc;

use crate::error::Error;

/// Records a key's ledger keeps; beyond them the two oldest are merged.
pub(crate) const RECORDS: usize = 16;

/// Where an admitted check's charge lies on its key's time: when it was admitted, and for
/// each limit (one, or each limit of a [`MultiLimit`](crate::algorithm::MultiLimit)) the stored time it
/// left, when the charge would have drained had nothing been given back since. One or two
/// limits' ends are held in place (every outcome carries a position, so it stays small);
/// more are shared on the heap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) at_us: u64,
    ends: Ends,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ends {
    One([u64; 1]),
    Two([u64; 2]),
    /// Three to eight; none when there were more (such a charge gives nothing back).
    Many(Arc<[u64]>),
}

impl Placed {
    /// A charge admitted at `at_us` whose limits' times it left are `ends` (at most 8: more
    /// are not kept, and such a charge gives nothing back).
    pub(crate) fn new(at_us: u64, ends: &[u64]) -> Self {
        let ends = match ends {
            &[end] => Ends::One([end]),
            &[first, second] => Ends::Two([first, second]),
            ends if ends.len() <= 8 => Ends::Many(ends.into()),
            _ => Ends::Many(Arc::new([])),
        };
        Self { at_us, ends }
    }

    /// The stored time each limit's charge left.
    pub(crate) fn ends(&self) -> &[u64] {
        match &self.ends {
            Ends::One(end) => end,
            Ends::Two(ends) => ends,
            Ends::Many(ends) => ends,
        }
    }

    /// From a script's reply: the time it admitted the check at (`now`), and each limit's
    /// reset time (the charge ends then). A time that is not one is an
    /// [`Error::InvalidReply`].
    pub(crate) fn read(now: i64, resets: impl Iterator<Item = u64>) -> Result<Self, Error> {
        let at = u64::try_from(now)
            .ok()
            .filter(|&t| t <= MAX)
            .ok_or_else(|| Error::InvalidReply(format!("admitted at {now} µs")))?;
        let mut ends = [0; 8];
        let mut n = 0;
        for reset in resets {
            let slot = ends
                .get_mut(n)
                .ok_or_else(|| Error::InvalidReply("more than 8 limits".to_owned()))?;
            *slot = at.saturating_add(reset);
            n += 1;
        }
        Ok(Self::new(at, &ends[..n]))
    }
}

/// A refund that moved a key's time back while charges admitted after the refunded one may
/// still have been held, moving them back too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    /// When the refunded charge was admitted: charges admitted since were behind it.
    pub(crate) at: u64,
    /// When the refund ran.
    pub(crate) moved_at: u64,
    /// How far the time moved back.
    pub(crate) back: u64,
    /// The key's time before the refund: by then every charge it moved has drained.
    pub(crate) until: u64,
}

/// A key's refunds that moved charges (see the module docs), and a floor: every charge
/// admitted before it has drained.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Ledger {
    /// When the ledger may be forgotten: every charge it says anything about has drained.
    pub(crate) until: u64,
    pub(crate) floor: u64,
    /// In the order written; the first may stand for several merged ones.
    pub(crate) records: Vec<Record>,
}

/// Largest integer exact in Lua's doubles; the ledger's sums stay below it.
const MAX: u64 = 1 << 52;

impl Ledger {
    /// Forgets the records whose moved charges have all drained by `now`, raising the floor.
    /// True when anything changed.
    fn prune(&mut self, now: u64) -> bool {
        let before = self.records.len();
        let floor = &mut self.floor;
        self.records.retain(|r| {
            let keep = r.until > now;
            if !keep {
                *floor = (*floor).max(r.moved_at);
            }
            keep
        });
        self.records.len() != before
    }

    /// The earliest a charge admitted at `at`, that left the time at `end` and took `span`
    /// of it, can end now: `end` moved back by every recorded refund of an earlier charge made
    /// while it was in flight (all of a merged record), and never before `at + span`.
    fn earliest_end(&self, at: u64, end: u64, span: u64) -> u64 {
        let moved = self
            .records
            .iter()
            .filter(|r| r.at <= at && at <= r.moved_at)
            .fold(0u64, |sum, r| sum.saturating_add(r.back))
            .min(MAX);
        end.saturating_sub(moved)
            .max(at.saturating_add(span))
            .min(end)
    }

    fn note(&mut self, record: Record) {
        self.until = self.until.max(record.until);
        self.records.push(record);
        if self.records.len() > RECORDS {
            let (a, b) = (self.records[0], self.records[1]);
            self.records[1] = Record {
                at: a.at.min(b.at),
                moved_at: a.moved_at.max(b.moved_at),
                back: (a.back + b.back).min(MAX),
                until: a.until.max(b.until),
            };
            self.records.remove(0);
        }
    }
}

/// What a refund did to one limit's stored time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GivenBack {
    /// The time to store: `None` when the key is rested again (it goes away).
    pub(crate) tat: Option<u64>,
    /// True when the time moved back.
    pub(crate) given: bool,
    /// True when the ledger changed and must be written.
    pub(crate) noted: bool,
}

/// Gives back, on a stored time `tat` later than `now`, what a charge admitted at `at` that
/// left the time at `end` and took `span` of it still holds at `now` (see the module docs),
/// never moving the time before `now`; notes in `ledger` a refund that may have moved later
/// charges.
#[cfg(test)]
pub(crate) fn give_back(
    tat: u64,
    ledger: &mut Ledger,
    now: u64,
    at: u64,
    end: u64,
    span: u64,
) -> GivenBack {
    give_back_part(tat, ledger, now, (at, end, span), span)
}

/// Like [`give_back`], but at most `most` of the charge `(at, end, span)`: its last part, as a
/// settlement below the charge gives back (the charge keeps its first `span - most`, so what
/// it still holds of its last `most` is what lies after `now`).
pub(crate) fn give_back_part(
    tat: u64,
    ledger: &mut Ledger,
    now: u64,
    (at, end, span): (u64, u64, u64),
    most: u64,
) -> GivenBack {
    let mut noted = ledger.prune(now);
    let earliest = (at >= ledger.floor).then(|| ledger.earliest_end(at, end, span));
    let held = earliest.map_or(0, |e| e.saturating_sub(now).min(span).min(most));
    if held == 0 {
        return GivenBack {
            tat: Some(tat),
            given: false,
            noted,
        };
    }
    let back = tat - held.min(tat);
    if back <= now {
        // Nothing is held any more: every charge admitted before now has drained.
        ledger.floor = ledger.floor.max(now);
        ledger.records.clear();
        ledger.until = ledger.until.max(tat);
        return GivenBack {
            tat: None,
            given: true,
            noted: true,
        };
    }
    if earliest.is_some_and(|e| e < tat) {
        // Charges may lie after this one: they moved back by `held`.
        ledger.note(Record {
            at,
            moved_at: now,
            back: held,
            until: tat,
        });
        noted = true;
    }
    GivenBack {
        tat: Some(back),
        given: true,
        noted,
    }
}

#[cfg(test)]
mod tests {
    use crate::algorithm::held::{give_back, Ledger, Placed, Record, RECORDS};

    #[test]
    fn a_placed_charge_keeps_up_to_eight_ends() {
        for n in 0..=9u64 {
            let ends: Vec<u64> = (0..n).map(|i| 1_000 + i * 7).collect();
            let placed = Placed::new(5, &ends);
            let kept: &[u64] = if n <= 8 { &ends } else { &[] };
            assert_eq!((placed.at_us, placed.ends()), (5, kept), "{n} ends");
            assert_eq!(placed.clone(), placed);
        }
    }

    /// A charge whose earlier neighbour was refunded while it was in flight moved back with
    /// the key's time: it drained sooner than its recorded end says, and gives back nothing
    /// once drained, not the units of a charge admitted after it.
    #[test]
    fn a_charge_moved_back_by_an_earlier_refund_gives_back_only_what_it_holds() {
        // Emission 5, burst 6. u1 (5 units) admitted at 265 took [265, 290], u2 (1 unit) at
        // 270 took [290, 295].
        let mut ledger = Ledger::default();
        // u1 refunded at 274: it held 16, and u2 moved back to [274, 279].
        let g = give_back(295, &mut ledger, 274, 265, 290, 25);
        assert_eq!((g.tat, g.given, g.noted), (Some(279), true, true));
        // A counted charge at 284 takes [284, 314]. u2, refunded at 285, has drained: its
        // recorded end (295) would have handed out 5 of the counted charge's.
        let g = give_back(314, &mut ledger, 285, 270, 295, 5);
        assert_eq!((g.tat, g.given), (Some(314), false));
        // Without the earlier refund, u2 would still hold 5 at 285.
        let g = give_back(314, &mut Ledger::default(), 285, 270, 295, 5);
        assert_eq!((g.tat, g.given), (Some(309), true));
    }

    #[test]
    fn a_newest_charge_needs_no_record_and_a_rested_key_raises_the_floor() {
        let mut ledger = Ledger::default();
        // The newest charge (nothing after it): given back in full, nothing to record.
        let g = give_back(300, &mut ledger, 250, 250, 300, 50);
        assert_eq!((g.tat, g.given, g.noted), (None, true, true));
        // The key rested: every charge admitted before 250 has drained.
        assert_eq!((ledger.floor, ledger.until), (250, 300));
        let g = give_back(400, &mut ledger, 260, 240, 320, 20);
        assert!(!g.given);
        let mut ledger = Ledger::default();
        let g = give_back(400, &mut ledger, 250, 250, 400, 50);
        assert_eq!((g.tat, g.noted), (Some(350), false));
        assert_eq!(ledger, Ledger::default());
    }

    /// Past `RECORDS`, the two oldest records merge into one that moves every charge either
    /// moved, at least as far: estimates only get earlier, never later.
    #[test]
    fn merged_records_bound_what_they_replace() {
        let mut ledger = Ledger::default();
        for i in 0..=RECORDS as u64 {
            ledger.note(Record {
                at: 10 * i,
                moved_at: 10 * i + 5,
                back: 3,
                until: 1_000 + i,
            });
        }
        assert_eq!(ledger.records.len(), RECORDS);
        assert_eq!(
            ledger.records[0],
            Record {
                at: 0,
                moved_at: 15,
                back: 6,
                until: 1_001
            }
        );
        // A charge admitted at 3 was moved by the first record only: 3; the merge says 6.
        assert_eq!(ledger.earliest_end(3, 500, 10), 494);
        // Pruned once drained: the floor rises to the latest refund among them.
        assert!(ledger.prune(1_001));
        assert_eq!(ledger.floor, 15);
    }
}
