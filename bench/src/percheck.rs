//! CPU per check of the in-memory contenders, less sensitive than checks/s to the noise of a
//! shared machine (time the process waits for a core is not counted): one contender, a fixed
//! number of checks on the `spread` workload (or `hot`), on one thread or on `WORKERS` threads with 64
//! tasks as `compare` runs them (then contention between cores, on atomics and locks, shows).
//! `perf stat -e task-clock` divided by the count is the contender's CPU per check; the loop,
//! the key's `format!` and the request are the same for all of them.
//!
//! ```text
//! cargo build --release -p tower-redis-ratelimit-bench --bin percheck
//! perf stat -e task-clock target/release/percheck "ours memory gcra layer" 2000000 2
//! ```

#[allow(dead_code)] // the Redis contenders are not run here
mod contenders;

use contenders::Contenders;

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args
        .next()
        .expect("usage: percheck CONTENDER [CHECKS [WORKERS [spread|hot]]]");
    let checks: u64 = args
        .next()
        .map_or(2_000_000, |n| n.parse().expect("CHECKS"));
    let workers: usize = args.next().map_or(1, |n| n.parse().expect("WORKERS"));
    // `hot`: every check on one key, far over its limit (as `compare`'s `hot`).
    let hot = match args.next().as_deref() {
        None | Some("spread") => false,
        Some("hot") => true,
        Some(other) => panic!("workload {other:?}: expected spread or hot"),
    };
    let mut c = Contenders::new(vec![]);
    contenders::tower_governor(&mut c, "tower_governor layer");
    contenders::governor_check_key(&mut c, "tower_governor limiter check_key");
    contenders::ours_memory(&mut c, "-", "-");
    let contender = c
        .into_vec()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no in-memory contender named {name:?}"));
    let check = contender.check;
    let allowed = if workers == 1 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(checks_in_a_loop(check, checks, 0, hot))
    } else {
        // As `compare` runs them: 64 tasks on `workers` threads.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let tasks: Vec<_> = (0..64)
                .map(|t| tokio::spawn(checks_in_a_loop(check.clone(), checks / 64, t + 1, hot)))
                .collect();
            let mut allowed = 0;
            for t in tasks {
                allowed += t.await.unwrap();
            }
            allowed
        })
    };
    println!("{name}: {checks} checks on {workers} thread(s), {allowed} allowed");
}

/// `checks` checks of keys drawn from 100,000 ids, as `compare`'s `spread`, or of one key.
async fn checks_in_a_loop(check: contenders::CheckFn, checks: u64, seed: u64, hot: bool) -> u64 {
    let mut rng = 0x2545_F491_4F6C_DD1D_u64 ^ seed.wrapping_mul(0x9E37_79B9);
    let mut allowed = 0u64;
    for n in 0..checks {
        if n % 64 == 63 {
            tokio::task::yield_now().await;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let key = if hot {
            "hot".to_owned()
        } else {
            format!("id{}", rng % 100_000)
        };
        allowed += u64::from(check(key).await);
    }
    allowed
}
