//! The gateway's life as a process: `--help` and `--version`, a refusal's exit code, `SIGHUP`
//! without a file to reload, and `SIGTERM`'s drain.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::servers::gateway::{gateway_bin, get, get_path, start_gateway_with_stderr};

/// How `child` ended, waited for at most 30 s (else the test fails with `why`).
fn exited(child: &mut std::process::Child, why: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(exit) = child.try_wait().unwrap() {
            return exit;
        }
        assert!(Instant::now() < deadline, "{why}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` (`HUP`, `TERM`) to the process `pid`, with the system's `kill`.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

#[test]
fn help_and_version_print_on_stdout_and_exit_0() {
    for flag in ["--help", "-h"] {
        let out = Command::new(gateway_bin()).arg(flag).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{flag}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.starts_with("usage: gateway "), "{flag}: {stdout}");
        assert!(stdout.contains("[--drain-ms N]"), "{stdout}");
        assert!(out.stderr.is_empty(), "{flag}: {:?}", out.stderr);
        // Every flag the usage names has a line of its own below it, with what it does.
        let (usage, lines) = stdout.split_once("\n\n").unwrap();
        let flags: std::collections::BTreeSet<&str> = usage
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .collect();
        assert!(flags.len() > 40, "{flags:?}");
        for flag in flags {
            let line = lines
                .lines()
                .find(|l| l.trim_start().split([' ', ',']).any(|w| w == flag))
                .unwrap_or_else(|| panic!("{flag} has no line in the help:\n{stdout}"));
            assert!(line.split_once(flag).unwrap().1.trim().len() > 10, "{line}");
        }
    }
    let out = Command::new(gateway_bin())
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("gateway {}\n", env!("CARGO_PKG_VERSION"))
    );
    // A flag it does not know is still a refusal: the reason and the usage on stderr, exit 2.
    let out = Command::new(gateway_bin()).arg("--nope").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: unknown flag --nope\nusage: gateway "),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

/// A fleet-wide reload signal reaches gateways started without `--config`: each logs it and
/// goes on serving.
#[test]
fn sighup_without_a_config_file_is_logged_and_ignored() {
    let dir = std::env::temp_dir().join(format!("gw-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("stderr.log");
    let mut gw =
        start_gateway_with_stderr(&["--limit", "100"], std::fs::File::create(&log).unwrap());
    for _ in 0..3 {
        signal(gw.child.id(), "HUP");
    }
    // Still serving (a request after the signals were delivered), still running.
    assert_eq!(get(gw.addr, "").0, 200);
    assert!(
        gw.child.try_wait().unwrap().is_none(),
        "the gateway ended on SIGHUP"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.contains("SIGHUP ignored: no --config file to reload") {
            // Three signals within a second or so: at most a line a second.
            assert!(text.matches("SIGHUP ignored").count() <= 3, "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "SIGHUP was not logged: {text}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get(gw.addr, "").0, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `SIGTERM` stops the gateway the way a rolling deploy needs: it stops accepting, the request
/// in flight gets its answer, and the process exits 0.
#[test]
fn sigterm_lets_the_request_in_flight_finish_then_exits_0() {
    let mut gw = start_gateway_with_stderr(&["--limit", "100"], Stdio::null());
    let addr = gw.addr;
    // A request that takes 3 s, sent before the signal.
    let in_flight = std::thread::spawn(move || get_path(addr, "/sleep/3000", ""));
    // Its request is on the gateway's side before the signal is sent: a second, for the
    // gateway to read it (the handler then sleeps 3 s, well past the signal).
    std::thread::sleep(Duration::from_secs(1));
    signal(gw.child.id(), "TERM");
    let (status, _) = in_flight.join().unwrap();
    assert_eq!(status, 200, "the request in flight was cut");
    let exit = exited(&mut gw.child, "the gateway did not exit after SIGTERM");
    assert_eq!(exit.code(), Some(0));
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "still accepting after it exited"
    );
}

/// Past `--drain-ms`, the gateway exits 0 without waiting for a request that takes longer.
#[test]
fn a_request_longer_than_the_drain_time_does_not_hold_the_exit() {
    let mut gw = start_gateway_with_stderr(&["--drain-ms", "200"], Stdio::null());
    let addr = gw.addr;
    let _in_flight = std::thread::spawn(move || {
        let _ = std::panic::catch_unwind(|| get_path(addr, "/sleep/60000", ""));
    });
    std::thread::sleep(Duration::from_secs(1));
    signal(gw.child.id(), "TERM");
    // The request would hold it a minute; the drain time is 200 ms.
    let exit = exited(&mut gw.child, "the gateway waited past its drain time");
    assert_eq!(exit.code(), Some(0));
}

/// The command line takes `--flag=value` as `--flag value`, applies repeated flags in order
/// (the last wins), and refuses a flag without its value.
#[test]
fn flags_read_with_equals_and_in_order_and_a_missing_value_is_refused() {
    let gw = start_gateway_with_stderr(
        &["--limit=5", "--per=1h", "--key=global", "--limit", "1"],
        Stdio::null(),
    );
    assert_eq!(get(gw.addr, "").0, 200);
    assert_eq!(get(gw.addr, "").0, 429, "the last --limit is in force");
    let out = Command::new(gateway_bin()).arg("--limit").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: --limit needs a value\nusage: gateway "),
        "{stderr}"
    );
}

/// Past `--drain-ms`, a request cut off gives its concurrency slot back to the store before
/// the gateway exits: a gateway started afterwards on the same Redis serves the key at once,
/// although the slot's lease (30 s) has not run out.
#[test]
fn a_request_cut_off_by_the_drain_gives_its_concurrency_slot_back() {
    let redis = crate::servers::RedisServer::start();
    let url = redis.url();
    let args = [
        "--redis",
        &url,
        "--key",
        "global",
        "--limit",
        "1000",
        "--concurrency",
        "1",
        "--lease-ms",
        "30000",
        "--timeout-ms",
        "2000",
    ];
    let mut gw =
        start_gateway_with_stderr(&[&args[..], &["--drain-ms", "200"]].concat(), Stdio::null());
    let addr = gw.addr;
    let sleeper = move || {
        std::thread::spawn(move || {
            let _ = std::panic::catch_unwind(|| get_path(addr, "/sleep/60000", ""));
        })
    };
    // A sleeper holds the key's one slot: another request is refused. (A sleeper that came
    // while a probe held the slot was refused and ended: another one is sent.)
    let mut in_flight = sleeper();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        if in_flight.is_finished() {
            in_flight = sleeper();
            continue;
        }
        if get(addr, "").0 == 429 {
            break;
        }
        assert!(Instant::now() < deadline, "no sleeper held the slot");
    }
    signal(gw.child.id(), "TERM");
    let exit = exited(&mut gw.child, "the gateway did not exit");
    assert_eq!(exit.code(), Some(0));
    let next = start_gateway_with_stderr(&args, Stdio::null());
    assert_eq!(
        get(next.addr, "").0,
        200,
        "the cut-off request's slot is still held"
    );
}

/// `--threads 1` serves on one thread (as `--threads 4` on four); a count outside 1 to 1024 is
/// refused, and so is the key in a limits file (it stays a flag).
#[test]
fn threads_set_the_serving_threads_and_stay_a_flag() {
    for threads in ["1", "4"] {
        let gw = start_gateway_with_stderr(
            &[
                "--threads",
                threads,
                "--key",
                "global",
                "--limit",
                "1",
                "--per",
                "1h",
            ],
            Stdio::null(),
        );
        assert_eq!(get(gw.addr, "").0, 200, "--threads {threads}");
        assert_eq!(get(gw.addr, "").0, 429, "--threads {threads}");
    }
    for bad in ["0", "1025", "x"] {
        crate::servers::gateway::assert_refused(&["--threads", bad], "--threads");
    }
    let dir = std::env::temp_dir().join(format!("gw-threads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("limits.toml");
    std::fs::write(&file, "limit = 5\nthreads = 1\n").unwrap();
    crate::servers::gateway::assert_refused(
        &["--config", file.to_str().unwrap()],
        "--threads stays a flag",
    );
    let _ = std::fs::remove_dir_all(&dir);
}
