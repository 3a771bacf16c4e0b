//! A check in a region: one script call spending from the region's pool (or, cut off, its
//! share), and the refill it may start.

use super::*;
use crate::store::unsupported;

impl Store for RegionalStore {}

impl Backend for RegionalStore {
    fn check<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Outcome, Error>> {
        let terms = match (Terms::of(algorithm), now_us) {
            (Ok(terms), None) => terms,
            (Err(e), _) => return Box::pin(std::future::ready(Err(e))),
            // The pools' lifetimes and the home's grants are on the servers' clocks.
            (Ok(_), Some(_)) => {
                return Box::pin(std::future::ready(Err(Error::Unsupported(
                    "checks at an explicit time do not work across regions",
                ))))
            }
        };
        let inner = &self.inner;
        let mut base = Vec::with_capacity(64);
        keys::write_base(key, &mut base);
        let cut = inner.cut.load(Relaxed);
        let cmd = spend_cmd(inner, &base, terms, cost, cut);
        Box::pin(async move {
            let mut again = true;
            loop {
                let ints = reply::ints(inner.own().link.eval(&SPEND, &cmd).await?)?;
                let &[allowed, remaining, retry, reset, refill, want, owed, first, asked_at] =
                    ints.as_slice()
                else {
                    return Err(Error::InvalidReply(format!(
                        "a regional check answered {ints:?}"
                    )));
                };
                if cut && allowed == 1 && inner.own != 0 {
                    inner.remember_owed(&base, terms);
                }
                if refill == 1 {
                    let (want, owed) = (want.max(0) as u64, owed.max(0) as u64);
                    start_refill(inner, &base, terms, want, owed, first == 1, asked_at);
                }
                // Refused while the key's first grant here is on its way (credit to be charged
                // with it, or this check has just asked for it): in the home region and in a
                // region within a few milliseconds of it, wait for it once (this instance's
                // refill to end, or about a round trip), then spend again.
                let first_on_its_way = first == 1 && allowed == 0 && (owed > 0 || refill == 1);
                if let (true, true, Some(wait)) =
                    (first_on_its_way, again, inner.first_grant_wait())
                {
                    again = false;
                    await_first_grant(inner, &base, wait).await;
                    continue;
                }
                return Outcome::from_ints(&[allowed, remaining, retry, reset]);
            }
        })
    }

    fn refund<'a>(
        &'a self,
        _algorithm: &'a dyn Algorithm,
        _key: StoreKey<'a>,
        _charge: &'a crate::decision::Charge,
        _now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        unsupported("units are not given back across regions")
    }

    fn settle<'a>(
        &'a self,
        _algorithm: &'a dyn Algorithm,
        _key: StoreKey<'a>,
        _charge: &'a crate::decision::Charge,
        _actual: u32,
        _now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        unsupported("charges are not settled across regions")
    }

    fn settle_now(
        &self,
        _algorithm: &dyn Algorithm,
        _key: StoreKey<'_>,
        _charge: &crate::decision::Charge,
        _actual: u32,
        _now_us: Option<u64>,
    ) -> Option<Result<bool, Error>> {
        None
    }

    fn reserve<'a>(
        &'a self,
        _algorithm: &'a dyn Algorithm,
        _key: StoreKey<'a>,
        _cost: u32,
        _up_to: u32,
        _now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<crate::store::Reserved, Error>> {
        // A region's pool is a lease already.
        unsupported("units are not reserved across regions")
    }

    fn schedules(&self) -> bool {
        false
    }

    fn schedule<'a>(
        &'a self,
        _algorithm: &'a dyn Algorithm,
        _key: StoreKey<'a>,
        _call: (u32, u64),
        _pace: crate::store::Pace,
        _now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<crate::store::Scheduled, Error>> {
        unsupported("calls are not scheduled across regions")
    }

    fn peek<'a>(
        &'a self,
        _algorithm: &'a dyn Algorithm,
        _key: StoreKey<'a>,
        _now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<crate::store::Peeked, Error>> {
        unsupported("a key's state is not shown across regions")
    }

    fn reset<'a>(
        &'a self,
        _algorithm: &'a dyn Algorithm,
        _key: StoreKey<'a>,
        _now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        unsupported("keys are not reset across regions")
    }

    fn ban<'a>(
        &'a self,
        _key: StoreKey<'a>,
        _duration_us: u64,
        _now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        unsupported("keys are not banned across regions")
    }

    fn count_refusal<'a>(
        &'a self,
        _key: StoreKey<'a>,
        _terms: &'a crate::store::offences::BanTerms,
        _now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<crate::store::offences::Counted, Error>> {
        unsupported("keys are not banned across regions")
    }

    fn unban<'a>(&'a self, _key: StoreKey<'a>) -> BoxFuture<'a, Result<(), Error>> {
        unsupported("keys are not banned across regions")
    }

    fn mark<'a>(
        &'a self,
        _namespace: &'a str,
        _token: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, Error>> {
        unsupported("no bans across regions to write back")
    }

    fn publish_top<'a>(
        &'a self,
        _namespace: &'a str,
        _instance: &'a str,
        _snapshot: &'a [u8],
        _ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        unsupported("no fleet view of top keys across regions")
    }

    fn read_tops<'a>(
        &'a self,
        _namespace: &'a str,
        _ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<crate::store::Snapshots, Error>> {
        unsupported("no fleet view of top keys across regions")
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        Some(&self.inner.own().namespaces)
    }

    fn regional(&self) -> bool {
        true
    }

    fn check_timeout(&self, timeout: Duration) -> Result<(), ConfigError> {
        if timeout > 2 * FIRST_GRANT_WAIT {
            return Ok(());
        }
        Err(ConfigError::new(
            "store_timeout",
            format!(
                "must be more than {} ms across regions: a check may wait up to {} ms for its \
                 key's first grant in a region near the home",
                2 * FIRST_GRANT_WAIT.as_millis(),
                FIRST_GRANT_WAIT.as_millis()
            ),
        ))
    }

    /// Every check goes through [`check`](Backend::check): every answer is a round trip to the region's Redis.
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
        _charge: &crate::decision::Charge,
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
}

