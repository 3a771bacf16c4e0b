//! The throttle's tower service: wait for quota (the configured one, and what the upstream
//! said), call the inner service, learn from the answer, and maybe send a 429'd call again.

use std::{
    fmt,
    future::Future,
    marker::PhantomData,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use http::{Method, Request, Response};
use tower_service::Service;

use super::{
    adaptive::{Adaptive, AdaptiveCounters},
    clock::Clock,
    config::{NoRetry, RetryIdempotent, Settings},
    error::ThrottleError,
    learn::{at_least_a_moment, read_limits, read_token_limits},
    line::Place,
    tokens::{TokenBudget, TokenUsage},
};
use crate::core::quiet::{self, Cause};
use crate::{
    algorithm::{Algorithm, Kind},
    decision::{Decision, Source},
    error::ErrorChain,
    extract::{Key, KeyExtractor},
    rate_limit::RateLimiter,
    store::{micros, Backend, BoxFuture, Learned, Ledger, Pace, Sent, Upstreams},
};

/// The service made by [`ThrottleLayer`](super::ThrottleLayer).
pub struct Throttle<S, K, A, R = NoRetry> {
    inner: S,
    settings: Settings<K, A>,
    _retry: PhantomData<fn() -> R>,
}

impl<S, K, A, R> Throttle<S, K, A, R> {
    pub(crate) fn new(inner: S, settings: Settings<K, A>) -> Self {
        Self {
            inner,
            settings,
            _retry: PhantomData,
        }
    }
}

impl<S: Clone, K, A, R> Clone for Throttle<S, K, A, R> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), self.settings.clone())
    }
}

impl<S: fmt::Debug, K, A: Algorithm, R> fmt::Debug for Throttle<S, K, A, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("inner", &self.inner)
            .field("limiter", &self.settings.limiter)
            .field("max_wait", &self.settings.max_wait)
            .finish_non_exhaustive()
    }
}

/// When a call asked to go, and the latest it may go; what its errors say it waited.
#[derive(Clone, Copy)]
struct Budget {
    asked: Duration,
    deadline: Duration,
}

impl Budget {
    /// Whether a wait of `wait` from now on `clock` ends by the deadline (never overflowing).
    fn fits(&self, clock: &Clock, wait: Duration) -> bool {
        clock
            .now()
            .checked_add(wait)
            .is_some_and(|t| t <= self.deadline)
    }

    /// How much of the budget is left.
    fn left(&self, clock: &Clock) -> Duration {
        self.deadline.saturating_sub(clock.now())
    }

    /// How long the call has waited so far.
    fn waited(&self, clock: &Clock) -> Duration {
        clock.now().saturating_sub(self.asked)
    }
}

/// The call's turn under the configured quota: how long until it may go. Under a GCRA quota,
/// in a store that schedules and out of shadow mode, its place in the key's schedule is kept
/// for it (one store call: callers of every instance go in the order the store sees them, one
/// emission interval per unit apart), or it fails at once when that place is beyond the
/// deadline. Otherwise, and when the store call fails (the check then decides by the failure
/// policy), it waits in [`acquire`] and its turn is now.
async fn configured_turn<A: Algorithm>(
    clock: &Clock,
    limiter: &RateLimiter<A>,
    key: &Key<'_>,
    cost: u32,
    budget: Budget,
) -> Result<Duration, ThrottleError> {
    let engine = &limiter.engine;
    let core = &engine.core;
    let algorithm = &*engine.algorithm;
    if limiter.is_shadow()
        || !core.store.schedules()
        || !matches!(algorithm.rule().kind(), Kind::Gcra(_))
    {
        acquire(clock, limiter, key, cost, budget).await?;
        return Ok(Duration::ZERO);
    }
    let store_key = engine.store_key(Some(key));
    let budget_us = micros(budget.left(clock));
    let started = Instant::now();
    let scheduled = core
        .call(|| {
            core.store
                .schedule(algorithm, store_key, (cost, budget_us), Pace::Steady, None)
        })
        .await;
    let Ok(scheduled) = scheduled else {
        acquire(clock, limiter, key, cost, budget).await?;
        return Ok(Duration::ZERO);
    };
    let d = Decision::from_outcome(
        scheduled.outcome,
        algorithm.quota(),
        algorithm.window(),
        cost,
        Arc::clone(&core.policy),
        algorithm.parts(),
        Source::Store,
    );
    core.decided(d.verdict(), Source::Store, Some(started.elapsed()));
    if d.allowed {
        return Ok(Duration::from_micros(scheduled.wait_us));
    }
    Err(ThrottleError::WouldExceedMaxWait {
        decision: Box::new(d),
        waited: budget.waited(clock),
    })
}

