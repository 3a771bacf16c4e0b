//! Reading what an upstream's answer says about its limits: the IETF `RateLimit` fields, the
//! `X-RateLimit-*` family, the fields of model APIs (requests and tokens) and `Retry-After`,
//! with the same care as inbound headers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue, StatusCode};

use super::model::{self, Vendor};
use crate::store::{upstream::Rate, Learned};

/// Which header family an answer's limits were read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderFamily {
    /// `RateLimit: "name";r=R;t=T` (the IETF draft this crate's server side writes).
    Ietf,
    /// `RateLimit-Remaining` and `RateLimit-Reset` (earlier IETF drafts).
    IetfDraft,
    /// `X-RateLimit-Remaining` and `X-RateLimit-Reset` (seconds from now, or a Unix time in
    /// seconds or milliseconds).
    XRateLimit,
    /// `Retry-After` on a 429 or a 503 (seconds, or an HTTP date).
    RetryAfter,
    /// A 429 with no usable `Retry-After`: the default pause.
    Default429,
    /// OpenAI's `x-ratelimit-{limit,remaining,reset}-requests` and `-tokens` (resets as
    /// durations: `6m0s`, `1s`, `20ms`).
    OpenAi,
    /// Anthropic's `anthropic-ratelimit-requests-*`, `-tokens-*`, `-input-tokens-*` and
    /// `-output-tokens-*` (`limit`, `remaining`, `reset` as an RFC 3339 time).
    Anthropic,
}

impl From<Vendor> for HeaderFamily {
    fn from(v: Vendor) -> Self {
        match v {
            Vendor::OpenAi => HeaderFamily::OpenAi,
            Vendor::Anthropic => HeaderFamily::Anthropic,
        }
    }
}

impl HeaderFamily {
    /// A short name for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            HeaderFamily::Ietf => "ratelimit",
            HeaderFamily::IetfDraft => "ratelimit-remaining",
            HeaderFamily::XRateLimit => "x-ratelimit",
            HeaderFamily::RetryAfter => "retry-after",
            HeaderFamily::Default429 => "429",
            HeaderFamily::OpenAi => "openai",
            HeaderFamily::Anthropic => "anthropic",
        }
    }
}

/// What [`read_limits`] made of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reading {
    /// What to record.
    pub learned: Learned,
    /// Where the window (units left, reset) came from, if anywhere.
    pub window_from: Option<HeaderFamily>,
    /// Where the pause came from, if anywhere.
    pub pause_from: Option<HeaderFamily>,
    /// Header values that were malformed or hostile (negative, not a number, out of range)
    /// and were ignored.
    pub ignored: u32,
    /// Values beyond the cap (`max_pause`) that were cut down to it.
    pub capped: u32,
    /// The upstream's stated quota per window (`RateLimit-Policy: "name";q=Q;w=W`): the
    /// policy the `RateLimit` item read names, else the one with the lowest rate.
    pub stated: Option<StatedQuota>,
}

/// A quota per window an upstream states in `RateLimit-Policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatedQuota {
    /// Units per window (`q`).
    pub quota: u64,
    /// The window (`w`, whole seconds).
    pub window: Duration,
}

/// The pause after a 429 that says nothing of when to come back.
pub const DEFAULT_429_PAUSE: Duration = Duration::from_secs(1);

/// Unix times at or above this many seconds are times, not durations (2001-09-09).
const EPOCH_SECONDS: u64 = 1_000_000_000;
/// ... and at or above this many, milliseconds.
const EPOCH_MILLIS: u64 = 1_000_000_000_000;

