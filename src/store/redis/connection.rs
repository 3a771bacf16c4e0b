//! One multiplexed connection to one Redis server, replaced when it dies.
//!
//! redis-rs' `ConnectionManager` learns that its connection died (Redis' idle `timeout`, a
//! NAT or load balancer dropping an idle flow, a restart during a quiet period) only when the
//! next command fails, and it fails that command although the command never left the
//! process. An endpoint whose traffic is sparser than the idle timeout then fails every time.
//!
//! Here the connection's driver task is ours: when it ends (the server closed the socket, or
//! the socket failed), the connection is marked dead at once, and the next command connects
//! afresh before it is sent. A command that failed on a connection that was already dead when
//! the command was handed to it provably never reached Redis and is sent once more on a new
//! connection; a command that may have reached Redis is never sent twice (it may have spent
//! units). Connecting runs in a task of its own, bounded by the connect timeout, shared by
//! every command waiting for it, and goes on when a waiting caller gives up; a failure is
//! remembered for a moment so that a dead Redis is not dialled once per request.
//!
//! Sockets keep TCP alive (a NAT or firewall keeps the flow, and a peer that vanished is
//! noticed while idle) and give up on data unacknowledged for [`TCP_USER_TIMEOUT`] (a black
//! hole is noticed under traffic too).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, OnceLock, Weak,
    },
    time::{Duration, Instant},
};

use arc_swap::ArcSwapOption;
use futures_util::{
    future::{BoxFuture, Shared},
    FutureExt,
};
use redis::{
    aio::{ConnectionLike, MultiplexedConnection},
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, RedisFuture, Value,
};

use crate::Error;

/// Idle time before the first TCP keepalive probe.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Time between keepalive probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long sent data may stay unacknowledged before the socket gives up (Linux).
pub(crate) const TCP_USER_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a failed connection attempt answers for the next ones.
const FAILURE_MEMORY: Duration = Duration::from_millis(100);

/// Microseconds on a monotonic clock shared by every connection; never 0.
fn monotonic_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// After this long without a command, a connection may have been closed meanwhile without
/// its driver having run yet (a busy or blocked runtime): give it the chance first.
const IDLE_US: u64 = 200_000;

/// A connection answering `READONLY` is replaced only when it is older than this.
const READONLY_RECONNECT_US: u64 = 1_000_000;

/// A connection in use, when its driver ended (0 while it runs), and when it was last handed
/// a command (to a resolution of [`IDLE_US`] / 2).
struct Live {
    conn: MultiplexedConnection,
    died_at: Arc<AtomicU64>,
    used_at: AtomicU64,
    born_at: u64,
}

impl Live {
    fn died_at(&self) -> Option<u64> {
        match self.died_at.load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }

    /// Records a use at `now`; true when the connection had been idle.
    fn touch(&self, now: u64) -> bool {
        let last = self.used_at.load(Ordering::Relaxed);
        let idle = now.saturating_sub(last);
        // Written rarely, so that concurrent commands do not fight over the cache line.
        if idle > IDLE_US / 2 {
            self.used_at.store(now, Ordering::Relaxed);
        }
        idle > IDLE_US
    }
}

type Attempt = Shared<BoxFuture<'static, Result<Arc<Live>, Error>>>;

struct Inner {
    info: ConnectionInfo,
    connect_timeout: Duration,
    live: ArcSwapOption<Live>,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    /// The connection attempt under way, if any.
    attempt: Option<Attempt>,
    /// The last failed attempt: when it failed, and why.
    failure: Option<(Instant, Error)>,
}

/// A self-replacing connection to one server (see the module docs). Cloning shares it.
#[derive(Clone)]
pub(crate) struct Supervised {
    inner: Arc<Inner>,
}

impl Supervised {
    /// Connects to `info` when first used.
    pub(crate) fn lazy(info: ConnectionInfo, connect_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                info,
                connect_timeout,
                live: ArcSwapOption::empty(),
                pending: Mutex::new(Pending::default()),
            }),
        }
    }

    /// Connects to `info` now and verifies the server answers.
    pub(crate) async fn connect(
        info: ConnectionInfo,
        connect_timeout: Duration,
    ) -> Result<Self, Error> {
        let this = Self::lazy(info, connect_timeout);
        this.connection().await?;
        Ok(this)
    }

    /// A live connection: the current one, or a new one.
    async fn connection(&self) -> Result<Arc<Live>, Error> {
        if let Some(live) = &*self.inner.live.load() {
            if live.died_at().is_none() {
                return Ok(Arc::clone(live));
            }
        }
        self.reconnect().await
    }

    /// Joins the connection attempt under way, or starts one.
    async fn reconnect(&self) -> Result<Arc<Live>, Error> {
        let attempt = {
            let mut pending = lock(&self.inner.pending);
            if let Some(live) = self.inner.live.load_full() {
                if live.died_at().is_none() {
                    return Ok(live);
                }
            }
            match &pending.attempt {
                Some(attempt) => attempt.clone(),
                None => {
                    if let Some((at, e)) = &pending.failure {
                        if at.elapsed() < FAILURE_MEMORY {
                            return Err(e.clone());
                        }
                    }
                    let attempt = open(self.inner.info.clone(), self.inner.connect_timeout)
                        .boxed()
                        .shared();
                    pending.attempt = Some(attempt.clone());
                    // Driven by a task of its own: it completes (and is installed) even when
                    // every caller waiting for it gave up.
                    tokio::spawn(install(Arc::downgrade(&self.inner), attempt.clone()));
                    attempt
                }
            }
        };
        attempt.await
    }

    /// Forgets `dead` if it is still the current connection.
    fn retire(&self, dead: &Arc<Live>) {
        let current = self.inner.live.load();
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, dead)) {
            self.inner.live.compare_and_swap(&current, None);
        }
    }

    /// Sends `cmd` once; once more on a new connection when it provably never reached Redis.
    async fn send(&self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let mut retried = false;
        loop {
            let live = self.connection().await.map_err(into_redis_error)?;
            let mut handed_over = monotonic_us();
            if live.touch(handed_over) {
                // Idle: a close that arrived meanwhile may not have been read yet. Let the
                // runtime poll its I/O (and the driver run) before handing the command over.
                tokio::task::yield_now().await;
                if live.died_at().is_some() {
                    self.retire(&live);
                    continue;
                }
                handed_over = monotonic_us();
            }
            let result = live.conn.clone().send_packed_command(cmd).await;
            let Err(e) = &result else { return result };
            if e.is_unrecoverable_error() || e.is_connection_dropped() {
                self.retire(&live);
                // The driver had already ended (so the command could not be written) before
                // the command was handed over: nothing reached Redis.
                let unsent = live.died_at().is_some_and(|t| t <= handed_over);
                if unsent && !retried {
                    retried = true;
                    tracing::debug!(error = %e, "redis connection was closed; sending on a new one");
                    continue;
                }
            } else if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
                && handed_over.saturating_sub(live.born_at) > READONLY_RECONNECT_US
            {
                // The server was demoted (a failover): the next command connects afresh, which
                // follows a DNS name or an address that moved to the new primary. At most once
                // a second, so that a server that stays read-only is not dialled per request.
                self.retire(&live);
            }
            return result;
        }
    }
}

