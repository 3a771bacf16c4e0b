//! Limits from a TOML file (the `config` feature), for [live limits](crate::RateLimitLayer::live):
//! read whole, checked whole, and only then put in force, so that a file half written or
//! wrong is refused and the limits in force stay.
//!
//! ```toml
//! algorithm = "sliding-window"   # gcra (default), token-bucket, sliding-window
//! limit = 100                    # per `per`
//! per = "1m"                     # ms, s, m, h, d
//! burst = 100                    # buckets only; default: the limit
//! shadow = false
//! allow = ["monitoring", "10.0.0.0/8"]
//! deny = ["abuser", "203.0.113.0/24"]
//!
//! [plans]                        # a quota per key: N/PERIOD
//! gold = "1000/1m"
//! ```
//!
//! ```
//! use tower_redis_ratelimit::{rate_limit::file::LimitsFile, Quota};
//!
//! let file = LimitsFile::from_toml("limit = 5\nper = \"1m\"\n[plans]\ngold = \"50/1m\"\n")?;
//! let limits = file.limits(Quota::per_second(10))?;
//! assert_eq!(limits.quota(), Quota::per_minute(5));
//!
//! let file = LimitsFile::from_toml("limit = 5\nper = \"soon\"\n")?;
//! let err = file.limits(Quota::per_second(10)).unwrap_err();
//! assert_eq!((err.line(), err.field()), (Some(2), Some("per")));
//! let err = LimitsFile::from_toml("limit = 5\nburst = \"x\"\n").unwrap_err();
//! assert_eq!((err.line(), err.field()), (Some(2), Some("burst")));
//! # Ok::<(), tower_redis_ratelimit::rate_limit::file::FileError>(())
//! ```

use std::{collections::BTreeMap, fmt, time::Duration};

use serde::{de::DeserializeOwned, Deserialize};

use super::{AccessList, Limits};
use crate::quota::Quota;

/// What is wrong with a file: the line and the field when known, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    line: Option<usize>,
    field: Option<String>,
    message: String,
}

impl FileError {
    /// An error about `field` of `text` (its line found in `text`).
    pub fn field_error(text: &str, field: &str, message: impl Into<String>) -> Self {
        Self {
            line: line_of(text, field),
            field: Some(field.to_owned()),
            message: message.into(),
        }
    }

    /// The line (from 1), when known.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The field, when known.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// Why.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}, ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "field `{field}`: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for FileError {}

/// Reads `text` as TOML into `T`, whole: a syntax error, a value of the wrong type or an
/// unknown key is a [`FileError`] naming its line and, when it can tell, its field. For files
/// with keys of your own beside the limits'.
pub fn from_toml<T: DeserializeOwned>(text: &str) -> Result<T, FileError> {
    toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        // The key on that line, or the unknown key the message names.
        let field = unknown_field(e.message()).or_else(|| {
            let line = text.lines().nth(line? - 1)?;
            let (key, _) = line.split_once('=')?;
            let key = key.trim().trim_matches('"');
            (!key.is_empty() && !key.starts_with('[')).then(|| key.to_owned())
        });
        FileError {
            line,
            field,
            message: e.message().trim().to_owned(),
        }
    })
}

/// The key serde names in "unknown field `x`, expected ...".
fn unknown_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(rest[..rest.find('`')?].to_owned())
}

/// The line of `text` where `field` is set (`field = ...`), or its table (`[field]`).
fn line_of(text: &str, field: &str) -> Option<usize> {
    let (table, key) = match field.split_once('.') {
        Some((table, key)) => (Some(table), key),
        None => (None, field),
    };
    let mut in_table = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_table = Some(name.trim().to_owned());
            if table.is_none() && name.trim() == key {
                return Some(i + 1);
            }
            continue;
        }
        let Some((k, _)) = line.split_once('=') else {
            continue;
        };
        if in_table.as_deref() == table && k.trim().trim_matches('"') == key {
            return Some(i + 1);
        }
    }
    None
}

/// The limits' keys of a file (see the [module docs](self)); any other key is an error.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LimitsFile {
    /// `gcra`, `token-bucket` or `sliding-window`: what the limiter must run. A live layer
    /// cannot change its algorithm: compare it with yours.
    pub algorithm: Option<String>,
    /// Requests per `per`.
    pub limit: Option<u32>,
    /// The period: a whole number and a unit, `ms`, `s`, `m`, `h` or `d` (`"1m"`).
    pub per: Option<String>,
    /// The buckets' capacity, when not the limit.
    pub burst: Option<u32>,
    /// A quota per key, `N/PERIOD` (`"100/1m"`).
    #[serde(default)]
    pub plans: BTreeMap<String, String>,
    /// Shadow mode.
    pub shadow: Option<bool>,
    /// Keys, addresses and CIDRs never limited.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Keys, addresses and CIDRs always refused.
    #[serde(default)]
    pub deny: Vec<String>,
    /// The file's text, for the lines of the errors found after reading.
    #[serde(skip)]
    text: String,
}

