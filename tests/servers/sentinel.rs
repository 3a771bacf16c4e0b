//! A real Sentinel deployment on loopback: one primary, one replica of it, and three
//! Sentinels (`redis-server FILE --sentinel`) monitoring the primary as [`MASTER`] with a
//! quorum of 2, failing over one second after the primary stops answering.
//!
//! Every process listens on a free 127.0.0.1 port; every PID is recorded under
//! `target/test-redis-pids` like [`RedisServer`]'s and the process is killed by PID on drop.
//! Starting waits (bounded) until every Sentinel names the primary, knows the replica and the
//! two other Sentinels (without which no failover can be agreed on), and panics with each
//! Sentinel's view and log otherwise.

use std::{
    collections::HashMap,
    path::PathBuf,
    process::{Child, Command},
    time::{Duration, Instant},
};

use tower_redis_ratelimit::redis;

use super::{free_port, pid_file, redis_binary, spawn_redis, RedisServer};

/// The master name the Sentinels monitor.
pub const MASTER: &str = "mymaster";

/// How long starting may take: the replica's first sync, then the Sentinels finding the
/// replica (the primary's `INFO`) and each other (hello messages every 2 s).
const READY_LIMIT: Duration = Duration::from_secs(20);

/// One Sentinel process, killed (by PID) and reaped on drop, its directory removed.
pub struct Sentinel {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Sentinel {
    /// Starts a Sentinel monitoring `127.0.0.1:primary_port` with a quorum of 2; retries on
    /// another port when the first one was taken meanwhile.
    fn start(primary_port: u16) -> Self {
        Self::start_with(primary_port, 2, "")
    }

    /// Starts a Sentinel of its own monitoring `127.0.0.1:primary_port` as [`MASTER`] (quorum
    /// 1), logging in to it with `auth_pass` when given. It names that server at once.
    pub fn watching(primary_port: u16, auth_pass: Option<&str>) -> Self {
        let auth = auth_pass
            .map(|pw| format!("sentinel auth-pass {MASTER} {pw}\n"))
            .unwrap_or_default();
        Self::start_with(primary_port, 1, &auth)
    }

    fn start_with(primary_port: u16, quorum: u32, extra: &str) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            match Self::spawn(free_port(), primary_port, quorum, extra) {
                Ok(sentinel) => return sentinel,
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server --sentinel did not come up on 127.0.0.1: {last_error}");
    }

    fn spawn(port: u16, primary_port: u16, quorum: u32, extra: &str) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("trr-sentinel-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // Sentinel rewrites its configuration file (the epoch, the Sentinels and replicas it
        // found), so each one has a writable file of its own.
        let config = dir.join("sentinel.conf");
        let text = format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             daemonize no\n\
             dir {dir}\n\
             logfile {log}\n\
             sentinel monitor {MASTER} 127.0.0.1 {primary_port} {quorum}\n\
             sentinel down-after-milliseconds {MASTER} 1000\n\
             sentinel failover-timeout {MASTER} 5000\n\
             sentinel parallel-syncs {MASTER} 1\n\
             {extra}",
            dir = dir.display(),
            log = dir.join("sentinel.log").display(),
        );
        std::fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
        let child = spawn_redis(
            Command::new(redis_binary()).arg(&config).arg("--sentinel"),
            " FILE --sentinel",
        );
        let mut sentinel = Sentinel { child, port, dir };
        sentinel.wait_pong(Duration::from_secs(10))?;
        Ok(sentinel)
    }

