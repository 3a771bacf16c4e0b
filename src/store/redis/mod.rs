//! The Redis store: checks run as atomic Lua scripts, on one server, a pool or a cluster.

/// A script of `lua/` with the shared prelude before it (and libraries of `lua/` after the
/// prelude, when named), built (and hashed) once:
/// `static S: LazyLock<Script> = prelude_script!("file.lua");`.
macro_rules! prelude_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/prelude.lua")),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file))
            ))
        })
    };
    ($file:literal, after $($library:literal),+) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/prelude.lua")),
                $(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $library)),)+
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file))
            ))
        })
    };
}

/// A GCRA script of `lua/` with the GCRA core before it (and no prelude), built (and hashed)
/// once: `static S: LazyLock<Script> = gcra_script!("gcra.lua");`.
macro_rules! gcra_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/gcra_core.lua")),
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file))
            ))
        })
    };
}

pub(crate) mod algorithms;
mod autoban;
mod batch;
mod builder;
mod connect;
mod connection;
pub(crate) mod keys;
mod leases;
mod link;
#[cfg(test)]
mod operating;
mod packed;
mod redact;
mod regional;
mod reply;
mod reserve;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(feature = "tls")]
mod tls;
mod upstream;

pub use self::{
    batch::Batching,
    builder::{RedisStoreBuilder, DEFAULT_CONNECT_TIMEOUT},
    regional::{RegionStats, RegionalStore, RegionalStoreBuilder, REGION_CUTS, REGION_CUT_OFF},
};
pub use crate::error::{ConnectError, ConnectErrorKind};
/// The connection pool [`RedisStore::from_pool`] takes, so that yours matches its version.
pub use bb8;
/// The pool's Redis connection manager, so that yours matches its version.
pub use bb8_redis;

use std::{fmt, sync::Arc};

use bb8::Pool;
use bb8_redis::RedisConnectionManager;
use redis::{aio::ConnectionLike, cluster_async::ClusterConnection};

use self::{
    algorithms::{on, ResetCall},
    batch::Batcher,
    link::{Link, Shared},
};
use super::{
    offences::{BanTerms, Counted},
    Acquired, Backend, BoxFuture, Gate, KeyBuf, Learned, Ledger, Namespaces, Pace, Peeked,
    Reserved, Scheduled, Sent, SlotTerms, Slots, Store, StoreKey, Upstreams,
};
use crate::{
    algorithm::{Algorithm, Outcome},
    decision::Charge,
    error::{ConfigError, Error},
};

/// Counters in Redis, shared by every instance that points at the same server.
///
/// Each check is one `EVALSHA` of the algorithm's script (falling back to loading it when Redis
/// answers `NOSCRIPT`, e.g. after a restart or `SCRIPT FLUSH`). Requires Redis 5.0 or later
/// (script effects replication) or Valkey; checked on Redis 5.0.7, 6.2.14 and 7.0 and Valkey
/// 9.1.2 (see [the guide](crate::guide::production_redis#servers)).
///
/// How it reaches Redis:
/// - [`connect`](Self::connect), [`connect_lazy`](Self::connect_lazy) and the
///   [`builder`](Self::builder)'s `connect`, `connect_sentinel` and `connect_client`: one
///   multiplexed connection (concurrent checks pipeline on one socket), replaced as soon as
///   it closes (Redis' idle `timeout`, a NAT, a restart), so that the next check goes out on
///   a new one instead of failing. A check whose connection was cut after it was sent is not
///   sent again (it may have spent units). The default, and the fastest.
/// - [`connect_cluster`](Self::connect_cluster): a Redis Cluster. Every key of one check
///   carries the same hash tag, so each check runs on one node; `MOVED`/`ASK` redirections
///   during resharding and failovers are followed, and a node that lost its scripts reloads
///   them on `NOSCRIPT`.
/// - [`from_connection`](Self::from_connection), [`from_cluster`](Self::from_cluster) and
///   [`from_pool`](Self::from_pool): a connection, cluster connection or bb8-redis pool you
///   built.
///
/// ```no_run
/// use tower_redis_ratelimit::RedisStore;
///
/// # async fn run() -> Result<(), tower_redis_ratelimit::Error> {
/// // Connects now, so a wrong URL fails at start-up.
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    link: Link,
    batcher: Option<Batcher>,
    namespaces: Arc<Namespaces>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RedisStore");
        match &self.link {
            Link::Multiplexed(_) => d.field("backend", &"multiplexed"),
            Link::Pool(p) => d.field("pool", &p.state()),
            Link::Cluster(_) => d.field("backend", &"cluster"),
            Link::Shared(_) => d.field("backend", &"your connection"),
        };
        d.field("batching", &self.batcher.as_ref().map(Batcher::config));
        d.finish()
    }
}

