//! `corvid doctor`: checks a host and says what is wrong in words, with the command that
//! fixes each leftover. It only reads: plugins, network configurations, the controller
//! and the agent, kernel modules, and what attachments left behind (leases without a
//! namespace, agent veths without a port, nftables elements without an attachment).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use corvid_api::{Client, Host, Port};
use corvid_cni::exec::{conf_files, load_file, Runtime};
use corvid_cni::NetConfList;
use corvid_net::nftables::AttachmentTag;
use serde::Serialize;

/// Arguments of `corvid doctor`.
#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Directory of network configurations.
    #[arg(long, env = "NETCONFPATH", default_value = "/etc/cni/net.d")]
    conf_dir: PathBuf,
    /// Plugin directories, colon-separated.
    #[arg(long, env = "CNI_PATH", default_value = "/opt/cni/bin:/usr/lib/cni")]
    cni_path: String,
    /// Where runtimes cache ADD results (libcni's layout).
    #[arg(long, default_value = corvid_cni::exec::DEFAULT_CACHE_DIR)]
    cache_dir: PathBuf,
    /// Where host-local keeps its leases.
    #[arg(long, default_value = corvid_ipam::leases::DEFAULT_DATA_DIR)]
    ipam_dir: PathBuf,
    /// The agent's /metrics, /healthz and /readyz address.
    #[arg(long, default_value = "127.0.0.1:9697")]
    agent_metrics: String,
    #[command(flatten)]
    host: crate::HostArgs,
    /// Print the findings as one JSON document.
    #[arg(long)]
    json: bool,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    /// As it should be.
    Ok,
    /// Works, but something deserves a look.
    Warn,
    /// Broken: the fix says what to do.
    Fail,
    /// Not running where it was looked for, and nothing asked for it.
    #[serde(rename = "not running")]
    NotRunning,
}

impl Status {
    /// How the text report shows it.
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "[ok]",
            Status::Warn => "[warn]",
            Status::Fail => "[fail]",
            Status::NotRunning => "[off]",
        }
    }
}

/// One finding.
#[derive(Debug, Serialize)]
struct Finding {
    check: &'static str,
    status: Status,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

/// The findings so far.
#[derive(Default)]
struct Report(Vec<Finding>);

impl Report {
    fn add(&mut self, check: &'static str, status: Status, message: impl Into<String>) {
        self.0.push(Finding {
            check,
            status,
            message: message.into(),
            fix: None,
        });
    }

