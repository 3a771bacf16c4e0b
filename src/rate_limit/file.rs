//! Limits from a TOML file (the `config` feature), for [live limits](crate::RateLimitLayer::live):
//! read whole, checked whole, and only then put in force, so that a file that does not parse,
//! or is empty, is refused and the limits in force stay.
//!
//! A file being written can parse before it is finished (`limit = 6` before `per = "1m"`).
//! [`FileWatch`] reads a file only once it has stopped changing: its size and modification
//! time the same across two looks at least [`SETTLE`] apart; [`read`] reads regular files of
//! at most [`MAX_FILE_LEN`] bytes and nothing else (a FIFO or `/dev/zero` is refused before
//! it is opened). Both block: call them off an async runtime (`spawn_blocking`). A writer that
//! pauses longer than [`SETTLE`] mid-file can still be read half written: writers that need
//! the change to be atomic write a file beside it and rename it into place.
//!
//! ```toml
//! algorithm = "sliding-window"   # gcra (default), token-bucket, sliding-window, fixed-window
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

use std::{
    collections::BTreeMap,
    fmt,
    fs::{self, File, Metadata},
    io::Read,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

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

    /// An error about the file as a whole (no line, no field).
    fn whole(message: impl Into<String>) -> Self {
        Self {
            line: None,
            field: None,
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
///
/// An empty text (nothing but white space) is refused: a file truncated for writing looks the
/// same. A file that means to take every default says so with a comment.
///
/// # Errors
///
/// A [`FileError`] naming the line (and, when it can tell, the field) of the first syntax
/// error, value of the wrong type or unknown key.
pub fn from_toml<T: DeserializeOwned>(text: &str) -> Result<T, FileError> {
    if text.trim().is_empty() {
        return Err(FileError::whole(EMPTY));
    }
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
    /// `gcra`, `token-bucket`, `sliding-window` or `fixed-window`: what the limiter must run. A live layer
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
    ///
    /// # Errors
    ///
    /// A [`FileError`] naming the line and the field of the first value that does not read.
    pub fn from_toml(text: &str) -> Result<Self, FileError> {
        let mut file: Self = from_toml(text)?;
        file.text = text.to_owned();
        if let Some(a) = &file.algorithm {
            if !["gcra", "token-bucket", "sliding-window", "fixed-window"].contains(&a.as_str()) {
                return Err(FileError::field_error(
                    text,
                    "algorithm",
                    format!("{a:?} is not gcra, token-bucket, sliding-window or fixed-window"),
                ));
            }
        }
        Ok(file)
    }

    /// The limits the file sets; `defaults` gives the limit and the period the file leaves
    /// out. Every value is checked here (a period, a plan, a list entry), each error naming
    /// its line and field; whether the quotas build the limiter's algorithm is checked when
    /// they are put in force ([`LiveLimits::replace`](crate::rate_limit::LiveLimits::replace)).
    ///
    /// # Errors
    ///
    /// A [`FileError`] naming the line and the field of the first value that cannot be used (a
    /// period, a plan, a list entry).
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

/// Why an empty file is refused.
const EMPTY: &str = "the file is empty (a file being written looks the same): write at least one setting, or a comment to take every default";

/// The largest file [`read`] and [`FileWatch`] take: 8 MiB.
pub const MAX_FILE_LEN: u64 = 8 << 20;

/// How long a file must stay unchanged (its size and modification time) before
/// [`FileWatch`] reads it: 100 ms.
pub const SETTLE: Duration = Duration::from_millis(100);

/// Reads the file at `path` whole, as UTF-8 text. Refused, each with a [`FileError`] saying
/// why: anything but a regular file (a symbolic link is followed; a FIFO, a device such as
/// `/dev/zero` or a directory is refused before it is opened), a file longer than
/// [`MAX_FILE_LEN`] (its length is checked before it is read, and at most one byte past the
/// bound is read should it grow), text that is not UTF-8, and an empty file. Blocks: call it
/// off an async runtime (`tokio::task::spawn_blocking`).
///
/// # Errors
///
/// A [`FileError`] when the file cannot be read, is empty, is not a regular file or is over the
/// size bound.
pub fn read(path: impl AsRef<Path>) -> Result<String, FileError> {
    let io = |e: std::io::Error| FileError::whole(e.to_string());
    let path = path.as_ref();
    check_meta(&fs::metadata(path).map_err(io)?)?;
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    check_meta(&meta)?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_FILE_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_FILE_LEN {
        return Err(too_long(bytes.len() as u64));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        FileError::whole(format!(
            "not UTF-8 text (byte {} of the file)",
            e.utf8_error().valid_up_to() + 1
        ))
    })?;
    if text.trim().is_empty() {
        return Err(FileError::whole(EMPTY));
    }
    Ok(text)
}

/// A regular file of at most [`MAX_FILE_LEN`] bytes, or why not.
fn check_meta(meta: &Metadata) -> Result<(), FileError> {
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else {
            special_kind(&kind)
        };
        return Err(FileError::whole(format!(
            "not a regular file ({what}): only regular files are read"
        )));
    }
    if meta.len() > MAX_FILE_LEN {
        return Err(too_long(meta.len()));
    }
    Ok(())
}

#[cfg(unix)]
fn special_kind(kind: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_kind(_: &fs::FileType) -> &'static str {
    "a special file"
}

fn too_long(len: u64) -> FileError {
    FileError::whole(format!(
        "{len} bytes or more: a file is at most {MAX_FILE_LEN} bytes (8 MiB)"
    ))
}

/// What one look at a file saw: its identity, length and modification time, or why it cannot
/// be read (missing, not a regular file, too long).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stamp {
    File {
        len: u64,
        modified: Option<SystemTime>,
        /// The device and inode (a file renamed into place is another file).
        id: (u64, u64),
    },
    Refused(FileError),
}

impl Stamp {
    fn of(path: &Path) -> Self {
        let meta = match fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) => return Self::Refused(FileError::whole(e.to_string())),
        };
        if let Err(e) = check_meta(&meta) {
            return Self::Refused(e);
        }
        Self::File {
            len: meta.len(),
            modified: meta.modified().ok(),
            id: file_id(&meta),
        }
    }
}

