//! A request's charge settled after the response: where the real figure comes from (a header
//! of the inner service's response, the handler's [`Usage`] handle), and the charge they share
//! so that it settles once.

use std::{
    fmt,
    sync::{Arc, Mutex, MutexGuard},
};

use http::{HeaderMap, HeaderName, HeaderValue};

use super::engine::RateEngine;
use crate::{
    core::quiet::Cause,
    decision::{Charge, Decision, Settled, Source},
    error::Error,
    extract::Key,
    http::OnTrailers,
    store::BoxFuture,
};

/// Where a layer's settlements come from (see
/// [`RateLimitLayer::settle_from_header`](super::RateLimitLayer::settle_from_header) and
/// [`settle_from_handle`](super::RateLimitLayer::settle_from_handle)).
#[derive(Debug, Clone, Default)]
pub(crate) struct SettleFrom {
    /// The response header that carries the figure.
    pub(crate) header: Option<HeaderName>,
    /// Whether requests carry a [`Usage`] handle for their handler.
    pub(crate) handle: bool,
    /// The trailer of a streamed response body that carries the figure.
    pub(crate) trailer: Option<HeaderName>,
}

impl SettleFrom {
    /// The builder method that asked for settlements first, for the errors of policies added
    /// later.
    pub(crate) fn field(&self) -> &'static str {
        match (&self.header, &self.trailer) {
            (Some(_), _) => "settle_from_header",
            (None, Some(_)) => "settle_from_trailer",
            (None, None) => "settle_from_handle",
        }
    }
}

/// One request's charge until it is settled or given back, shared by the response future and
/// the handler's [`Usage`]: whichever takes the charge first settles it.
pub(crate) struct Held {
    pub(crate) engine: Arc<RateEngine>,
    key: Option<Key<'static>>,
    slot: Mutex<Slot>,
}

/// The charge, once the request is decided.
struct Slot {
    charge: Option<Charge>,
    source: Source,
}

impl Held {
    pub(crate) fn new(engine: &Arc<RateEngine>, key: Option<&Key<'_>>) -> Self {
        Self {
            engine: Arc::clone(engine),
            key: key.map(|k| k.clone().into_owned()),
            slot: Mutex::new(Slot {
                charge: None,
                source: Source::Store,
            }),
        }
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        // A panic elsewhere while the lock was held cannot leave the slot half-written.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `d`'s charge (none for a denial let through in shadow mode).
    pub(crate) fn hold(&self, d: &Decision) {
        let mut slot = self.slot();
        slot.charge = d.charge.clone();
        slot.source = d.source;
    }

    /// Whether the charge is still held (not yet settled nor given back).
    pub(crate) fn is_held(&self) -> bool {
        self.slot().charge.is_some()
    }

    /// Takes the charge, to give it back.
    pub(crate) fn take(&self) -> Option<Charge> {
        self.slot().charge.take()
    }

    /// Settles the charge to `actual` units, through the path of
    /// [`RateLimiter::settle`](super::RateLimiter::settle).
    pub(crate) async fn settle(&self, actual: u64) -> Result<Settled, Error> {
        let taken = {
            let mut slot = self.slot();
            let source = slot.source;
            RateEngine::take_for_settlement(&mut slot.charge, source, actual)?
        };
        let Some((charge, actual)) = taken else {
            return Ok(Settled::NoCharge);
        };
        let key = self.key.as_ref();
        self.engine.settle_taken(key, charge, actual, None).await
    }

    /// Gives the whole charge back (a response that does not count): `Ok(units)` given back.
    pub(crate) async fn refund(&self) -> Result<u64, Error> {
        let Some(charge) = self.take() else {
            return Ok(0);
        };
        let given = self.engine.refund(self.key.as_ref(), &charge, None).await?;
        Ok(if given { u64::from(charge.cost()) } else { 0 })
    }

    /// Logs, at most once a second for this policy, that `name` held a figure that does not
    /// read (`why`); the charge stands.
    pub(crate) fn unreadable(&self, name: &HeaderName, value: Option<&HeaderValue>, why: &str) {
        let Some(left_out) = self.engine.core.quiet.may_log(Cause::UnreadableFigure) else {
            return;
        };
        // The inner service's value, not the client's key: shown, but bounded and escaped.
        let value = value.map_or_else(String::new, |v| {
            let bytes = v.as_bytes();
            let shown = &bytes[..bytes.len().min(32)];
            shown.escape_ascii().to_string()
        });
        tracing::warn!(
            policy = %self.engine.policy(),
            header = %name,
            value,
            why,
            left_out,
            "rate limit: a usage figure that does not read as a whole number; the first charge stands"
        );
    }
}

/// Settles a request's charge from a trailer of its response body, before the trailers go
/// on (see [`RateLimitLayer::settle_from_trailer`](super::RateLimitLayer::settle_from_trailer)).
pub(crate) struct FromTrailer {
    pub(crate) held: Arc<Held>,
    pub(crate) name: HeaderName,
}

impl OnTrailers for FromTrailer {
    fn on_trailers(&mut self, trailers: &HeaderMap) -> Option<BoxFuture<'static, ()>> {
        if !self.held.is_held() {
            return None; // settled or given back already
        }
        let name = &self.name;
        match read_figure(trailers.get_all(name).iter())? {
            Ok(actual) => {
                let held = Arc::clone(&self.held);
                // A store error is logged (quietly) where it happens; the body goes on.
                Some(Box::pin(async move {
                    let _ = held.settle(actual).await;
                }))
            }
            Err(why) => {
                self.held.unreadable(name, trailers.get(name), why);
                None
            }
        }
    }
}

