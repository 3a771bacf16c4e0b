//! Rate-limit response headers.
//!
//! The default, [`HeaderStyle::Ietf`], follows draft-ietf-httpapi-ratelimit-headers-10:
//!
//! ```text
//! RateLimit-Policy: "default";q=100;w=60
//! RateLimit: "default";r=42;t=18
//! ```
//!
//! `q` is the quota (units a fully rested key has), `w` the seconds in which the whole quota is
//! restored, `r` the units left, and `t` the seconds until the quota is full again (on an
//! allowed response) or until the denied request can succeed (on a 429, equal to
//! `Retry-After`). Seconds are rounded up. A request whose cost can never fit gets no `t` and
//! no `Retry-After`.

use http::{header::RETRY_AFTER, HeaderMap, HeaderName, HeaderValue};
use std::time::Duration;

use crate::{decision::Decision, extract::Out, store::KeyBuf};

/// `RateLimit-Policy` (IETF draft).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF draft).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit` (legacy).
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining` (legacy).
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset` (legacy; seconds from now, not a timestamp).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Which rate-limit headers responses carry. `Retry-After` is always sent on a 429 that can
/// be retried, whatever the style.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (IETF draft 10). The default.
    #[default]
    Ietf,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (seconds from now).
    Legacy,
    /// Both of the above.
    Both,
    /// No rate-limit headers (only `Retry-After` on a 429).
    None,
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Seconds in `t` and `X-RateLimit-Reset`: until the quota is full again when allowed, until
/// the request can succeed when denied, nothing when it never can.
pub(crate) fn reset_secs(d: &Decision) -> Option<u64> {
    if d.allowed {
        Some(ceil_secs(d.reset_after))
    } else {
        d.retry_after.map(ceil_secs)
    }
}

/// `Retry-After` seconds for a denied decision: at least 1, never earlier than `t`.
pub fn retry_after_secs(d: &Decision) -> Option<u64> {
    if d.allowed {
        return None;
    }
    d.retry_after.map(|r| ceil_secs(r).max(1))
}

/// Appends the policy name as a Structured Field string: `"` and `\` escaped, anything outside
/// visible ASCII and space replaced by `_` (limiter-built names never contain either).
pub(crate) fn push_sf_string(out: &mut impl Out, name: &str) {
    out.put(b"\"");
    // Runs of plain characters are copied at once: names are nearly always plain.
    let mut plain = 0;
    for (i, c) in name.char_indices() {
        if matches!(c, ' '..='~') && c != '"' && c != '\\' {
            continue;
        }
        out.put(&name.as_bytes()[plain..i]);
        match c {
            '"' | '\\' => out.put(&[b'\\', c as u8]),
            _ => out.put(b"_"),
        }
        plain = i + c.len_utf8();
    }
    out.put(&name.as_bytes()[plain..]);
    out.put(b"\"");
}

/// Appends `n` in decimal (without `format!`: headers are rendered on every response).
fn push_u64(out: &mut impl Out, n: u64) {
    let mut digits = [0u8; 20];
    let len = write_u64(&mut digits, n);
    out.put(&digits[..len]);
}

