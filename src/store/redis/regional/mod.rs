//! Several regions: one global limit per key across regions that each decide against their
//! own Redis (see the guide's chapter [several regions](crate::guide::regions) and
//! `ARCHITECTURE.md`, "Several regions").
//!
//! The home region (the first listed) keeps the exact algorithm per key, on the same keys a
//! plain limiter uses. Each region's Redis holds a **pool** of units per key that the home
//! granted (`lua/regional_grant_*.lua`, counted as spent at the home when granted); a check
//! spends from its own region's pool in one script call (`lua/regional_spend.lua`) and never
//! waits on another region. When the pool runs low, the check that noticed takes the key's
//! refill marker and a background task asks the home for a block sized on the key's demand,
//! then puts it in the pool (`lua/regional_fill.lua`). Units live at most the lifetime `L`.
//! A cold key may be admitted on credit (`borrow`), charged at the home with the next grant.
//!
//! Heartbeats go to every other region's Redis. While the home (or, for the home region, any
//! other region) has not answered for the detection time, the region decides from a GCRA at
//! its share `F` of the limit on its own Redis and counts what it admits; when the link is
//! back, the home is charged with it (down to a drained key), and grants resume.

use std::{
    collections::HashMap,
    fmt,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc, LazyLock, Mutex, Weak,
    },
    time::{Duration, Instant},
};

use redis::Script;
use tokio::sync::Notify;

use super::{keys, link::evalsha, reply, RedisStore};
use heartbeat::heartbeats;
use refill::refill_pool;

mod builder;
mod heartbeat;
mod refill;
mod spend;
use crate::{
    algorithm::{Algorithm, Kind, Outcome},
    error::{ConfigError, Error},
    quota::MAX_EXACT,
    store::{Backend, BoxFuture, Namespaces, Store, StoreKey},
};

static SPEND: LazyLock<Script> = prelude_script!("regional_spend.lua");
static FILL: LazyLock<Script> = prelude_script!("regional_fill.lua");
static OWED: LazyLock<Script> = prelude_script!("regional_owed.lua");
static GRANT_GCRA: LazyLock<Script> = prelude_script!("regional_grant_gcra.lua");
static GRANT_BUCKET: LazyLock<Script> = prelude_script!("regional_grant_bucket.lua");
static PING: LazyLock<Script> = LazyLock::new(|| {
    Script::new(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/lua/regional_ping.lua"
    )))
});

/// The most keys a region remembers having admitted while cut off, to charge the home with
/// when the link is back; past it, a key is charged on its next check instead.
const MAX_OWED_KEYS: usize = 100_000;

/// A store for one global limit per key across several regions, each deciding against its
/// own Redis: checks never wait on another region. Build it with
/// [`RegionalStore::builder`]; limiters take it like any store.
///
/// Only [`Gcra`](crate::Gcra) and the [`TokenBucket`](crate::TokenBucket) run across regions;
/// a limiter built on this store refuses any other algorithm and unit leases
/// ([`ConfigError`] naming `algorithm` or `lease`), and keeps no deny cache (a refill may free
/// units at any time). Refunds, peeks, resets, bans and checks at an explicit time
/// ([`RateLimiter::check_at`](crate::RateLimiter::check_at)) are not supported across regions
/// ([`Error::Unsupported`]).
///
/// **The bound.** With a key's burst `B`, rate `ρ` (the limit per second), unit lifetime `L`,
/// `R` regions and the cold-key credit `b`, the admissions of all regions together in any
/// window of `W` seconds while the regions reach each other are at most
/// `B + ρ·(W + L) + R·b`. While the regions are cut off from each other for `T` seconds, region
/// `r` admits at most `F_r·(B + ρ·T)` plus what its pool held, so with shares summing to at
/// most 1 all regions together stay within `B + ρ·T` (plus the pools). See the guide for the
/// derivation.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_redis_ratelimit::{store::redis::RegionalStore, Gcra, Quota, RateLimiter, RedisStore};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// // In region "eu"; "us" is the home (listed first, the same order in every region).
/// let store = RegionalStore::builder("eu")
///     .region("us", RedisStore::connect_lazy("redis://redis.us.internal:6379")?)
///     .region("eu", RedisStore::connect("redis://redis.eu.internal:6379").await?)
///     .share(0.5)
///     .lifetime(Duration::from_secs(2))
///     .build()?;
/// let limiter = RateLimiter::builder(store, Gcra::new(Quota::per_minute(6_000))?).build()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RegionalStore {
    inner: Arc<Inner>,
}

