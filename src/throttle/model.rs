//! The rate-limit fields of model APIs, for requests and for tokens: OpenAI's
//! `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (resets as durations like `6m0s`)
//! and Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
//! remaining,reset}` (resets as RFC 3339 times). Nothing here panics or trusts a value.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;

/// Whose fields an answer's budget was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vendor {
    OpenAi,
    Anthropic,
}

/// One budget as an answer tells it: its limit (when told), the units left, and the time
/// until they are all back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Told {
    pub(crate) limit: Option<u64>,
    pub(crate) remaining: u64,
    pub(crate) reset: Duration,
}

/// The request budget an answer tells (OpenAI's fields first); values that do not read are
/// counted in `ignored`.
pub(crate) fn requests(
    headers: &HeaderMap,
    now: SystemTime,
    ignored: &mut u32,
) -> Option<(Told, Vendor)> {
    openai(headers, "requests", ignored)
        .map(|t| (t, Vendor::OpenAi))
        .or_else(|| anthropic(headers, "requests", now, ignored).map(|t| (t, Vendor::Anthropic)))
}

/// The token budget an answer tells: OpenAI's `-tokens` fields; else Anthropic's `tokens`
/// fields, else the tighter (fewer left) of its `input-tokens` and `output-tokens`.
pub(crate) fn tokens(
    headers: &HeaderMap,
    now: SystemTime,
    ignored: &mut u32,
) -> Option<(Told, Vendor)> {
    if let Some(t) = openai(headers, "tokens", ignored) {
        return Some((t, Vendor::OpenAi));
    }
    if let Some(t) = anthropic(headers, "tokens", now, ignored) {
        return Some((t, Vendor::Anthropic));
    }
    let input = anthropic(headers, "input-tokens", now, ignored);
    let output = anthropic(headers, "output-tokens", now, ignored);
    let tighter = match (input, output) {
        (Some(i), Some(o)) => Some(if o.remaining < i.remaining { o } else { i }),
        (i, o) => i.or(o),
    };
    tighter.map(|t| (t, Vendor::Anthropic))
}

fn openai(headers: &HeaderMap, what: &str, ignored: &mut u32) -> Option<Told> {
    let name = |field: &str| format!("x-ratelimit-{field}-{what}");
    told(
        headers,
        [&name("limit"), &name("remaining"), &name("reset")],
        ignored,
        go_duration,
    )
}

fn anthropic(headers: &HeaderMap, what: &str, now: SystemTime, ignored: &mut u32) -> Option<Told> {
    let name = |field: &str| format!("anthropic-ratelimit-{what}-{field}");
    told(
        headers,
        [&name("limit"), &name("remaining"), &name("reset")],
        ignored,
        |text| rfc3339(text).map(|at| at.duration_since(now).unwrap_or_default()),
    )
}

/// The limit, remaining and reset fields `names`: `None` when neither remaining nor reset is
/// there, or one of them does not read (counted); a limit that does not read is left out
/// (counted).
fn told(
    headers: &HeaderMap,
    names: [&str; 3],
    ignored: &mut u32,
    reset: impl Fn(&str) -> Option<Duration>,
) -> Option<Told> {
    let text = |name: &str| headers.get(name).map(|v| v.to_str().ok());
    let (r, t) = (text(names[1]), text(names[2]));
    if r.is_none() && t.is_none() {
        return None;
    }
    let mut bad = |ok: bool| {
        if !ok {
            *ignored += 1;
        }
    };
    let remaining = r.map(|v| v.and_then(count));
    let reset = t.map(|v| v.and_then(&reset));
    bad(remaining.is_none_or(|r| r.is_some()));
    bad(reset.is_none_or(|t| t.is_some()));
    let limit = text(names[0]).map(|v| v.and_then(count));
    bad(limit.is_none_or(|l| l.is_some()));
    Some(Told {
        limit: limit.flatten(),
        remaining: remaining??,
        reset: reset??,
    })
}

