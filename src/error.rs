//! Errors: a configuration that cannot work, and why a check could not be decided.
//!
//! Each error's `Display` says what happened at its own level and `source()` returns the
//! cause, so an error reporter prints every cause once; the crate's own logs print the whole
//! chain with [`ErrorChain`](crate::telemetry::ErrorChain).

use std::{error::Error as StdError, fmt, sync::Arc, time::Duration};

/// A cause kept as an error's source: shared, so the error stays `Clone`.
pub(crate) type Cause = Arc<dyn StdError + Send + Sync>;

/// A configuration value that cannot work, found when a limiter or layer is built.
///
/// The message names the field, e.g. `invalid quota.limit: must be at least 1`.
///
/// ```
/// use tower_redis_ratelimit::{Gcra, Quota};
///
/// let err = Gcra::new(Quota::per_second(0)).unwrap_err();
/// assert_eq!(err.field(), "quota.limit");
/// assert!(err.to_string().contains("quota.limit"));
/// ```
#[derive(Debug, Clone)]
pub struct ConfigError {
    field: &'static str,
    reason: String,
    /// What rejected the value, when another library did (a URL parser, a PEM reader, TLS):
    /// [`source`](StdError::source), not part of the message.
    cause: Option<Cause>,
}

impl PartialEq for ConfigError {
    /// The same field refused for the same reason (whatever the cause's own value).
    fn eq(&self, other: &Self) -> bool {
        self.field == other.field && self.reason == other.reason
    }
}

impl Eq for ConfigError {}

impl ConfigError {
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
            cause: None,
        }
    }

    /// The same, with `cause` (what rejected the value) as its source.
    pub(crate) fn caused_by(mut self, cause: impl StdError + Send + Sync + 'static) -> Self {
        self.cause = Some(Arc::new(cause));
        self
    }

    /// The configuration field that was rejected, e.g. `"quota.burst"`.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// Why the value was rejected.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {}: {}", self.field, self.reason)
    }
}

impl StdError for ConfigError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.cause
            .as_deref()
            .map(|c| c as &(dyn StdError + 'static))
    }
}

/// Why a check could not reach a decision.
///
/// The layer never surfaces these to clients as 500s: it applies its [`FailurePolicy`](crate::FailurePolicy).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The store did not answer within the configured timeout.
    Timeout(Duration),
    /// Redis answered with an error or the connection failed; the source is redis-rs' error.
    Redis(redis::RedisError),
    /// No connection could be had to send the call on: a pool that timed out, or the task
    /// that sends batched checks has stopped. The source says which.
    Pool(Cause),
    /// The store answered, but not in the shape the algorithm expects
    /// (foreign data under the limiter's keys, or a script from another version).
    InvalidReply(String),
    /// The key holds another algorithm's state in a [`MemoryStore`](crate::MemoryStore)
    /// (two algorithms sharing a key), as Redis answers `WRONGTYPE`.
    WrongType,
    /// The request itself is invalid, e.g. a cost of zero.
    InvalidInput(&'static str),
    /// The store does not support this algorithm.
    Unsupported(&'static str),
    /// The circuit breaker is open after repeated store failures; the store was not called.
    CircuitOpen,
    /// Connecting to the store failed; [`ConnectError::kind`] says how. Displays as the
    /// [`ConnectError`] it holds.
    Connect(ConnectError),
    /// The store's configuration cannot work (a certificate file that holds no certificate,
    /// say); found when the store is built. Displays as the [`ConfigError`] it holds.
    Config(ConfigError),
}

/// How connecting to Redis failed: what to fix is different for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectErrorKind {
    /// No server at the address: the name does not resolve, or the connection was refused or
    /// could not be routed.
    Unreachable,
    /// The server did not complete the TCP or TLS connection, the handshake and a `PING`
    /// within the connect timeout (a black-holed address, a TLS port spoken to in plain text,
    /// an overloaded server).
    TimedOut,
    /// The server wants a password (`NOAUTH`) that the configuration does not give.
    AuthRequired,
    /// The server refused the credentials: a wrong password, an unknown or disabled ACL user
    /// (`WRONGPASS`), or a user not allowed to run the commands the store needs (`NOPERM`).
    AuthFailed,
    /// The TLS handshake failed: an untrusted or invalid certificate, a name mismatch, a
    /// server that does not speak TLS, a client certificate the server refused.
    Tls,
    /// No Sentinel named a primary for the master name that answers as a primary.
    NoPrimary,
    /// Any other failure (a protocol error, a server error during the handshake).
    Other,
}

