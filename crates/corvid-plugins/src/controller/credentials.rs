//! How a plugin's network configuration says to reach the controller: the token (inline,
//! or `tokenFile` so that it stays out of configuration files others can read) and the
//! TLS side (`ca`, `cert`, `key`), shared by the `corvid` and `corvid-k8s` plugins.

use std::path::PathBuf;

use corvid_api::{Client, Credentials, Tls, TlsError};
use corvid_cni::{Error, ErrorCode};
use serde::Deserialize;

/// The controller credentials of a plugin's configuration.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ControllerAccess {
    /// The token, inline.
    #[serde(default)]
    token: Option<String>,
    /// A file holding the token.
    #[serde(default)]
    token_file: Option<PathBuf>,
    /// The CA (PEM) the controller's certificate must chain to.
    #[serde(default)]
    ca: Option<PathBuf>,
    /// The certificate (PEM) the plugin presents.
    #[serde(default)]
    cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[serde(default)]
    key: Option<PathBuf>,
}

impl ControllerAccess {
    /// A client of the controller at `url`; unreadable files are a configuration error.
    pub fn client(&self, url: &str) -> Result<Client, Error> {
        let invalid = |e: TlsError| Error::new(ErrorCode::InvalidNetworkConfig, e.to_string());
        let token = match (&self.token, &self.token_file) {
            (Some(_), Some(_)) => {
                return Err(Error::new(
                    ErrorCode::InvalidNetworkConfig,
                    "give \"token\" or \"tokenFile\", not both",
                ))
            }
            (_, Some(f)) => Some(corvid_api::tls::read_token(f).map_err(invalid)?),
            (t, None) => t.clone(),
        };
        let credentials = Credentials {
            token,
            tls: Tls {
                ca: self.ca.clone(),
                cert: self.cert.clone(),
                key: self.key.clone(),
            },
        };
        credentials.client(url).map_err(invalid)
    }
}