/// Reads the figure of a usage header's values: `None` when the header is missing, else the
/// whole number it holds, or why it does not read. One value of ASCII digits only, at most
/// [`Settled::MAX_ACTUAL`]: no sign, no space, no exponent, no second value.
pub(crate) fn read_figure<'a>(
    mut values: impl Iterator<Item = &'a HeaderValue>,
) -> Option<Result<u64, &'static str>> {
    let value = values.next()?;
    if values.next().is_some() {
        return Some(Err("several values"));
    }
    let bytes = value.as_bytes();
    if bytes.is_empty() {
        return Some(Err("empty"));
    }
    if !bytes.iter().all(u8::is_ascii_digit) {
        return Some(Err("not a whole number"));
    }
    // Digits only: the only way to fail is to overflow.
    let figure = std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&n| n <= Settled::MAX_ACTUAL);
    Some(figure.ok_or("above the largest figure a charge settles to"))
}

/// A request's charge, in the request's extensions for its handler, which settles it to the
/// units the request used once it knows them ([`settle`](Self::settle)): the tokens a model
/// answered with, the bytes a download served. Put there by a layer built with
/// [`RateLimitLayer::settle_from_handle`](super::RateLimitLayer::settle_from_handle).
///
/// - **When**: any time, also after the response has started streaming (the handle outlives
///   the response future); the settlement is one atomic store call, seen by the key's next
///   check on every instance sharing the store.
/// - **Once**: the charge settles once; a second settlement answers
///   [`Settled::NoCharge`] and does nothing. A settlement from a response header
///   ([`settle_from_header`](super::RateLimitLayer::settle_from_header)) and a response that
///   does not count ([`count_if`](super::RateLimitLayer::count_if)) use the same charge:
///   whichever comes first wins, the other finds no charge.
/// - **Dropped** without settling: the first charge (the estimate) stands.
/// - **No charge**: a request the layer passed on without charging it (a bypass, a cost of 0,
///   an allowed key, a store failure let through, a denial let through in shadow mode) carries
///   a handle that settles nothing ([`Settled::NoCharge`]), so a handler can always take it.
///
/// With handles on several layers, the request carries the innermost layer's. Cloning is
/// cheap: clones share the charge.
///
/// ```
/// use axum::{routing::post, Extension, Router};
/// use tower_redis_ratelimit::{rate_limit::Usage, *};
///
/// # fn app() -> Result<(), Box<dyn std::error::Error>> {
/// // 10,000 tokens a minute per API key; each call is admitted on an estimate of 500.
/// let tokens = RateLimiter::new(MemoryStore::new(), Gcra::new(Quota::per_minute(10_000))?)?;
/// let layer = RateLimitLayer::new(tokens, HeaderKey::new("x-api-key")?)
///     .cost(|_| 500)
///     .settle_from_handle()?;
/// let app: Router = Router::new()
///     .route("/v1/completions", post(|Extension(usage): Extension<Usage>| async move {
///         let (answer, tokens_used) = ("...", 1_234); // the model's answer and its usage
///         // Settled before the answer goes out: the key's next request sees it.
///         if let Err(e) = usage.settle(tokens_used).await {
///             tracing::warn!(error = %e, "the estimate stands");
///         }
///         answer
///     }))
///     .layer(layer);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Usage {
    held: Option<Arc<Held>>,
}

