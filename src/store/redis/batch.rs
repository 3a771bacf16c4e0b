//! Exact batching: concurrent checks go to Redis as one script call that decides them all.
//!
//! A background task owns the queue. While fewer than `max_in_flight` calls are on their way to
//! Redis, whatever is queued (at least one check, at most `max_batch`) leaves at once as one
//! call of the algorithm's batch script; checks arriving meanwhile wait for the next. A lone
//! check therefore never waits for company, and under load one call carries many checks. The
//! batch script decides its checks one after the other inside one atomic call, so each decision
//! is exactly the one its own call would have got at that instant. Every call is bounded by
//! `call_timeout`, so a stalled Redis cannot hold the in-flight slots for longer.
//!
//! On a cluster, calls are not held back: whatever is queued leaves at once, one call per slot
//! (checks on the same slot share it), so a slow node delays only its own checks.

use std::{sync::Arc, time::Duration};

use redis::{Script, Value};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::{
    keys::slot,
    link::{evalsha_sized, Link},
    packed::{Args, Keys},
};
use crate::error::{ConfigError, Error};

/// How a [`RedisStore`](crate::RedisStore) batches concurrent checks; see
/// [`RedisStore::with_batching`](crate::RedisStore::with_batching), which checks the
/// settings (a value out of range is a [`ConfigError`] naming the field).
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::store::redis::Batching;
///
/// let batching = Batching::new().max_batch(128).max_in_flight(4);
/// assert_eq!(batching.checks_per_call(), 128);
/// assert_eq!(batching.calls_in_flight(), 4);
/// assert_eq!(batching.time_per_call(), Duration::from_secs(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    max_batch: usize,
    max_in_flight: usize,
    call_timeout: Duration,
}

impl Default for Batching {
    fn default() -> Self {
        Self::new()
    }
}

impl Batching {
    /// At most 64 checks per call, at most 2 calls on their way at once, each call given up
    /// after 1 s.
    pub const fn new() -> Self {
        Self {
            max_batch: 64,
            max_in_flight: 2,
            call_timeout: Duration::from_secs(1),
        }
    }

    /// Checks decided by one script call, at most (1 to 1,024).
    pub const fn max_batch(mut self, checks: usize) -> Self {
        self.max_batch = checks;
        self
    }

    /// Calls sent and not yet answered, at most (1 to 1,024). While all are in flight, new
    /// checks queue up for the next call. Not used on a cluster (see
    /// [`RedisStore::with_batching`](crate::RedisStore::with_batching)).
    pub const fn max_in_flight(mut self, calls: usize) -> Self {
        self.max_in_flight = calls;
        self
    }

    /// How long one call may take before its checks fail with [`Error::Timeout`] and its
    /// in-flight slot is freed (at least 1 ms). Keep it at or above the limiters' store
    /// timeout: a check's own timeout still applies to it.
    pub const fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Checks decided by one script call, at most (set with [`max_batch`](Self::max_batch)).
    pub const fn checks_per_call(&self) -> usize {
        self.max_batch
    }

    /// Calls sent and not yet answered, at most (set with
    /// [`max_in_flight`](Self::max_in_flight)).
    pub const fn calls_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// How long one call may take (set with [`call_timeout`](Self::call_timeout)).
    pub const fn time_per_call(&self) -> Duration {
        self.call_timeout
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=1024).contains(&self.max_batch) {
            return Err(ConfigError::new(
                "batching.max_batch",
                "must be between 1 and 1024",
            ));
        }
        if !(1..=1024).contains(&self.max_in_flight) {
            return Err(ConfigError::new(
                "batching.max_in_flight",
                "must be between 1 and 1024",
            ));
        }
        if self.call_timeout < Duration::from_millis(1) {
            return Err(ConfigError::new(
                "batching.call_timeout",
                "must be at least 1 ms",
            ));
        }
        Ok(())
    }
}

/// How a batch script takes its checks' keys and arguments.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Layout {
    /// `batch.lua`'s: the time, the number of checks, then per check its key count, its
    /// argument count and its arguments; one reply per check.
    Generic,
    /// `gcra_batch.lua`'s: one key per check, the checks of a key one after the other; the
    /// time, then per run of checks with the same arguments their number and the arguments;
    /// one reply per check, then the time.
    Gcra,
}

/// `KEYS` and `ARGV` become locals that the driver points at each check's slice in turn; code
/// in `shared` (defined once) and in `body` (run once per check) both see the current check's.
pub(crate) fn batch_form(shared: &str, body: &str) -> Script {
    Script::new(&format!(
        "local KEYS, ARGV = KEYS, ARGV\n{shared}\nlocal function decide()\n{body}\nend\n{}",
        include_str!("../../../lua/batch.lua")
    ))
}

/// One queued check.
pub(crate) struct Job {
    pub(crate) script: &'static Script,
    pub(crate) layout: Layout,
    pub(crate) keys: Keys,
    pub(crate) args: Args,
    pub(crate) now: Option<u64>,
    pub(crate) reply: oneshot::Sender<Result<Value, Error>>,
}

