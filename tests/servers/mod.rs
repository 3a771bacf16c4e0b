//! The servers and processes the tests start, each on a free 127.0.0.1 port and stopped by
//! PID: `redis-server` standalone, as a local Cluster, with Sentinels ([`sentinel`]) or TLS
//! ([`tls`]); a proxy that cuts connections ([`proxy`]); a link between regions that delays and cuts ([`link`]); an HTTP upstream with a limit of its
//! own ([`upstream`]); the gateway's binary ([`gateway`]) and the examples' ([`example_bin`]).
//!
//! A test that cannot start its server panics with the reason; it never skips.
#![allow(dead_code, unreachable_pub)]

pub mod gateway;
pub mod grpc;
pub mod link;
pub mod model;
pub mod proxy;
pub mod sentinel;
pub mod tls;
pub mod upstream;

use std::{
    net::TcpListener,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tower_redis_ratelimit::{
    redis,
    store::redis::bb8_redis::RedisConnectionManager,
    store::redis::{bb8, Batching},
    RedisStore,
};

/// A running `redis-server`, killed (by PID) and reaped on drop.
pub struct RedisServer {
    child: Child,
    pub port: u16,
    /// Extra `redis-server` arguments (cluster mode), kept for restarts.
    extra: Vec<String>,
}

/// Where each running server's PID is recorded, so `scripts/test` can stop any server a
/// crashed test binary left behind.
fn pid_file(pid: u32) -> std::path::PathBuf {
    // The workspace's target directory, from the library's tests and the gateway's alike.
    let mut root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    if !root.join("lua").is_dir() {
        root = root.parent().unwrap_or(root);
    }
    let dir = root.join("target/test-redis-pids");
    let _ = std::fs::create_dir_all(&dir);
    dir.join(pid.to_string())
}

/// The `redis-server` the tests start: `REDIS_SERVER_BIN` when set (`scripts/compat` points it
/// at other versions), else the one on `PATH`.
fn redis_binary() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

/// The major version of [`redis_binary`], from `redis-server --version` (`Redis server
/// v=7.0.15 …`, `Valkey server v=9.1.2 …`), read once; panics when it cannot be read.
pub fn server_major_version() -> u32 {
    static MAJOR: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *MAJOR.get_or_init(|| {
        let out = Command::new(redis_binary())
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run `{} --version` ({e})", redis_binary()));
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .and_then(|v| v.split('.').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no version in `{} --version`: {text}", redis_binary()))
    })
}

/// The arguments that turn `DEBUG` on for local connections (tests use `DEBUG SLEEP` and
/// `DEBUG SET-ACTIVE-EXPIRE`), where the server has the option (Redis 7 and later, Valkey);
/// older servers allow `DEBUG` to every client without it.
pub fn debug_command_args() -> &'static [&'static str] {
    if server_major_version() >= 7 {
        &["--enable-debug-command", "local"]
    } else {
        &[]
    }
}

/// How many servers in a row may fail to start (a port taken in between) before a test
/// gives up: a server that cannot start with the arguments given (TLS options to a build
/// without TLS) fails the test at once instead of being started again until a timeout.
pub const SPAWN_ATTEMPTS: usize = 20;

pub fn free_port() -> u16 {
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
            match Self::spawn(free_port(), Vec::new()) {
                Ok(server) => return server,
                Err(e) => last_error = e, // port taken in between, or a slow start: try again
            }
        }
        panic!("redis-server did not come up on 127.0.0.1: {last_error}");
    }

    /// Starts a fresh server with extra `redis-server` arguments (e.g. `["--timeout", "1"]`),
    /// kept for restarts.
    pub fn start_with(args: &[&str]) -> Self {
        let extra: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let mut last_error = String::new();
        for _ in 0..5 {
            match Self::spawn(free_port(), extra.clone()) {
                Ok(server) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server did not come up on 127.0.0.1: {last_error}");
    }

    /// Starts a fresh server on `port` (one a test reserved with [`free_port`]).
    pub fn start_with_port(port: u16) -> Self {
        Self::spawn(port, Vec::new())
            .unwrap_or_else(|e| panic!("redis-server did not come up on 127.0.0.1:{port}: {e}"))
    }

    fn spawn(port: u16, extra: Vec<String>) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("trr-redis-{port}"));
        // A fresh directory: a cluster node must not find an old nodes.conf.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let child = spawn_redis(
            Command::new(redis_binary())
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .args(["--loglevel", "warning", "--protected-mode", "yes"])
                .args(debug_command_args())
                .arg("--dir")
                .arg(&dir)
                .args(&extra),
            "",
        );
        let mut server = RedisServer { child, port, extra };
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
            match Self::spawn(self.port, self.extra.clone()) {
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
        signal(self.pid(), sig);
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("redis-server exited with {status}"));
            }
            if let Ok(mut conn) = client.get_connection() {
                match redis::cmd("PING").query::<String>(&mut conn) {
                    Ok(_) => return Ok(()),
                    // Up, and asking for a password (`--requirepass`, ACL users).
                    Err(e) if e.code() == Some("NOAUTH") => return Ok(()),
                    Err(_) => {}
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

/// Calls served so far by the commands for which `counted(name)` holds, from
/// `INFO commandstats` (`name` as Redis reports it, e.g. `evalsha`).
pub fn command_calls(conn: &mut redis::Connection, counted: impl Fn(&str) -> bool) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            if !counted(name) {
                return None;
            }
            stats
                .split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
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

/// Starts `redis-server` as `cmd` says (`how`: the arguments to name when it cannot start,
/// besides the port and options), silent, and records its PID for `scripts/test`.
pub fn spawn_redis(cmd: &mut Command, how: &str) -> Child {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start `{}{how}` ({e}); install Redis (Debian: apt-get install \
                 redis-server) or run scripts/test, which installs it",
                redis_binary()
            )
        });
    let _ = std::fs::write(pid_file(child.id()), b"");
    child
}

