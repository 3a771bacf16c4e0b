//! The layer's policies in memory: a policy handle only selects a policy of its own layer,
//! policy names are unique within a layer, and a store that decides at once is asked once per
//! request, its errors about one key refusing that request.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::body::Body;
use http::Request;
use tower::{ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{Gcra, GlobalKey, HeaderKey, Quota, RateLimitLayer, RateLimiter};

use crate::common::{counting, header};

/// A policy handle can only select a policy of the layer that handed it out: another layer's
/// handle is answered 503 and never decided under a policy it was not meant for.
#[tokio::test]
async fn a_policy_handle_of_another_layer_is_refused() {
    use tower_redis_ratelimit::{rate_limit::Class, MemoryStore};
    let store = MemoryStore::new();
    let limiter = |name: &str| {
        RateLimiter::builder(store.clone(), Gcra::new(Quota::per_hour(5)).unwrap())
            .policy_name(name)
            .build()
            .unwrap()
    };
    let mut other = RateLimitLayer::new(limiter("other-default"), GlobalKey);
    let foreign = other.add_policy(limiter("other-login")).unwrap();
    let mut layer = RateLimitLayer::new(limiter("default"), GlobalKey);
    let own = layer.add_policy(limiter("login")).unwrap();
    assert_ne!(own, foreign);
    let layer = layer.classify(move |parts| match parts.uri.path() {
        "/login" => Class::Policy(own),
        "/mixed-up" => Class::Policy(foreign),
        _ => Class::Default,
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(counting(calls.clone()));
    let get = |path: &'static str| {
        let svc = svc.clone();
        async move {
            let req = Request::get(path).body(Body::empty()).unwrap();
            svc.oneshot(req).await.unwrap()
        }
    };
    let res = get("/login").await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"login\";q=5;w=3600")
    );
    let res = get("/mixed-up").await;
    assert_eq!(res.status(), 503);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Policy names are unique within a layer: each counts apart, so a duplicate would be a
/// second set of counters under a name the headers cannot tell apart.
#[tokio::test]
async fn a_duplicate_policy_name_in_one_layer_is_an_error() {
    use tower_redis_ratelimit::MemoryStore;
    let limiter = |store: MemoryStore, name: &str| {
        RateLimiter::builder(store, Gcra::new(Quota::per_hour(5)).unwrap())
            .policy_name(name)
            .build()
            .unwrap()
    };
    let mut layer = RateLimitLayer::new(limiter(MemoryStore::new(), "login"), GlobalKey);
    let err = layer
        .add_policy(limiter(MemoryStore::new(), "login"))
        .unwrap_err();
    assert_eq!(err.field(), "policy_name");
}

/// A store that decides at once (in memory) and fails a key (it holds another algorithm's
/// state): the layer asks it once per request and, the error being about the key rather
/// than the store's health, refuses the request under `FailurePolicy::Local` without
/// deciding locally.
#[tokio::test]
async fn a_store_deciding_at_once_is_asked_once_per_request() {
    use tower_redis_ratelimit::{
        algorithm::{Algorithm, MemoryState, Outcome, Rule},
        rate_limit::Decision,
        store::ErrorScope,
        Error, FailurePolicy, MemoryStore,
    };

    /// GCRA, counting the store's decisions (its in-memory twin runs once per ask).
    struct Counted(Gcra, Arc<AtomicUsize>);
    impl Algorithm for Counted {
        fn name(&self) -> &'static str {
            "shared-name"
        }
        fn quota(&self) -> u64 {
            self.0.quota()
        }
        fn window(&self) -> Duration {
            self.0.window()
        }
        fn rule(&self) -> Rule<'_> {
            self.0.rule()
        }
        fn decide(
            &self,
            state: &mut MemoryState,
            now_us: u64,
            cost: u32,
        ) -> Result<Outcome, Error> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.decide(state, now_us, cost)
        }
        fn local_share(&self, instances: std::num::NonZeroU32) -> Option<Arc<dyn Algorithm>> {
            self.0.local_share(instances)
        }
    }

    /// Another algorithm keeping state of its own type under the same name and key.
    struct Foreign(Gcra);
    impl Algorithm for Foreign {
        fn name(&self) -> &'static str {
            "shared-name"
        }
        fn quota(&self) -> u64 {
            1
        }
        fn window(&self) -> Duration {
            Duration::from_secs(3_600)
        }
        fn rule(&self) -> Rule<'_> {
            self.0.rule()
        }
        fn decide(&self, state: &mut MemoryState, now_us: u64, _: u32) -> Result<Outcome, Error> {
            state.put(String::from("foreign"), now_us, 3_600_000_000);
            Ok(Outcome::single(true, 0, Some(0), 3_600_000_000))
        }
    }

    let store = MemoryStore::new();
    let foreign = RateLimiter::builder(
        store.clone(),
        Foreign(Gcra::new(Quota::per_hour(1)).unwrap()),
    )
    .common_counters()
    .build()
    .unwrap();
    let d: Decision = foreign.check("k", 1).await.unwrap();
    assert!(d.allowed);
    let asked = Arc::new(AtomicUsize::new(0));
    let gcra = Gcra::new(Quota::per_hour(4)).unwrap();
    let limiter = RateLimiter::builder(store, Counted(gcra, asked.clone()))
        .common_counters()
        .on_store_error(FailurePolicy::Local)
        .local_share(2)
        .build()
        .unwrap();
    let e = limiter.check("k", 1).await.unwrap_err();
    assert!(matches!(e, Error::WrongType), "{e:?}");
    assert_eq!(e.scope(), ErrorScope::Key);
    assert_eq!(asked.swap(0, Ordering::SeqCst), 1);
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            limiter.clone(),
            HeaderKey::new("x-key").unwrap(),
        ))
        .service(counting(calls.clone()));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let req = Request::get("/").header("x-key", "k").body(Body::empty());
        let res = svc.clone().oneshot(req.unwrap()).await.unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [503, 503, 503]);
    assert_eq!(
        asked.load(Ordering::SeqCst),
        3,
        "the store was asked more or less than once per request"
    );
    assert_eq!(limiter.stats().degraded, 0);
    assert_eq!(limiter.stats().store_errors, 4);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// `RateLimit-Policy` announces the window in which a rested key earns its burst back, worked