/// The queue's sending side; the task ends when every clone is dropped.
#[derive(Clone)]
pub(crate) struct Batcher {
    queue: mpsc::Sender<Job>,
    config: Batching,
}

impl Batcher {
    /// Starts the batching task on the current Tokio runtime.
    pub(crate) fn start(link: Link, config: Batching) -> Result<Self, ConfigError> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| ConfigError::new("batching", "must be set up inside a Tokio runtime"))?;
        // Bounded: when Redis stalls, submitters wait here (within their store timeout)
        // instead of growing the queue without end.
        let capacity = (config.max_batch * config.max_in_flight * 64).min(1 << 16);
        let (queue, rx) = mpsc::channel(capacity);
        runtime.spawn(run(rx, link, config));
        Ok(Self { queue, config })
    }

    pub(crate) fn config(&self) -> Batching {
        self.config
    }

    /// Queues one check and waits for its reply.
    pub(crate) async fn submit(
        &self,
        script: &'static Script,
        layout: Layout,
        keys: Keys,
        args: Args,
        now: Option<u64>,
    ) -> Result<Value, Error> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            script,
            layout,
            keys,
            args,
            now,
            reply,
        };
        let stopped = || Error::Pool(Arc::new(Stopped));
        self.queue.send(job).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Why a batched check found no task to send it.
#[derive(Debug)]
struct Stopped;

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the batching task has stopped (its Tokio runtime shut down)")
    }
}

impl std::error::Error for Stopped {}

async fn run(mut rx: mpsc::Receiver<Job>, link: Link, config: Batching) {
    let permits = Arc::new(Semaphore::new(config.max_in_flight));
    let cluster = link.is_cluster();
    let mut jobs = Vec::with_capacity(config.max_batch);
    loop {
        // One server: wait for a free slot before taking what is queued, so checks gather
        // while the calls in flight run. A cluster: no wait (see the module docs).
        let mut permit = None;
        if !cluster {
            let Ok(p) = permits.clone().acquire_owned().await else {
                return;
            };
            permit = Some(p);
        }
        if rx.recv_many(&mut jobs, config.max_batch).await == 0 {
            return; // every sender is gone
        }
        // A check whose caller gave up (its store timeout passed) is not sent: it would take
        // quota for a request that was already answered.
        jobs.retain(|j| !j.reply.is_closed());
        for batch in group(&mut jobs, cluster) {
            // Further calls of the same round (other scripts or explicit times) take slots of
            // their own.
            let permit = match permit.take() {
                Some(p) => Some(p),
                None if cluster => None,
                None => match permits.clone().acquire_owned().await {
                    Ok(p) => Some(p),
                    Err(_) => return,
                },
            };
            let link = link.clone();
            let timeout = config.call_timeout;
            tokio::spawn(async move {
                send(batch, &link, timeout).await;
                drop(permit);
            });
        }
    }
}

/// Splits `jobs` into batches that one call can decide: the same script and explicit time,
/// and on a cluster the same slot. Arrival order is kept within each batch.
fn group(jobs: &mut Vec<Job>, cluster: bool) -> Vec<Vec<Job>> {
    let slot = |job: &Job| if cluster { slot(job.keys.first()) } else { 0 };
    let mut batches: Vec<(u16, Vec<Job>)> = Vec::new();
    for job in jobs.drain(..) {
        let job_slot = slot(&job);
        let same = |b: &&mut (u16, Vec<Job>)| {
            let first = &b.1[0];
            std::ptr::eq(first.script, job.script) && first.now == job.now && b.0 == job_slot
        };
        match batches.iter_mut().find(same) {
            Some((_, batch)) => batch.push(job),
            None => batches.push((job_slot, vec![job])),
        }
    }
    batches.into_iter().map(|(_, b)| b).collect()
}

async fn send(batch: Vec<Job>, link: &Link, timeout: Duration) {
    if batch[0].layout == Layout::Gcra {
        return send_gcra(batch, link, timeout).await;
    }
    let script = batch[0].script;
    let key_count = batch.iter().map(|job| job.keys.len()).sum();
    let keys = |cmd: &mut redis::Cmd| {
        for key in batch.iter().flat_map(|job| job.keys.iter()) {
            cmd.arg(key);
        }
    };
    let arg_count: usize = batch.iter().map(|job| job.args.as_slice().len()).sum();
    let capacity = (
        key_count + 2 * batch.len() + arg_count + 5,
        64 + 80 * key_count + 4 * batch.len() + 20 * arg_count,
    );
    let mut cmd = evalsha_sized(script, key_count, capacity, keys, batch[0].now);
    cmd.arg(batch.len());
    for job in &batch {
        let args = job.args.as_slice();
        cmd.arg(job.keys.len()).arg(args.len());
        for arg in args {
            cmd.arg(*arg);
        }
    }
    let reply = tokio::time::timeout(timeout, link.eval(script, &cmd))
        .await
        .unwrap_or(Err(Error::Timeout(timeout)));
    match reply {
        Ok(Value::Array(replies)) if replies.len() == batch.len() => {
            for (job, reply) in batch.into_iter().zip(replies) {
                let reply = match reply {
                    Value::BulkString(message) => Err(check_error(&message)),
                    other => Ok(other),
                };
                let _ = job.reply.send(reply);
            }
        }
        Ok(other) => {
            let why = format!("a batch of {} checks was answered {other:?}", batch.len());
            for job in batch {
                let _ = job.reply.send(Err(Error::InvalidReply(why.clone())));
            }
        }
        Err(e) => {
            for job in batch {
                let _ = job.reply.send(Err(e.clone()));
            }
        }
    }
}

