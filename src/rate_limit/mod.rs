//! The server middleware: [`RateLimitLayer`] takes a key from each request, asks its policy's
//! limiter, and calls the inner service only when the request is allowed; the response gets
//! the rate-limit headers, a denied request a `429` (gRPC: `RESOURCE_EXHAUSTED`).
//!
//! `config` holds what the layer and its services share, so that neither imports the other.

mod body;
mod config;
mod counting;
mod future;
pub mod headers;
mod layer;
pub mod response;
mod service;
mod stamp;

pub use self::{
    body::{BoxError, ResponseBody},
    config::{Class, MissingKey, PolicyId},
    counting::StatusSet,
    future::ResponseFuture,
    headers::HeaderStyle,
    layer::RateLimitLayer,
    service::RateLimit,
};