impl LimitsFile {
    /// Reads a file's text (see [`from_toml`]).
    pub fn from_toml(text: &str) -> Result<Self, FileError> {
        let mut file: Self = from_toml(text)?;
        file.text = text.to_owned();
        if let Some(a) = &file.algorithm {
            if !["gcra", "token-bucket", "sliding-window"].contains(&a.as_str()) {
                return Err(FileError::field_error(
                    text,
                    "algorithm",
                    format!("{a:?} is not gcra, token-bucket or sliding-window"),
                ));
            }
        }
        Ok(file)
    }

    /// The limits the file sets; `defaults` gives the limit and the period the file leaves
    /// out. Every value is checked here (a period, a plan, a list entry), each error naming
    /// its line and field; whether the quotas build the limiter's algorithm is checked when
    /// they are put in force ([`LiveLimits::replace`](crate::rate_limit::LiveLimits::replace)).
    pub fn limits(&self, defaults: Quota) -> Result<Limits, FileError> {
        let text = &self.text;
        let per = match &self.per {
            Some(per) => parse_duration(per).ok_or_else(|| {
                FileError::field_error(
                    text,
                    "per",
                    format!("{per:?} is not a period like 1s, 1m, 1h"),
                )
            })?,
            None => defaults.period(),
        };
        let mut quota = Quota::new(self.limit.unwrap_or(defaults.limit()), per);
        if let Some(burst) = self.burst {
            quota = quota.burst(burst);
        }
        let mut limits = Limits::new(quota).shadow(self.shadow.unwrap_or(false));
        for (key, plan) in &self.plans {
            let quota = parse_quota(plan).ok_or_else(|| {
                FileError::field_error(
                    text,
                    &format!("plans.{key}"),
                    format!("{plan:?} is not N/PERIOD, e.g. \"100/1m\""),
                )
            })?;
            limits = limits.plan(key, quota);
        }
        let list = |field: &str, entries: &[String]| {
            AccessList::parse(entries)
                .map_err(|e| FileError::field_error(text, field, e.to_string()))
        };
        Ok(limits
            .allow(list("allow", &self.allow)?)
            .deny(list("deny", &self.deny)?))
    }
}

/// A period: a whole number and a unit, `ms`, `s` (or none), `m`, `h`, `d`.
///
/// ```
/// # use std::time::Duration;
/// use tower_redis_ratelimit::rate_limit::file::parse_duration;
/// assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
/// assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
/// assert_eq!(parse_duration("soon"), None);
/// ```
pub fn parse_duration(text: &str) -> Option<Duration> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let n: u64 = text[..split].parse().ok()?;
    let unit = match &text[split..] {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    Some(Duration::from_millis(n.checked_mul(unit)?))
}

/// A quota written `N/PERIOD` (`"100/1m"`).
pub fn parse_quota(text: &str) -> Option<Quota> {
    let (n, per) = text.split_once('/')?;
    Some(Quota::new(
        n.trim().parse().ok()?,
        parse_duration(per.trim())?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_line_and_the_field() {
        let cases = [
            ("limit = 5\nper = \"1m\"\nburst = \"x\"\n", 3, "burst"),
            ("limit = 5\n\nlisten = \"127.0.0.1:1\"\n", 3, "listen"),
            ("limit = 5\nshadow = tru\n", 2, "shadow"),
            ("limit = 5\n[plans]\ngold = 7\n", 3, "gold"),
        ];
        for (text, line, field) in cases {
            let e = LimitsFile::from_toml(text).unwrap_err();
            assert_eq!(
                (e.line(), e.field()),
                (Some(line), Some(field)),
                "{text:?}: {e}"
            );
        }
        let half_written = LimitsFile::from_toml("limit = 5\nper = \"1").unwrap_err();
        assert_eq!(half_written.line(), Some(2), "{half_written}");
        let file = LimitsFile::from_toml("limit = 5\n[plans]\ngold = \"ten/1m\"\n").unwrap();
        let e = file.limits(Quota::per_second(1)).unwrap_err();
        assert_eq!((e.line(), e.field()), (Some(3), Some("plans.gold")), "{e}");
        let file = LimitsFile::from_toml("deny = [\"10.0.0.0/40\"]\n").unwrap();
        let e = file.limits(Quota::per_second(1)).unwrap_err();
        assert_eq!((e.line(), e.field()), (Some(1), Some("deny")), "{e}");
        let e = LimitsFile::from_toml("algorithm = \"leaky\"\n").unwrap_err();
        assert_eq!(e.field(), Some("algorithm"));
    }

    #[test]
    fn absent_keys_take_the_defaults() {
        let file = LimitsFile::from_toml("").unwrap();
        let limits = file.limits(Quota::per_minute(7)).unwrap();
        assert_eq!(
            (limits.quota(), limits.is_shadow()),
            (Quota::per_minute(7), false)
        );
        let file =
            LimitsFile::from_toml("limit = 3\nper = \"1h\"\nburst = 6\nshadow = true").unwrap();
        let limits = file.limits(Quota::per_minute(7)).unwrap();
        assert_eq!(limits.quota(), Quota::per_hour(3).burst(6));
        assert!(limits.is_shadow());
    }
}