/// Sends a batch of GCRA checks (see `lua/gcra_batch.lua`): ordered by key, the checks of one
/// key in their order (a key's checks come one after the other; checks of different keys do
/// not depend on each other's order), their arguments once per run of equal ones.
async fn send_gcra(batch: Vec<Job>, link: &Link, timeout: Duration) {
    let script = batch[0].script;
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by(|&a, &b| batch[a].keys.first().cmp(batch[b].keys.first()));
    let n = batch.len();
    let key_bytes: usize = batch.iter().map(|job| job.keys.first().len()).sum();
    let keys = |cmd: &mut redis::Cmd| {
        for &i in &order {
            cmd.arg(batch[i].keys.first());
        }
    };
    let mut cmd = evalsha_sized(
        script,
        n,
        (2 * n + 8, 64 + key_bytes + 16 * n),
        keys,
        batch[0].now,
    );
    let mut run = 0;
    while run < n {
        let args = batch[order[run]].args.as_slice();
        let len = order[run..]
            .iter()
            .take_while(|&&i| batch[i].args.as_slice() == args)
            .count();
        cmd.arg(len);
        for arg in args {
            cmd.arg(*arg);
        }
        run += len;
    }
    let reply = tokio::time::timeout(timeout, link.eval(script, &cmd))
        .await
        .unwrap_or(Err(Error::Timeout(timeout)));
    let mut jobs: Vec<Option<Job>> = batch.into_iter().map(Some).collect();
    let mut answer = |i: usize, reply: Result<Value, Error>| {
        if let Some(job) = jobs[i].take() {
            let _ = job.reply.send(reply);
        }
    };
    match reply {
        Ok(Value::Array(mut replies)) if replies.len() == n + 1 => {
            let now = match replies.pop() {
                Some(Value::Int(now)) if now >= 0 => now,
                other => {
                    let why = format!("a batch of {n} GCRA checks was answered at {other:?}");
                    for i in 0..n {
                        answer(i, Err(Error::InvalidReply(why.clone())));
                    }
                    return;
                }
            };
            for (&i, reply) in order.iter().zip(replies) {
                let reply = match reply {
                    // Admitted: its reset and the time (see algorithms::gcra::parse_gcra).
                    Value::Int(reset) if reset > 0 => {
                        Ok(Value::Array(vec![Value::Int(reset), Value::Int(now)]))
                    }
                    Value::BulkString(message) => Err(check_error(&message)),
                    other => Ok(other),
                };
                answer(i, reply);
            }
        }
        Ok(other) => {
            let why = format!("a batch of {n} GCRA checks was answered {other:?}");
            for i in 0..n {
                answer(i, Err(Error::InvalidReply(why.clone())));
            }
        }
        Err(e) => {
            for i in 0..n {
                answer(i, Err(e.clone()));
            }
        }
    }
}

/// The error of one check in a batch, from its message (e.g. `WRONGTYPE Operation against…`),
/// as a single call would have got it.
fn check_error(message: &[u8]) -> Error {
    let mut line = Vec::with_capacity(message.len() + 3);
    line.push(b'-');
    line.extend(message.iter().filter(|b| !matches!(b, b'\r' | b'\n')));
    line.extend_from_slice(b"\r\n");
    match redis::parse_redis_value(&line) {
        Ok(Value::ServerError(e)) => Error::Redis(e.into()),
        Err(e) => Error::Redis(e),
        Ok(_) => Error::InvalidReply(String::from_utf8_lossy(message).into_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_errors_keep_their_code() {
        let e = check_error(b"WRONGTYPE Operation against a key holding the wrong kind of value");
        match e {
            Error::Redis(e) => assert_eq!(e.code(), Some("WRONGTYPE")),
            other => panic!("{other:?}"),
        }
        assert!(!check_error(b"ERR tower-redis-ratelimit: corrupted TAT").is_unavailable());
        assert!(check_error(b"LOADING Redis is loading the dataset").is_unavailable());
        assert!(matches!(check_error(b"x\r\ny"), Error::Redis(_)));
    }

    #[test]
    fn limits_are_validated() {
        let b = Batching::new;
        for (batching, field) in [
            (b().max_batch(0), "batching.max_batch"),
            (b().max_batch(1025), "batching.max_batch"),
            (b().max_in_flight(0), "batching.max_in_flight"),
            (b().max_in_flight(usize::MAX), "batching.max_in_flight"),
            (b().call_timeout(Duration::ZERO), "batching.call_timeout"),
        ] {
            assert_eq!(
                batching.validate().unwrap_err().field(),
                field,
                "{batching:?}"
            );
        }
        assert!(Batching::new().validate().is_ok());
    }
}