/// Digits only, at most 19 of them.
fn count(text: &str) -> Option<u64> {
    let t = text.trim();
    if t.is_empty() || t.len() > 19 || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// A duration as OpenAI (and Go's `time.Duration`) writes it: `6m0s`, `1s`, `20ms`,
/// `1h2m3.5s`, `0s`; units `h`, `m`, `s`, `ms`, `us`, `ns`; a bare whole number is seconds.
/// Anything else (a sign, an unknown unit, more than 64 characters, a number of more than 20
/// digits, beyond what a `Duration` holds) is `None`.
pub(crate) fn go_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    if t.is_empty() || t.len() > 64 {
        return None;
    }
    if let Some(secs) = count(t) {
        return Some(Duration::from_secs(secs));
    }
    let b = t.as_bytes();
    let digits = |from: usize| from + b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut nanos: u128 = 0;
    let mut i = 0;
    while i < b.len() {
        let whole_end = digits(i);
        let whole = &t[i..whole_end];
        let (fraction, frac_end) = match b.get(whole_end) {
            Some(b'.') => {
                let end = digits(whole_end + 1);
                (&t[whole_end + 1..end], end)
            }
            _ => ("", whole_end),
        };
        let unit_end = frac_end
            + b[frac_end..]
                .iter()
                .take_while(|c| c.is_ascii_alphabetic())
                .count();
        let per: u128 = match &t[frac_end..unit_end] {
            "h" => 3_600_000_000_000,
            "m" => 60_000_000_000,
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" => 1_000,
            "ns" => 1,
            _ => return None,
        };
        if (whole.is_empty() && fraction.is_empty()) || whole.len() > 20 {
            return None;
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        // Nanoseconds are the finest unit: further digits of a fraction say nothing.
        let fraction = &fraction[..fraction.len().min(18)];
        let part = match fraction.len() {
            0 => 0,
            n => fraction.parse::<u128>().ok()? * per / 10u128.pow(n as u32),
        };
        nanos = nanos.checked_add(whole.checked_mul(per)?.checked_add(part)?)?;
        i = unit_end;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// An RFC 3339 time (`2024-05-01T12:00:30Z`, `2024-05-01t12:00:30.250+02:00`); `None` for
/// anything else, a date that does not exist included. A time before 1970 is 1970.
pub(crate) fn rfc3339(text: &str) -> Option<SystemTime> {
    let t = text.trim();
    let b = t.as_bytes();
    if !(20..=40).contains(&b.len()) {
        return None;
    }
    let num = |from: usize, len: usize| -> Option<i64> {
        let s = t.get(from..from + len)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let at = |i: usize, c: &[u8]| c.contains(&b[i]);
    if !(at(4, b"-") && at(7, b"-") && at(10, b"Tt ") && at(13, b":") && at(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0u32;
    if b.get(i) == Some(&b'.') {
        let end = i + 1 + b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        let fraction = &t[i + 1..end];
        if fraction.is_empty() {
            return None;
        }
        let kept = &fraction[..fraction.len().min(9)];
        nanos = kept.parse::<u32>().ok()? * 10u32.pow(9 - kept.len() as u32);
        i = end;
    }
    let offset = match &t[i..] {
        "Z" | "z" => 0,
        zone if zone.len() == 6 && at(i, b"+-") && at(i + 3, b":") => {
            let (h, m) = (num(i + 1, 2)?, num(i + 4, 2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let sign = if b[i] == b'-' { -1 } else { 1 };
            sign * (h * 3600 + m * 60)
        }
        _ => return None,
    };
    // A leap second reads as the second before it.
    let secs =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second.min(59)
            - offset;
    let Ok(secs) = u64::try_from(secs) else {
        return Some(UNIX_EPOCH);
    };
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_openai_writes_them() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("6m0s", ms(360_000)),
            ("1s", ms(1_000)),
            ("20ms", ms(20)),
            ("1h2m3.5s", ms(3_723_500)),
            ("0s", ms(0)),
            ("0", ms(0)),
            ("30", ms(30_000)),
            (" 1.25s ", ms(1_250)),
            (".5s", ms(500)),
            ("7.66s", ms(7_660)),
            ("1500us", ms(1) + Duration::from_micros(500)),
            ("2ns", Duration::from_nanos(2)),
            ("0.0000000019s", Duration::from_nanos(1)),
        ] {
            assert_eq!(go_duration(text), Some(want), "{text}");
        }
    }

    #[test]
    fn hostile_durations_are_none_and_never_panic() {
        let long = "9".repeat(300);
        let many = "1s".repeat(40);
        for text in [
            "",
            "-1s",
            "+1s",
            "1",
            "s",
            "1x",
            ".s",
            "1..5s",
            "abc",
            "1e9s",
            "NaN",
            "1 s",
            "99999999999999999999999h",
            "99999999999999999999h",
            &long,
            &many,
            "1h-2m",
            "\u{b5}s",
            "1\u{b5}s",
        ] {
            let got = go_duration(text);
            // A bare whole number is seconds ("1"); everything else here does not read.
            if text == "1" {
                assert_eq!(got, Some(Duration::from_secs(1)));
            } else {
                assert_eq!(got, None, "{text:?}");
            }
        }
        // Large but countable: read, for the caller to cap.
        assert!(go_duration("9999999h").is_some());
    }

    #[test]
    fn rfc3339_times() {
        let at = |secs: u64, nanos: u32| Some(UNIX_EPOCH + Duration::new(secs, nanos));
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), at(0, 0));
        assert_eq!(rfc3339("2023-11-14T22:13:20Z"), at(1_700_000_000, 0));
        assert_eq!(
            rfc3339("2023-11-14t22:13:20.25z"),
            at(1_700_000_000, 250_000_000)
        );
        assert_eq!(rfc3339("2023-11-15T00:13:20+02:00"), at(1_700_000_000, 0));
        assert_eq!(rfc3339("2023-11-14T21:13:20-01:00"), at(1_700_000_000, 0));
        assert_eq!(rfc3339("2024-02-29T00:00:00Z"), at(1_709_164_800, 0));
        assert_eq!(rfc3339("1960-01-01T00:00:00Z"), Some(UNIX_EPOCH));
        for bad in [
            "",
            "2023-11-14",
            "2023-11-14T22:13:20",
            "2023-02-30T00:00:00Z",
            "2023-13-01T00:00:00Z",
            "2023-11-14T24:00:00Z",
            "2023-11-14T22:13:20.Z",
            "2023-11-14T22:13:20+2:00",
            "2023-11-14T22:13:20+25:00",
            "-023-11-14T22:13:20Z",
            "2023-11-14T22:13:20.123456789012345678901Z",
            "9999-99-99T99:99:99Z",
            "2023\u{b5}11-14T22:13:20Z",
        ] {
            assert_eq!(rfc3339(bad), None, "{bad:?}");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn openai_and_anthropic_budgets() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut ignored = 0;
        let h = headers(&[
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-tokens", "149000"),
            ("x-ratelimit-reset-tokens", "400ms"),
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-reset-requests", "120ms"),
        ]);
        let told = |limit, remaining, reset| Told {
            limit,
            remaining,
            reset,
        };
        assert_eq!(
            tokens(&h, now, &mut ignored),
            Some((
                told(Some(150_000), 149_000, Duration::from_millis(400)),
                Vendor::OpenAi
            ))
        );
        assert_eq!(
            requests(&h, now, &mut ignored).map(|t| t.0.remaining),
            Some(499)
        );
        let h = headers(&[
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "39000"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2023-11-14T22:13:21Z",
            ),
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "7000"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2023-11-14T22:13:50Z",
            ),
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", "2023-11-14T22:13:19Z"),
        ]);
        assert_eq!(
            tokens(&h, now, &mut ignored),
            Some((
                told(Some(8000), 7000, Duration::from_secs(30)),
                Vendor::Anthropic
            ))
        );
        // A reset in the past: the budget is back now.
        assert_eq!(
            requests(&h, now, &mut ignored),
            Some((told(Some(50), 49, Duration::ZERO), Vendor::Anthropic))
        );
        assert_eq!(ignored, 0);
        let h = headers(&[
            ("anthropic-ratelimit-tokens-limit", "-1"),
            ("anthropic-ratelimit-tokens-remaining", "10"),
            ("anthropic-ratelimit-tokens-reset", "soon"),
        ]);
        assert_eq!(tokens(&h, now, &mut ignored), None);
        assert_eq!(ignored, 2);
    }
}