/// Sends `sig` (e.g. `"-STOP"`) to the process `pid`, one this harness started.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill {sig} {pid} failed");
}

fn redis_cli() -> String {
    std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".to_owned())
}

/// A port whose cluster bus port (+10000) is free too, both below the kernel's ephemeral range
/// (32768 and up here), so that no outgoing connection grabs the bus port meanwhile.
fn free_cluster_port() -> u16 {
    for _ in 0..1000 {
        let port = 11_000 + (std::process::id() as u16 ^ rand_u16()) % 11_000;
        let both = TcpListener::bind(("127.0.0.1", port))
            .and_then(|a| TcpListener::bind(("127.0.0.1", port + 10_000)).map(|b| (a, b)));
        if both.is_ok() {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

fn rand_u16() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    h.finish() as u16
}

/// A real local Redis Cluster: `masters` primaries with `replicas` replicas each, created with
/// `redis-cli --cluster create`, every node stopped by PID on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start(masters: usize, replicas: usize) -> Self {
        let total = masters * (1 + replicas);
        let mut nodes = Vec::with_capacity(total);
        let mut failed = 0;
        while nodes.len() < total {
            let port = free_cluster_port();
            let extra = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--cluster-require-full-coverage",
                "no",
            ]
            .map(str::to_owned)
            .to_vec();
            match RedisServer::spawn(port, extra) {
                Ok(node) => nodes.push(node),
                Err(e) => {
                    failed += 1;
                    assert!(failed < SPAWN_ATTEMPTS, "no cluster node would start: {e}");
                }
            }
        }
        let cluster = RedisCluster { nodes };
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new(redis_cli())
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); install redis-tools"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_ok(Duration::from_secs(30));
        cluster
    }

    /// Waits until every live node reports `cluster_state:ok` with all slots assigned, knows
    /// every other node, and every replica's link to its primary is up (a replica that never
    /// synced cannot take over).
    pub fn wait_ok(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let ok = self.nodes.iter().all(|n| {
                let Ok(mut c) = redis::Client::open(n.url())
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
                else {
                    return false;
                };
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut c)
                    .unwrap_or_default();
                let replication: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut c)
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_assigned:16384")
                    && info.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
                    && (replication.contains("role:master")
                        || replication.contains("master_link_status:up"))
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "cluster did not become ok in {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Seed node URLs for the cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    pub async fn store(&self) -> RedisStore {
        RedisStore::connect_cluster(&self.urls())
            .await
            .expect("cannot connect to the test cluster")
    }

    /// Runs `command` on every node and returns (port, reply) pairs; for inspection.
    pub fn on_each(&self, command: &[&str]) -> Vec<(u16, redis::Value)> {
        self.nodes
            .iter()
            .map(|n| {
                let mut cmd = redis::cmd(command[0]);
                for a in &command[1..] {
                    cmd.arg(*a);
                }
                (n.port, cmd.query(&mut n.conn()).unwrap())
            })
            .collect()
    }

    /// Every key under `pattern` on every primary, with its PTTL.
    pub fn keys_with_pttl(&self, pattern: &str) -> Vec<(String, i64)> {
        self.nodes
            .iter()
            .filter(|n| n.role() == "master")
            .flat_map(|n| keys_with_pttl(&mut n.conn(), pattern))
            .collect()
    }
}

