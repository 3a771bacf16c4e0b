//! What operators see: every decision counted once with its source, the rule that fired, the
//! keys denied most, a shadow mode clients never notice; and the gateway demo's admin
//! listener (`/metrics`, `/top`) checked from outside, on several instances.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::servers::{
    dead_redis_url,
    gateway::{send, AdminGateway},
    RedisServer,
};
use axum::body::Body;
use http::Request;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::{
    algorithm::MultiLimit,
    rate_limit::UnitLease,
    telemetry::{Source, Verdict},
    FailurePolicy, Gcra, HeaderKey, MemoryStore, Quota, RateLimitLayer, RateLimiter,
};

/// GET `path` with `headers` over a fresh connection: status, lower-cased head, body.
fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    let r = send(addr, "GET", path, headers);
    (r.status, r.head, r.body)
}

/// The sum of the samples of `name` whose labels include every pair of `labels`, in a
/// Prometheus text exposition.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
            (n == name).then_some(())?;
            let all = labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
            all.then(|| value.parse::<f64>().unwrap() as u64)
        })
        .sum()
}

fn metrics(gw: &AdminGateway) -> String {
    let (status, head, body) = get(gw.admin, "/metrics", &[]);
    assert_eq!(status, 200, "{head}");
    body
}

fn top(gw: &AdminGateway, query: &str) -> Vec<serde_json::Value> {
    let (status, head, body) = get(gw.admin, &format!("/top{query}"), &[]);
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"))
}

/// What one instance served: statuses by user.
type Served = HashMap<String, (u64, u64)>;

/// `threads` clients each send `per_thread` requests, user `i % users` and instance
/// `i % instances` in turn, each on a fresh connection; returns what each instance served
/// (200s and 429s by user).
fn flood(gws: &[AdminGateway], users: usize, threads: usize, per_thread: usize) -> Vec<Served> {
    let served: Vec<Arc<Mutex<Served>>> = gws.iter().map(|_| Arc::default()).collect();
    let addrs: Vec<SocketAddr> = gws.iter().map(|g| g.addr).collect();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (served, addrs) = (&served, &addrs);
            s.spawn(move || {
                for i in 0..per_thread {
                    let n = t * per_thread + i;
                    let user = format!("user-{}", n % users);
                    let at = n % addrs.len();
                    let (status, head, _) = get(addrs[at], "/", &[("x-user", &user)]);
                    let mut served = served[at].lock().unwrap();
                    let entry = served.entry(user).or_default();
                    match status {
                        200 => entry.0 += 1,
                        429 => entry.1 += 1,
                        other => panic!("{other}: {head}"),
                    }
                }
            });
        }
    });
    served
        .into_iter()
        .map(|s| Arc::try_unwrap(s).unwrap().into_inner().unwrap())
        .collect()
}

/// Under a flood with the deny cache on (the default), each instance's
/// `decision="denied"` count is the 429s it served, `allowed` its 200s, and its `/top` names
/// each user with the 429s it served them.
fn denials_are_counted_as_served(gws: &[AdminGateway], what: &str) {
    let users = 4;
    let served = flood(gws, users, 6, 24);
    let mut from_cache = 0;
    for (gw, served) in gws.iter().zip(&served) {
        let text = metrics(gw);
        let ok: u64 = served.values().map(|s| s.0).sum();
        let refused: u64 = served.values().map(|s| s.1).sum();
        let counted = |decision| {
            metric(
                &text,
                "ratelimit_decisions_total",
                &[("policy", "default"), ("decision", decision)],
            )
        };
        assert_eq!(counted("denied"), refused, "{what}: 429s served\n{text}");
        assert_eq!(counted("allowed"), ok, "{what}: 200s served\n{text}");
        assert_eq!(counted("would_deny") + counted("unavailable"), 0, "{what}");
        from_cache += metric(
            &text,
            "ratelimit_decisions_total",
            &[("decision", "denied"), ("source", "deny_cache")],
        );
        let listed = top(gw, "?n=100");
        for item in &listed {
            assert_eq!(item["policy"], "default", "{what}: {item}");
            assert_eq!(item["would_deny"], 0, "{what}: {item}");
            let user = item["key"].as_str().unwrap();
            assert_eq!(
                item["denied"].as_u64().unwrap(),
                served[user].1,
                "{what}: /top of {user}"
            );
        }
        let denied_users = served.values().filter(|s| s.1 > 0).count();
        assert_eq!(listed.len(), denied_users, "{what}: {listed:?}");
        // Sorted by count, highest first.
        let counts: Vec<u64> = listed
            .iter()
            .map(|i| i["denied"].as_u64().unwrap())
            .collect();
        assert!(counts.windows(2).all(|w| w[0] >= w[1]), "{counts:?}");
    }
    assert!(from_cache > 0, "{what}: the deny cache answered no denial");
}

