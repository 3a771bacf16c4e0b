//! What a limiter counts.

use std::{
    cell::Cell,
    sync::atomic::{AtomicU64, AtomicUsize, Ordering},
};

use crate::decision::{Source, Verdict};

/// Counters of a limit ([`RateLimiter::stats`](crate::RateLimiter::stats),
/// [`ConcurrencyLimiter::stats`](crate::concurrency::ConcurrencyLimiter::stats)), for health
/// checks, dashboards and tests. Every decision is counted once, under its [`Verdict`] and
/// its [`Source`] ([`decisions`](Self::decisions)); the fields sum them up. A concurrency
/// limit counts its acquires as decisions; it has no deny cache, shadow mode nor refunds.
///
/// ```
/// # use tower_redis_ratelimit::*;
/// # use tower_redis_ratelimit::telemetry::{Source, Verdict};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(1))?)?;
/// limiter.check("k", 1).await?;
/// limiter.check("k", 1).await?; // denied by the store, and its denial cached
/// limiter.check("k", 1).await?; // denied by the deny cache
/// let stats = limiter.stats();
/// assert_eq!((stats.allowed, stats.denied), (1, 2));
/// assert_eq!(stats.decisions(Verdict::Denied, Source::DenyCache), 1);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LimiterStats {
    /// Checks allowed (for a concurrency limit: requests admitted), whatever answered them,
    /// including requests the failure policy let through while the store failed.
    pub allowed: u64,
    /// Checks denied (for a concurrency limit: requests refused because every permit of
    /// their key was held), whatever answered them, the deny cache included: the requests a
    /// layer refused with `429` (gRPC `RESOURCE_EXHAUSTED`).
    pub denied: u64,
    /// Denials under a policy in shadow mode: requests that went on, but would have been
    /// refused (see
    /// [`RateLimiterBuilder::shadow`](crate::rate_limit::RateLimiterBuilder::shadow)).
    pub would_deny: u64,
    /// Checks the store could not decide and the failure policy refused (`503`).
    pub unavailable: u64,
    /// Checks that failed in the store (errors and timeouts).
    pub store_errors: u64,
    /// Checks refused without calling the store because the circuit breaker was open.
    pub short_circuited: u64,
    /// Decisions made locally at the local share while the store was unavailable.
    pub degraded: u64,
    /// How often the circuit breaker opened.
    pub breaker_opened: u64,
    /// Checks denied (or, in shadow mode, would-be denied) by the local deny cache without a
    /// store call.
    pub deny_cache_hits: u64,
    /// Refunds that gave units back (see [`RateLimiter::refund`](crate::RateLimiter::refund)
    /// and [`RateLimitLayer::count_if`](crate::RateLimitLayer::count_if)).
    pub refunds: u64,
    /// Refunds that failed in the store (errors, timeouts, an open circuit breaker): those
    /// units stay spent.
    pub refund_errors: u64,
    /// Serialized as `{"allowed": {"store": N, ...}, ...}`, every verdict and source.
    #[cfg_attr(feature = "serde", serde(serialize_with = "decisions_by_name"))]
    decisions: [[u64; SOURCES]; VERDICTS],
}

/// The decisions as a map of verdicts, each a map of sources.
#[cfg(feature = "serde")]
fn decisions_by_name<S: serde::Serializer>(
    decisions: &[[u64; SOURCES]; VERDICTS],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    struct Sources<'a>(&'a [u64; SOURCES]);
    impl serde::Serialize for Sources<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let mut map = serializer.serialize_map(Some(SOURCES))?;
            for source in Source::ALL {
                map.serialize_entry(source.as_str(), &self.0[source.index()])?;
            }
            map.end()
        }
    }
    let mut map = serializer.serialize_map(Some(VERDICTS))?;
    for verdict in Verdict::ALL {
        map.serialize_entry(verdict.as_str(), &Sources(&decisions[verdict.index()]))?;
    }
    map.end()
}

impl LimiterStats {
    /// The decisions of `verdict` answered by `source`.
    pub fn decisions(&self, verdict: Verdict, source: Source) -> u64 {
        self.decisions[verdict.index()][source.index()]
    }
}

const SOURCES: usize = Source::ALL.len();
const VERDICTS: usize = Verdict::ALL.len();

/// One live counter.
#[derive(Debug, Default)]
pub(crate) struct Count(AtomicU64);

impl Count {
    pub(crate) fn increment(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// How many lanes the decision counters (and the top-keys tracker) are split into: threads
/// count in their own lane, so that two cores deciding at once do not write the same cache
/// line.
pub(crate) const LANES: usize = 8;

/// This thread's lane, from 0 to `LANES - 1`: threads take lanes in turn.
pub(crate) fn lane() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static LANE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    LANE.with(|lane| match lane.get() {
        usize::MAX => {
            let next = NEXT.fetch_add(1, Ordering::Relaxed) % LANES;
            lane.set(next);
            next
        }
        current => current,
    })
}

/// One lane of decision counters, on cache lines of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Lane([[Count; SOURCES]; VERDICTS]);

/// The live counters behind [`LimiterStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    decisions: [Lane; LANES],
    pub(crate) store_errors: Count,
    pub(crate) short_circuited: Count,
    pub(crate) refunds: Count,
    pub(crate) refund_errors: Count,
}

impl Counters {
    /// Counts one decision.
    pub(crate) fn decided(&self, verdict: Verdict, source: Source) {
        self.decisions[lane()].0[verdict.index()][source.index()].increment();
    }

    pub(crate) fn snapshot(&self, breaker_opened: u64) -> LimiterStats {
        let mut decisions = [[0u64; SOURCES]; VERDICTS];
        for lane in &self.decisions {
            for (sum, row) in decisions.iter_mut().zip(&lane.0) {
                for (sum, count) in sum.iter_mut().zip(row) {
                    *sum += count.get();
                }
            }
        }
        let verdict = |v: Verdict| decisions[v.index()].iter().sum::<u64>();
        let source = |s: Source| decisions.iter().map(|row| row[s.index()]).sum::<u64>();
        let cache = Source::DenyCache.index();
        LimiterStats {
            allowed: verdict(Verdict::Allowed),
            denied: verdict(Verdict::Denied),
            would_deny: verdict(Verdict::WouldDeny),
            unavailable: verdict(Verdict::Unavailable),
            store_errors: self.store_errors.get(),
            short_circuited: self.short_circuited.get(),
            degraded: source(Source::Local),
            breaker_opened,
            deny_cache_hits: decisions[Verdict::Denied.index()][cache]
                + decisions[Verdict::WouldDeny.index()][cache],
            refunds: self.refunds.get(),
            refund_errors: self.refund_errors.get(),
            decisions,
        }
    }
}
