//! Automatic bans: a policy that bans a key refused too often
//! ([`RateLimiterBuilder::ban_after`](super::RateLimiterBuilder::ban_after)).
//!
//! How refusals are counted: off the request path. Each refusal this process answers (by
//! the store or by the deny cache, in shadow mode too) is put, without waiting, on a bounded
//! queue; one task per limiter takes them in turn and counts each in the store with one
//! atomic script call (`lua/autoban.lua`, or its twin in a `MemoryStore`), so the count is
//! exact across every instance sharing the store, and only the refusal that reaches the
//! count sets the ban. The response is never delayed; a ban starts one store round trip
//! after the refusal that brought it. A full queue drops the refusal (logged at most once a
//! second): under a flood, a key is then banned after a few more refusals than asked.

use std::{
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use super::{banner::RefusalCounter, engine::RateEngine};
use crate::{
    core::report,
    error::ConfigError,
    extract::Key,
    store::{
        offences::{BanTerms, Counted, DAY_US},
        BoxFuture, KeyBuf,
    },
};

/// The longest window, first ban and ban of an automatic ban: a day.
const DAY: Duration = Duration::from_micros(DAY_US);

/// The largest escalation factor.
const MAX_ESCALATE: f64 = 1_000.0;

/// When a policy bans a key by itself: refused `after` times within `within`, the key is
/// banned for `duration`; banned again within a day of its last ban's end, for
/// [`escalate`](Self::escalate) times its last ban's duration (2 unless set), at most a day.
///
/// The ban is the one [`RateLimiter::ban`](super::RateLimiter::ban) sets: in the store, so
/// every instance sharing it refuses the key ([`Decision::banned`](super::Decision::banned),
/// `Retry-After` the time it has left); [`peek`](super::RateLimiter::peek) shows it as
/// `banned_for`, [`reset`](super::RateLimiter::reset) leaves it, and
/// [`unban`](super::RateLimiter::unban) lifts it. Refusals of a banned key do not count, and
/// the count starts afresh when a ban starts (an operator's too). The window starts at the
/// key's first refusal counted (a fixed window from there, not a sliding one). In shadow
/// mode the policy counts, and logs the ban it would set, but never bans.
///
/// Each ban is counted in `ratelimit_bans_total{policy, reason="automatic"}` (an operator's,
/// `reason="operator"`) and logged once at `info`, with the key's digest (`key_sha1`), the
/// ban's duration (`ban_ms`) and its number (`offence`: 1 for the key's first).
///
/// Refusals are counted off the request path, each with one atomic store call (see the
/// module's source, `src/rate_limit/autoban.rs`): the response is not delayed, and a ban
/// starts about one store round trip after the refusal that brought it. Not across regions
/// ([`RegionalStore`](crate::store::redis::RegionalStore) keeps no bans), nor with a custom algorithm
/// (whose script reads no ban).
///
/// ```
/// # use std::time::Duration;
/// # use tower_redis_ratelimit::{rate_limit::AutoBan, *};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Refused 5 times within a minute: banned for 5 minutes, then 10, 20, ... at most a day.
/// let limiter = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_second(10))?)
///     .ban_after(AutoBan::new(5, Duration::from_secs(60), Duration::from_secs(300)).escalate(2.0))
///     .build()?;
/// # let _ = limiter;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoBan {
    after: u32,
    within: Duration,
    duration: Duration,
    escalate: f64,
}

impl AutoBan {
    /// Refused `after` times within `within`: banned for `duration` (checked when the limiter
    /// is built: `after` at least 1, each duration from 1 ms to a day).
    pub const fn new(after: u32, within: Duration, duration: Duration) -> Self {
        Self {
            after,
            within,
            duration,
            escalate: 2.0,
        }
    }

    /// A ban within a day of the key's last one's end lasts `factor` times the last one
    /// (from 1, the same again, to 1000; 2 unless set), at most a day.
    pub const fn escalate(mut self, factor: f64) -> Self {
        self.escalate = factor;
        self
    }

    /// The refusals that ban a key.
    pub const fn after(&self) -> u32 {
        self.after
    }

    /// The window in which they are counted.
    pub const fn within(&self) -> Duration {
        self.within
    }

    /// The first ban's duration.
    pub const fn duration(&self) -> Duration {
        self.duration
    }

    /// The escalation factor.
    pub const fn escalate_factor(&self) -> f64 {
        self.escalate
    }