/// Why connecting to Redis failed: how (its [kind](Self::kind)), a message naming the address
/// and the step, and the cause as its [`source`](StdError::source) when there is one.
///
/// ```
/// use tower_redis_ratelimit::{Error, RedisStore, store::redis::ConnectErrorKind};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // Nothing listens on port 1.
/// match RedisStore::connect("redis://127.0.0.1:1").await {
///     Err(Error::Connect(e)) => assert_eq!(e.kind(), ConnectErrorKind::Unreachable),
///     other => panic!("{other:?}"),
/// }
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ConnectError {
    kind: ConnectErrorKind,
    message: String,
    source: Option<Cause>,
}

impl ConnectError {
    /// `message` names the address and the step; the cause, if any, goes in
    /// [`caused_by`](Self::caused_by).
    pub(crate) fn new(kind: ConnectErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// The same error, with `cause` as its source.
    pub(crate) fn caused_by(mut self, cause: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(cause));
        self
    }

    /// The same error, its message followed by `more` (a hint about the cause).
    pub(crate) fn explained(mut self, more: &str) -> Self {
        self.message.push_str(more);
        self
    }

    /// How connecting failed.
    pub fn kind(&self) -> ConnectErrorKind {
        self.kind
    }

    /// What happened, naming the address (the cause is the error's
    /// [`source`](StdError::source)).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            ConnectErrorKind::Unreachable => "unreachable",
            ConnectErrorKind::TimedOut => "timed out",
            ConnectErrorKind::AuthRequired => "authentication required",
            ConnectErrorKind::AuthFailed => "authentication failed",
            ConnectErrorKind::Tls => "TLS",
            ConnectErrorKind::NoPrimary => "no primary",
            ConnectErrorKind::Other => "failed",
        };
        write!(f, "cannot connect to redis ({what}): {}", self.message)
    }
}

impl StdError for ConnectError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// What an [`Error`] says about the next check: is the whole store refusing work, or only
/// this key, or only this check?
///
/// The circuit breaker counts only [`ErrorScope::Store`] errors, and
/// [`FailurePolicy::Local`](crate::FailurePolicy::Local) decides locally only on them: a store that refuses every key
/// (down, hung, out of memory, read-only after a failover, asking for a password) is
/// unavailable, while an answer about one key (`WRONGTYPE`, a corrupted value) shows that the
/// store is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorScope {
    /// The store refuses or cannot take any check now: timeouts, connection failures, the
    /// breaker open, and the server-wide refusals `OOM`, `READONLY`, `NOAUTH`, `WRONGPASS`,
    /// `NOPERM`, `BUSY`, `LOADING`, `MISCONF`, `MASTERDOWN`, `CLUSTERDOWN`, `TRYAGAIN`, and
    /// any error this crate does not recognise.
    Store,
    /// The store is up but this key's state is unusable: `WRONGTYPE` (foreign data under
    /// the key), a corrupted stored value, a reply of the wrong shape.
    Key,
    /// This check itself is invalid (a cost of zero, an argument the script rejects, an
    /// algorithm the store does not support); other checks are unaffected.
    Check,
}

/// The scope of an error the Redis server (or a script) answered with, by its code.
fn server_error_scope(code: &str, detail: &str) -> ErrorScope {
    if code == "ERR" {
        if let Some(inner) = pre_7_script_error(detail) {
            // Redis 5 and 6 answer every error raised in a script as `ERR`, the raised
            // message after a prefix: `WRONGTYPE …` from a command the script called, or the
            // script's own message (which has no code of its own).
            let inner = inner.trim_start_matches('-');
            return match inner.split_once(' ') {
                Some((code, rest)) if is_error_code(code) => server_error_scope(code, rest),
                _ => server_error_scope("ERR", inner),
            };
        }
    }
    match code {
        "WRONGTYPE" | "CROSSSLOT" => ErrorScope::Key,
        // The scripts' own errors: a corrupted value under one key, or an argument the script
        // rejects (a bug in this check, not in the store).
        "ERR" if detail.starts_with(SCRIPT_ERROR_CORRUPTED) => ErrorScope::Key,
        "ERR" if detail.starts_with(SCRIPT_ERROR_ARGUMENT) => ErrorScope::Check,
        // OOM, READONLY, NOAUTH, WRONGPASS, NOPERM, BUSY, LOADING, MISCONF, MASTERDOWN,
        // CLUSTERDOWN, TRYAGAIN, `ERR max number of clients reached`, a killed script...:
        // every key is refused. Unknown codes too: failing over to the local share (or the
        // breaker's rest) costs little when wrong, while blaming one key for a store-wide
        // refusal turns `Local` into an outage.
        _ => ErrorScope::Store,
    }
}

