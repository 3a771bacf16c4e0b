//! Several regions: one limit per key across regions, each deciding against its own Redis.
//!
//! An API served from several regions (say three, 70–250 ms apart) wants one limit per
//! customer across all of them. One Redis for every region puts a cross-region round trip on
//! every request; one Redis per region gives the customer the limit once per region. A
//! [`RegionalStore`](crate::store::redis::RegionalStore) gives one limit, with every request
//! decided by one script call on the region's own Redis, a bound on the overshoot you can
//! read below, and a region cut off from the others that keeps serving its share.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_redis_ratelimit::{store::redis::RegionalStore, Gcra, Quota, RateLimiter, RedisStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // The same list, in the same order, in every region; the first region is the home.
//! // This instance runs in "eu": its own Redis is connected now (it decides every request),
//! // the others lazily (a region away at start-up is what the share is for).
//! let store = RegionalStore::builder("eu")
//!     .region("us", RedisStore::connect_lazy("redis://redis.us.internal:6379")?)
//!     .region("eu", RedisStore::connect("redis://redis.eu.internal:6379").await?)
//!     .region("ap", RedisStore::connect_lazy("redis://redis.ap.internal:6379")?)
//!     .share(0.4) // of each key's limit, while cut off from the others (default 1/3 here)
//!     .build()?;
//! let limiter = RateLimiter::builder(store.clone(), Gcra::new(Quota::per_minute(6_000))?)
//!     .build()?;
//! let decision = limiter.check("customer-42", 1).await?;
//! println!("{:?}", store.stats()); // cut_off, cuts, grants, units granted and charged
//! # Ok(()) }
//! ```
//!
//! The gateway demo takes the same as flags: `--region eu --regions
//! us=redis://...,eu=redis://...,ap=redis://... --region-share 0.4`.
//!
//! # How it works
//!
//! - **The home region** (the first listed) keeps the exact algorithm (GCRA or the token
//!   bucket) per key in its Redis, on the same keys a plain limiter uses.
//! - **Each region's Redis holds a pool of units per key, granted by the home.** A grant is a
//!   reservation at the home, as [unit leases](crate::guide::operating#unit-leases) make: the
//!   units count as spent at the home the moment they are granted.
//! - **A request spends from its own region's pool**, in one script call on its region's
//!   Redis. It never waits on another region, with one exception, bounded: a key's first
//!   requests in a region (below).
//! - **Refills run in the background, ahead of need.** When a check leaves the pool at or
//!   below its low-water mark (the key's demand over the lead time: 100 ms, or three round
//!   trips to the home if longer), that check takes the key's refill marker in the region's
//!   Redis (one refill in flight per key and region, whatever the number of instances) and a
//!   task asks the home for a block: the key's demand over the lead time plus half a unit
//!   lifetime, at most the burst. **Blocks follow demand**: a region where all the traffic
//!   lands gets nearly the whole limit. While the regions together ask for more than a key
//!   has, the home shares what it has among them in proportion to what each asked for, and a
//!   region short of what it asked for asks again one lead time after it last asked: a region
//!   far from the home is not starved by one beside it (it still gets somewhat less: in the
//!   tests, about 30% against 70% with equal demand, 50 ms from the home against 0).
//! - **Granted units live at most the lifetime `L`** (default 500 ms) in a pool: never spent
//!   twice, lost when unspent (they were counted at the home). Two live blocks merge under
//!   the earlier expiry.
//! - **A cold key** (no pool in this region for a while) may admit `b` units on credit
//!   (default 1) so that its first request is not refused while its first grant is on its
//!   way; the credit is charged at the home with that grant. That first grant is a block of
//!   what the key's rate makes in a lead time (its demand is not known yet), so the requests
//!   right after it are admitted too. A request refused before the first grant landed waits
//!   for it once (for the refill its instance sent to end, or about a round trip to the home
//!   and half more; at most 10 ms), then spends from the pool: in the home region and in regions a few milliseconds from it, a
//!   new key's first burst is admitted as a plain limiter would admit it. Farther away, such
//!   a request is refused at once, for at most one round trip per key and region after the
//!   key's first request; raise `b` for keys whose first requests come in bursts.
//!   ([`RegionStats::first_grants_awaited`](crate::store::redis::RegionStats) counts the
//!   waits; a limiter on a regional store needs a store timeout above 20 ms.)
//!
//! # The bound
//!
//! For a key with burst `B` and rate `ρ` (the limit per second; GCRA and the token bucket
//! admit at most `B + ρ·X` in any `X` seconds), unit lifetime `L`, `R` regions and credit `b`:
//!
//! **While the regions reach each other, all regions together admit at most
//! `B + ρ·(W + L) + R·b` in any window of `W` seconds.**
//!
//! Why: every unit a region spends, but credit, was granted by the home's algorithm, which
//! counted it when it granted it. A block lives `L` from the check that asked for it, on the
//! region's own Redis clock, and that check came before the grant, so a unit is spent at most
//! `L` after the home granted it, however long the grant took to land: the units spent in a
//! window of `W` were granted in a window of `W + L`, where the home grants at most
//! `B + ρ·(W + L)`. A grant that lands later than the detection time after its check (the
//! region's Redis stalled, or the link was slow) is dropped, and so are the blocks in a pool
//! whose Redis clock has stepped back (how long they have lived is no longer known); the home
//! has charged them, so a drop only costs the region units
//! ([`RegionStats::units_dropped`](crate::store::redis::RegionStats) counts them). Credit adds at
//! most `b` per region and cold key; it is charged at the home with the first grant, so it
//! shifts admissions in time, except when the home's key is drained then (a charge takes a key
//! down to drained, never into debt), which is the `R·b` term. With the defaults (`L` = 0.5 s,
//! `b` = 1) and a limit of 6,000 a minute (`B` = 6,000, `ρ` = 100/s), a window of a minute
//! admits at most 6,000 + 6,000 + 50 + R: less than 1% over `B + ρ·W`.
//!
//! # When a region is cut off
//!
//! Every instance sends heartbeats to every other region's Redis, four times per detection
//! time (default 1 s, [`detect_after`](crate::store::redis::RegionalStoreBuilder::detect_after)).
//! When the home (or, for the home region, any other region) has not answered for the
//! detection time, or has never answered in the first four detection times after the
//! instance's store was built (4 s by default; at most 5 s, or one detection time if that is
//! longer: opening a link to a region far away takes several
//! round trips, so regions up to 250 ms apart each way are not taken for cut off at start;
//! until then a region decides from what it was granted and its credit, as when linked),
//! the instance **decides from a GCRA at its region's share `F`** of the key's
//! limit (rate `F·ρ`, burst `⌊F·B⌋`), on its own Redis (so shared by the region's instances):
//! never unlimited, never an outage. It logs it once at `warn` ("cut off from the other
//! regions"), counts it ([`RegionStats`](crate::store::redis::RegionStats): `cut_off`, `cuts`)
//! and sets the gauge `ratelimit_region_cut_off{region}` to 1 (and counts
//! `ratelimit_region_cuts_total{region}`). What it admits meanwhile is charged to the key's
//! state at once in the home region (its own Redis holds it), and counted as owed to the home
//! in any other region.
//!
//! **From the moment a region last reached the others, for `T` seconds of a cut, region `r`
//! admits at most `F_r·(B + ρ·T)`**, home included, so with shares that sum to at most 1
//! (the default, 1/R each) all regions together stay within `B + ρ·T`. What a region admits
//! from its pool before the cut is detected counts: each region keeps a ring of what it
//! admitted (per eighth of the detection time, four detection times long), and once cut off
//! its share starts as if everything admitted since it last reached the others had gone
//! through the share. A region that spent more than its share before it saw the cut (a busy
//! region drains its pool, and the home refills its own from its own Redis) is refused until
//! the share has earned that back, so over a cut longer than that it holds its share; over a
//! shorter one, what it admitted before the detection is the most it admits.
//!
//! **When the link is back**, each instance of another region charges the home with what its
//! region admitted while cut off (every key it admitted, at once; any key it missed, at its
//! next check), down to a drained key, and goes back to grants. The home's key had only the
//! home region's own admissions meanwhile, so after the charges it holds `B` minus what the
//! regions admitted (or nothing), and the window that holds the restore stays within
//! `B + ρ·(W + L)`. One exception: a region that is back first may take what the home
//! still has before another region's charge arrives (within a heartbeat period); that charge
//! then stops at a drained key, and the window holding the restore may admit up to what that
//! other region admitted while cut off over the limit.
//!
//! With more than two regions, a partial cut (the home reaches some regions but not others)
//! puts the home region and the regions it cannot reach on their shares, while the regions
//! that still reach the home take grants. The home region charges its share's admissions to
//! the key at once, so it and the regions still connected stay within the home's limit
//! together; each region cut off from the home adds its share: at most
//! `(1 + Σ F_cut)·(B + ρ·T)` over `T`, `F_cut` the shares of the regions that cannot reach
//! the home.
//!
//! # What works across regions
//!
//! | | across regions |
//! |---|---|
//! | GCRA, token bucket, quotas per request (`quota_fn`, plans) | global: the bound above |
//! | sliding window, multi-limits, custom algorithms | refused: [`ConfigError`](crate::ConfigError) naming `algorithm` (a sliding-window log cannot grant blocks that expire on their own time) |
//! | unit leases | refused: `lease` (a region's pool is a lease already) |
//! | concurrency limits | a build error: a `RegionalStore` is no [`SlotStore`](crate::store::SlotStore) (give them a `RedisStore` of one region) |
//! | the deny cache | off (a denial is not final: a refill may come at any time) |
//! | refunds (`count_if`), peeks, resets, bans | not supported yet: [`Error::Unsupported`](crate::Error::Unsupported) |
//! | allow and deny lists, shadow mode, the failure policy, stats and top keys | per instance, as always |
//!
//! The failure policy still applies to the region's own Redis: when it fails, every check
//! in that region gets the policy's answer, as with a plain `RedisStore`.
//!
//! # Choosing the settings
//!
//! - [`share`](crate::store::redis::RegionalStoreBuilder::share): the shares of all regions
//!   summing to at most 1 keep the limit during a cut; give a bigger share to a region that
//!   takes most of the traffic.
//! - [`lifetime`](crate::store::redis::RegionalStoreBuilder::lifetime) (`L`): the bound grows
//!   by `ρ·L`; a longer lifetime means fewer, larger grants. Keep it well above the round
//!   trip to the home.
//! - [`lead`](crate::store::redis::RegionalStoreBuilder::lead): the same in every region, at
//!   least the longest round trip between a region and the home.
//! - [`borrow`](crate::store::redis::RegionalStoreBuilder::borrow): 0 refuses a cold key's
//!   first request in a region far from the home until its first grant arrives (one round
//!   trip to the home); more lets a burst of a new key's first requests through there, at
//!   the cost of `R·b` in the bound.
//!
//! The tests behind these claims run real Redis servers with a proxy between the regions that
//! delays every byte and can cut the link (`tests/production/regions.rs`,
//! `tests/outside/regions.rs`); latency, use of the limit and overshoot under 0, 50 and
//! 150 ms and a partition are in the repository's `BENCHMARKS.md`.
