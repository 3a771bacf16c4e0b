//! Responses the limiter writes itself: rejections and store-failure answers.

use std::{fmt, sync::Arc, time::Duration};

use base64::Engine as _;
use bytes::Bytes;
use http::{
    header::{CONTENT_TYPE, RETRY_AFTER},
    HeaderMap, HeaderName, HeaderValue, Response, StatusCode,
};

use super::{
    body::{BoxBody, ResponseBody},
    headers::{ceil_secs, render_concurrency, render_with, HeaderStyle},
    stamp::{render_with_field, PolicyField},
};
use crate::decision::Decision;

/// A user-supplied rejection: builds the response for a refused request from what refused it
/// (`T`: a rate limit's [`Decision`], a concurrency limit's refusal). The limiter adds its
/// headers unless the response already has them.
pub(crate) type RejectFn<T> = dyn Fn(&T) -> Response<BoxBody> + Send + Sync;

/// gRPC status code RESOURCE_EXHAUSTED.
const GRPC_RESOURCE_EXHAUSTED: &str = "8";
/// gRPC status code UNAVAILABLE.
const GRPC_UNAVAILABLE: &str = "14";
/// RESOURCE_EXHAUSTED as a number, in `google.rpc.Status`.
const RESOURCE_EXHAUSTED_CODE: u8 = 8;

/// `grpc-message` of a rate limit's denial that can succeed later.
const GRPC_DENIED: &str = "rate limit exceeded";
/// `grpc-message` of a rate limit's denial that can never succeed.
const GRPC_NEVER: &str = "request cost exceeds the rate-limit quota";
/// `grpc-message` of a concurrency limit's refusal.
const GRPC_BUSY: &str = "concurrency limit exceeded";
/// `grpc-message` when the store failed and the policy is closed.
const GRPC_UNAVAILABLE_MESSAGE: &str = "rate limiter unavailable";

/// The status with its details (gRPC's richer error model): a serialized `google.rpc.Status`,
/// base64 without padding, as gRPC writes binary metadata (and tonic emits it).
const GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");
/// How long a gRPC client's retry policy waits before its next attempt, in milliseconds;
/// negative: do not retry (gRFC A6).
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
/// The `Any` type of `google.rpc.RetryInfo`.
const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";
/// The longest `google.protobuf.Duration` (10,000 years).
const MAX_RETRY_DELAY: Duration = Duration::new(315_576_000_000, 999_999_999);
/// The longest pushback written: `i32::MAX` ms (24.8 days), the most that gRPC clients
/// parsing it as a 32-bit integer (grpc-java) read as a wait rather than "do not retry".
const MAX_PUSHBACK_MS: u64 = i32::MAX as u64;

/// The RFC 9457 problem type for a request over its quota (draft-ietf-httpapi-ratelimit-headers).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// How a layer answers: header style and rejection of what `T` describes.
pub(crate) struct Responder<T: ?Sized> {
    pub(crate) style: HeaderStyle,
    /// The fields on denials only: an allowed response carries none.
    pub(crate) denials_only: bool,
    pub(crate) reject: Option<Arc<RejectFn<T>>>,
    pub(crate) problem_details: bool,
}

impl<T: ?Sized> Clone for Responder<T> {
    fn clone(&self) -> Self {
        Self {
            style: self.style,
            denials_only: self.denials_only,
            reject: self.reject.clone(),
            problem_details: self.problem_details,
        }
    }
}

impl<T: ?Sized> Default for Responder<T> {
    fn default() -> Self {
        Self {
            style: HeaderStyle::default(),
            denials_only: false,
            reject: None,
            problem_details: false,
        }
    }
}

