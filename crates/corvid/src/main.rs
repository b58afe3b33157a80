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
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Cni(args) => cni::run(args),
    }
}
