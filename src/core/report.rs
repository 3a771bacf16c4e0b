//! Reporting what a limit decides: `tracing` events, span fields and, with the `metrics`
//! feature, metrics (the names and labels are listed in [`telemetry`](crate::telemetry)).

use std::time::Duration;

use super::quiet::{self, Cause};
#[cfg(feature = "metrics")]
use crate::store::KeyBuf;
use crate::{
    decision::{Decision, Source, Verdict},
    error::Error,
    extract::Key,
};

/// Metric names.
pub const DECISIONS: &str = "ratelimit_decisions_total";
/// Metric names.
pub const STORE_ERRORS: &str = "ratelimit_store_errors_total";
/// Metric names.
pub const UPSTREAM_LEARNED: &str = "ratelimit_upstream_learned_total";
/// Metric names.
pub const UPSTREAM_WAITS: &str = "ratelimit_upstream_waits_total";
/// Metric names.
pub const REFUNDS: &str = "ratelimit_refunds_total";
/// Metric names.
pub const STORE_LATENCY: &str = "ratelimit_store_latency_seconds";
/// Metric names.
pub const KEY_DECISIONS: &str = "ratelimit_key_decisions_total";
/// Metric names.
pub const BREAKER_OPEN: &str = "ratelimit_breaker_open";
/// Metric names.
pub const NEAR_LIMIT: &str = "ratelimit_near_limit_total";
/// Metric names.
pub const STORE_RESETS: &str = "ratelimit_store_resets_total";
/// Metric names.
pub const BANS: &str = "ratelimit_bans_total";
/// Metric names.
pub const DELAYED: &str = "ratelimit_delayed_total";
/// Metric names.
pub const WAITING: &str = "ratelimit_waiting";
/// Metric names.
pub const POLICY_CAPACITY: &str = "ratelimit_policy_capacity";
/// Metric names.
pub const POLICY_WINDOW: &str = "ratelimit_policy_window_seconds";
/// Metric names.
pub const POLICY_SHADOW: &str = "ratelimit_policy_shadow";

/// The limit in force for `policy`, in the metrics: the units a rested key holds, the time
/// in which they are restored (`q` and `w` of `RateLimit-Policy`), and shadow mode.
pub(crate) fn policy_in_force(policy: &str, capacity: u64, window: Duration, shadow: bool) {
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!(POLICY_CAPACITY, "policy" => policy.to_owned()).set(capacity as f64);
        metrics::gauge!(POLICY_WINDOW, "policy" => policy.to_owned()).set(window.as_secs_f64());
        metrics::gauge!(POLICY_SHADOW, "policy" => policy.to_owned())
            .set(f64::from(u8::from(shadow)));
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (policy, capacity, window, shadow);
}

/// Describes every metric family of this crate to the installed recorder (`# HELP` in
/// Prometheus' text). Called when a limit is built; describing twice changes nothing.
pub(crate) fn describe() {
    #[cfg(feature = "metrics")]
    {
        use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
        describe_counter!(
            DECISIONS,
            "Rate-limit decisions, by policy, verdict (allowed, denied, would_deny, unavailable) and what answered (store, deny_cache, unit_lease, local, failure_policy)."
        );
        describe_counter!(
            KEY_DECISIONS,
            "Rate-limit decisions of the keys listed with metric_keys, by policy, key and verdict."
        );
        describe_counter!(
            STORE_ERRORS,
            "Store calls that failed, by policy and kind (timeout, redis, other); checks refused by an open circuit breaker are not store calls."
        );
        describe_counter!(
            BANS,
            "Keys banned, by policy and reason (automatic: refused too often, under ban_after; operator: RateLimiter::ban, PUT /bans). Each ban is counted once, by the instance that set it."
        );
        describe_counter!(
            DELAYED,
            "Requests over the limit that waited for their units instead of being refused, by policy and outcome (served: went on at their time; abandoned: went away first, their units given back)."
        );
        describe_gauge!(
            WAITING,
            "Requests waiting for their units on this instance now, by policy."
        );
        describe_counter!(
            REFUNDS,
            "Units given back after the response, by policy and outcome (given, nothing, failed)."
        );
        describe_counter!(
            UPSTREAM_LEARNED,
            "Limits an upstream stated and the outbound throttle learned, by policy and header family."
        );
        describe_counter!(
            UPSTREAM_WAITS,
            "Outbound calls the throttle held back to stay within an upstream's limits, by policy."
        );
        describe_histogram!(
            STORE_LATENCY,
            Unit::Seconds,
            "How long the store took for a check, failed and timed-out calls included, by policy."
        );
        describe_gauge!(
            BREAKER_OPEN,
            "1 while the policy's circuit breaker is open (checks do not call the store), else 0."
        );
        describe_gauge!(
            POLICY_CAPACITY,
            "Units a rested key of the policy holds, in force now (q of RateLimit-Policy)."
        );
        describe_gauge!(
            POLICY_WINDOW,
            Unit::Seconds,
            "Time in which the policy's capacity is restored, in force now (w of RateLimit-Policy)."
        );
        describe_gauge!(
            POLICY_SHADOW,
            "1 while the policy is in shadow mode (decides and reports, never refuses), else 0."
        );
        describe_counter!(
            STORE_RESETS,
            "Stores found to have lost a policy's state (a restart without persistence, a flush), by policy; each instance that notices counts it."
        );
        describe_counter!(
            NEAR_LIMIT,
            "Allowed decisions that left the key at or under 20% of its capacity, by policy."
        );
    }
}

