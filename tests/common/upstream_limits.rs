//! The limit of a third-party API, as the outbound tests (the `memory` binary, and `servers`)
//! and the outbound benchmark (`bench/src/upstream.rs`) play it: four kinds of limit, four
//! ways of telling it, on whatever clock the caller reads (a test's manual clock, or the wall
//! clock). No I/O here: a server wraps it.
#![allow(dead_code)]

use std::{collections::VecDeque, time::Duration};

/// How the upstream counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `quota` calls per window aligned to whole multiples of the window.
    Fixed,
    /// `quota` calls in any window ending now.
    Rolling,
    /// A bucket of `quota` tokens refilled at `quota` per window.
    TokenBucket,
    /// A fixed window that tells nothing but `Retry-After` on a 429.
    RetryAfterOnly,
}

/// How the upstream tells its limit (ignored by [`Kind::RetryAfterOnly`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// `RateLimit-Policy: "up";q=Q;w=W` and `RateLimit: "up";r=R;t=T`.
    Ietf,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (seconds from now).
    Draft,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` as a Unix time.
    XUnix,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` in seconds from now.
    XDelta,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "fixed" => Kind::Fixed,
            "rolling" => Kind::Rolling,
            "bucket" => Kind::TokenBucket,
            "retry-after" => Kind::RetryAfterOnly,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Fixed => "fixed",
            Kind::Rolling => "rolling",
            Kind::TokenBucket => "bucket",
            Kind::RetryAfterOnly => "retry-after",
        }
    }
}

impl Style {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ietf" => Style::Ietf,
            "draft" => Style::Draft,
            "x-unix" => Style::XUnix,
            "x-delta" => Style::XDelta,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Style::Ietf => "ietf",
            Style::Draft => "draft",
            Style::XUnix => "x-unix",
            Style::XDelta => "x-delta",
        }
    }
}

/// One answer: admitted or 429, and the headers that tell the limit.
#[derive(Debug, Clone)]
pub struct Answer {
    pub allowed: bool,
    pub headers: Vec<(&'static str, String)>,
}

/// An upstream's limit and what it counted.
#[derive(Debug)]
pub struct Limits {
    pub kind: Kind,
    pub style: Style,
    pub quota: u64,
    pub window: Duration,
    /// Fixed windows: the current window's index and its calls.
    fixed: (u64, u64),
    /// Rolling window: the admitted calls' times.
    log: VecDeque<Duration>,
    /// Token bucket: tokens (in millionths) and when they were counted.
    bucket: Option<(u128, Duration)>,
    pub ok: u64,
    pub limited: u64,
}

/// Whole seconds, rounded up (as resets are told).
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl Limits {
    /// `quota` calls per `window` (a whole number of seconds).
    pub fn new(kind: Kind, style: Style, quota: u64, window: Duration) -> Self {
        assert!(quota > 0 && window >= Duration::from_secs(1) && window.subsec_nanos() == 0);
        Self {
            kind,
            style,
            quota,
            window,
            fixed: (0, 0),
            log: VecDeque::new(),
            bucket: None,
            ok: 0,
            limited: 0,
        }
    }

    /// A call at `now` (since the Unix epoch): admitted or not, the units left, the time until
    /// the window resets (or the bucket is full), and until a call would be admitted.
    fn count(&mut self, now: Duration) -> (bool, u64, Duration, Duration) {
        let w = self.window;
        match self.kind {
            Kind::Fixed | Kind::RetryAfterOnly => {
                let index = (now.as_nanos() / w.as_nanos()) as u64;
                if self.fixed.0 != index {
                    self.fixed = (index, 0);
                }
                let allowed = self.fixed.1 < self.quota;
                self.fixed.1 += u64::from(allowed);
                let end = w * (index as u32 + 1);
                let reset = end.saturating_sub(now);
                (allowed, self.quota - self.fixed.1, reset, reset)
            }
            Kind::Rolling => {
                while self.log.front().is_some_and(|&t| t + w <= now) {
                    self.log.pop_front();
                }
                let allowed = (self.log.len() as u64) < self.quota;
                if allowed {
                    self.log.push_back(now);
                }
                let oldest = self
                    .log
                    .front()
                    .map_or(Duration::ZERO, |&t| (t + w).saturating_sub(now));
                (allowed, self.quota - self.log.len() as u64, oldest, oldest)
            }
            Kind::TokenBucket => {
                const UNIT: u128 = 1_000_000;
                let full = u128::from(self.quota) * UNIT;
                let (tokens, at) = self.bucket.unwrap_or((full, now));
                // Refill: quota per window, in millionths of a token per nanosecond.
                let refill = now.saturating_sub(at).as_nanos() * full / w.as_nanos();
                let mut tokens = (tokens + refill).min(full);
                let allowed = tokens >= UNIT;
                if allowed {
                    tokens -= UNIT;
                }
                self.bucket = Some((tokens, now));
                let per_token = w / self.quota as u32;
                let until_full = Duration::from_nanos(
                    ((full - tokens) * w.as_nanos() / full).min(u64::MAX as u128) as u64,
                );
                let until_one = if tokens >= UNIT {
                    Duration::ZERO
                } else {
                    Duration::from_nanos(((UNIT - tokens) * per_token.as_nanos() / UNIT) as u64)
                };
                (allowed, (tokens / UNIT) as u64, until_full, until_one)
            }
        }
    }

    /// Answers a call at `now` (since the Unix epoch).
    pub fn call(&mut self, now: Duration) -> Answer {
        let (allowed, left, reset, next) = self.count(now);
        if allowed {
            self.ok += 1;
        } else {
            self.limited += 1;
        }
        let mut headers = Vec::new();
        let (q, t) = (self.quota, ceil_secs(reset));
        if self.kind != Kind::RetryAfterOnly {
            match self.style {
                Style::Ietf => {
                    let w = self.window.as_secs();
                    headers.push(("ratelimit-policy", format!("\"up\";q={q};w={w}")));
                    headers.push(("ratelimit", format!("\"up\";r={left};t={t}")));
                }
                Style::Draft => {
                    headers.push(("ratelimit-limit", q.to_string()));
                    headers.push(("ratelimit-remaining", left.to_string()));
                    headers.push(("ratelimit-reset", t.to_string()));
                }
                Style::XUnix | Style::XDelta => {
                    headers.push(("x-ratelimit-limit", q.to_string()));
                    headers.push(("x-ratelimit-remaining", left.to_string()));
                    let reset = match self.style {
                        Style::XUnix => ceil_secs(now + reset),
                        _ => t,
                    };
                    headers.push(("x-ratelimit-reset", reset.to_string()));
                }
            }
        }
        if !allowed {
            headers.push(("retry-after", ceil_secs(next).max(1).to_string()));
        }
        Answer { allowed, headers }
    }

    /// Calls answered 429 out of all.
    pub fn limited_share(&self) -> f64 {
        self.limited as f64 / (self.ok + self.limited).max(1) as f64
    }
}
