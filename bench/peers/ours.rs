//! The project under test (`tower-redis-ratelimit`), through its public API only: a
//! `RateLimitLayer` with GCRA, keyed by the same request extension the other layers read.
//! Variants: the default store (multiplexed, deny cache on), deny cache off, exact batching,
//! unit leases (50 ms), and the in-memory store, with the rate-limit fields on every response
//! or on denials only (`MemoryLean`).
//!
//! This crate's copy of the harness's contender, on the crate's module paths;
//! `bash scripts/peers [--pin]` puts it in the harness's build copy and runs the harness.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};
use tower_redis_ratelimit::{
    rate_limit::UnitLease, store::redis::Batching, store::Store, Gcra, MemoryStore, Quota,
    RateLimitLayer, RateLimiter, RedisStore,
};

use crate::contenders::trl::{request, UserId};
use crate::harness::{Contender, Env, Worker, Workload, HOT_PER_SEC};

#[derive(Clone, Copy, Debug)]
pub enum Variant {
    Default,
    NoDenyCache,
    Batched,
    Leased,
    Memory,
    /// In memory, the rate-limit fields on denials only (`headers_on_denials_only`).
    MemoryLean,
}

type KeyFn = fn(&http::request::Parts) -> Option<u64>;
type Inner = tower::util::ServiceFn<fn(Request<()>) -> std::future::Ready<Result<Response<Body>, Infallible>>>;
type Svc = <RateLimitLayer<KeyFn, Gcra> as Layer<Inner>>::Service;

fn ok_ready(_req: Request<()>) -> std::future::Ready<Result<Response<Body>, Infallible>> {
    std::future::ready(Ok(Response::new(Body::empty())))
}

fn user_key(parts: &http::request::Parts) -> Option<u64> {
    parts.extensions.get::<UserId>().map(|u| u.0)
}

pub struct Ours {
    svc: Svc,
}

impl Ours {
    pub async fn new(env: &Env, v: Variant) -> anyhow::Result<Self> {
        // Same limits as the peers: hot = 100/s with a burst of 100; spread = never limited.
        // hot-allowed is one key that never reaches its limit: unit leases answer it above
        // 10^6 checks a second, so its burst is 10^9 (as the memory store's below, and as
        // governor's 10^9 a second); at 10^6 a second with a burst of 10^6 the leased key
        // came close to its limit within the window, its leases were granted a few hundred
        // units, and the checks waiting for them went to Redis one at a time.
        let quota = match env.workload {
            Workload::Hot => Quota::per_second(HOT_PER_SEC as u32),
            Workload::Spread => Quota::per_second(1_000_000),
            Workload::HotAllowed => Quota::per_second(1_000_000).burst(1_000_000_000),
        };
        let limiter = match v {
            // In memory ours runs past 10^6 checks a second: a burst of 10^9 keeps `spread` and
            // `hot-allowed` never limited (as governor's 10^9 a second with a burst of 10^6).
            Variant::Memory | Variant::MemoryLean => {
                let quota = match env.workload {
                    Workload::Hot => quota,
                    Workload::Spread | Workload::HotAllowed => quota.burst(1_000_000_000),
                };
                build(MemoryStore::new(), quota, &env.prefix, None, false)?
            }
            _ => {
                let mut s = RedisStore::connect(&env.redis_url).await?;
                if let Variant::Batched = v {
                    s = s.with_batching(Batching::new())?;
                }
                let cache = matches!(v, Variant::NoDenyCache).then_some(0);
                build(s, quota, &env.prefix, cache, matches!(v, Variant::Leased))?
            }
        };
        let mut layer = RateLimitLayer::new(limiter, user_key as KeyFn);
        if let Variant::MemoryLean = v {
            layer = layer.headers_on_denials_only();
        }
        let inner: Inner = tower::service_fn(ok_ready as fn(_) -> _);
        Ok(Self { svc: layer.layer(inner) })
    }
}

fn build(
    store: impl Store,
    quota: Quota,
    prefix: &str,
    deny_cache: Option<usize>,
    leased: bool,
) -> anyhow::Result<RateLimiter<Gcra>> {
    let mut b = RateLimiter::builder(store, Gcra::new(quota)?)
        .prefix(prefix.to_string())
        .store_timeout(Duration::from_secs(1));
    if let Some(n) = deny_cache {
        b = b.deny_cache(n);
    }
    if leased {
        b = b.lease(UnitLease::up_to(Duration::from_millis(50)));
    }
    Ok(b.build()?)
}

pub struct OursWorker {
    svc: Svc,
}

impl Contender for Ours {
    type W = OursWorker;
    fn worker(&self) -> OursWorker {
        OursWorker { svc: self.svc.clone() }
    }
}

impl Worker for OursWorker {
    async fn check(&mut self, id: u64) -> anyhow::Result<bool> {
        let resp = self.svc.ready().await?.call(request(id)).await?;
        match resp.status() {
            StatusCode::OK => Ok(true),
            StatusCode::TOO_MANY_REQUESTS => Ok(false),
            s => anyhow::bail!("status {s}"),
        }
    }
}