/// A JSON string literal (quotes, backslashes and control characters escaped).
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// An RFC 9457 `application/problem+json` body for a denied decision.
fn problem_response<B>(d: &Decision) -> Response<ResponseBody<B>> {
    let detail = match d.retry_after {
        Some(wait) => format!(
            "cost {} exceeds the {} units left; retry in {} s",
            d.cost,
            d.remaining,
            ceil_secs(wait).max(1)
        ),
        None => format!("cost {} exceeds the quota of {}", d.cost, d.capacity),
    };
    let violated: Vec<String> = if d.limits.is_empty() {
        vec![json_string(&d.policy)]
    } else {
        d.limits
            .iter()
            .filter(|l| l.violated())
            .map(|l| json_string(&l.name))
            .collect()
    };
    problem_json(&detail, &violated)
}

/// A `429` with an RFC 9457 `quota-exceeded` body: `detail`, and the `violated` policies as
/// JSON strings.
fn problem_json<B>(detail: &str, violated: &[String]) -> Response<ResponseBody<B>> {
    let body = format!(
        "{{\"type\":{},\"title\":\"Request cannot be satisfied as assigned quota has been exceeded\",\"status\":429,\"detail\":{},\"violated-policies\":[{}]}}",
        json_string(QUOTA_EXCEEDED),
        json_string(detail),
        violated.join(",")
    );
    let mut res = Response::new(ResponseBody::full(Bytes::from(body)));
    *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

impl<T: ?Sized> fmt::Debug for Responder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Responder")
            .field("style", &self.style)
            .field("denials_only", &self.denials_only)
            .field("custom_rejection", &self.reject.is_some())
            .field("problem_details", &self.problem_details)
            .finish()
    }
}

/// Whether the request is gRPC (`content-type: application/grpc`, `application/grpc+proto`…).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A "trailers-only" gRPC response: HTTP 200 with the status in the headers. `message` is
/// written as it is: it must be printable ASCII without `%`, which `grpc-message` carries
/// unencoded (anything else would need percent-encoding).
fn grpc_response<B>(status: &'static str, message: &'static str) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::full(Bytes::new()));
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from_static(status));
    h.insert("grpc-message", HeaderValue::from_static(message));
    res
}

/// A rate limit's gRPC denial: `RESOURCE_EXHAUSTED` with, when the request can succeed later,
/// the wait as a `google.rpc.RetryInfo` in `grpc-status-details-bin` (to the nanosecond) and
/// as `grpc-retry-pushback-ms` (rounded up); when it never can, a pushback of `-1` (do not
/// retry) and no details. The wait is at least 1 ms: a denial never asks for a retry at once.
fn grpc_denial<B>(d: &Decision) -> Response<ResponseBody<B>> {
    let Some(wait) = d.retry_after else {
        let mut res = grpc_response(GRPC_RESOURCE_EXHAUSTED, GRPC_NEVER);
        res.headers_mut()
            .insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
        return res;
    };
    let wait = wait.clamp(Duration::from_millis(1), MAX_RETRY_DELAY);
    let mut res = grpc_response(GRPC_RESOURCE_EXHAUSTED, GRPC_DENIED);
    let h = res.headers_mut();
    h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(pushback_ms(wait)));
    let details = retry_info_status(RESOURCE_EXHAUSTED_CODE, GRPC_DENIED, wait);
    let details = base64::engine::general_purpose::STANDARD_NO_PAD.encode(details);
    h.insert(
        GRPC_STATUS_DETAILS,
        HeaderValue::try_from(details).expect("base64 is a valid header value"),
    );
    res
}

/// `wait` in whole milliseconds, rounded up, at most [`MAX_PUSHBACK_MS`].
fn pushback_ms(wait: Duration) -> u64 {
    let ms = wait.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).map_or(MAX_PUSHBACK_MS, |ms| ms.min(MAX_PUSHBACK_MS))
}

