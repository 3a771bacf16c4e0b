//! What a store does for the limiters: the methods behind the sealed [`Store`].

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use super::{
    leases::{Acquired, SlotTerms},
    namespaces::Namespaces,
    offences::{BanTerms, Counted},
    reserved::{Pace, Reserved, Scheduled},
    upstream::{Gate, Learned, Ledger, Sent},
    Store, StoreKey,
};
use crate::{
    algorithm::{Algorithm, Outcome},
    decision::Charge,
    error::{ConfigError, Error},
};

/// What [`Backend::peek`] found: the key's state as a check would see it (a denial that took
/// nothing), and the time its ban has left (0: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Peeked {
    pub(crate) outcome: Outcome,
    pub(crate) banned_us: u64,
}

/// A boxed, sendable future, as the store's calls return.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The store's side of every rate limit: checks and refunds, reservations, peeks, resets and
/// bans, and the bookkeeping of the limiters built on it (concurrency slots and what upstreams
/// said are [`Slots`] and [`Upstreams`]). No method has a default body: each store says what
/// it does and what it cannot, and the `Arc` forwarding below cannot forget a method. Crate-private: it is the
/// sealed part of [`Store`] (see there why).
///
/// Keys are the limiter's namespace and the request's key ([`StoreKey`]); times are on the
/// store's clock (Redis `TIME`, a [`MemoryStore`](super::MemoryStore)'s clock) unless a call
/// carries an explicit `now_us` (tests and simulations).
pub(crate) trait Backend: Send + Sync + 'static {
    /// Decides one check: runs `algorithm`'s [rule](Algorithm::rule) on `key`'s state.
    fn check<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Outcome, Error>>;

    /// Decides one check at once, without a future, when this store can (in memory); `None`
    /// when the check must go through [`check`](Self::check). Tried first on every check, so
    /// it must answer quickly: the store timeout and the circuit breaker do not apply to it.
    fn check_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        cost: u32,
        now_us: Option<u64>,
    ) -> Option<Result<Outcome, Error>>;

    /// Gives back what an allowed check took (`charge`) on `key` and still holds, atomically
    /// (see [`Algorithm::refund`]): `Ok(true)` when units were given back, `Ok(false)` when
    /// there was nothing left to give.
    fn refund<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        charge: &'a Charge,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Like [`refund`](Self::refund), at once, when this store can (see
    /// [`check_now`](Self::check_now)).
    fn refund_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        charge: &Charge,
        now_us: Option<u64>,
    ) -> Option<Result<bool, Error>>;

    /// Settles what an allowed check took (`charge`, its estimate) on `key` to the `actual`
    /// units its request used, atomically (see [`Algorithm::settle`]): the difference given
    /// back (at most what the charge still holds) or charged past the limit. `Ok(true)` when
    /// the key's state changed. [`Error::Unsupported`] from a store that cannot settle (several
    /// regions) or for an algorithm that cannot.
    fn settle<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        charge: &'a Charge,
        actual: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Like [`settle`](Self::settle), at once, when this store can (see
    /// [`check_now`](Self::check_now)).
    fn settle_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        charge: &Charge,
        actual: u32,
        now_us: Option<u64>,
    ) -> Option<Result<bool, Error>>;

    /// Takes up to `up_to` units of `key` at once, as many as it has available, but at least
    /// `cost` (else a denial of `cost`, exactly as [`check`](Self::check) would deny it): a
    /// unit lease's reservation. GCRA and the token bucket reserve; [`Error::Unsupported`]
    /// otherwise, or from a store that does not reserve, and the limiter then checks each
    /// request alone.
    fn reserve<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        up_to: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Reserved, Error>>;

    /// Whether [`schedule`](Self::schedule) keeps places (in Redis and in memory).
    fn schedules(&self) -> bool;

    /// Keeps a place of `call.0` (the cost) units in `key`'s time for a call that may wait at most
    /// `call.1` µs, paced by `pace` (see [`Pace`]; `lua/gcra_schedule.lua`,
    /// `lua/token_bucket_schedule.lua` and their twins
    /// [`gcra_schedule`](super::reserved::gcra_schedule) and
    /// [`token_bucket::schedule`](crate::algorithm::token_bucket::schedule)): the key's time
    /// moves on by the cost, so callers sharing the key go in the order they asked, and a
    /// kept place's units are placed on the key's time as a check's are (a refund gives them
    /// back). GCRA and the token bucket schedule; [`Error::Unsupported`] for any other
    /// algorithm, or from a store that does not schedule.
    fn schedule<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        call: (u32, u64),
        pace: Pace,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Scheduled, Error>>;

    /// `key`'s state as a check would see it, spending nothing and writing nothing (see
    /// [`peek`](crate::algorithm::peek)), and the time its ban has left. [`Error::Unsupported`]
    /// for a custom algorithm.
    fn peek<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Peeked, Error>>;

    /// Removes `key`'s state under `algorithm` (not its ban) at `now_us` (`None`: the store's
    /// clock): the key's next check starts from a rested key, and a refund of a check admitted
    /// before gives nothing back (the reset gave back all it held).
    fn reset<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Bans `key` for `duration_us` from now (replacing a ban it has): until then, every
    /// check of it is denied by the check's own script, without taking anything.
    fn ban<'a>(
        &'a self,
        key: StoreKey<'a>,
        duration_us: u64,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Lifts `key`'s ban, if it has one.
    fn unban<'a>(&'a self, key: StoreKey<'a>) -> BoxFuture<'a, Result<(), Error>>;

    /// Counts one refusal of `key` under `terms` (a policy that bans by itself), atomically
    /// across every instance sharing the store: the refusal that brings the key's count in
    /// its window to `terms.after` bans it (as [`ban`](Self::ban) does, unless in shadow
    /// mode), escalated from its last ban; a refusal of a banned key does not count (see
    /// `lua/autoban.lua`). [`Error::Unsupported`] from a store that keeps no bans.
    fn count_refusal<'a>(
        &'a self,
        key: StoreKey<'a>,
        terms: &'a BanTerms,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Counted, Error>>;

    /// The token of `namespace`'s marker, set to `token` when the store holds none: a store
    /// that lost the namespace's state (a restart without persistence, a flush) lost the
    /// marker with it, and answers another token than the one seen before (see
    /// [`RateLimiter::notice_reset`](crate::RateLimiter::notice_reset)).
    fn mark<'a>(
        &'a self,
        namespace: &'a str,
        token: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, Error>>;

    /// Publishes `snapshot` as `instance`'s top keys of `namespace`, counted for `ttl`; the
    /// snapshots of instances that stopped publishing for longer go.
    fn publish_top<'a>(
        &'a self,
        namespace: &'a str,
        instance: &'a str,
        snapshot: &'a [u8],
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Every snapshot of `namespace`'s top keys published within `ttl`, with its instance.
    fn read_tops<'a>(
        &'a self,
        namespace: &'a str,
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<crate::store::Snapshots, Error>>;

    /// The namespaces of the limiters built on this store, so that two limiters with the same
    /// namespace and different quotas are a [`ConfigError`](crate::ConfigError).
    fn namespaces(&self) -> Option<&Namespaces>;

    /// True for a store that spreads one limit across regions
    /// ([`RegionalStore`](super::redis::RegionalStore)): limiters built on it refuse what
    /// cannot work across regions.
    fn regional(&self) -> bool;

    /// Refuses a limiter's store timeout that this store's calls may need more than (a
    /// [`ConfigError`](crate::ConfigError) naming `store_timeout`).
    fn check_timeout(&self, timeout: Duration) -> Result<(), ConfigError>;

    /// True when this store's time is not the wall clock (a `MemoryStore` on a
    /// [`ManualClock`](super::memory::ManualClock)): limiters built on it keep no deny cache, whose
    /// deadlines are in real time.
    fn manual_clock(&self) -> bool;

    /// This store's [`ManualClock`](super::memory::ManualClock), when it has one: a
    /// [`ThrottleLayer`](crate::throttle::ThrottleLayer) on this store waits on it.
    fn clock(&self) -> Option<super::memory::ManualClock>;
}