/// A limit's metric handles, looked up in the installed recorder on the limit's first
/// decision and kept: recording a decision then allocates nothing and looks nothing up.
/// Install the recorder before the first request.
#[derive(Default)]
pub(crate) struct Meters {
    #[cfg(feature = "metrics")]
    handles: std::sync::OnceLock<Box<Handles>>,
}

#[cfg(feature = "metrics")]
struct Handles {
    /// Each verdict and source's counter, taken on its first decision: a combination that
    /// never occurs has no series.
    decisions: [[std::sync::OnceLock<metrics::Counter>; Source::ALL.len()]; Verdict::ALL.len()],
    latency: metrics::Histogram,
    near_limit: metrics::Counter,
}

/// The decisions' counter of `policy`, `verdict` and `source`.
#[cfg(feature = "metrics")]
fn decisions(policy: &str, verdict: Verdict, source: Source) -> metrics::Counter {
    metrics::counter!(DECISIONS, "policy" => policy.to_owned(), "decision" => verdict.as_str(), "source" => source.as_str())
}

impl Meters {
    #[cfg(feature = "metrics")]
    fn handles(&self, policy: &str) -> &Handles {
        self.handles.get_or_init(|| {
            Box::new(Handles {
                decisions: Default::default(),
                latency: metrics::histogram!(STORE_LATENCY, "policy" => policy.to_owned()),
                near_limit: metrics::counter!(NEAR_LIMIT, "policy" => policy.to_owned()),
            })
        })
    }

