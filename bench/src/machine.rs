//! The machine description line: date, cores, CPU, OS, rustc, Redis and the crate versions.

use std::process::Command;

use tower_redis_ratelimit::redis;

use crate::Config;

/// `redis_version` from `INFO server`.
pub fn redis_version(conn: &mut redis::Connection) -> String {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(conn)
        .expect("INFO server");
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned()
}

pub fn describe(redis_version: &str, config: &Config) -> String {
    // The machine's, not this process' (which BENCH_PIN=1 narrows).
    let cores = std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.lines().filter(|l| l.starts_with("processor")).count())
        .ok()
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().map(|n| n.get()).ok())
        .unwrap_or(0);
    let pinning = config
        .pin
        .as_ref()
        .map_or_else(|| "not pinned".to_owned(), |p| p.describe());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| std::env::consts::OS.to_owned());
    let rustc = Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.split_whitespace().nth(1).map(|v| format!("rustc {v}")))
        .unwrap_or_else(|| "rustc ?".to_owned());
    let profile = if cfg!(debug_assertions) {
        "DEBUG build (numbers meaningless)"
    } else {
        "release build"
    };
    let v = |name: &str| locked_versions(name).join(" / ");
    format!(
        "{date}; {cores} cores, {cpu}, {os}, {rustc}, {profile}; redis-server {redis_version}; \
         tower-redis-ratelimit {ours}, tower-rate-limit-redis {trlr} (redis-rs {redis}), \
         tower_governor {tg} (governor {gov}); {tasks} tasks, {rounds} rounds x {secs} s; {pinning}",
        date = today(),
        ours = v("tower-redis-ratelimit"),
        trlr = v("tower-rate-limit-redis"),
        redis = v("redis"),
        tg = v("tower_governor"),
        gov = v("governor"),
        tasks = config.tasks,
        rounds = config.rounds,
        secs = config.secs,
    )
}

/// Every version of package `name` in the workspace's Cargo.lock (what this binary was built
/// with), e.g. `["0.32.7", "1.8.1"]` for `redis`.
fn locked_versions(name: &str) -> Vec<String> {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock"))
        .unwrap_or_default();
    let wanted = format!("name = \"{name}\"");
    let mut lines = lock.lines();
    let mut versions = Vec::new();
    while let Some(line) = lines.next() {
        if line.trim() == wanted {
            if let Some(v) = lines
                .next()
                .and_then(|l| l.trim().strip_prefix("version = "))
            {
                versions.push(v.trim_matches('"').to_owned());
            }
        }
    }
    if versions.is_empty() {
        versions.push("?".to_owned());
    }
    versions
}

/// Today's date (UTC), `YYYY-MM-DD`.
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
