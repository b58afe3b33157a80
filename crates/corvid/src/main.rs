//! The corvid command line: argument parsing only; the work is done by the libraries.

mod cni;
mod kube_watch;
mod kurma;
mod signal;
mod up;

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

/// Sends log events to stderr, filtered by RUST_LOG or else by `level`.
fn init_logging(level: &str, format: LogFormat) -> Result<(), String> {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.is_empty() => {
            EnvFilter::try_new(&env).map_err(|e| format!("RUST_LOG: {e}"))?
        }
        _ => EnvFilter::try_new(level).map_err(|e| format!("--log-level {level}: {e}"))?,
    };
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
    DockerPlugin(DockerPluginArgs),
    /// Run the Kubernetes watcher: namespaces to networks, pods to ports and annotations.
    KubeWatch(kube_watch::KubeWatchArgs),
    /// Kurma network plugins: run the networking pod, set up pods, build corvid's image.
    Kurma(kurma::KurmaArgs),
}

/// How a process reaches the controller.
#[derive(clap::Args)]
struct ControllerClientArgs {
    /// The controller's URL.
    #[arg(
        long,
        env = "CORVID_CONTROLLER",
        default_value = "http://127.0.0.1:9696"
    )]
    controller: String,
    /// The controller's token.
    #[arg(long, env = "CORVID_TOKEN")]
    token: Option<String>,
}

/// How a host-side process reaches the controller and names its host.
#[derive(clap::Args)]
struct HostArgs {
    /// This host's ID, as ports name it in binding:host_id.
    #[arg(long, env = "CORVID_HOST_ID")]
    host_id: String,
    #[command(flatten)]
    client: ControllerClientArgs,
}

/// Arguments of `corvid docker-plugin`.
#[derive(clap::Args)]
struct DockerPluginArgs {
    #[command(flatten)]
    host: HostArgs,
    /// The socket Docker finds the plugin at (its file name is the driver's name).
    #[arg(long, default_value = "/run/docker/plugins/corvid.sock")]
    socket: std::path::PathBuf,
    /// Listen on this TCP address instead of the socket, announced by the --spec file.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// The spec file announcing --listen to Docker (its file name is the driver's name).
    #[arg(
        long,
        default_value = "/etc/docker/plugins/corvid.spec",
        requires = "listen"
    )]
    spec: std::path::PathBuf,
    /// Capability scope: local or global.
    #[arg(long, default_value = "local", value_parser = ["local", "global"])]
    scope: String,
    /// Range that pools for networks created without --subnet are carved from.
    #[arg(long, default_value = "10.213.0.0/16")]
    default_range: ipnet::IpNet,
    /// Prefix length of those pools.
    #[arg(long, default_value_t = 24)]
    default_prefix: u8,
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
    /// Seconds between full comparisons of the host with the controller.
    #[arg(long, default_value_t = 60)]
    resync: u64,
    /// The interface on the public network: this host answers for floating IPs there.
    #[arg(long)]
    public_interface: Option<String>,
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
    /// Require this token in X-Auth-Token on every request.
    #[arg(long, env = "CORVID_TOKEN")]
    token: Option<String>,
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
            let config = corvid_controller::Config {
                listen: a.listen,
                store: a.store,
                token: a.token,
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
        Command::KubeWatch(a) => kube_watch::run(a),
        Command::Kurma(a) => kurma::run(a),
        Command::DockerPlugin(a) => {
            let driver = corvid_docker::Driver::new(corvid_docker::Config {
                controller: a.host.client.controller,
                token: a.host.client.token,
                host_id: a.host.host_id,
                scope: a.scope,
                default_range: a.default_range,
                default_prefix: a.default_prefix,
                dst_prefix: "eth".into(),
            });
            let listen = match a.listen {
                Some(addr) => corvid_docker::server::Listen::Tcp { addr, spec: a.spec },
                None => corvid_docker::server::Listen::Unix(a.socket),
            };
            match corvid_docker::server::serve(driver, &listen, signal::stop_requested()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("docker-plugin: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Agent(a) => {
            let config = corvid_agent::Config {
                host_id: a.host.host_id,
                controller: a.host.client.controller,
                token: a.host.client.token,
                underlay_ip: a.underlay_ip,
                resync: std::time::Duration::from_secs(a.resync.max(1)),
                public_interface: a.public_interface,
            };
            match corvid_agent::Agent::new(config) {
                Ok(mut agent) => agent.run(),
                Err(e) => {
                    tracing::error!("agent: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
