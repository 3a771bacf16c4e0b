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
