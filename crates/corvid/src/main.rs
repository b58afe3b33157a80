//! The corvid command line: argument parsing only; the work is done by the libraries.

mod cni;

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
            match corvid_controller::run(config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("corvid controller: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
