//! Certificates made by the tests (no openssl): a CA, a server certificate for 127.0.0.1 and
//! a client certificate, written to a fresh directory; and a TLS `redis-server` using them.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::{free_port, RedisServer};

/// PEM files for one test.
pub struct Certs {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Certs {
    /// A CA named `ca_name`, a server certificate for `127.0.0.1` and `localhost`, and a
    /// client certificate, all signed by the CA.
    pub fn make(ca_name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("trr-tls-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca_pem, issuer) = ca(ca_name);
        let (server_cert, server_key) = leaf(
            &issuer,
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) =
            leaf(&issuer, &["client"], ExtendedKeyUsagePurpose::ClientAuth);
        let write = |name: &str, pem: &str| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        Self {
            ca: write("ca.pem", &ca_pem),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            dir,
        }
    }

    pub fn read(path: &PathBuf) -> Vec<u8> {
        std::fs::read(path).unwrap()
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `redis-server` that speaks TLS on `tls_port` (and plain text on its `port`, used only by
/// the harness to see it is up).
pub struct TlsRedis {
    pub server: RedisServer,
    pub tls_port: u16,
}

impl TlsRedis {
    /// Starts a TLS server with `certs`; `auth_clients` asks clients for a certificate.
    pub fn start(certs: &Certs, auth_clients: bool, extra: &[&str]) -> Self {
        let tls_port = free_port();
        let tls_port_s = tls_port.to_string();
        let mut args = vec![
            "--tls-port",
            &tls_port_s,
            "--tls-cert-file",
            certs.server_cert.to_str().unwrap(),
            "--tls-key-file",
            certs.server_key.to_str().unwrap(),
            "--tls-ca-cert-file",
            certs.ca.to_str().unwrap(),
            "--tls-auth-clients",
            if auth_clients { "yes" } else { "no" },
        ];
        args.extend_from_slice(extra);
        Self {
            server: RedisServer::start_with(&args),
            tls_port,
        }
    }

    /// `rediss://127.0.0.1:TLS_PORT`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }
}

impl super::RedisCluster {
    /// A Redis Cluster of `masters` primaries (no replicas) speaking TLS with `certs`: each
    /// node serves clients on a TLS port (`--tls-port`) and talks to the other nodes over TLS
    /// (`--tls-cluster yes`, `--tls-replication yes`), presenting the client certificate on the
    /// connections it opens; its plain `port` stays open only for the harness (readiness,
    /// inspection). Created with `redis-cli --tls --cluster create` on the TLS ports.
    /// `auth_clients` asks clients for a certificate.
    pub fn start_tls(masters: usize, certs: &Certs, auth_clients: bool) -> Self {
        let path = |p: &PathBuf| p.to_str().unwrap().to_owned();
        let mut nodes = Vec::with_capacity(masters);
        let mut tls_ports = Vec::with_capacity(masters);
        let mut failed = 0;
        while nodes.len() < masters {
            // With `--tls-cluster yes` the cluster bus listens on the TLS port + 10000.
            let tls_port = super::free_cluster_port();
            let extra = vec![
                "--cluster-enabled".to_owned(),
                "yes".to_owned(),
                "--cluster-config-file".to_owned(),
                "nodes.conf".to_owned(),
                "--cluster-node-timeout".to_owned(),
                "1000".to_owned(),
                "--cluster-require-full-coverage".to_owned(),
                "no".to_owned(),
                "--tls-port".to_owned(),
                tls_port.to_string(),
                "--tls-cluster".to_owned(),
                "yes".to_owned(),
                "--tls-replication".to_owned(),
                "yes".to_owned(),
                "--tls-cert-file".to_owned(),
                path(&certs.server_cert),
                "--tls-key-file".to_owned(),
                path(&certs.server_key),
                "--tls-client-cert-file".to_owned(),
                path(&certs.client_cert),
                "--tls-client-key-file".to_owned(),
                path(&certs.client_key),
                "--tls-ca-cert-file".to_owned(),
                path(&certs.ca),
                "--tls-auth-clients".to_owned(),
                if auth_clients { "yes" } else { "no" }.to_owned(),
            ];
            // A port taken in between makes the server exit: try other ports.
            match RedisServer::spawn(free_port(), extra) {
                Ok(node) => {
                    nodes.push(node);
                    tls_ports.push(tls_port);
                }
                Err(e) => {
                    failed += 1;
                    assert!(
                        failed < super::SPAWN_ATTEMPTS,
                        "no TLS cluster node would start: {e}"
                    );
                }
            }
        }
        let cluster = Self { nodes };
        let addrs: Vec<String> = tls_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = std::process::Command::new(super::redis_cli())
            .arg("--tls")
            .arg("--cacert")
            .arg(&certs.ca)
            .arg("--cert")
            .arg(&certs.client_cert)
            .arg("--key")
            .arg(&certs.client_key)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); install redis-tools"));
        assert!(
            out.status.success(),
            "redis-cli --tls --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_ok(std::time::Duration::from_secs(30));
        cluster
    }

    /// The TLS port of each node (`CONFIG GET tls-port`, asked on its plain port).
    pub fn tls_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .map(|n| {
                let reply: Vec<String> = tower_redis_ratelimit::redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("tls-port")
                    .query(&mut n.conn())
                    .unwrap();
                reply[1].parse().unwrap()
            })
            .collect()
    }

    /// `rediss://127.0.0.1:TLS_PORT` for every node: seed URLs for the cluster client.
    pub fn tls_urls(&self) -> Vec<String> {
        self.tls_ports()
            .into_iter()
            .map(|p| format!("rediss://127.0.0.1:{p}"))
            .collect()
    }
}