/// Settings of a [`RegionalStore`]; [`build`](Self::build) validates them.
pub struct RegionalStoreBuilder {
    own: String,
    regions: Vec<(String, RedisStore)>,
    share: Option<f64>,
    lifetime: Duration,
    borrow: u32,
    detect_after: Duration,
    lead: Duration,
}

/// What a region's [`RegionalStore`] has seen: whether it is cut off now, and its grants.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RegionStats {
    /// This region's name.
    pub region: String,
    /// The home region's name (the first listed).
    pub home: String,
    /// True while this region decides from its share because it cannot reach the home (or,
    /// in the home region, another region).
    pub cut_off: bool,
    /// The times this region was cut off so far.
    pub cuts: u64,
    /// Grants the home answered.
    pub grants: u64,
    /// Units the home granted this region.
    pub units_granted: u64,
    /// Units admitted without the home (on credit, or while cut off) that the home was
    /// charged with afterwards.
    pub units_charged: u64,
    /// Grants that failed or got no answer within the detection time.
    pub failed_grants: u64,
    /// Granted units that never reached this region's pool: they landed later than the
    /// detection time after they were asked for (this region's Redis stalled, or its clock
    /// stepped back), or could not be written there. The home was charged with them.
    pub units_dropped: u64,
    /// Checks refused before their key's first grant in this region had landed that waited
    /// for it once (about a round trip to the home) and checked again.
    pub first_grants_awaited: u64,
}

struct Inner {
    regions: Vec<Peer>,
    own: usize,
    share: f64,
    lifetime_us: u64,
    borrow: u32,
    detect: Duration,
    lead_us: u64,
    /// The round trip of a grant, smoothed (0: none yet).
    rtt_us: AtomicU64,
    /// The round trip of a heartbeat to the home, smoothed (0: none yet, or the home region).
    home_ping_us: AtomicU64,
    /// Checks that waited for a key's first grant in this region.
    first_grants_awaited: AtomicU64,
    cut: AtomicBool,
    cuts: AtomicU64,
    grants: AtomicU64,
    units_granted: AtomicU64,
    units_charged: AtomicU64,
    failed_grants: AtomicU64,
    units_dropped: AtomicU64,
    /// Keys admitted while cut off, to charge the home with once the link is back.
    owed: Mutex<HashMap<Vec<u8>, Terms>>,
    /// Refills this instance has in flight, by key: woken when each ends.
    refills: Mutex<HashMap<Vec<u8>, Arc<Notify>>>,
    epoch: Instant,
}

struct Peer {
    name: String,
    store: RedisStore,
    /// Milliseconds since `Inner::epoch` of the last heartbeat this region answered;
    /// [`NEVER`] until it first answers.
    last_ok_ms: AtomicU64,
}

/// `Peer::last_ok_ms` of a region that has not answered yet.
const NEVER: u64 = u64::MAX;

/// The longest a region that has never answered may go unanswered from the store's start
/// before it counts as out of reach: four detection times, at most this (and never less than
/// one detection time). Opening a link takes several round trips, so a region far away may
/// answer its first heartbeat after the detection time without being cut off.
const FIRST_CONTACT: Duration = Duration::from_secs(5);

/// A key's global limit, as the regional scripts take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Terms {
    bucket: bool,
    emission_us: u64,
    burst: u64,
}

impl Terms {
    fn of(algorithm: &dyn Algorithm) -> Result<Self, Error> {
        let (bucket, r) = match algorithm.rule().kind() {
            Kind::Gcra(g) => (false, g.rate()),
            Kind::TokenBucket(t) => (true, t.rate()),
            Kind::SlidingWindow(_) | Kind::FixedWindow(_) | Kind::Multi(_) | Kind::Script(_) => {
                return Err(Error::Unsupported(
                    "only GCRA and the token bucket run across regions",
                ))
            }
        };
        Ok(Self {
            bucket,
            emission_us: r.emission_us(),
            burst: r.burst(),
        })
    }

    /// The GCRA a region runs while cut off: rate and burst times `share`, at least one unit,
    /// and an emission interval the scripts take (`emission × burst` within 2^52 µs: a tiny
    /// share admits next to nothing, never an error that the failure policy would answer).
    fn share(&self, share: f64) -> (u64, u64) {
        let burst = ((self.burst as f64 * share).floor() as u64).max(1);
        let emission =
            ((self.emission_us as f64 / share).ceil() as u64).clamp(1, MAX_EXACT / burst);
        (emission, burst)
    }
}