impl RedisStore {
    /// Settings for connecting: timeout, TLS, lazy start, Sentinel, Cluster (see
    /// [`RedisStoreBuilder`]).
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// Connects to `url` (e.g. `redis://127.0.0.1:6379/0`, `rediss://` for TLS with the
    /// system's roots) and waits until the server answers a `PING`, within
    /// [`DEFAULT_CONNECT_TIMEOUT`], so that a wrong address, a missing password or an
    /// untrusted certificate fails here, with a [`ConnectError`]
    /// saying which, rather than on the first request.
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::builder().connect(url).await
    }

    /// Like [`RedisStore::connect`], but connects on the first check (so the app can start
    /// while Redis is away; checks fail, and the failure policy applies, until it answers).
    /// The URL is still parsed now.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a URL that does not parse; connecting fails later, in the first
    /// checks.
    pub fn connect_lazy(url: &str) -> Result<Self, Error> {
        Self::builder().lazy_direct(url)
    }

    /// `url` as it may be shown in a message, a log or a banner: with `***` in place of the
    /// password (`redis://:***@HOST`, `rediss://USER:***@HOST`, `redis+unix:///PATH?pass=***`;
    /// a user information without a colon, `redis://SECRET@HOST`, is hidden whole). Anything
    /// that is not a well-formed URL errs towards hiding more. The store's own errors and
    /// logs never show a password.
    ///
    /// ```
    /// use tower_redis_ratelimit::RedisStore;
    ///
    /// assert_eq!(
    ///     RedisStore::redact_url("redis://app:s3cret@10.0.0.1:6379/0"),
    ///     "redis://app:***@10.0.0.1:6379/0"
    /// );
    /// assert_eq!(RedisStore::redact_url("redis://10.0.0.1:6379"), "redis://10.0.0.1:6379");
    /// ```
    pub fn redact_url(url: &str) -> std::borrow::Cow<'_, str> {
        redact::redact_url(url)
    }

    /// Connects to a Redis Cluster through any of its `nodes` (e.g.
    /// `["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"]`) and waits for the slot map, so a
    /// wrong address fails here. See [`RedisStoreBuilder::connect_cluster`].
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect_cluster`].
    pub async fn connect_cluster<S: AsRef<str>>(nodes: &[S]) -> Result<Self, Error> {
        Self::builder().connect_cluster(nodes).await
    }

    /// Uses a multiplexed connection you built: a `redis::aio::MultiplexedConnection`, a
    /// `redis::aio::ConnectionManager` (which reconnects by itself) or any other cloneable
    /// async connection. Each check clones it. What happens when it breaks is up to it: a
    /// plain `MultiplexedConnection` is not replaced, so prefer
    /// [`RedisStoreBuilder::connect_client`] or a `ConnectionManager`.
    pub fn from_connection<C>(connection: C) -> Self
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        Self::new(Link::Shared(Shared::new(connection)))
    }

    /// Uses a Redis Cluster connection you built with redis-rs' `ClusterClient` (your
    /// retries, timeouts, TLS, read routing).
    pub fn from_cluster(connection: ClusterConnection) -> Self {
        Self::new(Link::Cluster(connection))
    }

    /// Uses an existing bb8-redis pool.
    ///
    /// A check holds a pooled connection only long enough to clone its multiplexed handle. Keep
    /// bb8's default `test_on_check_out(true)`: bb8-redis cannot tell that a connection broke
    /// (for example when Redis restarted), and the check-out `PING` is what replaces it. That
    /// `PING` costs a round trip per check; [`connect`](Self::connect) has neither the cost
    /// nor the problem.
    pub fn from_pool(pool: Pool<RedisConnectionManager>) -> Self {
        Self::new(Link::Pool(pool))
    }

    pub(crate) fn new(link: Link) -> Self {
        Self {
            link,
            batcher: None,
            namespaces: Arc::default(),
        }
    }

    /// Sends concurrent checks to Redis together, as one script call per batch (exact
    /// batching).
    ///
    /// While fewer than [`max_in_flight`](Batching::max_in_flight) calls are on their way,
    /// a check leaves at once; checks arriving meanwhile queue up and leave together as one
    /// call of the algorithm's script in batch form, which decides them one after the other
    /// inside one atomic call. Every check gets exactly the decision its own
    /// call would have got at that instant, so limits hold as they do without batching; under
    /// load, Redis runs one script call for many checks. A check whose caller stopped waiting
    /// (its store timeout passed) before its batch left is not sent, and a call that takes
    /// longer than [`call_timeout`](Batching::call_timeout) fails its checks with a timeout.
    /// Custom algorithms are sent alone unless they are
    /// [batchable](crate::algorithm::Scripted::batchable).
    ///
    /// On a cluster, only checks on the same slot can share a call, and calls are never held
    /// back (a slow node must not delay checks bound for the others): checks queued at the
    /// same moment on the same slot share a call, the rest go as they would without
    /// batching. It rarely pays there.
    ///
    /// Errors when `batching` is out of range (naming the field) or when called outside a
    /// Tokio runtime (the batching task runs on it).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first batching setting that cannot work.
    ///
    /// ```no_run
    /// use tower_redis_ratelimit::{RedisStore, store::redis::Batching};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379")
    ///     .await?
    ///     .with_batching(Batching::new().max_batch(64))?;
    /// # Ok(()) }
    /// ```
    pub fn with_batching(mut self, batching: Batching) -> Result<Self, ConfigError> {
        self.batcher = Some(Batcher::start(self.link.clone(), batching)?);
        Ok(self)
    }

    /// Sends every check alone (the default).
    pub fn without_batching(mut self) -> Self {
        self.batcher = None;
        self
    }

    /// The batching in use, if any.
    pub fn batching(&self) -> Option<Batching> {
        self.batcher.as_ref().map(Batcher::config)
    }
}

