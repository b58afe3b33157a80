//! The operator's endpoints every corvid daemon serves: `/metrics` in Prometheus' text
//! format (OpenMetrics, through prometheus-client), `/healthz` (the process answers) and
//! `/readyz` (it can do its work), the paths and answers Kubernetes probes expect.
//!
//! Each daemon keeps its metrics in a `Registry` of its own and says what "ready" means
//! for it; the controller serves these routes on its API port, the other daemons on
//! `--metrics-listen`.

#![deny(missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

pub use prometheus_client;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Why a daemon cannot do its work now, as `/readyz` says it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotReady(pub String);

impl From<&str> for NotReady {
    fn from(why: &str) -> Self {
        NotReady(why.to_string())
    }
}

impl From<String> for NotReady {
    fn from(why: String) -> Self {
        NotReady(why)
    }
}

/// Whether a daemon can do its work now; the error says why not.
pub type Readiness = Box<dyn Fn() -> Result<(), NotReady> + Send + Sync>;

/// Why the endpoints could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address is taken, or not this host's.
    #[error("metrics: listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// No thread could be started for them.
    #[error("metrics: starting a thread: {0}")]
    Thread(std::io::Error),
}

/// What the endpoints read: the registry, what readiness means, and what to refresh
/// before a scrape (gauges read from state, such as objects by kind).
pub struct Endpoints {
    registry: Registry,
    ready: Readiness,
    refresh: Option<Box<dyn Fn() + Send + Sync>>,
}

impl Endpoints {
    /// The endpoints of `registry`, ready when `ready` says so.
    pub fn new(registry: Registry, ready: Readiness) -> Endpoints {
        Endpoints {
            registry,
            ready,
            refresh: None,
        }
    }

    /// Runs `refresh` before every scrape, to set gauges that mirror state.
    pub fn refreshing(mut self, refresh: impl Fn() + Send + Sync + 'static) -> Endpoints {
        self.refresh = Some(Box::new(refresh));
        self
    }

    /// The registry in Prometheus' text format (OpenMetrics 1.0).
    pub fn encode(&self) -> String {
        if let Some(refresh) = &self.refresh {
            refresh();
        }
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }

    /// Whether the daemon is ready, as `/readyz` answers it.
    pub fn ready(&self) -> Result<(), NotReady> {
        (self.ready)()
    }
}

/// Gives an enum the label values of Prometheus' convention (lower case, snake case)
/// where the derive would write the variant's name as it is spelled:
/// `label_values!(Pass { Full => "full", Changes => "changes" });`
#[macro_export]
macro_rules! label_values {
    ($ty:ty { $($variant:ident => $text:literal),* $(,)? }) => {
        impl $crate::prometheus_client::encoding::EncodeLabelValue for $ty {
            fn encode(
                &self,
                encoder: &mut $crate::prometheus_client::encoding::LabelValueEncoder<'_>,
            ) -> Result<(), std::fmt::Error> {
                std::fmt::Write::write_str(encoder, match self { $(Self::$variant => $text),* })
            }
        }
    };
}

/// Buckets for durations from half a millisecond to about half a minute, doubling.
pub fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 17))
}

/// Buckets for counts of 1 to 1,024, doubling (batch sizes).
pub fn sizes() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 11))
}

/// `/metrics`, `/healthz` and `/readyz` over `endpoints`.
pub fn router(endpoints: Arc<Endpoints>) -> Router {
    let scraped = endpoints.clone();
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let e = scraped.clone();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        e.encode(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let e = endpoints.clone();
                async move { readyz(&e) }
            }),
        )
}

