//! `corvid kurma`: the Kurma network-plugin runtime (the plugin host and what a runtime
//! does for each pod) and the build of corvid's own plugin image.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Args, Subcommand};
use corvid_kurma::runtime::{host, pod, Layout, DEFAULT_DIR};

#[derive(Args)]
pub struct KurmaArgs {
    /// The runtime's directory: images, the netns volume, plugin state, pod records.
    #[arg(long, global = true, default_value = DEFAULT_DIR)]
    dir: PathBuf,
    #[command(subcommand)]
    command: KurmaCommand,
}

#[derive(Subcommand)]
enum KurmaCommand {
    /// Run the networking pod of a Kurma configuration until SIGINT or SIGTERM.
    RunNetworks {
        /// The configuration (its pod_networks, failurePolicy, restartPlugins, pluginTimeout).
        #[arg(long)]
        config: PathBuf,
        #[command(flatten)]
        metrics: crate::MetricsArgs,
    },
    /// Set up or take down a pod's networks, as the runtime does for each pod.
    Pod {
        #[command(subcommand)]
        command: PodCommand,
    },
    /// The pods set up here and their results, as JSON.
    Pods,
    /// Build corvid's plugin image (an ACI and an OCI layout).
    BuildImage {
        /// The static plugin binary; by default the corvid-plugins beside this corvid.
        #[arg(long)]
        plugins: Option<PathBuf>,
        /// Where the images go.
        #[arg(long, default_value = ".")]
        out: PathBuf,
        /// The image's version label and OCI tag.
        #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
        image_version: String,
    },
}

#[derive(Subcommand)]
enum PodCommand {
    /// Make the pod's network namespace and add it to its networks; prints its record.
    Add {
        /// The pod's UUID.
        uuid: String,
        /// A network to join (repeatable); the configuration's defaults when none.
        #[arg(long = "network")]
        networks: Vec<String>,
    },
    /// Take the pod off its networks and remove its namespace.
    Del {
        /// The pod's UUID.
        uuid: String,
    },
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("corvid kurma: {e}");
    ExitCode::FAILURE
}

fn print_json(value: &impl serde::Serialize) -> ExitCode {
    match serde_json::to_string_pretty(value) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// Runs `corvid kurma ...`.
pub fn run(args: KurmaArgs) -> ExitCode {
    let layout = Layout::new(args.dir);
    match args.command {
        KurmaCommand::RunNetworks { config, metrics } => {
            let text = match std::fs::read_to_string(&config) {
                Ok(t) => t,
                Err(e) => return fail(format!("{}: {e}", config.display())),
            };
            if let Err(e) = metrics.serve(corvid_kurma::runtime::metrics::endpoints) {
                return fail(e);
            }
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            std::thread::spawn(move || {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    rt.block_on(crate::signal::stop_requested());
                    flag.store(true, Ordering::Relaxed);
                }
            });
            match host::run(&layout, &text, &stop) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        KurmaCommand::Pod {
            command: PodCommand::Add { uuid, networks },
        } => match pod::add(&layout, &uuid, &networks) {
            Ok(record) => print_json(&record),
            Err(e) => fail(e),
        },
        KurmaCommand::Pod {
            command: PodCommand::Del { uuid },
        } => match pod::del(&layout, &uuid) {
            Ok(failures) if failures.is_empty() => ExitCode::SUCCESS,
            Ok(failures) => fail(format!("pod {uuid}: {}", failures.join("; "))),
            Err(e) => fail(e),
        },
        KurmaCommand::Pods => match pod::list(&layout) {
            Ok(pods) => print_json(&pods),
            Err(e) => fail(e),
        },
        KurmaCommand::BuildImage {
            plugins,
            out,
            image_version,
        } => {
            let binary = match plugins.map_or_else(corvid_plugins::install::sibling_binary, Ok) {
                Ok(b) => b,
                Err(e) => return fail(format!("cannot find my own executable: {e}")),
            };
            match corvid_kurma::image::build(
                &binary,
                &corvid_plugins::PLUGIN_NAMES,
                &image_version,
                &out,
            ) {
                Ok(built) => {
                    println!("{}", built.aci.display());
                    println!("{}", built.oci.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
    }
}
