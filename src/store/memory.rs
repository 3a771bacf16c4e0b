//! An in-process store with the same decisions as Redis.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};

use super::{BoxFuture, Store};
use crate::{algorithm::MemoryState, Algorithm, Error, Outcome};

const SHARDS: usize = 16;

/// Counters in this process's memory: the same algorithms, integer for integer, as the Redis
/// scripts, without a network hop. Limits are per process, so use it for single-instance apps,
/// development, tests and demos, not behind a load balancer.
///
/// Expired state is swept as the map grows, so keys that stop coming back do not accumulate.
/// Cloning shares the counters.
///
/// ```
/// use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_second(2))?);
/// assert!(limiter.check("job-42", 1).await?.allowed);
/// assert!(limiter.check("job-42", 1).await?.allowed);
/// assert!(!limiter.check("job-42", 1).await?.allowed);
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    shards: Arc<[Mutex<Shard>; SHARDS]>,
}

#[derive(Default)]
struct Shard {
    map: HashMap<Box<str>, MemoryState>,
    /// Size after the last sweep; the next sweep runs when the map has doubled.
    swept_len: usize,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.len())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of keys held, including expired ones not swept yet.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        // FNV-1a: cheap, and only spreads keys over locks.
        let h = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        &self.shards[(h as usize) % SHARDS]
    }

    fn decide(
        &self,
        algorithm: &dyn Algorithm,
        key: &str,
        cost: u32,
        now: u64,
    ) -> Result<Outcome, Error> {
        let mut shard = lock(self.shard(key));
        if shard.map.len() >= 2 * shard.swept_len.max(512) {
            shard.map.retain(|_, state| {
                state.expire(now);
                !state.is_empty()
            });
            shard.swept_len = shard.map.len();
        }
        let state = match shard.map.get_mut(key) {
            Some(state) => state,
            None => shard.map.entry(key.into()).or_default(),
        };
        state.expire(now);
        let outcome = algorithm.check_in_memory(state, now, cost);
        if state.is_empty() {
            shard.map.remove(key);
        }
        outcome
    }
}

fn lock(m: &Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a shard half-updated in a way that matters
    // more than losing the limiter: keep going with the data as it is.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Microseconds since the Unix epoch, as Redis' `TIME` reports them.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Store for MemoryStore {
    fn check<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        base_key: &'a str,
        cost: u32,
        now: Option<u64>,
    ) -> BoxFuture<'a, Result<Outcome, Error>> {
        // Keyed like the first Redis key, so algorithms sharing a prefix do not collide here
        // any more than they do in Redis.
        let key = algorithm.redis_keys(base_key).swap_remove(0);
        let result = self.decide(algorithm, &key, cost, now.unwrap_or_else(now_us));
        Box::pin(std::future::ready(result))
    }
}