/// out from the quota (6 per second is `w=1`, 7 per hour `w=3600`), never the emission
/// interval rounded up to a microsecond and multiplied back (1,000,002 µs, announced `w=2`):
/// a client pacing by `q / w` runs at the configured rate, not half of it.
#[tokio::test]
async fn a_policys_window_is_the_time_its_burst_takes_to_earn_back() {
    use tower_redis_ratelimit::{
        algorithm::{Algorithm, MultiLimit},
        MemoryStore, TokenBucket,
    };
    async fn policy<A: Algorithm + 'static>(algorithm: A) -> String {
        let limiter = RateLimiter::builder(MemoryStore::new(), algorithm)
            .policy_name("p")
            .build()
            .unwrap();
        let svc = ServiceBuilder::new()
            .layer(RateLimitLayer::new(limiter, GlobalKey))
            .service(counting(Arc::new(AtomicUsize::new(0))));
        let res = svc
            .oneshot(Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        header(&res, "ratelimit-policy").unwrap().to_owned()
    }
    let cases = [
        (Quota::per_second(6), "\"p\";q=6;w=1"),
        (Quota::per_second(7), "\"p\";q=7;w=1"),
        (Quota::per_hour(7), "\"p\";q=7;w=3600"),
        (Quota::per_minute(100).burst(10), "\"p\";q=10;w=6"),
        (
            Quota::new(3, Duration::from_millis(1000)).burst(2),
            "\"p\";q=2;w=1",
        ),
        (Quota::per_second(3).burst(4), "\"p\";q=4;w=2"),
    ];
    for (quota, expected) in cases {
        assert_eq!(
            policy(Gcra::new(quota).unwrap()).await,
            expected,
            "gcra {quota}"
        );
        assert_eq!(
            policy(TokenBucket::new(quota).unwrap()).await,
            expected,
            "token bucket {quota}"
        );
        let multi = MultiLimit::new([("p", quota), ("slow", Quota::per_day(1_000))]).unwrap();
        let announced = policy(multi).await;
        assert!(
            announced.contains(expected),
            "multi-limit {quota}: {announced}"
        );
    }
}