#[cfg(unix)]
fn file_id(meta: &Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

#[cfg(not(unix))]
fn file_id(_: &Metadata) -> (u64, u64) {
    (0, 0)
}

/// What [`FileWatch::look`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// Nothing to do: the file is as last read (or its new text is the same).
    Unchanged,
    /// The file changed (or a read was [asked](FileWatch::ask)) and has not stayed unchanged
    /// for [`SETTLE`] yet: look again later.
    Settling,
    /// The file has settled: its new text, or why it cannot be read (see [`read`]). A refusal
    /// is reported once per change of the file.
    Read(Result<String, FileError>),
}

/// Watches a file for reloads: [`look`](Self::look) at it every few tens of milliseconds
/// (and [`ask`](Self::ask) on `SIGHUP`), and it hands back the file's text once the file has
/// stopped changing, that is its size, modification time and inode are the same across two
/// looks at least [`SETTLE`] apart, and the same again after it was read. The time of each
/// look is the caller's (tests drive it), and every look blocks on the file system: call it
/// off an async runtime (`spawn_blocking`).
///
/// ```
/// use std::time::{Duration, Instant};
/// use tower_redis_ratelimit::rate_limit::file::{FileWatch, Look, SETTLE};
///
/// let path = std::env::temp_dir().join(format!("file-watch-doc-{}.toml", std::process::id()));
/// std::fs::write(&path, "limit = 5\n")?;
/// let mut watch = FileWatch::new(&path);
/// assert_eq!(watch.read()?, "limit = 5\n"); // at start-up: read now
/// std::fs::write(&path, "limit = 6\n")?;
/// let t0 = Instant::now();
/// assert_eq!(watch.look(t0), Look::Settling); // changed: read it once it stays so
/// assert_eq!(watch.look(t0 + SETTLE), Look::Read(Ok("limit = 6\n".into())));
/// assert_eq!(watch.look(t0 + 2 * SETTLE), Look::Unchanged);
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct FileWatch {
    path: PathBuf,
    /// The stamp of the last read (or refusal reported).
    last: Option<Stamp>,
    /// The text last read.
    text: Option<String>,
    /// A stamp seen, and when it was first seen (it has not changed since).
    pending: Option<(Stamp, Instant)>,
    /// A read was asked: the next settled look reads the file, changed or not.
    asked: bool,
}