impl RegionalStore {
    /// Settings for the store of region `own`, which must be one of the
    /// [`region`](RegionalStoreBuilder::region)s listed.
    pub fn builder(own: impl Into<String>) -> RegionalStoreBuilder {
        RegionalStoreBuilder {
            own: own.into(),
            regions: Vec::new(),
            share: None,
            lifetime: RegionalStoreBuilder::DEFAULT_LIFETIME,
            borrow: RegionalStoreBuilder::DEFAULT_BORROW,
            detect_after: RegionalStoreBuilder::DEFAULT_DETECT_AFTER,
            lead: RegionalStoreBuilder::DEFAULT_LEAD,
        }
    }

    /// This region's state and grants so far.
    pub fn stats(&self) -> RegionStats {
        let i = &self.inner;
        RegionStats {
            region: i.regions[i.own].name.clone(),
            home: i.regions[0].name.clone(),
            cut_off: i.cut.load(Relaxed),
            cuts: i.cuts.load(Relaxed),
            grants: i.grants.load(Relaxed),
            units_granted: i.units_granted.load(Relaxed),
            units_charged: i.units_charged.load(Relaxed),
            failed_grants: i.failed_grants.load(Relaxed),
            units_dropped: i.units_dropped.load(Relaxed),
            first_grants_awaited: i.first_grants_awaited.load(Relaxed),
        }
    }

    /// The share of each key's limit this region uses while cut off.
    pub fn share(&self) -> f64 {
        self.inner.share
    }

    /// The regions' names, the home first.
    pub fn regions(&self) -> Vec<String> {
        self.inner.regions.iter().map(|p| p.name.clone()).collect()
    }
}

impl fmt::Debug for RegionalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionalStore")
            .field("region", &self.inner.regions[self.inner.own].name)
            .field("regions", &self.regions())
            .field("share", &self.inner.share)
            .finish_non_exhaustive()
    }
}

impl Inner {
    fn own(&self) -> &RedisStore {
        &self.regions[self.own].store
    }

