//! Opening one connection to Redis, and saying truthfully why it failed.
//!
//! A connection is opened to a fixed address (a URL), to the primary that a set of Sentinels
//! names, or by a `redis::Client` the application built. Opening runs the whole round trip
//! (TCP, TLS, the handshake with `AUTH`/`HELLO`/`SELECT`, then a `PING`) within the connect
//! timeout, and a failure is a [`ConnectError`] whose kind says what to fix.
//!
//! Sentinel: redis-rs has a Sentinel client, but it opens its connections with its own
//! connector (redis-rs' TLS, which needs a process-wide crypto provider, no bound on
//! connecting, connections to Sentinels kept between lookups). Asking a Sentinel is one
//! command, so it is asked here on a connection opened like every other one: the same TLS,
//! timeout and error kinds for Sentinels and for Redis. The primary is looked up again on
//! every reconnect, so a failover is followed by the next connection.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, OnceLock,
    },
    time::{Duration, Instant},
};

use futures_util::{future::BoxFuture, stream::FuturesUnordered, FutureExt, StreamExt};
use redis::{
    aio::MultiplexedConnection, AsyncConnectionConfig, ConnectionAddr, ConnectionInfo,
    IntoConnectionInfo, RedisConnectionInfo,
};

use super::redact::redact_url;
use crate::error::{ConfigError, ConnectError, ConnectErrorKind, Error, ErrorChain};

/// Idle time before the first TCP keepalive probe.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Time between keepalive probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long sent data may stay unacknowledged before the socket gives up (Linux).
pub(crate) const TCP_USER_TIMEOUT: Duration = Duration::from_secs(15);

/// Where connections go.
pub(crate) enum Target {
    /// One server, by URL.
    Direct(ConnectionInfo),
    /// The primary named by any of these Sentinels for `master`; `settings` (credentials,
    /// database) are for the primary, `tls` whether it speaks TLS.
    Sentinel {
        sentinels: Vec<ConnectionInfo>,
        master: String,
        settings: RedisConnectionInfo,
        tls: bool,
    },
    /// The application's own client: redis-rs connects, with every option of the client.
    Client(redis::Client),
}

/// Opens connections to a [`Target`] (see the module docs).
pub(crate) struct Connector {
    target: Target,
    timeout: Duration,
    #[cfg(feature = "tls")]
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// A connection just opened, and when its driver ended (0 while it runs, and always 0 when
/// redis-rs drives it).
pub(crate) struct Opened {
    pub(crate) conn: MultiplexedConnection,
    pub(crate) died_at: Arc<AtomicU64>,
}

/// Microseconds on a monotonic clock shared by every connection; never 0.
pub(crate) fn monotonic_us() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// Runs `driver` on a task of its own and records when it ends: from then on, nothing sent
/// on the connection can reach Redis.
fn drive(conn: MultiplexedConnection, driver: BoxFuture<'static, ()>) -> Opened {
    let died_at = Arc::new(AtomicU64::new(0));
    let flag = Arc::clone(&died_at);
    tokio::spawn(async move {
        driver.await;
        flag.store(monotonic_us(), Ordering::Release);
    });
    Opened { conn, died_at }
}

impl Connector {
    /// A connector to `target`; `tls` is the client configuration for `rediss://` addresses.
    pub(crate) fn new(
        target: Target,
        timeout: Duration,
        #[cfg(feature = "tls")] tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Self {
        Self {
            target,
            timeout,
            #[cfg(feature = "tls")]
            tls,
        }
    }

    /// The database commands go to.
    pub(crate) fn db(&self) -> i64 {
        match &self.target {
            Target::Direct(info) => info.redis_settings().db(),
            Target::Sentinel { settings, .. } => settings.db(),
            Target::Client(client) => client.get_connection_info().redis_settings().db(),
        }
    }

    /// Opens a connection and checks that the server answers `PING`, all within the connect
    /// timeout.
    pub(crate) async fn open(&self) -> Result<Opened, Error> {
        let phase = Phase::default();
        match tokio::time::timeout(self.timeout, self.open_unbounded(&phase)).await {
            Ok(result) => result,
            Err(_) => Err(connect_error(
                ConnectErrorKind::TimedOut,
                format!(
                    "{} did not answer within {:?} (the connect timeout){}",
                    self.describe(),
                    self.timeout,
                    phase.hint()
                ),
            )),
        }
    }

