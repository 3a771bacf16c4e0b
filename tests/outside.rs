//! The examples run as processes, the way users run them (the binaries `cargo test` builds
//! with the examples): the gateway demo with its flags and output lines, on memory, Redis,
//! Cluster, TLS and Sentinel, its admin listener (`/metrics`, `/top`) on several instances;
//! the tonic example read by two gRPC clients; the outbound and backfill examples. The flags and lines tested
//! here are contracts: a test names them exactly as a user types or reads them.
//!
//! See `tests/README.md` for where a new test goes.

mod common;
mod servers;

#[path = "outside/gateway.rs"]
mod gateway;
#[path = "outside/gateway_production.rs"]
mod gateway_production;
#[path = "outside/grpc_retry_info.rs"]
mod grpc_retry_info;
#[path = "outside/operators.rs"]
mod operators;
#[path = "outside/outbound.rs"]
mod outbound;
#[path = "outside/regions.rs"]
mod regions;
#[path = "outside/steer.rs"]
mod steer;
