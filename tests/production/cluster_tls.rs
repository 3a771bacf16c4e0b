//! Redis Cluster over TLS, on a real local cluster whose nodes serve clients and talk to each
//! other over TLS with certificates made here: exact limits on keys spread over every primary,
//! mutual TLS, and a server certificate the client does not trust failing at connect.

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::common::limiter;
use crate::servers::{keys_with_pttl, tls::Certs, RedisCluster};
use tower_redis_ratelimit::{redis, Error, Gcra, Quota, RateLimiter, RedisStore};

/// Connections open on `node` to `port` (from `CLIENT LIST`'s `laddr`).
fn clients_on_port(node: &crate::servers::RedisServer, port: u16) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut node.conn())
        .unwrap();
    let laddr = format!("laddr=127.0.0.1:{port} ");
    list.lines().filter(|l| l.contains(&laddr)).count()
}

/// The index of the one node of `cluster` that holds the keys of a check (`base` and any key
/// under it), with their PTTLs there; asked on the plain ports with `KEYS`, which a node
/// answers for its own slots without `MOVED`.
fn node_holding(cluster: &RedisCluster, base: &str) -> (usize, Vec<(String, i64)>) {
    let holders: Vec<(usize, Vec<(String, i64)>)> = cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (i, keys_with_pttl(&mut n.conn(), &format!("{base}*"))))
        .filter(|(_, keys)| !keys.is_empty())
        .collect();
    assert_eq!(holders.len(), 1, "{base} is held by nodes {holders:?}");
    holders.into_iter().next().unwrap()
}

/// Describes a connect result for the report, and returns the error.
fn expect_connect_error(what: &str, result: Result<RedisStore, Error>, took: Duration) -> Error {
    let e = match result {
        Ok(_) => panic!("{what}: connected, but should have failed"),
        Err(e) => e,
    };
    match &e {
        Error::Connect(c) => println!(
            "{what}: failed after {took:?} with Error::Connect, kind {:?}, message {:?}",
            c.kind(),
            c.message()
        ),
        other => println!("{what}: failed after {took:?} with {other:?}"),
    }
    println!("{what}: Display: {e}");
    println!("{what}: Debug: {e:?}");
    e
}

/// Two app instances, each with its own TLS cluster connection, share exact limits on six
/// keys that land on every primary; every connection the store opened is to a TLS port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cluster_limits_are_exact_on_keys_over_every_primary() {
    let certs = Certs::make("cluster CA");
    let cluster = RedisCluster::start_tls(3, &certs, false);
    let urls = cluster.tls_urls();
    let mut limiters: Vec<Arc<RateLimiter<Gcra>>> = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::builder()
            .ca_pem(Certs::read(&certs.ca))
            .connect_cluster(&urls)
            .await
            .expect("TLS cluster connect with the test CA");
        limiters.push(Arc::new(limiter(
            store,
            Gcra::new(Quota::per_hour(5)).unwrap(),
            "tlsc",
        )));
    }

    let keys: Vec<String> = (0..6).map(|i| format!("user{i}")).collect();
    let mut tasks = Vec::new();
    for key in &keys {
        for i in 0..8 {
            let (limiter, key) = (Arc::clone(&limiters[i % 2]), key.clone());
            tasks.push(tokio::spawn(async move {
                let allowed = limiter
                    .check(&key, 1)
                    .await
                    .expect("check over TLS")
                    .allowed;
                (key, allowed)
            }));
        }
    }
    let mut allowed = std::collections::BTreeMap::<String, u32>::new();
    for t in tasks {
        let (key, ok) = t.await.unwrap();
        *allowed.entry(key).or_default() += u32::from(ok);
    }
    println!("allowed per key (limit 5, 8 checks each): {allowed:?}");
    for key in &keys {
        assert_eq!(allowed.get(key), Some(&5), "{key}: {allowed:?}");
    }

    // Where the keys are, looked at from the plain ports.
    let tls_ports = cluster.tls_ports();
    let mut used = BTreeSet::new();
    for key in &keys {
        let stored = limiters[0].storage_key(key);
        let (node, stored_keys) = node_holding(&cluster, &stored);
        assert!(
            stored_keys.iter().all(|(_, pttl)| *pttl > 0),
            "{stored_keys:?}"
        );
        println!("{key} -> {stored_keys:?} on node tls:{}", tls_ports[node]);
        used.insert(node);
    }
    // The six keys' slots fall in each third of the slot range, so on each primary.
    assert_eq!(
        used.len(),
        cluster.nodes.len(),
        "keys on nodes {used:?} only, of {tls_ports:?}"
    );
    // The stores talk to every node that holds a key on its TLS port.
    for &node in &used {
        let n = clients_on_port(&cluster.nodes[node], tls_ports[node]);
        println!(
            "node tls:{}: {n} client connections on the TLS port",
            tls_ports[node]
        );
        assert!(n >= 1, "no client on the TLS port of node {node}");
    }
    println!(
        "keys on {} of {} primaries: {used:?}",
        used.len(),
        cluster.nodes.len()
    );
}

