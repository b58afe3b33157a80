//! The corvid network controller: a Neutron-shaped REST API over a revisioned store (redb
//! embedded, or etcd for clusters), IPAM over subnets, and a watch feed for agents.

#![deny(missing_docs)]

mod api;
pub mod controller;
pub mod error;
pub mod ipam;
pub mod keys;
pub mod query;
pub mod store;
mod util;
pub mod view;

use std::future::Future;
use std::net::SocketAddr;

pub use controller::Controller;

/// What `corvid controller` needs to run.
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Store spec: `redb:<path>` or `etcd:<url>[,<url>...]`.
    pub store: String,
    /// Token every request must carry in `X-Auth-Token`, if set.
    pub token: Option<String>,
}

/// Runs the controller until `shutdown` resolves, then finishes the requests in flight.
pub fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    rt.block_on(async move {
        let spec = config.store.clone();
        let store = tokio::task::spawn_blocking(move || store::open(&spec))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let ctl = Controller::start(store, config.token).map_err(|e| e.to_string())?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("listening on {}: {e}", config.listen))?;
        tracing::info!(listen = %config.listen, store = %config.store, "controller listening");
        axum::serve(listener, api::router(ctl))
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| e.to_string())
    })
}
