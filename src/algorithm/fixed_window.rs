//! Fixed window: one counter per key and window, windows aligned to the clock in UTC.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use super::{
    outcome::{Outcome, Position},
    settle::Change,
    state::{MemoryState, Window},
    Algorithm, Kind, Reset, Rule, Twin, NEVER,
};
use crate::{
    decision::Charge,
    error::{ConfigError, Error},
    quota::{Quota, MAX_EXACT},
};

const DAY_US: u64 = 86_400_000_000;

/// A calendar window of a [`FixedWindow`], in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Calendar {
    /// A week, from Monday 00:00 UTC.
    Week,
    /// A month, from its first day 00:00 UTC.
    Month,
    /// A year, from January 1st 00:00 UTC.
    Year,
}

impl Calendar {
    /// The length a policy header states for this window (`w` in `RateLimit-Policy`): 7 days,
    /// 30 days, 365 days. The windows themselves are the calendar's (a month of 28 to 31
    /// days, a year of 365 or 366), and the `RateLimit` header's reset counts to the end of
    /// the current one.
    pub const fn nominal(self) -> Duration {
        let days = match self {
            Calendar::Week => 7,
            Calendar::Month => 30,
            Calendar::Year => 365,
        };
        Duration::from_secs(days * 86_400)
    }

    /// The number the scripts take (see `lua/fixed_window_core.lua`).
    const fn code(self) -> u64 {
        match self {
            Calendar::Week => 1,
            Calendar::Month => 2,
            Calendar::Year => 3,
        }
    }
}

/// How a [`FixedWindow`]'s windows are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Span {
    /// Every `period_us` from the Unix epoch (a day starts at midnight UTC).
    Period(u64),
    Calendar(Calendar),
}

/// Fixed window: at most `limit` units in each window aligned to the clock in UTC: seconds,
/// minutes, hours and days from the Unix epoch ([`FixedWindow::new`]), or calendar weeks from
/// Monday, months and years ([`FixedWindow::calendar`]). A request weighs its cost; a refused
/// request takes nothing.
///
/// One small counter per key (in Redis, one `GET` and, when admitted, one `SET`): the
/// cheapest state for long quotas such as a monthly plan, where a
/// [`SlidingWindow`](crate::SlidingWindow) would keep one log entry per admitted request. The
/// price is the boundary: up to twice the limit can pass around a window's end (the end of
/// one window and the start of the next). The `RateLimit` header's reset is the window's end.
///
/// ```
/// use tower_redis_ratelimit::{algorithm::{Calendar, FixedWindow}, Quota};
///
/// // 100 requests in each minute of the clock.
/// let per_minute = FixedWindow::new(Quota::per_minute(100))?;
/// // A million calls each calendar month.
/// let monthly = FixedWindow::calendar(Calendar::Month, 1_000_000)?;
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct FixedWindow {
    limit: u64,
    span: Span,
}

impl FixedWindow {
    /// Windows of the quota's period, counted from the Unix epoch, each admitting up to the
    /// quota's limit. A period under 1 ms, a zero limit, or a burst different from the limit
    /// (a fixed window has no separate burst) is rejected.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the quota's field (`quota.limit`, `quota.period`,
    /// `quota.burst`).
    pub fn new(quota: Quota) -> Result<Self, ConfigError> {
        let period_us = quota.period_us()?;
        if matches!(quota.explicit_burst(), Some(b) if b != quota.limit()) {
            return Err(ConfigError::new(
                "quota.burst",
                "a fixed window has no separate burst; its limit is the most a window admits",
            ));
        }
        Self::with_span(quota.limit(), Span::Period(period_us))
    }

    /// Calendar windows (weeks from Monday, months, years, in UTC), each admitting up to
    /// `limit` units.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `quota.limit` when `limit` is 0.
    pub fn calendar(calendar: Calendar, limit: u32) -> Result<Self, ConfigError> {
        Self::with_span(limit, Span::Calendar(calendar))
    }