/// A shadow rollout made live: the limiter's builder turns shadow mode on, the layer's live
/// limits leave it unset, and every request is served (none refused) while the limits report
/// shadow mode; a replacement that leaves it unset keeps the limiter's, one that turns it off
/// enforces. Turning it off in the limits the layer is made live with contradicts the
/// builder: refused.
#[tokio::test]
async fn a_shadow_rollout_stays_in_shadow_mode_with_live_limits() {
    use tower_redis_ratelimit::{rate_limit::Limits, MemoryStore};
    let quota = Quota::per_hour(2);
    let limiter = || {
        RateLimiter::builder(MemoryStore::new(), Gcra::new(quota).unwrap())
            .shadow(true)
            .build()
            .unwrap()
    };
    let (layer, live) = RateLimitLayer::new(limiter(), GlobalKey)
        .live(Limits::new(quota))
        .unwrap();
    assert!(live.limits().is_shadow());
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(counting(calls.clone()));
    let statuses = |n: usize| {
        let svc = svc.clone();
        async move {
            let mut out = Vec::new();
            for _ in 0..n {
                let req = Request::get("/").body(Body::empty()).unwrap();
                out.push(svc.clone().oneshot(req).await.unwrap().status().as_u16());
            }
            out
        }
    };
    assert_eq!(statuses(5).await, [200; 5]);
    live.replace(Limits::new(Quota::per_hour(1))).unwrap();
    assert!(live.limits().is_shadow());
    assert_eq!(statuses(2).await, [200; 2]);
    live.replace(Limits::new(quota).shadow(false)).unwrap();
    assert!(!live.limits().is_shadow());
    assert_eq!(statuses(1).await, [429]);
    assert_eq!(calls.load(Ordering::SeqCst), 7);

    let err = RateLimitLayer::new(limiter(), GlobalKey)
        .live(Limits::new(quota).shadow(false))
        .unwrap_err();
    assert_eq!(err.field(), "shadow", "{err}");
}

/// One quota given twice and different (to the limiter's algorithm and to the live limits)
/// is refused naming `quota`; given alike it is taken, and `RateLimiter::peek` shows the
/// quota the layer enforces, a key's plan and a replacement's quota included.
#[tokio::test]
async fn a_quota_given_twice_and_different_is_refused_and_peek_shows_the_enforced_one() {
    use tower_redis_ratelimit::{rate_limit::Limits, MemoryStore};
    let limiter =
        RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_hour(5)).unwrap()).unwrap();
    let err = RateLimitLayer::new(limiter.clone(), GlobalKey)
        .live(Limits::new(Quota::per_hour(10)))
        .unwrap_err();
    assert_eq!(err.field(), "quota", "{err}");
    assert!(err.to_string().contains("10 per 3600s"), "{err}");

    let (layer, live) = RateLimitLayer::new(limiter.clone(), HeaderKey::new("x-k").unwrap())
        .live(Limits::new(Quota::per_hour(5)).plan("gold", Quota::per_hour(50)))
        .unwrap();
    assert_eq!(limiter.peek("anyone").await.unwrap().capacity, 5);
    assert_eq!(limiter.peek("gold").await.unwrap().capacity, 50);
    live.replace(Limits::new(Quota::per_hour(7))).unwrap();
    assert_eq!(limiter.peek("anyone").await.unwrap().capacity, 7);
    assert_eq!(limiter.peek("gold").await.unwrap().capacity, 7);
    // The layer enforces what the limiter shows.
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(counting(Arc::default()));
    let req = Request::get("/")
        .header("x-k", "anyone")
        .body(Body::empty())
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"default\";q=7;w=3600")
    );
    // A second layer cannot make the same limiter's limits live too.
    let err = RateLimitLayer::new(limiter, GlobalKey)
        .live(Limits::new(Quota::per_hour(5)))
        .unwrap_err();
    assert_eq!(err.field(), "live", "{err}");
}

