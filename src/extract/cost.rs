//! How many units a request costs.

use http::request::Parts;

/// A request's cost in units, from its head (see
/// [`RateLimitLayer::cost`](crate::RateLimitLayer::cost)).
pub(crate) type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;
