//! The store a leasing limiter decides with: the limiter's store, with checks of hot keys
//! answered from units reserved in advance (see [`UnitLease`](crate::UnitLease)).

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use super::table::{before_the_last, Rest, Step, Table};
use crate::{
    algorithm::Position,
    store::{Backend, BoxFuture, KeyBuf, Namespaces, Reserved, StoreKey},
    Algorithm, Charge, Error, Key, Outcome, Rule, Store,
};

/// A store that leases units of its keys: [`check_now`](Store::check_now) answers from a live
/// lease, [`check`](Store::check) sends a reservation sized to the key's demand (or waits
/// for the one in flight). Everything else goes to the store beneath, so the engine's
/// breaker, timeout, deny cache and failure policy work as without leases.
pub(crate) struct LeasedStore {
    inner: Arc<dyn Store>,
    /// The limiter's algorithm: only checks under it are leased (not quotas given per check).
    algorithm: Arc<dyn Algorithm>,
    namespace: Arc<str>,
    max_key_len: usize,
    /// Bound on giving a lease's rest back.
    timeout: Duration,
    table: Arc<Table>,
    /// The store beneath cannot reserve: every check goes to it.
    unsupported: AtomicBool,
}

impl LeasedStore {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        inner: Arc<dyn Store>,
        algorithm: Arc<dyn Algorithm>,
        namespace: &str,
        max_key_len: usize,
        timeout: Duration,
        lifetime: Duration,
        max_keys: usize,
        cap: u32,
    ) -> Self {
        let emission_us = match algorithm.rule() {
            Rule::Gcra(r) | Rule::TokenBucket(r) => r.emission_us(),
            _ => 0, // not leased (see `leases`)
        };
        Self {
            inner,
            algorithm,
            namespace: namespace.into(),
            max_key_len,
            timeout,
            table: Arc::new(Table::new(max_keys, lifetime, u64::from(cap), emission_us)),
            unsupported: AtomicBool::new(false),
        }
    }

    /// Whether a check under `algorithm` at `now_us` may be answered from a lease: the
    /// limiter's own rule, on the store's clock.
    fn leases(&self, algorithm: &dyn Algorithm, now_us: Option<u64>) -> bool {
        let same = match (algorithm.rule(), self.algorithm.rule()) {
            (Rule::Gcra(a), Rule::Gcra(b)) | (Rule::TokenBucket(a), Rule::TokenBucket(b)) => a == b,
            _ => false,
        };
        same && now_us.is_none() && !self.unsupported.load(Ordering::Relaxed)
    }

    async fn leased_check(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        cost: u32,
    ) -> Result<Outcome, Error> {
        let mut compact = KeyBuf::new();
        key.write_key_compact(&mut compact);
        let id = compact.as_bytes();
        let mut waited = false;
        loop {
            let (up_to, give_back) = match self.table.step(id, cost, Instant::now(), waited) {
                Step::Taken(outcome) => return Ok(outcome),
                Step::Wait(landed) => {
                    landed.await;
                    waited = true;
                    continue;
                }
                Step::Untracked => return self.inner.check(algorithm, key, cost, None).await,
                Step::Exact { give_back } => {
                    if give_back.units > 0 {
                        self.give_back(self.owned(key), give_back);
                    }
                    return self.inner.check(algorithm, key, cost, None).await;
                }
                Step::Reserve { up_to, give_back } => (up_to, give_back),
            };
            let owned = self.owned(key);
            if give_back.units > 0 {
                self.give_back(owned.clone(), give_back);
            }
            return self.reserve(algorithm, key, owned, id, cost, up_to).await;
        }
    }

    /// Sends a reservation of up to `up_to` units (at least `cost`) and installs the lease it
    /// brings; the lease's rest goes back when its lifetime is over.
    async fn reserve(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        owned: Owned,
        id: &[u8],
        cost: u32,
        up_to: u64,
    ) -> Result<Outcome, Error> {
        // Dropped before the reply (the store timeout): waiters go to the store, and the
        // units the reservation may have taken are lost (fewer admitted, never more).
        let mut pending = Pending {
            table: &self.table,
            id,
            denied: false,
            armed: true,
        };
        let up_to = u32::try_from(up_to).unwrap_or(u32::MAX);
        // The lifetime runs from here, so it bounds hand-outs however slow the reply.
        let sent = Instant::now();
        let reserved = match self.inner.reserve(algorithm, key, cost, up_to, None).await {
            Ok(reserved) => reserved,
            Err(Error::Unsupported(_)) => {
                self.unsupported.store(true, Ordering::Relaxed);
                drop(pending);
                return self.inner.check(algorithm, key, cost, None).await;
            }
            Err(e) => return Err(e),
        };
        let Reserved {
            mut outcome,
            granted,
            ..
        } = reserved;
        if !outcome.allowed {
            pending.denied = true;
            return Ok(outcome);
        }
        pending.armed = false;
        let extra = u64::from(granted - cost.min(granted));
        let generation = self.table.install(id, sent, extra, &outcome);
        // As a check answered from the lease would say: what Redis has left and what the
        // lease holds; its charge is the reservation's first units.
        outcome.remaining = outcome.remaining.saturating_add(extra);
        let placed = outcome.position.placed().copied();
        if let Some(placed) = before_the_last(placed, extra, self.table.emission_us()) {
            outcome.position = Position::Placed(placed);
        }
        if extra > 0 {
            let until = sent + self.table.lifetime();
            self.return_at(until, owned, id.into(), generation);
        }
        Ok(outcome)
    }

    /// What a spawned return needs of `key`: it outlives the check.
    fn owned(&self, key: StoreKey<'_>) -> Owned {
        Owned {
            inner: Arc::clone(&self.inner),
            algorithm: Arc::clone(&self.algorithm),
            namespace: Arc::clone(&self.namespace),
            key: key.key().cloned().map(Key::into_owned),
            max_key_len: self.max_key_len,
            timeout: self.timeout,
        }
    }

    /// At `until`, the units lease `generation` of `id` still holds go back to the store.
    fn return_at(&self, until: Instant, owned: Owned, id: Box<[u8]>, generation: u64) {
        let table = Arc::clone(&self.table);
        tokio::spawn(async move {
            tokio::time::sleep_until(until.into()).await;
            let rest = table.expire(&id, generation);
            if rest.units > 0 {
                owned.refund(rest).await;
            }
        });
    }

    /// Gives the rest of a lease back to the store, in a task of its own (the check does not
    /// wait).
    fn give_back(&self, owned: Owned, rest: Rest) {
        tokio::spawn(async move { owned.refund(rest).await });
    }
}

