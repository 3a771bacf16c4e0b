//! A throwaway `redis-server` on a free 127.0.0.1 port, stopped by PID on drop.
//!
//! A minimal copy of what `tests/servers/mod.rs` does, kept here so that this benchmark builds
//! without the test suite's harness (which needs the test-only dependencies and features of
//! the day) and `cargo fmt` on this package stays inside `bench/`.

use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tower_redis_ratelimit::redis;

use crate::pinning::Pinning;

pub struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts `redis-server` (or `$REDIS_SERVER_BIN`) without persistence, on the CPUs of
    /// `pinning` if given; panics with the reason if it does not answer `PING` within 10 s.
    pub fn start(pinning: Option<&Pinning>) -> Self {
        let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("cannot bind a loopback port")
                .port();
            let dir = std::env::temp_dir().join(format!("trr-bench-redis-{port}"));
            let _ = std::fs::create_dir_all(&dir);
            let child = pinning
                .map_or_else(|| Command::new(&bin), |p| p.command(&bin))
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .args(["--loglevel", "warning", "--protected-mode", "yes"])
                .arg("--dir")
                .arg(&dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start `{bin}` ({e}); Debian: apt-get install redis-server")
                });
            let mut server = RedisServer { child, port };
            match server.wait_ready(Duration::from_secs(10)) {
                Ok(()) => return server,
                Err(e) => last_error = e, // dropping `server` stops it; try another port
            }
        }
        panic!("redis-server did not come up on 127.0.0.1: {last_error}");
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("redis-server exited with {status}"));
            }
            if let Ok(mut conn) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err("no PONG within the time limit".to_owned());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its process id, for its CPU time in `/proc` (scripts/bench-rls).
    #[allow(dead_code)] // not used by `compare`
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain synchronous connection (for `INFO`).
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(5))
            .expect("cannot connect to the benchmark redis")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL to this child's PID, then reap it.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(
            std::env::temp_dir().join(format!("trr-bench-redis-{}", self.port)),
        );
    }
}
