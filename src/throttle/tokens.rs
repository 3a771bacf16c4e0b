//! An upstream's token budget beside its request budget: what a call is estimated to use,
//! the window of the budget's limit, where the figure it really used comes from, and the
//! handle a caller settles it through.

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use http::{request::Parts, HeaderMap, HeaderName};

use super::adaptive::Adaptive;
use crate::{
    error::{ConfigError, Error},
    extract::{CostFn, Key},
    rate_limit::RateEngine,
    store::{Ledger, Upstreams},
};

/// The tokens a call is estimated to use when [`TokenBudget::estimate`] is not given.
pub const DEFAULT_TOKEN_ESTIMATE: u32 = 1_000;

/// The window of a token limit when [`TokenBudget::window`] is not given: a minute, as
/// OpenAI and Anthropic state tokens per minute.
pub const DEFAULT_TOKEN_WINDOW: Duration = Duration::from_secs(60);

/// An upstream's budget of tokens (a model API's tokens per minute), which an adaptive
/// throttle learns from its answers and respects beside the request budget (see
/// [`ThrottleLayer::token_budget`](super::ThrottleLayer::token_budget)).
///
/// Each call takes its estimate of tokens before it is sent (waiting, like the request
/// budget, for its place in the upstream's pace), and is settled afterwards to what it used:
/// the figure in a response header ([`settle_from_header`](Self::settle_from_header)), or
/// what the caller reads from the body and reports through the [`TokenUsage`] handle in the
/// response's extensions. Using more than the estimate is a debt: the next calls wait for
/// it; using less gives the difference back. Without a settlement the estimate stands.
///
/// The budget is learned from OpenAI's `x-ratelimit-*-tokens` fields and Anthropic's
/// `anthropic-ratelimit-tokens-*` (or `-input-tokens-*` / `-output-tokens-*`) fields (see
/// [`read_token_limits`](super::read_token_limits)), and shared through the adaptive store
/// by every instance calling the same key.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::throttle::TokenBudget;
///
/// let budget = TokenBudget::new()
///     // The prompt's length, say, from a header the caller sets.
///     .estimate(|parts: &http::request::Parts| {
///         parts.headers.get("x-estimated-tokens")
///             .and_then(|v| v.to_str().ok()?.parse().ok())
///             .unwrap_or(2_000)
///     })
///     .settle_from_header(http::HeaderName::from_static("x-usage-total-tokens"))
///     .window(Duration::from_secs(60))?;
/// # let _ = budget;
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct TokenBudget {
    pub(crate) estimate: Option<Arc<CostFn>>,
    pub(crate) window: Duration,
    pub(crate) settle_header: Option<HeaderName>,
}

impl Default for TokenBudget {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for TokenBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBudget")
            .field("estimate", &self.estimate.as_ref().map(|_| "fn"))
            .field("window", &self.window)
            .field("settle_header", &self.settle_header)
            .finish()
    }
}

impl TokenBudget {
    /// Each call estimated at [`DEFAULT_TOKEN_ESTIMATE`] tokens, a limit per
    /// [`DEFAULT_TOKEN_WINDOW`], settled only through the [`TokenUsage`] handle.
    pub fn new() -> Self {
        Self {
            estimate: None,
            window: DEFAULT_TOKEN_WINDOW,
            settle_header: None,
        }
    }

    /// The tokens a call is estimated to use, taken before it is sent (0: the call takes
    /// none and is not settled). An estimate near what calls use keeps the pace even; one
    /// too low is paid back as a debt once the call is settled, one too high given back.
    pub fn estimate<F>(mut self, estimate: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.estimate = Some(Arc::new(estimate));
        self
    }

    /// The window the upstream's token limit is per (default a minute). More than zero and at
    /// most one day; otherwise a [`ConfigError`] naming `window`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `window` for zero or more than one day.
    pub fn window(mut self, window: Duration) -> Result<Self, ConfigError> {
        if window.is_zero() || window > Duration::from_secs(86_400) {
            return Err(ConfigError::new(
                "window",
                format!("{window:?}: must be more than zero and at most one day"),
            ));
        }
        self.window = window;
        Ok(self)
    }

