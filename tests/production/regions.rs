//! Several regions on real Redis servers: two regions, each with its own `redis-server`, the
//! links between them through a proxy that delays bytes each way and can be cut. The global
//! bound holds for GCRA and the token bucket with every instance hammering one key; one busy
//! region gets nearly the whole limit; a cut region keeps serving within its share; the link
//! back charges the home with what was admitted meanwhile, so no burst follows.
//!
//! Time is real (the regions' Redis servers keep it): every bound is computed from the time
//! the test measured, so a slow machine loosens nothing and fails nothing.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::servers::{link::RegionLink, RedisServer};
use tower_redis_ratelimit::{
    algorithm::Algorithm,
    rate_limit::UnitLease,
    store::redis::{RegionalStore, RegionalStoreBuilder},
    Error, Gcra, Quota, RateLimiter, RedisStore, SlidingWindow, TokenBucket,
};

/// Each way: a round trip between the regions takes 50 ms more.
const ONE_WAY: Duration = Duration::from_millis(25);
const LIFETIME: Duration = Duration::from_millis(500);
const DETECT: Duration = Duration::from_millis(300);

/// Two regions: `a` (the home, listed first) and `b`, each with its own Redis; each reaches
/// the other's Redis only through a delaying link.
struct Regions {
    a: RedisServer,
    b: RedisServer,
    a_to_b: RegionLink,
    b_to_a: RegionLink,
}

impl Regions {
    async fn start(one_way: Duration) -> Self {
        let (a, b) = (RedisServer::start(), RedisServer::start());
        let a_to_b = RegionLink::start(addr(&b), one_way).await;
        let b_to_a = RegionLink::start(addr(&a), one_way).await;
        Regions {
            a,
            b,
            a_to_b,
            b_to_a,
        }
    }

    /// One more instance in `region` ("a" or "b"), with its own connections.
    async fn instance(&self, region: &str, share: Option<f64>) -> RegionalStore {
        let (home, other) = match region {
            "a" => (
                self.a.store().await,
                RedisStore::connect(&self.a_to_b.url()).await.unwrap(),
            ),
            _ => (
                RedisStore::connect(&self.b_to_a.url()).await.unwrap(),
                self.b.store().await,
            ),
        };
        let mut builder = RegionalStore::builder(region)
            .region("a", home)
            .region("b", other)
            .lifetime(LIFETIME)
            .detect_after(DETECT);
        if let Some(share) = share {
            builder = builder.share(share);
        }
        builder.build().unwrap()
    }

    fn cut(&self) {
        self.a_to_b.cut();
        self.b_to_a.cut();
    }

    fn restore(&self) {
        self.a_to_b.restore();
        self.b_to_a.restore();
    }
}

fn addr(redis: &RedisServer) -> std::net::SocketAddr {
    format!("127.0.0.1:{}", redis.port).parse().unwrap()
}

