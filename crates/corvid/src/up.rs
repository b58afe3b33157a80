//! `corvid up`: the whole stack on one machine. The controller on the embedded store, an
//! agent for this host, and a default dual-stack network with masquerade; then it prints
//! the CNI configuration that attaches containers to that network and stays in the
//! foreground.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use corvid_api::{Client, Network, NetworkCreate, Subnet, SubnetCreate};
use serde_json::json;

/// Arguments of `corvid up`.
#[derive(Args)]
pub struct UpArgs {
    /// Address the controller listens on.
    #[arg(long, env = "CORVID_LISTEN", default_value = "127.0.0.1:9696")]
    listen: SocketAddr,
    /// Where the controller keeps its state.
    #[arg(long, default_value = "/var/lib/corvid")]
    state_dir: PathBuf,
    /// This host's ID; the hostname by default.
    #[arg(long, env = "CORVID_HOST_ID")]
    host_id: Option<String>,
    /// Name of the default network (and of its CNI configuration).
    #[arg(long, default_value = "corvid")]
    network: String,
    /// The default network's IPv4 subnet.
    #[arg(long, default_value = "10.77.0.0/16")]
    subnet: ipnet::Ipv4Net,
    /// The default network's IPv6 subnet (a unique local /64 by default).
    #[arg(long, default_value = "fd77:0:0:1::/64", conflicts_with = "no_ipv6")]
    ipv6_cidr: ipnet::Ipv6Net,
    /// An IPv4-only default network: containers get no IPv6 address.
    #[arg(long)]
    no_ipv6: bool,
    /// Where the agent serves /metrics, /healthz and /readyz (`corvid doctor` looks there).
    #[arg(long, env = "CORVID_METRICS_LISTEN", default_value = "127.0.0.1:9697")]
    metrics_listen: SocketAddr,
    /// Seconds between the agent's full comparisons of the host with the controller.
    #[arg(long, default_value_t = 60)]
    resync: u64,
    /// Where the CNI configuration list is written.
    #[arg(long, env = "NETCONFPATH", default_value = "/etc/cni/net.d")]
    conf_dir: PathBuf,
    /// Have the agent filter ports by their security groups (as `corvid agent
    /// --security-groups`): the ports the API and the Docker driver make; the CNI
    /// plugin's have port security off.
    #[arg(long, env = "CORVID_SECURITY_GROUPS")]
    security_groups: bool,
}

/// The default network, with a subnet in each of `cidrs`' families, created on the first
/// run and found afterwards: a subnet of a family the network lacks is added (an IPv4
/// network of an earlier corvid becomes dual stack), one it has is kept as it is.
fn default_network(
    client: &Client,
    name: &str,
    cidrs: &[ipnet::IpNet],
) -> Result<(Network, Vec<Subnet>), corvid_api::ApiError> {
    let (nets, _) = client.list::<Network>(&[("name", name)])?;
    let net = match nets.into_iter().next() {
        Some(n) => n,
        None => client.create(NetworkCreate {
            name: Some(name.to_string()),
            masquerade: Some(true),
            ..Default::default()
        })?,
    };
    let mut subnets = Vec::new();
    for id in &net.subnets {
        subnets.push(client.get::<Subnet>(id)?);
    }
    for cidr in cidrs {
        if subnets
            .iter()
            .any(|s| s.cidr.addr().is_ipv4() == cidr.addr().is_ipv4())
        {
            continue;
        }
        subnets.push(client.create(SubnetCreate {
            network_id: net.id.clone(),
            name: Some(name.to_string()),
            cidr: Some(cidr.trunc()),
            ip_version: Some(if cidr.addr().is_ipv4() { 4 } else { 6 }),
            ..Default::default()
        })?);
    }
    Ok((net, subnets))
}

/// Runs the stack until SIGINT or SIGTERM.
pub fn run(a: UpArgs) -> ExitCode {
    match up(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("up: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn up(a: UpArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.state_dir)
        .with_context(|| format!("create {}", a.state_dir.display()))?;
    let config = corvid_controller::Config {
        listen: a.listen,
        store: format!("redb:{}", a.state_dir.join("state.redb").display()),
        token: None,
        tls: None,
        max_body: corvid_controller::DEFAULT_MAX_BODY,
        client_timeout: corvid_controller::DEFAULT_CLIENT_TIMEOUT,
    };
    let controller =
        std::thread::spawn(move || corvid_controller::run(config, crate::signal::stop_requested()));
    let url = format!("http://{}", a.listen);
    let client = Client::new(&url);
    let start = Instant::now();
    while client.request("GET", "/", None).is_err() {
        if controller.is_finished() {
            return match controller.join() {
                Ok(Err(e)) => Err(e).context("the controller stopped"),
                _ => Err(anyhow!("the controller stopped")),
            };
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the controller did not answer on {url}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut cidrs = vec![ipnet::IpNet::V4(a.subnet)];
    if !a.no_ipv6 {
        cidrs.push(ipnet::IpNet::V6(a.ipv6_cidr));
    }
    let (net, subnets) =
        default_network(&client, &a.network, &cidrs).context("the default network")?;
    // A network's ID gives each port an address in every subnet of it; one subnet's, in
    // that subnet alone.
    let (target, subnets): (&str, Vec<&Subnet>) = if a.no_ipv6 {
        let v4 = subnets
            .iter()
            .find(|s| s.cidr.addr().is_ipv4())
            .ok_or_else(|| anyhow!("network {} has no IPv4 subnet", a.network))?;
        (&v4.id, vec![v4])
    } else {
        (&net.id, subnets.iter().collect())
    };
    let host_id = a.host_id.unwrap_or_else(corvid_net::hostname);
    let mut agent = corvid_agent::Agent::new(corvid_agent::Config {
        host_id: host_id.clone(),
        controller: url.clone(),
        credentials: Default::default(),
        underlay_ip: None,
        resync: Duration::from_secs(a.resync.max(1)),
        public_interface: None,
        security_groups: a.security_groups,
        all_routers: false,
        direct_routing: false,
        // A workstation's conntrack is left as its owner set it.
        conntrack: Default::default(),
    })
    .context("agent")?;
    corvid_metrics::serve(
        a.metrics_listen,
        corvid_agent::metrics::endpoints(agent.health()),
    )?;
    std::thread::spawn(move || agent.run());

    let conflist = json!({
        "cniVersion": "1.1.0",
        "name": a.network,
        "plugins": [{
            "type": "corvid",
            "mpurl": url,
            "project": net.project_id,
            "subnet": target,
            "hostId": host_id,
        }]
    });
    let path = a.conf_dir.join(format!("{}.conflist", a.network));
    std::fs::create_dir_all(&a.conf_dir)
        .and_then(|_| {
            std::fs::write(
                &path,
                serde_json::to_string_pretty(&conflist).unwrap_or_default() + "\n",
            )
        })
        .with_context(|| format!("write {}", path.display()))?;
    println!(
        "corvid is up: controller {url}, agent for host {host_id}, network {} ({}).\n\
         CNI configuration written to {}.\n\n\
         Attach two namespaces and ping (install the plugins once with `corvid cni install`):\n  \
         corvid cni netns add a && corvid cni netns add b\n  \
         corvid cni add {net} /run/netns/a && corvid cni add {net} /run/netns/b\n  \
         ip netns exec a ping <the address b got>\n\n\
         Stop with Ctrl-C.",
        a.network,
        subnets
            .iter()
            .map(|s| s.cidr.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        path.display(),
        net = a.network,
    );
    match controller.join() {
        Ok(r) => Ok(r?),
        Err(_) => bail!("the controller thread panicked"),
    }
}
