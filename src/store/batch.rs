//! Exact batching: concurrent checks go to Redis as one script call that decides them all.
//!
//! A background task owns the queue. While fewer than `max_in_flight` batches are on their way
//! to Redis, whatever is queued (at least one check, at most `max_batch`) leaves at once as one
//! call of the algorithm's batch script; checks arriving meanwhile wait for the next. A lone
//! check therefore never waits for company, and under load one call carries many checks. The
//! batch script decides its checks one after the other inside one atomic call, so each decision
//! is exactly the one its own call would have got at that instant.

use std::sync::Arc;

use redis::{Script, Value};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::redis::Backend;
use crate::{ConfigError, Error};

/// How a [`RedisStore`](crate::RedisStore) batches concurrent checks; see
/// [`RedisStore::with_batching`](crate::RedisStore::with_batching).
///
/// ```
/// use tower_redis_ratelimit::Batching;
///
/// let batching = Batching::new().max_batch(128).max_in_flight(4);
/// assert_eq!(batching.get_max_batch(), 128);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    max_batch: usize,
    max_in_flight: usize,
}

impl Default for Batching {
    fn default() -> Self {
        Self::new()
    }
}

impl Batching {
    /// At most 64 checks per call, at most 2 calls on their way at once.
    pub const fn new() -> Self {
        Self {
            max_batch: 64,
            max_in_flight: 2,
        }
    }

    /// Checks decided by one script call, at most (1 to 1,024).
    pub const fn max_batch(mut self, checks: usize) -> Self {
        self.max_batch = checks;
        self
    }

    /// Batches sent and not yet answered, at most. While all are in flight, new checks queue
    /// up for the next batch.
    pub const fn max_in_flight(mut self, calls: usize) -> Self {
        self.max_in_flight = calls;
        self
    }

    /// The configured `max_batch`.
    pub const fn get_max_batch(&self) -> usize {
        self.max_batch
    }

    /// The configured `max_in_flight`.
    pub const fn get_max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=1024).contains(&self.max_batch) {
            return Err(ConfigError::new(
                "batching.max_batch",
                "must be between 1 and 1024",
            ));
        }
        if self.max_in_flight == 0 {
            return Err(ConfigError::new(
                "batching.max_in_flight",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// One queued check.
pub(crate) struct Job {
    pub(crate) script: &'static Script,
    pub(crate) keys: Vec<String>,
    pub(crate) args: Vec<u64>,
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
    pub(crate) fn start(backend: Backend, config: Batching) -> Result<Self, ConfigError> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| ConfigError::new("batching", "must be set up inside a Tokio runtime"))?;
        // Bounded: when Redis stalls, submitters wait here (within their store timeout)
        // instead of growing the queue without end.
        let (queue, rx) = mpsc::channel(config.max_batch * config.max_in_flight * 64);
        runtime.spawn(run(rx, backend, config));
        Ok(Self { queue, config })
    }

    pub(crate) fn config(&self) -> Batching {
        self.config
    }

    /// Queues one check and waits for its reply.
    pub(crate) async fn submit(
        &self,
        script: &'static Script,
        keys: Vec<String>,
        args: Vec<u64>,
        now: Option<u64>,
    ) -> Result<Value, Error> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            script,
            keys,
            args,
            now,
            reply,
        };
        let stopped = || Error::Pool("the batching task has stopped".to_owned());
        self.queue.send(job).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(mut rx: mpsc::Receiver<Job>, backend: Backend, config: Batching) {
    let permits = Arc::new(Semaphore::new(config.max_in_flight));
    let cluster = backend.is_cluster();
    let mut jobs = Vec::with_capacity(config.max_batch);
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        if rx.recv_many(&mut jobs, config.max_batch).await == 0 {
            return; // every sender is gone
        }
        // A check whose caller gave up (its store timeout passed) is not sent: it would take
        // quota for a request that was already answered.
        jobs.retain(|j| !j.reply.is_closed());
        let permit = Arc::new(permit);
        for batch in group(&mut jobs, cluster) {
            let (backend, permit) = (backend.clone(), permit.clone());
            tokio::spawn(async move {
                send(batch, &backend).await;
                drop(permit);
            });
        }
    }
}

/// Splits `jobs` into batches that one call can decide: the same script and explicit time,
/// and on a cluster the same hash tag (so one slot). Arrival order is kept within each batch.
fn group(jobs: &mut Vec<Job>, cluster: bool) -> Vec<Vec<Job>> {
    let mut batches: Vec<Vec<Job>> = Vec::new();
    for job in jobs.drain(..) {
        let same = |b: &&mut Vec<Job>| {
            let first = &b[0];
            std::ptr::eq(first.script, job.script)
                && first.now == job.now
                && (!cluster || hash_tag(&first.keys) == hash_tag(&job.keys))
        };
        match batches.iter_mut().find(same) {
            Some(batch) => batch.push(job),
            None => batches.push(vec![job]),
        }
    }
    batches
}

/// The hash tag of a check's first key (all of a check's keys share it).
fn hash_tag(keys: &[String]) -> &str {
    let Some(key) = keys.first() else { return "" };
    match key.find('{') {
        Some(open) => match key[open + 1..].find('}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    }
}

async fn send(batch: Vec<Job>, backend: &Backend) {
    let script = batch[0].script;
    let mut invocation = script.prepare_invoke();
    for job in &batch {
        for key in &job.keys {
            invocation.key(key);
        }
    }
    match batch[0].now {
        Some(now) => invocation.arg(now),
        None => invocation.arg(""),
    };
    invocation.arg(batch.len());
    for job in &batch {
        invocation.arg(job.keys.len()).arg(job.args.len());
        for arg in &job.args {
            invocation.arg(*arg);
        }
    }
    match backend.invoke(&invocation).await {
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
                let _ = job.reply.send(Err(duplicate(&e)));
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

/// The same error again, for every check of a failed batch.
fn duplicate(e: &Error) -> Error {
    match e {
        Error::Redis(e) => Error::Redis(e.clone()),
        Error::Pool(e) => Error::Pool(e.clone()),
        Error::InvalidReply(e) => Error::InvalidReply(e.clone()),
        Error::Timeout(d) => Error::Timeout(*d),
        Error::InvalidInput(e) => Error::InvalidInput(e),
        Error::Unsupported(e) => Error::Unsupported(e),
        Error::CircuitOpen => Error::CircuitOpen,
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
    fn hash_tags() {
        let k = |s: &str| vec![s.to_owned()];
        assert_eq!(hash_tag(&k("{rl:a}:l")), "rl:a");
        assert_eq!(hash_tag(&k("x{rl:a}")), "rl:a");
        assert_eq!(hash_tag(&k("{}x")), "{}x");
        assert_eq!(hash_tag(&k("plain")), "plain");
        assert_eq!(hash_tag(&[]), "");
    }

    #[test]
    fn limits_are_validated() {
        assert_eq!(
            Batching::new().max_batch(0).validate().unwrap_err().field(),
            "batching.max_batch"
        );
        assert_eq!(
            Batching::new()
                .max_batch(1025)
                .validate()
                .unwrap_err()
                .field(),
            "batching.max_batch"
        );
        assert_eq!(
            Batching::new()
                .max_in_flight(0)
                .validate()
                .unwrap_err()
                .field(),
            "batching.max_in_flight"
        );
        assert!(Batching::new().validate().is_ok());
    }
}
