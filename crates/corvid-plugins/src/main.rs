//! The multi-call plugin binary: run as `bridge`, `host-local` or `loopback` (a link
//! named so), or as `corvid-plugins NAME`; in corvid's Kurma plugin image also as
//! `/opt/network/add`, `del` and `netplugin`.

use std::path::Path;

use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

fn main() {
    // stdout is the CNI result channel: logs go to stderr only, warnings and worse unless
    // RUST_LOG asks for more. RUST_LOG is read as targets and levels (`info`,
    // `corvid_net=debug`), not as EnvFilter's span and field directives: those pull in a
    // regex engine, a third of a MiB on every plugin start.
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(Level::WARN))
        // ureq writes each request's headers, the controller's token among them, at debug.
        .with_target("ureq::unit", Level::INFO);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .without_time(),
        )
        .with(filter)
        .init();
    let mut argv = std::env::args();
    let invoked = argv.next().unwrap_or_default();
    let mut name = Path::new(&invoked)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(action) = corvid_plugins::kurma::action_for(&name) {
        let args: Vec<String> = argv.collect();
        std::process::exit(corvid_plugins::kurma::main(action, &args));
    }
    if corvid_plugins::plugin_for(&name).is_none() {
        name = argv.next().unwrap_or_default();
    }
    let Some(plugin) = corvid_plugins::plugin_for(&name) else {
        eprintln!(
            "corvid-plugins: run me as one of {} (a link with that name), or as `corvid-plugins NAME`",
            corvid_plugins::PLUGIN_NAMES.join(", ")
        );
        std::process::exit(2);
    };
    std::process::exit(corvid_cni::skel::run(plugin));
}