impl RedisServer {
    /// The port of this node's primary, if it is a replica.
    pub fn replica_of(&self) -> Option<u16> {
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut self.conn()).ok()?;
        match (role.first(), role.get(2)) {
            (Some(redis::Value::BulkString(r)), Some(redis::Value::Int(port))) if r == b"slave" => {
                u16::try_from(*port).ok()
            }
            _ => None,
        }
    }

    /// `master` or `slave` (from `ROLE`).
    pub fn role(&self) -> String {
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut self.conn()).unwrap();
        match &role[0] {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        }
    }
}

/// A Redis to run a suite against: a standalone server or a 3-primary cluster.
pub enum Backend {
    Standalone(RedisServer),
    /// Standalone, with exact batching on (`RedisStore::with_batching`).
    Batched(RedisServer),
    Cluster(RedisCluster),
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Standalone(_) => "standalone",
            Backend::Batched(_) => "standalone, batched",
            Backend::Cluster(_) => "cluster",
        }
    }

    /// An independent store (own connection), like one more app instance.
    pub async fn store(&self) -> RedisStore {
        match self {
            Backend::Standalone(s) => s.store().await,
            // Each batch call may take as long as the harness's store timeout: on a loaded
            // machine the default second is not always enough.
            Backend::Batched(s) => s
                .store()
                .await
                .with_batching(Batching::new().call_timeout(Duration::from_secs(10)))
                .expect("batching"),
            Backend::Cluster(c) => c.store().await,
        }
    }

    pub fn keys_with_pttl(&self, pattern: &str) -> Vec<(String, i64)> {
        match self {
            Backend::Standalone(s) | Backend::Batched(s) => keys_with_pttl(&mut s.conn(), pattern),
            Backend::Cluster(c) => c.keys_with_pttl(pattern),
        }
    }
}

/// Every backend, for suites that must hold on standalone Redis (with and without batching)
/// and on Redis Cluster alike.
pub fn each_backend() -> Vec<Backend> {
    vec![
        Backend::Standalone(RedisServer::start()),
        Backend::Batched(RedisServer::start()),
        Backend::Cluster(RedisCluster::start(3, 0)),
    ]
}

/// `target/<profile>/examples/<name>`, built by `cargo test` with the examples.
pub fn example_bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        bin.exists(),
        "{} not built; run `cargo test` (it builds examples)",
        bin.display()
    );
    bin
}
