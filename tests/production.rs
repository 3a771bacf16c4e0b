//! Redis as it runs in production and as it fails: Cluster specifics (failover, resharding,
//! scripts lost on a node, idle connections), TLS and mutual TLS, AUTH and ACL users,
//! Sentinel with failover, the connection's life (idle closes, cuts, timeouts), refusals
//! (`OOM`, `READONLY`, `NOAUTH`, `BUSY`, `LOADING`), dead and paused servers, restarts under
//! load, and a bounded soak.
//!
//! See `tests/README.md` for where a new test goes.

mod common;
mod servers;

#[path = "production/cluster.rs"]
mod cluster;
#[path = "production/cluster_tls.rs"]
mod cluster_tls;
#[path = "production/connection.rs"]
mod connection;
#[path = "production/failures.rs"]
mod failures;
#[path = "production/refusals.rs"]
mod refusals;
#[path = "production/regions.rs"]
mod regions;
#[path = "production/reliability.rs"]
mod reliability;
#[path = "production/sentinel.rs"]
mod sentinel;
#[path = "production/soak.rs"]
mod soak;
#[path = "production/tls_and_auth.rs"]
mod tls_and_auth;
