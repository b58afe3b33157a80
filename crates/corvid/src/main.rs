//! The corvid command line: argument parsing only; the work is done by the libraries.

mod cni;
#[cfg(feature = "docker")]
mod docker_plugin;
mod docs;
mod doctor;
#[cfg(feature = "k8s")]
mod kube_watch;
#[cfg(feature = "kurma")]
mod kurma;
mod signal;
mod up;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// corvid: container networking.
#[derive(Parser)]
#[command(
    name = "corvid",
    version,
    about = "Container networking",
    propagate_version = true
)]
struct Cli {
    /// The least severe level logged: error, warn, info, debug or trace (or a RUST_LOG
    /// style filter). RUST_LOG, when set, wins.
    #[arg(long, global = true, env = "CORVID_LOG_LEVEL", default_value = "info")]
    log_level: String,
    /// Log lines as text, or as one JSON object per line.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written (always to stderr).
#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// ureq writes each request's headers, the controller's token among them, at debug: never
/// shown, whatever the level asked.
const QUIET_CLIENT: &str = "ureq::unit=info";

/// Sends log events to stderr, filtered by RUST_LOG or else by `level`.
fn init_logging(level: &str, format: LogFormat) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.is_empty() => EnvFilter::try_new(&env).context("RUST_LOG")?,
        _ => EnvFilter::try_new(level).with_context(|| format!("--log-level {level}"))?,
    }
    .add_directive(QUIET_CLIENT.parse()?);
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    Ok(())
}

#[derive(Subcommand)]
enum Command {
    /// CNI: install the plugins, attach namespaces to networks by hand, list attachments.
    Cni(cni::CniArgs),
    /// Run the network controller: the Neutron-shaped REST API over redb or etcd.
    Controller(ControllerArgs),
    /// Run this host's agent: plug the ports bound to it, link it into the overlay.
    Agent(AgentArgs),
    /// Run everything on this machine: controller, agent and a default network.
    Up(up::UpArgs),
    /// Run the Docker network and IPAM driver (unix socket, or TCP with a spec file).
    #[cfg(feature = "docker")]
    DockerPlugin(docker_plugin::DockerPluginArgs),
    /// Run the Kubernetes watcher: namespaces to networks, pods to ports and annotations.
    #[cfg(feature = "k8s")]
    KubeWatch(kube_watch::KubeWatchArgs),
    /// Kurma network plugins: run the networking pod, set up pods, build corvid's image.
    #[cfg(feature = "kurma")]
    Kurma(kurma::KurmaArgs),
    /// Check this host and say what is wrong: plugins, configurations, the controller and
    /// the agent, kernel modules, leftovers (with the command that removes each).
    Doctor(doctor::DoctorArgs),
    /// Write the man pages and shell completions (for packaging).
    #[command(hide = true)]
    GenerateDocs(docs::DocsArgs),
}

/// How a process reaches the controller.
#[derive(clap::Args)]
struct ControllerClientArgs {
    /// The controller's URL [default: http://127.0.0.1:9696; `corvid doctor` checks no
    /// controller unless one is named].
    #[arg(long, env = "CORVID_CONTROLLER")]
    controller: Option<String>,
    /// The controller's token (`ps` shows it: prefer --token-file).
    #[arg(long, env = "CORVID_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file holding the controller's token.
    #[arg(long, env = "CORVID_TOKEN_FILE", conflicts_with = "token")]
    token_file: Option<std::path::PathBuf>,
    /// The CA (PEM) the controller's certificate must chain to, for an https:// URL.
    #[arg(long, env = "CORVID_CA")]
    ca: Option<std::path::PathBuf>,
    /// This client's certificate (PEM), for a controller that asks for one.
    #[arg(long, env = "CORVID_CERT", requires = "key")]
    cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(long, env = "CORVID_KEY", requires = "cert")]
    key: Option<std::path::PathBuf>,
}

impl ControllerClientArgs {
    /// The controller's URL, given or the default.
    fn url(&self) -> String {
        self.controller
            .clone()
            .unwrap_or_else(|| "http://127.0.0.1:9696".into())
    }

    /// The token (from the file when one is named) and the TLS side.
    fn credentials(&self) -> Result<corvid_api::Credentials, corvid_api::TlsError> {
        Ok(corvid_api::Credentials {
            token: token(&self.token, &self.token_file)?,
            tls: corvid_api::Tls {
                ca: self.ca.clone(),
                cert: self.cert.clone(),
                key: self.key.clone(),
            },
        })
    }
}