    /// Registers the series of `policy` a dashboard reads before anything happened (at 0):
    /// the decisions that can occur (`expected`), the near-limit counter, the store resets.
    /// The handles themselves are taken on the first decision, from the recorder installed
    /// by then.
    pub(crate) fn register(&self, policy: &str, expected: &[(Verdict, Source)]) {
        #[cfg(feature = "metrics")]
        {
            for &(verdict, source) in expected {
                decisions(policy, verdict, source).increment(0);
            }
            metrics::counter!(NEAR_LIMIT, "policy" => policy.to_owned()).increment(0);
            metrics::counter!(STORE_RESETS, "policy" => policy.to_owned()).increment(0);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (policy, expected);
    }

    /// Counts an allowed decision that left its key at or under a fifth of its capacity.
    pub(crate) fn near_limit(&self, policy: &str) {
        #[cfg(feature = "metrics")]
        self.handles(policy).near_limit.increment(1);
        #[cfg(not(feature = "metrics"))]
        let _ = policy;
    }

    /// Counts one decision of `policy` in the metrics; `latency`: how long the store took,
    /// when it was asked.
    pub(crate) fn decided(
        &self,
        policy: &str,
        verdict: Verdict,
        source: Source,
        latency: Option<Duration>,
    ) {
        #[cfg(feature = "metrics")]
        {
            let h = self.handles(policy);
            h.decisions[verdict.index()][source.index()]
                .get_or_init(|| decisions(policy, verdict, source))
                .increment(1);
            if let Some(latency) = latency {
                h.latency.record(latency.as_secs_f64());
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (policy, verdict, source, latency);
    }

    /// Times a store call of `policy` that failed (a timeout at its duration), beside the
    /// decisions' calls: a slow store shows in the latency however its calls end.
    pub(crate) fn failed_call(&self, policy: &str, took: Duration) {
        #[cfg(feature = "metrics")]
        self.handles(policy).latency.record(took.as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = (policy, took);
    }
}

impl std::fmt::Debug for Meters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Meters")
    }
}

/// Per-key decision counters for the keys a user listed
/// ([`RateLimiterBuilder::metric_keys`](crate::rate_limit::RateLimiterBuilder::metric_keys)):
/// the metric `ratelimit_key_decisions_total{policy, key, decision}`, with handles looked up
/// on each key's first decision.
#[derive(Default)]
pub(crate) struct KeyMeters {
    #[cfg(feature = "metrics")]
    keys: std::collections::HashMap<Box<[u8]>, KeyMeter>,
}

#[cfg(feature = "metrics")]
struct KeyMeter {
    text: String,
    handles: std::sync::OnceLock<[metrics::Counter; Verdict::ALL.len()]>,
}

impl KeyMeters {
    /// Counters for `keys` (their text as the key extractor gives it).
    pub(crate) fn new<'k>(keys: impl IntoIterator<Item = Key<'k>>) -> Self {
        #[cfg(feature = "metrics")]
        {
            let keys = keys
                .into_iter()
                .map(|key| {
                    let mut compact = Vec::new();
                    key.write_compact(KEY_ID_LEN, &mut compact);
                    let meter = KeyMeter {
                        text: key.to_string(),
                        handles: std::sync::OnceLock::new(),
                    };
                    (compact.into_boxed_slice(), meter)
                })
                .collect();
            Self { keys }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = keys.into_iter().count();
            Self {}
        }
    }

    /// Whether no key is listed.
    pub(crate) fn is_empty(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.keys.is_empty();
        #[cfg(not(feature = "metrics"))]
        true
    }

    /// Counts a decision of `key`, when it is listed.
    pub(crate) fn decided(&self, policy: &str, key: Option<&Key<'_>>, verdict: Verdict) {
        #[cfg(feature = "metrics")]
        {
            let Some(key) = key else { return };
            let mut compact = KeyBuf::new();
            key.write_compact(KEY_ID_LEN, &mut compact);
            let Some(meter) = self.keys.get(compact.as_bytes()) else {
                return;
            };
            let handles = meter.handles.get_or_init(|| {
                Verdict::ALL.map(|v| {
                    metrics::counter!(KEY_DECISIONS, "policy" => policy.to_owned(), "key" => meter.text.clone(), "decision" => v.as_str())
                })
            });
            handles[verdict.index()].increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (policy, key, verdict);
    }
}

/// Text keys longer than this are compared by their SHA-1.
#[cfg(feature = "metrics")]
const KEY_ID_LEN: usize = 64;

impl std::fmt::Debug for KeyMeters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyMeters")
    }
}

/// A rate-limit decision, reported: the `tracing` event (`debug`; a would-be denial at
/// `info`), and for a request that does not simply go on, the fields `rate_limit.policy`,
/// `rate_limit.decision`, `rate_limit.source` and `rate_limit.limit` recorded on the current
/// span (the request's span, when it declares them). `latency`: how long the store took.
pub(crate) fn decided(
    d: &Decision,
    key: Option<&Key<'_>>,
    verdict: Verdict,
    latency: Option<Duration>,
    quiet: &quiet::Quiet,
) {
    // No subscriber: no event, no span (what `on_span` checks too), read once.
    if tracing::level_filters::LevelFilter::current() == tracing::level_filters::LevelFilter::OFF {
        return;
    }
    let latency_us = latency.map_or(0, |l| l.as_micros() as u64);
    let limit = d.binding().map_or(&*d.policy, |l| &*l.name);
    match verdict {
        Verdict::WouldDeny => {
            // Each one with its key at `trace` only (a key can be a credential); at `info`, a
            // line every ten seconds per policy with how many there were.
            tracing::trace!(
                policy = %d.policy,
                key = %Logged(key),
                decision = verdict.as_str(),
                source = d.source.as_str(),
                limit,
                cost = d.cost,
                remaining = d.remaining,
                retry_after_ms = d.retry_after.map(|r| r.as_millis() as u64),
                "rate limit: would deny (shadow mode)"
            );
            if let Some(left_out) = quiet.may_log(Cause::WouldDeny) {
                tracing::info!(
                    policy = %d.policy,
                    would_deny = left_out + 1,
                    "rate limit: would deny (shadow mode); counted since the last such line"
                );
            }
        }
        _ if tracing::enabled!(tracing::Level::DEBUG) => tracing::debug!(
            policy = %d.policy,
            decision = verdict.as_str(),
            source = d.source.as_str(),
            limit,
            allowed = d.allowed,
            remaining = d.remaining,
            cost = d.cost,
            latency_us,
            "rate limit: decided"
        ),
        _ => {}
    }
    if verdict != Verdict::Allowed {
        on_span(&d.policy, verdict, d.source, limit);
    }
}

