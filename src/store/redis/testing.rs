//! For the crate's own tests of what a store does (its crate-private calls): a real
//! `redis-server` on a free 127.0.0.1 port, stopped by PID when dropped (its PID recorded for
//! `scripts/test`, as `tests/servers` does). A server that cannot start fails the test.

use std::{
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use super::RedisStore;

/// A running `redis-server`, killed and reaped on drop.
pub(crate) struct TestRedis {
    child: Child,
    port: u16,
}

fn pid_file(pid: u32) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-redis-pids");
    let _ = std::fs::create_dir_all(&dir);
    dir.join(pid.to_string())
}

impl TestRedis {
    /// Starts a fresh server; panics with the reason if it cannot.
    pub(crate) fn start() -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("cannot bind a loopback port")
                .port();
            let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
            let child = Command::new(&bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .args(["--loglevel", "warning"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start `{bin}` ({e}): install Redis"));
            let _ = std::fs::write(pid_file(child.id()), b"");
            let mut server = TestRedis { child, port };
            match server.wait_ready() {
                Ok(()) => return server,
                Err(e) => last = e, // the port was taken in between: try another
            }
        }
        panic!("redis-server did not come up on 127.0.0.1: {last}");
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited with {status}"));
            }
            let pong = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            match pong {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e.to_string()),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A store on its own connection.
    pub(crate) async fn store(&self) -> RedisStore {
        RedisStore::connect(&self.url())
            .await
            .expect("cannot connect to the test redis")
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(pid_file(self.child.id()));
    }
}