#[test]
fn denials_counted_equal_the_429s_served_on_three_instances_sharing_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let gws: Vec<AdminGateway> = (0..3)
        .map(|_| {
            AdminGateway::start(&[
                "--redis",
                &url,
                "--limit",
                "5",
                "--per",
                "1m",
                "--key",
                "header:x-user",
            ])
        })
        .collect();
    denials_are_counted_as_served(&gws, "redis");
    // Exact across the instances: 5 per user in all.
    let allowed: u64 = gws
        .iter()
        .map(|g| {
            metric(
                &metrics(g),
                "ratelimit_decisions_total",
                &[("decision", "allowed")],
            )
        })
        .sum();
    assert_eq!(allowed, 4 * 5);
    // The store's latency is a histogram, with a sample per store call.
    let text = metrics(&gws[0]);
    assert!(
        text.contains("# TYPE ratelimit_store_latency_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("ratelimit_store_latency_seconds_bucket{policy=\"default\",le=\"0.001\"}"),
        "{text}"
    );
    assert!(
        metric(&text, "ratelimit_store_latency_seconds_count", &[]) > 0,
        "{text}"
    );
}

#[test]
fn denials_counted_equal_the_429s_served_in_memory() {
    let gw = AdminGateway::start(&["--limit", "5", "--per", "1m", "--key", "header:x-user"]);
    denials_are_counted_as_served(std::slice::from_ref(&gw), "memory");
}

/// `--shadow`: every request is served without a rate-limit field; `/metrics` counts each
/// would-be denial once and `/top` names the key, on each of three instances.
#[test]
fn a_shadow_gateway_serves_everything_plainly_and_names_the_keys_it_would_limit() {
    let redis = RedisServer::start();
    let url = redis.url();
    let memory = [AdminGateway::start(&[
        "--shadow",
        "--limit",
        "5",
        "--per",
        "1m",
        "--key",
        "header:x-user",
    ])];
    let shared: Vec<AdminGateway> = (0..3)
        .map(|_| {
            AdminGateway::start(&[
                "--shadow",
                "--redis",
                &url,
                "--limit",
                "5",
                "--per",
                "1m",
                "--key",
                "header:x-user",
            ])
        })
        .collect();
    for (gws, what) in [(&memory[..], "memory"), (&shared[..], "redis")] {
        let mut sent = 0;
        for (user, n) in [("eve", 40), ("bob", 3)] {
            for i in 0..n {
                let gw = &gws[i % gws.len()];
                let (status, head, _) = get(gw.addr, "/", &[("x-user", user)]);
                assert_eq!(status, 200, "{what}: {head}");
                for field in [
                    "ratelimit:",
                    "ratelimit-policy:",
                    "x-ratelimit-",
                    "retry-after:",
                ] {
                    assert!(!head.contains(field), "{what}: {field} in\n{head}");
                }
                sent += 1;
            }
        }
        let (mut would_deny, mut eve) = (0, 0);
        for gw in gws {
            let text = metrics(gw);
            let counted = |d| metric(&text, "ratelimit_decisions_total", &[("decision", d)]);
            assert_eq!(counted("denied"), 0, "{what}");
            would_deny += counted("would_deny");
            for item in top(gw, "") {
                assert_eq!(item["key"], "eve", "{what}: bob stayed under the limit");
                assert_eq!(item["denied"], 0);
                eve += item["would_deny"].as_u64().unwrap();
            }
        }
        assert_eq!(sent, 43);
        assert_eq!(would_deny, 35, "{what}: 40 requests of eve, 5 allowed");
        assert_eq!(eve, 35, "{what}");
    }
}

