//! What a request is charged: `--cost N` (a flag, and a limit setting of the `--config` file
//! that a reload changes), and `--settle-header NAME`, which settles the charge to the
//! upstream's figure.

use std::time::Duration;

use crate::{
    gateway::{rename_into_place, TempDir},
    servers::gateway::{assert_refused, get, send, start_gateway, AdminGateway},
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
        &["--settle-header", "x usage"],
        "--settle-header: \"x usage\" is not a header name",
    );
}