    fn describe(&self) -> String {
        match &self.target {
            Target::Direct(info) => info.addr().to_string(),
            Target::Sentinel { master, .. } => {
                format!("the sentinels or the primary of {master:?}")
            }
            Target::Client(client) => client.get_connection_info().addr().to_string(),
        }
    }

    async fn open_unbounded(&self, phase: &Phase) -> Result<Opened, Error> {
        match &self.target {
            Target::Direct(info) => {
                self.open_addr(info.addr(), info.redis_settings(), phase)
                    .await
            }
            Target::Sentinel {
                sentinels,
                master,
                settings,
                tls,
            } => {
                self.open_primary(sentinels, master, settings, *tls, phase)
                    .await
            }
            Target::Client(client) => {
                let addr = client.get_connection_info().addr().to_string();
                let conn = client
                    .get_multiplexed_async_connection_with_config(&config())
                    .await
                    .map_err(|e| classify(&addr, e))?;
                ping(&addr, conn.clone()).await?;
                Ok(Opened {
                    conn,
                    died_at: Arc::default(),
                })
            }
        }
    }

    /// Opens a connection to `addr`: TCP (or a Unix socket), TLS for `rediss://`, the
    /// handshake, a `PING`.
    async fn open_addr(
        &self,
        addr: &ConnectionAddr,
        settings: &RedisConnectionInfo,
        phase: &Phase,
    ) -> Result<Opened, Error> {
        phase.set(Step::Tcp);
        let name = addr.to_string();
        // Every call is bounded by its caller (the limiter's store timeout, the batch call
        // timeout), so the connection adds no response timeout of its own.
        let (conn, driver) = match addr {
            ConnectionAddr::Tcp(host, port) => {
                let stream = tcp(host, *port).await?;
                phase.set(Step::Redis);
                let (conn, driver) =
                    MultiplexedConnection::new_with_config(settings, stream, config())
                        .await
                        .map_err(|e| plain_handshake_failed(&name, e))?;
                (conn, driver.boxed())
            }
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => {
                self.open_tls(host, *port, *insecure, settings, phase, &name)
                    .await?
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path).await.map_err(|e| {
                    Error::Connect(
                        ConnectError::new(ConnectErrorKind::Unreachable, name.clone()).caused_by(e),
                    )
                })?;
                let (conn, driver) =
                    MultiplexedConnection::new_with_config(settings, stream, config())
                        .await
                        .map_err(|e| classify(&name, e))?;
                (conn, driver.boxed())
            }
            #[allow(unreachable_patterns)]
            _ => {
                return Err(Error::Config(ConfigError::new(
                    "url",
                    format!("this address kind is not supported: {name}"),
                )))
            }
        };
        let opened = drive(conn, driver);
        // The handshake (AUTH, HELLO, SELECT) ran; a server that wants a password the URL
        // does not give answers only now.
        ping(&name, opened.conn.clone()).await?;
        Ok(opened)
    }

    /// A TLS connection to `host:port` (`name` in errors), the handshake run: the connection
    /// and its driver.
    async fn open_tls(
        &self,
        host: &str,
        port: u16,
        insecure: bool,
        settings: &RedisConnectionInfo,
        phase: &Phase,
        name: &str,
    ) -> Result<(MultiplexedConnection, BoxFuture<'static, ()>), Error> {
        if insecure {
            return Err(Error::Config(ConfigError::new(
                "url",
                "`#insecure` (TLS without verifying the server) is not supported: \
                 trust the server's CA with `RedisStoreBuilder::ca_pem`",
            )));
        }
        #[cfg(feature = "tls")]
        {
            let Some(tls) = &self.tls else {
                return Err(Error::Config(ConfigError::new(
                    "url",
                    "rediss:// needs TLS settings (internal error)",
                )));
            };
            let stream = tcp(host, port).await?;
            phase.set(Step::Tls);
            let stream = super::tls::handshake(Arc::clone(tls), host, stream)
                .await
                .map_err(Error::Connect)?;
            phase.set(Step::Redis);
            let (conn, driver) = MultiplexedConnection::new_with_config(settings, stream, config())
                .await
                .map_err(|e| classify(name, e))?;
            Ok((conn, driver.boxed()))
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = (host, port, settings, phase, name);
            Err(Error::Config(ConfigError::new(
                "url",
                "rediss:// needs the `tls` feature of tower-redis-ratelimit",
            )))
        }
    }

