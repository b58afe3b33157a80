//! The multi-call plugin binary: run as `bridge`, `host-local` or `loopback` (a link
//! named so), or as `corvid-plugins NAME`; the DHCP daemon as `dhcp daemon`; in corvid's Kurma plugin image also as
//! `/opt/network/add`, `del` and `netplugin`.

use std::path::Path;

use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

/// The log settings a network configuration may carry, as Multus and Calico take them.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct LogConf {
    /// A file the plugin appends its log lines to.
    log_file: Option<std::path::PathBuf>,
    /// The least severe level written there: error, warn, info, debug or trace.
    log_level: Option<String>,
}

/// Logs to stderr (`default` and worse unless RUST_LOG says otherwise) and, when the
/// configuration names a `logFile`, to that file at its `logLevel` (info by default).
/// stdout is the CNI result channel: nothing else is written there. RUST_LOG is read as
/// targets and levels (`info`, `corvid_net=debug`), not as EnvFilter's span and field
/// directives: those pull in a regex engine, a third of a MiB on every plugin start.
fn init_logging(conf: &[u8], default: Level) {
    // ureq writes each request's headers, the controller's token among them, at debug.
    let quiet = |t: Targets| t.with_target("ureq::unit", Level::INFO);
    let stderr_filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(default));
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .without_time()
        .with_filter(quiet(stderr_filter));
    let log: LogConf = serde_json::from_slice(conf).unwrap_or_default();
    let mut trouble = None;
    let file = log.log_file.and_then(|path| {
        let level = match log.log_level.as_deref().map(str::parse::<Level>) {
            None => Level::INFO,
            Some(Ok(level)) => level,
            Some(Err(_)) => {
                trouble = Some(format!(
                    "logLevel {:?} is not error, warn, info, debug or trace: info is used",
                    log.log_level.unwrap_or_default()
                ));
                Level::INFO
            }
        };
        let opened = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path);
        match opened {
            Ok(f) => Some(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::sync::Mutex::new(f))
                    .with_ansi(false)
                    .with_filter(quiet(Targets::new().with_default(level))),
            ),
            Err(e) => {
                trouble = Some(format!("logFile {}: {e}", path.display()));
                None
            }
        }
    });
    tracing_subscriber::registry()
        .with(stderr)
        .with(file)
        .init();
    if let Some(t) = trouble {
        tracing::warn!("{t}");
    }
}

fn main() {
    let mut argv = std::env::args();
    let invoked = argv.next().unwrap_or_default();
    let mut name = Path::new(&invoked)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(action) = corvid_plugins::kurma::action_for(&name) {
        init_logging(b"{}", Level::WARN);
        let args: Vec<String> = argv.collect();
        std::process::exit(corvid_plugins::kurma::main(action, &args));
    }
    if corvid_plugins::plugin_for(&name).is_none() {
        name = argv.next().unwrap_or_default();
    }
    let rest: Vec<String> = argv.collect();
    if name == "dhcp" && rest.first().is_some_and(|a| a == "daemon") {
        // A daemon's state changes are info lines.
        init_logging(b"{}", Level::INFO);
        std::process::exit(corvid_plugins::ipam::dhcp::daemon::main(&rest[1..]));
    }
    let Some(plugin) = corvid_plugins::plugin_for(&name) else {
        init_logging(b"{}", Level::WARN);
        eprintln!(
            "corvid-plugins: run me as one of {} (a link with that name), or as `corvid-plugins NAME`",
            corvid_plugins::PLUGIN_NAMES.join(", ")
        );
        std::process::exit(2);
    };
    std::process::exit(corvid_cni::skel::run_after(plugin, |conf| {
        init_logging(conf, Level::WARN)
    }));
}