/// Reads what an upstream's answer (`status`, `headers`) says about its limits, at `now`.
/// Nothing here panics or trusts a value: a malformed, negative or non-numeric value is
/// ignored (and counted in [`Reading::ignored`]); a pause or a reset further away than
/// `max_pause` is cut to it (counted in [`Reading::capped`]), and so is a rate whose one unit
/// takes longer (its window is cut to `max_pause` × its quota).
///
/// The window (units left and when they reset) comes from the first family present, in this
/// order: `RateLimit` (the item with the fewest units left), `RateLimit-Remaining` /
/// `RateLimit-Reset`, `X-RateLimit-Remaining` / `X-RateLimit-Reset`. A reset of
/// 1,000,000,000 or more is a Unix time (in milliseconds from 10^12), otherwise seconds from
/// now. A pause comes from `Retry-After` on a 429 or a 503; a 429 without one pauses for
/// [`DEFAULT_429_PAUSE`], or until the window resets when the answer says none is left. A
/// 429 or 503 that says to come back at once (`Retry-After: 0`, a date in the past, a window
/// of none left that resets now or has reset) pauses for [`DEFAULT_429_PAUSE`] too (cut to
/// `max_pause` when that is shorter).
///
/// The IETF fields (`RateLimit`, `RateLimit-Policy`) are read with an RFC 9651 Structured
/// Field parser, so a policy name like `"a,b"` is one item; a field that does not parse is
/// ignored whole (and counted). [`Reading::stated`] is the stated quota per window. Absolute
/// times (a Unix-time reset, an HTTP date in `Retry-After`) are read against the answer's
/// `Date` when it differs from `now` by more than a second, so an upstream whose clock is
/// off from ours still pauses for its own window.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::{HeaderMap, StatusCode};
/// use tower_redis_ratelimit::throttle::read_limits;
///
/// let mut h = HeaderMap::new();
/// h.insert("x-ratelimit-remaining", "7".parse().unwrap());
/// h.insert("x-ratelimit-reset", "30".parse().unwrap());
/// let r = read_limits(StatusCode::OK, &h, SystemTime::now(), Duration::from_secs(60));
/// assert_eq!(r.learned.remaining, Some(7));
/// assert_eq!(r.learned.reset, Some(Duration::from_secs(30)));
///
/// h.insert("retry-after", "999999999999".parse().unwrap()); // hostile: capped
/// let r = read_limits(StatusCode::TOO_MANY_REQUESTS, &h, SystemTime::now(), Duration::from_secs(60));
/// assert_eq!(r.learned.pause, Some(Duration::from_secs(60)));
/// ```
pub fn read_limits(
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
    max_pause: Duration,
) -> Reading {
    let mut r = Reading {
        learned: Learned::new(),
        window_from: None,
        pause_from: None,
        ignored: 0,
        capped: 0,
        stated: None,
    };
    // Absolute times (Unix resets, HTTP dates) are the upstream's: read them against its
    // `Date` when its clock and ours disagree by more than a second.
    let now = answer_clock(headers, now);
    r.read_window(headers, now, max_pause);
    if let Some(p) = r.stated {
        r.learned = r.learned.rate(Rate::stated(p.quota, p.window));
    }
    // No rate may space calls further apart than a header may pause them.
    if let Some(rate) = r.learned.rate.as_mut().filter(|r| r.quota > 0) {
        let longest = max_pause.saturating_mul(u32::try_from(rate.quota).unwrap_or(u32::MAX));
        if rate.window > longest {
            rate.window = longest;
            r.capped += 1;
        }
    }
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        r.read_pause(status, headers, now, max_pause);
    }
    r
}