/// The protobuf encoding of `google.rpc.Status { code, message, details: [Any {
/// type_url: RetryInfo's, value: RetryInfo { retry_delay: Duration { seconds, nanos } } }] }`.
/// Each nested message is its parent's last field, so once every length is known the bytes
/// are written front to back, into one buffer of the exact size. Zero numbers are left out,
/// as proto3 writes them.
fn retry_info_status(code: u8, message: &str, delay: Duration) -> Vec<u8> {
    let (secs, nanos) = (delay.as_secs(), u64::from(delay.subsec_nanos()));
    let duration = int_field_len(secs) + int_field_len(nanos);
    let retry_info = len_field_len(duration);
    let any = len_field_len(RETRY_INFO_TYPE_URL.len()) + len_field_len(retry_info);
    let status = int_field_len(code.into()) + len_field_len(message.len()) + len_field_len(any);
    let mut out = Vec::with_capacity(status);
    int_field(&mut out, 1, code.into()); // Status.code
    len_field(&mut out, 2, message.len()); // Status.message
    out.extend_from_slice(message.as_bytes());
    len_field(&mut out, 3, any); // Status.details[0]: Any
    len_field(&mut out, 1, RETRY_INFO_TYPE_URL.len()); // Any.type_url
    out.extend_from_slice(RETRY_INFO_TYPE_URL.as_bytes());
    len_field(&mut out, 2, retry_info); // Any.value: RetryInfo
    len_field(&mut out, 1, duration); // RetryInfo.retry_delay: Duration
    int_field(&mut out, 1, secs); // Duration.seconds
    int_field(&mut out, 2, nanos); // Duration.nanos
    debug_assert_eq!(out.len(), status);
    out
}

/// Appends `v` as a protobuf varint: 7 bits a byte, low bits first.
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The bytes of `v` as a varint.
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Appends field `field` (1 to 15: a one-byte key) as a varint, unless it is zero.
fn int_field(out: &mut Vec<u8>, field: u8, v: u64) {
    if v != 0 {
        out.push(field << 3); // wire type 0, varint
        varint(out, v);
    }
}

fn int_field_len(v: u64) -> usize {
    if v == 0 {
        0
    } else {
        1 + varint_len(v)
    }
}

/// Appends the key and length of field `field` (1 to 15), length-delimited; `len` bytes of
/// content follow.
fn len_field(out: &mut Vec<u8>, field: u8, len: usize) {
    out.push(field << 3 | 2); // wire type 2, length-delimited
    varint(out, len as u64);
}

fn len_field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn text_response<B>(status: StatusCode, body: Bytes) -> Response<ResponseBody<B>> {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_PLAIN));
    response_with(status, headers, body)
}

/// A response of `status` with `headers` and `body`.
fn response_with<B>(
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::full(body));
    *res.status_mut() = status;
    *res.headers_mut() = headers;
    res
}

/// The content type of the limiter's plain-text answers.
const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

impl<T: ?Sized> Responder<T> {
    /// The response when the store failed and the policy is closed.
    pub(crate) fn unavailable<B>(&self, grpc: bool) -> Response<ResponseBody<B>> {
        let mut res = if grpc {
            grpc_response(GRPC_UNAVAILABLE, GRPC_UNAVAILABLE_MESSAGE)
        } else {
            text_response(
                StatusCode::SERVICE_UNAVAILABLE,
                Bytes::from_static(b"rate limiter unavailable\n"),
            )
        };
        res.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        res
    }

    /// Adds `headers` to a custom rejection, except those it set itself.
    fn merge_headers<B>(headers: HeaderMap, mut res: Response<B>) -> Response<B> {
        // Each header the rejection did not set itself, with all its values (several limits
        // give several `RateLimit` list members).
        let mut current = None;
        for (name, value) in headers {
            if let Some(name) = name {
                current = (!res.headers().contains_key(&name)).then_some(name);
            }
            if let Some(name) = &current {
                res.headers_mut().append(name.clone(), value);
            }
        }
        res
    }
}

