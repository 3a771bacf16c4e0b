//! Several regions: one limit per key across regions, each deciding against its own Redis.
//!
//! (Filled in below.)
