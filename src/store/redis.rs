//! A store on one Redis server, through a bb8 connection pool.

use std::{fmt, time::Duration};

use bb8::Pool;
use bb8_redis::RedisConnectionManager;

use super::{BoxFuture, Store};
use crate::{Algorithm, Error, Outcome};

/// Counters in Redis, shared by every instance that points at the same server.
///
/// Each check is one `EVALSHA` of the algorithm's script (falling back to loading it when Redis
/// answers `NOSCRIPT`, e.g. after a restart or `SCRIPT FLUSH`). Requires Redis 5 or later
/// (script effects replication).
///
/// ```no_run
/// use tower_redis_ratelimit::RedisStore;
///
/// # async fn run() -> Result<(), tower_redis_ratelimit::Error> {
/// // Checks the connection now, so a wrong URL fails at start-up.
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    pool: Pool<RedisConnectionManager>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("pool", &self.pool.state())
            .finish()
    }
}

/// Connections in the pool [`RedisStore::connect`] builds. Each is multiplexed and a check
/// holds it only long enough to clone its handle, so in practice one carries all checks.
const DEFAULT_POOL_SIZE: u32 = 8;

impl RedisStore {
    /// Connects to `url` (e.g. `redis://127.0.0.1:6379/0`) and checks the server answers
    /// `PING`, so that a wrong address fails here rather than on the first request.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let store = Self::connect_lazy(url)?;
        let mut conn = store.pool.get().await.map_err(pool_error)?;
        let _: String = redis::cmd("PING").query_async(&mut *conn).await?;
        drop(conn);
        Ok(store)
    }

    /// Like [`RedisStore::connect`], but does not connect until the first check. The URL is
    /// still parsed now.
    pub fn connect_lazy(url: &str) -> Result<Self, Error> {
        let manager = RedisConnectionManager::new(url)?;
        let pool = Pool::builder()
            .max_size(DEFAULT_POOL_SIZE)
            // bb8's default sends a PING on every checkout, doubling round trips per check.
            .test_on_check_out(false)
            .connection_timeout(Duration::from_secs(2))
            .build_unchecked(manager);
        Ok(Self { pool })
    }

    /// Uses an existing bb8-redis pool. Consider `test_on_check_out(false)` on its builder:
    /// the default check-out `PING` doubles the round trips of every check.
    pub fn from_pool(pool: Pool<RedisConnectionManager>) -> Self {
        Self { pool }
    }

    /// The underlying pool.
    pub fn pool(&self) -> &Pool<RedisConnectionManager> {
        &self.pool
    }
}

fn pool_error(e: bb8::RunError<redis::RedisError>) -> Error {
    match e {
        bb8::RunError::User(e) => Error::Redis(e),
        bb8::RunError::TimedOut => Error::Pool("timed out waiting for a connection".to_owned()),
    }
}

impl Store for RedisStore {
    fn check<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        base_key: &'a str,
        cost: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Outcome, Error>> {
        Box::pin(async move {
            let script = algorithm.script();
            let mut invocation = script.prepare_invoke();
            for key in algorithm.redis_keys(base_key) {
                invocation.key(key);
            }
            match now_us {
                Some(now) => invocation.arg(now),
                None => invocation.arg(""),
            };
            for arg in algorithm.script_args(cost) {
                invocation.arg(arg);
            }
            // A multiplexed connection is a cheap handle: clone it and return the pooled one at
            // once, so concurrent checks pipeline on one socket instead of queueing for
            // exclusive connections.
            let mut conn = self.pool.get().await.map_err(pool_error)?.clone();
            let reply: redis::Value = invocation.invoke_async(&mut conn).await?;
            algorithm.parse_reply(reply)
        })
    }
}