/// Reads the token budget a model API's answer tells (see
/// [`TokenBudget`](crate::throttle::TokenBudget)), at `now`: OpenAI's
/// `x-ratelimit-limit-tokens`, `x-ratelimit-remaining-tokens` and `x-ratelimit-reset-tokens`
/// (a duration: `6m0s`, `1s`, `20ms`, `1h2m3.5s`), else Anthropic's
/// `anthropic-ratelimit-tokens-limit`, `-remaining` and `-reset` (an RFC 3339 time), else the
/// tighter of its `input-tokens` and `output-tokens` fields. The limit is tokens per `window`
/// (both vendors state tokens per minute); the reset is cut to `max_pause`. A value that does
/// not read is ignored and counted in [`Reading::ignored`]; nothing here panics. No pause is
/// read (that is [`read_limits`]' part).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderMap;
/// use tower_redis_ratelimit::throttle::{read_token_limits, HeaderFamily, Rate};
///
/// let mut h = HeaderMap::new();
/// h.insert("x-ratelimit-limit-tokens", "150000".parse().unwrap());
/// h.insert("x-ratelimit-remaining-tokens", "149984".parse().unwrap());
/// h.insert("x-ratelimit-reset-tokens", "6ms".parse().unwrap());
/// let minute = Duration::from_secs(60);
/// let r = read_token_limits(&h, SystemTime::now(), minute, minute);
/// assert_eq!(r.learned.remaining, Some(149_984));
/// assert_eq!(r.learned.reset, Some(Duration::from_millis(6)));
/// assert_eq!(r.learned.rate, Some(Rate::stated(150_000, minute)));
/// assert_eq!(r.window_from, Some(HeaderFamily::OpenAi));
///
/// h.insert("x-ratelimit-reset-tokens", "-3h".parse().unwrap()); // hostile: ignored
/// let r = read_token_limits(&h, SystemTime::now(), minute, minute);
/// assert_eq!((r.learned.remaining, r.ignored), (None, 1));
/// ```
pub fn read_token_limits(
    headers: &HeaderMap,
    now: SystemTime,
    window: Duration,
    max_pause: Duration,
) -> Reading {
    let mut r = Reading {
        learned: Learned::new(),
        window_from: None,
        pause_from: None,
        ignored: 0,
        capped: 0,
        stated: None,
    };
    let now = answer_clock(headers, now);
    if let Some((told, vendor)) = model::tokens(headers, now, &mut r.ignored) {
        r.learn_told(told, vendor.into(), max_pause, |quota, _| {
            Rate::stated(quota, window)
        });
    }
    r
}

impl Reading {
    /// The window and the rate the headers tell (the first header family that has them).
    fn read_window(&mut self, headers: &HeaderMap, now: SystemTime, max_pause: Duration) {
        let r = self;
        let (window, name) = match ietf(headers, &mut r.ignored) {
            Some((w, name)) => (Some(w), name),
            None => (None, None),
        };
        r.stated = policies(headers, name.as_deref(), &mut r.ignored);
        let window = window
            .map(|w| (w, HeaderFamily::Ietf))
            .or_else(|| {
                pair(
                    headers,
                    "ratelimit-remaining",
                    "ratelimit-reset",
                    now,
                    &mut r.ignored,
                )
                .map(|w| (w, HeaderFamily::IetfDraft))
            })
            .or_else(|| {
                pair(
                    headers,
                    "x-ratelimit-remaining",
                    "x-ratelimit-reset",
                    now,
                    &mut r.ignored,
                )
                .map(|w| (w, HeaderFamily::XRateLimit))
            });
        if window.is_none() {
            if let Some((told, vendor)) = model::requests(headers, now, &mut r.ignored) {
                r.learn_told(told, vendor.into(), max_pause, |quota, reset| {
                    Rate::inferred(quota, reset.max(Duration::from_secs(1)))
                });
                return;
            }
        }
        if let Some(((remaining, reset), from)) = window {
            let reset = cap(reset, max_pause, &mut r.capped);
            r.learned = r.learned.window(remaining, reset);
            r.window_from = Some(from);
            // A limit beside the count and its reset: a rate over a window at least as long as
            // the reset, in whole seconds rounded down (a Unix-time reset rounded up by the
            // upstream reads up to a second long), at least one.
            let limit = match from {
                HeaderFamily::IetfDraft => Some("ratelimit-limit"),
                HeaderFamily::XRateLimit => Some("x-ratelimit-limit"),
                _ => None,
            };
            let limit = limit
                .and_then(|name| headers.get(name))
                .and_then(|v| header_number(v).or_else(|| bad(&mut r.ignored)))
                .filter(|&q| q > 0);
            if let Some(quota) = limit {
                let window = Duration::from_secs(reset.as_secs());
                r.learned = r
                    .learned
                    .rate(Rate::inferred(quota, window.max(Duration::from_secs(1))));
            }
        }
    }