/// The top keys' snapshots a store holds ([`Backend::read_tops`]): each instance's id and
/// snapshot.
pub(crate) type Snapshots = Vec<(Vec<u8>, Vec<u8>)>;

/// A store's concurrency slots, for the [concurrency limiter](crate::concurrency): the
/// crate-private side of [`SlotStore`](super::SlotStore). A store without them (a
/// [`RegionalStore`](super::redis::RegionalStore)) does not implement it, so a concurrency
/// limiter on it does not build.
pub(crate) trait Slots: Send + Sync + 'static {
    /// Removes every concurrency holder of `key`.
    fn release_all<'a>(&'a self, key: StoreKey<'a>) -> BoxFuture<'a, Result<(), Error>>;

    /// Admits `holder` (an id unique across instances) under `key` if
    /// fewer than [`limit`](SlotTerms::limit) unexpired holders hold it, with a lease of
    /// [`lease`](SlotTerms::lease); first drops expired holders. Admits no new holder while
    /// admissions are paused after the store lost its state (see [`SlotTerms`]); a holder
    /// already held (a call sent again) is admitted again and counted once.
    fn acquire<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        terms: &'a SlotTerms,
    ) -> BoxFuture<'a, Result<Acquired, Error>>;

    /// Moves `holder`'s deadline to [`lease`](SlotTerms::lease) from now. `false` when it held
    /// no slot any more (its lease expired unrenewed, or the store lost its state): it is then
    /// put back, counted even over the limit; except a holder released after a renewal that
    /// got no answer (see [`release`](Self::release)), which stays released.
    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        terms: &'a SlotTerms,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Gives `holder`'s slot back; releasing a slot not held does nothing, so a release may be
    /// sent again. `late_renewal`: a renewal of this holder got no answer and may still reach
    /// the store after this release; for that long, it must not put the holder back.
    fn release<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        late_renewal: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Gives the slot back at once, without a future, when this store can (in memory); `None`
    /// when it must go through [`release`](Self::release).
    fn release_now(&self, key: StoreKey<'_>, holder: &str) -> Option<Result<(), Error>>;
}

