//! The queue of a limiter's refusals to count toward automatic bans, and its task (see
//! [`AutoBan`](super::AutoBan) for why refusals are counted off the request path).

use std::sync::{OnceLock, Weak};

use tokio::sync::mpsc;

use crate::{
    core::{quiet::Quiet, report},
    extract::Key,
    store::{offences::BanTerms, BoxFuture},
};

/// The refusals a limiter may hold waiting to be counted; past it, a refusal is dropped.
const QUEUE: usize = 4_096;

/// What counts one refusal in the store (the limiter's engine).
pub(crate) trait RefusalCounter: Send + Sync + 'static {
    /// Counts one refusal of `key`, and makes the ban it sets this process's.
    fn count<'a>(&'a self, key: &'a Key<'static>) -> BoxFuture<'a, ()>;
}

/// A limiter's automatic bans: its terms and the queue of refusals to count.
pub(crate) struct Banner {
    terms: BanTerms,
    /// What counts, for the task (weak: the engine owns this).
    counter: OnceLock<Weak<dyn RefusalCounter>>,
    /// The queue, made with its task on the first refusal (a runtime is there then).
    queue: OnceLock<mpsc::Sender<Key<'static>>>,
}

impl Banner {
    pub(crate) fn new(terms: BanTerms) -> Self {
        Self {
            terms,
            counter: OnceLock::new(),
            queue: OnceLock::new(),
        }
    }

    /// The terms (shadow mode off: the engine says).
    pub(crate) fn terms(&self) -> &BanTerms {
        &self.terms
    }

    /// Binds the counting task to `counter` (once the engine is built).
    pub(crate) fn bind(&self, counter: Weak<dyn RefusalCounter>) {
        let _ = self.counter.set(counter);
    }

    /// Puts a refusal of `key` on the queue, without waiting; a full queue drops it, logged
    /// at most once a second under `policy`.
    pub(crate) fn refused(&self, key: &Key<'_>, policy: &str, quiet: &Quiet) {
        let Some(queue) = self.queue() else {
            let why = "no tokio runtime to count in";
            return report::refusal_not_counted(policy, quiet, &why);
        };
        if queue.try_send(key.clone().into_owned()).is_err() {
            let why = "the queue of refusals to count is full";
            report::refusal_not_counted(policy, quiet, &why);
        }
    }

    /// The queue, its task started on first use.
    fn queue(&self) -> Option<&mpsc::Sender<Key<'static>>> {
        if let Some(queue) = self.queue.get() {
            return Some(queue);
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let counter = self.counter.get()?.clone();
        Some(self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            runtime.spawn(count_refusals(counter, rx));
            tx
        }))
    }
}

/// The counting task: each refusal in turn, until the limiter is gone.
async fn count_refusals(
    counter: Weak<dyn RefusalCounter>,
    mut queue: mpsc::Receiver<Key<'static>>,
) {
    while let Some(key) = queue.recv().await {
        let Some(counter) = counter.upgrade() else {
            return;
        };
        counter.count(&key).await;
    }
}
