//! Kubernetes onto corvid: `corvid kube-watch` gives every namespace a network and every
//! scheduled pod a port (named by the pod's UID, which is how the node's `corvid-k8s` CNI
//! plugin finds it), writes the port onto the pod as the `corvid.io/port` annotation, and
//! serves services. The `watcher` feature (default) holds all of that but the annotation
//! and the IDs, which is all the plugin links.

#![deny(missing_docs)]

pub mod annotation;
#[cfg(feature = "watcher")]
pub mod error;
pub mod ids;
#[cfg(feature = "watcher")]
pub mod leader;
#[cfg(feature = "watcher")]
pub mod metrics;
#[cfg(feature = "watcher")]
pub mod service_cidr;
#[cfg(feature = "watcher")]
pub mod watcher;

#[cfg(feature = "watcher")]
pub use error::Error;
#[cfg(feature = "watcher")]
use std::path::Path;

#[cfg(feature = "watcher")]
/// A client of the API server: `kubeconfig` when given, else `$KUBECONFIG` (or
/// `~/.kube/config`), else the in-cluster service account.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(Error::connect(format!(
                "reading kubeconfig {}",
                path.display()
            )))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(Error::connect(format!("kubeconfig {}", path.display())))?
        }
        None => kube::Config::infer().await.map_err(Error::connect(
            "no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a cluster",
        ))?,
    };
    client(config).map_err(Error::connect("API server client"))
}

#[cfg(feature = "watcher")]
/// kube's default client stack, but with TCP_NODELAY. Without it, the request that
/// follows the TLS handshake waited for the server's delayed ACK: 40 ms on every first
/// request, which is every request a CNI plugin makes.
fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use kube::client::ConfigExt;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut timed = hyper_timeout::TimeoutConnector::new(https);
    timed.set_connect_timeout(config.connect_timeout);
    // A watch that goes quiet is noticed: no read waits longer than this.
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    let hyper: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(timed);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(Box::<dyn std::error::Error + Send + Sync>::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}
