//! The `hot-allowed` workload: one key far below its limit, served by four instances sharing
//! one Redis (a big tenant behind a load balancer), where unit leases pay. Its contenders
//! (built by [`contenders::hot_allowed`](crate::contenders::hot_allowed)) run only here, in
//! rounds interleaved like the main table's, and get a table of their own.

use std::fmt::Write;

use tower_redis_ratelimit::redis;

use crate::{
    contenders::{Contender, HOT_ALLOWED_INSTANCES, HOT_ALLOWED_PER_SECOND, LEASE_LIFETIME},
    redis_stats, round, summarize, Config, Summary, Workload,
};

/// Runs every contender on `hot-allowed` and returns the Markdown section.
pub async fn run(
    config: &Config,
    info: &mut redis::Connection,
    contenders: &[Contender],
) -> String {
    let mut rounds: Vec<Vec<_>> = contenders.iter().map(|_| Vec::new()).collect();
    for r in 0..config.rounds {
        for (i, contender) in contenders.iter().enumerate() {
            let (commands_before, cpu_before) = redis_stats(info);
            let inner_before = contender
                .inner_calls
                .as_ref()
                .map_or(0, |n| n.load(std::sync::atomic::Ordering::Relaxed));
            let mut round = round(
                &contender.check,
                Workload::HotAllowed,
                config.tasks,
                config.secs,
            )
            .await;
            let (commands_after, cpu_after) = redis_stats(info);
            round.redis_commands = commands_after - commands_before;
            round.redis_cpu_us = cpu_after - cpu_before;
            round.inner_calls = contender
                .inner_calls
                .as_ref()
                .map_or(0, |n| n.load(std::sync::atomic::Ordering::Relaxed))
                - inner_before;
            eprintln!(
                "hot-allowed round {}/{}: {:>10.0} checks/s  {}",
                r + 1,
                config.rounds,
                round.checks_per_sec,
                contender.name
            );
            rounds[i].push(round);
        }
    }
    let results: Vec<Summary> = rounds
        .into_iter()
        .zip(contenders)
        .map(|(rs, c)| summarize(rs, c))
        .collect();
    markdown(contenders, &results)
}

fn markdown(contenders: &[Contender], results: &[Summary]) -> String {
    let find = |name: &str| contenders.iter().position(|c| c.name == name);
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "\n## hot-allowed: one key far below its limit, {HOT_ALLOWED_INSTANCES} instances sharing one Redis\n");
    let _ = writeln!(
        w,
        "Every check on one key with a quota of {HOT_ALLOWED_PER_SECOND} per second (burst \
         4,000,000,000) for ours and tower_governor: all allowed. tower-rate-limit-redis takes \
         at most 1,000 per second with a burst of 65,535, so its key moves on every 50,000 \
         checks (one hot key at a time, all allowed). Each contender is {HOT_ALLOWED_INSTANCES} instances (each ours \
         on its own `RedisStore` connection, each peer layer on its own connection), the \
         checks spread over them round-robin. `leased`: `RateLimiterBuilder::lease(UnitLease::\
         up_to({LEASE_LIFETIME:?}))`. tower_governor counts in memory, per instance: it is not \
         a shared limit and is listed for scale only.\n"
    );
    let _ = writeln!(
        w,
        "| contender | checks/s median (min–max) | p50 µs | p99 µs | allowed | inner \
         calls/check | Redis cmds/check | Redis CPU µs/check | vs baseline |"
    );
    let _ = writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for (c, s) in contenders.iter().zip(results) {
        let vs = c
            .baseline
            .as_deref()
            .and_then(|b| Some((b, find(b)?)))
            .map_or_else(
                || "–".to_owned(),
                |(b, i)| format!("{:.2}× {b}", s.median / results[i].median.max(1.0)),
            );
        let opt =
            |v: Option<f64>, d: usize| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.d$}"));
        let _ = writeln!(
            w,
            "| {} | {:.0} ({:.0}–{:.0}) | {} | {} | {:.3} | {} | {} | {} | {} |",
            c.name,
            s.median,
            s.min,
            s.max,
            s.p50_us,
            s.p99_us,
            s.allowed_fraction,
            opt(s.inner_calls_per_check, 3),
            opt(s.commands_per_check, 4),
            opt(s.redis_cpu_us_per_check, 2),
            vs
        );
    }
    md
}
