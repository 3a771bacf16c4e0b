//! The Markdown report.

use std::fmt::Write;

use crate::{contenders::Contender, Config, Summary, GOVERNOR, GOVERNOR_CHECK, TRLR, WORKLOADS};

/// Named comparisons: (contender, baseline). A pair is left out when the filter dropped
/// either side.
pub const HEAD_TO_HEAD: &[(&str, &str)] = &[
    ("ours gcra layer (multiplexed)", TRLR),
    ("ours gcra layer (multiplexed, deny cache off)", TRLR),
    ("ours gcra layer (bb8)", TRLR),
    (TRLR, "raw gcra script (multiplexed)"),
    (
        "ours gcra layer (multiplexed, deny cache off)",
        "raw gcra script (multiplexed)",
    ),
    (
        "ours token-bucket layer (multiplexed, deny cache off)",
        "raw token-bucket script (multiplexed)",
    ),
    (
        "ours sliding-window layer (multiplexed, deny cache off)",
        "raw sliding-window script (multiplexed)",
    ),
    (
        "ours gcra layer (bb8, deny cache off)",
        "raw gcra script (bb8)",
    ),
    ("ours memory gcra layer", GOVERNOR),
    ("ours memory gcra layer (deny cache off)", GOVERNOR),
    ("ours memory gcra check", GOVERNOR_CHECK),
    ("ours memory gcra check (deny cache off)", GOVERNOR_CHECK),
    (
        "ours gcra layer (batched, deny cache off)",
        "tower-rate-limit-redis layer",
    ),
    (
        "ours gcra layer (batched, deny cache off)",
        "ours gcra layer (multiplexed, deny cache off)",
    ),
    (
        "ours sliding-window layer (batched, deny cache off)",
        "ours sliding-window layer (multiplexed, deny cache off)",
    ),
];

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "–".to_owned()
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
}

pub fn markdown(
    machine: &str,
    config: &Config,
    contenders: &[Contender],
    results: &[Vec<Summary>],
) -> String {
    let find = |name: &str| contenders.iter().position(|c| c.name == name);
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "# tower-redis-ratelimit against peer crates\n");
    let _ = writeln!(
        w,
        "Command (from the workspace root): `{}BENCH_SECS={} BENCH_ROUNDS={} BENCH_TASKS={}{} \
         cargo run --release -p tower-redis-ratelimit-bench --bin compare`\n",
        if config.pin.is_some() {
            "BENCH_PIN=1 "
        } else {
            ""
        },
        config.secs,
        config.rounds,
        config.tasks,
        if config.filter.is_empty() {
            String::new()
        } else {
            format!(" BENCH_FILTER='{}'", config.filter.join(","))
        }
    );
    let _ = writeln!(w, "Machine: {machine}.\n");
    let _ = writeln!(
        w,
        "{tasks} tokio tasks call one contender in a loop for {secs} s per round, contenders \
         interleaved round by round; the median round with the min–max range over {rounds} \
         rounds. Every contender has the same quota: {q} per second per key, burst {q}. `hot`: \
         every task on one key, far over its limit; `spread`: keys drawn from 100,000 ids \
         (nearly all allowed). Latency is per check (p50/p99, µs, hdrhistogram). \
         `inner calls/check`: how often a layer called its inner service per check (a layer \
         that calls it only for allowed requests shows the `allowed` value). `Redis \
         cmds/check`: the `INFO commandstats` delta per check, counting the commands run \
         inside scripts. `Redis CPU µs/check`: the server's CPU time (user + system, \
         `INFO cpu`) per check: with one Redis near 100% of a core, what bounds checks/s. \
         `client CPU µs/check`: this process' CPU time (user + system, from `/proc/self/stat`, \
         10 ms ticks) per check: the contender's client side, plus the harness' loop (the same \
         for every contender). `vs baseline`: median checks/s divided by the named contender's. \
         Figures are from one run on a shared machine: compare rows of the same run.\n",
        tasks = config.tasks,
        secs = config.secs,
        rounds = config.rounds,
        q = crate::contenders::PER_SECOND,
    );
    let _ = writeln!(
        w,
        "| contender | workload | checks/s median (min–max) | p50 µs | p99 µs | allowed | \
         inner calls/check | Redis cmds/check | Redis CPU µs/check | client CPU µs/check | \
         vs baseline |"
    );
    let _ = writeln!(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for (wi, workload) in WORKLOADS.iter().enumerate() {
        for (c, s) in contenders.iter().zip(results) {
            let s = &s[wi];
            let vs = c
                .baseline
                .as_deref()
                .and_then(|b| Some((b, find(b)?)))
                .map_or_else(
                    || "–".to_owned(),
                    |(b, i)| format!("{} {b}", ratio(s.median, results[i][wi].median)),
                );
            let _ = writeln!(
                w,
                "| {} | {} | {:.0} ({:.0}–{:.0}) | {} | {} | {:.3} | {} | {} | {} | {:.2} | {} |",
                c.name,
                workload.name(),
                s.median,
                s.min,
                s.max,
                s.p50_us,
                s.p99_us,
                s.allowed_fraction,
                opt(s.inner_calls_per_check, 3),
                opt(s.commands_per_check, 2),
                opt(s.redis_cpu_us_per_check, 2),
                s.client_cpu_us_per_check,
                vs,
            );
        }
    }
    let pairs: Vec<(usize, usize)> = HEAD_TO_HEAD
        .iter()
        .filter_map(|(a, b)| Some((find(a)?, find(b)?)))
        .collect();
    if !pairs.is_empty() {
        let _ = writeln!(w, "\n## Head to head (median checks/s, ratio)\n");
        let _ = writeln!(w, "| contender | baseline | hot | spread |");
        let _ = writeln!(w, "|---|---|---:|---:|");
        for (a, b) in pairs {
            let cell = |wi: usize| {
                format!(
                    "{} ({:.0} vs {:.0})",
                    ratio(results[a][wi].median, results[b][wi].median),
                    results[a][wi].median,
                    results[b][wi].median
                )
            };
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} |",
                contenders[a].name,
                contenders[b].name,
                cell(0),
                cell(1)
            );
        }
    }
    let _ = writeln!(
        w,
        "\nChart: `compare.svg` (checks/s per contender, hot and spread side by side, log \
         scale). Contenders and their configuration: `bench/README.md`."
    );
    md
}
