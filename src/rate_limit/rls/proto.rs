//! The messages of Envoy's rate limit service (`envoy.service.ratelimit.v3`), written with
//! prost's derive from the protocol's definitions: the fields a rate limit service reads and
//! answers, with their numbers. Fields this service never sets or reads are left out; prost
//! skips them on decoding, as protobuf does with any unknown field.

/// `envoy.service.ratelimit.v3.RateLimitRequest`: a domain and the descriptors to decide.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    /// The domain: which rules apply.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// The descriptors, each decided against the domain's rules.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// The units each descriptor takes when it does not say (0: one).
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`: a list of key/value entries.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The entries, outermost first.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// A limit the caller asks for instead of the rule's (not used by this service).
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// The units this descriptor takes, over the request's `hits_addend`.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Entry {
    /// The entry's key, e.g. `remote_address`.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The entry's value, e.g. `10.0.0.1`.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitOverride {
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// The unit (`Unit` as a number).
    #[prost(enumeration = "Unit", tag = "2")]
    pub unit: i32,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct UInt64Value {
    /// The value.
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `google.protobuf.Duration`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct ProtoDuration {
    /// Whole seconds.
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    /// Nanoseconds past the seconds.
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    /// `OVER_LIMIT` when any descriptor not in shadow mode is over its limit, else `OK`.
    #[prost(enumeration = "Code", tag = "1")]
    pub overall_code: i32,
    /// One status per descriptor of the request, in its order.
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    /// Headers for the downstream response (`x-ratelimit-*` when asked).
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    /// Headers for the upstream request.
    #[prost(message, repeated, tag = "4")]
    pub request_headers_to_add: Vec<HeaderValue>,
}

/// `RateLimitResponse.Code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Code {
    /// Not decided.
    Unknown = 0,
    /// Within the limit.
    Ok = 1,
    /// Over the limit.
    OverLimit = 2,
}

/// `RateLimitResponse.RateLimit`: the limit a descriptor was decided against.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimit {
    /// The rule's name, when it has one.
    #[prost(string, tag = "3")]
    pub name: String,
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// The unit (`Unit` as a number).
    #[prost(enumeration = "Unit", tag = "2")]
    pub unit: i32,
}

/// `RateLimitResponse.RateLimit.Unit` (the numbers of `envoy.type.v3.RateLimitUnit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Unit {
    /// No unit.
    Unknown = 0,
    /// A second.
    Second = 1,
    /// A minute.
    Minute = 2,
    /// An hour.
    Hour = 3,
    /// A day.
    Day = 4,
    /// A calendar month.
    Month = 5,
    /// A calendar year.
    Year = 6,
    /// A calendar week.
    Week = 7,
}

/// `RateLimitResponse.DescriptorStatus`: one descriptor's decision.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    /// `OK` or `OVER_LIMIT`.
    #[prost(enumeration = "Code", tag = "1")]
    pub code: i32,
    /// The limit it was decided against; none for a descriptor no rule limits.
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    /// The units left in the limit after this request.
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    /// How long until the limit is whole again (for a fixed window: its end).
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<ProtoDuration>,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HeaderValue {
    /// The header's name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The header's value.
    #[prost(string, tag = "2")]
    pub value: String,
}
