//! The HTTP shell every middleware of this crate shares: how the limiter answers (a `429`, a
//! `503`, a gRPC status, a custom rejection), the rate-limit headers, the key of a request
//! (and what happens without one), and the response body, which may hold a guard (a
//! concurrency permit) until it ends.

mod body;
mod forbidden;
pub(crate) mod headers;
mod key;
mod responder;
mod stamp;

pub(crate) use self::{
    body::{box_body, OnTrailers},
    forbidden::forbidden,
    key::{key_of, Keyed},
    responder::{is_grpc, Responder},
    stamp::{PolicyField, Stamp},
};
pub use self::{
    body::{BoxError, ResponseBody},
    headers::HeaderStyle,
    responder::QUOTA_EXCEEDED,
};