    fn home(&self) -> &RedisStore {
        &self.regions[0].store
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn lead_us(&self) -> u64 {
        self.lead_us.max(3 * self.rtt_us.load(Relaxed))
    }

    /// How long a check refused before a key's first grant landed waits for it: the round
    /// trip to the home (a grant's, else a heartbeat's) and half more, and 2 ms
    /// ([`FIRST_GRANT_WAIT`] in the home region, whose grants are on its own Redis); `None`
    /// (no wait) when that is more than [`FIRST_GRANT_WAIT`], or before another region has
    /// measured its round trip. A check that finds this instance's own refill of the key in
    /// flight waits for it to end instead, up to [`FIRST_GRANT_WAIT`].
    fn first_grant_wait(&self) -> Option<Duration> {
        if self.own == 0 {
            return Some(FIRST_GRANT_WAIT);
        }
        let rtt = match self.rtt_us.load(Relaxed) {
            0 => self.home_ping_us.load(Relaxed),
            rtt => rtt,
        };
        let us = match rtt {
            0 => return None,
            rtt => rtt + rtt / 2 + 2_000,
        };
        let wait = Duration::from_micros(us);
        (wait <= FIRST_GRANT_WAIT).then_some(wait)
    }

    fn lock_refills(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Arc<Notify>>> {
        self.refills.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn marker_ms(&self) -> u64 {
        (self.detect.as_millis() as u64).max(1)
    }

    /// How long a key's pool outlives its last check: long enough that a key in use is not
    /// taken for a cold one (which may borrow), at least a lifetime and a window.
    fn pool_ttl_ms(&self, terms: &Terms) -> u64 {
        let window = terms.emission_us.saturating_mul(terms.burst);
        (self.lifetime_us.max(window) / 1000 + 1_000).min(86_400_000)
    }

    /// How long a region never reached may go unanswered before it is out of reach: four
    /// detection times, at most [`FIRST_CONTACT`], at least one detection time.
    fn first_contact(&self) -> Duration {
        (4 * self.detect).min(FIRST_CONTACT).max(self.detect)
    }

    /// The time each slot of a pool's ring of admissions covers (`lua/regional_spend.lua`): an
    /// eighth of the detection time, so the ring's 32 slots cover four detection times, the
    /// longest a region goes unanswered before it is cut off.
    fn ring_slot_us(&self) -> u64 {
        (self.detect.as_micros() as u64 / 8).max(1_000)
    }

    /// How long ago this instance last reached every region it must reach (the home, or for
    /// the home region every other region), in microseconds; since the store was built for a
    /// region never reached. While cut off, the region's share counts what it admitted since.
    fn since_reached_us(&self) -> u64 {
        let now = self.now_ms();
        let since = |p: &Peer| match p.last_ok_ms.load(Relaxed) {
            NEVER => now,
            last => now.saturating_sub(last),
        };
        let ms = if self.own == 0 {
            self.regions[1..].iter().map(since).max().unwrap_or(0)
        } else {
            since(&self.regions[0])
        };
        ms.saturating_mul(1_000)
    }

    /// Whether a peer that must answer has not for the detection time: the home, or for the
    /// home region any other region. A peer that has never answered is out of reach only
    /// [`first_contact`](Self::first_contact) after the store started.
    fn out_of_reach(&self) -> bool {
        let now = self.now_ms();
        let detect = self.detect.as_millis() as u64;
        let first_contact = self.first_contact().as_millis() as u64;
        let stale = |p: &Peer| match p.last_ok_ms.load(Relaxed) {
            NEVER => now > first_contact,
            last => now.saturating_sub(last) > detect,
        };
        if self.own == 0 {
            self.regions[1..].iter().any(stale)
        } else {
            stale(&self.regions[0])
        }
    }

    fn remember_owed(&self, base: &[u8], terms: Terms) {
        let mut owed = self.owed.lock().unwrap_or_else(|e| e.into_inner());
        if owed.len() < MAX_OWED_KEYS && !owed.contains_key(base) {
            owed.insert(base.to_vec(), terms);
        }
    }
}

/// The Redis key of the key under `base` with `suffix` (see `keys.rs`: `:rp`, `:rm`, ...).
fn with_suffix(base: &[u8], suffix: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(base.len() + suffix.len());
    k.extend_from_slice(base);
    k.extend_from_slice(suffix.as_bytes());
    k
}

/// The longest a check waits for its key's first grant in a region (see
/// [`RegionalStoreBuilder::borrow`]); farther from the home, a check refused before the first
/// grant landed is refused at once. A limiter on a regional store needs a store timeout above
/// twice this (`check_timeout`).
const FIRST_GRANT_WAIT: Duration = Duration::from_millis(10);

/// Gauge: 1 while a region decides from its share because it is cut off, else 0; label
/// `region`.
pub const REGION_CUT_OFF: &str = "ratelimit_region_cut_off";
/// Counter: the times a region was cut off; label `region`.
pub const REGION_CUTS: &str = "ratelimit_region_cuts_total";

#[cfg(test)]
mod shares {
    use super::*;

    /// A share, however small, is a GCRA the scripts take: at least one unit, and an emission
    /// interval whose tolerance stays within 2^52 µs (never an argument error, which the
    /// failure policy would answer, `open` letting everything through).
    #[test]
    fn a_tiny_share_admits_next_to_nothing_and_never_errs() {
        let hourly = Terms {
            bucket: false,
            emission_us: 3_600_000_000,
            burst: 1,
        };
        for share in [1e-300, 1e-12, 1e-9, 0.001] {
            let (emission, burst) = hourly.share(share);
            assert!(
                burst >= 1 && emission.checked_mul(burst).is_some_and(|t| t <= MAX_EXACT),
                "{share}"
            );
        }
        let tenth = Terms {
            bucket: false,
            emission_us: 100_000,
            burst: 100,
        };
        assert_eq!(tenth.share(0.5), (200_000, 50));
        assert_eq!(tenth.share(1.0), (100_000, 100));
    }
}

/// The regional scripts on a real Redis, on a time the tests set (`ARGV[1]`): blocks, their
/// lifetime, credit for a cold key, the share while cut off, the home's charges and its
/// split of a scarce key by demand.
#[cfg(test)]
mod scripts_on_a_set_clock {
    use super::super::testing::TestRedis;
    use super::*;

    const T0: u64 = 1_700_000_000_000_000;
    const SECOND: u64 = 1_000_000;
    /// One unit every 100 ms, burst 10 (10 per second).
    const EMISSION: u64 = 100_000;
    const BURST: u64 = 10;

    struct Pool {
        conn: redis::Connection,
        lead: u64,
    }

    impl Pool {
        fn new(redis: &TestRedis) -> Self {
            let conn = redis::Client::open(redis.url())
                .unwrap()
                .get_connection()
                .unwrap();
            Pool {
                conn,
                lead: 100_000,
            }
        }

        /// A check of `cost` at `now`: {allowed, remaining, retry, reset, refill, want, owed,
        /// first}.
        fn spend(&mut self, now: u64, cost: u64, cut: bool, borrow: u64) -> Vec<i64> {
            SPEND
                .key("{t:k}:rp")
                .key("{t:k}:rm")
                .key("{t:k}:rs")
                .arg(now)
                .arg(cost)
                .arg(u8::from(cut))
                .arg(borrow)
                .arg(self.lead)
                .arg(SECOND) // lifetime
                .arg(10_000) // pool ttl, ms
                .arg(1_000) // marker, ms
                .arg(EMISSION)
                .arg(BURST)
                .arg(2 * EMISSION) // the share: half the rate
                .arg(BURST / 2) // and half the burst
                .arg(0) // GCRA
                .arg(SECOND / 10) // ring slots of 100 ms
                .arg(0) // reached the others just now
                .invoke(&mut self.conn)
                .unwrap()
        }

        /// A check of the home region while cut off: its share, charged to the key's TAT.
        fn spend_at_home_cut_off(&mut self, now: u64) -> Vec<i64> {
            SPEND
                .key("{t:k}:rp")
                .key("{t:k}:rm")
                .key("{t:k}:rs")
                .key("{t:k}:g")
                .arg(now)
                .arg(1)
                .arg(1)
                .arg(0)
                .arg(100_000)
                .arg(SECOND)
                .arg(10_000)
                .arg(1_000)
                .arg(EMISSION)
                .arg(BURST)
                .arg(2 * EMISSION)
                .arg(BURST / 2)
                .arg(0)
                .arg(SECOND / 10)
                .arg(0)
                .invoke(&mut self.conn)
                .unwrap()
        }

        /// A grant of `granted` units at `now`, asked for at `now`, `charged` of what was owed
        /// taken off: the units in the pool.
        fn fill(&mut self, now: u64, granted: u64, charged: u64) -> i64 {
            self.fill_asked(now, now, granted, charged)[0]
        }

        /// A grant of `granted` units landing at `now`, asked for at `asked_at`, dropped if
        /// later than 300 ms: {units in the pool, units dropped}.
        fn fill_asked(&mut self, now: u64, asked_at: u64, granted: u64, charged: u64) -> Vec<i64> {
            FILL.key("{t:k}:rp")
                .key("{t:k}:rm")
                .arg(now)
                .arg(granted)
                .arg(charged)
                .arg(SECOND)
                .arg(10_000)
                .arg(0)
                .arg(asked_at)
                .arg(300_000)
                .invoke(&mut self.conn)
                .unwrap()
        }

        /// The home's grant to `region` of up to `want` units at `now`, after charging
        /// `charge`: {granted, retry_us, now}.
        fn grant(
            &mut self,
            script: &Script,
            now: u64,
            want: u64,
            charge: u64,
            region: u64,
        ) -> Vec<i64> {
            let state = if std::ptr::eq(script, &*GRANT_BUCKET) {
                "{t:k}:b"
            } else {
                "{t:k}:g"
            };
            script
                .key(state)
                .key("{t:k}:rd")
                .arg(now)
                .arg(want)
                .arg(EMISSION)
                .arg(BURST)
                .arg(charge)
                .arg(region)
                .arg(SECOND)
                .invoke(&mut self.conn)
                .unwrap()
        }
    }

    #[test]
    fn the_older_block_is_spent_first_and_no_unit_outlives_its_lifetime() {
        let redis = TestRedis::start();
        let mut pool = Pool::new(&redis);
        assert_eq!(pool.fill(T0, 3, 0), 3);
        // A second block while the first lives: both kept, the first expiring first.
        assert_eq!(pool.fill(T0 + 200_000, 2, 0), 5);
        assert_eq!(pool.spend(T0 + 300_000, 1, false, 0)[..2], [1, 4]);
        // A third block while both live: the two older ones merge under the earlier expiry.
        assert_eq!(pool.fill(T0 + 400_000, 4, 0), 8);
        // At T0 + 1 s the merged block (4 units) has expired; the newest (4) is left.
        let r = pool.spend(T0 + SECOND, 5, false, 0);
        assert_eq!(r[0], 0, "{r:?}");
        assert_eq!(pool.spend(T0 + SECOND, 4, false, 0)[..2], [1, 0]);
    }

    #[test]
    fn a_block_lives_from_the_check_that_asked_for_it_and_a_late_grant_is_dropped() {
        let redis = TestRedis::start();
        let mut pool = Pool::new(&redis);
        // A check asks for a refill at T0 and tells its time.
        let r = pool.spend(T0, 1, false, 1);
        assert_eq!((r[4], r[8]), (1, T0 as i64), "{r:?}");
        // The grant lands 200 ms later: its block expires a lifetime after T0.
        assert_eq!(pool.fill_asked(T0 + 200_000, T0, 5, 1), [5, 0]);
        assert_eq!(pool.spend(T0 + SECOND - 1, 1, false, 0)[..2], [1, 4]);
        assert_eq!(pool.spend(T0 + SECOND, 1, false, 0)[0], 0);
        // A grant landing more than 300 ms after its check (a stalled Redis) is dropped.
        let t = T0 + 2 * SECOND;
        assert_eq!(pool.fill_asked(t + 300_001, t, 5, 0), [0, 5]);
        assert_eq!(pool.spend(t + 300_002, 1, false, 0)[0], 0);
        // So is one landing on a clock earlier than its check's (stepped back).
        assert_eq!(pool.fill_asked(t - 1, t, 5, 0), [0, 5]);
        // A charge only (no units asked for) adds no units.
        assert_eq!(pool.fill_asked(t, 0, 5, 0), [0, 5]);
    }

    #[test]
    fn a_clock_stepped_back_drops_the_blocks_it_would_keep_alive() {
        let redis = TestRedis::start();
        let mut pool = Pool::new(&redis);
        assert_eq!(pool.fill(T0, 10, 0), 10);
        assert_eq!(pool.spend(T0 + 100_000, 1, false, 0)[..2], [1, 9]);
        // The clock steps back 10 s: on it the block would live 10 s more; it goes.
        let back = T0 + 100_000 - 10 * SECOND;
        let r = pool.spend(back + 50_000, 1, false, 0);
        assert_eq!(r[..2], [0, 0], "{r:?}");
        // A block granted after the step lives its lifetime on the new clock.
        assert_eq!(pool.fill(back + 100_000, 10, 0), 10);
        assert_eq!(pool.spend(back + 200_000, 1, false, 0)[..2], [1, 9]);
        // The same when the step comes between two grants: the older block goes.
        let t = T0 + 20 * SECOND;
        assert_eq!(pool.fill(t, 10, 0), 10);
        assert_eq!(pool.fill(t - 5 * SECOND, 3, 0), 3);
        assert_eq!(pool.spend(t - 5 * SECOND + 1, 4, false, 0)[0], 0);
    }

    #[test]
    fn a_cold_key_is_admitted_on_credit_once_and_asks_the_home() {
        let redis = TestRedis::start();
        let mut pool = Pool::new(&redis);
        // {allowed, remaining, retry, reset, refill, want, owed}
        let first = pool.spend(T0, 1, false, 1);
        assert_eq!(
            (first[0], first[4], first[5], first[6]),
            (1, 1, 1, 1),
            "{first:?}"
        );
        // Warm now: no more credit, and the refill in flight holds the marker; refused
        // before the first grant landed, which the caller may wait for.
        let second = pool.spend(T0 + 1_000, 1, false, 1);
        assert_eq!(
            (second[0], second[4], second[6], second[7]),
            (0, 0, 1, 1),
            "{second:?}"
        );
        // The grant arrives, the credit charged: owed 0, units to spend.
        assert_eq!(pool.fill(T0 + 50_000, 4, 1), 4);
        let third = pool.spend(T0 + 60_000, 1, false, 1);
        assert_eq!((third[0], third[1], third[6]), (1, 3, 0), "{third:?}");
        // A refusal once a grant has landed is the limit's: nothing to wait for.
        let rest = pool.spend(T0 + 60_000, 3, false, 1);
        let late = pool.spend(T0 + 60_000, 1, false, 1);
        assert_eq!((rest[0], late[0], late[7]), (1, 0, 0), "{late:?}");
    }

    #[test]
    fn a_keys_first_block_in_a_region_is_what_its_rate_makes_in_a_lead_time() {
        let redis = TestRedis::start();
        let mut pool = Pool::new(&redis);
        // Lead 450 ms at one unit per 100 ms: the first refill asks for 5 units.
        pool.lead = 450_000;
        let first = pool.spend(T0, 1, false, 1);
        assert_eq!((first[0], first[4], first[5]), (1, 1, 5), "{first:?}");
        // Without credit, the first check is refused, asks for the block, and says so.
        redis::cmd("FLUSHALL").exec(&mut pool.conn).unwrap();
        let no_credit = pool.spend(T0, 1, false, 0);
        assert_eq!(
            (no_credit[0], no_credit[4], no_credit[5], no_credit[7]),
            (0, 1, 5, 1),
            "{no_credit:?}"
        );
        // A lead shorter than a unit's time still asks for the check's cost.
        redis::cmd("FLUSHALL").exec(&mut pool.conn).unwrap();
        pool.lead = 10;
        assert_eq!(pool.spend(T0, 3, false, 0)[5], 3);
    }

    #[test]
    fn cut_off_a_region_decides_from_its_share_and_counts_what_it_owes() {
        let redis = TestRedis::start();
        let mut pool = Pool::new(&redis);
        pool.fill(T0, 10, 0);
        // The share: burst 5, one unit every 200 ms; the pool's units are not used.
        for i in 0..5 {
            let r = pool.spend(T0, 1, true, 0);
            assert_eq!((r[0], r[6]), (1, i + 1), "{r:?}");
        }
        let denied = pool.spend(T0, 1, true, 0);
        assert_eq!((denied[0], denied[2]), (0, 200_000), "{denied:?}");
        assert_eq!(pool.spend(T0 + 200_000, 1, true, 0)[..1], [1]);
        // Back in reach: the pool is as it was, and what is owed asks for a refill.
        let back = pool.spend(T0 + 300_000, 1, false, 0);
        assert_eq!(
            (back[0], back[1], back[4], back[6]),
            (1, 9, 1, 6),
            "{back:?}"
        );
    }

    #[test]
    fn the_home_region_cut_off_charges_its_own_key_and_owes_nothing() {
        let redis = TestRedis::start();
        let mut home = Pool::new(&redis);
        for _ in 0..3 {
            let r = home.spend_at_home_cut_off(T0);
            assert_eq!((r[0], r[6]), (1, 0), "{r:?}");
        }
        // Three units charged to the TAT: the other regions' grants see them.
        assert_eq!(home.grant(&GRANT_GCRA, T0, 10, 0, 1)[0], 7);
    }

    #[test]
    fn the_home_charges_what_was_owed_down_to_a_drained_key() {
        let redis = TestRedis::start();
        let mut home = Pool::new(&redis);
        for script in [&*GRANT_GCRA, &*GRANT_BUCKET] {
            redis::cmd("FLUSHALL").exec(&mut home.conn).unwrap();
            // 3 owed on a rested key: 7 left to grant.
            assert_eq!(home.grant(script, T0, 10, 3, 0)[..2], [7, 0]);
            // 1000 owed: drained, not 1000 units in debt.
            let t = T0 + 10 * EMISSION;
            let r = home.grant(script, t, 5, 1_000, 0);
            assert_eq!((r[0], r[1]), (0, EMISSION as i64), "{r:?}");
            assert_eq!(home.grant(script, t + 2 * EMISSION, 5, 0, 0)[0], 2);
        }
    }

    #[test]
    fn a_scarce_key_is_shared_by_the_regions_demands() {
        let redis = TestRedis::start();
        let mut home = Pool::new(&redis);
        for script in [&*GRANT_GCRA, &*GRANT_BUCKET] {
            redis::cmd("FLUSHALL").exec(&mut home.conn).unwrap();
            // Region 0 alone: everything it asks for that the key has.
            assert_eq!(home.grant(script, T0, 10, 0, 0)[0], 10);
            // 4 units later, region 1 asks for 10 and region 0 asked for 10 within the
            // horizon: each gets 10/20 of what the key has.
            let t = T0 + 4 * EMISSION;
            assert_eq!(home.grant(script, t, 10, 0, 1)[0], 2);
            assert_eq!(home.grant(script, t, 10, 0, 0)[0], 1);
            // Past the horizon, region 1's demand no longer counts.
            let later = T0 + 3 * SECOND;
            assert_eq!(home.grant(script, later, 10, 0, 0)[0], 10);
        }
    }
}