/// The token given, or the one in the file given.
fn token(
    given: &Option<String>,
    file: &Option<std::path::PathBuf>,
) -> Result<Option<String>, corvid_api::TlsError> {
    match file {
        Some(f) => corvid_api::tls::read_token(f).map(Some),
        None => Ok(given.clone()),
    }
}

/// Where a daemon serves /metrics, /healthz and /readyz.
#[derive(clap::Args)]
struct MetricsArgs {
    /// Serve /metrics, /healthz and /readyz on this address (none when not given).
    #[arg(long, env = "CORVID_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
}

impl MetricsArgs {
    /// Serves `endpoints` when an address was given.
    fn serve(
        &self,
        endpoints: impl FnOnce() -> corvid_metrics::Endpoints,
    ) -> Result<(), corvid_metrics::ServeError> {
        match self.metrics_listen {
            Some(addr) => corvid_metrics::serve(addr, endpoints()),
            None => Ok(()),
        }
    }
}

/// How a host-side process reaches the controller and names its host.
#[derive(clap::Args)]
struct HostArgs {
    /// This host's ID, as ports name it in binding:host_id (the host name by default, as
    /// the kubelet names its node).
    #[arg(long, env = "CORVID_HOST_ID", default_value_t = corvid_net::hostname())]
    host_id: String,
    #[command(flatten)]
    client: ControllerClientArgs,
}

/// Arguments of `corvid agent`.
#[derive(clap::Args)]
struct AgentArgs {
    #[command(flatten)]
    host: HostArgs,
    /// The address other hosts reach this one at (found from the route to the controller
    /// when not given).
    #[arg(long, env = "CORVID_UNDERLAY_IP")]
    underlay_ip: Option<std::net::IpAddr>,
    /// Seconds between full comparisons of the host with the controller (up to a third
    /// more while the feed is quiet).
    #[arg(long, default_value_t = 60)]
    resync: u64,
    /// The interface on the public network: this host answers for floating IPs there.
    #[arg(long, env = "CORVID_PUBLIC_INTERFACE")]
    public_interface: Option<String>,
    /// Filter the ports plugged here by their security groups (ports with port security
    /// on, which API ports have by default). Off: no port is filtered, and the filter an
    /// earlier agent left is removed.
    #[arg(long, env = "CORVID_SECURITY_GROUPS")]
    security_groups: bool,
    /// Hold every router's networks here, not only those of routers with a port bound
    /// here: what a Kubernetes node needs, which reaches every pod with or without pods
    /// of its own.
    #[arg(long, env = "CORVID_ALL_ROUTERS")]
    all_routers: bool,
    /// Route to ports on hosts whose underlay address is in this host's underlay subnet
    /// straight over the underlay, without encapsulation (as flannel's DirectRouting);
    /// VXLAN for the others. Every network on this host must then have subnets of its
    /// own: direct routes share the host's main table.
    #[arg(long, env = "CORVID_DIRECT_ROUTING")]
    direct_routing: bool,
    /// Answer on this address what is asked of a node's kube-proxy, which corvid replaces:
    /// its health (port 10256, `/healthz`, what cloud load balancers check) and its mode
    /// (port 10249, `/proxyMode`).
    #[arg(long, env = "CORVID_KUBE_PROXY_LISTEN")]
    kube_proxy_listen: Option<std::net::IpAddr>,
    /// Seconds conntrack remembers a TCP connection one side closed (CLOSE_WAIT), so that
    /// a translated one still open the other way keeps its translation; 0 leaves the
    /// kernel's 60. kube-proxy's flag and default.
    #[arg(
        long,
        env = "CORVID_CONNTRACK_TCP_TIMEOUT_CLOSE_WAIT",
        default_value_t = 3600
    )]
    conntrack_tcp_timeout_close_wait: u64,
    /// Seconds conntrack remembers an idle open TCP connection; 0 leaves the kernel's
    /// five days. kube-proxy's flag and default.
    #[arg(
        long,
        env = "CORVID_CONNTRACK_TCP_TIMEOUT_ESTABLISHED",
        default_value_t = 86400
    )]
    conntrack_tcp_timeout_established: u64,
    #[command(flatten)]
    metrics: MetricsArgs,
}

