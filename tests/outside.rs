//! The examples run as processes, the way users run them (the binaries `cargo test` builds
//! with the examples): the tonic example read by two gRPC clients; the outbound and backfill
//! examples. The flags and lines tested here are contracts: a test names them exactly as a
//! user types or reads them. The gateway's are in `gateway/tests/`.
//!
//! See `tests/README.md` for where a new test goes.

mod common;
mod servers;

#[path = "outside/grpc_retry_info.rs"]
mod grpc_retry_info;
#[path = "outside/outbound.rs"]
mod outbound;
