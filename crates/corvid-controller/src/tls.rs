//! https for the API: rustls with the server's certificate, and client certificates
//! checked against a CA when one is given (the clients then need no token to be known).
//! Handshakes run on tasks of their own, so a client that never finishes one holds up
//! nobody else's.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use corvid_api::tls::{provider, read_certs, read_key, read_roots, TlsError};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The files of the controller's TLS side.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// PEM certificate chain of the server.
    pub cert: PathBuf,
    /// PEM private key of that certificate.
    pub key: PathBuf,
    /// PEM CA(s) a client certificate must chain to; when set, a client without one is
    /// refused during the handshake.
    pub client_ca: Option<PathBuf>,
}

/// A handshake that takes longer than this is dropped.
const HANDSHAKE: Duration = Duration::from_secs(10);

impl TlsFiles {
    /// The rustls configuration these files describe.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::config("TLS versions"))?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(read_roots(ca)?),
                    provider(),
                )
                .build()
                .map_err(|e| TlsError::File {
                    what: "",
                    path: ca.clone(),
                    reason: e.to_string(),
                })?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(read_certs(&self.cert)?, read_key(&self.key)?)
            .map_err(TlsError::config(format!(
                "{} and {}",
                self.cert.display(),
                self.key.display()
            )))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// A listener that hands axum only connections whose handshake completed.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `tcp`, drops a client silent for `client_timeout`, and shakes hands
    /// with `config`.
    pub fn new(
        tcp: TcpListener,
        config: rustls::ServerConfig,
        client_timeout: Duration,
    ) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors, usually: wait rather than spin.
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                crate::connection::tune(&stream, client_timeout);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::warn!(%peer, "TLS handshake refused: {e}"),
                        Err(_) => tracing::warn!(%peer, "TLS handshake not finished in 10 s"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accepting task ends only with the runtime.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}
