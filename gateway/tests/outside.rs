//! The gateway run as a process, the way operators run it (the binary Cargo builds for these
//! tests, `CARGO_BIN_EXE_gateway`): its flags and output lines, on memory, Redis, Cluster, TLS
//! and Sentinel; its admin listener (`/metrics`, `/top`, `/keys`, `/bans`) on several
//! instances; several regions; reloads. The flags and lines tested here are contracts: a test
//! names them exactly as a user types or reads them.
//!
//! The servers the tests start (redis-server standalone, Cluster, Sentinel, TLS; proxies, an
//! upstream) are the library's test servers, shared from `tests/servers/`.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/servers/mod.rs"]
mod servers;

#[path = "outside/bans.rs"]
mod bans;
#[path = "outside/delays.rs"]
mod delays;
#[path = "outside/gateway.rs"]
mod gateway;
#[path = "outside/gateway_production.rs"]
mod gateway_production;
#[path = "outside/lifecycle.rs"]
mod lifecycle;
#[path = "outside/operators.rs"]
mod operators;
#[path = "outside/proxy.rs"]
mod proxy;
#[path = "outside/regions.rs"]
mod regions;
#[path = "outside/rls.rs"]
mod rls;
#[path = "outside/steer.rs"]
mod steer;
#[path = "outside/telemetry.rs"]
mod telemetry;
#[path = "outside/usage.rs"]
mod usage;
