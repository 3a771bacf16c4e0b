//! What a limit keeps of the store it shares with other instances: its id among them (for the
//! fleet's top keys), and what it needs to notice a store that lost the limit's state (a
//! restart without persistence, a flush) and write back the bans it knows.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Mutex, MutexGuard, PoisonError, RwLock,
    },
    time::{Duration, Instant},
};

use crate::{extract::Key, store::KeyBuf};

/// Keys longer than this are named in `bans` by their SHA-1 (see `Key::write_compact`).
const ID_LEN: usize = 64;

/// `key`'s id in `bans`: its compact form, written without an allocation.
fn id(key: &Key<'_>) -> KeyBuf {
    let mut id = KeyBuf::new();
    key.write_compact(ID_LEN, &mut id);
    id
}

/// The most bans an instance keeps to write back; past it, the ended ones go, then new ones
/// are not kept.
const MAX_KNOWN_BANS: usize = 10_000;

/// A ban known to this instance: its key, and when it ends.
type KnownBan = (Key<'static>, Instant);

/// What a limit keeps of the store it shares with other instances.
pub(crate) struct StoreWatch {
    /// This limit's id among every instance sharing the store.
    pub(crate) instance: String,
    /// The token of the limit's marker last seen (`None` before the first look).
    seen: Mutex<Option<Vec<u8>>>,
    /// The bans this instance set, or saw the store enforce, each with when it ends, by the
    /// key's compact form (looked up on checks without an allocation).
    bans: RwLock<HashMap<Box<[u8]>, KnownBan>>,
    /// How many bans `bans` holds (read without its lock on every check).
    known: AtomicUsize,
    /// A loss was noticed and some bans are not written back yet: the next look tries again.
    pending: AtomicBool,
}

impl Default for StoreWatch {
    fn default() -> Self {
        Self {
            instance: crate::unique_id::next(),
            seen: Mutex::default(),
            bans: RwLock::default(),
            known: AtomicUsize::new(0),
            pending: AtomicBool::new(false),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl StoreWatch {
    /// `key` is banned for `left` more.
    pub(crate) fn banned(&self, key: &Key<'_>, left: Duration) {
        let now = Instant::now();
        let ends = now + left;
        let id = id(key);
        let mut bans = self.bans.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = bans.get_mut(id.as_bytes()) {
            known.1 = ends;
            return;
        }
        if bans.len() >= MAX_KNOWN_BANS {
            bans.retain(|_, (_, ends)| *ends > now);
            if bans.len() >= MAX_KNOWN_BANS {
                return;
            }
        }
        bans.insert(id.as_bytes().into(), (key.clone().into_owned(), ends));
        self.known.store(bans.len(), Ordering::Relaxed);
    }

    /// `key`'s ban was lifted (here, or by another instance: the store's check of the key
    /// found none). Looked up under a shared lock first: checks of keys never banned take no
    /// exclusive lock and allocate nothing.
    pub(crate) fn unbanned(&self, key: &Key<'_>) {
        if self.known.load(Ordering::Relaxed) == 0 {
            return;
        }
        let id = id(key);
        let known = self
            .bans
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(id.as_bytes());
        if known {
            let mut bans = self.bans.write().unwrap_or_else(PoisonError::into_inner);
            bans.remove(id.as_bytes());
            self.known.store(bans.len(), Ordering::Relaxed);
        }
    }

    /// Whether any ban is known (no lock).
    pub(crate) fn knows_bans(&self) -> bool {
        self.known.load(Ordering::Relaxed) > 0
    }

    /// The bans still in force, each with when it ends.
    pub(crate) fn live_bans(&self) -> Vec<(Key<'static>, Instant)> {
        let now = Instant::now();
        let mut bans = self.bans.write().unwrap_or_else(PoisonError::into_inner);
        bans.retain(|_, (_, ends)| *ends > now);
        self.known.store(bans.len(), Ordering::Relaxed);
        bans.values().cloned().collect()
    }

    /// Marks the bans as waiting to be written back (`true`), or written (`false`).
    pub(crate) fn set_pending(&self, pending: bool) {
        self.pending.store(pending, Ordering::Relaxed);
    }

    /// Whether bans are waiting to be written back since a loss.
    pub(crate) fn pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// The marker's token seen now: `true` when it differs from the one seen before (the
    /// store lost the state it held then).
    pub(crate) fn saw(&self, token: Vec<u8>) -> bool {
        let mut seen = lock(&self.seen);
        let changed = seen.as_ref().is_some_and(|before| *before != token);
        *seen = Some(token);
        changed
    }
}

impl std::fmt::Debug for StoreWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreWatch")
            .field("known_bans", &self.known.load(Ordering::Relaxed))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_token_is_noticed_once_and_the_first_look_is_not_a_change() {
        let w = StoreWatch::default();
        assert!(!w.saw(b"a".to_vec()));
        assert!(!w.saw(b"a".to_vec()));
        assert!(w.saw(b"b".to_vec()));
        assert!(!w.saw(b"b".to_vec()));
    }

    #[test]
    fn bans_are_kept_until_they_end_or_are_lifted() {
        let w = StoreWatch::default();
        w.banned(&Key::from("a"), Duration::from_secs(60));
        w.banned(&Key::from("b"), Duration::ZERO);
        w.banned(&Key::from("c"), Duration::from_secs(60));
        w.unbanned(&Key::from("c"));
        let live = w.live_bans();
        assert_eq!(live.len(), 1, "{live:?}");
        assert_eq!(live[0].0, Key::from("a"));
        assert!(live[0].1 <= Instant::now() + Duration::from_secs(60));
        assert!(w.knows_bans());
        w.unbanned(&Key::from("a"));
        assert!(!w.knows_bans());
    }
}
