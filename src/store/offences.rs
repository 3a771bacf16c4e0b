//! What a store keeps to ban a key by itself: the key's refusals in a window and its last
//! automatic ban, counted by `lua/autoban.lua` in Redis and by [`Offences`] (its twin) in
//! memory.

/// The longest automatic ban, and how long a key's last one is remembered after it ends: a
/// day.
pub(crate) const DAY_US: u64 = 86_400_000_000;

/// The terms of a policy that bans by itself, as a store runs them: `after` refusals within
/// `within_us` ban the key for `for_us`, each ban within a day of the last one's end
/// `escalate_milli` thousandths of the last one's duration, at most [`DAY_US`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BanTerms {
    pub(crate) after: u32,
    pub(crate) within_us: u64,
    pub(crate) for_us: u64,
    pub(crate) escalate_milli: u64,
    /// Count and answer the ban that would be set, without setting it (shadow mode).
    pub(crate) shadow: bool,
}

impl BanTerms {
    /// The duration of the next ban after a last one of `last_us` (`None`: none within a
    /// day), at most a day: computed on integers as `lua/autoban.lua` does.
    pub(crate) fn next_ban(&self, last_us: Option<u64>) -> u64 {
        let Some(last) = last_us else {
            return self.for_us.min(DAY_US);
        };
        let scaled = u128::from(last) * u128::from(self.escalate_milli) / 1000;
        u64::try_from(scaled).unwrap_or(u64::MAX).min(DAY_US)
    }
}

/// What counting one refusal did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counted {
    /// The key's refusals in its window with this one; 0 when the key is banned (a refusal
    /// of a banned key does not count).
    pub(crate) refusals: u32,
    /// The ban this refusal set (or, in shadow mode, would have set), in µs; 0: none.
    pub(crate) ban_us: u64,
    /// Which ban of the key that is: 1 for its first, 2 for one within a day of the first's
    /// end, and so on.
    pub(crate) offence: u32,
}

/// One key's offences in memory (the twin of `{NS:KEY}:ab` and `{NS:KEY}:al`, see
/// `src/store/redis/keys.rs`): its refusals in the current window, and its last ban.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Offences {
    refusals: u32,
    /// When the refusals' window ends (µs on the store's clock).
    window_ends: u64,
    /// The last ban's duration and number, and until when they are remembered.
    last_us: u64,
    last_offence: u32,
    last_until: u64,
}

impl Offences {
    /// Counts one refusal at `now` of a key that is not banned (the caller looked), under
    /// `terms`: the twin of `lua/autoban.lua`. A ban to set is the caller's to write.
    pub(crate) fn count(&mut self, terms: &BanTerms, now: u64) -> Counted {
        if self.window_ends <= now {
            self.refusals = 0;
            self.window_ends = now.saturating_add(terms.within_us);
        }
        self.refusals += 1;
        if self.refusals < terms.after {
            return Counted {
                refusals: self.refusals,
                ..Counted::default()
            };
        }
        let refusals = std::mem::take(&mut self.refusals);
        self.window_ends = 0;
        let last = (self.last_until > now).then_some((self.last_us, self.last_offence));
        let ban_us = terms.next_ban(last.map(|(us, _)| us));
        let offence = last.map_or(1, |(_, n)| n + 1);
        if !terms.shadow {
            self.last_us = ban_us;
            self.last_offence = offence;
            self.last_until = now.saturating_add(ban_us).saturating_add(DAY_US);
        }
        Counted {
            refusals,
            ban_us,
            offence,
        }
    }

    /// The count starts afresh (a ban started).
    pub(crate) fn forget_refusals(&mut self) {
        self.refusals = 0;
        self.window_ends = 0;
    }

    /// When nothing here matters any more.
    pub(crate) fn expires_at(&self) -> u64 {
        self.window_ends.max(self.last_until)
    }
}

impl super::Expiring for Offences {
    fn expires_at(&self) -> u64 {
        Offences::expires_at(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TERMS: BanTerms = BanTerms {
        after: 3,
        within_us: 1_000_000,
        for_us: 2_000_000,
        escalate_milli: 2_000,
        shadow: false,
    };

    #[test]
    fn the_nth_refusal_within_the_window_bans_and_the_count_starts_afresh() {
        let mut o = Offences::default();
        assert_eq!(o.count(&TERMS, 0).refusals, 1);
        assert_eq!(o.count(&TERMS, 10).refusals, 2);
        let c = o.count(&TERMS, 20);
        assert_eq!((c.refusals, c.ban_us, c.offence), (3, 2_000_000, 1));
        assert_eq!(o.count(&TERMS, 30).refusals, 1);
    }

    #[test]
    fn refusals_outside_the_window_do_not_add_up() {
        let mut o = Offences::default();
        o.count(&TERMS, 0);
        o.count(&TERMS, 10);
        let c = o.count(&TERMS, 1_000_000);
        assert_eq!((c.refusals, c.ban_us), (1, 0));
    }

    #[test]
    fn a_ban_within_a_day_escalates_up_to_a_day() {
        let mut o = Offences::default();
        let mut now = 0;
        let mut bans = Vec::new();
        for _ in 0..20 {
            let c = (0..3).map(|_| o.count(&TERMS, now)).last().unwrap();
            bans.push((c.ban_us, c.offence));
            now += c.ban_us + 1;
        }
        assert_eq!(bans[0], (2_000_000, 1));
        assert_eq!(bans[1], (4_000_000, 2));
        assert_eq!(bans[2], (8_000_000, 3));
        assert_eq!(bans[19], (DAY_US, 20));
        // A day after the last ban's end, the key starts from the first duration again.
        now += DAY_US;
        let c = (0..3).map(|_| o.count(&TERMS, now)).last().unwrap();
        assert_eq!((c.ban_us, c.offence), (2_000_000, 1));
    }

    #[test]
    fn shadow_mode_remembers_no_ban() {
        let terms = BanTerms {
            shadow: true,
            ..TERMS
        };
        let mut o = Offences::default();
        for _ in 0..2 {
            let c = (0..3).map(|_| o.count(&terms, 0)).last().unwrap();
            assert_eq!((c.ban_us, c.offence), (2_000_000, 1));
        }
    }
}