/// `/top` writes keys as the extractor made them: an IPv6 client grouped to its /64
/// (`2001:db8::/64`), an IPv4 address as is; `n` bounds the list; a bad `n` is a 400.
#[test]
fn top_names_ip_keys_and_takes_n() {
    let gw = AdminGateway::start(&[
        "--key",
        "ip",
        "--trusted-proxy",
        "127.0.0.1/32",
        "--limit",
        "1",
        "--per",
        "1m",
    ]);
    for (client, n) in [("2001:db8::1", 3), ("2001:db8::2:7", 3), ("203.0.113.9", 3)] {
        for _ in 0..n {
            get(gw.addr, "/", &[("x-forwarded-for", client)]);
        }
    }
    let listed = top(&gw, "");
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0]["key"], "2001:db8::/64");
    assert_eq!(listed[0]["denied"], 5, "one allowed, five denied");
    assert_eq!(listed[1]["key"], "203.0.113.9");
    assert_eq!(listed[1]["denied"], 2);
    assert_eq!(top(&gw, "?n=1").len(), 1);
    for bad in ["?n=0", "?n=x", "?n=-1"] {
        assert_eq!(get(gw.admin, &format!("/top{bad}"), &[]).0, 400, "{bad}");
    }
}

/// Requests of a plan count under the policy's own name (`default`).
#[test]
fn plans_count_under_the_policy_name() {
    let gw = AdminGateway::start(&[
        "--key",
        "header:x-user",
        "--plan",
        "gold=2/1m",
        "--limit",
        "1",
        "--per",
        "1m",
    ]);
    for _ in 0..4 {
        get(gw.addr, "/", &[("x-user", "gold")]);
    }
    let listed = top(&gw, "");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (
            &listed[0]["key"],
            &listed[0]["policy"],
            &listed[0]["denied"]
        ),
        (
            &serde_json::json!("gold"),
            &serde_json::json!("default"),
            &serde_json::json!(2)
        )
    );
}

/// A store that cannot be reached under `--on-redis-error closed`: each 503 is counted once
/// as `decision="unavailable"`, `source="failure_policy"`.
#[test]
fn store_failures_answered_503_are_counted_unavailable() {
    let url = dead_redis_url();
    let gw = AdminGateway::start(&[
        "--redis",
        &url,
        "--lazy-connect",
        "--on-redis-error",
        "closed",
        "--timeout-ms",
        "50",
    ]);
    let mut refused = 0;
    for _ in 0..6 {
        let (status, head, _) = get(gw.addr, "/", &[]);
        assert_eq!(status, 503, "{head}");
        refused += 1;
    }
    let text = metrics(&gw);
    let unavailable = metric(
        &text,
        "ratelimit_decisions_total",
        &[("decision", "unavailable"), ("source", "failure_policy")],
    );
    assert_eq!(unavailable, refused, "{text}");
    assert_eq!(
        metric(
            &text,
            "ratelimit_decisions_total",
            &[("decision", "allowed")]
        ),
        0
    );
}

