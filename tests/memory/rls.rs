//! The rate limit service on a `MemoryStore`: rules matched as envoyproxy/ratelimit matches
//! them, the request's semantics, and the JSON form.

use tower_redis_ratelimit::{
    rate_limit::rls::{json_request, json_response, proto::*, RlsAlgorithm, RlsRules, RlsService},
    MemoryStore,
};

const RULES: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    value: /admin
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: path
    value: /api/*
    rate_limit: { unit: minute, requests_per_unit: 2, name: api }
  - key: path
    rate_limit: { unit: second, requests_per_unit: 100 }
  - key: api_key
    descriptors:
      - key: plan
        value: free
        rate_limit: { unit: day, requests_per_unit: 2 }
      - key: plan
        value: gold
        rate_limit: { unlimited: true }
  - key: trial
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: blocked
    rate_limit: { unit: second }
  - key: tenant
    rate_limit: { unit: minute, requests_per_unit: 5, name: tenant }
  - key: vip
    rate_limit: { unit: minute, requests_per_unit: 50, replaces: [{ name: tenant }] }
";

fn rules() -> RlsRules {
    RlsRules::from_yaml("edge.yaml", RULES).unwrap()
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    }
}

fn service() -> RlsService {
    RlsService::builder(MemoryStore::new())
        .build(rules())
        .unwrap()
}

/// The codes of `request`: the overall one, then each descriptor's.
async fn codes(service: &RlsService, request: &RateLimitRequest) -> (Code, Vec<Code>) {
    let r = service.should_rate_limit(request).await.unwrap();
    (
        r.overall_code(),
        r.statuses.iter().map(|s| s.code()).collect(),
    )
}

#[test]
fn the_most_specific_rule_matches() {
    let rules = rules();
    let path = |entries: &[(&str, &str)]| rules.find("edge", entries).map(|r| r.path.clone());
    // An exact value before a pattern, a pattern before the key alone.
    assert_eq!(path(&[("path", "/admin")]).unwrap(), "edge.path_/admin");
    assert_eq!(path(&[("path", "/api/v1")]).unwrap(), "edge.path_/api/*");
    assert_eq!(path(&[("path", "/apix")]).unwrap(), "edge.path");
    assert_eq!(
        path(&[("remote_address", "10.0.0.1")]).unwrap(),
        "edge.remote_address"
    );
    // Nested: the rule of the node the last entry reaches.
    assert_eq!(
        path(&[("api_key", "k"), ("plan", "free")]).unwrap(),
        "edge.api_key.plan_free"
    );
    // No rule at the node reached, no node for an entry, more entries than levels: none.
    assert_eq!(path(&[("api_key", "k")]), None);
    assert_eq!(path(&[("api_key", "k"), ("plan", "silver")]), None);
    assert_eq!(path(&[("remote_address", "a"), ("x", "y")]), None);
    assert_eq!(path(&[("nothing", "x")]), None);
    assert!(rules.find("other", &[("remote_address", "a")]).is_none());
}

#[test]
fn files_that_do_not_read_are_refused_with_the_place() {
    let refused = |text: &str| RlsRules::from_yaml("f.yaml", text).unwrap_err().to_string();
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    bogus: 1\n");
    assert!(
        e.contains("f.yaml") && e.contains("line 4") && e.contains("bogus"),
        "{e}"
    );
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n");
    assert!(e.contains("fortnight"), "{e}");
    let e = refused("domain: d\ndescriptors:\n  - key: a\n  - key: a\n");
    assert!(e.contains("d.a") && e.contains("twice"), "{e}");
    let e = refused("domain: ''\n");
    assert!(e.contains("domain"), "{e}");
    let e = refused(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unlimited: true, unit: second }\n",
    );
    assert!(e.contains("unlimited"), "{e}");
    let e = refused("domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n");
    assert!(e.contains("share_threshold"), "{e}");
    // Units in any case, a number as a value.
    let rules = RlsRules::from_yaml(
        "f.yaml",
        "domain: d\ndescriptors:\n  - key: code\n    value: 10\n    rate_limit: { unit: SECOND, requests_per_unit: 1 }\n",
    )
    .unwrap();
    assert!(rules.find("d", &[("code", "10")]).is_some());
}

#[tokio::test]
async fn a_key_only_rule_counts_each_value_apart() {
    let service = service();
    let a = request(vec![descriptor(&[("remote_address", "a")])]);
    let b = request(vec![descriptor(&[("remote_address", "b")])]);
    for _ in 0..3 {
        assert_eq!(codes(&service, &a).await.0, Code::Ok);
    }
    assert_eq!(codes(&service, &a).await.0, Code::OverLimit);
    assert_eq!(codes(&service, &b).await.0, Code::Ok);
    let r = service.should_rate_limit(&b).await.unwrap();
    let s = &r.statuses[0];
    assert_eq!(s.limit_remaining, 1);
    let limit = s.current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit()), (3, Unit::Minute));
    let reset = s.duration_until_reset.unwrap().seconds;
    assert!((1..=60).contains(&reset), "{reset}");
}

#[tokio::test]
async fn a_refused_request_spends_nothing_on_any_descriptor() {
    let service = service();
    let both = request(vec![
        descriptor(&[("remote_address", "r")]),
        descriptor(&[("path", "/admin")]),
    ]);
    assert_eq!(
        codes(&service, &both).await,
        (Code::Ok, vec![Code::Ok, Code::Ok])
    );
    // /admin is spent (1 an hour): the request is refused, and remote_address keeps its units.
    for _ in 0..5 {
        assert_eq!(
            codes(&service, &both).await,
            (Code::OverLimit, vec![Code::Ok, Code::OverLimit])
        );
    }
    let alone = request(vec![descriptor(&[("remote_address", "r")])]);
    assert_eq!(codes(&service, &alone).await.0, Code::Ok);
    assert_eq!(codes(&service, &alone).await.0, Code::Ok);
    assert_eq!(
        codes(&service, &alone).await.0,
        Code::OverLimit,
        "3 a minute, 1 + 2 spent"
    );
}

#[tokio::test]
async fn hits_addend_comes_from_the_descriptor_then_the_request() {
    let service = service();
    let mut r = request(vec![descriptor(&[("remote_address", "h")])]);
    r.hits_addend = 2;
    assert_eq!(codes(&service, &r).await.0, Code::Ok);
    assert_eq!(codes(&service, &r).await.0, Code::OverLimit, "2 + 2 > 3");
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
    let answer = service.should_rate_limit(&r).await.unwrap();
    assert_eq!(
        (answer.overall_code(), answer.statuses[0].limit_remaining),
        (Code::Ok, 0)
    );
    // 0 looks without taking.
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    assert_eq!(codes(&service, &r).await.0, Code::Ok);
}

#[tokio::test]
async fn shadow_unlimited_replaced_and_blocked_rules() {
    let service = service();
    let trial = request(vec![descriptor(&[("trial", "t")])]);
    for _ in 0..3 {
        let r = service.should_rate_limit(&trial).await.unwrap();
        assert_eq!(r.overall_code(), Code::Ok, "shadow mode never refuses");
    }
    let gold = request(vec![descriptor(&[("api_key", "k"), ("plan", "gold")])]);
    let r = service.should_rate_limit(&gold).await.unwrap();
    assert_eq!(
        (r.overall_code(), r.statuses[0].limit_remaining),
        (Code::Ok, u32::MAX)
    );
    // vip replaces tenant in a request where both match: tenant's 5 a minute do not apply.
    let both = request(vec![
        descriptor(&[("tenant", "t")]),
        descriptor(&[("vip", "v")]),
    ]);
    for _ in 0..10 {
        let r = service.should_rate_limit(&both).await.unwrap();
        assert_eq!(r.overall_code(), Code::Ok);
        assert!(r.statuses[0].current_limit.is_none());
    }
    let blocked = request(vec![descriptor(&[("blocked", "x")])]);
    assert_eq!(codes(&service, &blocked).await.0, Code::OverLimit);
    // No rule: OK, no numbers.
    let free = request(vec![descriptor(&[("nothing", "x")])]);
    let r = service.should_rate_limit(&free).await.unwrap();
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(
        r.statuses[0],
        DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        }
    );
    // An unknown domain: OK for every descriptor.
    let mut other = free.clone();
    other.domain = "other".into();
    assert_eq!(codes(&service, &other).await, (Code::Ok, vec![Code::Ok]));
    // Requests without a domain or descriptors are refused.
    assert!(service.should_rate_limit(&request(vec![])).await.is_err());
}

#[tokio::test]
async fn replacing_the_rules_keeps_the_counters() {
    let service = service();
    let r = request(vec![descriptor(&[("remote_address", "z")])]);
    for _ in 0..3 {
        assert_eq!(codes(&service, &r).await.0, Code::Ok);
    }
    service
        .replace(
            RlsRules::from_yaml(
                "edge.yaml",
                &RULES.replace("requests_per_unit: 3", "requests_per_unit: 4"),
            )
            .unwrap(),
        )
        .unwrap();
    assert_eq!(
        codes(&service, &r).await.0,
        Code::Ok,
        "one more under the new limit"
    );
    assert_eq!(codes(&service, &r).await.0, Code::OverLimit);
}

#[tokio::test]
async fn every_algorithm_decides_the_same_first_requests() {
    for algorithm in [
        RlsAlgorithm::FixedWindow,
        RlsAlgorithm::Gcra,
        RlsAlgorithm::SlidingWindow,
    ] {
        let service = RlsService::builder(MemoryStore::new())
            .algorithm(algorithm)
            .build(rules())
            .unwrap();
        let r = request(vec![descriptor(&[("remote_address", "g")])]);
        let got: Vec<Code> = {
            let mut got = Vec::new();
            for _ in 0..4 {
                got.push(codes(&service, &r).await.0);
            }
            got
        };
        assert_eq!(
            got,
            [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit],
            "{algorithm:?}"
        );
    }
}

#[tokio::test]
async fn the_json_form_reads_and_writes_as_proto3_maps_it() {
    let service = service();
    let body = br#"{"domain": "edge", "descriptors": [{"entries": [{"key": "path", "value": "/admin"}]}, {"entries": [{"key": "nothing", "value": "x"}], "hits_addend": "1"}]}"#;
    let req = json_request(body).unwrap();
    assert_eq!(req.descriptors.len(), 2);
    let first: serde_json::Value = serde_json::from_str(&json_response(
        &service.should_rate_limit(&req).await.unwrap(),
    ))
    .unwrap();
    assert_eq!(first["overallCode"], "OK");
    assert_eq!(first["statuses"][0]["currentLimit"]["unit"], "HOUR");
    assert_eq!(first["statuses"][0]["currentLimit"]["requestsPerUnit"], 1);
    assert!(
        first["statuses"][0].get("limitRemaining").is_none(),
        "0 is left out"
    );
    assert!(first["statuses"][0]["durationUntilReset"]
        .as_str()
        .unwrap()
        .ends_with('s'));
    assert_eq!(first["statuses"][1], serde_json::json!({"code": "OK"}));
    let second: serde_json::Value = serde_json::from_str(&json_response(
        &service.should_rate_limit(&req).await.unwrap(),
    ))
    .unwrap();
    assert_eq!(second["overallCode"], "OVER_LIMIT");
    for bad in [
        &b"{"[..],
        br#"{"domain": 1}"#,
        br#"{"domain": "d", "bogus": 1}"#,
    ] {
        assert!(json_request(bad).is_err());
    }
}