    /// A budget a model API told: its window, and its rate (`rate` of the limit and the
    /// reset in whole seconds) when it told its limit.
    fn learn_told(
        &mut self,
        told: model::Told,
        from: HeaderFamily,
        max_pause: Duration,
        rate: impl Fn(u64, Duration) -> Rate,
    ) {
        let reset = cap(told.reset, max_pause, &mut self.capped);
        self.learned = self.learned.window(told.remaining, reset);
        self.window_from = Some(from);
        if let Some(quota) = told.limit.filter(|&q| q > 0) {
            let whole = Duration::from_secs(reset.as_secs());
            self.learned = self.learned.rate(rate(quota, whole));
        }
    }

    /// The pause of an answer refusing calls (429 or 503): its `Retry-After`, else for a 429
    /// until the window it tells resets, else the default pause.
    fn read_pause(
        &mut self,
        status: StatusCode,
        headers: &HeaderMap,
        now: SystemTime,
        max_pause: Duration,
    ) {
        let r = self;
        let retry = headers
            .get_all(http::header::RETRY_AFTER)
            .iter()
            .next()
            .and_then(|v| retry_after(v, now, &mut r.ignored));
        let pause = match retry {
            Some(p) => Some((p, HeaderFamily::RetryAfter)),
            None if status == StatusCode::TOO_MANY_REQUESTS => {
                let until_reset = r.learned.reset.filter(|_| r.learned.remaining == Some(0));
                Some((
                    until_reset.unwrap_or(DEFAULT_429_PAUSE),
                    HeaderFamily::Default429,
                ))
            }
            None => None,
        };
        if let Some((p, from)) = pause {
            r.learned.pause = Some(cap(at_least_a_moment(p), max_pause, &mut r.capped));
            r.pause_from = Some(from);
        }
    }
}

/// The pause of an answer that refuses calls: what it said, or [`DEFAULT_429_PAUSE`] when it
/// said to come back at once (`Retry-After: 0`, a date in the past, a window that resets
/// now), so that an upstream refusing every call is not called again at once by every
/// instance. A retry waits the same ([`ThrottleLayer::retry_rate_limited`]).
///
/// [`ThrottleLayer::retry_rate_limited`]: crate::throttle::ThrottleLayer::retry_rate_limited
pub(crate) fn at_least_a_moment(pause: Duration) -> Duration {
    if pause.is_zero() {
        DEFAULT_429_PAUSE
    } else {
        pause
    }
}

fn cap(d: Duration, max: Duration, capped: &mut u32) -> Duration {
    if d > max {
        *capped += 1;
        max
    } else {
        d
    }
}