/// What `lua/forget.lua` does with a GCRA state given first, instead of deleting it.
#[derive(Clone, Copy)]
enum Keep {
    /// Deletes every key.
    Nothing,
    /// Keeps the state's TAT, deleting its ban's copy (an unban).
    Tat,
}

impl RedisStore {
    /// Deletes `keys` (all of one base key, so of one hash slot) in one script call, but what
    /// `keep` keeps of the GCRA state given first.
    fn forget(&self, keys: Vec<Vec<u8>>, keep: Keep) -> BoxFuture<'_, Result<(), Error>> {
        let mut cmd = link::evalsha_keys(
            &algorithms::FORGET,
            keys.len(),
            (keys.len() + 4, 256),
            |cmd| {
                for k in &keys {
                    cmd.arg(k.as_slice());
                }
            },
        );
        match keep {
            Keep::Nothing => {}
            Keep::Tat => {
                cmd.arg("keep-tat");
            }
        }
        Box::pin(async move {
            match self.link.eval(&algorithms::FORGET, &cmd).await? {
                redis::Value::Int(_) => Ok(()),
                other => Err(Error::InvalidReply(format!(
                    "a deletion answered {other:?}"
                ))),
            }
        })
    }
}

impl Store for RedisStore {}

impl Backend for RedisStore {
    fn check<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Outcome, Error>> {
        // Only valid arguments reach the scripts (GCRA's check validates none: see lua/gcra.lua).
        if cost == 0 {
            return Box::pin(std::future::ready(Err(Error::InvalidInput(
                "cost must be at least 1",
            ))));
        }
        if now_us.is_some_and(|t| t > crate::quota::MAX_EXACT) {
            return Box::pin(std::future::ready(Err(Error::InvalidInput(
                "explicit time must be under 2^52 microseconds",
            ))));
        }
        // Everything the call needs is copied before the future: it borrows no key.
        let call = on!(algorithm, check(cost));
        if let (Some(batcher), Some(batch)) = (&self.batcher, call.batch) {
            let layout = call.layout;
            let mut keys = packed::Keys::default();
            call.each_key(key, |k| keys.push(k));
            let args = packed::Args::new(call.args());
            return Box::pin(async move {
                let reply = batcher.submit(batch, layout, keys, args, now_us).await?;
                on!(algorithm, parse(cost, reply))
            });
        }
        let cmd = call.command(key, now_us);
        let script = call.script;
        Box::pin(async move {
            let reply = self.link.eval(script, &cmd).await?;
            on!(algorithm, parse(cost, reply))
        })
    }

