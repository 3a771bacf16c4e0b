//! How a [`RedisStore`] connects: the connect timeout, TLS material, lazy start, and the
//! three kinds of deployment (one server, Sentinel, Cluster).

use std::{fmt, time::Duration};

use redis::{cluster::ClusterClient, IntoConnectionInfo, RedisConnectionInfo};

use super::{
    connect::{self, Connector, Target},
    connection::Supervised,
    link::Link,
    redact::redact_url,
    RedisStore,
};
use crate::error::{ConfigError, ConnectError, ConnectErrorKind, Error};

/// The default bound on connecting: TCP, TLS, the handshake and a `PING`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Settings for connecting a [`RedisStore`]; made by [`RedisStore::builder`].
///
/// Connecting runs a whole round trip (TCP, TLS for `rediss://`, `AUTH` when the URL has
/// credentials, `PING`) within [`connect_timeout`](Self::connect_timeout), so that a wrong
/// address, password or certificate fails at start-up with a [`ConnectError`] saying which.
/// Every later reconnect runs the same checks.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_redis_ratelimit::RedisStore;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// // A managed Redis with TLS and a private CA, a password in the URL.
/// let store = RedisStore::builder()
///     .connect_timeout(Duration::from_secs(2))
///     .ca_pem(std::fs::read("/etc/redis/ca.pem")?)
///     .connect("rediss://:secret@redis.internal:6380")
///     .await?;
///
/// // Three Sentinels watching the master named "rl".
/// let store = RedisStore::builder()
///     .connect_sentinel(
///         &["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
///         "rl",
///     )
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStoreBuilder {
    connect_timeout: Duration,
    lazy: bool,
    ca: Option<Vec<u8>>,
    client_cert: Option<(Vec<u8>, Vec<u8>)>,
    primary: Option<RedisConnectionInfo>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("connect_timeout", &self.connect_timeout)
            .field("lazy", &self.lazy)
            .field("ca_pem", &self.ca.is_some())
            .field("client_cert", &self.client_cert.is_some())
            .field("primary_auth", &self.primary.is_some())
            .finish()
    }
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            lazy: false,
            ca: None,
            client_cert: None,
            primary: None,
        }
    }
}

impl RedisStoreBuilder {
    /// The bound on connecting, each time a connection is opened (default
    /// [`DEFAULT_CONNECT_TIMEOUT`], 3 s). Must be above zero.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Starts without Redis: the connect methods return at once (after checking the
    /// configuration), checks fail, and the failure policy applies, until Redis answers; each
    /// later connection runs the same checks, and a failed one is logged with its cause.
    pub fn lazy(mut self, lazy: bool) -> Self {
        self.lazy = lazy;
        self
    }