impl Responder<Decision> {
    /// Adds the rate-limit headers of an allowed decision to the inner service's response.
    /// A denial here is one let through in shadow mode: its headers say what would have
    /// happened, but no `Retry-After` is added (one the inner service set stays).
    pub(crate) fn allowed<B>(&self, d: &Decision, res: &mut Response<B>, pk: Option<&str>) {
        let headers = res.headers_mut();
        if d.allowed {
            render_with(self.style, d, pk, headers);
            return;
        }
        let own: Vec<_> = headers.get_all(RETRY_AFTER).iter().cloned().collect();
        render_with(self.style, d, pk, headers);
        headers.remove(RETRY_AFTER);
        for v in own {
            headers.append(RETRY_AFTER, v);
        }
    }

    /// The response to a denied request. A gRPC denial also carries the wait as
    /// `google.rpc.RetryInfo` and `grpc-retry-pushback-ms` (see [`grpc_denial`]).
    #[cfg(test)]
    pub(crate) fn denied<B>(
        &self,
        d: &Decision,
        grpc: bool,
        pk: Option<&str>,
    ) -> Response<ResponseBody<B>> {
        self.denied_with(d, grpc, pk, None)
    }

    /// The response to a denied request. A gRPC denial also carries the wait as
    /// `google.rpc.RetryInfo` and `grpc-retry-pushback-ms` (see [`grpc_denial`]). `field`:
    /// the policy's own `RateLimit-Policy` member, rendered ahead, used when it is that of
    /// `d`.
    pub(crate) fn denied_with<B>(
        &self,
        d: &Decision,
        grpc: bool,
        pk: Option<&str>,
        field: Option<&PolicyField>,
    ) -> Response<ResponseBody<B>> {
        // Responses built here carry no rate-limit header of their own: render straight into
        // them. A custom rejection's own headers win (merged below).
        let mut res = if grpc {
            grpc_denial(d)
        } else if let Some(reject) = &self.reject {
            let mut headers = HeaderMap::new();
            render_with_field(self.style, d, pk, field, &mut headers);
            return Self::merge_headers(headers, reject(d).map(ResponseBody::boxed));
        } else if self.problem_details {
            problem_response(d)
        } else if d.is_never() {
            text_response(
                StatusCode::TOO_MANY_REQUESTS,
                Bytes::from(format!(
                    "request cost {} exceeds the quota of {}: it can never be allowed\n",
                    d.cost, d.capacity
                )),
            )
        } else {
            let body = Bytes::from_static(b"rate limit exceeded\n");
            let content_type = HeaderValue::from_static(TEXT_PLAIN);
            let head = field.and_then(|f| f.denial_head(self.style, d, pk, &content_type));
            if let Some(headers) = head {
                return response_with(StatusCode::TOO_MANY_REQUESTS, headers, body);
            }
            text_response(StatusCode::TOO_MANY_REQUESTS, body)
        };
        render_with_field(self.style, d, pk, field, res.headers_mut());
        res
    }
}