    fn wait_pong(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "sentinel on port {} exited with {status}; log: {}",
                    self.port,
                    self.log_tail()
                ));
            }
            if let Some(mut conn) = self.try_conn() {
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "sentinel on port {} did not answer PING",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn try_conn(&self) -> Option<redis::Connection> {
        let conn = redis::Client::open(self.url())
            .ok()?
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        Some(conn)
    }

    /// A synchronous connection to this Sentinel.
    pub fn conn(&self) -> redis::Connection {
        self.try_conn()
            .unwrap_or_else(|| panic!("cannot connect to the sentinel on port {}", self.port))
    }

    /// `SENTINEL GET-MASTER-ADDR-BY-NAME` for [`MASTER`]: the port of the primary this
    /// Sentinel names, if any.
    pub fn master_port(&self) -> Option<u16> {
        let mut conn = self.try_conn()?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER)
            .query(&mut conn)
            .ok()?;
        addr.map(|(_, port)| port)
    }

    /// `SENTINEL REPLICAS` (or `SENTINEL SENTINELS`) for [`MASTER`]: one map of fields each.
    fn peers(&self, what: &str) -> Vec<HashMap<String, String>> {
        let Some(mut conn) = self.try_conn() else {
            return Vec::new();
        };
        redis::cmd("SENTINEL")
            .arg(what)
            .arg(MASTER)
            .query(&mut conn)
            .unwrap_or_default()
    }

    /// The replicas this Sentinel knows, as (port, flags).
    pub fn replicas(&self) -> Vec<(u16, String)> {
        self.peers("REPLICAS")
            .into_iter()
            .map(|r| {
                let port = r.get("port").and_then(|p| p.parse().ok()).unwrap_or(0);
                (port, r.get("flags").cloned().unwrap_or_default())
            })
            .collect()
    }

    /// How many other Sentinels this one knows.
    pub fn known_sentinels(&self) -> usize {
        self.peers("SENTINELS").len()
    }

    /// The last lines of this Sentinel's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("sentinel.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Kills the Sentinel (SIGKILL, by PID) and waits for it to exit.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(pid_file(self.child.id()));
    }

    /// Sends a signal to the Sentinel by PID, e.g. `"-STOP"`, `"-CONT"`.
    pub fn signal(&self, sig: &str) {
        super::signal(self.pid(), sig);
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        // SIGKILL ends a SIGSTOPped Sentinel too.
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A primary, its replica and three Sentinels (see the module docs).
pub struct SentinelSetup {
    pub primary: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<Sentinel>,
}

impl SentinelSetup {
    /// Starts everything and waits until the deployment can fail over; panics, with every
    /// Sentinel's view and log, when it does not get there within [`READY_LIMIT`].
    pub fn start() -> Self {
        let started = Instant::now();
        // No 5 s wait for more replicas before the first (diskless) full sync.
        let primary = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
        // Synced first, so that the Sentinels find the replica in the primary's first INFO.
        wait_until(READY_LIMIT, "the replica to sync with the primary", || {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut replica.conn())
                .unwrap_or_default();
            info.contains("master_link_status:up")
                .then_some(())
                .ok_or(info)
        });
        let sentinels = (0..3).map(|_| Sentinel::start(primary.port)).collect();
        let setup = SentinelSetup {
            primary,
            replica,
            sentinels,
        };
        setup.wait_ready(READY_LIMIT.saturating_sub(started.elapsed()));
        eprintln!(
            "sentinel setup ready in {:?} (primary {}, replica {}, sentinels {:?})",
            started.elapsed(),
            setup.primary.port,
            setup.replica.port,
            setup.sentinels.iter().map(|s| s.port).collect::<Vec<_>>()
        );
        setup
    }

    /// Every Sentinel's URL, `redis://127.0.0.1:PORT`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Sentinel::url).collect()
    }

    /// Waits until every Sentinel names the primary, knows the replica (up) and the two other
    /// Sentinels.
    fn wait_ready(&self, limit: Duration) {
        let primary = self.primary.port;
        let replica = self.replica.port;
        let others = self.sentinels.len() - 1;
        let outcome = try_until(limit, || {
            let views: Vec<String> = self
                .sentinels
                .iter()
                .filter_map(|s| {
                    let master = s.master_port();
                    let replicas = s.replicas();
                    let known = s.known_sentinels();
                    let ok = master == Some(primary)
                        && replicas
                            .iter()
                            .any(|(port, flags)| *port == replica && flags == "slave")
                        && known == others;
                    (!ok).then(|| {
                        format!(
                            "sentinel {} names {master:?}, knows replicas {replicas:?} and \
                             {known} other sentinels",
                            s.port
                        )
                    })
                })
                .collect();
            views.is_empty().then_some(()).ok_or(views.join("; "))
        });
        if let Err(state) = outcome {
            panic!(
                "the sentinels did not get ready in {limit:?} (primary {primary}, replica \
                 {replica}): {state}\n{}",
                self.logs()
            );
        }
    }

    /// Waits until every Sentinel names the server on `port` as the primary; panics with
    /// the Sentinels' logs after `limit`.
    pub fn wait_master(&self, port: u16, limit: Duration) {
        let outcome = try_until(limit, || {
            let named: Vec<Option<u16>> = self.sentinels.iter().map(|s| s.master_port()).collect();
            named
                .iter()
                .all(|p| *p == Some(port))
                .then_some(())
                .ok_or(format!("{named:?}"))
        });
        if let Err(named) = outcome {
            panic!(
                "the sentinels do not all name port {port} after {limit:?}: {named}\n{}",
                self.logs()
            );
        }
    }

    /// Every Sentinel's log tail, for failure messages.
    pub fn logs(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| format!("--- sentinel {} log ---\n{}", s.port, s.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Polls `probe` every 50 ms until it succeeds; the last failure after `limit`.
fn try_until(limit: Duration, mut probe: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        match probe() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn wait_until(limit: Duration, what: &str, probe: impl FnMut() -> Result<(), String>) {
    if let Err(state) = try_until(limit, probe) {
        panic!("timed out after {limit:?} waiting for {what}; last state: {state}");
    }
}