/// The message a script raised, from Redis 5's and 6's answer to it:
/// `Error running script (call to f_SHA): @user_script:LINE: MESSAGE`. Redis 7 and later
/// answer with the message itself, followed by ` script: SHA, on @user_script:LINE.`.
fn pre_7_script_error(detail: &str) -> Option<&str> {
    let rest = detail.strip_prefix("Error running script (call to f_")?;
    let (sha, rest) = rest.split_once("): ")?;
    if !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let Some(line) = rest.strip_prefix("@user_script:") else {
        return Some(rest); // an error with no line (raised outside the script's own code)
    };
    let (number, message) = line.split_once(": ")?;
    number
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then_some(message)
}

/// Whether `word` reads as a Redis error code (`WRONGTYPE`, `OOM`, `ERR`...).
fn is_error_code(word: &str) -> bool {
    word.len() >= 2 && word.bytes().all(|b| b.is_ascii_uppercase())
}

/// How the scripts' errors about a stored value start (after `ERR `).
const SCRIPT_ERROR_CORRUPTED: &str = "tower-redis-ratelimit: corrupted";
/// How the scripts' errors about an argument start (after `ERR `).
const SCRIPT_ERROR_ARGUMENT: &str = "tower-redis-ratelimit: invalid argument";

impl Error {
    /// What this error means for the next check: see [`ErrorScope`].
    pub fn scope(&self) -> ErrorScope {
        use redis::ErrorKind;
        match self {
            Error::Timeout(_) | Error::Pool(_) | Error::CircuitOpen | Error::Connect(_) => {
                ErrorScope::Store
            }
            Error::Config(_) => ErrorScope::Check,
            Error::InvalidReply(_) | Error::WrongType => ErrorScope::Key,
            Error::InvalidInput(_) | Error::Unsupported(_) => ErrorScope::Check,
            Error::Redis(e) => match (e.kind(), e.code()) {
                (_, Some(code)) => server_error_scope(code, e.detail().unwrap_or("")),
                (ErrorKind::UnexpectedReturnType, None) => ErrorScope::Key,
                // Connection, protocol, authentication and client-side failures.
                _ => ErrorScope::Store,
            },
        }
    }

    /// True when the store as a whole is unavailable ([`ErrorScope::Store`]): only these
    /// count towards the circuit breaker and switch [`FailurePolicy::Local`](crate::FailurePolicy::Local) to local
    /// decisions.
    pub fn is_unavailable(&self) -> bool {
        self.scope() == ErrorScope::Store
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Timeout(d) => write!(f, "rate-limit store timed out after {d:?}"),
            Error::Redis(_) => f.write_str("redis error"),
            Error::Pool(_) => f.write_str("no redis connection to send on"),
            Error::InvalidReply(e) => write!(f, "unexpected reply from the rate-limit store: {e}"),
            Error::WrongType => f.write_str("the key holds another algorithm's state"),
            Error::InvalidInput(e) => write!(f, "invalid rate-limit check: {e}"),
            Error::Unsupported(e) => write!(f, "unsupported: {e}"),
            Error::CircuitOpen => write!(f, "circuit breaker open: the store is failing"),
            Error::Connect(e) => e.fmt(f),
            Error::Config(e) => e.fmt(f),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            Error::Pool(e) => Some(&**e),
            // Transparent: they display as the error they hold, so its cause is theirs.
            Error::Connect(e) => e.source(),
            Error::Config(e) => e.source(),
            _ => None,
        }
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}

