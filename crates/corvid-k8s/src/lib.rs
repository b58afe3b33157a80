//! Kubernetes onto corvid: `corvid kube-watch` gives every namespace a network and every
//! scheduled pod a port, and writes the port onto the pod as the `corvid.io/port`
//! annotation, which the node's `corvid-k8s` CNI plugin plugs from.

#![deny(missing_docs)]

pub mod annotation;
pub mod ids;
pub mod leader;
pub mod watcher;

use std::path::Path;

/// A client of the API server: `kubeconfig` when given, else `$KUBECONFIG` (or
/// `~/.kube/config`), else the in-cluster service account.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<kube::Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("reading kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            format!("no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a cluster: {e}")
        })?,
    };
    kube::Client::try_from(config).map_err(|e| format!("API server client: {e}"))
}