    fn with_span(limit: u32, span: Span) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::new("quota.limit", "must be at least 1"));
        }
        Ok(Self {
            limit: u64::from(limit),
            span,
        })
    }

    /// The most units a window admits.
    pub(crate) const fn limit(&self) -> u64 {
        self.limit
    }

    /// How the windows are cut, as the scripts take it: the period (0 for a calendar
    /// window) and the calendar (0 for a period).
    pub(crate) const fn span_args(&self) -> [u64; 2] {
        match self.span {
            Span::Period(p) => [p, 0],
            Span::Calendar(c) => [0, c.code()],
        }
    }
}

/// The start and end of the window `t` (microseconds since the epoch) falls in: the twin of
/// `window_of` in `lua/fixed_window_core.lua`.
fn window_of(span: Span, t: u64) -> (u64, u64) {
    let period = match span {
        Span::Period(p) => {
            let start = t - t % p;
            return (start, start + p);
        }
        Span::Calendar(c) => c,
    };
    let days = (t / DAY_US) as i64;
    let (start, end) = match period {
        Calendar::Week => {
            let monday = days - (days + 3).rem_euclid(7); // 1970-01-01 was a Thursday
            (monday, monday + 7)
        }
        Calendar::Month => {
            let (y, m) = civil_from_days(days);
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            (days_from_civil(y, m, 1), days_from_civil(ny, nm, 1))
        }
        Calendar::Year => {
            let (y, _) = civil_from_days(days);
            (days_from_civil(y, 1, 1), days_from_civil(y + 1, 1, 1))
        }
    };
    (start as u64 * DAY_US, end as u64 * DAY_US)
}

/// Days since the epoch of a date in the proleptic Gregorian calendar (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The year and month of a day since the epoch (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m)
}

/// The current window at `now` and what the key holds of it, as `window_state` in
/// `lua/fixed_window_core.lua`: its end, id and count. A state of an earlier window counts
/// nothing; one of a later window (the clock stepped back) is the current one.
fn current(span: Span, stored: Option<Window>, now: u64) -> (u64, Window) {
    let (start, end) = window_of(span, now);
    match stored {
        Some(w) if w.id >= start => {
            let end = if w.id >= end {
                window_of(span, w.id).1
            } else {
                end
            };
            (end, w)
        }
        _ => (
            end,
            Window {
                id: start,
                count: 0,
            },
        ),
    }
}

/// The decision for one check of `cost` on the stored window: the outcome, and the window to
/// store (with how long it lives) when the check was admitted. The in-memory twin of
/// `lua/fixed_window.lua`.
pub(crate) fn decide(
    limit: u64,
    span: Span,
    stored: Option<Window>,
    now: u64,
    cost: u64,
) -> (Outcome, Option<(Window, u64)>) {
    let (end, w) = current(span, stored, now);
    let reset = end - now;
    if w.count.saturating_add(cost) > limit {
        let retry = (cost <= limit).then_some(reset);
        let o = Outcome::single(false, limit.saturating_sub(w.count), retry, reset);
        return (o, None);
    }
    let count = w.count + cost;
    let mut o = Outcome::single(true, limit - count, Some(0), reset);
    o.position = Position::Window { id: w.id };
    (o, Some((Window { id: w.id, count }, reset)))
}

impl Twin for FixedWindow {
    fn peek(&self, state: &mut MemoryState, now_us: u64) -> Result<Outcome, Error> {
        Ok(decide(self.limit, self.span, state.window()?, now_us, NEVER).0)
    }

    fn reset(&self) -> Reset {
        Reset::Window
    }
}

impl FixedWindow {
    /// Gives `back` units of `charge` back to its window, while that window lasts and was not
    /// reset since, never below zero: the twin of `lua/fixed_window_refund.lua` (all of the
    /// charge) and of `lua/fixed_window_settle.lua` settling down.
    fn give_back(
        &self,
        state: &mut MemoryState,
        now_us: u64,
        charge: &Charge,
        back: u64,
    ) -> Result<bool, Error> {
        let Position::Window { id } = charge.position else {
            return Ok(false); // no window: nothing it provably holds
        };
        let (end, w) = current(self.span, state.window()?, now_us);
        if w.id != id || w.count == 0 {
            return Ok(false);
        }
        let count = w.count - back.min(w.count);
        state.put_window(Window { id, count }, now_us, end - now_us);
        Ok(true)
    }
}