/// Waits until `key` has `cost` units, by the deadline. Under a limiter in shadow mode, never
/// waits nor fails: a denial is counted and logged, a store error logged.
async fn acquire<A: Algorithm>(
    clock: &Clock,
    limiter: &RateLimiter<A>,
    key: &Key<'_>,
    cost: u32,
    budget: Budget,
) -> Result<(), ThrottleError> {
    let shadow = limiter.is_shadow();
    loop {
        let d = match limiter.check(key, cost).await {
            Ok(d) => d,
            Err(e) if shadow => {
                if let Some(left_out) = quiet::may_log(limiter.policy_name(), Cause::StoreFailed) {
                    tracing::warn!(error = %crate::error::ErrorChain(&e), left_out, "rate limit: store failed (shadow mode: not waiting)");
                }
                return Ok(());
            }
            Err(e) => return Err(ThrottleError::Store(e)),
        };
        if d.allowed {
            return Ok(());
        }
        if shadow {
            // Counted and reported by the limiter as a would-be denial.
            return Ok(());
        }
        match d.retry_after {
            Some(wait) if budget.fits(clock, wait) => {
                tracing::debug!(policy = %d.policy, ?wait, "rate limit: waiting for quota");
                clock.sleep(wait).await;
            }
            _ => {
                return Err(ThrottleError::WouldExceedMaxWait {
                    decision: Box::new(d),
                    waited: budget.waited(clock),
                })
            }
        }
    }
}

/// Waits while the upstream said to pause, or while its window of `ledger` has fewer than
/// `cost` units left (taking them when the call may go), by the deadline; how the call goes
/// (blind, or first to learn the next window), and how long until its place in the
/// upstream's pace when the upstream's rate is known (the place is kept for it). While the
/// store fails (logged and counted), the same from what this process learned meanwhile.
async fn upstream_gate<A: Algorithm>(
    clock: &Clock,
    adaptive: &Adaptive,
    limiter: &RateLimiter<A>,
    key: &Key<'_>,
    (ledger, cost): (Ledger, u32),
    budget: Budget,
) -> Result<(Sent, Duration), ThrottleError> {
    let engine = &limiter.engine;
    loop {
        let store_key = engine.store_key(Some(key));
        let call = adaptive
            .store
            .take(store_key, ledger, cost, budget.left(clock));
        let gate = match bounded(adaptive, limiter, "reading", call).await {
            Some(gate) => gate,
            // In memory: answers at once, and cannot fail but for a key it cannot hold.
            None => match adaptive
                .local
                .take(store_key, ledger, cost, budget.left(clock))
                .await
            {
                Ok(gate) => gate,
                Err(_) => return Ok((Sent::Counted, Duration::ZERO)),
            },
        };
        if gate.go {
            return Ok((gate.blind, gate.wait));
        }
        if !budget.fits(clock, gate.wait) {
            return Err(ThrottleError::UpstreamPaused {
                wait: gate.wait,
                waited: budget.waited(clock),
            });
        }
        tracing::debug!(policy = %engine.core.policy, wait = ?gate.wait, "rate limit: waiting for the upstream's limit");
        #[cfg(feature = "metrics")]
        metrics::counter!(crate::core::report::UPSTREAM_WAITS, "policy" => engine.core.policy.to_string())
            .increment(1);
        clock.sleep(gate.wait).await;
    }
}

/// How a call went by each of the upstream's budgets (see [`Sent`]).
#[derive(Clone, Copy)]
struct Ways {
    requests: Sent,
    tokens: Sent,
}