/// Installs the outcome of `attempt` once it completes.
async fn install(inner: Weak<Inner>, attempt: Attempt) {
    let result = attempt.await;
    let Some(inner) = inner.upgrade() else { return };
    let mut pending = lock(&inner.pending);
    pending.attempt = None;
    match result {
        Ok(live) => {
            pending.failure = None;
            inner.live.store(Some(live));
        }
        Err(e) => {
            tracing::warn!(error = %e, "rate limit: cannot connect to redis");
            pending.failure = Some((Instant::now(), e));
        }
    }
}

fn lock(m: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Opens a connection to `info` and checks that the server answers `PING`, all within
/// `timeout`.
async fn open(info: ConnectionInfo, timeout: Duration) -> Result<Arc<Live>, Error> {
    tokio::time::timeout(timeout, open_unbounded(&info))
        .await
        .unwrap_or(Err(Error::Timeout(timeout)))
}

async fn open_unbounded(info: &ConnectionInfo) -> Result<Arc<Live>, Error> {
    // Every call is bounded by its caller (the limiter's store timeout, the batch call
    // timeout), so the connection adds no response timeout of its own.
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    let (conn, driver) = match info.addr() {
        ConnectionAddr::Tcp(host, port) => {
            let stream = tcp(host, *port).await?;
            let (conn, driver) =
                MultiplexedConnection::new_with_config(info.redis_settings(), stream, config)
                    .await?;
            (conn, driver.boxed())
        }
        #[cfg(unix)]
        ConnectionAddr::Unix(path) => {
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(redis::RedisError::from)?;
            let (conn, driver) =
                MultiplexedConnection::new_with_config(info.redis_settings(), stream, config)
                    .await?;
            (conn, driver.boxed())
        }
        _ => {
            return Err(Error::Redis(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "this address kind is not supported",
            ))))
        }
    };
    let died_at = Arc::new(AtomicU64::new(0));
    let flag = Arc::clone(&died_at);
    tokio::spawn(async move {
        driver.await;
        // The driver (and the queue it read commands from) is gone: nothing sent from now on
        // can reach Redis.
        flag.store(monotonic_us(), Ordering::Release);
    });
    let now = monotonic_us();
    let live = Arc::new(Live {
        conn,
        died_at,
        used_at: AtomicU64::new(now),
        born_at: now,
    });
    // The handshake (AUTH, HELLO, SELECT) ran; a server that wants a password the URL does
    // not give answers only now.
    let _: () = redis::cmd("PING")
        .query_async(&mut live.conn.clone())
        .await?;
    Ok(live)
}

/// A TCP connection to `host:port`, trying each address it resolves to in turn.
async fn tcp(host: &str, port: u16) -> Result<tokio::net::TcpStream, Error> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port))
        .await
        .map_err(redis::RedisError::from)?
    {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => {
                tune(&stream);
                return Ok(stream);
            }
            Err(e) => last = Some(e),
        }
    }
    let e = last.unwrap_or_else(|| std::io::Error::other(format!("{host} has no address")));
    Err(Error::Redis(e.into()))
}

/// Keepalive and the user timeout (see the module docs); best effort.
fn tune(stream: &tokio::net::TcpStream) {
    let socket = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL);
    let _ = socket.set_tcp_keepalive(&keepalive);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = socket.set_tcp_user_timeout(Some(TCP_USER_TIMEOUT));
}

fn into_redis_error(e: Error) -> redis::RedisError {
    match e {
        Error::Redis(e) => e,
        Error::Timeout(d) => std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("connecting took longer than {d:?}"),
        )
        .into(),
        other => redis::RedisError::from(std::io::Error::other(other.to_string())),
    }
}

impl ConnectionLike for Supervised {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.send(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let live = self.connection().await.map_err(into_redis_error)?;
            let result = live
                .conn
                .clone()
                .send_packed_commands(pipeline, offset, count)
                .await;
            if matches!(&result, Err(e) if e.is_unrecoverable_error()) {
                self.retire(&live);
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.info.redis_settings().db()
    }
}