    /// Asks every Sentinel at once for the primary of `master`, and tries each distinct
    /// address named as soon as it is named, all at once: the first that accepts the
    /// credentials and answers `ROLE` as a primary is used. A Sentinel that names a wrong
    /// server (one that refuses the password, one that does not answer, a replica) does not
    /// fail the lookup while another names the primary. When none works, the error lists every
    /// Sentinel's answer and every primary's failure; its kind is that of the primaries'
    /// failures when they all refused the same way (the password, the certificate), else
    /// [`ConnectErrorKind::NoPrimary`].
    async fn open_primary(
        &self,
        sentinels: &[ConnectionInfo],
        master: &str,
        settings: &RedisConnectionInfo,
        tls: bool,
        phase: &Phase,
    ) -> Result<Opened, Error> {
        let mut pending: FuturesUnordered<BoxFuture<'_, Lookup>> = sentinels
            .iter()
            .map(|sentinel| {
                async move {
                    let name = sentinel.addr().to_string();
                    let answer = self.ask_sentinel(sentinel, master).await;
                    Lookup::Named {
                        sentinel: name,
                        answer,
                    }
                }
                .boxed()
            })
            .collect();
        let mut problems = Vec::new();
        let mut tried = Vec::new();
        // How each primary tried failed: `Some(kind)` when it refused the connection that way.
        let mut refusals: Vec<Option<ConnectErrorKind>> = Vec::new();
        while let Some(event) = pending.next().await {
            match event {
                Lookup::Named {
                    answer: Err(problem),
                    ..
                } => problems.push(problem),
                Lookup::Named {
                    sentinel,
                    answer: Ok((host, port)),
                } => {
                    if tried.contains(&(host.clone(), port)) {
                        continue;
                    }
                    tried.push((host.clone(), port));
                    let addr = primary_addr(host, port, tls);
                    pending.push(
                        async move {
                            let outcome = self.try_primary(&addr, settings, phase).await;
                            Lookup::Tried {
                                named: format!("primary {addr} (named by sentinel {sentinel})"),
                                outcome,
                            }
                        }
                        .boxed(),
                    );
                }
                Lookup::Tried {
                    outcome: Ok(opened),
                    ..
                } => return Ok(opened),
                Lookup::Tried {
                    named,
                    outcome: Err((refused, problem)),
                } => {
                    refusals.push(refused);
                    problems.push(format!("{named}: {problem}"));
                }
            }
        }
        Err(no_primary(master, &refusals, &problems))
    }

    /// `SENTINEL GET-MASTER-ADDR-BY-NAME master` on one Sentinel; why not, as a problem.
    async fn ask_sentinel(
        &self,
        sentinel: &ConnectionInfo,
        master: &str,
    ) -> Result<(String, u16), String> {
        let name = sentinel.addr().to_string();
        let opened = self
            .open_addr(
                sentinel.addr(),
                sentinel.redis_settings(),
                &Phase::default(),
            )
            .await
            .map_err(|e| format!("sentinel {name}: {}", ErrorChain(&e)))?;
        let reply: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(master)
            .query_async(&mut opened.conn.clone())
            .await
            .map_err(|e| format!("sentinel {name}: {}", ErrorChain(&e)))?;
        reply.ok_or_else(|| format!("sentinel {name} does not know {master:?}"))
    }

    /// Opens a connection to a primary a Sentinel named and checks that it is one (`ROLE`;
    /// during a failover a Sentinel may still name the old primary). Why not, as a problem,
    /// with the kind of failure when the server refused the connection (a password, a
    /// certificate).
    async fn try_primary(
        &self,
        addr: &ConnectionAddr,
        settings: &RedisConnectionInfo,
        phase: &Phase,
    ) -> Result<Opened, (Option<ConnectErrorKind>, String)> {
        let opened = match self.open_addr(addr, settings, phase).await {
            Ok(opened) => opened,
            Err(e @ Error::Connect(_)) if !is_transient(&e) => {
                let kind = match &e {
                    Error::Connect(c) => Some(c.kind()),
                    _ => None,
                };
                return Err((kind, ErrorChain(&e).to_string()));
            }
            Err(e) => return Err((None, ErrorChain(&e).to_string())),
        };
        // A server that fails `ROLE` (it went down, or it is loading) is one problem among
        // the answers, not the end of the search.
        let role: redis::Value = redis::cmd("ROLE")
            .query_async(&mut opened.conn.clone())
            .await
            .map_err(|e| {
                (
                    None,
                    format!(
                        "ROLE failed: {}",
                        ErrorChain(&classify(&addr.to_string(), e))
                    ),
                )
            })?;
        match role_name(&role) {
            Some("master") => Ok(opened),
            other => Err((
                None,
                format!("is a {} now", other.unwrap_or("server of unknown role")),
            )),
        }
    }
}