/// A server certificate signed by a CA the client does not trust fails at connect, and so
/// do the system roots (which do not hold the test CA); the right CA connects.
#[tokio::test]
async fn tls_cluster_with_an_untrusted_ca_fails_at_connect() {
    let certs = Certs::make("cluster CA");
    let other = Certs::make("some other CA");
    let cluster = RedisCluster::start_tls(3, &certs, false);
    let urls = cluster.tls_urls();

    let store = RedisStore::builder()
        .ca_pem(Certs::read(&certs.ca))
        .connect_cluster(&urls)
        .await
        .expect("the right CA connects");
    let l = limiter(store, Gcra::new(Quota::per_hour(1)).unwrap(), "tlsu");
    assert!(l.check("k", 1).await.unwrap().allowed);
    assert!(!l.check("k", 1).await.unwrap().allowed);

    let timeout = Duration::from_secs(2);
    let started = Instant::now();
    let result = RedisStore::builder()
        .connect_timeout(timeout)
        .ca_pem(Certs::read(&other.ca))
        .connect_cluster(&urls)
        .await;
    let took = started.elapsed();
    expect_connect_error("untrusted CA", result, took);
    assert!(took < timeout + Duration::from_secs(1), "{took:?}");

    let started = Instant::now();
    let result = RedisStore::builder()
        .connect_timeout(timeout)
        .connect_cluster(&urls)
        .await;
    let took = started.elapsed();
    expect_connect_error("system roots", result, took);
    assert!(took < timeout + Duration::from_secs(1), "{took:?}");
}

/// `--tls-auth-clients yes` on every node: the client certificate opens the cluster; without
/// it, connect fails.
#[tokio::test]
async fn tls_cluster_with_mutual_tls_needs_the_client_certificate() {
    let certs = Certs::make("cluster CA");
    let cluster = RedisCluster::start_tls(3, &certs, true);
    let urls = cluster.tls_urls();

    let store = RedisStore::builder()
        .ca_pem(Certs::read(&certs.ca))
        .client_cert_pem(
            Certs::read(&certs.client_cert),
            Certs::read(&certs.client_key),
        )
        .connect_cluster(&urls)
        .await
        .expect("mutual TLS with the client certificate");
    let l = limiter(store, Gcra::new(Quota::per_hour(2)).unwrap(), "tlsm");
    for key in ["a", "b", "c", "d"] {
        let allowed: Vec<bool> = {
            let mut v = Vec::new();
            for _ in 0..3 {
                v.push(l.check(key, 1).await.unwrap().allowed);
            }
            v
        };
        assert_eq!(allowed, [true, true, false], "{key}");
    }

    let started = Instant::now();
    let result = RedisStore::builder()
        .connect_timeout(Duration::from_secs(2))
        .ca_pem(Certs::read(&certs.ca))
        .connect_cluster(&urls)
        .await;
    expect_connect_error("no client certificate", result, started.elapsed());
}
