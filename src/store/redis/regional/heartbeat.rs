//! Heartbeats to the other regions, and moving into and out of deciding from the share.

use super::{
    refill::{reconcile, smooth},
    *,
};

/// Sends heartbeats to every other region's Redis, four times per detection time, and moves
/// this region into and out of deciding from its share. Ends with the store.
pub(super) async fn heartbeats(weak: Weak<Inner>) {
    let period = match weak.upgrade() {
        Some(inner) => inner.detect / 4,
        None => return,
    };
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let pings = inner
            .regions
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != inner.own)
            .map(|(_, peer)| {
                let cmd = evalsha(&PING, 0, |_| {}, None);
                let inner = &inner;
                let home = std::ptr::eq(peer, &inner.regions[0]);
                async move {
                    let sent = Instant::now();
                    let answer =
                        tokio::time::timeout(inner.detect, peer.store.link.eval(&PING, &cmd)).await;
                    if matches!(answer, Ok(Ok(_))) {
                        peer.last_ok_ms.store(inner.now_ms(), Relaxed);
                        if home {
                            smooth(&inner.home_ping_us, sent.elapsed().as_micros() as u64);
                        }
                    }
                }
            });
        futures_util::future::join_all(pings).await;
        let cut = inner.out_of_reach();
        if cut == inner.cut.swap(cut, Relaxed) {
            continue;
        }
        let region = &inner.regions[inner.own].name;
        if cut {
            inner.cuts.fetch_add(1, Relaxed);
            tracing::warn!(
                region = %region,
                home = %inner.regions[0].name,
                share = inner.share,
                "rate limit: cut off from the other regions; deciding from this region's share of each limit"
            );
        } else {
            let owed = std::mem::take(&mut *inner.owed.lock().unwrap_or_else(|e| e.into_inner()));
            tracing::warn!(
                region = %region,
                keys = owed.len(),
                "rate limit: the other regions are back; charging the home with what was admitted meanwhile"
            );
            for (base, terms) in owed {
                tokio::spawn(reconcile(inner.clone(), base, terms));
            }
        }
        #[cfg(feature = "metrics")]
        {
            metrics::gauge!(REGION_CUT_OFF, "region" => region.clone())
                .set(f64::from(u8::from(cut)));
            if cut {
                metrics::counter!(REGION_CUTS, "region" => region.clone()).increment(1);
            }
        }
    }
}
