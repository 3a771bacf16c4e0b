//! Tests that need no server and no process: `MemoryStore` and its manual clock, key
//! extractors and hostile input, headers, the layers' answers and configuration in memory.
//! This binary does not compile `tests/servers` and passes with no `redis-server` installed
//! (`cargo test --test memory`).
//!
//! A suite that runs one driver on Redis and in memory keeps both runs in `redis/`; only tests
//! of nothing but memory live here. See `tests/README.md` for where a new test goes.

mod common;
// The upstreams' limits for the throttle's tests (in the other binaries, under `servers`).
#[path = "common/upstream_limits.rs"]
mod upstream_limits;

#[path = "memory/admin.rs"]
mod admin;
#[path = "memory/algorithms.rs"]
mod algorithms;
#[path = "memory/concurrency.rs"]
mod concurrency;
#[path = "memory/counting.rs"]
mod counting;
#[path = "memory/delays.rs"]
mod delays;
#[path = "memory/hostile_input.rs"]
mod hostile_input;
#[path = "memory/layer.rs"]
mod layer;
#[path = "memory/manual_clock.rs"]
mod manual_clock;
#[path = "memory/quotas.rs"]
mod quotas;
#[cfg(feature = "rls")]
#[path = "memory/rls.rs"]
mod rls;
#[path = "memory/throttle_clock.rs"]
mod throttle_clock;
#[path = "memory/throttle_pacing.rs"]
mod throttle_pacing;
#[path = "memory/unit_leases.rs"]
mod unit_leases;
#[path = "memory/usage.rs"]
mod usage;