/// With the fields on denials only, an allowed response carries no rate-limit field (in any
/// style) and a denial carries them with `Retry-After`.
#[tokio::test]
async fn fields_on_denials_only_leave_allowed_responses_bare() {
    use tower_redis_ratelimit::{rate_limit::HeaderStyle, MemoryStore};
    for style in [HeaderStyle::Ietf, HeaderStyle::Legacy, HeaderStyle::Both] {
        let limiter =
            RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_hour(2)).unwrap()).unwrap();
        let layer = RateLimitLayer::new(limiter, GlobalKey)
            .headers(style)
            .headers_on_denials_only();
        let calls = Arc::new(AtomicUsize::new(0));
        let svc = ServiceBuilder::new()
            .layer(layer)
            .service(counting(calls.clone()));
        let get = || {
            let svc = svc.clone();
            async move {
                let req = Request::get("/").body(Body::empty()).unwrap();
                svc.oneshot(req).await.unwrap()
            }
        };
        let fields = [
            "ratelimit",
            "ratelimit-policy",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ];
        for _ in 0..2 {
            let res = get().await;
            assert_eq!(res.status(), 200);
            for name in fields {
                assert_eq!(header(&res, name), None, "{style:?}: {name}");
            }
        }
        let res = get().await;
        assert_eq!(res.status(), 429);
        assert!(header(&res, "retry-after").is_some());
        let written = fields.iter().filter(|n| header(&res, n).is_some()).count();
        assert_eq!(
            written,
            match style {
                HeaderStyle::Ietf => 2,
                HeaderStyle::Legacy => 3,
                _ => 5,
            },
            "{style:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}

/// A layer that needs no decision for an admitted request (no decision extension, nothing
/// settled after the response, no `pk`) renders its fields from the admission's numbers: the
/// same bytes, and the same counts, as a layer that builds the decision.
#[tokio::test]
async fn admitted_fields_and_counts_are_the_same_with_or_without_the_decision_built() {
    use tower_redis_ratelimit::{rate_limit::HeaderStyle, TokenBucket};
    let quota = Quota::per_second(5).burst(3);
    for style in [HeaderStyle::Ietf, HeaderStyle::Legacy, HeaderStyle::Both] {
        same_fields_lean_or_built(style, || Gcra::new(quota).unwrap()).await;
        same_fields_lean_or_built(style, || TokenBucket::new(quota).unwrap()).await;
    }
}

/// Sixty requests of three keys (one on a plan of its own) through a layer that builds no
/// decision and one that does, on clocks that move alike: every response's fields the same.
async fn same_fields_lean_or_built<A>(
    style: tower_redis_ratelimit::rate_limit::HeaderStyle,
    algorithm: impl Fn() -> A,
) where
    A: tower_redis_ratelimit::algorithm::Algorithm + Clone,
{
    use tower_redis_ratelimit::{store::memory::ManualClock, MemoryStore};
    let fields = [
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "retry-after",
    ];
    let clock = ManualClock::new();
    let layer = |built: bool| {
        let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let limiter = RateLimiter::builder(store, algorithm())
            .policy_name("api")
            .build()
            .unwrap();
        // Keys starting with "gold" are on a plan of their own.
        let layer = RateLimitLayer::new(limiter.clone(), HeaderKey::new("x-key").unwrap())
            .headers(style)
            .quota_fn(|parts| {
                let key = parts.headers.get("x-key")?.to_str().ok()?;
                key.starts_with("gold").then(|| Quota::per_second(20))
            })
            .decision_extension(built);
        let svc = ServiceBuilder::new()
            .layer(layer)
            .service(counting(Arc::new(AtomicUsize::new(0))));
        (svc, limiter)
    };
    let (lean, lean_limiter) = layer(false);
    let (built, built_limiter) = layer(true);
    let name = std::any::type_name::<A>();
    for step in 0..60u64 {
        let key = ["a", "b", "gold-1"][(step % 3) as usize];
        let req = || {
            Request::get("/")
                .header("x-key", key)
                .body(Body::empty())
                .unwrap()
        };
        let a = lean.clone().oneshot(req()).await.unwrap();
        let b = built.clone().oneshot(req()).await.unwrap();
        assert_eq!(a.status(), b.status(), "{style:?} {name} step {step}");
        for field in fields {
            assert_eq!(
                header(&a, field),
                header(&b, field),
                "{style:?} {name} step {step}: {field}"
            );
        }
        assert!(
            fields.iter().any(|f| header(&a, f).is_some()),
            "{style:?} {name} step {step}: no field"
        );
        clock.advance(Duration::from_millis(20 + 7 * (step % 5)));
    }
    let (l, b) = (lean_limiter.stats(), built_limiter.stats());
    assert_eq!(l, b, "{style:?} {name}");
    assert!(l.allowed > 0 && l.denied > 0, "{style:?} {name}: {l:?}");
}
