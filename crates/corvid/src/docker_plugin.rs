//! `corvid docker-plugin`: the Docker network and IPAM driver, on a unix socket (or one
//! systemd passes) or on TCP with a spec file.

use anyhow::Context;

use crate::{signal, HostArgs, MetricsArgs};

/// Arguments of `corvid docker-plugin`.
#[derive(clap::Args)]
pub struct DockerPluginArgs {
    #[command(flatten)]
    host: HostArgs,
    /// The socket Docker finds the plugin at (its file name is the driver's name).
    #[arg(long, default_value = "/run/docker/plugins/corvid.sock")]
    socket: std::path::PathBuf,
    /// The group (name or number) that may use the socket, which is then 0660; without
    /// one it is 0600.
    #[arg(long)]
    socket_group: Option<String>,
    /// Serve on the socket systemd passed (corvid-docker-plugin.socket) instead.
    #[arg(long, conflicts_with_all = ["listen", "socket_group"])]
    socket_activated: bool,
    #[command(flatten)]
    metrics: MetricsArgs,
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

/// Runs the driver until a stop signal.
pub fn run(a: DockerPluginArgs) -> anyhow::Result<()> {
    let driver = corvid_docker::Driver::new(corvid_docker::Config {
        controller: a.host.client.url(),
        credentials: a.host.client.credentials()?,
        host_id: a.host.host_id,
        scope: a.scope,
        default_range: a.default_range,
        default_prefix: a.default_prefix,
        dst_prefix: "eth".into(),
    })?;
    a.metrics
        .serve(|| corvid_docker::metrics::endpoints(driver.client().clone()))?;
    let listen = match (a.listen, a.socket_activated) {
        (Some(addr), _) => corvid_docker::server::Listen::Tcp { addr, spec: a.spec },
        (None, true) => corvid_docker::server::Listen::Activated,
        (None, false) => corvid_docker::server::Listen::Unix {
            path: a.socket,
            group: a.socket_group.as_deref().map(group_id).transpose()?,
        },
    };
    Ok(corvid_docker::server::serve(
        driver,
        &listen,
        signal::stop_requested(),
    )?)
}

/// The ID of group `name` (a name from the group database, or a number).
fn group_id(name: &str) -> anyhow::Result<u32> {
    if let Ok(gid) = name.parse() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(name).with_context(|| format!("--socket-group {name}"))? {
        Some(g) => Ok(g.gid.as_raw()),
        None => anyhow::bail!("--socket-group: no group named {name}"),
    }
}