/// An error and its causes on one line, `error: cause: cause`, each cause once: for logs and
/// messages that stand alone (`tracing::warn!(error = %ErrorChain(&e), ...)`). A cause whose text
/// its error already printed (redis-rs prints its source in its own message) is skipped.
///
/// ```
/// use std::{error::Error, fmt};
/// use tower_redis_ratelimit::telemetry::ErrorChain;
///
/// #[derive(Debug)]
/// struct Unavailable(std::io::Error);
/// impl fmt::Display for Unavailable {
///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
///         f.write_str("store unavailable")
///     }
/// }
/// impl Error for Unavailable {
///     fn source(&self) -> Option<&(dyn Error + 'static)> {
///         Some(&self.0)
///     }
/// }
///
/// let e = Unavailable(std::io::Error::other("connection refused"));
/// assert_eq!(ErrorChain(&e).to_string(), "store unavailable: connection refused");
/// ```
pub struct ErrorChain<'a>(pub &'a (dyn StdError + 'a));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut last = self.0.to_string();
        f.write_str(&last)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            let text = cause.to_string();
            if !text.is_empty() && !last.contains(&text) {
                write!(f, ": {text}")?;
            }
            last = text;
            source = cause.source();
        }
        Ok(())
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error Redis answers with `line` (e.g. `-OOM command not allowed...`).
    fn server_error(line: &str) -> Error {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(e)) => Error::Redis(e.into()),
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn server_wide_refusals_are_store_errors() {
        for line in [
            "OOM command not allowed when used memory > 'maxmemory'.",
            "READONLY You can't write against a read only replica.",
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair or user is disabled.",
            "NOPERM User rl has no permissions to run the 'evalsha' command",
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "LOADING Redis is loading the dataset in memory",
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "CLUSTERDOWN The cluster is down",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "ERR max number of clients reached",
            "ERR Error running script (call to f_0123): @user_script:1: Script killed by user with SCRIPT KILL...",
            "SOMETHINGNEW a code this crate has never seen",
        ] {
            let e = server_error(line);
            assert_eq!(e.scope(), ErrorScope::Store, "{line}");
            assert!(e.is_unavailable(), "{line}");
        }
    }

    #[test]
    fn answers_about_one_key_or_one_check_are_not() {
        let key = [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "ERR tower-redis-ratelimit: corrupted TAT under {rl:k}:g",
            "ERR tower-redis-ratelimit: corrupted log total under {rl:k}:l script: 1a2b, on @user_script:40.",
            // Redis 7 and later, a command the script called.
            "WRONGTYPE Operation against a key holding the wrong kind of value script: \
             d3c21d0c2b9ca22f82737626a27bcaf5d288f99f, on @user_script:1.",
            // Redis 5 and 6 (as 5.0.7, 6.0.9 and 6.2.14 answer): every error raised in a
            // script is an `ERR` naming the script and the line.
            "ERR Error running script (call to f_d3c21d0c2b9ca22f82737626a27bcaf5d288f99f): \
             @user_script:1: WRONGTYPE Operation against a key holding the wrong kind of value",
            "ERR Error running script (call to f_57364dbc640ed46514eb99a1de6772db40f997a1): \
             @user_script:21: tower-redis-ratelimit: corrupted TAT under {rl:k}:g",
        ];
        for line in key {
            assert_eq!(server_error(line).scope(), ErrorScope::Key, "{line}");
        }
        for line in [
            "ERR tower-redis-ratelimit: invalid argument cost",
            "ERR Error running script (call to f_036f7b3ddff0307e82bf6e6009c5e1bb67aa5aa6): \
             @user_script:21: tower-redis-ratelimit: invalid argument cost",
        ] {
            assert_eq!(server_error(line).scope(), ErrorScope::Check, "{line}");
        }
        // A key's name in a server-wide refusal does not make it a key's error: only the
        // start of the raised message counts.
        for line in [
            "ERR Error running script (call to f_0123): @user_script:1: -OOM command not \
             allowed when used memory > 'maxmemory'. tower-redis-ratelimit: corrupted",
            "ERR Error running script (call to f_0123): @user_script:1: Script killed by \
             user with SCRIPT KILL... WRONGTYPE",
            "ERR Error running script (call to f_zz): @user_script:1: WRONGTYPE Operation",
            "ERR x Error running script (call to f_0123): @user_script:1: WRONGTYPE Operation",
        ] {
            assert_eq!(server_error(line).scope(), ErrorScope::Store, "{line}");
        }
        assert_eq!(Error::InvalidReply("x".into()).scope(), ErrorScope::Key);
        assert_eq!(Error::InvalidInput("x").scope(), ErrorScope::Check);
        for e in [
            Error::Timeout(Duration::from_millis(5)),
            Error::CircuitOpen,
            Error::Redis(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into()),
        ] {
            assert_eq!(e.scope(), ErrorScope::Store, "{e}");
        }
    }

    #[test]
    fn each_cause_is_printed_once() {
        let refused = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        // redis-rs prints its I/O error and also returns it as the source.
        let e = Error::Redis(refused().into());
        assert_eq!(e.to_string(), "redis error");
        assert_eq!(
            ErrorChain(&e).to_string(),
            format!("redis error: {}", refused())
        );
        let c =
            ConnectError::new(ConnectErrorKind::Unreachable, "127.0.0.1:1").caused_by(refused());
        let e = Error::Connect(c.clone());
        assert_eq!(e.to_string(), c.to_string(), "transparent");
        assert_eq!(
            e.to_string(),
            "cannot connect to redis (unreachable): 127.0.0.1:1"
        );
        assert_eq!(ErrorChain(&e).to_string(), format!("{e}: {}", refused()));
        let config = Error::Config(ConfigError::new("url", "not a URL"));
        assert_eq!(ErrorChain(&config).to_string(), "invalid url: not a URL");
        assert!(config.source().is_none());
        // A value another library refused keeps that library's error as its source.
        let parsed = ConfigError::new("url", "cannot be read").caused_by(refused());
        assert_eq!(parsed.to_string(), "invalid url: cannot be read");
        assert_eq!(
            ErrorChain(&parsed).to_string(),
            format!("invalid url: cannot be read: {}", refused())
        );
        assert_eq!(Error::WrongType.scope(), ErrorScope::Key);
    }
}
