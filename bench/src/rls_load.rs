//! The load of scripts/bench-rls: `tasks` tokio tasks, each calling its target in a loop
//! (gRPC `ShouldRateLimit` over one of a few HTTP/2 connections, or the bare Redis pipeline
//! over one of as many multiplexed Redis connections), a warm-up, then a measured span
//! bracketed by the callers' snapshots of the processes' CPU time.

use std::{
    sync::{
        atomic::{AtomicU8, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use tonic::transport::Channel;
use tower_redis_ratelimit::{
    rate_limit::rls::{
        proto::{Code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse},
        SHOULD_RATE_LIMIT,
    },
    redis,
};

/// The ids of the spread workloads: each descriptor's value is one of these many.
pub const SPREAD: u64 = 100_000;

/// What each request asks: one descriptor per key, each `key=ID` (spread) or `key=hot`.
pub struct Workload {
    pub name: &'static str,
    pub keys: &'static [&'static str],
    pub hot: bool,
}

pub const WORKLOADS: [Workload; 4] = [
    Workload {
        name: "1 descriptor, spread",
        keys: &["k"],
        hot: false,
    },
    Workload {
        name: "1 descriptor, hot",
        keys: &["k"],
        hot: true,
    },
    Workload {
        name: "3 descriptors, spread",
        keys: &["a", "b", "c"],
        hot: false,
    },
    Workload {
        name: "3 descriptors, hot",
        keys: &["a", "b", "c"],
        hot: true,
    },
];

impl Workload {
    /// Each descriptor's `(key, value)`, the values drawn from `rng` (each independently).
    fn entries(&self, rng: &mut u64) -> Vec<(&'static str, String)> {
        self.keys
            .iter()
            .map(|&key| {
                let value = if self.hot {
                    "hot".to_owned()
                } else {
                    (xorshift(rng) % SPREAD).to_string()
                };
                (key, value)
            })
            .collect()
    }
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

/// Who answers: a rate limit service over gRPC, or Redis itself (the bare pipeline).
#[derive(Clone)]
pub enum Target {
    Grpc(tonic::client::Grpc<Channel>),
    Bare(redis::aio::MultiplexedConnection),
}

enum Outcome {
    Ok,
    OverLimit,
    Failed,
}

impl Target {
    /// `conns` connections to the service at `addr` (HTTP/2, cleartext).
    pub async fn grpc(addr: std::net::SocketAddr, conns: usize) -> Vec<Target> {
        let mut targets = Vec::new();
        for _ in 0..conns {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("endpoint")
                .tcp_nodelay(true)
                .connect()
                .await
                .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
            targets.push(Target::Grpc(tonic::client::Grpc::new(channel)));
        }
        targets
    }

    /// `conns` multiplexed connections to Redis at `url`.
    pub async fn bare(url: &str, conns: usize) -> Vec<Target> {
        let client = redis::Client::open(url).expect("redis URL");
        let mut targets = Vec::new();
        for _ in 0..conns {
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("cannot connect to the benchmark redis");
            targets.push(Target::Bare(conn));
        }
        targets
    }

    async fn call(&mut self, entries: Vec<(&'static str, String)>) -> Outcome {
        match self {
            Target::Grpc(grpc) => match ask(grpc, entries).await {
                Ok(r) if r.overall_code() == Code::Ok => Outcome::Ok,
                Ok(r) if r.overall_code() == Code::OverLimit => Outcome::OverLimit,
                _ => Outcome::Failed,
            },
            Target::Bare(conn) => {
                // One INCRBY and one PEXPIRE per descriptor, in one pipeline per decision.
                let mut pipe = redis::pipe();
                for (key, value) in entries {
                    let k = format!("bench:{key}:{value}");
                    pipe.cmd("INCRBY").arg(&k).arg(1).ignore();
                    pipe.cmd("PEXPIRE").arg(&k).arg(60_000).ignore();
                }
                match pipe.query_async::<()>(conn).await {
                    Ok(()) => Outcome::Ok,
                    Err(_) => Outcome::Failed,
                }
            }
        }
    }
}

async fn ask(
    grpc: &mut tonic::client::Grpc<Channel>,
    entries: Vec<(&'static str, String)>,
) -> Result<RateLimitResponse, tonic::Status> {
    let request = RateLimitRequest {
        domain: "bench".into(),
        descriptors: entries
            .into_iter()
            .map(|(key, value)| RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.into(),
                    value,
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    };
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<RateLimitRequest, RateLimitResponse>::default();
    grpc.unary(
        tonic::Request::new(request),
        http::uri::PathAndQuery::from_static(SHOULD_RATE_LIMIT),
        codec,
    )
    .await
    .map(tonic::Response::into_inner)
}

/// One run's counts over its measured span.
pub struct Measured {
    /// Requests answered `OK` or `OVER_LIMIT`.
    pub decisions: u64,
    pub ok: u64,
    pub over: u64,
    pub failed: u64,
    pub secs: f64,
    /// Latency in µs of the decisions of the measured span.
    pub latency: Histogram<u64>,
}

/// The longest a call may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const DONE: u8 = 2;

/// Runs `tasks` tasks over `targets` (task `i` on target `i % targets.len()`): `warmup`, then
/// `span` measured, `snapshot` called right before and right after it.
pub async fn drive(
    targets: Vec<Target>,
    tasks: usize,
    workload: &'static Workload,
    warmup: Duration,
    span: Duration,
    mut snapshot: impl FnMut(),
) -> Measured {
    let phase = Arc::new(AtomicU8::new(WARMING));
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let mut target = targets[i % targets.len()].clone();
            let phase = Arc::clone(&phase);
            tokio::spawn(async move {
                let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ ((i as u64 + 1) << 32);
                let mut counts = [0_u64; 3];
                let mut latency = Histogram::<u64>::new(3).unwrap();
                loop {
                    let entries = workload.entries(&mut rng);
                    let start = Instant::now();
                    // A call that takes longer than `CALL_TIMEOUT` fails (a server that stops
                    // answering does not hang the benchmark).
                    let outcome = tokio::time::timeout(CALL_TIMEOUT, target.call(entries))
                        .await
                        .unwrap_or(Outcome::Failed);
                    match phase.load(Ordering::Relaxed) {
                        MEASURING => {
                            counts[outcome as usize] += 1;
                            let _ = latency.record(start.elapsed().as_micros() as u64);
                        }
                        DONE => return (counts, latency),
                        _ => {}
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(warmup).await;
    snapshot();
    let start = Instant::now();
    phase.store(MEASURING, Ordering::Relaxed);
    tokio::time::sleep(span).await;
    phase.store(DONE, Ordering::Relaxed);
    let secs = start.elapsed().as_secs_f64();
    snapshot();
    let mut measured = Measured {
        decisions: 0,
        ok: 0,
        over: 0,
        failed: 0,
        secs,
        latency: Histogram::new(3).unwrap(),
    };
    for handle in handles {
        let (counts, latency) = handle.await.expect("a load task panicked");
        measured.ok += counts[Outcome::Ok as usize];
        measured.over += counts[Outcome::OverLimit as usize];
        measured.failed += counts[Outcome::Failed as usize];
        measured.latency.add(&latency).unwrap();
    }
    // A failed call (an error, `UNKNOWN`) is no decision.
    measured.decisions = measured.ok + measured.over;
    measured
}