/// Digits only (no sign, no spaces inside, no fraction), at most 19 of them.
fn number(text: &str) -> Option<u64> {
    let t = text.trim();
    if t.is_empty() || t.len() > 19 || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

fn header_number(v: &HeaderValue) -> Option<u64> {
    number(v.to_str().ok()?)
}

/// A reset value: seconds from now, or a Unix time (seconds, or milliseconds).
fn reset_from(n: u64, now: SystemTime) -> Duration {
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let at = if n >= EPOCH_MILLIS {
        Duration::from_millis(n)
    } else if n >= EPOCH_SECONDS {
        Duration::from_secs(n)
    } else {
        return Duration::from_secs(n);
    };
    at.saturating_sub(since_epoch)
}

/// `remaining` and `reset` headers of one family, both present and valid.
fn pair(
    headers: &HeaderMap,
    remaining: &str,
    reset: &str,
    now: SystemTime,
    ignored: &mut u32,
) -> Option<(u64, Duration)> {
    let (r, t) = (headers.get(remaining), headers.get(reset));
    if r.is_none() && t.is_none() {
        return None;
    }
    let r = r.and_then(|v| header_number(v).or_else(|| bad(ignored)));
    let t = t.and_then(|v| header_number(v).or_else(|| bad(ignored)));
    Some((r?, reset_from(t?, now)))
}

fn bad<T>(ignored: &mut u32) -> Option<T> {
    *ignored += 1;
    None
}

/// The values of a Structured Field list sent on several lines, as one list (RFC 9110
/// combines field lines with commas); `None` when there is none, or when one is not text
/// (counted).
fn sf_list(headers: &HeaderMap, name: &str, ignored: &mut u32) -> Option<sfv::List> {
    let mut text = String::new();
    for value in headers.get_all(name) {
        let Ok(v) = value.to_str() else {
            *ignored += 1;
            return None;
        };
        if !text.is_empty() {
            text.push_str(", ");
        }
        text.push_str(v);
    }
    if text.is_empty() {
        return None;
    }
    match sfv::Parser::new(&text).parse::<sfv::List>() {
        Ok(list) => Some(list),
        Err(_) => bad(ignored),
    }
}

/// An item's parameter as a count: a non-negative sf-integer (absent: `None`; anything else:
/// `Err`).
fn param(item: &sfv::Item, name: &str) -> Result<Option<u64>, ()> {
    match item.params.get(name) {
        None => Ok(None),
        Some(v) => v
            .as_integer()
            .and_then(|i| u64::try_from(i64::from(i)).ok())
            .map(Some)
            .ok_or(()),
    }
}

/// An item's policy name (an sf-string, or a token as some servers send).
fn item_name(item: &sfv::Item) -> Option<String> {
    let b = &item.bare_item;
    b.as_string()
        .map(|s| s.as_str().to_owned())
        .or_else(|| b.as_token().map(|t| t.as_str().to_owned()))
}

/// `RateLimit: "a";r=5;t=30, "b";r=0;t=7`: the item with the fewest units left, and its
/// policy's name.
fn ietf(headers: &HeaderMap, ignored: &mut u32) -> Option<((u64, Duration), Option<String>)> {
    let list = sf_list(headers, "ratelimit", ignored)?;
    let mut best: Option<((u64, Duration), Option<String>)> = None;
    for entry in &list {
        let sfv::ListEntry::Item(item) = entry else {
            *ignored += 1;
            continue;
        };
        match (param(item, "r"), param(item, "t")) {
            (Ok(Some(r)), Ok(Some(t))) => {
                if best.as_ref().is_none_or(|((br, _), _)| r < *br) {
                    best = Some(((r, Duration::from_secs(t)), item_name(item)));
                }
            }
            (Ok(None), Ok(None)) => {}
            _ => *ignored += 1,
        }
    }
    best
}

/// `RateLimit-Policy: "burst";q=100;w=60, "daily";q=1000;w=86400`: the policy named `name`,
/// else the one with the lowest rate. A policy without a window (`w`) says no rate.
fn policies(headers: &HeaderMap, name: Option<&str>, ignored: &mut u32) -> Option<StatedQuota> {
    let list = sf_list(headers, "ratelimit-policy", ignored)?;
    let mut named = None;
    let mut slowest: Option<StatedQuota> = None;
    for entry in &list {
        let sfv::ListEntry::Item(item) = entry else {
            *ignored += 1;
            continue;
        };
        let (Ok(Some(quota)), Ok(w)) = (param(item, "q"), param(item, "w")) else {
            *ignored += 1;
            continue;
        };
        let Some(w) = w.filter(|&w| w > 0) else {
            continue;
        };
        let p = StatedQuota {
            quota,
            window: Duration::from_secs(w),
        };
        if name.is_some() && item_name(item).as_deref() == name {
            named = Some(p);
        }
        // quota / window, compared without dividing.
        let slower = |o: &StatedQuota| {
            u128::from(p.quota) * o.window.as_millis() < u128::from(o.quota) * p.window.as_millis()
        };
        if slowest.as_ref().is_none_or(slower) {
            slowest = Some(p);
        }
    }
    named.or(slowest)
}

/// The time to read an answer's absolute times against: its `Date` when that differs from
/// `now` by more than a second (both in whole seconds), else `now`.
fn answer_clock(headers: &HeaderMap, now: SystemTime) -> SystemTime {
    let Some(date) = headers
        .get(http::header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|t| httpdate::parse_http_date(t.trim()).ok())
    else {
        return now;
    };
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if secs(date).abs_diff(secs(now)) > 1 {
        date
    } else {
        now
    }
}

/// `Retry-After`: seconds, or an HTTP date (a date in the past is no pause). Seconds too many
/// to count (more than 19 digits) are the longest pause, which the caller cuts to its cap.
fn retry_after(v: &HeaderValue, now: SystemTime, ignored: &mut u32) -> Option<Duration> {
    let Ok(text) = v.to_str() else {
        return bad(ignored);
    };
    if let Some(secs) = number(text) {
        return Some(Duration::from_secs(secs));
    }
    let digits = text.trim();
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::MAX);
    }
    match httpdate::parse_http_date(text.trim()) {
        Ok(at) => Some(at.duration_since(now).unwrap_or_default()),
        Err(_) => bad(ignored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(status: u16, pairs: &[(&str, &str)]) -> Reading {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        read_limits(
            StatusCode::from_u16(status).unwrap(),
            &h,
            now,
            Duration::from_secs(60),
        )
    }

    #[test]
    fn each_family() {
        let r = read(200, &[("ratelimit", "\"a\";r=5;t=30, \"b\";r=2;t=7")]);
        assert_eq!(r.learned, Learned::new().window(2, Duration::from_secs(7)));
        assert_eq!(r.window_from, Some(HeaderFamily::Ietf));
        let r = read(
            200,
            &[("ratelimit-remaining", "4"), ("ratelimit-reset", "9")],
        );
        assert_eq!(r.learned, Learned::new().window(4, Duration::from_secs(9)));
        // Unix seconds and milliseconds, and seconds from now.
        let r = read(
            200,
            &[
                ("x-ratelimit-remaining", "3"),
                ("x-ratelimit-reset", "1700000012"),
            ],
        );
        assert_eq!(r.learned.reset, Some(Duration::from_secs(12)));
        let r = read(
            200,
            &[
                ("x-ratelimit-remaining", "3"),
                ("x-ratelimit-reset", "1700000012500"),
            ],
        );
        assert_eq!(r.learned.reset, Some(Duration::from_millis(12_500)));
        let r = read(
            200,
            &[("x-ratelimit-remaining", "3"), ("x-ratelimit-reset", "12")],
        );
        assert_eq!(r.learned.reset, Some(Duration::from_secs(12)));
        // A Unix time in the past: the window is over.
        let r = read(
            200,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1600000000"),
            ],
        );
        assert_eq!(r.learned.reset, Some(Duration::ZERO));
    }

    #[test]
    fn retry_after_seconds_dates_and_the_default() {
        let r = read(429, &[("retry-after", "5")]);
        assert_eq!(
            (r.learned.pause, r.pause_from),
            (Some(Duration::from_secs(5)), Some(HeaderFamily::RetryAfter))
        );
        let r = read(503, &[("retry-after", "Tue, 14 Nov 2023 22:13:40 GMT")]);
        assert_eq!(r.learned.pause, Some(Duration::from_secs(20)));
        let r = read(429, &[]);
        assert_eq!(
            (r.learned.pause, r.pause_from),
            (Some(DEFAULT_429_PAUSE), Some(HeaderFamily::Default429))
        );
        let r = read(
            429,
            &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "8")],
        );
        assert_eq!(r.learned.pause, Some(Duration::from_secs(8)));
        // Not on a 200.
        assert_eq!(read(200, &[("retry-after", "5")]).learned.pause, None);
    }

    #[test]
    fn a_refusal_saying_to_come_back_at_once_pauses_the_default() {
        let past = "Tue, 14 Nov 2023 22:13:00 GMT";
        for (status, pairs) in [
            (429, &[("retry-after", "0")][..]),
            (429, &[("retry-after", past)][..]),
            (503, &[("retry-after", "0")][..]),
            (503, &[("retry-after", past)][..]),
            (429, &[("ratelimit", "\"x\";r=0;t=0")][..]),
            (
                429,
                &[("ratelimit-remaining", "0"), ("ratelimit-reset", "0")][..],
            ),
            (
                429,
                &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "0")][..],
            ),
            (
                429,
                &[
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", "1600000000"),
                ][..],
            ),
        ] {
            let r = read(status, pairs);
            assert_eq!(
                r.learned.pause,
                Some(DEFAULT_429_PAUSE),
                "{status} {pairs:?}"
            );
        }
        // Cut to a shorter cap, as any pause.
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("0"));
        let r = read_limits(
            StatusCode::TOO_MANY_REQUESTS,
            &h,
            SystemTime::now(),
            Duration::from_millis(300),
        );
        assert_eq!(
            (r.learned.pause, r.capped),
            (Some(Duration::from_millis(300)), 1)
        );
        // Not a refusal: a 200 whose window has reset says when units come back, and a 503
        // without `Retry-After` says nothing of the limit.
        let r = read(200, &[("ratelimit", "\"x\";r=0;t=0")]);
        assert_eq!(r.learned, Learned::new().window(0, Duration::ZERO));
        assert_eq!(read(503, &[]).learned.pause, None);
    }

    #[test]
    fn hostile_values_are_ignored_or_capped() {
        for (k, v) in [
            ("x-ratelimit-remaining", "-1"),
            ("x-ratelimit-remaining", "1e9"),
            ("x-ratelimit-remaining", "99999999999999999999999"),
            ("x-ratelimit-remaining", "0x10"),
            ("x-ratelimit-remaining", "3.5"),
        ] {
            let r = read(200, &[(k, v), ("x-ratelimit-reset", "10")]);
            assert_eq!(r.learned.remaining, None, "{v}");
            assert_eq!(r.ignored, 1, "{v}");
        }
        let r = read(429, &[("retry-after", "-5")]);
        assert_eq!(
            (r.ignored, r.pause_from),
            (1, Some(HeaderFamily::Default429))
        );
        // Seconds past what a u64 counts are the longest pause, cut to the cap like 19 digits.
        for digits in [
            "9999999999999999999",
            "99999999999999999999",
            &"9".repeat(300),
        ] {
            let r = read(429, &[("retry-after", digits)]);
            assert_eq!(
                (r.learned.pause, r.capped, r.ignored, r.pause_from),
                (
                    Some(Duration::from_secs(60)),
                    1,
                    0,
                    Some(HeaderFamily::RetryAfter)
                ),
                "{} digits",
                digits.len()
            );
        }
        let r = read(429, &[("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT")]);
        assert_eq!(
            (r.learned.pause, r.capped),
            (Some(Duration::from_secs(60)), 1)
        );
        let r = read(
            200,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "99999999999"),
            ],
        );
        assert_eq!(
            (r.learned.reset, r.capped),
            (Some(Duration::from_secs(60)), 1)
        );
        let r = read(200, &[("ratelimit", "\"a\";r=-3;t=5")]);
        assert_eq!((r.learned.remaining, r.ignored), (None, 1));
    }

    #[test]
    fn the_stated_policy_is_read_with_a_structured_field_parser() {
        let r = read(
            200,
            &[
                (
                    "ratelimit-policy",
                    "\"a,b\";q=40;w=1, \"daily\";q=1000;w=86400",
                ),
                ("ratelimit", "\"a,b\";r=12;t=1"),
            ],
        );
        // The comma inside the name splits nothing.
        assert_eq!(r.ignored, 0);
        let stated = Rate::stated(40, Duration::from_secs(1));
        assert_eq!(
            r.learned,
            Learned::new()
                .window(12, Duration::from_secs(1))
                .rate(stated)
        );
        let per_second = StatedQuota {
            quota: 40,
            window: Duration::from_secs(1),
        };
        assert_eq!(r.stated, Some(per_second));
        // The policy the `RateLimit` item names, else the slowest.
        let r = read(
            200,
            &[
                ("ratelimit-policy", "\"fast\";q=100;w=1"),
                ("ratelimit-policy", "\"hour\";q=3600;w=3600"),
                ("ratelimit", "\"fast\";r=3;t=1"),
            ],
        );
        assert_eq!(r.stated.map(|p| p.quota), Some(100));
        let r = read(
            200,
            &[(
                "ratelimit-policy",
                "\"fast\";q=100;w=1, \"hour\";q=3600;w=3600",
            )],
        );
        assert_eq!(r.stated.map(|p| p.quota), Some(3600));
        // Malformed fields are ignored and counted, never split by hand.
        for bad in [
            "\"a\";q=-1;w=1",
            "\"a\";q=1.5;w=1",
            "\"unterminated;q=1",
            "(\"x\");q=1",
        ] {
            let r = read(200, &[("ratelimit-policy", bad)]);
            assert_eq!((r.stated, r.ignored), (None, 1), "{bad}");
        }
    }

    #[test]
    fn a_rate_is_inferred_from_a_limit_beside_its_reset_and_capped_by_max_pause() {
        let r = read(
            200,
            &[
                ("x-ratelimit-limit", "100"),
                ("x-ratelimit-remaining", "5"),
                ("x-ratelimit-reset", "30"),
            ],
        );
        let inferred = Rate::inferred(100, Duration::from_secs(30));
        assert_eq!(r.learned.rate, Some(inferred));
        // The earlier drafts' fields alike.
        let r = read(
            200,
            &[
                ("ratelimit-limit", "40"),
                ("ratelimit-remaining", "5"),
                ("ratelimit-reset", "1"),
            ],
        );
        assert_eq!(
            r.learned.rate,
            Some(Rate::inferred(40, Duration::from_secs(1)))
        );
        // No limit header, or a malformed one: no rate (the latter counted).
        let r = read(
            200,
            &[("x-ratelimit-remaining", "5"), ("x-ratelimit-reset", "3")],
        );
        assert_eq!((r.learned.rate, r.ignored), (None, 0));
        let r = read(
            200,
            &[
                ("x-ratelimit-limit", "-4"),
                ("x-ratelimit-remaining", "5"),
                ("x-ratelimit-reset", "3"),
            ],
        );
        assert_eq!((r.learned.rate, r.ignored), (None, 1));
        // One call a year: no unit may take longer than max_pause (60 s here).
        let r = read(200, &[("ratelimit-policy", "\"slow\";q=2;w=31536000")]);
        assert_eq!(
            r.learned.rate,
            Some(Rate::stated(2, Duration::from_secs(120)))
        );
        assert_eq!(r.capped, 1);
    }

    #[test]
    fn absolute_resets_are_read_against_the_answers_date_when_the_clocks_disagree() {
        // Our clock reads 1_700_000_000; the upstream's an hour behind.
        let behind = "Tue, 14 Nov 2023 21:13:20 GMT";
        let r = read(
            200,
            &[
                ("date", behind),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1699996402"),
            ],
        );
        assert_eq!(r.learned.reset, Some(Duration::from_secs(2)));
        let r = read(
            429,
            &[
                ("date", behind),
                ("retry-after", "Tue, 14 Nov 2023 21:13:22 GMT"),
            ],
        );
        assert_eq!(r.learned.pause, Some(Duration::from_secs(2)));
        // An hour ahead: its reset is not in our past.
        let r = read(
            200,
            &[
                ("date", "Tue, 14 Nov 2023 23:13:20 GMT"),
                ("ratelimit-remaining", "0"),
                ("ratelimit-reset", "1700003605"),
            ],
        );
        assert_eq!(r.learned.reset, Some(Duration::from_secs(5)));
        // Within a second, and a malformed date: our clock.
        for date in ["Tue, 14 Nov 2023 22:13:21 GMT", "yesterday"] {
            let r = read(
                200,
                &[
                    ("date", date),
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", "1700000004"),
                ],
            );
            assert_eq!(r.learned.reset, Some(Duration::from_secs(4)), "{date}");
        }
    }
}
