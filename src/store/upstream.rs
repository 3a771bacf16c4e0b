//! What a store keeps for an adaptive [`ThrottleLayer`](crate::throttle::ThrottleLayer): what an upstream
//! said about its limits, shared by every instance calling it (see
//! [`Backend::take`](super::Backend::take) and [`Backend::learn`](super::Backend::learn)).
//! Times are on the store's clock.

use std::time::Duration;

/// What one answer of an upstream said about its limit, as
/// [`ThrottleLayer::adaptive`](crate::throttle::ThrottleLayer::adaptive) reads it from the response's
/// headers (see [`read_limits`](crate::throttle::read_limits)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Learned {
    /// Send nothing for this long (`Retry-After` on a 429 or a 503).
    pub pause: Option<Duration>,
    /// Units left in the upstream's current window.
    pub remaining: Option<u64>,
    /// Time until the upstream's window resets.
    pub reset: Option<Duration>,
    /// The upstream's rate: units per window, stated (`RateLimit-Policy`) or inferred from a
    /// limit header and the reset (see [`Rate::stated`]).
    pub rate: Option<Rate>,
}

/// The longest window of a rate the stores keep (a longer one is taken as this long), and the
/// largest quota: so that the scripts' arithmetic stays exact.
pub(crate) const MAX_RATE_WINDOW: Duration = Duration::from_secs(31 * 86_400);
pub(crate) const MAX_RATE_QUOTA: u64 = 1 << 32;

/// An upstream's rate, which the throttle paces its calls by: `quota` units per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rate {
    /// Units per window.
    pub quota: u64,
    /// The window.
    pub window: Duration,
    /// True when the upstream stated the window (`RateLimit-Policy`'s `w`); false when it is
    /// inferred from a reset (a `RateLimit-Limit` or `X-RateLimit-Limit` with its reset, in
    /// whole seconds): the store then keeps the longest window seen, as a reset is never
    /// longer than its window.
    pub stated: bool,
}

impl Rate {
    /// `quota` units per `window`, as the upstream stated it.
    pub const fn stated(quota: u64, window: Duration) -> Self {
        Self {
            quota,
            window,
            stated: true,
        }
    }

    /// `quota` units per a window at least `window` long (inferred from a reset).
    pub const fn inferred(quota: u64, window: Duration) -> Self {
        Self {
            quota,
            window,
            stated: false,
        }
    }
}

impl Learned {
    /// Nothing learned.
    pub const fn new() -> Self {
        Self {
            pause: None,
            remaining: None,
            reset: None,
            rate: None,
        }
    }

    /// With the upstream's rate.
    pub const fn rate(mut self, rate: Rate) -> Self {
        self.rate = Some(rate);
        self
    }

    /// With a pause.
    pub const fn pause(mut self, pause: Duration) -> Self {
        self.pause = Some(pause);
        self
    }

    /// With the units left in a window that resets after `reset`.
    pub const fn window(mut self, remaining: u64, reset: Duration) -> Self {
        self.remaining = Some(remaining);
        self.reset = Some(reset);
        self
    }

    /// True when it says nothing a store keeps (a remaining count without its reset time is
    /// not kept: it cannot tell when the units come back).
    pub fn is_empty(&self) -> bool {
        self.pause.is_none()
            && self.rate.is_none()
            && (self.remaining.is_none() || self.reset.is_none())
    }
}

/// Which of an upstream's budgets a call of the store is about: its requests, or its tokens
/// (a model API's tokens per minute, see [`TokenBudget`](crate::throttle::TokenBudget)). Each
/// is kept apart under the same key, by the same rules, in units of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ledger {
    /// Requests (or the units of the throttle's `cost`).
    Requests,
    /// Tokens.
    Tokens,
}

/// Whether an outbound call may go now, by what the upstream said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gate {
    /// The call may go (and its cost was taken from the units the upstream said were left,
    /// or its place in the upstream's pace was kept for it).
    pub(crate) go: bool,
    /// When it may go: how long until its place in the upstream's pace (zero when it goes at
    /// once). When it may not: how long until the pause or the upstream's window ends, or
    /// until the place it would have, beyond the caller's budget.
    pub(crate) wait: Duration,
    /// How the call goes: counted against a known window, blind, or first to learn the next
    /// window. The answer to a blind call is recorded even when it says nothing
    /// ([`Backend::learn`](super::Backend::learn)).
    pub(crate) blind: Sent,
}

/// How a call that may go is sent (see [`Gate::blind`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Counted against the upstream's known window.
    #[default]
    Counted,
    /// No window is known: sent blind, counted until its answer comes back.
    Blind,
    /// The known window ended: this call goes first to learn the next one; the others wait
    /// for its answer.
    Probe,
}

impl Gate {
    pub(crate) const fn new(go: bool, wait: Duration) -> Self {
        Self {
            go,
            wait,
            blind: Sent::Counted,
        }
    }

    /// The same answer, for a call that goes blind or first (see [`Sent`]).
    pub(crate) const fn blind(mut self, blind: Sent) -> Self {
        self.blind = blind;
        self
    }
}
