//! `corvid kube-watch`: the Kubernetes watcher (namespaces to networks, pods to ports).

use std::process::ExitCode;
use std::time::Duration;

use corvid_k8s::leader::Election;
use corvid_k8s::watcher::{Config, PodPool};

/// Arguments of `corvid kube-watch`.
#[derive(clap::Args)]
pub struct KubeWatchArgs {
    /// Kubeconfig of the API server; $KUBECONFIG, then the in-cluster service account, when
    /// not given.
    #[arg(long)]
    kubeconfig: Option<std::path::PathBuf>,
    #[command(flatten)]
    client: crate::ControllerClientArgs,
    #[command(flatten)]
    metrics: crate::MetricsArgs,
    /// The API server's --service-cluster-ip-range: the service network's subnet, given
    /// once per family on a dual-stack cluster (or comma-separated, as the API server
    /// takes it) [default: kubeadm's ClusterConfiguration, else the range the API server
    /// names].
    #[arg(long, env = "CORVID_SERVICE_CIDR", value_delimiter = ',', action = clap::ArgAction::Append)]
    service_cidr: Vec<ipnet::IpNet>,
    /// The network floating IPs come from; the watcher will not start while it is missing.
    #[arg(long, env = "CORVID_PUBLIC_NETWORK")]
    public_network: Option<String>,
    /// The router (ID or name) every namespace's network is attached to [default: the
    /// cluster router the watcher makes, with its gateway on --public-network].
    #[arg(long, env = "CORVID_ROUTER")]
    router: Option<String>,
    /// Where each namespace's subnets are carved from: once per family, twice for dual
    /// stack (`--pod-pool 10.64.0.0/10 --pod-pool fd64::/48`).
    #[arg(long, default_value = "10.64.0.0/10", action = clap::ArgAction::Append)]
    pod_pool: Vec<ipnet::IpNet>,
    /// Prefix length of each namespace's IPv4 subnet.
    #[arg(long, default_value_t = 16)]
    namespace_prefix: u8,
    /// Prefix length of each namespace's IPv6 subnet.
    #[arg(long, default_value_t = 64)]
    namespace_prefix6: u8,
    /// Seconds between sweeps for ports and networks whose pod or namespace is gone.
    #[arg(long, default_value_t = 300)]
    resync: u64,
    /// Namespace of the lease that elects the acting watcher.
    #[arg(long, default_value = "kube-system")]
    lease_namespace: String,
    /// Name of that lease.
    #[arg(long, default_value = "corvid-kube-watch")]
    lease_name: String,
    /// This watcher's identity in the lease (host name and PID when not given).
    #[arg(long)]
    identity: Option<String>,
    /// Seconds a lease holds without renewal: a standby takes over this long after the
    /// holder stops.
    #[arg(long, default_value_t = 10)]
    lease_seconds: u64,
}

/// Runs the watcher until it fails or a stop signal comes.
pub fn run(a: KubeWatchArgs) -> ExitCode {
    let identity = a
        .identity
        .unwrap_or_else(|| format!("{}-{}", corvid_net::hostname(), std::process::id()));
    let credentials = match a.client.credentials() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("kube-watch: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = a.metrics.serve(corvid_k8s::metrics::endpoints) {
        tracing::error!("kube-watch: {e}");
        return ExitCode::FAILURE;
    }
    let mut pod_pools: Vec<PodPool> = Vec::new();
    for cidr in a.pod_pool {
        if pod_pools
            .iter()
            .any(|p| p.cidr.addr().is_ipv4() == cidr.addr().is_ipv4())
        {
            tracing::error!(
                "kube-watch: --pod-pool takes one range per family; {cidr} is a second"
            );
            return ExitCode::from(2);
        }
        let prefix = if cidr.addr().is_ipv4() {
            a.namespace_prefix
        } else {
            a.namespace_prefix6
        };
        pod_pools.push(PodPool { cidr, prefix });
    }
    let config = Config {
        kubeconfig: a.kubeconfig,
        controller: a.client.url(),
        credentials,
        service_cidrs: a.service_cidr,
        public_network: a.public_network,
        router: a.router,
        pod_pools,
        resync: Duration::from_secs(a.resync.max(1)),
        election: Election {
            namespace: a.lease_namespace,
            name: a.lease_name,
            identity,
            duration: Duration::from_secs(a.lease_seconds.max(1)),
        },
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("kube-watch: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        tokio::select! {
            r = corvid_k8s::watcher::run(config) => match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("kube-watch: {e}");
                    ExitCode::FAILURE
                }
            },
            _ = crate::signal::stop_requested() => ExitCode::SUCCESS,
        }
    })
}
