//! Test harness: a real `redis-server` per test, on a free 127.0.0.1 port, stopped by PID.
//!
//! A test that cannot start Redis panics with the reason; it never skips.
#![allow(dead_code, unreachable_pub)]

use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use axum::body::Body;
use http::{Request, Response};
use tower::service_fn;
use tower_redis_ratelimit::{
    bb8, bb8_redis::RedisConnectionManager, redis, Algorithm, RateLimiter, RedisStore, Store,
};

/// A running `redis-server`, killed (by PID) and reaped on drop.
pub struct RedisServer {
    child: Child,
    pub port: u16,
}

/// Where each running server's PID is recorded, so `scripts/test` can stop any server a
/// crashed test binary left behind.
fn pid_file(pid: u32) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-redis-pids");
    let _ = std::fs::create_dir_all(&dir);
    dir.join(pid.to_string())
}

fn redis_binary() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("cannot bind a loopback port")
        .port()
}

impl RedisServer {
    /// Starts a fresh server; panics with a clear message if it cannot.
    pub fn start() -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            match Self::spawn(free_port()) {
                Ok(server) => return server,
                Err(e) => last_error = e, // port taken in between, or a slow start: try again
            }
        }
        panic!("redis-server did not come up on 127.0.0.1: {last_error}");
    }

    fn spawn(port: u16) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("trr-redis-{port}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let child = Command::new(redis_binary())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--loglevel", "warning", "--protected-mode", "yes"])
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `{}` ({e}); install Redis (Debian: apt-get install \
                     redis-server) or run scripts/test, which installs it",
                    redis_binary()
                )
            });
        let _ = std::fs::write(pid_file(child.id()), b"");
        let mut server = RedisServer { child, port };
        server.wait_ready(Duration::from_secs(10))?;
        Ok(server)
    }

    /// Kills the server (SIGKILL, by PID) and waits for it to exit.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(pid_file(self.child.id()));
    }

    /// Starts a new server on the same port (after [`kill`](Self::kill)); retries while the
    /// port is still being released.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Self::spawn(self.port) {
                Ok(new) => {
                    // The old guard's process is already reaped; dropping it is harmless.
                    drop(std::mem::replace(self, new));
                    return;
                }
                Err(e) if Instant::now() > deadline => panic!("restart failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Sends a signal to the server by PID, e.g. `"-STOP"`, `"-CONT"`.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill {sig} {} failed", self.pid());
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

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A plain synchronous connection for inspecting and tampering in tests.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(5))
            .expect("cannot connect to the test redis")
    }

    /// An independent store with its own pool, like one more app instance.
    pub async fn store(&self) -> RedisStore {
        RedisStore::connect(&self.url())
            .await
            .expect("cannot connect to the test redis")
    }

    /// A store on a bb8 pool of `size` connections, with bb8's check-out `PING`.
    pub async fn store_with_pool(&self, size: u32) -> RedisStore {
        let manager = RedisConnectionManager::new(self.url()).unwrap();
        let pool = bb8::Pool::builder()
            .max_size(size)
            .test_on_check_out(true)
            .build(manager)
            .await
            .unwrap();
        RedisStore::from_pool(pool)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends a SIGSTOPped server too.
        self.kill();
    }
}

/// A loopback address on which nothing listens (for "Redis is down" tests).
pub fn dead_redis_url() -> String {
    format!("redis://127.0.0.1:{}", free_port())
}

/// Every key under `pattern` with its PTTL.
pub fn keys_with_pttl(conn: &mut redis::Connection, pattern: &str) -> Vec<(String, i64)> {
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(conn).unwrap();
    keys.into_iter()
        .map(|k| {
            let ttl: i64 = redis::cmd("PTTL").arg(&k).query(conn).unwrap();
            (k, ttl)
        })
        .collect()
}

/// A limiter with `prefix` and a store timeout generous enough for loaded CI machines.
pub fn limiter<A: Algorithm>(store: impl Store, algorithm: A, prefix: &str) -> RateLimiter<A> {
    RateLimiter::builder(store, algorithm)
        .prefix(prefix)
        .store_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// An inner service answering `200 hello` that counts its calls, to prove denied requests
/// never reach it.
pub fn counting(
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    service_fn(move |_req: Request<Body>| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Response::new(Body::from("hello")))
        }
    })
}
