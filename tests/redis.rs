//! Tests against `redis-server`s the tests start (standalone, with batching, a local Cluster
//! of three primaries) in their normal life: every algorithm's script, exactness under
//! concurrency, batching, refunds and counting, concurrency limits, the deny cache, unit
//! leases, quotas, policies, shadow mode, the throttle and the adaptive throttle against a
//! local HTTP upstream, gRPC through tonic, metrics; each suite's in-memory twin beside its
//! Redis runs. What a feature does when its own Redis is killed or stalled mid-test is
//! checked here too.
//!
//! See `tests/README.md` for where a new test goes.

mod common;
mod servers;

#[path = "redis/adaptive.rs"]
mod adaptive;
#[path = "redis/agreement.rs"]
mod agreement;
#[path = "redis/algorithms.rs"]
mod algorithms;
#[path = "redis/autoban.rs"]
mod autoban;
#[path = "redis/bad_keys.rs"]
mod bad_keys;
#[path = "redis/batching.rs"]
mod batching;
#[path = "redis/budgets.rs"]
mod budgets;
#[path = "redis/clock.rs"]
mod clock;
#[path = "redis/composition.rs"]
mod composition;
#[path = "redis/concurrency.rs"]
mod concurrency;
#[path = "redis/counting.rs"]
mod counting;
#[path = "redis/deny_cache.rs"]
mod deny_cache;
#[path = "redis/exactness.rs"]
mod exactness;
#[path = "redis/grpc.rs"]
mod grpc;
#[path = "redis/layer.rs"]
mod layer;
#[path = "redis/metrics_facade.rs"]
mod metrics_facade;
#[path = "redis/policies.rs"]
mod policies;
#[path = "redis/quotas.rs"]
mod quotas;
#[path = "redis/recipe.rs"]
mod recipe;
#[path = "redis/refunds.rs"]
mod refunds;
#[path = "redis/settlements.rs"]
mod settlements;
#[path = "redis/shadow.rs"]
mod shadow;
#[path = "redis/throttle.rs"]
mod throttle;
#[path = "redis/tokens.rs"]
mod tokens;
#[path = "redis/unit_leases.rs"]
mod unit_leases;
#[path = "redis/usage.rs"]
mod usage;