    /// Trusts the certificate authorities in `pem` (one or more PEM certificates) for
    /// `rediss://` instead of the system's roots: a private CA, a managed service's CA.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(pem.into());
        self
    }

    /// Presents a client certificate (mutual TLS): `cert` is the PEM chain, `key` its PEM
    /// private key (PKCS#8, PKCS#1 or SEC1).
    pub fn client_cert_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// Credentials for the primary found through Sentinel, when they differ from those in
    /// the Sentinel URLs (by default the first Sentinel URL's user and password are used for
    /// the primary too). `username` is for an ACL user; `None` is the default user.
    pub fn primary_auth(mut self, username: Option<&str>, password: &str) -> Self {
        let mut settings = RedisConnectionInfo::default().set_password(password);
        if let Some(user) = username {
            settings = settings.set_username(user);
        }
        self.primary = Some(settings);
        self
    }

    /// Connects to the server at `url` (`redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`,
    /// `rediss://…` for TLS, `redis+unix:///path`).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a URL that does not parse or a setting that cannot work;
    /// [`Error::Connect`] when the server cannot be reached, refuses the credentials or the TLS
    /// handshake, or does not answer within the connect timeout
    /// ([`ConnectErrorKind`](crate::store::redis::ConnectErrorKind) says which).
    pub async fn connect(self, url: &str) -> Result<RedisStore, Error> {
        self.supervised(Target::Direct(connection_info(url)?)).await
    }

    /// Connects to the primary that the Sentinels at `sentinels` (e.g.
    /// `redis://10.0.0.1:26379`; `rediss://` when Sentinels and Redis use TLS) name for
    /// `master`.
    ///
    /// Every Sentinel is asked at once, and each distinct address named is tried as soon as
    /// it is named; the first that takes the credentials and answers `ROLE` as a primary is
    /// used, so one Sentinel naming a wrong server does not hide the primary the others name.
    /// When none works, the [`ConnectError`] lists every Sentinel's answer and every named
    /// server's failure. After a failover the old primary answers `READONLY` or drops its
    /// connections; the store then asks the Sentinels again, so checks go to the new primary
    /// once Sentinel has promoted it (the checks in between go to the failure policy).
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect); [`Error::Connect`] of kind `NoPrimary` when no Sentinel
    /// names a primary that works, listing each one's answer.
    pub async fn connect_sentinel<S: AsRef<str>>(
        self,
        sentinels: &[S],
        master: &str,
    ) -> Result<RedisStore, Error> {
        let sentinels: Vec<&str> = sentinels.iter().map(AsRef::as_ref).collect();
        let target = connect::sentinel_target(&sentinels, master, self.primary.clone())?;
        self.supervised(target).await
    }

    /// Connects with a client you built (any redis-rs option: RESP3, a credentials provider,
    /// your own TLS certificates). redis-rs opens each connection; the store still replaces a
    /// connection that failed and bounds connecting by the connect timeout. Unlike the other
    /// connect methods, a connection that Redis closed while idle is noticed only when a
    /// check fails on it.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect), for the client's first connection.
    pub async fn connect_client(self, client: redis::Client) -> Result<RedisStore, Error> {
        self.supervised(Target::Client(client)).await
    }

    /// Connects to a Redis Cluster through any of its `nodes` (`rediss://` for TLS) and waits
    /// for the slot map, within the connect timeout.
    ///
    /// Redirections (`MOVED`, `ASK`) and a failing-over node are retried for up to about a
    /// second (bounded anyway by the limiter's store timeout); what still fails goes to the
    /// failure policy. Lazy start is not available for a Cluster.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect), for the cluster's nodes.
    pub async fn connect_cluster<S: AsRef<str>>(self, nodes: &[S]) -> Result<RedisStore, Error> {
        self.validate()?;
        if self.lazy {
            return Err(Error::Config(ConfigError::new(
                "lazy",
                "lazy start is not available for a Redis Cluster",
            )));
        }
        let nodes: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
        let Some(first) = nodes.first() else {
            return Err(Error::Config(ConfigError::new(
                "nodes",
                "a cluster needs at least one node address",
            )));
        };
        let tls = nodes.iter().any(|n| n.starts_with("rediss://"));
        #[allow(unused_mut)]
        let mut builder = ClusterClient::builder(nodes.clone())
            .retries(6)
            .min_retry_wait(10)
            .max_retry_wait(250)
            // Short: while the client rebuilds its slot map after a failover, it may try the
            // dead node; each try costs up to this.
            .connection_timeout(self.connect_timeout.min(Duration::from_millis(500)));
        if tls {
            #[cfg(feature = "tls")]
            {
                // Checked here so that bad PEM is a ConfigError, not a connect failure.
                super::tls::client_config(&self.tls_pem())?;
                super::tls::ensure_process_provider();
                if self.ca.is_some() || self.client_cert.is_some() {
                    builder = builder.certs(self.tls_pem().to_redis());
                }
            }
            #[cfg(not(feature = "tls"))]
            return Err(Error::Config(ConfigError::new(
                "nodes",
                "rediss:// needs the `tls` feature of tower-redis-ratelimit",
            )));
        }
        let client = builder.build().map_err(|e| {
            Error::Config(ConfigError::new("nodes", "cannot build a cluster client").caused_by(e))
        })?;
        let connection =
            match tokio::time::timeout(self.connect_timeout, client.get_async_connection()).await {
                Ok(result) => result.map_err(|e| connect::classify(&redact_url(first), e))?,
                Err(_) => {
                    return Err(Error::Connect(ConnectError::new(
                        ConnectErrorKind::TimedOut,
                        format!(
                            "the cluster at {} did not answer within {:?} (the connect timeout)",
                            redact_url(first),
                            self.connect_timeout
                        ),
                    )))
                }
            };
        Ok(RedisStore::new(Link::Cluster(connection)))
    }

    fn validate(&self) -> Result<(), Error> {
        if self.connect_timeout.is_zero() {
            return Err(Error::Config(ConfigError::new(
                "connect_timeout",
                "must be above zero",
            )));
        }
        Ok(())
    }

    #[cfg(feature = "tls")]
    fn tls_pem(&self) -> super::tls::TlsPem {
        super::tls::TlsPem {
            ca: self.ca.clone(),
            client: self.client_cert.clone(),
        }
    }

    /// Checks the configuration and makes the connector (no I/O).
    fn connector(&self, target: Target) -> Result<Connector, Error> {
        self.validate()?;
        #[cfg(feature = "tls")]
        let tls = if connect::uses_tls(&target) || self.ca.is_some() || self.client_cert.is_some() {
            Some(super::tls::client_config(&self.tls_pem())?)
        } else {
            None
        };
        #[cfg(not(feature = "tls"))]
        if connect::uses_tls(&target) || self.ca.is_some() || self.client_cert.is_some() {
            return Err(Error::Config(ConfigError::new(
                "url",
                "TLS needs the `tls` feature of tower-redis-ratelimit",
            )));
        }
        Ok(Connector::new(
            target,
            self.connect_timeout,
            #[cfg(feature = "tls")]
            tls,
        ))
    }

    /// A store that connects on its first check (no I/O here).
    pub(crate) fn lazy_direct(self, url: &str) -> Result<RedisStore, Error> {
        let connector = self.connector(Target::Direct(connection_info(url)?))?;
        Ok(RedisStore::new(Link::Multiplexed(Supervised::lazy(
            connector,
        ))))
    }

    async fn supervised(self, target: Target) -> Result<RedisStore, Error> {
        let connector = self.connector(target)?;
        let conn = if self.lazy {
            Supervised::lazy(connector)
        } else {
            Supervised::connect(connector).await?
        };
        Ok(RedisStore::new(Link::Multiplexed(conn)))
    }
}

/// `url` read as one server's address; a URL it cannot read is a [`ConfigError`] naming
/// `url`, with the parser's error as its source.
fn connection_info(url: &str) -> Result<redis::ConnectionInfo, Error> {
    url.into_connection_info()
        .map_err(|e| Error::Config(ConfigError::new("url", "cannot be read").caused_by(e)))
}
