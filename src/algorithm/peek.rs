//! What a check would see, without a check: the in-memory twin of the peek scripts
//! (`lua/gcra_peek.lua`, `lua/token_bucket_peek.lua`, `lua/sliding_window_peek.lua`).

use super::{gcra, multi, sliding_window, token_bucket, Algorithm, MemoryState, Outcome, Rule};
use crate::error::Error;

/// The state of `key` as a check at `now_us` would see it, spending nothing: the same
/// arithmetic as a check of a cost no limit can fit (which never writes), so its numbers are
/// the next check's. `remaining` and `reset_after_us` are what a check of cost 0 would show;
/// the outcome is a denial. [`Error::Unsupported`] for a custom algorithm.
///
/// A sliding-window log drops the entries that left the window, as a check does: that
/// changes nothing any check can see.
pub(crate) fn peek(
    algorithm: &dyn Algorithm,
    state: &mut MemoryState,
    now_us: u64,
) -> Result<Outcome, Error> {
    const NEVER: u64 = u64::MAX;
    Ok(match algorithm.rule() {
        Rule::Gcra(r) => gcra::decide(r, state.tat()?, now_us, NEVER).0,
        Rule::TokenBucket(r) => token_bucket::decide(r, state.bucket()?, now_us, NEVER).0,
        Rule::SlidingWindow(w) => {
            if state.is_empty() {
                return Ok(Outcome::single(false, w.limit, None, 0));
            }
            sliding_window::decide(w.window_us, w.limit, state.log()?, now_us, NEVER).0
        }
        Rule::Multi(rates) => {
            let n = rates.len();
            let mut tats = [None; 8];
            if let Some(stored) = state.tats(n)? {
                tats[..n].copy_from_slice(stored);
            }
            let mut o = multi::decide(rates, &mut tats[..n], now_us, NEVER);
            // The binding limit of a peek: the one with the fewest units left (the first of
            // equals), as the peek script's reply is read.
            let mut b = 0;
            for (i, p) in o.parts.iter().enumerate() {
                if p.remaining < o.parts[b].remaining {
                    b = i;
                }
            }
            o.binding = b;
            o.remaining = o.parts[b].remaining;
            o.reset_after_us = o.parts[b].reset_after_us;
            o
        }
        Rule::Script(_) => {
            return Err(Error::Unsupported(
                "a custom algorithm cannot be read without a check",
            ))
        }
    })
}