impl Usage {
    pub(crate) fn new(held: &Arc<Held>) -> Self {
        Self {
            held: Some(Arc::clone(held)),
        }
    }

    /// A handle that settles nothing: the request holds no charge.
    pub(crate) const fn inert() -> Self {
        Self { held: None }
    }

    /// Settles the request's charge to the `actual` units it used (see
    /// [`RateLimiter::settle`](super::RateLimiter::settle) for what a settlement up or down
    /// does to the key): [`Settled::NoCharge`] when there is nothing to settle (already
    /// settled or given back, or the request was not charged).
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::settle`](super::RateLimiter::settle): [`Error::InvalidInput`] for an
    /// `actual` above [`Settled::MAX_ACTUAL`] (the charge is kept and may still be settled);
    /// the store's errors ([`Error::Timeout`], [`Error::CircuitOpen`], ...), the charge then
    /// used up (the settlement is atomic: it happened whole or not at all).
    pub async fn settle(&self, actual: u64) -> Result<Settled, Error> {
        match &self.held {
            Some(held) => held.settle(actual).await,
            None => Ok(Settled::NoCharge),
        }
    }

    /// The charge still to settle: the first charge (the estimate) until it is settled or
    /// given back, then `None` (as for a request that was not charged).
    pub fn charge(&self) -> Option<Charge> {
        self.held.as_ref().and_then(|h| h.slot().charge.clone())
    }
}

impl fmt::Debug for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No key: it may be a client's identity.
        let policy = self.held.as_ref().map(|h| h.engine.policy());
        f.debug_struct("Usage")
            .field("policy", &policy)
            .field("charge", &self.charge().map(|c| c.cost()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(values: &[&str]) -> Option<Result<u64, &'static str>> {
        let values: Vec<HeaderValue> = values
            .iter()
            .map(|v| HeaderValue::from_str(v).unwrap())
            .collect();
        read_figure(values.iter())
    }

    #[test]
    fn whole_numbers_read_and_nothing_else_does() {
        assert_eq!(read(&[]), None);
        assert_eq!(read(&["0"]), Some(Ok(0)));
        assert_eq!(read(&["0042"]), Some(Ok(42)));
        assert_eq!(read(&["4294967295"]), Some(Ok(Settled::MAX_ACTUAL)));
        for bad in [
            "",
            "-500",
            "+5",
            "abc",
            "1e9",
            "1.5",
            " 7",
            "7 ",
            "0x10",
            "4294967296",
            "18446744073709551616",
            "99999999999999999999",
        ] {
            assert!(matches!(read(&[bad]), Some(Err(_))), "{bad:?} read");
        }
        assert_eq!(read(&["1", "2"]), Some(Err("several values")));
    }
}
