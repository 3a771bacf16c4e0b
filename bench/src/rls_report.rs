//! scripts/bench-rls' Markdown: the machine line, a row per workload and contender (each
//! column the median of its rounds; decisions/s with the rounds' range), and the ratios
//! against issue 38's targets.

use std::fmt::Write as _;

use crate::{Config, Contender, Run, CONTENDERS, WORKLOADS};

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A row's medians.
struct Row {
    rate: f64,
    rate_min: f64,
    rate_max: f64,
    server_us: Option<f64>,
    per_core: Option<f64>,
    redis_us: f64,
    redis_commands: f64,
    p50_ms: f64,
    p99_ms: f64,
    ok: f64,
    failed: u64,
}

fn row(runs: &[Run]) -> Row {
    let rates: Vec<f64> = runs
        .iter()
        .map(|r| r.measured.decisions as f64 / r.measured.secs)
        .collect();
    let per_decision = |cpu: f64, r: &Run| cpu * 1e6 / r.measured.decisions.max(1) as f64;
    let server: Option<Vec<(f64, f64)>> = runs
        .iter()
        .map(|r| {
            r.server_cpu.map(|cpu| {
                (
                    per_decision(cpu, r),
                    r.measured.decisions as f64 / cpu.max(1e-9),
                )
            })
        })
        .collect();
    Row {
        rate: median(rates.clone()),
        rate_min: rates.iter().copied().fold(f64::INFINITY, f64::min),
        rate_max: rates.iter().copied().fold(0.0, f64::max),
        server_us: server
            .as_ref()
            .map(|s| median(s.iter().map(|x| x.0).collect())),
        per_core: server.map(|s| median(s.iter().map(|x| x.1).collect())),
        redis_us: median(runs.iter().map(|r| per_decision(r.redis_cpu, r)).collect()),
        redis_commands: median(
            runs.iter()
                .map(|r| r.redis_commands as f64 / r.measured.decisions.max(1) as f64)
                .collect(),
        ),
        p50_ms: median(
            runs.iter()
                .map(|r| r.measured.latency.value_at_quantile(0.5) as f64 / 1000.0)
                .collect(),
        ),
        p99_ms: median(
            runs.iter()
                .map(|r| r.measured.latency.value_at_quantile(0.99) as f64 / 1000.0)
                .collect(),
        ),
        ok: median(
            runs.iter()
                .map(|r| {
                    let m = &r.measured;
                    m.ok as f64 / (m.decisions + m.failed).max(1) as f64
                })
                .collect(),
        ),
        failed: runs.iter().map(|r| r.measured.failed).sum(),
    }
}

fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn or_dash(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map_or_else(|| "—".to_owned(), f)
}

pub fn table(config: &Config, redis_version: &str, runs: &[Vec<Vec<Run>>]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}\n", crate::machine_line(config, redis_version));
    out += "| workload | contender | decisions/s median (min–max) | descriptors/s | server CPU µs/decision | decisions/s per server core | Redis CPU µs/decision | Redis commands/decision | p50 ms | p99 ms | OK |\n";
    out += "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    let rows: Vec<Vec<Option<Row>>> = runs
        .iter()
        .map(|w| w.iter().map(|c| (!c.is_empty()).then(|| row(c))).collect())
        .collect();
    let mut failed = 0;
    for (w, workload) in WORKLOADS.iter().enumerate() {
        for (c, contender) in CONTENDERS.iter().enumerate() {
            if let Some(reason) = crate::skipped(*contender, workload) {
                let _ = writeln!(
                    out,
                    "| {} | {} | {reason} | | | | | | | | |",
                    workload.name,
                    contender.name()
                );
                continue;
            }
            let r = rows[w][c].as_ref().expect("run");
            failed += r.failed;
            let bare = *contender == Contender::Bare;
            let _ = writeln!(
                out,
                "| {} | {} | {} ({}–{}) | {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {} |",
                workload.name,
                contender.name(),
                thousands(r.rate),
                thousands(r.rate_min),
                thousands(r.rate_max),
                thousands(r.rate * workload.keys.len() as f64),
                or_dash(r.server_us, |x| format!("{x:.1}")),
                or_dash(r.per_core, thousands),
                r.redis_us,
                r.redis_commands,
                r.p50_ms,
                r.p99_ms,
                if bare {
                    "—".to_owned()
                } else {
                    format!("{:.1}%", r.ok * 100.0)
                },
            );
        }
    }
    if failed > 0 {
        let _ = writeln!(
            out,
            "\n{failed} calls failed (an error or `UNKNOWN`): not counted as decisions."
        );
    }
    out += &ratios(&rows);
    out
}

fn ratios(rows: &[Vec<Option<Row>>]) -> String {
    let index = |c: Contender| CONTENDERS.iter().position(|&x| x == c).unwrap();
    let (ours, lim, cached, bare) = (
        index(Contender::Ours),
        index(Contender::Limitador),
        index(Contender::LimitadorCached),
        index(Contender::Bare),
    );
    let mut out = String::from(
        "\n| workload | decisions/s per server core, ours / limitador (target ≥ 2) | Redis CPU per decision, ours / limitador (target ≤ 1) | Redis CPU per decision, ours / bare pipeline (target ≤ 2) | decisions/s, ours / limitador | decisions/s per server core, ours / limitador cached |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for (w, workload) in WORKLOADS.iter().enumerate() {
        let r = |c: usize| rows[w][c].as_ref();
        let (Some(o), Some(l), Some(b)) = (r(ours), r(lim), r(bare)) else {
            continue;
        };
        let core = |row: &Row| row.per_core.unwrap_or(f64::NAN);
        let _ = writeln!(
            out,
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            workload.name,
            core(o) / core(l),
            o.redis_us / l.redis_us,
            o.redis_us / b.redis_us,
            o.rate / l.rate,
            r(cached).map_or_else(|| "—".to_owned(), |c| format!("{:.2}", core(o) / core(c))),
        );
    }
    out
}
