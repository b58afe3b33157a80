//! The corvid command line: argument parsing only; the work is done by the libraries.

mod cni;
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
    #[command(subcommand)]
    command: Command,
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
}

/// How a host-side process reaches the controller and names its host.
#[derive(clap::Args)]
struct HostArgs {
    /// This host's ID, as ports name it in binding:host_id.
    #[arg(long, env = "CORVID_HOST_ID")]
    host_id: String,
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
    match Cli::parse().command {
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
                    eprintln!("corvid controller: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Up(a) => up::run(a),
        Command::DockerPlugin(a) => {
            let driver = corvid_docker::Driver::new(corvid_docker::Config {
                controller: a.host.controller,
                token: a.host.token,
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
                    eprintln!("corvid docker-plugin: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Agent(a) => {
            let config = corvid_agent::Config {
                host_id: a.host.host_id,
                controller: a.host.controller,
                token: a.host.token,
                underlay_ip: a.underlay_ip,
                resync: std::time::Duration::from_secs(a.resync.max(1)),
            };
            match corvid_agent::Agent::new(config) {
                Ok(mut agent) => agent.run(),
                Err(e) => {
                    eprintln!("corvid agent: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
