//! Responses the limiter writes itself: rejections and store-failure answers.

use std::{fmt, sync::Arc};

use bytes::Bytes;
use http::{
    header::{CONTENT_TYPE, RETRY_AFTER},
    HeaderMap, HeaderValue, Response, StatusCode,
};

use super::{
    body::{BoxBody, ResponseBody},
    headers::{ceil_secs, render_concurrency, render_with, HeaderStyle},
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

/// The RFC 9457 problem type for a request over its quota (draft-ietf-httpapi-ratelimit-headers).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// How a layer answers: header style and rejection of what `T` describes.
pub(crate) struct Responder<T: ?Sized> {
    pub(crate) style: HeaderStyle,
    pub(crate) reject: Option<Arc<RejectFn<T>>>,
    pub(crate) problem_details: bool,
}

impl<T: ?Sized> Clone for Responder<T> {
    fn clone(&self) -> Self {
        Self {
            style: self.style,
            reject: self.reject.clone(),
            problem_details: self.problem_details,
        }
    }
}

impl<T: ?Sized> Default for Responder<T> {
    fn default() -> Self {
        Self {
            style: HeaderStyle::default(),
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
        None => format!("cost {} exceeds the quota of {}", d.cost, d.limit),
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

fn grpc_response<B>(status: &'static str, message: &'static str) -> Response<ResponseBody<B>> {
    // A "trailers-only" gRPC response: HTTP 200 with the status in the headers.
    let mut res = Response::new(ResponseBody::full(Bytes::new()));
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from_static(status));
    h.insert("grpc-message", HeaderValue::from_static(message));
    res
}

fn text_response<B>(status: StatusCode, body: Bytes) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::full(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

impl<T: ?Sized> Responder<T> {
    /// The response when the store failed and the policy is closed.
    pub(crate) fn unavailable<B>(&self, grpc: bool) -> Response<ResponseBody<B>> {
        let mut res = if grpc {
            grpc_response(GRPC_UNAVAILABLE, "rate limiter unavailable")
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

    /// The response to a denied request.
    pub(crate) fn denied<B>(
        &self,
        d: &Decision,
        grpc: bool,
        pk: Option<&str>,
    ) -> Response<ResponseBody<B>> {
        // Responses built here carry no rate-limit header of their own: render straight into
        // them. A custom rejection's own headers win (merged below).
        let mut res = if grpc {
            let message = if d.is_never() {
                "request cost exceeds the rate-limit quota"
            } else {
                "rate limit exceeded"
            };
            grpc_response(GRPC_RESOURCE_EXHAUSTED, message)
        } else if let Some(reject) = &self.reject {
            let mut headers = HeaderMap::new();
            render_with(self.style, d, pk, &mut headers);
            return Self::merge_headers(headers, reject(d).map(ResponseBody::boxed));
        } else if self.problem_details {
            problem_response(d)
        } else if d.is_never() {
            text_response(
                StatusCode::TOO_MANY_REQUESTS,
                Bytes::from(format!(
                    "request cost {} exceeds the quota of {}: it can never be allowed\n",
                    d.cost, d.limit
                )),
            )
        } else {
            text_response(
                StatusCode::TOO_MANY_REQUESTS,
                Bytes::from_static(b"rate limit exceeded\n"),
            )
        };
        render_with(self.style, d, pk, res.headers_mut());
        res
    }
}

impl<T: ?Sized> Responder<T> {
    /// The response to a request refused by a concurrency limit (`refusal`, what a custom
    /// rejection is given): `429` (gRPC: `RESOURCE_EXHAUSTED`) in the style of a rate limit's
    /// denial, with the concurrency headers (no permit free) and no `Retry-After`: when a
    /// permit frees depends on the requests in flight.
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
            grpc_response(GRPC_RESOURCE_EXHAUSTED, "concurrency limit exceeded")
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
            limit: 10,
            remaining: 1,
            reset_after: Duration::from_secs(9),
            retry_after: Some(Duration::from_millis(2_500)),
            window: Duration::from_secs(60),
            cost: 3,
            policy: Arc::from("free-tier"),
            degraded: false,
            source: crate::decision::Source::Store,
            shadow: false,
            banned: false,
            binding: 0,
            limits: Vec::new(),
            charge: None,
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

    mod http_body_util_free {
        /// A body type for the test's type parameter; never polled.
        pub(crate) struct Empty;
    }
}