impl Algorithm for FixedWindow {
    fn name(&self) -> &'static str {
        "fixed-window"
    }

    fn quota(&self) -> u64 {
        self.limit
    }

    fn window(&self) -> Duration {
        match self.span {
            Span::Period(p) => Duration::from_micros(p),
            Span::Calendar(c) => c.nominal(),
        }
    }

    fn rule(&self) -> Rule<'_> {
        Rule::builtin(Kind::FixedWindow(self))
    }

    fn decide(&self, state: &mut MemoryState, now_us: u64, cost: u32) -> Result<Outcome, Error> {
        let stored = state.window()?;
        let (outcome, write) = decide(self.limit, self.span, stored, now_us, u64::from(cost));
        if let Some((window, ttl)) = write {
            state.put_window(window, now_us, ttl);
        }
        Ok(outcome)
    }

    /// Gives the units back to the window that admitted them, while it lasts and was not reset
    /// since, never below zero (`lua/fixed_window_refund.lua`).
    fn refund(&self, state: &mut MemoryState, now_us: u64, charge: &Charge) -> Result<bool, Error> {
        self.give_back(state, now_us, charge, u64::from(charge.cost()))
    }

    /// Settling down gives back to the charge's window, as a refund does; settling up counts
    /// the difference in the window of `now_us` (whichever it is: the debt ends with it),
    /// whatever its limit.
    fn settle(
        &self,
        state: &mut MemoryState,
        now_us: u64,
        charge: &Charge,
        actual: u32,
    ) -> Result<bool, Error> {
        match Change::of(charge.cost(), actual) {
            Change::None => Ok(false),
            Change::Down(back) => self.give_back(state, now_us, charge, back),
            Change::Up(excess) => {
                let (end, w) = current(self.span, state.window()?, now_us);
                let count = w.count.saturating_add(excess).min(MAX_EXACT);
                state.put_window(Window { id: w.id, count }, now_us, end - now_us);
                Ok(true)
            }
        }
    }

    fn local_share(&self, instances: NonZeroU32) -> Option<Arc<dyn Algorithm>> {
        let limit = u32::try_from(self.limit).ok()?;
        let share = (limit / instances.get()).max(1);
        Some(Arc::new(Self::with_span(share, self.span).ok()?))
    }

    /// The same windows with the quota's limit: the quota's period must be the windows' own
    /// (a calendar window's [nominal](Calendar::nominal) length), since windows of another
    /// length would drop what the configured ones still count.
    fn with_quota(&self, quota: Quota) -> Result<Box<dyn Algorithm>, ConfigError> {
        let own = self.window();
        if quota.period() != own {
            return Err(ConfigError::new(
                "quota.period",
                format!(
                    "a fixed window takes quotas per request with its own period ({own:?}), not {:?}",
                    quota.period()
                ),
            ));
        }
        match self.span {
            Span::Period(_) => Ok(Box::new(Self::new(quota)?)),
            Span::Calendar(c) => Ok(Box::new(Self::calendar(c, quota.limit())?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2024-01-01T00:00:00Z, a Monday, in microseconds.
    const JAN_1_2024: u64 = 1_704_067_200_000_000;

    fn days(n: u64) -> u64 {
        n * DAY_US
    }

    #[test]
    fn calendar_windows_start_on_monday_the_first_of_the_month_and_january_first() {
        let at = |c, t| window_of(Span::Calendar(c), t);
        let noon = JAN_1_2024 + DAY_US / 2;
        assert_eq!(at(Calendar::Week, noon), (JAN_1_2024, JAN_1_2024 + days(7)));
        // Sunday 2024-01-07 23:59:59.999999 is still the first week.
        let sunday_night = JAN_1_2024 + days(7) - 1;
        assert_eq!(at(Calendar::Week, sunday_night).0, JAN_1_2024);
        // 2024 is a leap year: February has 29 days.
        let feb = JAN_1_2024 + days(31);
        assert_eq!(at(Calendar::Month, feb + 5), (feb, feb + days(29)));
        assert_eq!(at(Calendar::Month, noon), (JAN_1_2024, feb));
        let dec = JAN_1_2024 + days(335);
        assert_eq!(at(Calendar::Month, dec), (dec, dec + days(31)));
        assert_eq!(
            at(Calendar::Year, feb),
            (JAN_1_2024, JAN_1_2024 + days(366))
        );
        // The epoch itself was a Thursday: its week started on Monday 1969-12-29, which the
        // scripts never see (they take times from 1970 on); its month and year start there.
        assert_eq!(at(Calendar::Month, 0), (0, days(31)));
        assert_eq!(at(Calendar::Year, 0), (0, days(365)));
    }

    #[test]
    fn dates_round_trip_over_four_centuries() {
        for z in (0..146_097 * 2).step_by(13) {
            let (y, m) = civil_from_days(z);
            let first = days_from_civil(y, m, 1);
            assert!(first <= z && z - first < 31, "{z}: {y}-{m}");
        }
    }

    #[test]
    fn periods_align_to_the_epoch() {
        let minute = Span::Period(60_000_000);
        assert_eq!(
            window_of(minute, JAN_1_2024 + 61_000_000),
            (JAN_1_2024 + 60_000_000, JAN_1_2024 + 120_000_000)
        );
        let day = Span::Period(DAY_US);
        assert_eq!(
            window_of(day, JAN_1_2024 + 5),
            (JAN_1_2024, JAN_1_2024 + DAY_US)
        );
    }

    #[test]
    fn a_window_admits_its_limit_and_refuses_without_spending() {
        let w = FixedWindow::new(Quota::per_minute(5)).unwrap();
        let mut state = MemoryState::default();
        let t = JAN_1_2024 + 10_000_000;
        let o = w.decide(&mut state, t, 3).unwrap();
        assert!(o.allowed);
        assert_eq!((o.remaining, o.reset_after_us), (2, 50_000_000));
        let refused = w.decide(&mut state, t, 3).unwrap();
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after_us, Some(50_000_000));
        assert_eq!(refused.remaining, 2);
        assert_eq!(w.decide(&mut state, t, 6).unwrap().retry_after_us, None);
        assert!(w.decide(&mut state, t, 2).unwrap().allowed);
        // The next window starts afresh.
        let next = w.decide(&mut state, JAN_1_2024 + 60_000_000, 5).unwrap();
        assert!(next.allowed);
    }

    #[test]
    fn bad_quotas_name_their_field() {
        let field = |q| FixedWindow::new(q).unwrap_err().field();
        assert_eq!(field(Quota::per_second(0)), "quota.limit");
        assert_eq!(field(Quota::per_second(5).burst(6)), "quota.burst");
        assert_eq!(
            field(Quota::new(1, Duration::from_micros(10))),
            "quota.period"
        );
        let calendar = FixedWindow::calendar(Calendar::Month, 0).unwrap_err();
        assert_eq!(calendar.field(), "quota.limit");
        let minute = FixedWindow::new(Quota::per_minute(5)).unwrap();
        let e = minute.with_quota(Quota::per_second(5)).err().unwrap();
        assert_eq!(e.field(), "quota.period");
        assert_eq!(minute.with_quota(Quota::per_minute(9)).unwrap().quota(), 9);
        let monthly = FixedWindow::calendar(Calendar::Month, 10).unwrap();
        let e = monthly.with_quota(Quota::per_day(5)).err().unwrap();
        assert_eq!(e.field(), "quota.period");
        let plan = Quota::new(500, Calendar::Month.nominal());
        assert_eq!(monthly.with_quota(plan).unwrap().quota(), 500);
    }
}
