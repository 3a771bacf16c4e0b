//! Per-key concurrency limits: [`ConcurrencyLimiter`] holds at most N slots per key in a
//! store shared by every instance, each under a lease that is renewed while held and expires
//! when its holder is gone; [`Permit`] is one held slot.
//!
//! `slots` holds the settings and the store calls, `lease` one holder's renewal and release,
//! `releases` the failed releases sent again, `acquire` the path to a permit (with the local
//! share), so that none imports another that imports it.

mod acquire;
mod builder;
mod lease;
mod limiter;
mod permit;
mod releases;
mod slots;

pub use self::{builder::ConcurrencyLimiterBuilder, limiter::ConcurrencyLimiter, permit::Permit};
