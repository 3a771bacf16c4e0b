//! Time comes from the Redis server: app instances whose clocks disagree still share one
//! exact count. With client-supplied time (what the seed scripts did), the same skew admits
//! extra requests.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::limiter;
use crate::servers::RedisServer;
use tower_redis_ratelimit::{redis, Gcra, Quota, SlidingWindow, TokenBucket};

fn local_now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[tokio::test]
async fn skewed_instances_share_one_count_on_server_time() {
    let redis = RedisServer::start();
    // 10 a second, burst 10.
    let q = Quota::per_second(10);
    let skew = 1_000_000; // instance B's clock runs one second ahead

    // What goes wrong with client time: B's "now" has refilled the bucket A emptied.
    let a = limiter(redis.store().await, Gcra::new(q).unwrap(), "client-time");
    let b = limiter(redis.store().await, Gcra::new(q).unwrap(), "client-time");
    let now = local_now_us();
    let mut admitted = 0;
    for i in 0..40 {
        let d = if i % 2 == 0 {
            a.check_at("k", 1, now).await.unwrap()
        } else {
            b.check_at("k", 1, now + skew).await.unwrap()
        };
        admitted += u32::from(d.allowed);
    }
    assert!(
        admitted > 10,
        "client time with skew admitted only {admitted}"
    );

    // What the limiter does: every instance reads the server clock, so skew cannot matter.
    // 10 an hour: however long the 40 checks take on a loaded machine, no unit comes back
    // meanwhile (one every 6 minutes).
    let q = Quota::per_hour(10);
    let mut conn = redis.conn();
    let started = server_time_us(&mut conn);
    for (name, algorithm) in [("g", 0), ("tb", 1), ("sw", 2)] {
        let store_a = redis.store().await;
        let store_b = redis.store().await;
        let mut admitted = 0;
        for i in 0..40 {
            let store = if i % 2 == 0 {
                store_a.clone()
            } else {
                store_b.clone()
            };
            let allowed = match algorithm {
                0 => {
                    limiter(store, Gcra::new(q).unwrap(), name)
                        .check("k", 1)
                        .await
                }
                1 => {
                    limiter(store, TokenBucket::new(q).unwrap(), name)
                        .check("k", 1)
                        .await
                }
                _ => {
                    limiter(store, SlidingWindow::new(q).unwrap(), name)
                        .check("k", 1)
                        .await
                }
            }
            .unwrap()
            .allowed;
            admitted += u32::from(allowed);
        }
        assert_eq!(admitted, 10, "{name}");
    }

    // And the state written is on the server's clock: the GCRA time stored is ten emissions
    // (an hour) after Redis' TIME when its first check ran, which was between the two reads.
    let ended = server_time_us(&mut conn);
    let tat: u64 = redis::cmd("GET")
        .arg("{g:default:k}:g")
        .query(&mut conn)
        .unwrap();
    let hour = Duration::from_secs(3600).as_micros() as u64;
    assert!(
        (started + hour..=ended + hour).contains(&tat),
        "TAT {tat} vs TIME {started}..{ended}"
    );
}

/// Redis' `TIME`, in microseconds.
fn server_time_us(conn: &mut redis::Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).unwrap();
    secs * 1_000_000 + micros
}
