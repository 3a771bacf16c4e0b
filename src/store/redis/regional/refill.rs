//! Refilling a region's pool of a key from the home, and charging the home with what a
//! region admitted without it.

use super::*;

/// Asks the home for up to `want` units of the key under `base`, charging it with `owed`
/// units admitted here without it, and puts what it grants into this region's pool: a block
/// that lives the lifetime from `asked_at` (the time of the check that asked, on this region's
/// Redis), dropped if it lands later than the detection time after that (0: a charge only, no
/// units wanted). Holds the key's refill marker (taken by the check that started it); on
/// failure, the marker expires by itself after the detection time, and the next check asks
/// again.
pub(super) async fn refill_pool(
    inner: Arc<Inner>,
    base: Vec<u8>,
    terms: Terms,
    want: u64,
    owed: u64,
    asked_at: u64,
) {
    let want = want.min(terms.burst);
    let sent = Instant::now();
    let Some((granted, retry_us)) = grant(&inner, &base, terms, want, owed).await else {
        return;
    };
    let rtt = sent.elapsed().as_micros() as u64;
    smooth(&inner.rtt_us, rtt);
    inner.grants.fetch_add(1, Relaxed);
    inner.units_granted.fetch_add(granted, Relaxed);
    inner.units_charged.fetch_add(owed, Relaxed);
    // Short of what it asked for, the region asks again one lead time after it last asked
    // (its round trip included), and not before the home has a unit: regions near the home
    // and far from it then ask as often, and share what the key has by their demands.
    let retry_ms = if granted < want {
        retry_us
            .max(inner.lead_us.saturating_sub(rtt))
            .div_ceil(1000)
            .clamp(1, inner.marker_ms())
    } else {
        0
    };
    let fill = Fill {
        granted,
        owed,
        retry_ms,
        asked_at,
    };
    let dropped = fill_pool(&inner, &base, terms, fill).await;
    if dropped > 0 {
        inner.units_dropped.fetch_add(dropped, Relaxed);
        tracing::debug!(
            region = %inner.regions[inner.own].name,
            granted,
            dropped,
            "rate limit: granted units did not reach the region's pool in time (dropped)"
        );
    }
}

/// Asks the home for up to `want` units of the key under `base`, charging it with `owed`:
/// the units granted and how long until the home has one again, or `None` (counted and
/// logged) when the grant failed or got no answer within the detection time.
async fn grant(
    inner: &Inner,
    base: &[u8],
    terms: Terms,
    want: u64,
    owed: u64,
) -> Option<(u64, u64)> {
    let (script, suffix): (&Script, _) = if terms.bucket {
        (&GRANT_BUCKET, keys::BUCKET)
    } else {
        (&GRANT_GCRA, keys::GCRA)
    };
    let state = with_suffix(base, suffix);
    let demand = with_suffix(base, keys::REGION_DEMAND);
    let mut cmd = evalsha(
        script,
        2,
        |cmd| {
            cmd.arg(&state).arg(&demand);
        },
        None,
    );
    cmd.arg(want)
        .arg(terms.emission_us)
        .arg(terms.burst)
        .arg(owed)
        .arg(inner.own)
        .arg(4 * inner.lead_us());
    let answer = tokio::time::timeout(inner.detect, inner.home().link.eval(script, &cmd)).await;
    let grant = match answer {
        Ok(Ok(value)) => reply::ints(value),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::Timeout(inner.detect)),
    };
    match grant.as_deref() {
        Ok(&[granted, retry, _now]) if granted >= 0 && retry >= 0 => {
            Some((granted as u64, retry as u64))
        }
        other => {
            inner.failed_grants.fetch_add(1, Relaxed);
            tracing::debug!(
                region = %inner.regions[inner.own].name,
                answer = ?other,
                "rate limit: a grant from the home region failed"
            );
            None
        }
    }
}

/// A grant to put into a region's pool (see `lua/regional_fill.lua`).
struct Fill {
    granted: u64,
    owed: u64,
    retry_ms: u64,
    asked_at: u64,
}

/// Puts `fill` into this region's pool of the key under `base`: the granted units dropped
/// (landed too late, or not written at all).
async fn fill_pool(inner: &Inner, base: &[u8], terms: Terms, fill: Fill) -> u64 {
    let pool = with_suffix(base, keys::REGION_POOL);
    let marker = with_suffix(base, keys::REGION_MARKER);
    let mut cmd = evalsha(
        &FILL,
        2,
        |cmd| {
            cmd.arg(&pool).arg(&marker);
        },
        None,
    );
    cmd.arg(fill.granted)
        .arg(fill.owed)
        .arg(inner.lifetime_us)
        .arg(inner.pool_ttl_ms(&terms))
        .arg(fill.retry_ms)
        .arg(fill.asked_at)
        .arg(inner.detect.as_micros() as u64);
    let filled = tokio::time::timeout(inner.detect, inner.own().link.eval(&FILL, &cmd)).await;
    let landed = filled.map_err(|_| Error::Timeout(inner.detect));
    match landed.and_then(|answer| reply::ints(answer?)).as_deref() {
        Ok(&[_, dropped]) => dropped.max(0) as u64,
        _ => fill.granted,
    }
}

/// Adds a round trip of `rtt_us` to the average in `cell` (7/8 of the old, 1/8 of the new; the
/// first one as it is), at least 1 µs so that 0 keeps meaning "none yet".
pub(super) fn smooth(cell: &AtomicU64, rtt_us: u64) {
    let old = cell.load(Relaxed);
    let smoothed = if old == 0 {
        rtt_us
    } else {
        (7 * old + rtt_us) / 8
    };
    cell.store(smoothed.max(1), Relaxed);
}

/// Charges the home with what this region admitted on `base` while cut off.
pub(super) async fn reconcile(inner: Arc<Inner>, base: Vec<u8>, terms: Terms) {
    let pool = with_suffix(&base, keys::REGION_POOL);
    let marker = with_suffix(&base, keys::REGION_MARKER);
    let mut cmd = evalsha(
        &OWED,
        2,
        |cmd| {
            cmd.arg(&pool).arg(&marker);
        },
        None,
    );
    cmd.arg(inner.marker_ms());
    let answer = tokio::time::timeout(inner.detect, inner.own().link.eval(&OWED, &cmd)).await;
    match answer {
        Ok(Ok(redis::Value::Int(owed))) if owed > 0 => {
            refill_pool(inner, base, terms, 0, owed as u64, 0).await;
        }
        // Nothing owed, or a refill holds the marker: it charges what is owed itself.
        _ => {}
    }
}
