//! What a prefix and a policy name may contain: they become part of every Redis key and of the
//! `RateLimit` headers.

use crate::error::ConfigError;

/// Checks a limiter's `prefix` and `policy_name`; the error names the field.
pub(crate) fn check(prefix: &str, policy: &str) -> Result<(), ConfigError> {
    let p = prefix;
    if p.is_empty()
        || p.len() > 64
        || !p
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
    {
        return Err(ConfigError::new(
            "prefix",
            format!("{p:?}: must be 1 to 64 visible ASCII characters without braces"),
        ));
    }
    let n = policy;
    if n.is_empty()
        || n.len() > 64
        || !n
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
    {
        return Err(ConfigError::new(
            "policy_name",
            format!("{n:?}: must be 1 to 64 characters from A-Z a-z 0-9 - _ . :"),
        ));
    }
    Ok(())
}
