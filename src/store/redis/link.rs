//! How a [`RedisStore`](super::RedisStore) reaches Redis: one self-replacing connection, a
//! bb8 pool, or a cluster; and how a script call is sent on any of them.

use std::{sync::Arc, time::Duration};

use bb8::Pool;
use bb8_redis::RedisConnectionManager;
use redis::{
    aio::ConnectionLike, cluster_async::ClusterConnection, Cmd, RedisFuture, Script, Value,
};

use super::connection::Supervised;
use crate::error::Error;

/// Where a store sends its commands.
#[derive(Clone)]
pub(crate) enum Link {
    Multiplexed(Supervised),
    Pool(Pool<RedisConnectionManager>),
    Cluster(ClusterConnection),
    /// A connection the application built (`RedisStore::from_connection`).
    Shared(Shared),
}

/// Any cloneable async connection, erased; each call works on a clone.
#[derive(Clone)]
pub(crate) struct Shared(Arc<dyn Fn() -> Box<dyn ConnectionLike + Send> + Send + Sync>);

impl Shared {
    pub(crate) fn new<C: ConnectionLike + Clone + Send + Sync + 'static>(conn: C) -> Self {
        Self(Arc::new(move || Box::new(conn.clone())))
    }

    fn handle(&self) -> Handle {
        Handle((self.0)())
    }
}

/// One clone of a [`Shared`] connection.
struct Handle(Box<dyn ConnectionLike + Send>);

impl ConnectionLike for Handle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

impl Link {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Link::Cluster(_))
    }

    /// Runs `evalsha` (made by [`evalsha`]), loading `script` when Redis answers `NOSCRIPT`
    /// (after a restart or `SCRIPT FLUSH`; on a cluster, `SCRIPT LOAD` goes to every primary)
    /// and trying once more.
    pub(crate) async fn eval(
        &self,
        script: &Script,
        evalsha: &redis::Cmd,
    ) -> Result<redis::Value, Error> {
        match self {
            // Straight to the connection: no clone of the handle, no boxed future.
            Link::Multiplexed(conn) => match conn.query(evalsha).await {
                Err(e) if is_noscript(&e) => {
                    script.load_async(&mut conn.clone()).await?;
                    Ok(conn.query(evalsha).await?)
                }
                result => Ok(result?),
            },
            // EVALSHA is routed by the slot of its first key.
            Link::Cluster(cluster) => eval_on(&mut cluster.clone(), script, evalsha).await,
            Link::Shared(shared) => eval_on(&mut shared.handle(), script, evalsha).await,
            Link::Pool(pool) => {
                // A multiplexed connection is a cheap handle: clone it and return the pooled
                // one at once, so concurrent checks pipeline instead of queueing.
                let mut conn = pool.get().await.map_err(pool_error)?.clone();
                // Every call is bounded by its caller; redis-rs' default response timeout
                // (500 ms) would otherwise cut longer store timeouts short.
                conn.set_response_timeout(UNBOUNDED);
                eval_on(&mut conn, script, evalsha).await
            }
        }
    }
}

/// A response timeout that never fires before the caller's own timeout.
const UNBOUNDED: Duration = Duration::from_secs(24 * 3600);

async fn eval_on(
    conn: &mut impl redis::aio::ConnectionLike,
    script: &Script,
    evalsha: &redis::Cmd,
) -> Result<redis::Value, Error> {
    match evalsha.query_async(conn).await {
        Err(e) if is_noscript(&e) => {
            script.load_async(conn).await?;
            Ok(evalsha.query_async(conn).await?)
        }
        result => Ok(result?),
    }
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// `EVALSHA` of `script` with `keys` (`key_count` of them), then `ARGV[1]` (`now`, or `''`
/// for the server clock) and the arguments the caller adds. Built straight into one command
/// buffer: no per-argument allocation.
pub(crate) fn evalsha(
    script: &Script,
    key_count: usize,
    keys: impl FnOnce(&mut redis::Cmd),
    now: Option<u64>,
) -> redis::Cmd {
    evalsha_sized(script, key_count, (key_count + 8, 160), keys, now)
}

/// [`evalsha`] into a command sized for `capacity`: (arguments, bytes of arguments), so that
/// it is built without growing.
pub(crate) fn evalsha_sized(
    script: &Script,
    key_count: usize,
    capacity: (usize, usize),
    keys: impl FnOnce(&mut redis::Cmd),
    now: Option<u64>,
) -> redis::Cmd {
    let mut cmd = evalsha_keys(script, key_count, capacity, keys);
    match now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    cmd
}

/// `EVALSHA` of `script` with `keys` (`key_count` of them) and nothing after them, into a command
/// sized for `capacity` (as [`evalsha_sized`]): for the scripts that take the time last, and
/// only when it is explicit (`lua/gcra.lua`).
pub(crate) fn evalsha_keys(
    script: &Script,
    key_count: usize,
    capacity: (usize, usize),
    keys: impl FnOnce(&mut redis::Cmd),
) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(capacity.0, capacity.1);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(key_count);
    keys(&mut cmd);
    cmd
}

fn pool_error(e: bb8::RunError<redis::RedisError>) -> Error {
    match e {
        bb8::RunError::User(e) => Error::Redis(e),
        timed_out @ bb8::RunError::TimedOut => Error::Pool(Arc::new(timed_out)),
    }
}
