//! Reloads of `--config`'s file: on `SIGHUP` and when it changes, once it has settled.

use super::*;
use std::sync::atomic::{AtomicU32, Ordering};

/// The metric counting the limits file's reloads, by result (`ok`, `refused`).
pub(crate) const CONFIG_RELOADS: &str = "ratelimit_config_reloads_total";

/// Describes the reload counter and registers both results at 0.
fn register_reloads() {
    metrics::describe_counter!(
        CONFIG_RELOADS,
        "Reloads of the gateway's limits file, by result (ok: in force; refused: the running limits stay)."
    );
    for result in ["ok", "refused"] {
        metrics::counter!(CONFIG_RELOADS, "result" => result).increment(0);
    }
}

/// Puts the file's new text in force, or says why not (the running limits stay). One stderr
/// line either way. Runs off the async runtime: a file of many plans takes its time.
pub(crate) fn reload(
    base: &Args,
    path: &str,
    text: Result<String, FileError>,
    running: &mut Args,
    live: &LiveLimits,
    cost: &AtomicU32,
) {
    let outcome = text
        .map_err(|e| format!("--config {path}: {e}"))
        .and_then(|text| with_text(base, path, &text))
        .and_then(|next| {
            for ((field, now), (_, then)) in fixed(running).iter().zip(fixed(&next).iter()) {
                if now != then {
                    return Err(format!(
                        "{field} cannot change without a restart ({now} in force, {then} in the file)"
                    ));
                }
            }
            cost_fits(&next).map_err(|e| e.to_string())?;
            live.replace(limits_of(&next)).map_err(|e| e.to_string())?;
            cost.store(next.cost, Ordering::Relaxed);
            Ok(next)
        });
    match outcome {
        Ok(next) => {
            *running = next;
            metrics::counter!(CONFIG_RELOADS, "result" => "ok").increment(1);
            let shadow = if running.shadow { ", shadow on" } else { "" };
            let delay = match running.delay_up_to {
                Some(max) => format!(", delay up to {max:?}"),
                None => String::new(),
            };
            eprintln!(
                "config reloaded: {path}: limit {}{shadow}{delay}",
                quota_text(&quota_of(running), running.calendar)
            );
        }
        Err(reason) => {
            metrics::counter!(CONFIG_RELOADS, "result" => "refused").increment(1);
            eprintln!("config refused: {reason}");
        }
    }
}

/// How often the watched file is looked at.
pub(crate) const LOOK_EVERY: Duration = Duration::from_millis(50);

/// Reloads the file on SIGHUP and when it changes, once it has settled (its size and
/// modification time unchanged across two looks 100 ms apart, see `FileWatch`), for as long
/// as the gateway runs. Each look, read and check runs on tokio's blocking threads, never on
/// the threads that serve requests.
pub(crate) fn watch(
    base: Args,
    path: String,
    file: FileWatch,
    running: Args,
    (live, cost): (LiveLimits, Arc<AtomicU32>),
) {
    register_reloads();
    // Taken here, before the gateway says where it listens: a SIGHUP sent right after that
    // line finds it (the signal's default action would end the process).
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("config: no SIGHUP reloads ({e}); the file is still watched");
            None
        }
    };
    tokio::spawn(async move {
        let fixed = Arc::new((base, path, live, cost));
        let mut state = Some((file, running));
        let mut tick = tokio::time::interval(LOOK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let signalled = tokio::select! {
                Some(()) = async { match &mut hangup { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
                _ = tick.tick() => false,
            };
            let Some((mut file, mut running)) = state.take() else {
                return;
            };
            if signalled {
                file.ask();
            }
            let fixed = Arc::clone(&fixed);
            let looked = tokio::task::spawn_blocking(move || {
                if let Look::Read(text) = file.look(std::time::Instant::now()) {
                    let (base, path, live, cost) = &*fixed;
                    reload(base, path, text, &mut running, live, cost);
                }
                (file, running)
            })
            .await;
            match looked {
                Ok(next) => state = Some(next),
                Err(e) => {
                    eprintln!("config: reloads stopped ({e})");
                    return;
                }
            }
        }
    });
}
