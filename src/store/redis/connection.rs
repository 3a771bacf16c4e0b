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
//! A server that stops answering without closing anything (a frozen or hung process, a
//! primary Sentinel failed over while it was paused) keeps a connection that never dies. When
//! commands have waited for [`STALL_US`] with no reply at all, the connection is retired and
//! the next command connects afresh (through the Sentinels again, or the same address).
//! Commands already handed to the stalled connection keep it until they end; none is resent.
//!
//! Sockets keep TCP alive (a NAT or firewall keeps the flow, and a peer that vanished is
//! noticed while idle) and give up on data unacknowledged for [`TCP_USER_TIMEOUT`](super::connect::TCP_USER_TIMEOUT) (a black
//! hole is noticed under traffic too).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, Weak,
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
    Cmd, RedisFuture, Value,
};

use super::connect::{monotonic_us, Connector};
use crate::error::Error;

/// How long a failed connection attempt answers for the next ones.
const FAILURE_MEMORY: Duration = Duration::from_millis(100);

/// After this long without a command, a connection may have been closed meanwhile without
/// its driver having run yet (a busy or blocked runtime): give it the chance first.
const IDLE_US: u64 = 200_000;

/// After this long without a command, a connection is probed with a `PING` before a check is
/// handed to it: Redis' idle `timeout` (at least a second) may have closed it in a way its
/// driver has not read yet. A failed probe sends the check on a new connection; the check
/// itself never went out. A second: shorter than any idle timeout that closes connections.
const PROBE_US: u64 = 1_000_000;

/// A connection answering `READONLY` is replaced only when it is older than this.
const READONLY_RECONNECT_US: u64 = 1_000_000;

/// A connection on which commands have waited this long with no reply at all is given up.
const STALL_US: u64 = 1_000_000;

/// A connection in use, when its driver ended (0 while it runs), when it was last handed
/// a command (to a resolution of [`IDLE_US`] / 2), and since when commands wait for a reply
/// (0 when none does, as far as completed commands tell).
struct Live {
    conn: MultiplexedConnection,
    died_at: Arc<AtomicU64>,
    used_at: AtomicU64,
    born_at: u64,
    waiting_since: AtomicU64,
}

impl Live {
    fn died_at(&self) -> Option<u64> {
        match self.died_at.load(Ordering::Acquire) {
            0 => None,
            t => Some(t),
        }
    }

    /// Records a use at `now`; how long the connection had been idle (to a resolution of
    /// [`IDLE_US`] / 2).
    fn touch(&self, now: u64) -> u64 {
        let last = self.used_at.load(Ordering::Relaxed);
        let idle = now.saturating_sub(last);
        // Written rarely, so that concurrent commands do not fight over the cache line.
        if idle > IDLE_US / 2 {
            self.used_at.store(now, Ordering::Relaxed);
        }
        idle
    }

    /// Records that a command is handed over at `now`; true when commands have waited on this
    /// connection for longer than [`STALL_US`] without any reply since.
    fn hand_over(&self, now: u64) -> bool {
        // Read first: under load the value is rarely 0, and a read keeps the cache line shared.
        let since = self.waiting_since.load(Ordering::Relaxed);
        if since != 0 {
            return now.saturating_sub(since) > STALL_US;
        }
        // Lost to a concurrent hand-over: that one started the wait, just now.
        let _ = self
            .waiting_since
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        false
    }

    /// Records a reply (a result or an error from the server or the socket).
    fn answered(&self) {
        if self.waiting_since.load(Ordering::Relaxed) != 0 {
            self.waiting_since.store(0, Ordering::Relaxed);
        }
    }
}

type Attempt = Shared<BoxFuture<'static, Result<Arc<Live>, Error>>>;

struct Inner {
    connector: Connector,
    live: ArcSwapOption<Live>,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    /// The connection attempt under way, if any.
    attempt: Option<Attempt>,
    /// The last failed attempt: when it failed, and why.
    failure: Option<(Instant, Error)>,
    /// When a failure to connect was last logged at `warn`: a server away for a while (a
    /// region cut off, a restart) is told once per [`WARN_EVERY`], not on every attempt.
    warned_at: Option<Instant>,
}

/// How often a server that stays unreachable is logged at `warn` (the attempts between are
/// logged at `debug`).
const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// A self-replacing connection to one server (see the module docs). Cloning shares it.
#[derive(Clone)]
pub(crate) struct Supervised {
    inner: Arc<Inner>,
}

impl Supervised {
    /// Connects with `connector` when first used.
    pub(crate) fn lazy(connector: Connector) -> Self {
        Self {
            inner: Arc::new(Inner {
                connector,
                live: ArcSwapOption::empty(),
                pending: Mutex::new(Pending::default()),
            }),
        }
    }