    /// One script call, never batched (a refund is rarer than a check, and its answer is not
    /// waited on by a decision).
    fn refund<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        charge: &'a Charge,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let call = match on!(algorithm, refund(charge, self.link.is_cluster())) {
            Ok(Some(call)) => call,
            Ok(None) => return Box::pin(std::future::ready(Ok(false))),
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let cmd = call.command(key, now_us);
        let script = call.script;
        Box::pin(async move { algorithms::parse_refund(self.link.eval(script, &cmd).await?) })
    }

    /// One script call, never batched, like a refund.
    fn settle<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        charge: &'a Charge,
        actual: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let call = match on!(algorithm, settle(charge, actual, self.link.is_cluster())) {
            Ok(Some(call)) => call,
            Ok(None) => return Box::pin(std::future::ready(Ok(false))),
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let cmd = call.command(key, now_us);
        let script = call.script;
        Box::pin(async move { algorithms::parse_refund(self.link.eval(script, &cmd).await?) })
    }

    /// One script call, never batched (one call stands for a whole lease of checks).
    fn reserve<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        up_to: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Reserved, Error>> {
        let call = match on!(algorithm, reserve(cost, up_to)) {
            Ok(call) => call,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let (script, cmd) = (call.script, call.command(key, now_us));
        Box::pin(async move { reserve::parse(self.link.eval(script, &cmd).await?, cost, up_to) })
    }

    fn schedules(&self) -> bool {
        true
    }

    /// One script call, never batched.
    fn schedule<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        (cost, budget_us): (u32, u64),
        pace: Pace,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Scheduled, Error>> {
        let call = match on!(algorithm, schedule(cost, budget_us, pace)) {
            Ok(call) => call,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let (script, cmd) = (call.script, call.command(key, now_us));
        Box::pin(async move { reserve::parse_schedule(self.link.eval(script, &cmd).await?) })
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        Some(&self.namespaces)
    }

    /// One read-only script call, never batched.
    fn peek<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Peeked, Error>> {
        let call = match on!(algorithm, peek()) {
            Ok(call) => call,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        let (script, cmd) = (call.script, call.command(key, now_us));
        Box::pin(async move {
            algorithms::parse_peek(algorithm.parts(), self.link.eval(script, &cmd).await?)
        })
    }

    fn reset<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let call = match on!(algorithm, reset()) {
            ResetCall::Script(call) => call,
            ResetCall::Delete(suffixes) => {
                return self.forget(algorithms::suffixed_keys(suffixes, key), Keep::Nothing)
            }
        };
        let (script, cmd) = (call.script, call.command(key, now_us));
        Box::pin(async move {
            match self.link.eval(script, &cmd).await? {
                redis::Value::Int(_) => Ok(()),
                other => Err(Error::InvalidReply(format!("a reset answered {other:?}"))),
            }
        })
    }

    fn ban<'a>(
        &'a self,
        key: StoreKey<'a>,
        duration_us: u64,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        // The ban, and its copy in the key's GCRA state (which GCRA's checks read instead).
        let mut ban = KeyBuf::new();
        keys::write_key(key, keys::BAN, &mut ban);
        let mut state = KeyBuf::new();
        keys::write_key(key, keys::GCRA, &mut state);
        // The refusals counted toward an automatic ban: they start afresh with a ban.
        let mut refusals = KeyBuf::new();
        keys::write_key(key, keys::REFUSALS, &mut refusals);
        let mut cmd = link::evalsha(
            &algorithms::BAN,
            3,
            |cmd| {
                cmd.arg(ban.as_bytes())
                    .arg(state.as_bytes())
                    .arg(refusals.as_bytes());
            },
            now_us,
        );
        cmd.arg(duration_us);
        Box::pin(async move {
            let ends = self.link.eval(&algorithms::BAN, &cmd).await?;
            match ends {
                redis::Value::Int(_) => Ok(()),
                other => Err(Error::InvalidReply(format!("a ban answered {other:?}"))),
            }
        })
    }

    fn mark<'a>(
        &'a self,
        namespace: &'a str,
        token: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, Error>> {
        let mut marker = KeyBuf::new();
        keys::write_marker(namespace, &mut marker);
        let mut cmd = link::evalsha_keys(&algorithms::MARKER, 1, (4, 128), |cmd| {
            cmd.arg(marker.as_bytes());
        });
        cmd.arg(token);
        Box::pin(async move {
            match self.link.eval(&algorithms::MARKER, &cmd).await? {
                redis::Value::BulkString(token) => Ok(token),
                other => Err(Error::InvalidReply(format!(
                    "a store marker answered {other:?}"
                ))),
            }
        })
    }

    fn publish_top<'a>(
        &'a self,
        namespace: &'a str,
        instance: &'a str,
        snapshot: &'a [u8],
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let (mut snapshots, mut published) = (KeyBuf::new(), KeyBuf::new());
        keys::write_tops(namespace, &mut snapshots, &mut published);
        let mut cmd = link::evalsha_keys(
            &algorithms::TOP_PUBLISH,
            2,
            (8, 128 + snapshot.len()),
            |cmd| {
                cmd.arg(snapshots.as_bytes()).arg(published.as_bytes());
            },
        );
        cmd.arg(instance).arg(snapshot).arg(ttl.as_millis() as u64);
        Box::pin(async move {
            match self.link.eval(&algorithms::TOP_PUBLISH, &cmd).await? {
                redis::Value::Int(_) => Ok(()),
                other => Err(Error::InvalidReply(format!(
                    "a publication of top keys answered {other:?}"
                ))),
            }
        })
    }

    fn read_tops<'a>(
        &'a self,
        namespace: &'a str,
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<crate::store::Snapshots, Error>> {
        let (mut snapshots, mut published) = (KeyBuf::new(), KeyBuf::new());
        keys::write_tops(namespace, &mut snapshots, &mut published);
        let mut cmd = link::evalsha_keys(&algorithms::TOP_READ, 2, (6, 128), |cmd| {
            cmd.arg(snapshots.as_bytes()).arg(published.as_bytes());
        });
        cmd.arg(ttl.as_millis() as u64);
        Box::pin(async move {
            let reply = self.link.eval(&algorithms::TOP_READ, &cmd).await?;
            let redis::Value::Array(items) = reply else {
                return Err(Error::InvalidReply(format!(
                    "a read of top keys answered {reply:?}"
                )));
            };
            let mut pairs = Vec::with_capacity(items.len() / 2);
            let mut items = items.into_iter();
            while let (Some(instance), Some(snapshot)) = (items.next(), items.next()) {
                match (instance, snapshot) {
                    (redis::Value::BulkString(i), redis::Value::BulkString(s)) => {
                        pairs.push((i, s))
                    }
                    other => {
                        return Err(Error::InvalidReply(format!(
                            "a read of top keys answered {other:?}"
                        )))
                    }
                }
            }
            Ok(pairs)
        })
    }

    fn count_refusal<'a>(
        &'a self,
        key: StoreKey<'a>,
        terms: &'a BanTerms,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Counted, Error>> {
        let cmd = autoban::call(key, terms, now_us);
        Box::pin(async move { autoban::counted(self.link.eval(&autoban::AUTOBAN, &cmd).await?) })
    }

    fn unban<'a>(&'a self, key: StoreKey<'a>) -> BoxFuture<'a, Result<(), Error>> {
        let mut ban = KeyBuf::new();
        keys::write_key(key, keys::BAN, &mut ban);
        let mut state = KeyBuf::new();
        keys::write_key(key, keys::GCRA, &mut state);
        self.forget(
            vec![state.as_bytes().to_vec(), ban.as_bytes().to_vec()],
            Keep::Tat,
        )
    }

    /// Every check goes through [`check`](Backend::check): every answer is a round trip to Redis.
    fn check_now(
        &self,
        _algorithm: &dyn Algorithm,
        _key: StoreKey<'_>,
        _cost: u32,
        _now_us: Option<u64>,
    ) -> Option<Result<Outcome, Error>> {
        None
    }

    fn refund_now(
        &self,
        _algorithm: &dyn Algorithm,
        _key: StoreKey<'_>,
        _charge: &Charge,
        _now_us: Option<u64>,
    ) -> Option<Result<bool, Error>> {
        None
    }

    fn settle_now(
        &self,
        _algorithm: &dyn Algorithm,
        _key: StoreKey<'_>,
        _charge: &Charge,
        _actual: u32,
        _now_us: Option<u64>,
    ) -> Option<Result<bool, Error>> {
        None
    }

    /// On the servers' clocks: the wall clock.
    fn manual_clock(&self) -> bool {
        false
    }

    fn clock(&self) -> Option<crate::store::memory::ManualClock> {
        None
    }

    fn regional(&self) -> bool {
        false
    }

    /// Any store timeout: a call that takes longer fails by it.
    fn check_timeout(&self, _timeout: std::time::Duration) -> Result<(), ConfigError> {
        Ok(())
    }
}

