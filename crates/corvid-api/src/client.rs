//! A blocking client of the controller's REST API. Blocking on purpose: its users are
//! short-lived plugin processes and driver threads, where a runtime would cost more than it
//! saves; async callers wrap it in `spawn_blocking`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::model::{Resource, WatchPage};
use crate::requests::{CreateBody, HostCreate, PortUpdate, UpdateBody};

/// Header carrying the store revision a list was read at, for resuming the watch feed.
pub const REVISION_HEADER: &str = "X-Corvid-Revision";
/// Header carrying the authentication token.
pub const TOKEN_HEADER: &str = "X-Auth-Token";

/// Why a call to the controller failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The controller answered with a Neutron error.
    #[error("{kind} ({status}): {message}")]
    Neutron {
        /// HTTP status.
        status: u16,
        /// Neutron error type (`PortNotFound`, `IpAddressAlreadyAllocated`, ...).
        kind: String,
        /// Human-readable message.
        message: String,
    },
    /// The controller could not be reached.
    #[error("controller unreachable: {0}")]
    Transport(String),
    /// The answer was not what the API promises.
    #[error("unexpected answer from the controller: {0}")]
    Decode(String),
}

impl ApiError {
    /// The HTTP status, when the controller answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Neutron { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A connection-pooling client for one controller.
#[derive(Clone)]
pub struct Client {
    base: String,
    pub(crate) token: Option<String>,
    /// `/project/<name>` when the client speaks the Mizar-MP routes of one project.
    scope: Option<String>,
    agent: ureq::Agent,
    /// The TLS configuration the agent was built with, for agents of other timeouts.
    pub(crate) tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

/// Tries of an idempotent request whose pooled connections were dropped: a few, as each
/// failure takes its connection out of the pool.
const ATTEMPTS: usize = 3;

/// Whether sending a request twice does what sending it once does. Neutron's member
/// actions are PUTs that are not: adding a router interface twice is refused.
fn idempotent(method: &str, path_and_query: &str) -> bool {
    let last = path_and_query
        .split('?')
        .next()
        .and_then(|p| p.rsplit('/').next())
        .unwrap_or("");
    let action = last.ends_with("_router_interface") || last.ends_with("_extraroutes");
    match method {
        "GET" | "HEAD" | "DELETE" => true,
        "PUT" => !action,
        _ => false,
    }
}

/// Whether a request failed because the server had dropped its connection.
fn dropped(t: &ureq::Transport) -> bool {
    use std::io::ErrorKind;
    let io = std::error::Error::source(t).and_then(|e| e.downcast_ref::<std::io::Error>());
    io.is_some_and(|e| {
        matches!(
            e.kind(),
            ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof
        )
    })
}

/// A pooling agent: connections are reused across requests, a connect waits 5 s at most.
fn agent(builder: ureq::AgentBuilder) -> ureq::Agent {
    builder
        .timeout_connect(Duration::from_secs(5))
        .max_idle_connections_per_host(64)
        .build()
}

/// An agent like `agent`, with `tls` when given.
pub(crate) fn agent_with(
    builder: ureq::AgentBuilder,
    tls: &Option<std::sync::Arc<rustls::ClientConfig>>,
) -> ureq::Agent {
    match tls {
        Some(config) => agent(builder.tls_config(config.clone())),
        None => agent(builder),
    }
}

/// Which changes a watch asks for; the default is all of them.
#[derive(Debug, Clone, Copy, Default)]
pub struct WatchFilter<'a> {
    /// Only ports bound to this host, before or after the change (and no other resource).
    pub host_id: Option<&'a str>,
    /// Only this collection (`ports`).
    pub resource: Option<&'a str>,
}

impl Client {
    /// A client for the controller at `base` (`http://127.0.0.1:9696`).
    pub fn new(base: &str) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            token: None,
            scope: None,
            agent: agent(ureq::AgentBuilder::new()),
            tls: None,
        }
    }

    /// Checks the controller's certificate against `tls.ca` and presents `tls.cert`.
    pub fn with_tls(mut self, tls: &crate::Tls) -> Result<Client, crate::tls::TlsError> {
        if tls.is_set() {
            self.tls = Some(std::sync::Arc::new(tls.client_config()?));
            self.agent = agent_with(ureq::AgentBuilder::new(), &self.tls);
        }
        Ok(self)
    }

    /// Sends `X-Auth-Token: token` with every request.
    pub fn with_token(mut self, token: &str) -> Client {
        self.token = Some(token.to_string());
        self
    }

    /// The same controller through the Mizar-MP agreement's routes of `project`
    /// (`/project/<project>/ports`, `/project/<project>/subnets/<id>`), which a Mizar-MP
    /// controller serves as well; the watch feed stays where it is.
    pub fn project(&self, project: &str) -> Client {
        Client {
            scope: Some(format!("/project/{}", percent_encode(project))),
            ..self.clone()
        }
    }

    /// The controller's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The controller's version, from `/version` (which needs no token).
    pub fn version(&self) -> Result<String, ApiError> {
        let (status, v, _) = self.request("GET", "/version", None)?;
        match (status, v["version"].as_str()) {
            (200, Some(version)) => Ok(version.to_string()),
            (200, None) => Err(ApiError::Decode(format!("/version answered {v}"))),
            _ => Err(ApiError::Decode(format!("/version answered {status}"))),
        }
    }

    /// The identity of the cluster the controller serves, from `/version`: the same for
    /// every controller on one store.
    pub fn cluster_id(&self) -> Result<String, ApiError> {
        let (status, v, _) = self.request("GET", "/version", None)?;
        match (status, v["cluster_id"].as_str()) {
            (200, Some(id)) if !id.is_empty() => Ok(id.to_string()),
            _ => Err(ApiError::Decode(format!(
                "/version answered {status} without a cluster_id: {v}"
            ))),
        }
    }

    /// Sends one request; returns the status, the JSON body (`null` when empty) and the
    /// revision header. Error statuses are returned, not turned into `Err`.
    pub fn request(
        &self,
        method: &str,
        path_and_query: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value, Option<i64>), ApiError> {
        // A pooled connection the controller dropped without a word (a client it took
        // for dead, see its --client-timeout) fails at its first use with a reset. ureq
        // retries that only for requests without a body; an idempotent one is retried
        // here too, as urllib3 does, on the next pooled connection or a new one.
        let idempotent = idempotent(method, path_and_query);
        let mut tries = 0;
        let res = loop {
            tries += 1;
            let mut req = self
                .agent
                .request(method, &format!("{}{}", self.base, path_and_query));
            if let Some(t) = &self.token {
                req = req.set(TOKEN_HEADER, t);
            }
            let res = match body {
                Some(b) => req.send_json(b),
                None => req.call(),
            };
            match &res {
                Err(ureq::Error::Transport(t)) if idempotent && tries < ATTEMPTS && dropped(t) => {}
                _ => break res,
            }
        };
        let resp = match res {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => return Err(ApiError::Transport(e.to_string())),
        };
        let status = resp.status();
        let revision = resp.header(REVISION_HEADER).and_then(|v| v.parse().ok());
        // Read whole, without `into_string`'s 10 MiB cap: an agent lists every port,
        // which passes that at about 13,600 ports.
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut resp.into_reader(), &mut bytes)
            .map_err(|e| ApiError::Transport(e.to_string()))?;
        let value = if bytes.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Ok((status, value, revision))
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, ApiError> {
        let (status, value, _) = self.request(method, path, body)?;
        check(status, value)
    }

    fn decode<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
        serde_json::from_value(v).map_err(|e| ApiError::Decode(e.to_string()))
    }

    fn collection<R: Resource>(&self) -> String {
        format!(
            "{}/{}",
            self.scope.as_deref().unwrap_or(R::PREFIX),
            R::COLLECTION
        )
    }

    /// Creates one resource from its attributes (the inner object of `{"port": {...}}`).
    pub fn create<R: Resource>(&self, attrs: impl CreateBody<R>) -> Result<R, ApiError> {
        let v = self.call(
            "POST",
            &self.collection::<R>(),
            Some(&json!({ R::SINGULAR: attrs })),
        )?;
        Self::decode(v[R::SINGULAR].clone())
    }

    /// Creates the resource with ID `id` (`attrs` must carry it), or shows the one an
    /// earlier attempt made: derived IDs make a retried create idempotent.
    pub fn create_or_get<R: Resource>(
        &self,
        id: &str,
        attrs: impl CreateBody<R>,
    ) -> Result<R, ApiError> {
        match self.create(attrs) {
            Err(ApiError::Neutron {
                status: 409, kind, ..
            }) if kind.ends_with("Exists") => self.get(id),
            r => r,
        }
    }

    /// Deletes one resource; `Ok(false)` when there was none.
    pub fn delete_if_present<R: Resource>(&self, id: &str) -> Result<bool, ApiError> {
        match self.delete::<R>(id) {
            Ok(()) => Ok(true),
            Err(ApiError::Neutron { status: 404, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates several resources in one all-or-nothing request.
    pub fn create_bulk<R: Resource>(
        &self,
        attrs: Vec<impl CreateBody<R>>,
    ) -> Result<Vec<R>, ApiError> {
        let v = self.call(
            "POST",
            &self.collection::<R>(),
            Some(&json!({ R::PLURAL: attrs })),
        )?;
        Self::decode(v[R::PLURAL].clone())
    }

    /// Shows one resource.
    pub fn get<R: Resource>(&self, id: &str) -> Result<R, ApiError> {
        let v = self.call("GET", &format!("{}/{id}", self.collection::<R>()), None)?;
        Self::decode(v[R::SINGULAR].clone())
    }

    /// Lists resources matching `filters` (`[("device_id", "abc")]`), with the store
    /// revision the list was read at (resume the watch feed from there).
    pub fn list<R: Resource>(&self, filters: &[(&str, &str)]) -> Result<(Vec<R>, i64), ApiError> {
        let query: Vec<String> = filters
            .iter()
            .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
            .collect();
        let path = format!("{}?{}", self.collection::<R>(), query.join("&"));
        let (status, value, revision) = self.request("GET", &path, None)?;
        let value = check(status, value)?;
        // Resuming the watch from 0 after a controller restart is a 410 for ever.
        let revision = revision.ok_or_else(|| {
            ApiError::Decode(format!("{path} answered without {REVISION_HEADER}"))
        })?;
        Ok((Self::decode(value[R::PLURAL].clone())?, revision))
    }

    /// Updates the given attributes of one resource.
    pub fn update<R: Resource>(&self, id: &str, attrs: impl UpdateBody<R>) -> Result<R, ApiError> {
        let v = self.call(
            "PUT",
            &format!("{}/{id}", self.collection::<R>()),
            Some(&json!({ R::SINGULAR: attrs })),
        )?;
        Self::decode(v[R::SINGULAR].clone())
    }

    /// Deletes one resource.
    pub fn delete<R: Resource>(&self, id: &str) -> Result<(), ApiError> {
        self.call("DELETE", &format!("{}/{id}", self.collection::<R>()), None)
            .map(drop)
    }

    /// Adds one tag to a resource.
    pub fn add_tag<R: Resource>(&self, id: &str, tag: &str) -> Result<(), ApiError> {
        let path = format!(
            "{}/{id}/tags/{}",
            self.collection::<R>(),
            percent_encode(tag)
        );
        self.call("PUT", &path, None).map(drop)
    }

    /// Reports a port's status (ACTIVE once plugged, DOWN once unplugged); returns the
    /// port as updated.
    pub fn set_port_status(
        &self,
        id: &str,
        status: crate::Status,
    ) -> Result<crate::Port, ApiError> {
        self.update(
            id,
            PortUpdate {
                status: Some(status),
                ..Default::default()
            },
        )
    }

    /// Adds an interface to `router`: a subnet (the router takes its gateway address) or
    /// a port.
    pub fn add_router_interface(
        &self,
        router: &str,
        which: &crate::RouterInterface,
    ) -> Result<crate::RouterInterfaceInfo, ApiError> {
        self.router_interface(router, "add_router_interface", which)
    }

    /// Removes the interface of `router` on a subnet, or the interface port named.
    pub fn remove_router_interface(
        &self,
        router: &str,
        which: &crate::RouterInterface,
    ) -> Result<crate::RouterInterfaceInfo, ApiError> {
        self.router_interface(router, "remove_router_interface", which)
    }

    fn router_interface(
        &self,
        router: &str,
        action: &str,
        which: &crate::RouterInterface,
    ) -> Result<crate::RouterInterfaceInfo, ApiError> {
        let path = format!(
            "{}/{}/{action}",
            self.collection::<crate::Router>(),
            percent_encode(router)
        );
        let body = serde_json::to_value(which).map_err(|e| ApiError::Decode(e.to_string()))?;
        Self::decode(self.call("PUT", &path, Some(&body))?)
    }

    /// The underlay address host `id`'s agent registered; none before it has.
    pub fn registered_underlay(&self, id: &str) -> Result<Option<std::net::IpAddr>, ApiError> {
        match self.get::<crate::Host>(id) {
            Ok(h) => Ok(Some(h.underlay_ip)),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Registers (or re-registers) a host and the underlay address its tunnels end at.
    pub fn register_host(
        &self,
        id: &str,
        underlay_ip: std::net::IpAddr,
    ) -> Result<crate::Host, ApiError> {
        let path = format!("/v2.0/hosts/{}", percent_encode(id));
        let v = self.call(
            "PUT",
            &path,
            Some(&json!({ "host": HostCreate { underlay_ip: Some(underlay_ip), ..Default::default() } })),
        )?;
        Self::decode(v["host"].clone())
    }

    /// Waits up to `timeout` for changes after revision `since` that `filter` lets
    /// through. A 410 means the revision is too old: list again.
    pub fn watch(
        &self,
        since: i64,
        filter: &WatchFilter,
        timeout: Duration,
    ) -> Result<WatchPage, ApiError> {
        let path = format!("/v2.0/watch?since={since}{}", watch_query(filter, timeout));
        Self::decode(self.call("GET", &path, None)?)
    }
}

/// The watch feed's query after `since`: the wait and the filter.
pub(crate) fn watch_query(filter: &WatchFilter, timeout: Duration) -> String {
    let mut query = format!("&timeout={}", timeout.as_secs());
    if let Some(r) = filter.resource {
        query.push_str(&format!("&resource={}", percent_encode(r)));
    }
    if let Some(h) = filter.host_id {
        query.push_str(&format!("&binding:host_id={}", percent_encode(h)));
    }
    query
}

/// Turns an error status into `ApiError::Neutron`.
pub(crate) fn check(status: u16, value: Value) -> Result<Value, ApiError> {
    if status < 400 {
        return Ok(value);
    }
    let e = &value["NeutronError"];
    Err(ApiError::Neutron {
        status,
        kind: e["type"].as_str().unwrap_or("HTTPError").to_string(),
        message: e["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| value.to_string()),
    })
}

/// Percent-encodes a query component.
fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, QUERY_COMPONENT).to_string()
}

/// Everything but RFC 3986's unreserved characters and ':' (which Neutron's attribute
/// names carry, `binding:host_id`).
const QUERY_COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b':');

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requests_that_may_go_twice_are_retried() {
        assert!(idempotent("GET", "/v2.0/ports?device_id=x"));
        assert!(idempotent("PUT", "/v2.0/ports/1"));
        assert!(idempotent("DELETE", "/v2.0/ports/1"));
        assert!(!idempotent("POST", "/v2.0/ports"));
        assert!(!idempotent("PUT", "/v2.0/routers/1/add_router_interface"));
        assert!(!idempotent("PUT", "/v2.0/routers/1/remove_extraroutes?x=1"));
    }
    use std::io::{Read, Write};

    #[test]
    fn an_answer_above_ten_mebibytes_is_read_whole() {
        // 11 MiB of JSON: ureq's `into_string` refused anything above 10.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let body = serde_json::to_vec(&json!({"ports": [], "pad": "x".repeat(11 << 20)})).unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut request = [0u8; 4096];
            let _ = conn.read(&mut request).unwrap();
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            conn.write_all(head.as_bytes()).unwrap();
            conn.write_all(&body).unwrap();
        });
        let client = Client::new(&format!("http://{addr}"));
        let (status, value, _) = client.request("GET", "/v2.0/ports", None).unwrap();
        server.join().unwrap();
        assert_eq!(status, 200);
        assert_eq!(value["pad"].as_str().map(str::len), Some(11 << 20));
    }
}
