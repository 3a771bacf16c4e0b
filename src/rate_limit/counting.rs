//! Which responses spend quota: [`StatusSet`] and the predicate behind
//! [`RateLimitLayer::count_if`](super::RateLimitLayer::count_if).

use std::{fmt, str::FromStr};

use http::{HeaderMap, StatusCode};

use crate::error::ConfigError;

/// Whether a response spends its request's units (see
/// [`RateLimitLayer::count_if`](super::RateLimitLayer::count_if)).
pub(crate) type CountFn = dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync;

/// A set of HTTP status codes, written as codes and classes: `"401,403,5xx"`. For
/// [`RateLimitLayer::count_only`](super::RateLimitLayer::count_only): only responses whose
/// status is in the set spend quota.
///
/// ```
/// use http::StatusCode;
/// use tower_redis_ratelimit::rate_limit::StatusSet;
///
/// let failures: StatusSet = "401,403,5xx".parse()?;
/// assert!(failures.contains(StatusCode::UNAUTHORIZED));
/// assert!(failures.contains(StatusCode::BAD_GATEWAY));
/// assert!(!failures.contains(StatusCode::OK));
/// assert!("401,6xx".parse::<StatusSet>().is_err());
/// # Ok::<(), tower_redis_ratelimit::ConfigError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StatusSet {
    /// Bit `code - 100` for each code from 100 to 599.
    bits: [u64; 8],
}

impl StatusSet {
    /// The empty set.
    pub const fn new() -> Self {
        Self { bits: [0; 8] }
    }

    /// Adds `code`.
    pub fn with(mut self, code: StatusCode) -> Self {
        self.insert(code.as_u16());
        self
    }

    /// Adds every code of a class: `class` 1 to 5 for `1xx` to `5xx`. Other classes add nothing.
    pub fn with_class(mut self, class: u16) -> Self {
        if (1..=5).contains(&class) {
            (class * 100..class * 100 + 100).for_each(|c| self.insert(c));
        }
        self
    }

    fn insert(&mut self, code: u16) {
        if (100..600).contains(&code) {
            let i = usize::from(code - 100);
            self.bits[i / 64] |= 1 << (i % 64);
        }
    }

    /// Whether `status` is in the set.
    pub fn contains(&self, status: StatusCode) -> bool {
        self.has(status.as_u16())
    }

    fn has(&self, code: u16) -> bool {
        if !(100..600).contains(&code) {
            return false;
        }
        let i = usize::from(code - 100);
        self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&b| b == 0)
    }
}

impl Default for StatusSet {
    fn default() -> Self {
        Self::new()
    }
}

/// Parses comma-separated codes (`429`) and classes (`5xx`, case-insensitive); spaces
/// around items are allowed. Anything else, or an empty list, is a [`ConfigError`] naming
/// `count_only`.
impl FromStr for StatusSet {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let bad = |why: String| ConfigError::new("count_only", why);
        let mut set = Self::new();
        for item in s.split(',').map(str::trim) {
            let b = item.as_bytes();
            match b {
                [c @ b'1'..=b'5', x, y]
                    if x.eq_ignore_ascii_case(&b'x') && y.eq_ignore_ascii_case(&b'x') =>
                {
                    set = set.with_class(u16::from(c - b'0'));
                }
                [b'1'..=b'5', b'0'..=b'9', b'0'..=b'9'] => {
                    let code: u16 = item.parse().map_err(|_| bad(format!("{item:?}")))?;
                    set.insert(code);
                }
                _ => {
                    return Err(bad(format!(
                        "{item:?} is not a status code (100-599) or class (1xx-5xx)"
                    )))
                }
            }
        }
        if set.is_empty() {
            return Err(bad("no status codes".to_owned()));
        }
        Ok(set)
    }
}

/// Lists the codes, classes folded: `401,403,5xx`.
impl fmt::Display for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut sep = |f: &mut fmt::Formatter<'_>| {
            let s = if first { "" } else { "," };
            first = false;
            f.write_str(s)
        };
        for class in 1..=5u16 {
            let all = (class * 100..class * 100 + 100).all(|c| self.has(c));
            if all {
                sep(f)?;
                write!(f, "{class}xx")?;
                continue;
            }
            for c in (class * 100..class * 100 + 100).filter(|&c| self.has(c)) {
                sep(f)?;
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StatusSet({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_codes_and_classes() {
        let s: StatusSet = " 401 , 403,5XX".parse().unwrap();
        assert_eq!(s.to_string(), "401,403,5xx");
        for code in [401, 403, 500, 503, 599] {
            assert!(s.contains(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in [200, 400, 404, 429, 499] {
            assert!(!s.contains(StatusCode::from_u16(code).unwrap()), "{code}");
        }
    }

    #[test]
    fn rejects_what_is_not_a_status() {
        for bad in [
            "", ",", "600", "6xx", "099", "40", "4000", "abc", "401,,403", "4x1", "+401",
        ] {
            let e = bad.parse::<StatusSet>().unwrap_err();
            assert_eq!(e.field(), "count_only", "{bad:?}");
        }
    }
}