/// What upstreams said, for the [adaptive throttle](crate::throttle): the crate-private side
/// of [`UpstreamStore`](super::UpstreamStore).
pub(crate) trait Upstreams: Send + Sync + 'static {
    /// Whether an outbound call of `cost` units of `ledger` may go now; when it may and the
    /// units left are known, they are taken. When the upstream's rate is known, the call's
    /// place in its pace is kept for it if the wait for it is at most `budget` (see
    /// `lua/upstream_take.lua`). A call sent blind is counted as its `cost` until answered.
    fn take<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        cost: u32,
        budget: Duration,
    ) -> BoxFuture<'a, Result<Gate, Error>>;

    /// Records what an upstream's answer said of `ledger` (see `lua/upstream_learn.lua` for
    /// the rules): a pause only grows; a new window replaces one that ended; the same window
    /// keeps the smaller remaining count (answers arrive out of order); a stale one is
    /// ignored. `how`: how the answered call went ([`Gate::blind`]); `cost`: what it took.
    fn learn<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        learned: Learned,
        how: Sent,
        cost: u32,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Settles a call that took `taken` units of `ledger` to the `used` its answer reported
    /// (see `lua/upstream_settle.lua`): the pace moves on by the difference (a debt) or back
    /// by it, never before now; a known window's count is corrected alike.
    fn settle<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        taken: u64,
        used: u64,
    ) -> BoxFuture<'a, Result<(), Error>>;
}