impl FileWatch {
    /// Watches the file at `path` (nothing read yet: the first look reads it once settled).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            last: None,
            text: None,
            pending: None,
            asked: false,
        }
    }

    /// The file watched.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file now, without waiting for it to settle (at start-up), as [`read`]; a
    /// look after it reports only a change from what this read saw.
    ///
    /// # Errors
    ///
    /// A [`FileError`] when the file cannot be read, is empty, is not a regular file or is over
    /// the size bound.
    pub fn read(&mut self) -> Result<String, FileError> {
        let stamp = Stamp::of(&self.path);
        let text = read(&self.path);
        self.pending = None;
        self.last = Some(stamp);
        self.text = text.as_ref().ok().cloned();
        text
    }

    /// Asks for a read (on `SIGHUP`): the next looks read the file once it has settled, and
    /// report its text even if it is the one last read.
    pub fn ask(&mut self) {
        self.asked = true;
    }

    /// Looks at the file at time `now` (the caller's clock, e.g. `Instant::now()`).
    pub fn look(&mut self, now: Instant) -> Look {
        let stamp = Stamp::of(&self.path);
        match &self.pending {
            Some((seen, since)) if *seen == stamp => {
                if now.saturating_duration_since(*since) < SETTLE {
                    return Look::Settling;
                }
            }
            _ => {
                if !self.asked && self.last.as_ref() == Some(&stamp) {
                    self.pending = None;
                    return Look::Unchanged;
                }
                self.pending = Some((stamp, now));
                return Look::Settling;
            }
        }
        // Unchanged for SETTLE: read it, and make sure it did not change while being read.
        self.pending = None;
        let text = match &stamp {
            Stamp::Refused(e) => Err(e.clone()),
            Stamp::File { .. } => {
                let text = read(&self.path);
                let after = Stamp::of(&self.path);
                if after != stamp {
                    self.pending = Some((after, now));
                    return Look::Settling;
                }
                text
            }
        };
        let asked = std::mem::take(&mut self.asked);
        self.last = Some(stamp);
        match text {
            Ok(text) if !asked && self.text.as_ref() == Some(&text) => Look::Unchanged,
            Ok(text) => {
                self.text = Some(text.clone());
                Look::Read(Ok(text))
            }
            Err(e) => {
                self.text = None;
                Look::Read(Err(e))
            }
        }
    }
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
        let file = LimitsFile::from_toml("# every default\n").unwrap();
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

#[cfg(test)]
mod watch_tests {
    use std::io::Write;

    use super::*;

