//! `BENCH_PIN=1`: Redis on CPU 0, this process (every contender, the runtime, the harness) on
//! the other CPUs, so that the server and its clients never take CPU time from each other and
//! what a contender saves on either side shows.
//!
//! The pinning uses `taskset` (util-linux): the server is started under `taskset -c 0`, and
//! this process pins its own threads with `taskset -a -p` before the Tokio runtime starts, so
//! every worker thread inherits the CPU set; the runtime then gets one worker per CPU left.

use std::process::Command;

/// Where the server and this process run, when pinned.
#[derive(Clone, Debug)]
pub struct Pinning {
    /// The CPU list of `redis-server` (`taskset -c` syntax).
    pub redis_cpus: String,
    /// The CPU list of this process.
    pub bench_cpus: String,
}

impl Pinning {
    /// `BENCH_PIN=1`: Redis on CPU 0, this process on CPUs 1 and up. Unset or `0`: no
    /// pinning. Panics on a machine with one CPU, or on any other value.
    pub fn from_env() -> Option<Self> {
        match std::env::var("BENCH_PIN").as_deref() {
            Err(_) | Ok("" | "0") => None,
            Ok("1") => {
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                assert!(cpus >= 2, "BENCH_PIN=1 needs at least 2 CPUs, found {cpus}");
                let bench_cpus = if cpus == 2 {
                    "1".to_owned()
                } else {
                    format!("1-{}", cpus - 1)
                };
                Some(Self {
                    redis_cpus: "0".to_owned(),
                    bench_cpus,
                })
            }
            Ok(other) => panic!("BENCH_PIN={other:?}: expected 0 or 1"),
        }
    }

    /// Pins every thread of this process to [`bench_cpus`](Self::bench_cpus). Call it before
    /// any other thread starts, so that the threads started later inherit the CPU set.
    pub fn pin_this_process(&self) {
        let pid = std::process::id().to_string();
        let status = Command::new("taskset")
            .args(["-a", "-p", "-c", &self.bench_cpus, &pid])
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("BENCH_PIN=1 needs `taskset` (util-linux): {e}"));
        assert!(
            status.success(),
            "taskset -a -p -c {} failed",
            self.bench_cpus
        );
    }

    /// The command starting `bin` on [`redis_cpus`](Self::redis_cpus). `taskset` execs
    /// `bin`, so the child's PID is the server's.
    pub fn command(&self, bin: &str) -> Command {
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", &self.redis_cpus, bin]);
        cmd
    }

    /// How the machine line describes it.
    pub fn describe(&self) -> String {
        format!(
            "pinned: redis-server on CPU {}, the benchmark on CPU {}",
            self.redis_cpus, self.bench_cpus
        )
    }
}
