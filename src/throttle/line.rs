//! Callers of one key wait in line, in the order they asked: only the first asks the stores
//! for its turn, so that a caller that waited long is not overtaken by one that just came
//! (every wake-up a new race), and its place is kept while it waits.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use tokio::sync::{Mutex as Turn, OwnedMutexGuard};

use crate::extract::Key;

/// The lines of a throttle's keys in this process, one per key with callers in it (a key's
/// line is forgotten when its last caller leaves, so there are never more lines than
/// callers).
#[derive(Debug, Default)]
pub(crate) struct Lines {
    lines: Mutex<HashMap<Key<'static>, Arc<Turn<()>>>>,
}

/// A caller's place in its key's line; the caller is first in it once [`Place::first`]
/// returns. Leaving (dropping it, first or not) lets the next caller move up.
pub(crate) struct Place<'a> {
    lines: &'a Lines,
    key: &'a Key<'static>,
    line: Option<Arc<Turn<()>>>,
    first: Option<OwnedMutexGuard<()>>,
}

impl Lines {
    /// Joins the line of `key`, at its end.
    pub(crate) fn join<'a>(&'a self, key: &'a Key<'static>) -> Place<'a> {
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let line = lines.entry(key.clone()).or_default().clone();
        Place {
            lines: self,
            key,
            line: Some(line),
            first: None,
        }
    }

    /// How many keys have callers in line.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lines.lock().unwrap().len()
    }
}

impl Place<'_> {
    /// Waits until every caller who joined before has left (tokio's mutex serves its waiters
    /// in the order they came).
    pub(crate) async fn first(&mut self) {
        if self.first.is_none() {
            let line = self.line.clone().expect("a place in a line");
            self.first = Some(line.lock_owned().await);
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        drop(self.first.take());
        drop(self.line.take());
        let mut lines = self.lines.lines.lock().unwrap_or_else(|e| e.into_inner());
        // Every handle on a line is taken under this lock: one the map alone holds has no
        // caller left.
        if lines
            .get(self.key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            lines.remove(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn callers_are_first_in_the_order_they_joined_and_lines_are_forgotten() {
        let lines = Arc::new(Lines::default());
        let key = Key::from("k").into_owned();
        let mut first = lines.join(&key);
        first.first().await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (line_of, key_of, order) = (lines.clone(), key.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let mut place = line_of.join(&key_of);
                place.first().await;
                order.lock().unwrap().push(i);
            }));
            // Each waits in line before the next is spawned (one thread: a spawned task runs
            // when this one yields, until it waits): the map, the first's place and its turn,
            // and two handles per caller waiting.
            while Arc::strong_count(lines.lines.lock().unwrap().get(&key).unwrap())
                < 3 + 2 * (i + 1)
            {
                tokio::task::yield_now().await;
            }
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        assert_eq!(lines.len(), 0);
    }

    #[tokio::test]
    async fn a_caller_that_gives_up_in_line_leaves_no_line_behind() {
        let lines = Lines::default();
        let key = Key::from("k").into_owned();
        let mut first = lines.join(&key);
        first.first().await;
        {
            let mut second = lines.join(&key);
            let waiting = tokio::time::timeout(std::time::Duration::from_millis(1), second.first());
            assert!(waiting.await.is_err());
        }
        assert_eq!(lines.len(), 1);
        drop(first);
        assert_eq!(lines.len(), 0);
    }
}