/// Waits for the call's turn, by the deadline: first in its key's line in this process, then
/// for the configured quota (unless the throttle only learns; its place in the quota's
/// schedule kept, see [`configured_turn`]), then for the upstream's requests and its tokens
/// (`tokens`: the call's estimate, 0 for none); leaves the line once its places are kept,
/// and waits for the latest of them.
async fn turn<K, A: Algorithm>(
    settings: &Settings<K, A>,
    key: &Key<'static>,
    (cost, tokens): (u32, u32),
    budget: Budget,
) -> Result<Ways, ThrottleError> {
    let clock = &settings.clock;
    let limiter = &settings.limiter;
    let mut place = settings.lines.join(key);
    if !first_by_deadline(clock, &mut place, budget).await {
        return Err(ThrottleError::InLine {
            waited: budget.waited(clock),
        });
    }
    // When the configured quota's place comes, on this clock.
    let mut slot = clock.now();
    if settings.configured {
        slot += configured_turn(clock, limiter, key, cost, budget).await?;
    }
    let not_told = (Sent::Counted, Duration::ZERO);
    let (requests, until_place) = match &settings.adaptive {
        Some(adaptive) => {
            let ledger = (Ledger::Requests, cost);
            upstream_gate(clock, adaptive, limiter, key, ledger, budget).await?
        }
        None => not_told,
    };
    let slot = slot.max(clock.now() + until_place);
    let (tokens, until_tokens) = match (&settings.adaptive, tokens) {
        (Some(adaptive), 1..) => {
            let ledger = (Ledger::Tokens, tokens);
            upstream_gate(clock, adaptive, limiter, key, ledger, budget).await?
        }
        _ => not_told,
    };
    drop(place);
    let go = slot.max(clock.now() + until_tokens);
    let wait = go.saturating_sub(clock.now());
    if !wait.is_zero() {
        clock.sleep(wait).await;
    }
    Ok(Ways { requests, tokens })
}

/// Waits until `place` is first in its line (true), or until the deadline (false); a place
/// that becomes first as the deadline comes is first.
async fn first_by_deadline(clock: &Clock, place: &mut Place<'_>, budget: Budget) -> bool {
    let mut first = std::pin::pin!(place.first());
    let mut give_up = std::pin::pin!(clock.sleep(budget.left(clock)));
    std::future::poll_fn(|cx| {
        if first.as_mut().poll(cx).is_ready() {
            return Poll::Ready(true);
        }
        give_up.as_mut().poll(cx).map(|()| false)
    })
    .await
}

/// A store call of the adaptive throttle, within the store timeout; `None` when it failed
/// (`doing`: what for, in the log), which is counted and logged: the caller then asks what
/// this process learned while the store failed (`Adaptive::local`).
async fn bounded<A: Algorithm, T>(
    adaptive: &Adaptive,
    limiter: &RateLimiter<A>,
    doing: &str,
    call: BoxFuture<'_, Result<T, crate::error::Error>>,
) -> Option<T> {
    let engine = &limiter.engine;
    let error = match engine.core.call(move || call).await {
        Ok(value) => return Some(value),
        Err(e) => e,
    };
    AdaptiveCounters::add(&adaptive.counters.store_errors, 1);
    tracing::warn!(
        policy = %engine.core.policy,
        error = %ErrorChain(&error),
        "rate limit: {doing} the upstream's learned limit failed; going by what this process learned meanwhile"
    );
    None
}