    /// The terms a store runs, or the setting that cannot work, named.
    pub(crate) fn terms(&self) -> Result<BanTerms, ConfigError> {
        if self.after == 0 {
            return Err(ConfigError::new("ban_after.after", "must be at least 1"));
        }
        let micros = |field: &'static str, d: Duration| {
            if d < Duration::from_millis(1) || d > DAY {
                return Err(ConfigError::new(
                    field,
                    format!("must be from 1 ms to a day (24 h), not {d:?}"),
                ));
            }
            Ok(d.as_micros() as u64)
        };
        let within_us = micros("ban_after.within", self.within)?;
        let for_us = micros("ban_after.duration", self.duration)?;
        if !(1.0..=MAX_ESCALATE).contains(&self.escalate) {
            return Err(ConfigError::new(
                "ban_after.escalate",
                format!("must be from 1 to {MAX_ESCALATE}, not {}", self.escalate),
            ));
        }
        Ok(BanTerms {
            after: self.after,
            within_us,
            for_us,
            escalate_milli: (self.escalate * 1000.0).round() as u64,
            shadow: false,
        })
    }
}

/// Binds `engine`'s automatic bans, if any, to it (once it is built).
pub(crate) fn bind(engine: &Arc<RateEngine>) {
    if let Some(banner) = &engine.banner {
        let weak: Weak<dyn RefusalCounter> = Arc::downgrade(engine) as Weak<RateEngine>;
        banner.bind(weak);
    }
}

impl RefusalCounter for RateEngine {
    fn count<'a>(&'a self, key: &'a Key<'static>) -> BoxFuture<'a, ()> {
        Box::pin(self.count_refusal(key))
    }
}

impl RateEngine {
    /// Counts one refusal of `key` in the store; a ban it sets is this process's at once
    /// (its deny cache, the bans it writes back to a store that lost them), counted and
    /// logged.
    async fn count_refusal(&self, key: &Key<'static>) {
        let Some(banner) = &self.banner else {
            return;
        };
        let terms = BanTerms {
            shadow: self.shadow(),
            ..*banner.terms()
        };
        let store_key = self.store_key(Some(key));
        let core = &self.core;
        let sent = Instant::now();
        match core
            .call(|| core.store.count_refusal(store_key, &terms, None))
            .await
        {
            Ok(Counted {
                ban_us, offence, ..
            }) if ban_us > 0 => {
                let duration = Duration::from_micros(ban_us);
                if !terms.shadow {
                    self.forget_locally(store_key);
                    if let Some(cache) = &self.deny_cache {
                        let mut compact = KeyBuf::new();
                        super::engine::cache_key(store_key, None, &mut compact);
                        cache.insert(compact.as_bytes(), sent, duration, duration, true);
                    }
                    self.watch.banned(key, duration);
                }
                let policy = &core.policy;
                report::banned(
                    policy,
                    "automatic",
                    Some(key),
                    duration,
                    Some(offence),
                    terms.shadow,
                );
            }
            Ok(_) => {}
            Err(e) => report::refusal_not_counted(&core.policy, &core.quiet, &e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_cannot_work_are_named() {
        let s = Duration::from_secs(1);
        let field = |b: AutoBan| b.terms().unwrap_err().field();
        assert_eq!(field(AutoBan::new(0, s, s)), "ban_after.after");
        assert_eq!(
            field(AutoBan::new(3, Duration::ZERO, s)),
            "ban_after.within"
        );
        assert_eq!(field(AutoBan::new(3, DAY + s, s)), "ban_after.within");
        assert_eq!(
            field(AutoBan::new(3, s, Duration::ZERO)),
            "ban_after.duration"
        );
        assert_eq!(field(AutoBan::new(3, s, DAY + s)), "ban_after.duration");
        assert_eq!(
            field(AutoBan::new(3, s, s).escalate(0.5)),
            "ban_after.escalate"
        );
        assert_eq!(
            field(AutoBan::new(3, s, s).escalate(f64::NAN)),
            "ban_after.escalate"
        );
        assert_eq!(
            field(AutoBan::new(3, s, s).escalate(1001.0)),
            "ban_after.escalate"
        );
        let t = AutoBan::new(3, s, DAY).escalate(1.5).terms().unwrap();
        assert_eq!((t.after, t.for_us, t.escalate_milli), (3, DAY_US, 1_500));
    }
}