/// A call a store cannot make: [`Error::Unsupported`] saying `what`.
pub(crate) fn unsupported<'a, T: Send + 'a>(what: &'static str) -> BoxFuture<'a, Result<T, Error>> {
    Box::pin(std::future::ready(Err(Error::Unsupported(what))))
}

/// A shared store is a store: one `Arc<dyn Store>` serves several limiters, or a store is
/// chosen at run time.
impl<S: Store + ?Sized> Backend for Arc<S> {
    fn check<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Outcome, Error>> {
        (**self).check(algorithm, key, cost, now_us)
    }

    fn check_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        cost: u32,
        now_us: Option<u64>,
    ) -> Option<Result<Outcome, Error>> {
        (**self).check_now(algorithm, key, cost, now_us)
    }

    fn refund<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        charge: &'a Charge,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).refund(algorithm, key, charge, now_us)
    }

    fn refund_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        charge: &Charge,
        now_us: Option<u64>,
    ) -> Option<Result<bool, Error>> {
        (**self).refund_now(algorithm, key, charge, now_us)
    }

    fn settle<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        charge: &'a Charge,
        actual: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).settle(algorithm, key, charge, actual, now_us)
    }

    fn settle_now(
        &self,
        algorithm: &dyn Algorithm,
        key: StoreKey<'_>,
        charge: &Charge,
        actual: u32,
        now_us: Option<u64>,
    ) -> Option<Result<bool, Error>> {
        (**self).settle_now(algorithm, key, charge, actual, now_us)
    }

    fn reserve<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        cost: u32,
        up_to: u32,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Reserved, Error>> {
        (**self).reserve(algorithm, key, cost, up_to, now_us)
    }

    fn schedules(&self) -> bool {
        (**self).schedules()
    }

    fn schedule<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        call: (u32, u64),
        pace: Pace,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Scheduled, Error>> {
        (**self).schedule(algorithm, key, call, pace, now_us)
    }

    fn peek<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Peeked, Error>> {
        (**self).peek(algorithm, key, now_us)
    }

    fn reset<'a>(
        &'a self,
        algorithm: &'a dyn Algorithm,
        key: StoreKey<'a>,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        (**self).reset(algorithm, key, now_us)
    }

    fn ban<'a>(
        &'a self,
        key: StoreKey<'a>,
        duration_us: u64,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        (**self).ban(key, duration_us, now_us)
    }

    fn unban<'a>(&'a self, key: StoreKey<'a>) -> BoxFuture<'a, Result<(), Error>> {
        (**self).unban(key)
    }

    fn count_refusal<'a>(
        &'a self,
        key: StoreKey<'a>,
        terms: &'a BanTerms,
        now_us: Option<u64>,
    ) -> BoxFuture<'a, Result<Counted, Error>> {
        (**self).count_refusal(key, terms, now_us)
    }

    fn mark<'a>(
        &'a self,
        namespace: &'a str,
        token: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, Error>> {
        (**self).mark(namespace, token)
    }

    fn publish_top<'a>(
        &'a self,
        namespace: &'a str,
        instance: &'a str,
        snapshot: &'a [u8],
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        (**self).publish_top(namespace, instance, snapshot, ttl)
    }

    fn read_tops<'a>(
        &'a self,
        namespace: &'a str,
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<crate::store::Snapshots, Error>> {
        (**self).read_tops(namespace, ttl)
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        (**self).namespaces()
    }

    fn manual_clock(&self) -> bool {
        (**self).manual_clock()
    }

    fn regional(&self) -> bool {
        (**self).regional()
    }

    fn check_timeout(&self, timeout: Duration) -> Result<(), ConfigError> {
        (**self).check_timeout(timeout)
    }

    fn clock(&self) -> Option<super::memory::ManualClock> {
        (**self).clock()
    }
}

impl<S: Store + ?Sized> Store for Arc<S> {}

impl<S: Slots + ?Sized> Slots for Arc<S> {
    fn release_all<'a>(&'a self, key: StoreKey<'a>) -> BoxFuture<'a, Result<(), Error>> {
        (**self).release_all(key)
    }

    fn acquire<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        terms: &'a SlotTerms,
    ) -> BoxFuture<'a, Result<Acquired, Error>> {
        (**self).acquire(key, holder, terms)
    }

    fn renew<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        terms: &'a SlotTerms,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).renew(key, holder, terms)
    }

    fn release<'a>(
        &'a self,
        key: StoreKey<'a>,
        holder: &'a str,
        late_renewal: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        (**self).release(key, holder, late_renewal)
    }

    fn release_now(&self, key: StoreKey<'_>, holder: &str) -> Option<Result<(), Error>> {
        (**self).release_now(key, holder)
    }
}

impl<S: Upstreams + ?Sized> Upstreams for Arc<S> {
    fn take<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        cost: u32,
        budget: Duration,
    ) -> BoxFuture<'a, Result<Gate, Error>> {
        (**self).take(key, ledger, cost, budget)
    }

    fn learn<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        learned: Learned,
        how: Sent,
        cost: u32,
    ) -> BoxFuture<'a, Result<(), Error>> {
        (**self).learn(key, ledger, learned, how, cost)
    }

    fn settle<'a>(
        &'a self,
        key: StoreKey<'a>,
        ledger: Ledger,
        taken: u64,
        used: u64,
    ) -> BoxFuture<'a, Result<(), Error>> {
        (**self).settle(key, ledger, taken, used)
    }
}