    /// Connects with `connector` now and verifies the server answers.
    pub(crate) async fn connect(connector: Connector) -> Result<Self, Error> {
        // Opened here rather than through `reconnect`: the caller reports a failure, so it is
        // not logged as well.
        let opened = open(&connector).await;
        report_connection(opened.is_ok(), Some(opened.is_ok()));
        let this = Self::lazy(connector);
        this.inner.live.store(Some(opened?));
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
                    let inner = Arc::clone(&self.inner);
                    let attempt = async move { open(&inner.connector).await }.boxed().shared();
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

    /// Forgets `stalled` (see [`STALL_US`]) if it is still the current connection.
    fn retire_stalled(&self, stalled: &Arc<Live>) {
        if self.retire(stalled) {
            tracing::warn!(
                "rate limit: redis has not answered for over {:?}; connecting afresh",
                Duration::from_micros(STALL_US)
            );
        }
    }

    /// Forgets `dead` if it is still the current connection.
    /// True when this call retired it.
    fn retire(&self, dead: &Arc<Live>) -> bool {
        let current = self.inner.live.load();
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, dead)) {
            let previous = self.inner.live.compare_and_swap(&current, None);
            let retired = previous.as_ref().is_some_and(|p| Arc::ptr_eq(p, dead));
            if retired {
                report_connection(false, None);
            }
            return retired;
        }
        false
    }

    /// Sends `cmd` and reads its reply, a server error as an `Err` (what `Cmd::query_async`
    /// does, without going through a boxed [`ConnectionLike`] future).
    pub(crate) async fn query(&self, cmd: &Cmd) -> redis::RedisResult<Value> {
        self.send(cmd).await?.extract_error()
    }

    /// Sends `cmd` once; once more on a new connection when it provably never reached Redis.
    async fn send(&self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let mut retried = false;
        loop {
            let live = self.connection().await.map_err(into_redis_error)?;
            let mut handed_over = monotonic_us();
            let idle = live.touch(handed_over);
            if idle > IDLE_US {
                // Idle: a close that arrived meanwhile may not have been read yet. Let the
                // runtime poll its I/O (and the driver run) before handing the command over.
                tokio::task::yield_now().await;
                if live.died_at().is_some() {
                    self.retire(&live);
                    continue;
                }
                if idle > PROBE_US && !retried {
                    // The driver may still not have read the close: ask before sending.
                    let probe = live
                        .conn
                        .clone()
                        .send_packed_command(&redis::cmd("PING"))
                        .await;
                    if let Err(e) = probe {
                        if e.is_unrecoverable_error() || e.is_connection_dropped() {
                            self.retire(&live);
                            retried = true;
                            tracing::debug!(error = %crate::error::ErrorChain(&e), "redis connection was closed while idle; sending on a new one");
                            continue;
                        }
                    }
                }
                handed_over = monotonic_us();
            }
            if live.hand_over(handed_over) {
                // Nothing has come back for a while: the server is frozen or gone without a
                // word. This command has not been handed over; it goes on a new connection.
                self.retire_stalled(&live);
                continue;
            }
            let result = live.conn.clone().send_packed_command(cmd).await;
            live.answered();
            let Err(e) = &result else { return result };
            if e.is_unrecoverable_error() || e.is_connection_dropped() {
                self.retire(&live);
                // The driver had already ended (so the command could not be written) before
                // the command was handed over: nothing reached Redis.
                let unsent = live.died_at().is_some_and(|t| t <= handed_over);
                if unsent && !retried {
                    retried = true;
                    tracing::debug!(error = %crate::error::ErrorChain(&e), "redis connection was closed; sending on a new one");
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

/// The connection's state in the metrics: `ratelimit_store_connected` (1 while a connection
/// is open), `ratelimit_store_connects_total{result="ok"|"failed"}` (each attempt to
/// connect, the first included).
fn report_connection(connected: bool, attempt: Option<bool>) {
    #[cfg(feature = "metrics")]
    {
        static DESCRIBED: std::sync::Once = std::sync::Once::new();
        DESCRIBED.call_once(|| {
            metrics::describe_gauge!(
                crate::telemetry::STORE_CONNECTED,
                "1 while the store's connection to Redis is open (standalone and Sentinel), else 0."
            );
            metrics::describe_counter!(
                crate::telemetry::STORE_CONNECTS,
                "Attempts to connect to Redis (standalone and Sentinel), by result (ok, failed)."
            );
        });
        metrics::gauge!(crate::telemetry::STORE_CONNECTED).set(f64::from(u8::from(connected)));
        if let Some(ok) = attempt {
            let result = if ok { "ok" } else { "failed" };
            metrics::counter!(crate::telemetry::STORE_CONNECTS, "result" => result).increment(1);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (connected, attempt);
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
            pending.warned_at = None;
            inner.live.store(Some(live));
            report_connection(true, Some(true));
        }
        Err(e) => {
            let now = Instant::now();
            if pending
                .warned_at
                .is_none_or(|t| now.duration_since(t) >= WARN_EVERY)
            {
                pending.warned_at = Some(now);
                tracing::warn!(error = %crate::error::ErrorChain(&e), "rate limit: cannot connect to redis (told again every {} s while it lasts)", WARN_EVERY.as_secs());
            } else {
                tracing::debug!(error = %crate::error::ErrorChain(&e), "rate limit: cannot connect to redis");
            }
            pending.failure = Some((now, e));
            report_connection(false, Some(false));
        }
    }
}

fn lock(m: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Opens a connection with `connector` and watches its driver.
async fn open(connector: &Connector) -> Result<Arc<Live>, Error> {
    let opened = connector.open().await?;
    let now = monotonic_us();
    Ok(Arc::new(Live {
        conn: opened.conn,
        died_at: opened.died_at,
        used_at: AtomicU64::new(now),
        born_at: now,
        waiting_since: AtomicU64::new(0),
    }))
}

fn into_redis_error(e: Error) -> redis::RedisError {
    match e {
        Error::Redis(e) => e,
        Error::Timeout(d) => std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("connecting took longer than {d:?}"),
        )
        .into(),
        other => redis::RedisError::from(std::io::Error::other(other)),
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
            let mut live = self.connection().await.map_err(into_redis_error)?;
            if live.hand_over(monotonic_us()) {
                self.retire_stalled(&live);
                live = self.connection().await.map_err(into_redis_error)?;
                live.hand_over(monotonic_us());
            }
            let result = live
                .conn
                .clone()
                .send_packed_commands(pipeline, offset, count)
                .await;
            live.answered();
            if matches!(&result, Err(e) if e.is_unrecoverable_error()) {
                self.retire(&live);
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.connector.db()
    }
}