/// Reads the answer's limits and counts what they said: what to record, and whether it was
/// a 429.
fn observe<A: Algorithm, B>(
    clock: &Clock,
    adaptive: &Adaptive,
    limiter: &RateLimiter<A>,
    max_pause: Duration,
    res: &Response<B>,
) -> (Learned, bool) {
    let engine = &limiter.engine;
    let counters = &adaptive.counters;
    let reading = read_limits(res.status(), res.headers(), clock.system_now(), max_pause);
    AdaptiveCounters::add(&counters.ignored, u64::from(reading.ignored));
    AdaptiveCounters::add(&counters.capped, u64::from(reading.capped));
    if reading.ignored > 0 || reading.capped > 0 {
        tracing::info!(
            policy = %engine.core.policy,
            ignored = reading.ignored,
            capped = reading.capped,
            "rate limit: the upstream sent rate-limit headers that were malformed or beyond the cap"
        );
    }
    let rate_limited = res.status() == http::StatusCode::TOO_MANY_REQUESTS;
    if rate_limited {
        AdaptiveCounters::add(&counters.rate_limited, 1);
    }
    if reading.learned.pause.is_some() {
        AdaptiveCounters::add(&counters.paused, 1);
    } else if reading.learned.remaining == Some(0) {
        AdaptiveCounters::add(&counters.exhausted, 1);
    }
    if !reading.learned.is_empty() {
        AdaptiveCounters::add(&counters.learned, 1);
        tracing::debug!(
            policy = %engine.core.policy,
            remaining = reading.learned.remaining,
            reset = ?reading.learned.reset,
            pause = ?reading.learned.pause,
            window_from = reading.window_from.map(|s| s.as_str()),
            pause_from = reading.pause_from.map(|s| s.as_str()),
            "rate limit: learned from the upstream"
        );
        #[cfg(feature = "metrics")]
        {
            let source = reading
                .pause_from
                .or(reading.window_from)
                .map_or("none", |s| s.as_str());
            metrics::counter!(crate::core::report::UPSTREAM_LEARNED, "policy" => engine.core.policy.to_string(), "source" => source)
                .increment(1);
        }
    }
    (reading.learned, rate_limited)
}

/// Records what an answer said of `ledger`, for every instance sharing the store. The
/// answer to a blind call (which took `cost`) is recorded even when it says nothing: it is
/// no longer on its way, and when it went first to learn a new window, the others stop
/// waiting for it.
async fn record<A: Algorithm>(
    adaptive: &Adaptive,
    limiter: &RateLimiter<A>,
    key: &Key<'_>,
    (ledger, learned): (Ledger, Learned),
    (how, cost): (Sent, u32),
) {
    if learned.is_empty() && how == Sent::Counted {
        return;
    }
    let engine = &limiter.engine;
    let store_key = engine.store_key(Some(key));
    let call = adaptive.store.learn(store_key, ledger, learned, how, cost);
    if bounded(adaptive, limiter, "recording", call)
        .await
        .is_none()
    {
        // For the calls that go by this process' own state while the store fails.
        let _ = adaptive
            .local
            .learn(store_key, ledger, learned, how, cost)
            .await;
    }
}

/// After an answer to a call that took `tokens` of the upstream's token budget: records
/// the budget the answer tells, settles the call to the figure of the budget's header when
/// there is one, and hands the caller the [`TokenUsage`] handle (in the response's
/// extensions) to settle it otherwise.
async fn account_tokens<A: Algorithm, B>(
    (clock, adaptive, limiter): (&Clock, &Adaptive, &RateLimiter<A>),
    (budget, max_pause): (&TokenBudget, Duration),
    key: &Key<'static>,
    (tokens, how): (u32, Sent),
    res: &mut Response<B>,
) {
    let engine = &limiter.engine;
    let counters = &adaptive.counters;
    let now = clock.system_now();
    let reading = read_token_limits(res.headers(), now, budget.window, max_pause);
    AdaptiveCounters::add(&counters.ignored, u64::from(reading.ignored));
    AdaptiveCounters::add(&counters.capped, u64::from(reading.capped));
    if reading.ignored > 0 {
        tracing::info!(policy = %engine.core.policy, ignored = reading.ignored, "rate limit: the upstream sent token-budget headers that were malformed");
    }
    if !reading.learned.is_empty() {
        AdaptiveCounters::add(&counters.learned, 1);
    }
    let learned = (Ledger::Tokens, reading.learned);
    record(adaptive, limiter, key, learned, (how, tokens)).await;
    let usage = TokenUsage::new(adaptive, engine, key, tokens);
    if let Some(used) = budget.figure(res.headers()) {
        if let Err(e) = usage.settle(used).await {
            AdaptiveCounters::add(&counters.store_errors, 1);
            tracing::warn!(policy = %engine.core.policy, error = %ErrorChain(&e), "rate limit: settling a call's tokens failed; its estimate stands");
        }
    }
    res.extensions_mut().insert(usage);
}

