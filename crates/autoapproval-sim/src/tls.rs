//! HTTPS for the simulator: a listener that does the TLS handshake with the
//! certificate in force (swappable while serving, as a rotated one is), and
//! optionally requires a client certificate signed by a given CA.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::SimError;

/// How long a client may take over its handshake before it is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A listener's TLS: its certificate and, for mTLS, the CA its clients'
/// certificates must chain to. PEM throughout.
#[derive(Clone, Debug)]
pub struct SimTls {
    /// The server certificate, then its intermediates.
    pub cert_chain_pem: Vec<u8>,
    /// The server certificate's private key.
    pub key_pem: Vec<u8>,
    /// The CA bundle a client certificate must chain to; `None`: no client
    /// certificate is asked for.
    pub client_ca_pem: Option<Vec<u8>>,
}

impl SimTls {
    /// The rustls configuration; a bad PEM is an error naming the field.
    pub(crate) fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, SimError> {
        let invalid = |name: &'static str, message: String| SimError::Invalid { name, message };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = CertificateDer::pem_slice_iter(&self.cert_chain_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("--tls-cert-file", e.to_string()))?;
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem)
            .map_err(|e| invalid("--tls-key-file", e.to_string()))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("--tls-cert-file", e.to_string()))?;
        let builder = match &self.client_ca_pem {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| invalid("--tls-client-ca-file", e.to_string()))?;
                    roots
                        .add(cert)
                        .map_err(|e| invalid("--tls-client-ca-file", e.to_string()))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| invalid("--tls-client-ca-file", e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder
            .with_single_cert(chain, key)
            .map_err(|e| invalid("--tls-key-file", e.to_string()))?;
        Ok(Arc::new(config))
    }
}

/// The TLS settings of one listener, replaced by `SimHandle::set_tls`; each
/// handshake takes the ones in force.
pub(crate) type CurrentTls = Arc<RwLock<Arc<rustls::ServerConfig>>>;

/// An `axum::serve` listener that hands over connections once their
/// handshake succeeded; a failed handshake is dropped (the client sees why)
/// and counted.
pub(crate) struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl TlsListener {
    /// Accepts on `tcp` until `stopped` turns true, each handshake in a task
    /// of its own so a slow client holds up no other.
    pub(crate) fn new(
        tcp: TcpListener,
        tls: CurrentTls,
        failures: Arc<std::sync::atomic::AtomicU64>,
        mut stopped: watch::Receiver<bool>,
    ) -> std::io::Result<Self> {
        let addr = tcp.local_addr()?;
        let (tx, accepted) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    _ = stopped.wait_for(|stop| *stop) => return,
                    accepted = tcp.accept() => match accepted {
                        Ok(pair) => pair,
                        // Out of descriptors and the like: try again.
                        Err(_) => continue,
                    },
                };
                let config = tls.read().unwrap_or_else(|e| e.into_inner()).clone();
                let tx = tx.clone();
                let failures = failures.clone();
                tokio::spawn(async move {
                    let handshake = TlsAcceptor::from(config).accept(stream);
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        _ => {
                            failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        Ok(Self { accepted, addr })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(pair) => pair,
            // The accept loop stopped: so does the server, by its shutdown signal.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