/// Writes `n` in decimal at the start of `out` (at least 20 bytes long); returns its length.
/// Two digits at a time, from a table: numbers are written on every response.
pub(crate) fn write_u64(out: &mut [u8], mut n: u64) -> usize {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        digits[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        i -= 2;
        digits[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        digits[i] = b'0' + n as u8;
    }
    let len = digits.len() - i;
    out[..len].copy_from_slice(&digits[i..]);
    len
}

/// Appends `;pk=:PK:` (an sf-binary) when there is a partition key.
fn push_pk(out: &mut impl Out, pk: Option<&str>) {
    if let Some(pk) = pk {
        out.put(b";pk=:");
        out.put(pk.as_bytes());
        out.put(b":");
    }
}

/// A `RateLimit-Policy` list member: `"name";q=LIMIT;w=WINDOW[;pk=:PK:]`.
pub(crate) fn policy_item(
    name: &str,
    limit: u64,
    window: Duration,
    pk: Option<&str>,
) -> HeaderValue {
    let mut out = KeyBuf::new();
    push_sf_string(&mut out, name);
    out.put(b";q=");
    push_u64(&mut out, limit);
    out.put(b";w=");
    push_u64(&mut out, ceil_secs(window).max(1));
    push_pk(&mut out, pk);
    value(out.as_bytes())
}

/// A `RateLimit` list member: `"name";r=REMAINING[;t=T][;pk=:PK:]`.
pub(crate) fn state_item(
    name: &str,
    remaining: u64,
    t: Option<u64>,
    pk: Option<&str>,
) -> HeaderValue {
    let mut out = KeyBuf::new();
    push_sf_string(&mut out, name);
    out.put(b";r=");
    push_u64(&mut out, remaining);
    if let Some(t) = t {
        out.put(b";t=");
        push_u64(&mut out, t);
    }
    push_pk(&mut out, pk);
    value(out.as_bytes())
}

/// The partition key when it can be written as an sf-binary (only base64 characters are ever
/// stored there).
pub(crate) fn valid_pk(pk: Option<&str>) -> Option<&str> {
    pk.filter(|pk| {
        pk.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
    })
}

/// The `pk` value for `key` (its compact bytes): base64 of the first 12 bytes of
/// SHA-1(secret, 0, key). Stable across instances sharing the secret; without the secret,
/// low-entropy keys such as IP addresses cannot be recovered by trying them all.
pub(crate) fn partition_key(secret: &[u8], key: &[u8]) -> String {
    use base64::Engine as _;
    let mut h = sha1_smol::Sha1::new();
    h.update(secret);
    h.update(&[0]);
    h.update(key);
    base64::engine::general_purpose::STANDARD.encode(&h.digest().bytes()[..12])
}

pub(crate) fn value(bytes: &[u8]) -> HeaderValue {
    // Only digits, ASCII letters and sf punctuation are ever formatted here. Copied once into
    // an exactly sized buffer: a `String` with spare capacity would take a second allocation
    // to become shared bytes.
    HeaderValue::from_bytes(bytes).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

/// Renders `d` into `headers` in `style`; adds `Retry-After` when `d` is a retryable denial.
///
/// IETF fields are appended (several limiters on one route give several list members);
/// legacy fields and `Retry-After` replace earlier values.
///
/// ```
/// use tower_redis_ratelimit::{Gcra, MemoryStore, Quota, RateLimiter, rate_limit::headers::render, rate_limit::HeaderStyle};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RateLimiter::builder(MemoryStore::new(), Gcra::new(Quota::per_minute(100))?)
///     .policy_name("api")
///     .build()?;
/// let d = limiter.check("user-1", 58).await?;
/// let mut h = http::HeaderMap::new();
/// render(HeaderStyle::Ietf, &d, &mut h);
/// assert_eq!(h["ratelimit-policy"], r#""api";q=100;w=60"#);
/// assert_eq!(h["ratelimit"], r#""api";r=42;t=35"#);
/// # Ok(()) }
/// ```
pub fn render(style: HeaderStyle, d: &Decision, headers: &mut HeaderMap) {
    render_with(style, d, None, headers);
}

/// [`render`], with the IETF `pk` parameter (base64, the content of an sf-binary) when given.
pub(crate) fn render_with(
    style: HeaderStyle,
    d: &Decision,
    pk: Option<&str>,
    headers: &mut HeaderMap,
) {
    let t = reset_secs(d);
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
        render_ietf(d, pk, t, headers);
    }
    render_legacy(style, d, t, headers);
}

/// The IETF fields of [`render_with`]; `t`: [`reset_secs`] of `d`.
fn render_ietf(d: &Decision, pk: Option<&str>, t: Option<u64>, headers: &mut HeaderMap) {
    let pk = valid_pk(pk);
    let mut item = |name: &str, limit: u64, window: Duration, remaining: u64, t| {
        headers.append(RATELIMIT_POLICY, policy_item(name, limit, window, pk));
        headers.append(RATELIMIT, state_item(name, remaining, t, pk));
    };
    if d.limits.is_empty() {
        item(&d.policy, d.capacity, d.window, d.remaining, t);
    } else {
        // Several limits: one list member each, named after the limit.
        for l in &d.limits {
            let t = match l.retry_after {
                Some(wait) if !wait.is_zero() => Some(ceil_secs(wait)),
                None if !d.allowed => None,
                _ => Some(ceil_secs(l.reset_after)),
            };
            item(&l.name, l.capacity, l.window, l.remaining, t);
        }
    }
}

/// What [`render_with`] writes after the IETF fields: the legacy fields in `style`, and
/// `Retry-After` when `d` is a retryable denial; `t`: [`reset_secs`] of `d`.
pub(crate) fn render_legacy(
    style: HeaderStyle,
    d: &Decision,
    t: Option<u64>,
    headers: &mut HeaderMap,
) {
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        headers.insert(X_RATELIMIT_LIMIT, number(d.capacity));
        headers.insert(X_RATELIMIT_REMAINING, number(d.remaining));
        if let Some(t) = t {
            headers.insert(X_RATELIMIT_RESET, number(t));
        }
    }
    if let Some(secs) = retry_after_secs(d) {
        headers.insert(RETRY_AFTER, number(secs));
    }
}