impl<T: ?Sized> Responder<T> {
    /// The response to a request refused by a concurrency limit (`refusal`, what a custom
    /// rejection is given): `429` (gRPC: `RESOURCE_EXHAUSTED`) in the style of a rate limit's
    /// denial, with the concurrency headers (no permit free) and no `Retry-After`: when a
    /// permit frees depends on the requests in flight. For the same reason a gRPC refusal
    /// has no `google.rpc.RetryInfo` and no `grpc-retry-pushback-ms`: a client's retry policy
    /// backs off as it is configured to.
    pub(crate) fn busy<B>(
        &self,
        refusal: &T,
        policy: &str,
        limit: u32,
        grpc: bool,
    ) -> Response<ResponseBody<B>> {
        if let (Some(reject), false) = (&self.reject, grpc) {
            let mut headers = HeaderMap::new();
            render_concurrency(self.style, policy, limit, 0, &mut headers);
            return Self::merge_headers(headers, reject(refusal).map(ResponseBody::boxed));
        }
        let mut res = if grpc {
            grpc_response(GRPC_RESOURCE_EXHAUSTED, GRPC_BUSY)
        } else if self.problem_details {
            let detail = format!(
                "{limit} requests of this key are in flight, the most allowed at once; retry when one ends"
            );
            problem_json(&detail, &[json_string(policy)])
        } else {
            text_response(
                StatusCode::TOO_MANY_REQUESTS,
                Bytes::from_static(b"concurrency limit exceeded\n"),
            )
        };
        render_concurrency(self.style, policy, limit, 0, res.headers_mut());
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn problem_details_body() {
        let d = Decision {
            allowed: false,
            capacity: 10,
            remaining: 1,
            reset_after: Duration::from_secs(9),
            retry_after: Some(Duration::from_millis(2_500)),
            window: Duration::from_secs(60),
            cost: 3,
            policy: Arc::from("free-tier"),
            ..Decision::sample()
        };
        let r: Responder<Decision> = Responder {
            problem_details: true,
            ..Responder::default()
        };
        let res: Response<ResponseBody<http_body_util_free::Empty>> = r.denied(&d, false, None);
        assert_eq!(res.status(), 429);
        assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(res.headers()["retry-after"], "3");
        assert_eq!(json_string("a\"b\\c\n"), r#""a\"b\\c\u000a""#);
    }

    fn denial(retry_after: Option<Duration>) -> Decision {
        Decision {
            allowed: false,
            capacity: 3,
            remaining: 0,
            reset_after: Duration::from_secs(60),
            retry_after,
            window: Duration::from_secs(60),
            cost: 1,
            policy: Arc::from("default"),
            ..Decision::sample()
        }
    }

    /// The gRPC denial of `d` as tonic's client reads it, with the response's headers.
    fn grpc_denied(d: &Decision) -> (tonic::Status, HeaderMap) {
        let r: Responder<Decision> = Responder::default();
        let res: Response<ResponseBody<http_body_util_free::Empty>> = r.denied(d, true, None);
        assert_eq!(res.status(), 200);
        let status = tonic::Status::from_header_map(res.headers()).expect("a grpc-status");
        (status, res.headers().clone())
    }

    /// What tonic-types (prost) writes for the same status, and what it reads back from ours.
    fn check_encoding(delay: Duration) {
        use prost::Message as _;
        use tonic_types::{pb, ErrorDetails, StatusExt as _};

        let ours = retry_info_status(RESOURCE_EXHAUSTED_CODE, GRPC_DENIED, delay);
        let reference = tonic::Status::with_error_details(
            tonic::Code::ResourceExhausted,
            GRPC_DENIED,
            ErrorDetails::with_retry_info(Some(delay)),
        );
        assert_eq!(ours, reference.details(), "{delay:?}");

        let status = pb::Status::decode(&ours[..]).unwrap();
        assert_eq!(status.code, tonic::Code::ResourceExhausted as i32);
        assert_eq!(status.message, GRPC_DENIED);
        assert_eq!(status.details.len(), 1);
        assert_eq!(status.details[0].type_url, tonic_types::RetryInfo::TYPE_URL);
        let info = pb::RetryInfo::decode(&status.details[0].value[..]).unwrap();
        let d = info.retry_delay.expect("a retry delay");
        assert_eq!(
            (d.seconds, d.nanos),
            (delay.as_secs() as i64, delay.subsec_nanos() as i32)
        );
    }

    #[test]
    fn retry_info_status_is_what_prost_writes() {
        for delay in [
            Duration::from_millis(1),
            Duration::from_nanos(1_000_001),
            Duration::from_millis(2_500),
            Duration::from_secs(20),
            Duration::new(19, 999_999_999),
            Duration::new(86_400 * 365, 1),
            MAX_RETRY_DELAY,
        ] {
            check_encoding(delay);
        }
    }

    proptest::proptest! {
        #[test]
        fn any_delay_is_encoded_as_prost_does(
            secs in 0..=MAX_RETRY_DELAY.as_secs(),
            nanos in 0..1_000_000_000u32,
        ) {
            check_encoding(Duration::new(secs, nanos));
        }
    }

    #[test]
    fn grpc_denial_carries_retry_info_and_pushback() {
        use tonic_types::StatusExt as _;

        let (status, headers) = grpc_denied(&denial(Some(Duration::from_micros(2_500_001))));
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(status.message(), GRPC_DENIED);
        let info = status.get_details_retry_info().expect("RetryInfo");
        assert_eq!(info.retry_delay, Some(Duration::from_micros(2_500_001)));
        assert_eq!(headers[&GRPC_RETRY_PUSHBACK_MS], "2501");
        assert_eq!(headers[RETRY_AFTER], "3");
        assert_eq!(headers["ratelimit"], "\"default\";r=0;t=3");
        // Binary metadata is written as gRPC does: base64 without padding.
        let details = headers[&GRPC_STATUS_DETAILS].to_str().unwrap();
        assert!(!details.contains('='), "{details}");
    }

    #[test]
    fn grpc_pushback_rounds_up_to_whole_milliseconds() {
        use tonic_types::StatusExt as _;

        for (wait, pushback, delay) in [
            (Duration::from_nanos(1), 1, Duration::from_millis(1)),
            (Duration::ZERO, 1, Duration::from_millis(1)),
            (Duration::from_millis(1), 1, Duration::from_millis(1)),
            (
                Duration::from_micros(1_001),
                2,
                Duration::from_micros(1_001),
            ),
            (Duration::from_secs(20), 20_000, Duration::from_secs(20)),
            (
                Duration::from_secs(30 * 86_400),
                MAX_PUSHBACK_MS,
                Duration::from_secs(30 * 86_400),
            ),
            (
                Duration::from_secs(2 * MAX_RETRY_DELAY.as_secs()),
                MAX_PUSHBACK_MS,
                MAX_RETRY_DELAY,
            ),
        ] {
            let (status, headers) = grpc_denied(&denial(Some(wait)));
            assert_eq!(
                headers[&GRPC_RETRY_PUSHBACK_MS],
                pushback.to_string().as_str(),
                "{wait:?}"
            );
            let info = status.get_details_retry_info().expect("RetryInfo");
            assert_eq!(info.retry_delay, Some(delay), "{wait:?}");
        }
    }

    #[test]
    fn grpc_denial_that_can_never_succeed_says_do_not_retry() {
        let (status, headers) = grpc_denied(&denial(None));
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(status.message(), GRPC_NEVER);
        assert!(status.details().is_empty(), "{:?}", status.details());
        assert!(!headers.contains_key(&GRPC_STATUS_DETAILS));
        assert_eq!(headers[&GRPC_RETRY_PUSHBACK_MS], "-1");
        assert!(!headers.contains_key(RETRY_AFTER));
    }

    #[test]
    fn grpc_refusal_of_a_concurrency_limit_has_no_wait() {
        let r: Responder<()> = Responder::default();
        let res: Response<ResponseBody<http_body_util_free::Empty>> =
            r.busy(&(), "default", 2, true);
        let h = res.headers();
        assert_eq!(h["grpc-status"], GRPC_RESOURCE_EXHAUSTED);
        assert_eq!(h["grpc-message"], GRPC_BUSY);
        for name in [GRPC_STATUS_DETAILS, GRPC_RETRY_PUSHBACK_MS, RETRY_AFTER] {
            assert!(!h.contains_key(&name), "{name}: {h:?}");
        }
    }

    /// `grpc-message` is percent-encoded, except printable ASCII other than `%`: the messages
    /// are written as they are, so they must be in that set.
    #[test]
    fn grpc_messages_need_no_percent_encoding() {
        for message in [GRPC_DENIED, GRPC_NEVER, GRPC_BUSY, GRPC_UNAVAILABLE_MESSAGE] {
            assert!(
                message
                    .bytes()
                    .all(|b| (0x20..=0x7e).contains(&b) && b != b'%'),
                "{message}"
            );
        }
    }

    mod http_body_util_free {
        /// A body type for the test's type parameter; never polled.
        pub(crate) struct Empty;
    }
}