    /// A directory of its own under the system's temporary directory, removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("file-rs-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_empty_file_is_refused_with_a_clear_error() {
        for text in ["", "\n", "  \n\t\n"] {
            let e = LimitsFile::from_toml(text).unwrap_err();
            assert!(e.message().contains("empty"), "{text:?}: {e}");
            assert_eq!((e.line(), e.field()), (None, None));
            assert!(from_toml::<LimitsFile>(text).is_err());
        }
        assert!(LimitsFile::from_toml("# every default\n").is_ok());
        let dir = Dir::new("empty");
        let path = dir.0.join("limits.toml");
        fs::write(&path, "").unwrap();
        let e = read(&path).unwrap_err();
        assert!(e.to_string().contains("the file is empty"), "{e}");
        let mut watch = FileWatch::new(&path);
        assert_eq!(watch.read(), Err(e.clone()));
        // Truncated for writing, and left so: refused once, not at every look.
        fs::write(&path, "limit = 5\n").unwrap();
        let t0 = Instant::now();
        assert_eq!(watch.look(t0), Look::Settling);
        assert!(matches!(watch.look(t0 + SETTLE), Look::Read(Ok(_))));
        fs::write(&path, "").unwrap();
        assert_eq!(watch.look(t0 + 2 * SETTLE), Look::Settling);
        assert_eq!(watch.look(t0 + 3 * SETTLE), Look::Read(Err(e)));
        assert_eq!(watch.look(t0 + 4 * SETTLE), Look::Unchanged);
    }

    #[test]
    fn a_file_is_read_once_unchanged_across_two_looks_a_settle_apart() {
        let dir = Dir::new("settle");
        let path = dir.0.join("limits.toml");
        fs::write(&path, "limit = 1\n").unwrap();
        let mut watch = FileWatch::new(&path);
        assert_eq!(watch.read().unwrap(), "limit = 1\n");
        let t0 = Instant::now();
        assert_eq!(watch.look(t0), Look::Unchanged);

        // A writer truncates the file and writes it in two parts; the first parses.
        let mut writer = File::create(&path).unwrap();
        writer.write_all(b"limit = 6\n").unwrap();
        assert_eq!(watch.look(t0 + 10 * MS), Look::Settling);
        assert_eq!(
            watch.look(t0 + 109 * MS),
            Look::Settling,
            "not a settle yet"
        );
        writer.write_all(b"per = \"1m\"\n").unwrap();
        drop(writer);
        assert_eq!(watch.look(t0 + 110 * MS), Look::Settling, "it grew");
        assert_eq!(watch.look(t0 + 209 * MS), Look::Settling);
        assert_eq!(
            watch.look(t0 + 210 * MS),
            Look::Read(Ok("limit = 6\nper = \"1m\"\n".into()))
        );
        assert_eq!(watch.look(t0 + 400 * MS), Look::Unchanged);

        // Asked (SIGHUP): read again once settled, though unchanged.
        watch.ask();
        assert_eq!(watch.look(t0 + 500 * MS), Look::Settling);
        assert_eq!(
            watch.look(t0 + 600 * MS),
            Look::Read(Ok("limit = 6\nper = \"1m\"\n".into()))
        );
        assert_eq!(watch.look(t0 + 700 * MS), Look::Unchanged);

        // Renamed into place with the same length: another file, read once settled.
        let tmp = dir.0.join("limits.tmp");
        fs::write(&tmp, "limit = 7\nper = \"1m\"\n").unwrap();
        fs::rename(&tmp, &path).unwrap();
        assert_eq!(watch.look(t0 + 800 * MS), Look::Settling);
        assert_eq!(
            watch.look(t0 + 900 * MS),
            Look::Read(Ok("limit = 7\nper = \"1m\"\n".into()))
        );

        // Written again with the same text: nothing to do.
        fs::write(&path, "limit = 7\nper = \"1m\"\n").unwrap();
        let t1 = t0 + 1_000 * MS;
        let first = watch.look(t1);
        assert!(
            matches!(first, Look::Settling | Look::Unchanged),
            "{first:?}"
        );
        assert_eq!(watch.look(t1 + SETTLE), Look::Unchanged);

        // Removed: refused once settled, once.
        fs::remove_file(&path).unwrap();
        let t2 = t1 + 2 * SETTLE;
        assert_eq!(watch.look(t2), Look::Settling);
        assert!(matches!(watch.look(t2 + SETTLE), Look::Read(Err(_))));
        assert_eq!(watch.look(t2 + 2 * SETTLE), Look::Unchanged);
    }

    #[cfg(unix)]
    #[test]
    fn only_regular_files_up_to_8_mib_are_read() {
        let dir = Dir::new("kinds");
        let fifo = dir.0.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // A FIFO with no writer: refused before it is opened (opening it would block).
        let e = read(&fifo).unwrap_err();
        assert!(e.message().contains("not a regular file (a FIFO)"), "{e}");
        let zero = dir.0.join("zero.toml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        for path in [Path::new("/dev/zero"), &zero] {
            let e = read(path).unwrap_err();
            assert!(
                e.message()
                    .contains("not a regular file (a character device)"),
                "{e}"
            );
        }
        let e = read(&dir.0).unwrap_err();
        assert!(e.message().contains("(a directory)"), "{e}");
        let mut watch = FileWatch::new(&zero);
        let t0 = Instant::now();
        assert_eq!(watch.look(t0), Look::Settling);
        assert!(
            matches!(watch.look(t0 + SETTLE), Look::Read(Err(e)) if e.message().contains("character device"))
        );

        let big = dir.0.join("big.toml");
        let mut text = "#".repeat(MAX_FILE_LEN as usize - 10);
        text.push_str("\nlimit = 5");
        assert_eq!(text.len() as u64, MAX_FILE_LEN);
        fs::write(&big, &text).unwrap();
        assert_eq!(read(&big).unwrap().len() as u64, MAX_FILE_LEN);
        text.push('\n');
        fs::write(&big, &text).unwrap();
        let e = read(&big).unwrap_err();
        assert!(e.message().contains("at most 8388608 bytes"), "{e}");

        let latin1 = dir.0.join("latin1.toml");
        fs::write(&latin1, b"deny = [\"caf\xe9\"]\n").unwrap();
        let e = read(&latin1).unwrap_err();
        assert!(e.message().contains("not UTF-8 text (byte 13"), "{e}");
    }
}