/// A limiter on `store`. Its checks get 2 s (not the default 100 ms): a check that reaches
/// another region through the delaying link can take longer than 100 ms on a loaded machine,
/// and the bounds below count what was admitted, however long a check took.
fn limiter<A: Algorithm>(store: &RegionalStore, algorithm: A, prefix: &str) -> RateLimiter<A> {
    RateLimiter::builder(store.clone(), algorithm)
        .prefix(prefix)
        .store_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Checks `key` from every limiter at once, two tasks each, a check every millisecond per task,
/// for `how_long`: the admissions of each limiter, and the time it took. Every check must be
/// answered (allowed or denied), never an error.
async fn hammer<A: Algorithm>(
    limiters: &[RateLimiter<A>],
    key: &str,
    how_long: Duration,
) -> (Vec<u64>, Duration) {
    let started = Instant::now();
    let counts: Vec<Arc<AtomicU64>> = limiters.iter().map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for (limiter, count) in limiters.iter().zip(&counts) {
        for _ in 0..2 {
            let (limiter, count, key) = (limiter.clone(), count.clone(), key.to_owned());
            tasks.push(tokio::spawn(async move {
                while started.elapsed() < how_long {
                    let d = limiter
                        .check(key.as_str(), 1)
                        .await
                        .expect("every check answered");
                    if d.allowed {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    (
        counts.iter().map(|c| c.load(Ordering::SeqCst)).collect(),
        elapsed,
    )
}

/// Waits (at most 10 s) until every store says it is cut off, or every one says it is not.
async fn until_cut(stores: &[&RegionalStore], cut: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while stores.iter().any(|s| s.stats().cut_off != cut) {
        assert!(
            Instant::now() < deadline,
            "the stores never saw the link {}: {:?}",
            if cut { "cut" } else { "back" },
            stores.iter().map(|s| s.stats()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `B + ρ·(W + L) + R·b`: the most all regions may admit together in `elapsed`.
fn global_bound(burst: u64, per_second: f64, elapsed: Duration, regions: u64) -> f64 {
    let borrow = u64::from(RegionalStoreBuilder::DEFAULT_BORROW);
    burst as f64 + per_second * (elapsed + LIFETIME).as_secs_f64() + (regions * borrow) as f64
}

async fn bound_held_with_every_instance_hammering<A: Algorithm + Clone>(
    algorithm: A,
    prefix: &str,
) {
    let regions = Regions::start(ONE_WAY).await;
    let mut limiters = Vec::new();
    for region in ["a", "a", "b", "b"] {
        let store = regions.instance(region, None).await;
        limiters.push(limiter(&store, algorithm.clone(), prefix));
    }
    let (counts, elapsed) = hammer(&limiters, "customer", Duration::from_secs(3)).await;
    let total: u64 = counts.iter().sum();
    let bound = global_bound(40, 20.0, elapsed, 2);
    assert!(
        total as f64 <= bound,
        "{} admitted {total} ({counts:?}) in {elapsed:?}, over the bound {bound}",
        algorithm.name()
    );
    // Both regions were served by their demands (equal here), the far one as well as the one
    // beside the home; together they used most of the limit.
    let (in_a, in_b) = (counts[0] + counts[1], counts[2] + counts[3]);
    assert!(
        in_a.min(in_b) * 5 >= total,
        "region a admitted {in_a}, b {in_b}: each at least a fifth"
    );
    let limit = 40.0 + 20.0 * elapsed.as_secs_f64();
    assert!(
        total as f64 >= 0.5 * limit,
        "{} admitted only {total} of {limit}",
        algorithm.name()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_hold_the_global_bound_under_gcra() {
    let q = Quota::per_second(20).burst(40);
    bound_held_with_every_instance_hammering(Gcra::new(q).unwrap(), "rg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_hold_the_global_bound_under_the_token_bucket() {
    let q = Quota::per_second(20).burst(40);
    bound_held_with_every_instance_hammering(TokenBucket::new(q).unwrap(), "rt").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_busy_region_far_from_its_home_gets_nearly_the_whole_limit() {
    let regions = Regions::start(ONE_WAY).await;
    let q = Quota::per_second(20).burst(40);
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let store = regions.instance("b", None).await;
        limiters.push(limiter(&store, Gcra::new(q).unwrap(), "rd"));
    }
    let (counts, elapsed) = hammer(&limiters, "customer", Duration::from_secs(3)).await;
    let total: u64 = counts.iter().sum();
    let limit = 40.0 + 20.0 * elapsed.as_secs_f64();
    // Far more than the 1/2 a fixed split would give, within the bound.
    assert!(
        total as f64 >= 0.8 * limit,
        "region b admitted {total} of {limit} ({counts:?})"
    );
    assert!(total as f64 <= global_bound(40, 20.0, elapsed, 2));
}

/// A key nobody checked yet, well under its limit. In the home region its first requests at
/// once are all admitted (one on credit, the others after waiting a few milliseconds for the
/// key's first grant). In a region 50 ms from the home, the first is admitted on credit and
/// the first grant brings a block of what the key's rate makes in a lead time, so a burst
/// right after it is admitted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_keys_first_requests_are_admitted_in_every_region() {
    let regions = Regions::start(ONE_WAY).await;
    // 100 a second: a lead time of at least 100 ms makes a first block of at least 10.
    let q = Quota::per_second(100).burst(100);
    let burst_of = |limiter: &RateLimiter<Gcra>, key: String| {
        let limiter = limiter.clone();
        async move {
            let checks = (0..8).map(|_| limiter.check(key.as_str(), 1));
            let decisions = futures_util::future::join_all(checks).await;
            decisions
                .into_iter()
                .filter(|d| d.as_ref().expect("every check answered").allowed)
                .count()
        }
    };
    let home = regions.instance("a", None).await;
    let at_home = limiter(&home, Gcra::new(q).unwrap(), "rn");
    for customer in 0..5 {
        let admitted = burst_of(&at_home, format!("a-new-{customer}")).await;
        assert_eq!(
            admitted, 8,
            "home region, customer {customer}: {admitted} of 8"
        );
    }
    assert!(home.stats().first_grants_awaited >= 5, "{:?}", home.stats());

    for customer in 0..3 {
        // An instance per customer: its grants are this customer's.
        let far = regions.instance("b", None).await;
        let away = limiter(&far, Gcra::new(q).unwrap(), "rn");
        let key = format!("b-new-{customer}");
        let grants = far.stats().grants;
        assert!(away.check(key.as_str(), 1).await.unwrap().allowed, "credit");
        let asked = Instant::now();
        while far.stats().grants == grants {
            assert!(asked.elapsed() < Duration::from_secs(2), "no grant came");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The home answered; the block goes into region b's pool on its own Redis next.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let admitted = burst_of(&away, key).await;
        assert_eq!(
            admitted, 8,
            "region b, customer {customer}: {admitted} of 8 after the first grant"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_region_keeps_serving_within_its_share_and_the_link_back_reconciles() {
    let regions = Regions::start(ONE_WAY).await;
    let q = Quota::per_second(20).burst(100);
    let (a, b) = (
        regions.instance("a", Some(0.5)).await,
        regions.instance("b", Some(0.5)).await,
    );
    let (in_a, in_b) = (
        limiter(&a, Gcra::new(q).unwrap(), "rc"),
        limiter(&b, Gcra::new(q).unwrap(), "rc"),
    );
    // Both regions know the key before the cut.
    hammer(
        &[in_a.clone(), in_b.clone()],
        "customer",
        Duration::from_millis(300),
    )
    .await;

    regions.cut();
    until_cut(&[&a, &b], true).await;
    // Units granted before the cut have expired by now: the share alone decides.
    tokio::time::sleep(LIFETIME).await;
    let (counts, elapsed) = hammer(
        &[in_a.clone(), in_b.clone()],
        "customer",
        Duration::from_secs(2),
    )
    .await;
    // The share's GCRA: burst 50, 10 per second.
    let share_limit = 50.0 + 10.0 * elapsed.as_secs_f64();
    for (region, admitted) in ["a", "b"].iter().zip(&counts) {
        let admitted = *admitted as f64;
        assert!(
            admitted <= share_limit + 1.0,
            "region {region} admitted {admitted} while cut off, over its share {share_limit}"
        );
        assert!(
            admitted >= 0.5 * share_limit,
            "region {region} admitted only {admitted} while cut off (share {share_limit})"
        );
    }
    for store in [&a, &b] {
        let stats = store.stats();
        assert!(stats.cut_off && stats.cuts == 1, "{stats:?}");
    }

    // The home region charged its own key as it went; b owes the home what it admitted.
    let charged_before = b.stats().units_charged;
    regions.restore();
    until_cut(&[&a, &b], false).await;
    // The home is charged with what b admitted while cut off: with a's charges, down to a
    // drained key, so what follows is the rate, not a fresh burst of 100.
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.stats().units_charged < charged_before + 50 {
        assert!(Instant::now() < deadline, "{:?} {:?}", a.stats(), b.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (after, elapsed) = hammer(&[in_a, in_b], "customer", Duration::from_secs(1)).await;
    let total: u64 = after.iter().sum();
    let most = 20.0 * (elapsed + LIFETIME).as_secs_f64() + 2.0;
    assert!(
        (total as f64) <= most,
        "{total} admitted in {elapsed:?} after the link came back ({after:?}); at most {most} \
         once the home is charged, {} with a fresh burst",
        100.0 + 20.0 * elapsed.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regional_settings_that_cannot_work_are_refused_naming_the_field() {
    let regions = Regions::start(Duration::ZERO).await;
    let store = || async { RedisStore::connect(&regions.a.url()).await.unwrap() };
    let two = |own: &'static str| async move {
        RegionalStore::builder(own)
            .region("a", store().await)
            .region("b", store().await)
    };
    for (builder, field) in [
        (two("c").await, "region"),
        (two("a").await.share(0.0), "share"),
        (two("a").await.share(1.5), "share"),
        (two("a").await.share(f64::NAN), "share"),
        (two("a").await.region("a", store().await), "regions"),
        (two("a").await.lifetime(Duration::ZERO), "lifetime"),
        (two("a").await.detect_after(Duration::ZERO), "detect_after"),
        (RegionalStore::builder("a"), "regions"),
    ] {
        let err = builder.build().unwrap_err();
        assert_eq!(err.field(), field, "{err}");
    }
    let regional = regions.instance("a", None).await;
    assert_eq!(regional.share(), 0.5);
    let q = Quota::per_second(5);
    let err = RateLimiter::builder(regional.clone(), SlidingWindow::new(q).unwrap())
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "algorithm", "{err}");
    let err = RateLimiter::builder(regional.clone(), Gcra::new(q).unwrap())
        .lease(UnitLease::up_to(Duration::from_millis(100)))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "lease", "{err}");
    // A check may wait a few milliseconds for a key's first grant: the timeout leaves room.
    let err = RateLimiter::builder(regional.clone(), Gcra::new(q).unwrap())
        .store_timeout(Duration::from_millis(20))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "store_timeout", "{err}");
    RateLimiter::builder(regional.clone(), Gcra::new(q).unwrap())
        .store_timeout(Duration::from_millis(21))
        .build()
        .unwrap();
    // A concurrency limiter on it does not build at all (`SlotStore`'s compile_fail example).
    // What is not supported across regions yet says so, and spends nothing.
    let gcra = RateLimiter::builder(regional, Gcra::new(q).unwrap())
        .build()
        .unwrap();
    let unsupported = |e: Error| assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
    unsupported(
        gcra.check_at("k", 1, 1_700_000_000_000_000)
            .await
            .unwrap_err(),
    );
    unsupported(gcra.peek("k").await.unwrap_err());
    unsupported(gcra.reset("k").await.unwrap_err());
    unsupported(gcra.ban("k", Duration::from_secs(5)).await.unwrap_err());
    // The key is still cold: its first check is admitted on credit.
    assert!(gcra.check("k", 1).await.unwrap().allowed);
}

/// Three regions, the home `a` first; each reaches the others' Redis through its own link.
struct ThreeRegions {
    servers: Vec<RedisServer>,
    /// `links[from][to]`: region `from`'s way to region `to`'s Redis (`None` for its own).
    links: Vec<Vec<Option<RegionLink>>>,
}

impl ThreeRegions {
    async fn start() -> Self {
        let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let mut links = Vec::new();
        for from in 0..3 {
            let mut row = Vec::new();
            for (to, server) in servers.iter().enumerate() {
                row.push(match from == to {
                    true => None,
                    false => Some(RegionLink::start(addr(server), ONE_WAY).await),
                });
            }
            links.push(row);
        }
        ThreeRegions { servers, links }
    }

    async fn instance(&self, region: usize) -> RegionalStore {
        let mut builder = RegionalStore::builder(["a", "b", "c"][region])
            .lifetime(LIFETIME)
            .detect_after(DETECT);
        for (to, name) in ["a", "b", "c"].iter().enumerate() {
            let url = match &self.links[region][to] {
                Some(link) => link.url(),
                None => self.servers[to].url(),
            };
            builder = builder.region(*name, RedisStore::connect(&url).await.unwrap());
        }
        builder.build().unwrap()
    }

    /// Cuts region `region` off from the other two, both ways.
    fn isolate(&self, region: usize) {
        for other in (0..3).filter(|&o| o != region) {
            for (from, to) in [(region, other), (other, region)] {
                self.links[from][to].as_ref().unwrap().cut();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_regions_hold_the_bound_and_a_partial_cut_stays_within_its_bound() {
    let world = ThreeRegions::start().await;
    let q = Quota::per_second(30).burst(60);
    let stores = [
        world.instance(0).await,
        world.instance(1).await,
        world.instance(2).await,
    ];
    let limiters: Vec<_> = stores
        .iter()
        .map(|s| limiter(s, Gcra::new(q).unwrap(), "r3"))
        .collect();
    let (counts, elapsed) = hammer(&limiters, "customer", Duration::from_secs(3)).await;
    let total: u64 = counts.iter().sum();
    let bound = global_bound(60, 30.0, elapsed, 3);
    assert!(total as f64 <= bound, "{total} ({counts:?}) over {bound}");
    assert!(counts.iter().all(|&c| c > 0), "{counts:?}");

    // Region c cut off from both others: c and the home a (which cannot reach c) decide from
    // their shares (1/3 each); b still reaches the home and takes grants.
    world.isolate(2);
    until_cut(&[&stores[0], &stores[2]], true).await;
    assert!(!stores[1].stats().cut_off, "{:?}", stores[1].stats());
    // The key rests: the home has its whole burst again, each share too.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let (counts, elapsed) = hammer(&limiters, "customer", Duration::from_secs(2)).await;
    let limit = 60.0 + 30.0 * elapsed.as_secs_f64();
    let share = limit / 3.0;
    for (region, admitted) in [("a", counts[0]), ("c", counts[2])] {
        assert!(
            admitted as f64 <= share + 1.0,
            "region {region} admitted {admitted} on its share {share} ({counts:?})"
        );
    }
    // The home charges its own key with what it admits on its share: a and b together stay
    // within the limit, and only c's share comes on top.
    let a_and_b = global_bound(60, 30.0, elapsed, 2);
    assert!(
        (counts[0] + counts[1]) as f64 <= a_and_b,
        "regions a and b admitted {} ({counts:?}), over {a_and_b}",
        counts[0] + counts[1]
    );
}

/// Two regions `one_way` apart, each store built at once with links that open on first use
/// (as a gateway's do), at the default detection time (1 s): the stores of `a` and `b`.
async fn lazily_linked(regions: &Regions) -> [RegionalStore; 2] {
    let build = |region: &str, home: RedisStore, other: RedisStore| {
        RegionalStore::builder(region)
            .region("a", home)
            .region("b", other)
            .build()
            .unwrap()
    };
    let a = build(
        "a",
        regions.a.store().await,
        RedisStore::connect_lazy(&regions.a_to_b.url()).unwrap(),
    );
    let b = build(
        "b",
        RedisStore::connect_lazy(&regions.b_to_a.url()).unwrap(),
        regions.b.store().await,
    );
    [a, b]
}

/// Regions 0 to 250 ms apart each way (round trips up to 500 ms, within the default detection
/// time of 1 s), links opened on first use, which takes several round trips: neither region
/// reports a cut in the first 2 s, while checks flow (one pair of regions at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_up_to_250_ms_apart_are_not_taken_for_cut_off_at_start() {
    for ms in [0, 50, 100, 150, 200, 250] {
        let regions = Regions::start(Duration::from_millis(ms)).await;
        let stores = lazily_linked(&regions).await;
        let limiters: Vec<_> = stores
            .iter()
            .map(|s| limiter(s, Gcra::new(Quota::per_second(20)).unwrap(), "start"))
            .collect();
        let started = Instant::now();
        let mut cut = Vec::new();
        while started.elapsed() < Duration::from_secs(2) {
            for (l, s) in limiters.iter().zip(&stores) {
                // Answered either way; only the cut matters here.
                let _ = l.check("k", 1).await;
                let stats = s.stats();
                if stats.cut_off || stats.cuts > 0 {
                    cut.push((stats.region, started.elapsed()));
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(cut.is_empty(), "{ms} ms apart: cut off at {cut:?}");
    }
}

/// A link that never opens: each region reports a cut, and decides from its share, once it
/// has not reached the other for four detection times (4 s at the default 1 s) from its start
/// (given 15 s here), and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_never_opens_is_reported_cut_after_four_detection_times() {
    let regions = Regions::start(ONE_WAY).await;
    regions.cut();
    let started = Instant::now();
    let stores = lazily_linked(&regions).await;
    for s in &stores {
        while !s.stats().cut_off {
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{:?} not cut off",
                s.stats()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            started.elapsed() >= Duration::from_secs(4),
            "{:?} cut off after only {:?}",
            s.stats().region,
            started.elapsed()
        );
    }
    // Cut off, the home decides from its share: 1/2 of a burst of 10.
    let home = limiter(
        &stores[0],
        Gcra::new(Quota::per_second(10)).unwrap(),
        "never",
    );
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += u32::from(home.check("k", 1).await.unwrap().allowed);
    }
    assert!((1..=6).contains(&admitted), "{admitted}");
}

/// The home region hammered through a cut, from a rested key: what it admits from the cut on,
/// before the cut is detected (from its pool, refilled by its own Redis) and after (from its
/// share), is at most its share of the limit over that time, `F·(B + ρ·T)`, for `T` well past
/// the time the share takes to count what was admitted before the cut was seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_home_region_holds_its_share_from_the_cut_on() {
    let regions = Regions::start(ONE_WAY).await;
    let (burst, rate) = (40, 20.0);
    let q = Quota::per_second(20).burst(burst);
    let (a, _b) = (
        regions.instance("a", Some(0.5)).await,
        regions.instance("b", Some(0.5)).await,
    );
    let home = limiter(&a, Gcra::new(q).unwrap(), "rh");
    // The key is known (and rested again) before the cut.
    assert!(home.check("customer", 1).await.unwrap().allowed);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    regions.cut();
    let (counts, elapsed) = hammer(&[home], "customer", Duration::from_secs(5)).await;
    assert!(a.stats().cut_off, "{:?}", a.stats());
    let share = 0.5 * (burst as f64 + rate * elapsed.as_secs_f64());
    assert!(
        counts[0] as f64 <= share + 1.0,
        "the home admitted {} in {elapsed:?} from the cut on; its share is {share}",
        counts[0]
    );
}

/// The units live in `region`'s pools now (their blocks not yet expired on its clock).
fn live_pool_units(redis: &RedisServer) -> u64 {
    let mut conn = redis.conn();
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    let time: (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let now = time.0 * 1_000_000 + time.1;
    let mut live = 0;
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
        if kind != "hash" {
            continue;
        }
        let f: Vec<Option<u64>> = redis::cmd("HMGET")
            .arg(&key)
            .arg(&["u1", "e1", "u2", "e2"])
            .query(&mut conn)
            .unwrap();
        for (units, expiry) in [(f[0], f[1]), (f[2], f[3])] {
            if let (Some(units), Some(expiry)) = (units, expiry) {
                if expiry > now {
                    live += units;
                }
            }
        }
    }
    live
}

/// A region's Redis stalls (`SIGSTOP`) after a check asked the home for a block and before the
/// grant lands: when it resumes, seconds later, the grant is dropped instead of living a whole
/// lifetime from then, so no unit is spent later than its lifetime after its grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_landing_after_the_regions_redis_stalled_is_dropped() {
    // 100 ms each way: a grant takes at least 200 ms, time to stop b's Redis before it lands.
    let regions = Regions::start(Duration::from_millis(100)).await;
    let b = regions.instance("b", None).await;
    let far = limiter(&b, Gcra::new(Quota::per_second(100)).unwrap(), "rs");
    // The links are open: a first key's grant has landed (the first ones may time out while
    // the link to the home opens).
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.stats().grants == 0 {
        assert!(Instant::now() < deadline, "no grant: {:?}", b.stats());
        far.check("warm", 1).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(LIFETIME.as_millis() as u64 + 100)).await;
    assert_eq!(live_pool_units(&regions.b), 0);

    // A new key: admitted on credit, its refill on its way to the home.
    let before = b.stats();
    far.check("stalled", 1).await.unwrap();
    regions.b.signal("-STOP");
    tokio::time::sleep(Duration::from_secs(2)).await;
    regions.b.signal("-CONT");
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.stats().grants == before.grants {
        assert!(Instant::now() < deadline, "no grant: {:?}", b.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The grant landed while b's Redis was stopped (its write waited past the detection
    // time), so this run tests what it should.
    let after = b.stats();
    assert!(after.units_granted > before.units_granted, "{after:?}");
    assert!(after.units_dropped > before.units_dropped, "{after:?}");
    // The write ran when b's Redis resumed; the pool holds none of the late units.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(live_pool_units(&regions.b), 0, "{after:?}");
}
