//! What a request is charged: `--cost N` (a flag, and a limit setting of the `--config` file
//! that a reload changes), and `--settle-header NAME`, which settles the charge to the
//! upstream's figure.

use std::time::Duration;

use crate::{
    gateway::{rename_into_place, TempDir},
    servers::gateway::{assert_refused, get, get_path, send, start_gateway, AdminGateway},
};

/// Each request is charged `--cost` units: 10 a minute at 4 a request admits two.
#[test]
fn each_request_is_charged_its_cost() {
    let gw = start_gateway(&["--limit", "10", "--per", "1m", "--cost", "4"]);
    let answers: Vec<(u16, String)> = (0..3).map(|_| get(gw.addr, "")).collect();
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 429]);
    assert!(
        answers[1].1.contains("ratelimit: \"default\";r=2;"),
        "{}",
        answers[1].1
    );
}

/// `cost` in the limits file is a limit setting: a reload changes it for the next request.
#[test]
fn a_reload_changes_the_cost() {
    let dir = TempDir::new("cost");
    let file = dir.0.join("limits.toml");
    let text =
        |cost: u32| format!("key = \"header:x-k\"\nlimit = 10\nper = \"1m\"\ncost = {cost}\n");
    rename_into_place(&file, &text(5));
    let gw = AdminGateway::start(&["--config", file.to_str().unwrap()]);
    let call = |k: &str| send(gw.addr, "GET", "/", &[("x-k", k)]).status;
    let statuses: Vec<u16> = (0..3).map(|_| call("a")).collect();
    assert_eq!(statuses, [200, 200, 429], "10 a minute at 5 a request");
    rename_into_place(&file, &text(1));
    gw.wait_lines("config reloaded", 1, Duration::from_secs(10));
    let statuses: Vec<u16> = (0..11).map(|_| call("b")).collect();
    assert_eq!(statuses[9..], [200, 429], "10 a minute at 1 a request");
    // A cost no key can pay is refused; the one in force stays.
    rename_into_place(&file, &text(11));
    let log = gw.wait_lines("config refused", 1, Duration::from_secs(10));
    assert!(
        log.contains("--cost 11 is more than a key ever holds (10)"),
        "{log}"
    );
    assert_eq!(call("c"), 200);
}

/// A cost of 0, a cost no key can pay, a settlement header without an upstream or that is
/// not a header name: each refused at start-up, naming the flag.
#[test]
fn costs_and_settlements_that_cannot_work_are_refused() {
    assert_refused(
        &["--cost", "0"],
        "--cost: \"0\" is not a whole number of units, at least 1",
    );
    assert_refused(
        &["--limit", "10", "--cost", "11"],
        "--cost 11 is more than a key ever holds (10): every request would be refused",
    );
    assert_refused(
        &["--settle-header", "x-usage"],
        "--settle-header NAME settles each charge from the upstream's answer: give --upstream URL",
    );
    assert_refused(
        &[
            "--upstream",
            "http://127.0.0.1:9",
            "--settle-header",
            "x-usage",
            "--unit-lease-ms",
            "100",
        ],
        "--settle-header settles charges in the store: not those answered from --unit-lease-ms",
    );
    assert_refused(
        &["--settle-header", "x usage"],
        "--settle-header: \"x usage\" is not a header name",
    );
}

/// An upstream answering `/usage/{figure}` with status `/{status}` (200 by default) and the
/// header `x-usage: figure` as given (`/usage` alone: an empty value).
fn usage_upstream() -> String {
    use axum::{extract::Path, http::StatusCode, routing::get as route};
    let answer = |status: u16, figure: String| {
        (
            StatusCode::from_u16(status).unwrap(),
            [("x-usage", figure)],
            "done",
        )
    };
    let app =
        axum::Router::new()
            .route(
                "/usage",
                route(move || async move { answer(200, String::new()) }),
            )
            .route(
                "/usage/{figure}",
                route(move |Path(figure): Path<String>| async move { answer(200, figure) }),
            )
            .route(
                "/usage/{figure}/{status}",
                route(
                    move |Path((figure, status)): Path<(String, u16)>| async move {
                        answer(status, figure)
                    },
                ),
            );
    format!("http://{}", crate::proxy::upstream(app))
}

