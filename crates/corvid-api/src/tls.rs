//! How a client reaches a controller that serves https: the CA its certificate must chain
//! to, the client's own certificate when the controller asks for one, and a token read
//! from a file rather than from the command line (where `ps` shows it).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The TLS side of a client.
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// PEM file of the CA(s) the controller's certificate must chain to; the Mozilla
    /// roots when none.
    pub ca: Option<PathBuf>,
    /// PEM certificate (chain) this client presents.
    pub cert: Option<PathBuf>,
    /// PEM private key of that certificate.
    pub key: Option<PathBuf>,
}

/// Why a client's or server's TLS side, or a token, could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file named on the command line could not be used; the error names it.
    #[error("{what}{}: {reason}", path.display())]
    File {
        /// What the file is for, as a prefix (`"token file "`), or empty.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// rustls refused the configuration (a key that is not the certificate's).
    #[error("{context}: {source}")]
    Config {
        /// The files or step it was refused for.
        context: String,
        /// rustls' reason.
        source: rustls::Error,
    },
    /// A client certificate without its key, or a key without its certificate.
    #[error("a client certificate needs both --cert and --key")]
    HalfCertificate,
}

impl TlsError {
    fn file(path: &Path, reason: impl std::fmt::Display) -> Self {
        TlsError::File {
            what: "",
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }

    /// rustls' refusal of what `context` names.
    pub fn config(context: impl Into<String>) -> impl FnOnce(rustls::Error) -> Self {
        let context = context.into();
        move |source| TlsError::Config { context, source }
    }
}

/// The ring provider, which every TLS peer of corvid uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in the PEM file `path`; an error names the file.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::file(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::file(path, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// The private key in the PEM file `path`.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::file(path, e))
}

/// A root store of the CAs in `path`.
pub fn read_roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|e| TlsError::file(path, e))?;
    }
    Ok(roots)
}

/// The token in `path`, without the line end editors leave.
pub fn read_token(path: &Path) -> Result<String, TlsError> {
    let token_file = |reason: String| TlsError::File {
        what: "token file ",
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| token_file(e.to_string()))?;
    let token = text.trim_end_matches(['\n', '\r']);
    if token.is_empty() {
        return Err(token_file("it is empty".into()));
    }
    Ok(token.to_string())
}

impl Tls {
    /// Whether anything is set: without, a client keeps ureq's defaults.
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    /// The rustls configuration this describes.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let roots = match &self.ca {
            Some(ca) => read_roots(ca)?,
            None => rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            },
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::config("TLS versions"))?
            .with_root_certificates(roots);
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
                .map_err(TlsError::config(cert.display().to_string())),
            (None, None) => Ok(builder.with_no_client_auth()),
            _ => Err(TlsError::HalfCertificate),
        }
    }
}

/// Everything a client shows and checks: the token and the TLS side. Its `Debug` leaves
/// the token out, so a logged configuration never carries it.
#[derive(Clone, Default)]
pub struct Credentials {
    /// The token sent in `X-Auth-Token`.
    pub token: Option<String>,
    /// The TLS side.
    pub tls: Tls,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &self.token.as_ref().map(|_| "(hidden)"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl Credentials {
    /// A client of the controller at `url` with these credentials.
    pub fn client(&self, url: &str) -> Result<crate::Client, TlsError> {
        let client = crate::Client::new(url).with_tls(&self.tls)?;
        Ok(match &self.token {
            Some(t) => client.with_token(t),
            None => client,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_token() {
        let c = Credentials {
            token: Some("s3cret-token".into()),
            tls: Tls::default(),
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("(hidden)"), "{shown}");
    }

    #[test]
    fn a_token_file_loses_its_line_end_and_must_not_be_empty() {
        let dir = std::env::temp_dir().join(format!("cvt-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        std::fs::write(&f, "abc\n").unwrap();
        assert_eq!(read_token(&f).unwrap(), "abc");
        std::fs::write(&f, "\n").unwrap();
        assert!(read_token(&f).unwrap_err().to_string().contains("empty"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
