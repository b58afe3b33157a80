//! Why the watcher stopped, or could not start, with what to do about it.

use corvid_api::{ApiError, TlsError};

/// A failure that ends the watcher.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No client of the API server could be made from the configuration found.
    #[error("API server: {context}: {source}")]
    Connect {
        /// Which configuration, and the step.
        context: String,
        /// kube's reason.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The API server refused or failed a request.
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    /// Another watcher holds the lease now.
    #[error("leadership lost ({0}): stopping so that only one watcher acts")]
    LeadershipLost(String),
    /// The controller refused or could not be reached.
    #[error("controller: {0}")]
    Controller(#[from] ApiError),
    /// The controller's TLS side or token could not be set up.
    #[error("controller: {0}")]
    Credentials(#[from] TlsError),
    /// No service range was given and the API server did not tell it.
    #[error(
        "cannot find the cluster's service range (no kubeadm-config in kube-system, and the \
         API server did not name it): pass --service-cidr, the API server's \
         --service-cluster-ip-range"
    )]
    NoServiceRange,
    /// The public network named on the command line does not exist.
    #[error(
        "the public network {0:?} does not exist: create it first, e.g. POST /v2.0/networks \
         {{\"network\": {{\"name\": \"{0}\", \"router:external\": true}}}} and a subnet for \
         its floating IPs, or name another with --public-network"
    )]
    NoPublicNetwork(String),
    /// The router named on the command line does not exist.
    #[error(
        "the router {0:?} does not exist: create it first (`openstack router create`), or \
         leave --router out and the watcher makes the cluster's own"
    )]
    NoRouter(String),
}

impl Error {
    /// kube's refusal of the configuration `context` names.
    pub(crate) fn connect<E: std::error::Error + Send + Sync + 'static>(
        context: impl Into<String>,
    ) -> impl FnOnce(E) -> Error {
        let context = context.into();
        move |e| Error::Connect {
            context,
            source: Box::new(e),
        }
    }
}
