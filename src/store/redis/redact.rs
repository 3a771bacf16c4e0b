//! Redis URLs as they may be shown: in messages, logs and banners, with `***` in place of the
//! password.

use std::borrow::Cow;

/// What a password is shown as.
const HIDDEN: &str = "***";

/// `url` with `***` in place of its password (see [`RedisStore::redact_url`]).
///
/// Everything before the last `@` that follows the scheme (or the start, when there is no
/// `://`) is the user information: a password holding `@`, `/`, `?` or `#` unencoded is
/// still hidden, and a string that is no URL at all errs towards hiding more.
///
/// [`RedisStore::redact_url`]: crate::RedisStore::redact_url
pub(crate) fn redact_url(url: &str) -> Cow<'_, str> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    let at = rest.rfind('@');
    let tail = at.map_or(rest, |at| &rest[at + 1..]);
    let query = tail.find('?').map(|q| q + 1);
    let secret_params = query.is_some_and(|q| params(&tail[q..]).any(|(_, secret)| secret));
    if at.is_none() && !secret_params {
        return Cow::Borrowed(url);
    }
    let mut out = String::with_capacity(url.len());
    out.push_str(&url[..start]);
    if let Some(at) = at {
        // `USER:PASSWORD@`: the user stays. `SECRET@` (a user without a password, or a
        // password without its colon) is hidden whole.
        if let Some(colon) = rest[..at].find(':') {
            out.push_str(&rest[..colon]);
            out.push(':');
        }
        out.push_str(HIDDEN);
        out.push('@');
    }
    match query {
        Some(q) if secret_params => {
            out.push_str(&tail[..q]);
            let (query, fragment) = match tail[q..].find('#') {
                Some(f) => tail[q..].split_at(f),
                None => (&tail[q..], ""),
            };
            for (i, (param, secret)) in params(query).enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match param.split_once('=') {
                    Some((name, _)) if secret => {
                        out.push_str(name);
                        out.push('=');
                        out.push_str(HIDDEN);
                    }
                    _ => out.push_str(param),
                }
            }
            out.push_str(fragment);
        }
        _ => out.push_str(tail),
    }
    Cow::Owned(out)
}

/// The `&`-separated parameters of a query (up to a `#`), each with whether it holds a
/// password (`pass=`, `password=`, as a `redis+unix://` URL gives it).
fn params(query: &str) -> impl Iterator<Item = (&str, bool)> {
    let query = query.split('#').next().unwrap_or_default();
    query.split('&').map(|param| {
        let name = param.split('=').next().unwrap_or_default();
        let secret = param.contains('=')
            && (name.eq_ignore_ascii_case("pass") || name.eq_ignore_ascii_case("password"));
        (param, secret)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_and_the_rest_is_kept() {
        for (url, shown) in [
            ("redis://:pw1@127.0.0.1:6379", "redis://:***@127.0.0.1:6379"),
            (
                "redis://limiter:pw1@127.0.0.1:6379/2",
                "redis://limiter:***@127.0.0.1:6379/2",
            ),
            (
                "rediss://:pw1@redis.internal:6380",
                "rediss://:***@redis.internal:6380",
            ),
            (
                "rediss://user:pw1@redis.internal:6380/0?protocol=3",
                "rediss://user:***@redis.internal:6380/0?protocol=3",
            ),
            // Percent-encoded, in the password and in the user.
            ("redis://:p%40ss%3Aw@h:1", "redis://:***@h:1"),
            ("redis://us%3Aer:p%2Fw@h:1", "redis://us%3Aer:***@h:1"),
            // A user information without a colon may be a password missing its colon.
            ("redis://pw1@h:1", "redis://***@h:1"),
            ("redis://@h:1", "redis://***@h:1"),
            ("redis://[::1]:6379", "redis://[::1]:6379"),
            ("redis://:pw1@[::1]:6379", "redis://:***@[::1]:6379"),
            // Unix sockets take the password as a parameter.
            (
                "redis+unix:///run/redis.sock?db=1&pass=pw1",
                "redis+unix:///run/redis.sock?db=1&pass=***",
            ),
            (
                "redis+unix:///run/redis.sock?user=u&PASSWORD=pw1#frag",
                "redis+unix:///run/redis.sock?user=u&PASSWORD=***#frag",
            ),
            (
                "redis+unix:///run/redis.sock?db=1",
                "redis+unix:///run/redis.sock?db=1",
            ),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn malformed_urls_never_show_the_password() {
        for (url, shown) in [
            // Unencoded `@`, `/`, `?`, `#` and `:` inside the password.
            ("redis://:p@ss@h:1", "redis://:***@h:1"),
            ("redis://:pa/ss@h:1", "redis://:***@h:1"),
            ("redis://u:pa?ss#x@h:1", "redis://u:***@h:1"),
            ("redis://u:p:w@h:1", "redis://u:***@h:1"),
            // No scheme, a wrong scheme, a scheme without `//`.
            (":pw1@h:1", ":***@h:1"),
            ("pw1@h:1", "***@h:1"),
            ("http://:pw1@h", "http://:***@h"),
            ("redis:pw1@h", "redis:***@h"),
            // No host at all, nothing but a password.
            ("redis://:pw1@", "redis://:***@"),
            ("", ""),
            ("redis://", "redis://"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn a_url_without_a_password_is_borrowed() {
        assert!(matches!(
            redact_url("redis://127.0.0.1:6379/0"),
            Cow::Borrowed(_)
        ));
    }
}