/// `n` in decimal as a header value (what `HeaderValue::from(n)` makes): below 100 a static
/// value, without an allocation (seconds to wait, small quotas and counts).
pub(crate) fn number(n: u64) -> HeaderValue {
    const SMALL: [&str; 100] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
        "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31",
        "32", "33", "34", "35", "36", "37", "38", "39", "40", "41", "42", "43", "44", "45", "46",
        "47", "48", "49", "50", "51", "52", "53", "54", "55", "56", "57", "58", "59", "60", "61",
        "62", "63", "64", "65", "66", "67", "68", "69", "70", "71", "72", "73", "74", "75", "76",
        "77", "78", "79", "80", "81", "82", "83", "84", "85", "86", "87", "88", "89", "90", "91",
        "92", "93", "94", "95", "96", "97", "98", "99",
    ];
    match usize::try_from(n).ok().and_then(|i| SMALL.get(i)) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(n),
    }
}

/// Renders a concurrency limit's state into `headers` in `style`: the IETF fields with the
/// quota unit `concurrent-requests` and no window (`RateLimit-Policy: "name";q=N;qu="concurrent-requests"`,
/// `RateLimit: "name";r=FREE`), or the legacy limit and remaining. Never a reset time nor
/// `Retry-After`: when a slot frees depends on requests in flight, which nothing can predict.
pub(crate) fn render_concurrency(
    style: HeaderStyle,
    policy: &str,
    limit: u32,
    free: u64,
    headers: &mut HeaderMap,
) {
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
        let mut item = KeyBuf::new();
        push_sf_string(&mut item, policy);
        item.put(b";q=");
        push_u64(&mut item, u64::from(limit));
        item.put(b";qu=\"concurrent-requests\"");
        headers.append(RATELIMIT_POLICY, value(item.as_bytes()));
        headers.append(RATELIMIT, state_item(policy, free, None, None));
    }
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(limit));
        headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(free));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn decimal_digits() {
        for n in [0, 7, 10, 99, 1_000_000_007, u64::MAX] {
            let mut s = b"x".to_vec();
            push_u64(&mut s, n);
            assert_eq!(s, format!("x{n}").into_bytes());
        }
        for (name, sf) in [
            ("a\"b\\c\u{e9}", r#""a\"b\\c_""#),
            ("plain name", r#""plain name""#),
            ("\u{e9}\u{1F600}x\"", r#""__x\"""#),
            ("", r#""""#),
        ] {
            let mut s = Vec::new();
            push_sf_string(&mut s, name);
            assert_eq!(String::from_utf8(s).unwrap(), sf);
        }
    }

    /// Numbers below 100 as static values, the rest as `HeaderValue::from` makes them: the
    /// same values, none marked sensitive.
    #[test]
    fn small_numbers_are_the_values_of_their_digits() {
        for n in (0..1_000).chain([u64::MAX]) {
            let v = number(n);
            assert_eq!(v, HeaderValue::from(n));
            assert!(!v.is_sensitive());
        }
    }

    /// Two digits at a time: every length, every pair, the edges of each power of ten.
    #[test]
    fn decimal_digits_of_every_length() {
        let tens = (1..20).flat_map(|e| {
            let p = 10u64.pow(e);
            [p - 1, p, p + 1]
        });
        let some = [1_000_000_007, u64::MAX - 1, u64::MAX].into_iter();
        for n in (0..10_000).chain(tens).chain(some) {
            let mut s = b"x".to_vec();
            push_u64(&mut s, n);
            assert_eq!(s, format!("x{n}").into_bytes());
        }
    }

    fn decision(allowed: bool, retry_ms: Option<u64>) -> Decision {
        Decision {
            allowed,
            capacity: 10,
            remaining: 0,
            reset_after: Duration::from_millis(2_500),
            retry_after: retry_ms.map(Duration::from_millis),
            window: Duration::from_millis(250),
            cost: 1,
            policy: Arc::from("p"),
            ..Decision::sample()
        }
    }

    fn rendered(style: HeaderStyle, d: &Decision) -> Vec<(String, String)> {
        rendered_pk(style, d, None)
    }

    fn rendered_pk(style: HeaderStyle, d: &Decision, pk: Option<&str>) -> Vec<(String, String)> {
        let mut h = HeaderMap::new();
        render_with(style, d, pk, &mut h);
        let mut v: Vec<_> = h
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        v.sort();
        v
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn allowed_ietf_rounds_up_and_has_no_retry_after() {
        assert_eq!(
            rendered(HeaderStyle::Ietf, &decision(true, None)),
            pairs(&[
                ("ratelimit", "\"p\";r=0;t=3"),
                ("ratelimit-policy", "\"p\";q=10;w=1")
            ])
        );
    }

    #[test]
    fn denied_retry_after_matches_t_and_is_at_least_one() {
        let d = decision(false, Some(1));
        assert_eq!(
            rendered(HeaderStyle::Both, &d),
            pairs(&[
                ("ratelimit", "\"p\";r=0;t=1"),
                ("ratelimit-policy", "\"p\";q=10;w=1"),
                ("retry-after", "1"),
                ("x-ratelimit-limit", "10"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1"),
            ])
        );
        let d = decision(false, Some(4_001));
        assert_eq!(
            rendered(HeaderStyle::None, &d),
            pairs(&[("retry-after", "5")])
        );
    }

    #[test]
    fn partition_key_is_an_sf_binary_on_both_fields() {
        let d = decision(true, None);
        assert_eq!(
            rendered_pk(HeaderStyle::Ietf, &d, Some("q83vEjRWeJA=")),
            pairs(&[
                ("ratelimit", "\"p\";r=0;t=3;pk=:q83vEjRWeJA=:"),
                ("ratelimit-policy", "\"p\";q=10;w=1;pk=:q83vEjRWeJA=:")
            ])
        );
        assert!(!rendered_pk(HeaderStyle::Ietf, &d, Some("not base64!"))[0]
            .1
            .contains("pk="));
    }

    #[test]
    fn hand_built_policy_names_are_escaped() {
        let mut d = decision(true, None);
        d.policy = Arc::from("a\"b\\c\u{e9}");
        let mut h = HeaderMap::new();
        render(HeaderStyle::Ietf, &d, &mut h);
        assert_eq!(h["ratelimit"], r#""a\"b\\c_";r=0;t=3"#);
    }

    #[test]
    fn never_has_no_t_and_no_retry_after() {
        let d = decision(false, None);
        assert_eq!(
            rendered(HeaderStyle::Both, &d),
            pairs(&[
                ("ratelimit", "\"p\";r=0"),
                ("ratelimit-policy", "\"p\";q=10;w=1"),
                ("x-ratelimit-limit", "10"),
                ("x-ratelimit-remaining", "0"),
            ])
        );
    }

    #[test]
    fn concurrency_fields_have_a_unit_and_no_window_nor_reset() {
        let mut h = HeaderMap::new();
        render_concurrency(HeaderStyle::Both, "exports", 4, 1, &mut h);
        let mut v: Vec<_> = h
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        v.sort();
        assert_eq!(
            v,
            pairs(&[
                ("ratelimit", "\"exports\";r=1"),
                (
                    "ratelimit-policy",
                    "\"exports\";q=4;qu=\"concurrent-requests\""
                ),
                ("x-ratelimit-limit", "4"),
                ("x-ratelimit-remaining", "1"),
            ])
        );
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

    #[test]
    fn rendered_headers_are_well_formed(
        allowed in any::<bool>(),
        limit in any::<u64>(),
        remaining in any::<u64>(),
        reset_us in any::<u64>(),
        retry_us in prop::option::of(any::<u64>()),
        window_us in any::<u64>(),
        policy in "[ -~]{0,20}",
    ) {
        let d = Decision {
            allowed, capacity: limit, remaining, cost: 1,
            reset_after: Duration::from_micros(reset_us),
            retry_after: retry_us.map(Duration::from_micros),
            window: Duration::from_micros(window_us),
            policy: Arc::from(policy.as_str()),
            ..Decision::sample()
        };
        let mut h = HeaderMap::new();
        render(HeaderStyle::Both, &d, &mut h);
        for (name, value) in &h {
            let text = value.to_str().expect("visible ASCII only");
            prop_assert!(!text.is_empty(), "{name} is empty");
            prop_assert_ne!(text, "invalid");
        }
        let item = h["ratelimit"].to_str().unwrap();
        prop_assert!(item.starts_with('"'));
        // A quoted name (with `\\` escapes), then `;key=integer` parameters.
        let bytes = item.as_bytes();
        let mut i = 1;
        let close = loop {
            match bytes[i] {
                b'\\' => i += 2,
                b'"' => break i,
                _ => i += 1,
            }
        };
        for param in item[close + 1..].split(';').skip(1) {
            let (k, v) = param.split_once('=').expect("key=value");
            prop_assert!(k == "r" || k == "t", "{}", k);
            prop_assert!(v.parse::<u64>().is_ok(), "{}", v);
        }
        if let Some(retry) = h.get("retry-after") {
            let retry: u64 = retry.to_str().unwrap().parse().unwrap();
            prop_assert!(retry >= 1);
        }
    }
    }
}
