//! The rate-limit headers of an allowed response, rendered when the decision is made, before
//! the inner service answers: the response future then carries two header values instead of
//! the whole decision and what it takes to render it.

use std::{sync::Arc, time::Duration};

use arc_swap::ArcSwapOption;
use http::{header::CONTENT_TYPE, HeaderMap, HeaderValue};

use super::headers::{
    ceil_secs, number, policy_item, push_sf_string, render_legacy, render_with, reset_secs,
    state_item, valid_pk, value, write_u64, HeaderStyle, RATELIMIT, RATELIMIT_POLICY,
    X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use crate::decision::{Admitted, Decision};

/// A policy's `RateLimit-Policy` member for its configured quota, rendered once when the
/// layer is built (it is the same on every response of the policy), and the start of its
/// `RateLimit` member (`"name";r=`).
#[derive(Debug, Clone)]
pub(crate) struct PolicyField {
    name: Arc<str>,
    limit: u64,
    window: Duration,
    value: HeaderValue,
    state: Arc<[u8]>,
    /// The `RateLimit` members with no unit left, by `t` (below [`EMPTY_MEMBERS`]), rendered
    /// ahead: every denial of a flooded key carries one of them.
    empty: Arc<[HeaderValue]>,
    /// The heads of plain-text denials with no unit left, by `t` (below [`EMPTY_MEMBERS`]),
    /// each made by the first such denial: the denials of a flooded key carry the same
    /// fields for a second or more, and a copy of a whole head costs less than its fields
    /// one by one. Shared by the field's clones.
    denials: Arc<[ArcSwapOption<DenialHead>]>,
}

/// The head of a plain-text denial with no unit left, and the style it was made in (its `t`
/// is its place).
#[derive(Debug)]
struct DenialHead {
    style: HeaderStyle,
    headers: HeaderMap,
}

/// Room for a `RateLimit` member on the stack: the name's start and two numbers.
const STATE_LEN: usize = 96;

/// Whether a member of this start (`"name";r=`) fits in [`STATE_LEN`] with its numbers: two
/// `u64`s of at most 20 digits and `;t=`.
fn fits(start: &[u8]) -> bool {
    start.len() + 43 <= STATE_LEN
}

/// How many `RateLimit` members with no unit left a policy keeps rendered: `t` of 0 to 63 s.
const EMPTY_MEMBERS: u64 = 64;

impl PolicyField {
    pub(crate) fn new(name: &Arc<str>, limit: u64, window: Duration) -> Self {
        let mut state = Vec::new();
        push_sf_string(&mut state, name);
        state.extend_from_slice(b";r=");
        let empty = match fits(&state) {
            false => Vec::new(),
            true => (0..EMPTY_MEMBERS)
                .map(|t| render_state(&state, 0, Some(t)))
                .collect(),
        };
        Self {
            name: Arc::clone(name),
            limit,
            window,
            value: policy_item(name, limit, window, None),
            state: state.into(),
            empty: empty.into(),
            denials: (0..EMPTY_MEMBERS).map(|_| ArcSwapOption::empty()).collect(),
        }
    }

    /// The head of a plain-text denial `d` of this policy in `style` (`content-type`, then
    /// the fields [`render_with_field`] adds), without a partition key: with no unit left and
    /// `t` below [`EMPTY_MEMBERS`], a copy of the one made first, else made now. `None` when
    /// `d` is not a single limit of this policy's quota, or has a partition key.
    pub(crate) fn denial_head(
        &self,
        style: HeaderStyle,
        d: &Decision,
        pk: Option<&str>,
        content_type: &HeaderValue,
    ) -> Option<HeaderMap> {
        if d.allowed || !d.limits.is_empty() || valid_pk(pk).is_some() {
            return None;
        }
        if !self.matches(d.capacity, d.window) {
            return None;
        }
        let place = reset_secs(d)
            .filter(|_| d.remaining == 0)
            .and_then(|t| self.denials.get(usize::try_from(t).ok()?));
        if let Some(head) = place.map(ArcSwapOption::load) {
            if let Some(head) = head.as_deref().filter(|h| h.style == style) {
                return Some(head.headers.clone());
            }
        }
        let mut headers = HeaderMap::with_capacity(8);
        headers.insert(CONTENT_TYPE, content_type.clone());
        render_with_field(style, d, None, Some(self), &mut headers);
        if let Some(place) = place {
            let headers = headers.clone();
            place.store(Some(Arc::new(DenialHead { style, headers })));
        }
        Some(headers)
    }

    /// The policy's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The `RateLimit` member of a decision of this policy with `remaining` units left,
    /// without a partition key: the same bytes as [`state_item`]'s.
    fn state(&self, remaining: u64, t: Option<u64>) -> HeaderValue {
        // Two numbers of at most 20 digits and `;t=`.
        if !fits(&self.state) {
            return state_item(&self.name, remaining, t, None);
        }
        if remaining == 0 {
            let held = t.and_then(|t| self.empty.get(usize::try_from(t).ok()?));
            if let Some(member) = held {
                return member.clone();
            }
        }
        render_state(&self.state, remaining, t)
    }

    /// Whether this is the policy field of a decision of `capacity` units per `window`.
    /// Decisions of a policy carry its name, so only the quota can differ: a quota given per
    /// request, or the local share of a degraded decision.
    fn matches(&self, capacity: u64, window: Duration) -> bool {
        capacity == self.limit && window == self.window
    }
}

/// A `RateLimit` member from its start (`"name";r=`, one that [`fits`]), the units
/// left and `t`.
fn render_state(start: &[u8], remaining: u64, t: Option<u64>) -> HeaderValue {
    let mut buf = [0u8; STATE_LEN];
    let mut len = start.len();
    buf[..len].copy_from_slice(start);
    len += write_u64(&mut buf[len..], remaining);
    if let Some(t) = t {
        buf[len..len + 3].copy_from_slice(b";t=");
        len += 3;
        len += write_u64(&mut buf[len..], t);
    }
    value(&buf[..len])
}

/// The headers [`render_with`](super::headers::render_with) would add to the response of an
/// allowed decision with a single limit, rendered ahead.
pub(crate) struct Stamp {
    /// `RateLimit-Policy` and `RateLimit`, appended.
    ietf: Option<(HeaderValue, HeaderValue)>,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset`, inserted.
    legacy: Option<(u64, u64, Option<u64>)>,
}

impl Stamp {
    /// The headers of `d` in `style`, with the IETF `pk` parameter when given; `field`: the
    /// policy's own `RateLimit-Policy` member, used when it matches. `None` when `d` is a
    /// denial or has several limits: render those from the decision.
    pub(crate) fn of(
        style: HeaderStyle,
        d: &Decision,
        pk: Option<&str>,
        field: Option<&PolicyField>,
    ) -> Option<Self> {
        if !d.allowed || !d.limits.is_empty() {
            return None;
        }
        let a = Admitted {
            remaining: d.remaining,
            capacity: d.capacity,
            window: d.window,
            reset_after: d.reset_after,
        };
        Some(Self::rendered(style, &d.policy, &a, valid_pk(pk), field))
    }

    /// The headers of an admission of `field`'s policy (`a`, a single limit), without a
    /// partition key: those [`of`](Self::of) renders for its decision.
    pub(crate) fn admitted(style: HeaderStyle, a: &Admitted, field: &PolicyField) -> Self {
        Self::rendered(style, &field.name, a, None, Some(field))
    }

    /// The headers of admission `a` of policy `name` in `style`: `field`'s member when it is
    /// that of `a` and there is no `pk`, else rendered.
    fn rendered(
        style: HeaderStyle,
        name: &str,
        a: &Admitted,
        pk: Option<&str>,
        field: Option<&PolicyField>,
    ) -> Self {
        let t = Some(ceil_secs(a.reset_after));
        let ietf = matches!(style, HeaderStyle::Ietf | HeaderStyle::Both).then(|| {
            match field.filter(|f| pk.is_none() && f.matches(a.capacity, a.window)) {
                Some(f) => (f.value.clone(), f.state(a.remaining, t)),
                None => (
                    policy_item(name, a.capacity, a.window, pk),
                    state_item(name, a.remaining, t, pk),
                ),
            }
        });
        let legacy = matches!(style, HeaderStyle::Legacy | HeaderStyle::Both).then_some((
            a.capacity,
            a.remaining,
            t,
        ));
        Self { ietf, legacy }
    }

    /// Adds the headers to a response, as `render_with` does: the IETF fields appended (after
    /// those of limiters further in), the legacy ones replacing earlier values.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some((policy, state)) = self.ietf {
            headers.append(RATELIMIT_POLICY, policy);
            headers.append(RATELIMIT, state);
        }
        if let Some((limit, remaining, t)) = self.legacy {
            headers.insert(X_RATELIMIT_LIMIT, number(limit));
            headers.insert(X_RATELIMIT_REMAINING, number(remaining));
            if let Some(t) = t {
                headers.insert(X_RATELIMIT_RESET, number(t));
            }
        }
    }
}

/// [`render_with`], with the policy's own `RateLimit-Policy` member (`field`) when it is
/// that of `d` (a single limit, the policy's quota, no partition key): the same bytes, with
/// one value cloned instead of rendered. For denials, rendered when the decision is made.
pub(crate) fn render_with_field(
    style: HeaderStyle,
    d: &Decision,
    pk: Option<&str>,
    field: Option<&PolicyField>,
    headers: &mut HeaderMap,
) {
    let own = field.filter(|f| {
        d.limits.is_empty() && valid_pk(pk).is_none() && f.matches(d.capacity, d.window)
    });
    match own {
        Some(f) => {
            let t = reset_secs(d);
            if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
                headers.append(RATELIMIT_POLICY, f.value.clone());
                headers.append(RATELIMIT, f.state(d.remaining, t));
            }
            render_legacy(style, d, t, headers);
        }
        None => render_with(style, d, pk, headers),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::headers::render_with;
    use proptest::prelude::*;

    fn decision(name: &str, limit: u64, remaining: u64, reset_us: u64, window_us: u64) -> Decision {
        Decision {
            allowed: true,
            capacity: limit,
            remaining,
            reset_after: Duration::from_micros(reset_us),
            retry_after: None,
            window: Duration::from_micros(window_us),
            cost: 1,
            policy: Arc::from(name),
            ..Decision::sample()
        }
    }

    fn stamped(
        style: HeaderStyle,
        d: &Decision,
        pk: Option<&str>,
        f: Option<&PolicyField>,
    ) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.append(RATELIMIT, HeaderValue::from_static("\"inner\";r=1"));
        h.insert(X_RATELIMIT_LIMIT, HeaderValue::from_static("7"));
        Stamp::of(style, d, pk, f)
            .expect("a single allowed limit")
            .apply(&mut h);
        h
    }

    fn rendered(style: HeaderStyle, d: &Decision, pk: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.append(RATELIMIT, HeaderValue::from_static("\"inner\";r=1"));
        h.insert(X_RATELIMIT_LIMIT, HeaderValue::from_static("7"));
        render_with(style, d, pk, &mut h);
        h
    }

    #[test]
    fn the_policy_field_is_used_for_its_own_quota_only() {
        let f = PolicyField::new(&Arc::from("api"), 100, Duration::from_secs(60));
        let d = decision("api", 100, 42, 17_500_000, 60_000_000);
        let h = stamped(HeaderStyle::Ietf, &d, None, Some(&f));
        assert_eq!(h["ratelimit-policy"], r#""api";q=100;w=60"#);
        let all: Vec<_> = h.get_all("ratelimit").iter().collect();
        assert_eq!(all, [r#""inner";r=1"#, r#""api";r=42;t=18"#]);
        // A quota given per request: rendered from the decision.
        let other = decision("api", 5, 4, 1, 1_000_000);
        let h = stamped(HeaderStyle::Ietf, &other, None, Some(&f));
        assert_eq!(h["ratelimit-policy"], r#""api";q=5;w=1"#);
        // Denials and several limits are rendered from the decision.
        let mut denied = d.clone();
        denied.allowed = false;
        assert!(Stamp::of(HeaderStyle::Ietf, &denied, None, Some(&f)).is_none());
    }

    /// Members with no unit left come rendered ahead for `t` below 64 s: the same bytes as
    /// rendered, allowed (the last unit taken) or denied, in every style, and beyond 64 s.
    #[test]
    fn members_with_nothing_left_are_the_rendered_ones() {
        for name in ["api", "a \"quoted\" name", &"n".repeat(60)] {
            let field = PolicyField::new(&Arc::from(name), 100, Duration::from_secs(60));
            for secs in 0..70u64 {
                for offset_us in [0, 1, 999_999] {
                    let us = (secs * 1_000_000).saturating_sub(offset_us);
                    let mut d = decision(name, 100, 0, us, 60_000_000);
                    for allowed in [true, false] {
                        d.allowed = allowed;
                        d.retry_after = (!allowed).then(|| Duration::from_micros(us));
                        for style in [HeaderStyle::Ietf, HeaderStyle::Both] {
                            let mut fielded = HeaderMap::new();
                            fielded.append(RATELIMIT, HeaderValue::from_static("\"inner\";r=1"));
                            fielded.insert(X_RATELIMIT_LIMIT, HeaderValue::from_static("7"));
                            render_with_field(style, &d, None, Some(&field), &mut fielded);
                            assert_eq!(fielded, rendered(style, &d, None), "{name} {us} {allowed}");
                            if allowed {
                                assert_eq!(
                                    stamped(style, &d, None, Some(&field)),
                                    rendered(style, &d, None)
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Headers rendered ahead are those `render_with` writes, byte for byte, in every
        /// style, with and without a partition key, with the policy's own field or another's.
        #[test]
        fn stamps_are_rendered_headers(
            name in prop_oneof!["[a-z:-]{0,12}", "[ -~]{0,80}", ".{0,8}"],
            limit in prop_oneof![1..1_000u64, any::<u64>()],
            remaining in prop_oneof![0..1_000u64, any::<u64>()],
            reset_us in any::<u64>(),
            window_us in prop_oneof![Just(60_000_000u64), any::<u64>()],
            style in prop_oneof![
                Just(HeaderStyle::Ietf), Just(HeaderStyle::Legacy),
                Just(HeaderStyle::Both), Just(HeaderStyle::None),
            ],
            pk in prop::option::of(prop_oneof!["[A-Za-z0-9+/=]{16}", Just("not base64!".to_owned())]),
            own_field in any::<bool>(),
        ) {
            let d = decision(&name, limit, remaining, reset_us, window_us);
            let field = if own_field {
                PolicyField::new(&Arc::from(name.as_str()), limit, d.window)
            } else {
                PolicyField::new(&Arc::from("other"), limit.wrapping_add(1), d.window)
            };
            let expected = rendered(style, &d, pk.as_deref());
            prop_assert_eq!(&stamped(style, &d, pk.as_deref(), Some(&field)), &expected);
            prop_assert_eq!(&stamped(style, &d, pk.as_deref(), None), &expected);
        }

        /// Headers rendered with the policy's field are those `render_with` writes, byte for
        /// byte, allowed or denied (with `Retry-After`), in every style, with and without a
        /// partition key, with the policy's own field or another's.
        #[test]
        fn fielded_headers_are_rendered_headers(
            name in prop_oneof!["[a-z:-]{0,12}", "[ -~]{0,80}", ".{0,8}"],
            limit in prop_oneof![1..1_000u64, any::<u64>()],
            remaining in prop_oneof![0..1_000u64, any::<u64>()],
            reset_us in any::<u64>(),
            retry_us in prop::option::of(prop_oneof![0..200_000_000u64, any::<u64>()]),
            window_us in prop_oneof![Just(60_000_000u64), any::<u64>()],
            allowed in any::<bool>(),
            style in prop_oneof![
                Just(HeaderStyle::Ietf), Just(HeaderStyle::Legacy),
                Just(HeaderStyle::Both), Just(HeaderStyle::None),
            ],
            pk in prop::option::of(prop_oneof!["[A-Za-z0-9+/=]{16}", Just("not base64!".to_owned())]),
            own_field in any::<bool>(),
        ) {
            let mut d = decision(&name, limit, remaining, reset_us, window_us);
            d.allowed = allowed;
            d.retry_after = retry_us.filter(|_| !allowed).map(Duration::from_micros);
            let field = if own_field {
                PolicyField::new(&Arc::from(name.as_str()), limit, d.window)
            } else {
                PolicyField::new(&Arc::from("other"), limit.wrapping_add(1), d.window)
            };
            let mut fielded = HeaderMap::new();
            fielded.append(RATELIMIT, HeaderValue::from_static("\"inner\";r=1"));
            fielded.insert(X_RATELIMIT_LIMIT, HeaderValue::from_static("7"));
            render_with_field(style, &d, pk.as_deref(), Some(&field), &mut fielded);
            prop_assert_eq!(&fielded, &rendered(style, &d, pk.as_deref()));
        }

        /// Every denial head a policy field hands out, in any order of decisions (repeated,
        /// `t` or `Retry-After` changing across a second, units left, styles, another quota,
        /// a partition key), is the head made from scratch: `content-type`, then the fields
        /// `render_with` writes, byte for byte. Heads made for another quota or with a
        /// partition key are none.
        #[test]
        fn denial_heads_are_rendered_heads(
            name in prop_oneof!["[a-z:-]{0,12}", "[ -~]{0,80}"],
            checks in prop::collection::vec((
                prop_oneof![Just(0u64), 0..3u64],
                prop_oneof![0..3_000_000u64, any::<u64>()],
                prop::option::of(prop_oneof![0..3_000_000u64, 62_000_000..66_000_000u64, any::<u64>()]),
                prop_oneof![
                    Just(HeaderStyle::Ietf), Just(HeaderStyle::Legacy),
                    Just(HeaderStyle::Both), Just(HeaderStyle::None),
                ],
                0..8u8,
            ), 1..24),
        ) {
            let field = PolicyField::new(&Arc::from(name.as_str()), 100, Duration::from_secs(60));
            let content_type = HeaderValue::from_static("text/plain; charset=utf-8");
            for (remaining, reset_us, retry_us, style, other) in checks {
                let mut d = decision(&name, 100, remaining, reset_us, 60_000_000);
                d.allowed = false;
                d.retry_after = retry_us.map(Duration::from_micros);
                let pk = (other == 1).then_some("YWJjZGVmZ2hpamtsbW5vcA==");
                if other == 2 {
                    d.capacity = 99;
                }
                let head = field.denial_head(style, &d, pk, &content_type);
                if other == 1 || other == 2 {
                    prop_assert!(head.is_none());
                    continue;
                }
                let mut expected = HeaderMap::new();
                expected.insert(CONTENT_TYPE, content_type.clone());
                render_with(style, &d, None, &mut expected);
                prop_assert_eq!(head, Some(expected));
            }
        }
    }
}