impl Slots for RedisStore {
    fn release_all<'a>(&'a self, key: StoreKey<'a>) -> BoxFuture<'a, Result<(), Error>> {
        let mut holders = KeyBuf::new();
        keys::write_key(key, keys::HOLDERS, &mut holders);
        self.forget(vec![holders.as_bytes().to_vec()], Keep::Nothing)
    }

    fn acquire<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        terms: &'a SlotTerms,
    ) -> BoxFuture<'a, Result<Acquired, Error>> {
        self.acquire_holder(key, holder, terms)
    }

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        terms: &'a SlotTerms,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.renew_holder(key, holder, terms)
    }

    fn release<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        late_renewal: Option<std::time::Duration>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.release_holder(key, holder, late_renewal)
    }

    /// Every release is a round trip to Redis.
    fn release_now(&self, _key: StoreKey<'_>, _holder: &str) -> Option<Result<(), Error>> {
        None
    }
}

impl Upstreams for RedisStore {
    fn take<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        cost: u32,
        budget: std::time::Duration,
    ) -> BoxFuture<'a, Result<Gate, Error>> {
        self.take_units(key, ledger, cost, budget)
    }

    fn learn<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        learned: Learned,
        how: Sent,
        cost: u32,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.learn_said(key, ledger, learned, how, cost)
    }

    fn settle<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        taken: u64,
        used: u64,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.settle_used(key, ledger, taken, used)
    }
}