fn readyz(endpoints: &Endpoints) -> Response {
    match endpoints.ready() {
        Ok(()) => "ok\n".into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

/// Serves the endpoints on `listen` from a thread of their own, so a daemon that is not
/// async (the agent) needs no runtime. The address is bound before this returns: a port
/// in use is the caller's error, not a log line.
pub fn serve(listen: SocketAddr, endpoints: Endpoints) -> Result<(), ServeError> {
    spawn(listen, router(Arc::new(endpoints)))?;
    tracing::info!(%listen, "serving /metrics, /healthz and /readyz");
    Ok(())
}

/// kube-proxy's health port, where cloud load balancers check a node for services of
/// `externalTrafficPolicy: Cluster`.
pub const KUBE_PROXY_HEALTH_PORT: u16 = 10256;
/// kube-proxy's metrics port, where `/proxyMode` tells which proxy runs.
pub const KUBE_PROXY_METRICS_PORT: u16 = 10249;

/// Answers on `ip` what is asked of a node's kube-proxy, for a daemon that does its work:
/// `/healthz` on [`KUBE_PROXY_HEALTH_PORT`] as kube-proxy writes it (200 or 503, and
/// JSON with `lastUpdated`, the time `last_updated` gives), and `/proxyMode` on
/// [`KUBE_PROXY_METRICS_PORT`] (`mode`).
pub fn serve_kube_proxy(
    ip: std::net::IpAddr,
    mode: &'static str,
    ready: Readiness,
    last_updated: Box<dyn Fn() -> std::time::SystemTime + Send + Sync>,
) -> Result<(), ServeError> {
    let (ready, last_updated) = (Arc::new(ready), Arc::new(last_updated));
    let health = Router::new().route(
        "/healthz",
        get(move || {
            let status = match ready() {
                Ok(()) => StatusCode::OK,
                Err(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            let body = format!(
                r#"{{"lastUpdated": "{}","currentTime": "{}"}}"#,
                humantime::format_rfc3339_millis(last_updated()),
                humantime::format_rfc3339_millis(std::time::SystemTime::now())
            );
            async move { (status, [(header::CONTENT_TYPE, "application/json")], body) }
        }),
    );
    spawn((ip, KUBE_PROXY_HEALTH_PORT).into(), health)?;
    let mode = Router::new().route("/proxyMode", get(move || async move { mode }));
    spawn((ip, KUBE_PROXY_METRICS_PORT).into(), mode)?;
    tracing::info!(%ip, "answering kube-proxy's /healthz and /proxyMode");
    Ok(())
}

/// Serves `app` on `listen` from a thread of its own, bound before it returns.
fn spawn(listen: SocketAddr, app: Router) -> Result<(), ServeError> {
    let listener = std::net::TcpListener::bind(listen)
        .and_then(|l| l.set_nonblocking(true).map(|_| l))
        .map_err(|source| ServeError::Listen {
            addr: listen,
            source,
        })?;
    std::thread::Builder::new()
        .name("corvid-metrics".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return tracing::error!("metrics: starting the runtime: {e}"),
            };
            rt.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => {
                        if let Err(e) = axum::serve(l, app).await {
                            tracing::error!("metrics: serving on {listen}: {e}");
                        }
                    }
                    Err(e) => tracing::error!("metrics: listening on {listen}: {e}"),
                }
            })
        })
        .map_err(ServeError::Thread)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn endpoints_answer_and_follow_readiness() {
        let mut registry = Registry::default();
        let hits = Counter::<u64>::default();
        registry.register("corvid_test_hits", "Hits.", hits.clone());
        let up = Arc::new(AtomicBool::new(false));
        let flag = up.clone();
        let endpoints = Endpoints::new(
            registry,
            Box::new(move || {
                if flag.load(Ordering::Relaxed) {
                    Ok(())
                } else {
                    Err("not synced".into())
                }
            }),
        );
        hits.inc();
        assert!(endpoints.encode().contains("corvid_test_hits_total 1\n"));
        assert_eq!(endpoints.ready(), Err("not synced".into()));
        up.store(true, Ordering::Relaxed);
        assert_eq!(endpoints.ready(), Ok(()));
    }

    #[test]
    fn serve_reports_a_port_in_use() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let e = serve(
            addr,
            Endpoints::new(Registry::default(), Box::new(|| Ok(()))),
        )
        .unwrap_err();
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }
}