/// What a step of a Sentinel lookup found.
enum Lookup {
    /// A Sentinel's answer: the primary's address, or why there is none.
    Named {
        sentinel: String,
        answer: Result<(String, u16), String>,
    },
    /// A named primary, tried.
    Tried {
        named: String,
        outcome: Result<Opened, (Option<ConnectErrorKind>, String)>,
    },
}

/// Reads the target of a Sentinel store: every Sentinel URL (`redis://` or `rediss://`),
/// and the settings for the primary (credentials and database from `settings` when given,
/// else from the first Sentinel URL).
pub(crate) fn sentinel_target(
    sentinels: &[&str],
    master: &str,
    settings: Option<RedisConnectionInfo>,
) -> Result<Target, Error> {
    if sentinels.is_empty() {
        return Err(Error::Config(ConfigError::new(
            "sentinels",
            "at least one Sentinel address is needed",
        )));
    }
    if master.is_empty() {
        return Err(Error::Config(ConfigError::new(
            "master",
            "the master name is empty",
        )));
    }
    let infos = sentinels
        .iter()
        .map(|s| {
            s.into_connection_info().map_err(|e| {
                Error::Config(ConfigError::new(
                    "sentinels",
                    format!("{}: {e}", redact_url(s)),
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tls = matches!(infos[0].addr(), ConnectionAddr::TcpTls { .. });
    if infos
        .iter()
        .any(|i| matches!(i.addr(), ConnectionAddr::TcpTls { .. }) != tls)
    {
        return Err(Error::Config(ConfigError::new(
            "sentinels",
            "mixes redis:// and rediss:// addresses",
        )));
    }
    // A Sentinel has no databases: its URL's credentials are the Sentinel's, and the primary's
    // by default.
    let settings = settings.unwrap_or_else(|| infos[0].redis_settings().clone());
    let infos = infos
        .into_iter()
        .map(|info| {
            let db0 = info.redis_settings().clone().set_db(0);
            info.set_redis_settings(db0)
        })
        .collect();
    Ok(Target::Sentinel {
        sentinels: infos,
        master: master.to_owned(),
        settings,
        tls,
    })
}

/// True when `target` (or any Sentinel of it) uses TLS.
pub(crate) fn uses_tls(target: &Target) -> bool {
    match target {
        Target::Direct(info) => matches!(info.addr(), ConnectionAddr::TcpTls { .. }),
        Target::Sentinel { tls, .. } => *tls,
        Target::Client(_) => false,
    }
}

/// How far opening a connection got, for the message of a timeout.
#[derive(Default)]
pub(crate) struct Phase(std::sync::atomic::AtomicU8);

#[derive(Clone, Copy)]
#[repr(u8)]
enum Step {
    Tcp = 1,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    Tls = 2,
    Redis = 3,
}

impl Phase {
    fn set(&self, step: Step) {
        self.0.store(step as u8, Ordering::Relaxed);
    }

    fn hint(&self) -> &'static str {
        match self.0.load(Ordering::Relaxed) {
            1 => " while opening the TCP connection",
            2 => " during the TLS handshake: is this a TLS port?",
            3 => {
                " after the TCP (and TLS) connection, during the Redis handshake: \
                 a TLS port spoken to in plain text (use rediss://), a server that is not \
                 Redis, or a Redis that does not answer (paused, overloaded)?"
            }
            _ => "",
        }
    }
}

fn role_name(role: &redis::Value) -> Option<&str> {
    let redis::Value::Array(items) = role else {
        return None;
    };
    match items.first()? {
        redis::Value::BulkString(b) => std::str::from_utf8(b).ok(),
        redis::Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

fn config() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(None)
}

async fn ping(addr: &str, mut conn: MultiplexedConnection) -> Result<(), Error> {
    redis::cmd("PING")
        .query_async::<()>(&mut conn)
        .await
        .map_err(|e| classify(addr, e))
}

fn connect_error(kind: ConnectErrorKind, message: String) -> Error {
    Error::Connect(ConnectError::new(kind, message))
}

/// Failures that another address or a later try may not have.
fn is_transient(e: &Error) -> bool {
    match e {
        Error::Connect(c) => matches!(
            c.kind(),
            ConnectErrorKind::Unreachable | ConnectErrorKind::TimedOut | ConnectErrorKind::Other
        ),
        _ => true,
    }
}

/// Names what a failure while connecting to `addr` means.
pub(crate) fn classify(addr: &str, e: redis::RedisError) -> Error {
    let kind = match e.code() {
        Some("NOAUTH") => ConnectErrorKind::AuthRequired,
        Some("WRONGPASS") | Some("NOPERM") => ConnectErrorKind::AuthFailed,
        // `AUTH` sent to a server without a password, or an old server's wording.
        Some("ERR")
            if e.detail()
                .is_some_and(|d| d.contains("AUTH") || d.contains("password")) =>
        {
            ConnectErrorKind::AuthFailed
        }
        _ if e.kind() == redis::ErrorKind::AuthenticationFailed => ConnectErrorKind::AuthFailed,
        _ if is_tls(&e) => ConnectErrorKind::Tls,
        _ if e.is_timeout() => ConnectErrorKind::TimedOut,
        _ if e.is_connection_refusal() => ConnectErrorKind::Unreachable,
        _ => ConnectErrorKind::Other,
    };
    let hint = match kind {
        ConnectErrorKind::AuthRequired => {
            " (give the password in the URL: redis://:PASSWORD@HOST:PORT or redis://USER:PASSWORD@HOST:PORT)"
        }
        _ => "",
    };
    Error::Connect(ConnectError::new(kind, format!("{addr}{hint}")).caused_by(e))
}

/// A failure of the Redis handshake over plain TCP; a server that closes the connection at
/// once is most likely a TLS port.
fn plain_handshake_failed(addr: &str, e: redis::RedisError) -> Error {
    let dropped = e.is_io_error() || e.is_connection_dropped();
    match classify(addr, e) {
        Error::Connect(c) if dropped && c.kind() == ConnectErrorKind::Other => {
            Error::Connect(c.explained(
                " (the server closed the connection during the Redis handshake: \
                 a TLS port spoken to in plain text? use rediss://)",
            ))
        }
        other => other,
    }
}

/// True when `e` comes from TLS: the server refused the client's certificate after the
/// handshake (TLS 1.3 sends that alert with its first answer), or the session broke.
fn is_tls(e: &redis::RedisError) -> bool {
    #[cfg(feature = "tls")]
    {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(err) = source {
            if err.is::<rustls::Error>() {
                return true;
            }
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                if io
                    .get_ref()
                    .is_some_and(|inner| inner.is::<rustls::Error>())
                {
                    return true;
                }
            }
            source = err.source();
        }
        // redis-rs may keep only the message of the I/O error.
        let text = e.to_string();
        text.contains("received fatal alert") || text.contains("peer certificate")
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = e;
        false
    }
}

/// A TCP connection to `host:port`, trying each address it resolves to in turn.
async fn tcp(host: &str, port: u16) -> Result<tokio::net::TcpStream, Error> {
    let unreachable = |what: String| ConnectError::new(ConnectErrorKind::Unreachable, what);
    let addrs = tokio::net::lookup_host((host, port)).await.map_err(|e| {
        Error::Connect(unreachable(format!("{host}:{port}: cannot resolve {host}")).caused_by(e))
    })?;
    let mut last = None;
    for addr in addrs {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => {
                tune(&stream);
                return Ok(stream);
            }
            Err(e) if addr.to_string() == format!("{host}:{port}") => {
                last = Some(unreachable(addr.to_string()).caused_by(e))
            }
            Err(e) => last = Some(unreachable(format!("{host}:{port} ({addr})")).caused_by(e)),
        }
    }
    Err(Error::Connect(last.unwrap_or_else(|| {
        unreachable(format!("{host}:{port}: {host} has no address"))
    })))
}

/// Keepalive and the user timeout; best effort.
fn tune(stream: &tokio::net::TcpStream) {
    let socket = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL);
    let _ = socket.set_tcp_keepalive(&keepalive);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = socket.set_tcp_user_timeout(Some(TCP_USER_TIMEOUT));
}

/// The address of a primary a Sentinel named.
fn primary_addr(host: String, port: u16, tls: bool) -> ConnectionAddr {
    if tls {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host, port)
    }
}

/// The error when no primary named by the Sentinels worked: the kind the primaries' failures
/// share when they all refused the same way, else [`ConnectErrorKind::NoPrimary`]; every
/// problem listed.
fn no_primary(master: &str, refusals: &[Option<ConnectErrorKind>], problems: &[String]) -> Error {
    let kind = match refusals.split_first() {
        Some((Some(first), rest)) if rest.iter().all(|k| *k == Some(*first)) => *first,
        _ => ConnectErrorKind::NoPrimary,
    };
    connect_error(
        kind,
        format!("no primary for {master:?}: {}", problems.join("; ")),
    )
}
