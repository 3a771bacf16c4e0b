//! The answer to a request whose key or address is on a layer's deny list: `403`, as
//! problem+json when the layer writes problem details, gRPC `PERMISSION_DENIED` to a gRPC
//! client. No rate-limit field: no limit was asked.

use bytes::Bytes;
use http::{header::CONTENT_TYPE, HeaderValue, Response, StatusCode};

use super::ResponseBody;

/// The `403` (or gRPC `PERMISSION_DENIED`) of a denied-listed request.
pub(crate) fn forbidden<B>(problem_details: bool, grpc: bool) -> Response<ResponseBody<B>> {
    let (body, content_type, status) = if grpc {
        (Bytes::new(), "application/grpc", StatusCode::OK)
    } else if problem_details {
        (
            Bytes::from_static(
                b"{\"type\":\"about:blank\",\"title\":\"Forbidden\",\"status\":403,\"detail\":\"this client is not allowed\"}",
            ),
            "application/problem+json",
            StatusCode::FORBIDDEN,
        )
    } else {
        (
            Bytes::from_static(b"forbidden\n"),
            "text/plain; charset=utf-8",
            StatusCode::FORBIDDEN,
        )
    };
    let mut res = Response::new(ResponseBody::full(body));
    *res.status_mut() = status;
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if grpc {
        // A "trailers-only" gRPC response: the status in the headers.
        h.insert("grpc-status", HeaderValue::from_static("7"));
        h.insert(
            "grpc-message",
            HeaderValue::from_static("this client is not allowed"),
        );
    }
    res
}
