//! corvid's Docker plugin: a libnetwork remote NetworkDriver and IpamDriver on a unix
//! socket, mapped onto the controller as Kuryr maps Docker onto Neutron. Everything it
//! knows lives in the controller (tags), so a restarted driver loses nothing.

#![deny(missing_docs)]

pub mod ipam;
pub mod metrics;
pub mod network;
pub mod server;
pub mod tags;

use corvid_api::Client;
use ipnet::IpNet;
use serde_json::{json, Value};

/// How the driver is started.
#[derive(Debug, Clone)]
pub struct Config {
    /// The controller's base URL.
    pub controller: String,
    /// The token and TLS side the controller is reached with.
    pub credentials: corvid_api::Credentials,
    /// This host's ID (ports joined here are bound to it).
    pub host_id: String,
    /// `local` or `global`, answered in GetCapabilities.
    pub scope: String,
    /// Where pools for `docker network create` without `--subnet` are carved from.
    pub default_range: IpNet,
    /// The prefix length of those pools.
    pub default_prefix: u8,
    /// Prefix of the interface name inside the container.
    pub dst_prefix: String,
}

/// A driver failure: answered as `{"Err": "..."}` with a non-200 status.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DriverError(String);

impl DriverError {
    /// An error with a message.
    pub fn new(msg: impl Into<String>) -> DriverError {
        DriverError(msg.into())
    }
}

impl From<corvid_api::ApiError> for DriverError {
    fn from(e: corvid_api::ApiError) -> Self {
        DriverError(format!("corvid controller: {e}"))
    }
}

impl From<corvid_api::TlsError> for DriverError {
    fn from(e: corvid_api::TlsError) -> Self {
        DriverError(format!("corvid controller: {e}"))
    }
}

impl From<corvid_net::Error> for DriverError {
    fn from(e: corvid_net::Error) -> Self {
        DriverError(format!("datapath: {e}"))
    }
}

/// Results of driver calls.
pub type Result<T> = std::result::Result<T, DriverError>;

/// The driver: a controller client and its configuration.
pub struct Driver {
    client: Client,
    cfg: Config,
    /// The controller's cluster ID, asked once: the devices Join makes carry it.
    cluster: std::sync::OnceLock<String>,
}

/// A string field of a request, empty when absent.
pub(crate) fn field<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

impl Driver {
    /// The client this driver reaches the controller with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A driver for `cfg`; fails only on unreadable TLS files.
    pub fn new(cfg: Config) -> Result<Driver> {
        let client = cfg.credentials.client(&cfg.controller)?;
        Ok(Driver {
            client,
            cfg,
            cluster: std::sync::OnceLock::new(),
        })
    }

    /// Deletes a controller object; one already gone is fine, since Docker repeats calls
    /// and a restarted daemon names objects another call already removed.
    pub(crate) fn delete_gone_ok<R: corvid_api::Resource>(&self, id: &str) -> Result<()> {
        match self.client.delete::<R>(id) {
            Ok(()) | Err(corvid_api::ApiError::Neutron { status: 404, .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The controller's cluster ID, asked at the first call that needs it.
    pub(crate) fn cluster(&self) -> Result<&str> {
        if let Some(c) = self.cluster.get() {
            return Ok(c);
        }
        let id = self.client.cluster_id()?;
        Ok(self.cluster.get_or_init(|| id))
    }

    /// Answers one call: `method` is the path without its slash (`NetworkDriver.Join`),
    /// `body` the request's JSON.
    pub fn call(&self, method: &str, body: &[u8]) -> Result<Value> {
        let req: Value = if body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            serde_json::from_slice(body)
                .map_err(|e| DriverError::new(format!("{method}: malformed JSON: {e}")))?
        };
        if !req.is_object() {
            return Err(DriverError::new(format!(
                "{method}: the body must be a JSON object"
            )));
        }
        match method {
            "Plugin.Activate" => Ok(json!({"Implements": ["NetworkDriver", "IpamDriver"]})),
            "NetworkDriver.GetCapabilities" => Ok(json!({
                "Scope": self.cfg.scope,
                "ConnectivityScope": self.cfg.scope,
            })),
            "NetworkDriver.CreateNetwork" => self.create_network(&req),
            "NetworkDriver.DeleteNetwork" => self.delete_network(&req),
            "NetworkDriver.CreateEndpoint" => self.create_endpoint(&req),
            "NetworkDriver.DeleteEndpoint" => self.delete_endpoint(&req),
            "NetworkDriver.EndpointOperInfo" => self.endpoint_info(&req),
            "NetworkDriver.Join" => self.join(&req),
            "NetworkDriver.Leave" => self.leave(&req),
            "NetworkDriver.AllocateNetwork" => Ok(json!({"Options": {}})),
            "NetworkDriver.FreeNetwork"
            | "NetworkDriver.DiscoverNew"
            | "NetworkDriver.DiscoverDelete"
            | "NetworkDriver.ProgramExternalConnectivity"
            | "NetworkDriver.RevokeExternalConnectivity" => Ok(json!({})),
            "IpamDriver.GetCapabilities" => Ok(json!({
                "RequiresMACAddress": false,
                "RequiresRequestReplay": false,
            })),
            "IpamDriver.GetDefaultAddressSpaces" => Ok(json!({
                "LocalDefaultAddressSpace": "corvid-local",
                "GlobalDefaultAddressSpace": "corvid-global",
            })),
            "IpamDriver.RequestPool" => self.request_pool(&req),
            "IpamDriver.ReleasePool" => self.release_pool(&req),
            "IpamDriver.RequestAddress" => self.request_address(&req),
            "IpamDriver.ReleaseAddress" => self.release_address(&req),
            other => Err(DriverError::new(format!("unknown method {other}"))),
        }
    }
}