/// Whether a method may be sent twice.
fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// A copy of `req` to send again (its extensions included).
fn copy<B: Clone>(req: &Request<B>) -> Request<B> {
    let mut c = Request::new(req.body().clone());
    *c.method_mut() = req.method().clone();
    *c.uri_mut() = req.uri().clone();
    *c.version_mut() = req.version();
    *c.headers_mut() = req.headers().clone();
    *c.extensions_mut() = req.extensions().clone();
    c
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Makes the copy of a request to send again.
type Copier<B> = fn(&Request<B>) -> Request<B>;

/// One throttled call: wait, send, learn; and when `again` makes a copy (retries on), send
/// it again after a 429 when the pause fits the deadline.
async fn run<S, K, A, B, RB>(
    mut inner: S,
    settings: Settings<K, A>,
    req: Request<B>,
    again: Option<Copier<B>>,
) -> Result<Response<RB>, BoxError>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    K: KeyExtractor,
    A: Algorithm,
{
    let (parts, body) = req.into_parts();
    let key = settings.key.extract(&parts).map(Key::into_owned);
    let cost = settings.cost.as_ref().map_or(1, |f| f(&parts));
    let tokens = settings
        .tokens
        .as_ref()
        .map_or(0, |b| b.estimate_of(&parts));
    let mut req = Request::from_parts(parts, body);
    let (Some(key), true) = (key, cost > 0) else {
        return inner.call(req).await.map_err(Into::into);
    };
    let clock = &settings.clock;
    let asked = clock.now();
    let budget = Budget {
        asked,
        deadline: asked.saturating_add(settings.max_wait),
    };
    let limiter = &settings.limiter;
    // The last 429, kept while its copy is sent again: the answer when the copy cannot go.
    let mut last_429: Option<Response<RB>> = None;
    let mut sent = 0;
    loop {
        let how = match (
            turn(&settings, &key, (cost, tokens), budget).await,
            last_429.take(),
        ) {
            (Ok(how), _) => how,
            (Err(_), Some(res)) => return Ok(res),
            (Err(e), None) => return Err(e.into()),
        };
        let copy = again
            .filter(|_| idempotent(req.method()) && sent < MAX_SENDS - 1)
            .map(|f| f(&req));
        std::future::poll_fn(|cx| inner.poll_ready(cx))
            .await
            .map_err(Into::into)?;
        let mut res = inner.call(req).await.map_err(Into::into)?;
        sent += 1;
        let Some(adaptive) = &settings.adaptive else {
            return Ok(res);
        };
        let (learned, rate_limited) = observe(clock, adaptive, limiter, settings.max_pause, &res);
        let requests = (Ledger::Requests, learned);
        record(adaptive, limiter, &key, requests, (how.requests, cost)).await;
        if let (Some(budget), 1..) = (&settings.tokens, tokens) {
            let on = (clock, adaptive, limiter);
            let budget = (&**budget, settings.max_pause);
            account_tokens(on, budget, &key, (tokens, how.tokens), &mut res).await;
        }
        // A 429 that says to come back at once still waits the default pause: the store
        // holds it (read_limits), unless `max_pause` cut it to nothing; then the retry waits
        // it here.
        let pause = at_least_a_moment(learned.pause.unwrap_or_default());
        match copy {
            Some(copy) if rate_limited && budget.fits(clock, pause) => {
                AdaptiveCounters::add(&adaptive.counters.retried, 1);
                tracing::debug!(policy = %limiter.engine.core.policy, ?pause, "rate limit: the upstream answered 429; sending again after the pause");
                if learned.pause.is_none_or(|p| p.is_zero()) {
                    clock.sleep(pause).await;
                }
                last_429 = Some(res);
                req = copy;
            }
            _ => return Ok(res),
        }
    }
}

/// A request is sent at most this many times (once, and again after 429s).
const MAX_SENDS: u32 = 3;

impl<S, K, A, B, RB> Service<Request<B>> for Throttle<S, K, A, NoRetry>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    K: KeyExtractor,
    A: Algorithm,
    B: Send + 'static,
    RB: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(run(inner, self.settings.clone(), req, None))
    }
}

impl<S, K, A, B, RB> Service<Request<B>> for Throttle<S, K, A, RetryIdempotent>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    K: KeyExtractor,
    A: Algorithm,
    B: Clone + Send + 'static,
    RB: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(run(inner, self.settings.clone(), req, Some(copy::<B>)))
    }
}