/// Each source of a decision is counted under its name: the store, the deny cache, unit
/// leases, the local share, the failure policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_is_counted_once_under_its_source() {
    // The store and the deny cache.
    let limiter =
        RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_hour(2)).unwrap()).unwrap();
    let mut sources = Vec::new();
    for _ in 0..5 {
        let d = limiter.check("k", 1).await.unwrap();
        sources.push((d.verdict(), d.source));
    }
    assert_eq!(
        sources,
        [
            (Verdict::Allowed, Source::Store),
            (Verdict::Allowed, Source::Store),
            (Verdict::Denied, Source::Store),
            (Verdict::Denied, Source::DenyCache),
            (Verdict::Denied, Source::DenyCache),
        ]
    );
    let stats = limiter.stats();
    assert_eq!(
        (stats.allowed, stats.denied, stats.deny_cache_hits),
        (2, 3, 2)
    );
    assert_eq!(stats.decisions(Verdict::Denied, Source::DenyCache), 2);
    assert_eq!(stats.decisions(Verdict::Denied, Source::Store), 1);

    // Unit leases, on Redis: a hot key is answered from reserved blocks.
    let mut redis = RedisServer::start();
    let leased = RateLimiter::builder(
        redis.store().await,
        Gcra::new(Quota::per_second(10_000)).unwrap(),
    )
    .policy_name("leased")
    .store_timeout(Duration::from_secs(5))
    .lease(UnitLease::up_to(Duration::from_millis(500)))
    .build()
    .unwrap();
    let mut from_leases = 0;
    for _ in 0..200 {
        let d = leased.check("hot", 1).await.unwrap();
        assert!(d.allowed);
        from_leases += u64::from(d.source == Source::UnitLease);
    }
    let stats = leased.stats();
    assert!(from_leases > 100, "{stats:?}");
    assert_eq!(
        stats.decisions(Verdict::Allowed, Source::UnitLease),
        from_leases
    );
    assert_eq!(stats.allowed, 200);

    // The local share and the failure policy, once Redis is gone.
    let build = |failure, name: &'static str| {
        let store = redis.store();
        async move {
            RateLimiter::builder(store.await, Gcra::new(Quota::per_hour(100)).unwrap())
                .policy_name(name)
                .store_timeout(Duration::from_millis(200))
                .on_store_error(failure)
                .build()
                .unwrap()
        }
    };
    let local = build(FailurePolicy::Local, "local").await;
    let open = build(FailurePolicy::Open, "open").await;
    let closed = build(FailurePolicy::Closed, "closed").await;
    redis.kill();
    let d = local.check("k", 1).await.unwrap();
    assert_eq!(
        (d.verdict(), d.source, d.degraded),
        (Verdict::Allowed, Source::Local, true)
    );
    assert_eq!(local.stats().decisions(Verdict::Allowed, Source::Local), 1);
    assert!(open.check("k", 1).await.is_err());
    assert!(closed.check("k", 1).await.is_err());
    let (o, c) = (open.stats(), closed.stats());
    assert_eq!(
        o.decisions(Verdict::Allowed, Source::FailurePolicy),
        1,
        "{o:?}"
    );
    assert_eq!(
        c.decisions(Verdict::Unavailable, Source::FailurePolicy),
        1,
        "{c:?}"
    );
    assert_eq!((o.allowed, c.unavailable, c.allowed), (1, 1, 0));
}

/// The decision says which rule fired: the policy, the part of a multi-limit that denied,
/// the source; the custom rejection is given it, and it is recorded on the request's span.
#[tokio::test]
async fn the_rule_that_fired_reaches_on_limited_and_the_span() {
    let multi = MultiLimit::new([
        ("burst", Quota::per_second(100)),
        ("daily", Quota::per_day(2)),
    ])
    .unwrap();
    let limiter = RateLimiter::builder(MemoryStore::new(), multi)
        .policy_name("api")
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let layer = RateLimitLayer::new(limiter, HeaderKey::new("x-key").unwrap()).on_limited({
        let seen = Arc::clone(&seen);
        move |d| {
            let fired = d.binding().map(|l| l.name.to_string());
            seen.lock()
                .unwrap()
                .push((d.policy.to_string(), fired, d.source, d.verdict()));
            http::Response::builder()
                .status(429)
                .body(Body::empty())
                .unwrap()
        }
    });
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        }));
    let recorded = span_fields::Recorded::default();
    let subscriber = span_fields::subscriber(recorded.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let span = tracing::info_span!(
            "request",
            rate_limit.policy = tracing::field::Empty,
            rate_limit.decision = tracing::field::Empty,
            rate_limit.source = tracing::field::Empty,
            rate_limit.limit = tracing::field::Empty,
        );
        let req = Request::builder()
            .header("x-key", "k")
            .body(Body::empty())
            .unwrap();
        let res = tracing::Instrument::instrument(svc.clone().oneshot(req), span)
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    let seen = seen.lock().unwrap();
    assert_eq!(
        *seen,
        [(
            "api".to_owned(),
            Some("daily".to_owned()),
            Source::Store,
            Verdict::Denied
        )]
    );
    let fields = recorded.fields();
    for (name, value) in [
        ("rate_limit.policy", "api"),
        ("rate_limit.decision", "denied"),
        ("rate_limit.source", "store"),
        ("rate_limit.limit", "daily"),
    ] {
        assert_eq!(
            fields
                .iter()
                .filter(|(n, v)| n == name && v == value)
                .count(),
            1,
            "{name}={value} once on the denied request's span: {fields:?}"
        );
    }
}

