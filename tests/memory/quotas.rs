//! A quota given per request keeps the sliding window's period.

use std::{sync::Arc, time::Duration};

use tower_redis_ratelimit::{Error, MemoryStore, Quota, SlidingWindow};

use crate::common::limiter;

/// A sliding window takes quotas with its own period only: a shorter window would drop what
/// the configured one still counts.
#[tokio::test]
async fn a_sliding_window_keeps_its_period() {
    let l = limiter(
        MemoryStore::new(),
        Arc::new(SlidingWindow::new(Quota::per_hour(2)).unwrap()),
        "period",
    );
    assert!(l.check("k", 1).await.unwrap().allowed);
    assert!(l.check("k", 1).await.unwrap().allowed);
    match l
        .check_with_quota("k", 1, Quota::new(2, Duration::from_millis(50)))
        .await
    {
        Err(Error::Config(e)) => assert_eq!(e.field(), "quota.period"),
        other => panic!("{other:?}"),
    }
    assert!(
        !l.check("k", 1).await.unwrap().allowed,
        "the log was cut short"
    );
    assert!(
        l.check_with_quota("k", 1, Quota::per_hour(3))
            .await
            .unwrap()
            .allowed
    );
}