/// The spend script's call for the key under `base` (see `lua/regional_spend.lua`).
fn spend_cmd(inner: &Inner, base: &[u8], terms: Terms, cost: u32, cut: bool) -> redis::Cmd {
    let (share_emission, share_burst) = terms.share(inner.share);
    let pool = with_suffix(base, keys::REGION_POOL);
    let marker = with_suffix(base, keys::REGION_MARKER);
    let local = with_suffix(base, keys::REGION_SHARE);
    // The home region charges what it admits on its share to the key's own state.
    let home_state = (inner.own == 0).then(|| {
        with_suffix(
            base,
            if terms.bucket {
                keys::BUCKET
            } else {
                keys::GCRA
            },
        )
    });
    let mut cmd = evalsha(
        &SPEND,
        3 + usize::from(home_state.is_some()),
        |cmd| {
            cmd.arg(&pool).arg(&marker).arg(&local);
            if let Some(state) = &home_state {
                cmd.arg(state);
            }
        },
        None,
    );
    cmd.arg(cost)
        .arg(u8::from(cut))
        .arg(inner.borrow)
        .arg(inner.lead_us())
        .arg(inner.lifetime_us)
        .arg(inner.pool_ttl_ms(&terms))
        .arg(inner.marker_ms())
        .arg(terms.emission_us)
        .arg(terms.burst)
        .arg(share_emission)
        .arg(share_burst)
        .arg(u8::from(terms.bucket))
        .arg(inner.ring_slot_us())
        .arg(if cut { inner.since_reached_us() } else { 0 });
    cmd
}

/// Starts the refill a check took the marker for, in a task of its own. A key's first refill
/// here is recorded: the checks that wait for it are told when it ends.
fn start_refill(
    inner: &Arc<Inner>,
    base: &[u8],
    terms: Terms,
    want: u64,
    owed: u64,
    first: bool,
    asked_at: i64,
) {
    let told = first.then(|| {
        let ended = Arc::new(Notify::new());
        inner.lock_refills().insert(base.to_vec(), ended);
        base.to_vec()
    });
    let asked_at = asked_at.max(0) as u64;
    let refill = refill_pool(inner.clone(), base.to_vec(), terms, want, owed, asked_at);
    let inner = inner.clone();
    tokio::spawn(async move {
        refill.await;
        if let Some(ended) = told.and_then(|key| inner.lock_refills().remove(&key)) {
            ended.notify_waiters();
        }
    });
}

/// Waits once for the key's first grant in this region: for this instance's refill of it to
/// end (at most [`FIRST_GRANT_WAIT`]), or for `wait` when another instance asked for it.
async fn await_first_grant(inner: &Inner, base: &[u8], wait: Duration) {
    inner.first_grants_awaited.fetch_add(1, Relaxed);
    // The check that asked for the refill may not have recorded it yet.
    tokio::task::yield_now().await;
    let ours = inner.lock_refills().get(base).map(|done| {
        // Registered before the lock is let go: the end cannot pass unseen.
        let mut ended = Box::pin(Arc::clone(done).notified_owned());
        ended.as_mut().enable();
        ended
    });
    match ours {
        Some(ended) => {
            let _ = tokio::time::timeout(FIRST_GRANT_WAIT, ended).await;
        }
        None => tokio::time::sleep(wait).await,
    }
}