/// Arguments of `corvid controller`.
#[derive(clap::Args)]
struct ControllerArgs {
    /// Address to listen on.
    #[arg(long, env = "CORVID_LISTEN", default_value = "127.0.0.1:9696")]
    listen: std::net::SocketAddr,
    /// Where the state lives: redb:<path> (embedded) or etcd:<url>[,<url>...].
    #[arg(
        long,
        env = "CORVID_STORE",
        default_value = "redb:/var/lib/corvid/state.redb"
    )]
    store: String,
    /// Require this token in X-Auth-Token on every request (`ps` shows it: prefer
    /// --token-file).
    #[arg(long, env = "CORVID_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file holding the token every request must carry.
    #[arg(long, env = "CORVID_TOKEN_FILE", conflicts_with = "token")]
    token_file: Option<std::path::PathBuf>,
    /// Serve https with this certificate chain (PEM).
    #[arg(long, env = "CORVID_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "CORVID_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Require client certificates that chain to this CA (PEM).
    #[arg(long, env = "CORVID_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<std::path::PathBuf>,
    /// The largest request body taken, in bytes; larger ones are answered 413.
    #[arg(long, env = "CORVID_MAX_BODY", default_value_t = corvid_controller::DEFAULT_MAX_BODY)]
    max_body: usize,
    /// Seconds a client may leave the controller's packets unanswered (keepalive probes
    /// from half of it) before its connection is dropped: a host gone without closing
    /// frees its watch then.
    #[arg(
        long,
        env = "CORVID_CLIENT_TIMEOUT",
        default_value_t = corvid_controller::DEFAULT_CLIENT_TIMEOUT.as_secs(),
        value_parser = clap::value_parser!(u64).range(3..)
    )]
    client_timeout: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(&cli.log_level, cli.log_format) {
        eprintln!("corvid: {e}");
        return ExitCode::from(2);
    }
    match cli.command {
        Command::Cni(args) => cni::run(args),
        Command::Controller(a) => {
            let token = match token(&a.token, &a.token_file) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!("controller: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let tls = match (a.tls_cert, a.tls_key) {
                (Some(cert), Some(key)) => Some(corvid_controller::tls::TlsFiles {
                    cert,
                    key,
                    client_ca: a.tls_client_ca,
                }),
                _ => None,
            };
            let config = corvid_controller::Config {
                listen: a.listen,
                store: a.store,
                token,
                tls,
                max_body: a.max_body,
                client_timeout: std::time::Duration::from_secs(a.client_timeout),
            };
            match corvid_controller::run(config, signal::stop_requested()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("controller: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Up(a) => up::run(a),
        #[cfg(feature = "k8s")]
        Command::KubeWatch(a) => kube_watch::run(a),
        #[cfg(feature = "kurma")]
        Command::Kurma(a) => kurma::run(a),
        Command::GenerateDocs(a) => exit("generate-docs", docs::run(a)),
        Command::Doctor(a) => doctor::run(a),
        #[cfg(feature = "docker")]
        Command::DockerPlugin(a) => exit("docker-plugin", docker_plugin::run(a)),
        Command::Agent(a) => exit("agent", agent(a)),
    }
}

/// Logs a daemon's failure as the last thing it says.
fn exit(daemon: &str, outcome: anyhow::Result<()>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{daemon}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A duration in seconds, none for 0.
fn seconds(s: u64) -> Option<std::time::Duration> {
    (s > 0).then(|| std::time::Duration::from_secs(s))
}

fn agent(a: AgentArgs) -> anyhow::Result<()> {
    let config = corvid_agent::Config {
        host_id: a.host.host_id,
        controller: a.host.client.url(),
        credentials: a.host.client.credentials()?,
        underlay_ip: a.underlay_ip,
        resync: std::time::Duration::from_secs(a.resync.max(1)),
        public_interface: a.public_interface,
        security_groups: a.security_groups,
        all_routers: a.all_routers,
        direct_routing: a.direct_routing,
        conntrack: corvid_net::conntrack::TcpTimeouts {
            close_wait: seconds(a.conntrack_tcp_timeout_close_wait),
            established: seconds(a.conntrack_tcp_timeout_established),
        },
    };
    let mut agent = corvid_agent::Agent::new(config)?;
    let health = agent.health();
    if let Some(ip) = a.kube_proxy_listen {
        let (ready, last) = (health.clone(), health.clone());
        corvid_metrics::serve_kube_proxy(
            ip,
            "corvid",
            Box::new(move || ready.ready()),
            Box::new(move || last.last_contact()),
        )?;
    }
    a.metrics
        .serve(|| corvid_agent::metrics::endpoints(health))?;
    agent.run()
}
