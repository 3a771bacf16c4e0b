//! TLS to Redis (`rediss://`): the client configuration, and the handshake on a socket the
//! store opened itself.
//!
//! The handshake runs here rather than inside redis-rs so that the socket (keepalive, user
//! timeout), the connect bound and the connection's driver stay the store's, as for plain TCP.
//! The crypto provider (`ring`) is passed explicitly, so no application has to install a
//! process-wide one. redis-rs' own TLS (used by the Cluster client) asks for the process-wide
//! provider: [`ensure_process_provider`] installs `ring` there when the application has not
//! chosen one.

use std::sync::Arc;

use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName},
    ClientConfig, RootCertStore,
};
use tokio::net::TcpStream;
use tokio_rustls::{client::TlsStream, TlsConnector};

use crate::error::{ConfigError, ConnectError, ConnectErrorKind};

/// PEM material for TLS: a private CA to trust instead of the system roots, and a client
/// certificate with its key for mutual TLS.
#[derive(Clone, Default)]
pub(crate) struct TlsPem {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsPem {
    /// The same material in redis-rs' form (for the Cluster client).
    pub(crate) fn to_redis(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        }
    }
}

/// Builds the client configuration from `pem`: every problem is a [`ConfigError`] naming the
/// option, so that a wrong file fails at start-up rather than at the first handshake.
pub(crate) fn client_config(pem: &TlsPem) -> Result<Arc<ClientConfig>, ConfigError> {
    let mut roots = RootCertStore::empty();
    match &pem.ca {
        Some(ca) => {
            let certs = CertificateDer::pem_slice_iter(ca)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ConfigError::new("ca_pem", "not a PEM certificate").caused_by(e))?;
            if certs.is_empty() {
                return Err(ConfigError::new(
                    "ca_pem",
                    "holds no certificate (expected -----BEGIN CERTIFICATE-----)",
                ));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| ConfigError::new("ca_pem", "unusable CA").caused_by(e))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system store may hold a certificate rustls cannot use; skip it as every
                // rustls-native-certs user does.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(ConfigError::new(
                    "ca_pem",
                    "no system root certificates were found; give the server's CA",
                ));
            }
        }
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(ring_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new("tls", "no protocol version to offer").caused_by(e))?
        .with_root_certificates(roots);
    let config = match &pem.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    ConfigError::new("client_cert", "not a PEM certificate").caused_by(e)
                })?;
            if chain.is_empty() {
                return Err(ConfigError::new("client_cert", "holds no certificate"));
            }
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| ConfigError::new("client_key", "no private key").caused_by(e))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                ConfigError::new("client_key", "does not go with the certificate").caused_by(e)
            })?
        }
    };
    Ok(Arc::new(config))
}

/// Runs the TLS handshake on `tcp`, verifying the server's certificate for `host`.
pub(crate) async fn handshake(
    config: Arc<ClientConfig>,
    host: &str,
    tcp: TcpStream,
) -> Result<TlsStream<TcpStream>, ConnectError> {
    let name = ServerName::try_from(host.to_owned()).map_err(|e| {
        ConnectError::new(
            ConnectErrorKind::Tls,
            format!("{host} is not a valid TLS server name"),
        )
        .caused_by(e)
    })?;
    TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| {
            // rustls reports through io::Error, whose message is rustls' (an unknown issuer, a
            // name mismatch, an expired certificate, a plain-text server).
            ConnectError::new(
                ConnectErrorKind::Tls,
                format!("TLS handshake with {host} failed"),
            )
            .caused_by(e)
        })
}

/// rustls' `ring` provider, the one this crate builds TLS with.
///
/// rustls marks it deprecated because `ring` offers no post-quantum key exchange; its other
/// provider, `aws-lc-rs`, needs a C toolchain and CMake to build, which this crate does not ask
/// of its users. A link to Redis inside one's own network is the case this serves; an
/// application that wants post-quantum key exchange installs its own process-wide provider
/// first, and the Cluster client uses that one (see [`ensure_process_provider`]).
#[allow(deprecated)]
fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// Installs `ring` as the process-wide rustls provider unless the application installed one
/// (redis-rs' own TLS code, used by the Cluster client, needs one).
pub(crate) fn ensure_process_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: a provider is installed either way.
        let _ = ring_provider().install_default();
    }
}