/// A key and the store, owned by a task that gives a lease's rest back.
#[derive(Clone)]
struct Owned {
    inner: Arc<dyn Store>,
    algorithm: Arc<dyn Algorithm>,
    namespace: Arc<str>,
    key: Option<Key<'static>>,
    max_key_len: usize,
    timeout: Duration,
}

impl Owned {
    /// The store's refund of the rest of a lease (a charge of that many units, the last of
    /// the reservation): what they still hold of the key's time goes back (GCRA moves the
    /// key's time back, never before now; the token bucket adds the tokens, never above the
    /// burst); units whose share of the time has drained give nothing back. A failed return
    /// leaves the units spent: fewer admitted, never more.
    async fn refund(&self, rest: Rest) {
        let units = rest.units;
        let charge = Charge {
            cost: u32::try_from(units).unwrap_or(u32::MAX),
            quota: None,
            local: false,
            position: rest.placed.map_or(Position::Unknown, Position::Placed),
        };
        let key = StoreKey::bounded(&self.namespace, self.key.as_ref(), self.max_key_len);
        let call = self.inner.refund(&*self.algorithm, key, &charge, None);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %crate::error::Chain(&e), units, "rate limit: lease not returned")
            }
            Err(_) => tracing::debug!(units, "rate limit: lease not returned (timed out)"),
        }
    }
}

/// A reservation in flight; when it ends without a lease, the key's waiters are woken.
struct Pending<'a> {
    table: &'a Table,
    id: &'a [u8],
    denied: bool,
    armed: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.table.abandon(self.id, self.denied);
        }
    }
}

impl Store for LeasedStore {}

impl Backend for LeasedStore {
    fn check<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Outcome, Error>> {
        if !self.leases(algorithm, now_us) {
            return self.inner.check(algorithm, key, cost, now_us);
        }
        Box::pin(self.leased_check(algorithm, key, cost))
    }

    fn check_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        cost: u32,
        now_us: Option<u64>,
    ) -> Option<Result<Outcome, Error>> {
        // A store that decides at once (in memory) has nothing to gain from leases.
        if let Some(result) = self.inner.check_now(algorithm, key, cost, now_us) {
            return Some(result);
        }
        if !self.leases(algorithm, now_us) {
            return None;
        }
        let mut compact = KeyBuf::new();
        key.write_key_compact(&mut compact);
        self.table
            .take(compact.as_bytes(), cost, Instant::now())
            .map(Ok)
    }

    fn refund<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        charge: &'a Charge,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        // A leased unit was counted by the store: it goes back there.
        self.inner.refund(algorithm, key, charge, now_us)
    }

    fn refund_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        charge: &Charge,
        now_us: Option<u64>,
    ) -> Option<Result<bool, Error>> {
        self.inner.refund_now(algorithm, key, charge, now_us)
    }

    fn reserve<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        up_to: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Reserved, Error>> {
        self.inner.reserve(algorithm, key, cost, up_to, now_us)
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        self.inner.namespaces()
    }

    fn manual_clock(&self) -> bool {
        self.inner.manual_clock()
    }
}
