//! The corvid network controller: a Neutron-shaped REST API over a revisioned store (redb
//! embedded, or etcd for clusters), IPAM over subnets, and a watch feed for agents.

#![deny(missing_docs)]

mod api;
pub mod compact_port;
mod connection;
pub mod controller;
pub mod error;
pub mod ipam;
pub mod keys;
mod loading;
pub mod metrics;
pub mod query;
pub mod store;
pub mod tls;
mod util;
pub mod view;
pub mod wakers;

use std::future::Future;

use axum::serve::ListenerExt;

pub use error::ServeError;
use std::net::SocketAddr;

pub use connection::DEFAULT_CLIENT_TIMEOUT;
pub use controller::Controller;

/// The default of `--max-body`: 1 MiB, room for a bulk create of hundreds of ports.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;

/// What `corvid controller` needs to run.
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Store spec: `redb:<path>` or `etcd:<url>[,<url>...]`.
    pub store: String,
    /// Token every request must carry in `X-Auth-Token`, if set.
    pub token: Option<String>,
    /// Serve https with these files, or plain http when none.
    pub tls: Option<tls::TlsFiles>,
    /// The largest request body taken; a larger one is answered 413.
    pub max_body: usize,
    /// How long a client may leave the controller's packets unanswered before its
    /// connection is dropped.
    pub client_timeout: std::time::Duration,
}

/// Runs the controller until `shutdown` resolves, then finishes the requests in flight.
pub fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let tls = match &config.tls {
        Some(files) => Some(files.server_config()?),
        None => None,
    };
    let served = rt.block_on(async move {
        // Bound before the load: a port in use is reported at once, and clients that
        // connect during the load wait for it (loading.rs).
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServeError::Listen {
                addr: config.listen,
                source,
            })?;
        let loading = loading::Loading::new();
        let waiting = loading.clone();
        let app = corvid_metrics::router(std::sync::Arc::new(metrics_endpoints(&loading)))
            .fallback(move |req| waiting.clone().serve(req))
            .layer(axum::extract::DefaultBodyLimit::max(config.max_body));
        let stopping = loading.clone();
        let shutdown = async move {
            shutdown.await;
            stopping.stop();
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        tracing::info!(listen = %config.listen, store = %config.store, scheme, "controller listening");
        let serving = async move {
            match tls {
                Some(tls) => {
                    let listener = tls::TlsListener::new(listener, tls, config.client_timeout)
                        .map_err(ServeError::Serve)?;
                    axum::serve(listener, app)
                        .with_graceful_shutdown(shutdown)
                        .await
                }
                None => {
                    let timeout = config.client_timeout;
                    let listener = listener.tap_io(move |tcp| connection::tune(tcp, timeout));
                    axum::serve(listener, app)
                        .with_graceful_shutdown(shutdown)
                        .await
                }
            }
            .map_err(ServeError::Serve)
        };
        let starting = async {
            let spec = config.store.clone();
            let store = tokio::task::spawn_blocking(move || store::open(&spec))
                .await
                .map_err(|e| ServeError::Runtime(e.into()))??;
            let ctl = Controller::start(store, config.token).await?;
            let cluster_id = ctl.cluster_id.clone();
            let api = api::router(ctl.clone()).route(
                "/version",
                axum::routing::get(move || version(cluster_id.clone())),
            );
            loading.loaded(&ctl, api);
            Ok::<_, ServeError>(ctl)
        };
        tokio::pin!(serving);
        tokio::select! {
            started = starting => {
                // Held for as long as the process serves: the endpoints hold it weakly.
                let _ctl = started?;
                serving.await
            }
            served = &mut serving => served,
        }
    });
    // A load cut short by the stop may be blocked on the store: not waited for.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    served
}

/// `GET /version`, as kube-apiserver and etcd answer it: which controller this is and
/// which cluster it serves, asked by `corvid doctor`, the daemons' readiness checks and
/// the agents (which mark their devices with the cluster) without a token.
async fn version(cluster_id: String) -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({"version": env!("CARGO_PKG_VERSION"), "cluster_id": cluster_id}))
}

/// The metrics endpoints over the controller: ready once its view is loaded and while
/// the store answers and the view is current (metrics.rs is kept free of the controller,
/// which counts into it).
fn metrics_endpoints(loading: &loading::Loading) -> corvid_metrics::Endpoints {
    let ready = loading.clone();
    let observed = loading.clone();
    metrics::endpoints(
        Box::new(move || match ready.controller() {
            Some(c) if c.stopping() => Err("the controller is stopping".into()),
            Some(c) if c.may_be_stale() => Err(format!(
                "the view has not been confirmed current with the store for {:.1} s",
                c.unconfirmed().as_secs_f64()
            )
            .into()),
            Some(_) => Ok(()),
            None => Err("the controller is loading its view from the store".into()),
        }),
        move || {
            let c = observed.controller()?;
            let view = c.view();
            Some((c.unconfirmed().as_secs_f64(), view.revision, view.counts()))
        },
    )
}