/// A `tracing` layer that keeps the fields recorded on spans after they were made.
mod span_fields {
    use std::sync::{Arc, Mutex};

    use tracing::{field::Field, span, Subscriber};
    use tracing_subscriber::{layer::Context, prelude::*, Layer};

    #[derive(Clone, Default)]
    pub struct Recorded(Arc<Mutex<Vec<(String, String)>>>);

    impl Recorded {
        pub fn fields(&self) -> Vec<(String, String)> {
            self.0.lock().unwrap().clone()
        }
    }

    struct Visit<'a>(&'a mut Vec<(String, String)>);

    impl tracing::field::Visit for Visit<'_> {
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.push((field.name().to_owned(), value.to_owned()));
        }

        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push((field.name().to_owned(), format!("{value:?}")));
        }
    }

    impl<S: Subscriber> Layer<S> for Recorded {
        fn on_record(&self, _: &span::Id, values: &span::Record<'_>, _: Context<'_, S>) {
            values.record(&mut Visit(&mut self.0.lock().unwrap()));
        }
    }

    pub fn subscriber(recorded: Recorded) -> impl Subscriber + Send + Sync {
        tracing_subscriber::registry().with(recorded)
    }
}

/// With `decision_extension`, the inner service reads the decision of its request: allowed
/// ones, and under shadow mode the would-be denials (which it serves, plainly).
#[tokio::test]
async fn handlers_read_the_decision_when_the_layer_exposes_it() {
    let limiter = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_hour(1)).unwrap())
        .policy_name("trial")
        .shadow(true)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter, HeaderKey::new("x-key").unwrap()).decision_extension(true),
        )
        .service(service_fn(|req: Request<Body>| async move {
            let d = req
                .extensions()
                .get::<tower_redis_ratelimit::rate_limit::Decision>()
                .expect("the decision in the extensions");
            let seen = format!("{} {} {}", d.policy, d.verdict(), d.source);
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::from(seen)))
        }));
    let mut bodies = Vec::new();
    for _ in 0..3 {
        let req = Request::builder()
            .header("x-key", "k")
            .body(Body::empty())
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), 200);
        let body = http_body_util::BodyExt::collect(res.into_body())
            .await
            .unwrap()
            .to_bytes();
        bodies.push(String::from_utf8(body.to_vec()).unwrap());
    }
    assert_eq!(
        bodies,
        [
            "trial allowed store",
            "trial would_deny store",
            "trial would_deny deny_cache"
        ]
    );
}

/// `GET /healthz`: `ok` while the store answers (always in memory), `503` with a one-line
/// reason once it does not.
#[test]
fn healthz_says_whether_the_store_answers() {
    let memory = AdminGateway::start(&[]);
    let (status, _, body) = get(memory.admin, "/healthz", &[]);
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let mut redis = RedisServer::start();
    let url = redis.url();
    let gw = AdminGateway::start(&["--redis", &url, "--timeout-ms", "200"]);
    let (status, _, body) = get(gw.admin, "/healthz", &[]);
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    redis.kill();
    let (status, _, body) = get(gw.admin, "/healthz", &[]);
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("the store did not answer: "), "{body}");
    assert_eq!(body.lines().count(), 1, "{body}");
}
