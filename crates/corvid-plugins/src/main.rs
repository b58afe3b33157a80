//! The multi-call plugin binary: run as `bridge`, `host-local` or `loopback` (a link
//! named so), or as `corvid-plugins NAME`.

use std::path::Path;

fn main() {
    // stdout is the CNI result channel: logs go to stderr only, warnings and worse unless
    // RUST_LOG asks for more. Without RUST_LOG no filter is parsed: plugins start often.
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => logs.with_env_filter(filter).init(),
        Err(_) => logs.with_max_level(tracing::Level::WARN).init(),
    }
    let mut argv = std::env::args();
    let invoked = argv.next().unwrap_or_default();
    let mut name = Path::new(&invoked)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
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