/// A settling gateway in front of [`usage_upstream`]: `limit` an hour per client, each
/// request charged `cost` first, with `more` flags.
fn settling(limit: u32, cost: u32, more: &[&str]) -> crate::servers::gateway::Gateway {
    let upstream = usage_upstream();
    let (limit, cost) = (limit.to_string(), cost.to_string());
    let mut args = vec![
        "--upstream",
        &upstream,
        "--limit",
        &limit,
        "--per",
        "1h",
        "--cost",
        &cost,
        "--settle-header",
        "x-usage",
    ];
    args.extend_from_slice(more);
    start_gateway(&args)
}

/// Ten answers each settling 100 units spend a budget of 1,000, though each was admitted at
/// 10; a hundred answers settling 1 unit pass a budget their estimates of 50 would have spent.
#[test]
fn answers_settle_their_charge_to_the_upstreams_figure() {
    let gw = settling(1000, 10, &[]);
    let statuses: Vec<u16> = (0..11)
        .map(|_| get_path(gw.addr, "/usage/100", "").0)
        .collect();
    assert_eq!(statuses[..10], [200; 10]);
    assert_eq!(statuses[10], 429, "10 x 100 units spent the 1,000");
    let gw = settling(1000, 50, &[]);
    let statuses: Vec<u16> = (0..100)
        .map(|_| get_path(gw.addr, "/usage/1", "").0)
        .collect();
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
}

/// A charge settled past the limit is a debt: the next request is refused with a
/// `Retry-After` covering it (10 an hour, one answer of 50 units: 40 units past, 4 hours).
#[test]
fn a_settlement_past_the_limit_is_a_debt_the_next_request_waits_out() {
    let gw = settling(10, 1, &[]);
    assert_eq!(get_path(gw.addr, "/usage/50", "").0, 200);
    let (status, head) = get_path(gw.addr, "/usage/1", "");
    assert_eq!(status, 429, "{head}");
    let retry: u64 = head
        .lines()
        .find_map(|l| l.strip_prefix("retry-after: "))
        .unwrap_or_else(|| panic!("{head}"))
        .trim()
        .parse()
        .unwrap();
    // 41 units to wait for at 10 an hour: 4.1 hours (give a minute for a loaded machine).
    assert!(
        (4 * 3600..=41 * 360 + 60).contains(&retry),
        "{retry}: {head}"
    );
}

/// A figure that is not a whole number (negative, a word, an exponent, too long, empty)
/// keeps the first charge, and the gateway goes on answering.
#[test]
fn hostile_figures_keep_the_first_charge() {
    let gw = settling(100, 10, &[]);
    let figures = [
        "-500",
        "abc",
        "1e9",
        "12345678901234567890",
        "",
        "7.5",
        "0x10",
        "+5",
    ];
    for (i, figure) in figures.iter().enumerate() {
        let path = match figure {
            &"" => "/usage".to_owned(),
            f => format!("/usage/{f}"),
        };
        let (status, head) = get_path(gw.addr, &path, "");
        assert_eq!(status, 200, "{figure}: {head}");
        let remaining = 100 - 10 * (i + 1);
        assert!(
            head.contains(&format!(";r={remaining};")),
            "{figure:?} kept the estimate of 10: {head}"
        );
    }
}

/// With `--count-only`, an answer not counted gives its whole charge back; a counted one is
/// settled to its figure.
#[test]
fn with_count_only_an_uncounted_answer_gives_all_back_and_a_counted_one_settles() {
    let gw = settling(100, 10, &["--count-only", "2xx"]);
    assert_eq!(get_path(gw.addr, "/usage/30/500", "").0, 500);
    assert_eq!(get_path(gw.addr, "/usage/30", "").0, 200);
    // Each answer's fields say what is left once it is settled.
    let (_, head) = get_path(gw.addr, "/usage/1", "");
    assert!(head.contains(";r=69;"), "100 - 30 - 1: {head}");
}

/// Two gateways on one Redis: what one settles, the other sees at once.
#[test]
fn a_settlement_on_one_gateway_holds_on_another() {
    let redis = crate::servers::RedisServer::start();
    let url = redis.url();
    let a = settling(100, 10, &["--redis", &url]);
    let b = settling(100, 10, &["--redis", &url]);
    assert_eq!(get_path(a.addr, "/usage/95", "").0, 200);
    let (status, head) = get_path(b.addr, "/usage/1", "");
    assert_eq!(status, 429, "95 settled on a, 10 asked on b: {head}");
}
