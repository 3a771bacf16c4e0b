//! Automatic bans in memory: the twin of `lua/autoban.lua`.

use super::MemoryStore;
use crate::{
    error::Error,
    store::{
        offences::{BanTerms, Counted},
        KeyBuf, StoreKey,
    },
};

impl MemoryStore {
    /// Counts one refusal of `key` at `now` under `terms`, and sets the ban it brings (see
    /// [`Backend::count_refusal`](crate::store::Backend::count_refusal)). The key's offences
    /// are locked while its ban is looked at and written, so that concurrent refusals add up
    /// exactly and only the one that reaches the count bans.
    pub(super) fn count_refusal_now(
        &self,
        key: StoreKey<'_>,
        terms: &BanTerms,
        now: u64,
    ) -> Result<Counted, Error> {
        let mut compact = KeyBuf::new();
        key.write_compact("offences", &mut compact);
        let offences = &self.inner.offences;
        let slot = offences.slot(compact.as_bytes());
        let mut shard = offences.lock(slot);
        if self.ban_left(key, now).is_some() {
            return Ok(Counted::default());
        }
        let counted = match shard.get_mut(slot, compact.as_bytes()) {
            Some(held) => held.count(terms, now),
            None => {
                shard.room(now);
                let fresh = shard.insert(slot, compact.as_bytes(), Default::default());
                fresh.count(terms, now)
            }
        };
        if counted.ban_us > 0 && !terms.shadow {
            self.set_ban(key, Some(now.saturating_add(counted.ban_us)), now)?;
        }
        Ok(counted)
    }

    /// The count of `key`'s refusals starts afresh (a ban started).
    pub(super) fn forget_refusals(&self, key: StoreKey<'_>) {
        let mut compact = KeyBuf::new();
        key.write_compact("offences", &mut compact);
        let offences = &self.inner.offences;
        let slot = offences.slot(compact.as_bytes());
        if let Some(held) = offences.lock(slot).get_mut(slot, compact.as_bytes()) {
            held.forget_refusals();
        }
    }
}