    /// Settles each call to the whole number in its response's header `name` (a usage figure
    /// the upstream or a proxy sends), before the response is returned. A missing or
    /// unreadable figure (not a whole number, negative, more than 19 digits) keeps the
    /// estimate; the [`TokenUsage`] handle may still settle it.
    pub fn settle_from_header(mut self, name: HeaderName) -> Self {
        self.settle_header = Some(name);
        self
    }

    /// The call's estimate.
    pub(crate) fn estimate_of(&self, parts: &Parts) -> u32 {
        self.estimate
            .as_ref()
            .map_or(DEFAULT_TOKEN_ESTIMATE, |f| f(parts))
    }

    /// The figure of the settlement header in `headers`, when there is one that reads.
    pub(crate) fn figure(&self, headers: &HeaderMap) -> Option<u64> {
        let value = headers.get(self.settle_header.as_ref()?)?.to_str().ok()?;
        let t = value.trim();
        if t.is_empty() || t.len() > 19 || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    }
}

/// The handle through which a caller settles a throttled call's tokens to what it used,
/// found in the response's extensions when the throttle has a [`TokenBudget`]:
///
/// ```
/// # async fn read(res: http::Response<String>) -> Result<(), tower_redis_ratelimit::Error> {
/// use tower_redis_ratelimit::throttle::TokenUsage;
///
/// let used = 1_234; // the body's `usage.total_tokens`
/// if let Some(usage) = res.extensions().get::<TokenUsage>() {
///     usage.settle(used).await?;
/// }
/// # Ok(()) }
/// ```
///
/// A call is settled once: by its response header
/// ([`TokenBudget::settle_from_header`]) or by this handle, the first to settle winning.
/// Clones share the call; dropped without settling, the estimate stands.
#[derive(Clone)]
pub struct TokenUsage {
    inner: Arc<Held>,
}

/// One call's tokens until they are settled.
struct Held {
    adaptive: Adaptive,
    engine: Arc<RateEngine>,
    key: Key<'static>,
    estimate: u32,
    settled: AtomicBool,
}

impl fmt::Debug for TokenUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenUsage")
            .field("estimate", &self.inner.estimate)
            .field("settled", &self.inner.settled.load(Ordering::Relaxed))
            .finish()
    }
}

impl TokenUsage {
    pub(crate) fn new(
        adaptive: &Adaptive,
        engine: &Arc<RateEngine>,
        key: &Key<'static>,
        estimate: u32,
    ) -> Self {
        Self {
            inner: Arc::new(Held {
                adaptive: adaptive.clone(),
                engine: Arc::clone(engine),
                key: key.clone(),
                estimate,
                settled: AtomicBool::new(false),
            }),
        }
    }

    /// The tokens the call took before it was sent.
    pub fn estimate(&self) -> u32 {
        self.inner.estimate
    }

    /// Whether the call was settled (by its header or through a handle).
    pub fn is_settled(&self) -> bool {
        self.inner.settled.load(Ordering::Acquire)
    }

    /// Settles the call to `used` tokens, for every instance sharing the store: beyond the
    /// estimate, a debt the next calls wait for; below it, the difference given back.
    /// `Ok(false)` when the call was settled already (nothing changes).
    ///
    /// # Errors
    ///
    /// The store's [`Error`] (or a timeout) when the settlement could not be written; the
    /// call then counts as settled (its estimate stands).
    pub async fn settle(&self, used: u64) -> Result<bool, Error> {
        let held = &self.inner;
        if held.settled.swap(true, Ordering::AcqRel) {
            return Ok(false);
        }
        let store_key = held.engine.store_key(Some(&held.key));
        let taken = u64::from(held.estimate);
        let store = &held.adaptive.store;
        held.engine
            .core
            .call(|| store.settle(store_key, Ledger::Tokens, taken, used))
            .await?;
        Ok(true)
    }
}