    fn fix(&mut self, check: &'static str, message: impl Into<String>, fix: String) {
        self.0.push(Finding {
            check,
            status: Status::Fail,
            message: message.into(),
            fix: Some(fix),
        });
    }
}

/// Runs every check; fails when any check failed.
pub fn run(a: DoctorArgs) -> ExitCode {
    let mut r = Report::default();
    let dirs: Vec<PathBuf> = a
        .cni_path
        .split(':')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect();
    let rt = Runtime {
        cache_dir: a.cache_dir.clone(),
        timeout: Duration::from_secs(10),
        ..Runtime::new(dirs)
    };
    let networks = configurations(&a.conf_dir, &rt, &mut r);
    plugins(&rt, &mut r);
    let client = controller(&a.host.client, &mut r);
    agent(&a, client.as_ref(), &mut r);
    kernel(&mut r);
    forwarding(&mut r);
    leftovers(&a, &rt, &networks, client.as_ref(), &mut r);
    let failed = r.0.iter().any(|f| f.status == Status::Fail);
    // Written, not printed: a reader that stops early (`| head`) is not an error here.
    let mut out = std::io::stdout().lock();
    if a.json {
        let doc = serde_json::json!({"healthy": !failed, "findings": r.0});
        let _ = writeln!(out, "{doc:#}");
    } else {
        for f in &r.0 {
            let _ = writeln!(out, "{:<7}{}: {}", f.status.label(), f.check, f.message);
            if let Some(fix) = &f.fix {
                let _ = writeln!(out, "       fix: {fix}");
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// corvid's plugins: where each is installed and which CNI versions it speaks.
fn plugins(rt: &Runtime, r: &mut Report) {
    let mut found = Vec::new();
    for name in corvid_plugins::PLUGIN_NAMES {
        if let Ok(path) = rt.find(name) {
            // corvid's plugins are links to its one binary; the reference set has the same
            // names.
            let whose = match std::fs::canonicalize(&path) {
                Ok(p) if p.ends_with(corvid_plugins::install::BINARY_NAME) => "corvid",
                _ => "not corvid's",
            };
            match rt.plugin_versions(name, corvid_cni::Version::CURRENT) {
                Ok(v) => found.push(format!(
                    "{name} ({whose}, {}, CNI {})",
                    path.display(),
                    v.join(" ")
                )),
                Err(e) => r.add(
                    "plugins",
                    Status::Fail,
                    format!("{} does not answer VERSION: {}", path.display(), e.msg),
                ),
            }
        }
    }
    if found.is_empty() {
        r.fix(
            "plugins",
            "none of the plugins corvid serves is on the plugin path",
            "corvid cni install --dir /opt/cni/bin".into(),
        );
    } else {
        r.add("plugins", Status::Ok, found.join("; "));
    }
}

/// Every configuration file: parsed, each plugin found and speaking its version.
fn configurations(dir: &Path, rt: &Runtime, r: &mut Report) -> Vec<NetConfList> {
    let files = match conf_files(dir) {
        Ok(f) => f,
        Err(e) => {
            r.add("conflists", Status::Warn, e.msg);
            return Vec::new();
        }
    };
    if files.is_empty() {
        r.add(
            "conflists",
            Status::Warn,
            format!("no network configuration in {}", dir.display()),
        );
    }
    let mut networks: Vec<NetConfList> = Vec::new();
    for path in files {
        let list = match load_file(&path) {
            Ok((_, list)) => list,
            Err(e) => {
                r.fix(
                    "conflists",
                    e.msg,
                    format!("correct or remove {}", path.display()),
                );
                continue;
            }
        };
        if let Some(first) = networks.iter().find(|n| n.name == list.name) {
            r.add(
                "conflists",
                Status::Warn,
                format!(
                    "{}: network {} is defined by an earlier file, this one is ignored",
                    path.display(),
                    first.name
                ),
            );
            continue;
        }
        match rt.validate(&list) {
            Ok(()) => {
                let types: Vec<&str> = (0..list.plugins.len())
                    .map(|i| list.plugin_type(i))
                    .collect();
                r.add(
                    "conflists",
                    Status::Ok,
                    format!(
                        "{}: network {} (CNI {}): {}",
                        path.display(),
                        list.name,
                        list.version,
                        types.join(", ")
                    ),
                );
            }
            Err(e) => r.fix(
                "conflists",
                format!("{}: network {}: {}", path.display(), list.name, e.msg),
                "install the missing plugin (corvid cni install) or correct the file".into(),
            ),
        }
        networks.push(list);
    }
    networks
}

/// The controller, the one named or the default `corvid up` serves: reachable, and its
/// version. Only a named one that does not answer is a failure.
fn controller(args: &crate::ControllerClientArgs, r: &mut Report) -> Option<Client> {
    let url = &args.url();
    let client = match args.credentials().and_then(|c| c.client(url)) {
        Ok(c) => c,
        Err(e) => {
            r.add("controller", Status::Fail, e.to_string());
            return None;
        }
    };
    match client.version() {
        Ok(v) => {
            r.add("controller", Status::Ok, format!("{url}: corvid {v}"));
            Some(client)
        }
        Err(e) if args.controller.is_some() => {
            r.fix(
                "controller",
                format!("{url}: {e}"),
                "start it (systemctl start corvid-controller) or correct --controller".into(),
            );
            None
        }
        Err(_) => {
            r.add(
                "controller",
                Status::NotRunning,
                format!("not running: nothing answers at {url} (name another with --controller)"),
            );
            None
        }
    }
}

/// This host's agent: registered with the controller, and synced by its own account.
fn agent(a: &DoctorArgs, client: Option<&Client>, r: &mut Report) {
    let host = &a.host.host_id;
    if let Some(c) = client {
        match c.get::<Host>(host) {
            Ok(_) => r.add("agent", Status::Ok, format!("host {host} is registered")),
            Err(e) if e.status() == Some(404) => r.fix(
                "agent",
                format!("host {host} is not registered with the controller"),
                "start the agent (systemctl start corvid-agent), with --host-id if the host name is not the ID".into(),
            ),
            Err(e) => r.add("agent", Status::Warn, format!("host {host}: {e}")),
        }
    }
    let url = format!("http://{}/readyz", a.agent_metrics);
    match ureq::get(&url).timeout(Duration::from_secs(3)).call() {
        Ok(_) => r.add("agent", Status::Ok, format!("{url}: synced")),
        Err(ureq::Error::Status(_, answer)) => {
            let why = answer.into_string().unwrap_or_default();
            r.add("agent", Status::Fail, format!("{url}: {}", why.trim()));
        }
        Err(_) if client.is_none() => r.add(
            "agent",
            Status::NotRunning,
            format!("not running: nothing answers at {url} (none is needed without a controller)"),
        ),
        Err(e) => r.add(
            "agent",
            Status::Warn,
            format!("{url}: {e}: is the agent running with --metrics-listen?"),
        ),
    }
}

/// Whether a kernel feature works now (Ok), its module can be loaded (Warn), or neither
/// (Fail). A feature in use is asked directly where it can be (a kernel built without
/// modules, or a sandbox, lists none).
fn module(name: &str) -> Status {
    let working = match name {
        "nf_tables" => corvid_net::nftables::Nftables::open()
            .and_then(|mut n| n.sets())
            .is_ok(),
        "br_netfilter" => Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists(),
        _ => false,
    };
    if working || Path::new("/sys/module").join(name).exists() {
        return Status::Ok;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let dir = Path::new("/lib/modules").join(release.trim());
    let listed = |file: &str| {
        std::fs::read_to_string(dir.join(file)).is_ok_and(|t| {
            t.lines()
                .any(|l| l.split(':').next().is_some_and(|m| is_module(m, name)))
        })
    };
    if listed("modules.builtin") {
        Status::Ok
    } else if listed("modules.dep") {
        Status::Warn
    } else {
        Status::Fail
    }
}

/// Whether `path` (from modules.dep) is module `name` (`.ko`, compressed or not; the
/// kernel treats `-` and `_` alike).
fn is_module(path: &str, name: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_") == name.replace('-', "_")
}

/// The kernel features corvid uses.
fn kernel(r: &mut Report) {
    for (name, what) in [
        ("bridge", "Linux bridges (bridge plugin, agent)"),
        ("vxlan", "the agent's overlay between hosts"),
        ("nf_tables", "masquerade, port maps, firewall and services"),
        ("br_netfilter", "pods reaching services on their own bridge"),
    ] {
        match module(name) {
            Status::Ok => r.add("kernel", Status::Ok, format!("{name}: present ({what})")),
            Status::Warn => r.0.push(Finding {
                check: "kernel",
                status: Status::Warn,
                message: format!("{name} is not loaded ({what})"),
                fix: Some(format!("modprobe {name}")),
            }),
            _ => r.add(
                "kernel",
                Status::Fail,
                format!("{name} is neither loaded nor installed: {what} cannot work"),
            ),
        }
    }
}

/// What would drop the traffic of corvid's bridges: iptables' FORWARD dropping without
/// the agent's allowance (while a corvid bridge is here), and forward chains of other
/// nftables tables whose policy drops, which only the host's owner may change.
fn forwarding(r: &mut Report) {
    let before = r.0.len();
    let bridges = corvid_net::Netlink::open()
        .and_then(|mut nl| nl.links())
        .map(|links| {
            links
                .into_iter()
                .filter(|l| l.name.starts_with(corvid_net::names::BRIDGE_PREFIX))
                .map(|l| l.name)
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if !bridges.is_empty() {
        match corvid_net::iptables::blocked() {
            Ok(tools) => {
                for tool in tools {
                    r.fix(
                        "forwarding",
                        format!(
                            "{tool}'s FORWARD drops what is forwarded, and corvid's bridges ({}) have no accept there",
                            bridges.join(", ")
                        ),
                        "start the agent (it adds the accepts at every full pass), or: \
                         iptables -N CORVID-BRIDGES; iptables -A CORVID-BRIDGES -i cvb+ -j ACCEPT; \
                         iptables -A CORVID-BRIDGES -o cvb+ -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT; \
                         iptables -I FORWARD -j CORVID-BRIDGES"
                            .into(),
                    );
                }
            }
            Err(e) => r.add(
                "forwarding",
                Status::Warn,
                format!("cannot read iptables: {e}"),
            ),
        }
    }
    match corvid_net::nftables::Nftables::open().and_then(|mut n| n.forward_drops()) {
        Ok(drops) => {
            for d in drops {
                r.fix(
                    "forwarding",
                    format!(
                        "{d} has policy drop: it drops corvid's forwarded traffic (containers reaching each other and leaving the host), whatever corvid's own table accepts"
                    ),
                    format!(
                        "nft insert rule {f} {t} {c} iifname \"cvb*\" accept; nft insert rule {f} {t} {c} oifname \"cvb*\" ct state established,related accept \
                         (firewalld: firewall-cmd --permanent --zone=trusted --add-interface=<each cvb bridge>)",
                        f = d.family,
                        t = d.table,
                        c = d.chain
                    ),
                );
            }
        }
        Err(e) => r.add(
            "forwarding",
            Status::Warn,
            format!("cannot read nftables: {e}"),
        ),
    }
    if r.0.len() == before {
        r.add(
            "forwarding",
            Status::Ok,
            "nothing drops what corvid's bridges forward",
        );
    }
}

/// What attachments left behind.
fn leftovers(
    a: &DoctorArgs,
    rt: &Runtime,
    networks: &[NetConfList],
    client: Option<&Client>,
    r: &mut Report,
) {
    let before = r.0.len();
    let mut tags = HashSet::new();
    let mut by_hash = BTreeMap::new();
    for n in networks {
        let cached = rt.cached_attachments(&n.name);
        for c in &cached {
            tags.insert(
                AttachmentTag::new(&n.name, &c.container_id, &c.if_name)
                    .as_str()
                    .to_string(),
            );
        }
        if let Some(hash) = AttachmentTag::network(&n.name).as_str().split(':').nth(1) {
            by_hash.insert(hash.to_string(), n.name.clone());
        }
        leases(a, n, &cached, r);
    }
    if let Some(c) = client {
        veths(&a.host.host_id, c, r);
    }
    elements(&tags, &by_hash, r);
    if r.0.len() == before {
        r.add(
            "leftovers",
            Status::Ok,
            "no lease, veth or nftables element without an owner",
        );
    }
}

/// host-local leases whose attachment no runtime cached, or whose namespace is gone.
fn leases(
    a: &DoctorArgs,
    n: &NetConfList,
    cached: &[corvid_cni::exec::CacheEntry],
    r: &mut Report,
) {
    let Ok(held) = corvid_ipam::leases::inspect(&a.ipam_dir, &n.name) else {
        return;
    };
    for lease in held {
        let owner = cached.iter().find(|c| {
            c.container_id == lease.container_id
                && (lease.ifname.is_empty() || c.if_name == lease.ifname)
        });
        match owner {
            None => r.fix(
                "leftovers",
                format!(
                    "lease {} of network {} is held by {} {}, which no runtime has attached",
                    lease.ip, n.name, lease.container_id, lease.ifname
                ),
                format!("corvid cni gc {}", n.name),
            ),
            Some(c) if !c.netns.is_empty() && !Path::new(&c.netns).exists() => r.fix(
                "leftovers",
                format!(
                    "lease {} of network {} belongs to {}, whose namespace {} is gone",
                    lease.ip, n.name, c.container_id, c.netns
                ),
                format!(
                    "corvid cni del {} {} --container-id {} --ifname {}",
                    n.name, c.netns, c.container_id, c.if_name
                ),
            ),
            Some(_) => {}
        }
    }
}

/// The agent's veths whose port is not bound to this host.
fn veths(host: &str, c: &Client, r: &mut Report) {
    let Ok((ports, _)) = c.list::<Port>(&[("binding:host_id", host)]) else {
        return;
    };
    let wanted: HashSet<String> = ports
        .iter()
        .map(|p| corvid_net::names::host_veth(&p.id))
        .collect();
    let Ok(links) = corvid_net::Netlink::open().and_then(|mut nl| nl.links()) else {
        return;
    };
    let cluster = c.cluster_id().ok();
    for l in links {
        // Another cluster's veth (a second corvid on this host) is not a leftover.
        let others = corvid_net::names::marked_cluster(&l.alias)
            .is_some_and(|m| cluster.as_deref().is_some_and(|c| c != m));
        if l.name.starts_with(corvid_net::names::VETH_PREFIX)
            && !wanted.contains(&l.name)
            && !others
        {
            r.fix(
                "leftovers",
                format!("veth {} belongs to no port bound to {host}", l.name),
                format!("ip link del {}", l.name),
            );
        }
    }
}

/// Elements of corvid's nftables sets whose attachment no runtime cached.
fn elements(tags: &HashSet<String>, by_hash: &BTreeMap<String, String>, r: &mut Report) {
    let Ok(mut nft) = corvid_net::nftables::Nftables::open() else {
        return;
    };
    let Ok(sets) = nft.sets() else {
        return;
    };
    let mut orphans: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for set in sets {
        let elements = nft.elements(&set).unwrap_or_default();
        // A network's masquerade set goes with its last element; an empty one was left.
        if set.starts_with("masq-") && elements.is_empty() {
            r.fix(
                "leftovers",
                format!("nftables set {set} in inet corvid is empty: its network has no container left"),
                format!(
                    "nft -a list chain inet corvid masquerade, delete the rule reading @{set} \
                     (nft delete rule inet corvid masquerade handle <handle>), then nft delete set inet corvid {set}"
                ),
            );
        }
        for e in elements {
            let Some(tag) = e.comment.filter(|t| t.starts_with("corvid:")) else {
                continue;
            };
            if !tags.contains(&tag) {
                let hash = tag.split(':').nth(1).unwrap_or_default().to_string();
                orphans.entry(hash).or_default().insert(set.clone());
            }
        }
    }
    for (hash, sets) in orphans {
        let sets = sets.into_iter().collect::<Vec<_>>().join(", ");
        match by_hash.get(&hash) {
            Some(network) => r.fix(
                "leftovers",
                format!("nftables elements of network {network} in {sets} belong to no attachment"),
                format!("corvid cni gc {network}"),
            ),
            None => r.fix(
                "leftovers",
                format!("nftables elements in {sets} belong to a network no configuration names"),
                "nft list table inet corvid, then delete those elements".into(),
            ),
        }
    }
}