/// A check the store could not decide, answered by the failure policy (`verdict`: let
/// through or refused).
pub(crate) fn undecided(policy: &str, verdict: Verdict) {
    tracing::debug!(
        policy,
        decision = verdict.as_str(),
        source = Source::FailurePolicy.as_str(),
        "rate limit: decided by the failure policy"
    );
    on_span(policy, verdict, Source::FailurePolicy, policy);
}

/// Records a decision on the current span, which keeps the fields it declared.
fn on_span(policy: &str, verdict: Verdict, source: Source, limit: &str) {
    // No subscriber, no span: nothing to look up.
    if tracing::level_filters::LevelFilter::current() == tracing::level_filters::LevelFilter::OFF {
        return;
    }
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    span.record("rate_limit.policy", policy);
    span.record("rate_limit.decision", verdict.as_str());
    span.record("rate_limit.source", source.as_str());
    span.record("rate_limit.limit", limit);
}

/// The store lost `policy`'s state: counted, and logged once with the bans written back
/// (`bans`, of which `failed` could not be).
pub(crate) fn store_reset(policy: &str, bans: usize, failed: usize) {
    tracing::warn!(
        policy,
        bans_written_back = bans - failed,
        bans_not_written_back = failed,
        "rate limit: the store lost this limit's state (restarted empty, or flushed); the bans this instance knows are written back, and every key starts afresh"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!(STORE_RESETS, "policy" => policy.to_owned()).increment(1);
}

/// A ban set (or, in shadow mode, one that would have been): counted under `reason`
/// (`automatic` or `operator`; a would-be ban is not counted), and an automatic one logged
/// once, at `info` with the key's digest (`key_sha1`, the first 16 hex digits of the SHA-1 of
/// its bytes, as the admin audit logs it), its duration and its number (`offence`: 1 for the
/// key's first ban within a day), the key itself at `trace` only.
pub(crate) fn banned(
    policy: &str,
    reason: &'static str,
    key: Option<&Key<'_>>,
    duration: Duration,
    offence: Option<u32>,
    shadow: bool,
) {
    if let (Some(offence), Some(k)) = (offence, key) {
        let digest = sha1_smol::Sha1::from(key_bytes(k)).digest().to_string();
        let key_sha1 = &digest[..16];
        let ban_ms = duration.as_millis() as u64;
        match shadow {
            true => tracing::info!(
                policy,
                key_sha1,
                ban_ms,
                offence,
                "rate limit: would ban the key (shadow mode): refused too often"
            ),
            false => tracing::info!(
                policy,
                key_sha1,
                ban_ms,
                offence,
                "rate limit: key banned: refused too often"
            ),
        }
        tracing::trace!(policy, key = %Logged(key), key_sha1, "rate limit: the key of the ban above");
    }
    #[cfg(feature = "metrics")]
    if !shadow {
        metrics::counter!(BANS, "policy" => policy.to_owned(), "reason" => reason).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// A key's bytes as an operator names it (`/bans/{key}`): text or bytes as they are, an
/// address or a number as written.
fn key_bytes(key: &Key<'_>) -> Vec<u8> {
    use crate::extract::Repr;
    match key.repr() {
        Repr::Text(t) => t.as_bytes().to_vec(),
        Repr::Bytes(b) => b.to_vec(),
        _ => key.to_string().into_bytes(),
    }
}

/// A refusal not counted toward an automatic ban (`why`), logged at most once a second.
pub(crate) fn refusal_not_counted(policy: &str, quiet: &quiet::Quiet, why: &dyn std::fmt::Display) {
    if let Some(left_out) = quiet.may_log(Cause::RefusalNotCounted) {
        tracing::warn!(
            policy,
            not_counted = left_out + 1,
            reason = %why,
            "rate limit: refusals not counted toward automatic bans since the last such line"
        );
    }
}

/// The bans a loss left waiting, written back at a later look.
pub(crate) fn bans_written_back(policy: &str, bans: usize) {
    tracing::info!(
        policy,
        bans_written_back = bans,
        "rate limit: the bans the store lost are written back"
    );
}

/// A check refused by the open circuit breaker: no store call was made, so no store error
/// is counted (the breaker's gauge and the decision's source say it).
pub(crate) fn short_circuited(policy: &str) {
    tracing::trace!(
        policy,
        "rate limit: circuit breaker open; the store was not called"
    );
}

pub(crate) fn store_failed(policy: &str, e: &Error) {
    tracing::debug!(policy, error = %crate::error::ErrorChain(&e), "rate limit: store check failed");
    #[cfg(feature = "metrics")]
    {
        let kind = match e {
            Error::Timeout(_) => "timeout",
            Error::Redis(_) | Error::Pool(_) | Error::Connect(_) => "redis",
            _ => "other",
        };
        metrics::counter!(STORE_ERRORS, "policy" => policy.to_owned(), "kind" => kind).increment(1);
    }
}

/// A refund: `Ok(given)` or the store's error.
pub(crate) fn refunded(policy: &str, cost: u32, result: &Result<bool, Error>) {
    match result {
        Ok(given) => tracing::debug!(policy, cost, given, "rate limit: refund"),
        Err(e) => {
            tracing::warn!(policy, cost, error = %crate::error::ErrorChain(&e), "rate limit: refund failed; the units stay spent")
        }
    }
    #[cfg(feature = "metrics")]
    {
        let outcome = match result {
            Ok(true) => "given",
            Ok(false) => "nothing",
            Err(_) => "failed",
        };
        metrics::counter!(REFUNDS, "policy" => policy.to_owned(), "outcome" => outcome)
            .increment(1);
    }
}

/// A settlement of a charge of `cost` to `actual` units: the result. A failure is logged at
/// most once a second per policy (a store that fails fails every settlement).
pub(crate) fn settled(
    policy: &str,
    quiet: &super::quiet::Quiet,
    (cost, actual): (u32, u32),
    result: &Result<bool, Error>,
) {
    match result {
        Ok(changed) => tracing::debug!(policy, cost, actual, changed, "rate limit: settled"),
        Err(e) => {
            if let Some(left_out) = quiet.may_log(super::quiet::Cause::SettleFailed) {
                tracing::warn!(policy, cost, actual, left_out, error = %crate::error::ErrorChain(&e), "rate limit: settlement failed; the first charge may stand")
            }
        }
    }
}

/// A concurrency limit's acquire: a permit given (`Allowed`) or refused (`Denied`), by the
/// store or the local share.
pub(crate) fn acquired(policy: &str, verdict: Verdict, source: Source) {
    tracing::debug!(
        policy,
        decision = verdict.as_str(),
        source = source.as_str(),
        "concurrency limit: decided"
    );
    if verdict != Verdict::Allowed {
        on_span(policy, verdict, source, policy);
    }
}

/// A key as a log line shows it: quoted and escaped (a client chose it), at most
/// [`LOGGED_KEY_CHARS`] characters, `-` for the quota keyless requests share.
struct Logged<'a>(Option<&'a Key<'a>>);

/// The characters of a key a log line shows; a longer key is cut, with `…` after it.
const LOGGED_KEY_CHARS: usize = 128;

impl std::fmt::Display for Logged<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(key) = self.0 else {
            return f.write_str("-");
        };
        let text = key.to_string();
        match text.char_indices().nth(LOGGED_KEY_CHARS) {
            Some((cut, _)) => write!(f, "{:?}…", &text[..cut]),
            None => write!(f, "{text:?}"),
        }
    }
}
