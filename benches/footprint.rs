//! Redis memory per key for each algorithm (`MEMORY USAGE`), the sliding window's Redis time
//! per check as its log grows from 10 to 100,000 members (`INFO commandstats`), against a
//! `redis-server` this program starts on a free loopback port; and `MemoryStore`'s heap bytes
//! per key and per log entry (counted by this program's allocator).
//!
//! ```text
//! cargo bench --bench footprint
//! ```

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/servers/mod.rs"]
mod servers;

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicIsize, Ordering},
    time::Duration,
};

use common::limiter;
use tower_redis_ratelimit::{
    algorithm::{Algorithm, MultiLimit},
    redis, Gcra, MemoryStore, Quota, RateLimiter, SlidingWindow, TokenBucket,
};

/// The system allocator, counting the bytes live on the heap.
struct Counting;

static HEAP: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HEAP.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HEAP.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HEAP.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap bytes per key of `keys` keys, each checked `checks` times, in a fresh `MemoryStore`
/// (keys like a client IP: `203.0.113.x`-sized).
async fn memory_store_bytes<A: Algorithm>(algorithm: A, keys: u32, checks: u32) -> f64 {
    let before = HEAP.load(Ordering::Relaxed);
    // No cap in the way of the measurement.
    let store = MemoryStore::builder()
        .max_log_entries(usize::MAX / 2)
        .build()
        .unwrap();
    let l = RateLimiter::builder(store.clone(), algorithm)
        .deny_cache(0)
        .build()
        .unwrap();
    for i in 0..keys {
        let key = format!("198.51.{}.{}", i / 256, i % 256);
        for _ in 0..checks {
            l.check(&key, 1).await.unwrap();
        }
    }
    let used = HEAP.load(Ordering::Relaxed) - before;
    assert_eq!(store.len(), keys as usize);
    drop((l, store));
    used as f64 / f64::from(keys)
}

fn memory_of<A: Algorithm>(conn: &mut redis::Connection, l: &RateLimiter<A>, key: &str) -> i64 {
    // Every key of one check starts with its base key.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", l.storage_key(key)))
        .query(conn)
        .unwrap();
    keys.iter()
        .map(|k| {
            redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(k)
                .arg("SAMPLES")
                .arg(0)
                .query::<Option<i64>>(conn)
                .unwrap()
                .unwrap_or(0)
        })
        .sum()
}

/// (calls, usec) of EVALSHA so far.
fn evalsha_stats(conn: &mut redis::Connection) -> (u64, u64) {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    let line = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .unwrap_or("");
    let field = |name: &str| -> u64 {
        line.split(&format!("{name}="))
            .nth(1)
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("calls"), field("usec"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let redis = servers::RedisServer::start();
    let store = redis.store().await;
    let mut conn = redis.conn();
    let q = Quota::per_minute(100);

    println!("## Redis memory per key (MEMORY USAGE, all keys of one limiter key)\n");
    println!("| algorithm | state | bytes |");
    println!("|---|---|---:|");
    let g = limiter(store.clone(), Gcra::new(q).unwrap(), "fp-g");
    g.check("user-12345", 1).await.unwrap();
    println!(
        "| GCRA | one integer | {} |",
        memory_of(&mut conn, &g, "user-12345")
    );
    let tb = limiter(store.clone(), TokenBucket::new(q).unwrap(), "fp-tb");
    tb.check("user-12345", 1).await.unwrap();
    println!(
        "| token bucket | hash of 2 fields | {} |",
        memory_of(&mut conn, &tb, "user-12345")
    );
    let m = limiter(
        store.clone(),
        MultiLimit::new([("s", Quota::per_second(10)), ("d", Quota::per_day(1000))]).unwrap(),
        "fp-m",
    );
    m.check("user-12345", 1).await.unwrap();
    println!(
        "| multi-limit (2) | two integers | {} |",
        memory_of(&mut conn, &m, "user-12345")
    );
    for n in [1u32, 10, 100] {
        let sw = limiter(
            store.clone(),
            SlidingWindow::new(q).unwrap(),
            &format!("fp-sw{n}"),
        );
        for _ in 0..n {
            sw.check("user-12345", 1).await.unwrap();
        }
        println!(
            "| sliding window | log of {n} + totals | {} |",
            memory_of(&mut conn, &sw, "user-12345")
        );
    }

    println!("\n## MemoryStore: heap bytes per key (100,000 keys, counted by the allocator)\n");
    println!("| algorithm | state | bytes per key |");
    println!("|---|---|---:|");
    let keys = 100_000;
    let gcra = memory_store_bytes(Gcra::new(q).unwrap(), keys, 1).await;
    println!("| GCRA | one integer | {gcra:.0} |");
    let bucket = memory_store_bytes(TokenBucket::new(q).unwrap(), keys, 1).await;
    println!("| token bucket | tokens and a time | {bucket:.0} |");
    for n in [1u32, 10, 100] {
        let sw = memory_store_bytes(SlidingWindow::new(q).unwrap(), keys, n).await;
        println!("| sliding window | log of {n} | {sw:.0} |");
    }
    let one = memory_store_bytes(SlidingWindow::new(q).unwrap(), keys, 1).await;
    let hundred = memory_store_bytes(SlidingWindow::new(q).unwrap(), keys, 100).await;
    println!(
        "\nA sliding-window log entry: {:.1} bytes (from the logs of 1 and 100 entries).",
        (hundred - one) / 99.0
    );

    println!("\n## Sliding window: Redis time per check as the log grows\n");
    println!("| members in the window | allowed check, µs in Redis | denied check, µs in Redis |");
    println!("|---:|---:|---:|");
    let window = Duration::from_secs(3_600);
    for n in [10u32, 100, 1_000, 10_000, 100_000] {
        let prefix = format!("fp-curve{n}");
        // A roomy limit fills the log; a limit of exactly n on the same log then denies.
        let roomy = RateLimiter::builder(
            store.clone(),
            SlidingWindow::new(Quota::new(n + 1_000, window)).unwrap(),
        )
        .prefix(&prefix)
        .common_counters()
        .build()
        .unwrap();
        let full = RateLimiter::builder(
            store.clone(),
            SlidingWindow::new(Quota::new(n, window)).unwrap(),
        )
        .prefix(&prefix)
        .common_counters()
        .deny_cache(0)
        .build()
        .unwrap();
        for _ in 0..n {
            roomy.check("k", 1).await.unwrap();
        }
        let measure = |l: RateLimiter<SlidingWindow>, times: u32, conn: &mut redis::Connection| {
            let before = evalsha_stats(conn);
            async move {
                for _ in 0..times {
                    l.check("k", 1).await.unwrap();
                }
                before
            }
        };
        let before = measure(full.clone(), 500, &mut conn).await;
        let after = evalsha_stats(&mut conn);
        let denied = (after.1 - before.1) as f64 / (after.0 - before.0).max(1) as f64;
        let before = measure(roomy.clone(), 500, &mut conn).await;
        let after = evalsha_stats(&mut conn);
        let allowed = (after.1 - before.1) as f64 / (after.0 - before.0).max(1) as f64;
        println!("| {n} | {allowed:.1} | {denied:.1} |");
    }
}
