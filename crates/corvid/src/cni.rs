//! `corvid cni`: cnitool's job with readable errors and `--json`.

use clap::{Args, Subcommand};
use corvid_cni::config::Attachment;
use corvid_cni::exec::{load_dir, Runtime, RuntimeConf};
use corvid_cni::{Command, Error, NetConfList};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct CniArgs {
    #[command(flatten)]
    paths: Paths,
    #[command(subcommand)]
    command: CniCommand,
}

#[derive(Args)]
struct Paths {
    /// Directory of network configurations.
    #[arg(
        long,
        global = true,
        env = "NETCONFPATH",
        default_value = "/etc/cni/net.d"
    )]
    conf_dir: PathBuf,
    /// Plugin directories, colon-separated.
    #[arg(long, global = true, env = "CNI_PATH", default_value = "/opt/cni/bin")]
    cni_path: String,
    /// Where ADD results are cached.
    #[arg(long, global = true, default_value = corvid_cni::exec::DEFAULT_CACHE_DIR)]
    cache_dir: PathBuf,
    /// Seconds a plugin may run before it is killed.
    #[arg(long, global = true, default_value_t = 60)]
    timeout: u64,
    /// Print JSON (results, errors, listings) instead of text.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum CniCommand {
    /// Install the plugins (bandwidth, bridge, corvid, corvid-k8s, firewall, host-device, host-local, loopback, macvlan, portmap, ptp, static, tuning) into a CNI bin directory.
    Install {
        /// The directory.
        #[arg(long, default_value = corvid_plugins::install::DEFAULT_BIN_DIR)]
        dir: PathBuf,
        /// The plugin binary; by default the corvid-plugins beside this corvid.
        #[arg(long)]
        from: Option<PathBuf>,
    },
    /// Attach a network namespace to a network.
    Add(Attach),
    /// Detach it.
    Del(Attach),
    /// Verify an attachment against its cached result.
    Check(Attach),
    /// Release what the network's plugins hold for attachments that are not kept.
    Gc {
        /// The network.
        network: String,
        /// Attachments to keep, as CONTAINER_ID/IFNAME; by default every cached one.
        #[arg(long)]
        keep: Vec<String>,
    },
    /// Ask the network's plugins whether they can serve ADD.
    Status {
        /// The network.
        network: String,
    },
    /// Show the configured networks and the cached attachments.
    List,
    /// Create or delete a named network namespace to try things without a runtime.
    #[command(subcommand)]
    Netns(NetnsCommand),
}

#[derive(Args)]
struct Attach {
    /// The network's name.
    network: String,
    /// The network namespace path, e.g. /run/netns/demo.
    netns: String,
    /// Interface name inside the namespace.
    #[arg(long, default_value = "eth0")]
    ifname: String,
    /// Container ID; by default derived from the namespace path.
    #[arg(long)]
    container_id: Option<String>,
    /// CNI_ARGS, as K=V;K=V.
    #[arg(long, default_value = "")]
    args: String,
    /// Capability values as a JSON object, e.g. '{"portMappings":[...]}'.
    #[arg(long)]
    capability_args: Option<String>,
}

#[derive(Subcommand)]
enum NetnsCommand {
    /// Create /run/netns/NAME.
    Add {
        /// The name.
        name: String,
    },
    /// Delete /run/netns/NAME.
    Del {
        /// The name.
        name: String,
    },
}

fn fail(paths: &Paths, e: &Error) -> ExitCode {
    if paths.json {
        println!("{}", e.to_json(corvid_cni::Version::CURRENT.as_str()));
    } else {
        eprintln!("corvid: {e}");
    }
    ExitCode::FAILURE
}

fn usage(msg: impl Into<String>) -> Error {
    Error::new(corvid_cni::ErrorCode::InvalidEnvironment, msg)
}

fn runtime(paths: &Paths) -> Runtime {
    let mut rt = Runtime::new(
        paths
            .cni_path
            .split(':')
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .collect(),
    );
    rt.cache_dir = paths.cache_dir.clone();
    rt.timeout = Duration::from_secs(paths.timeout);
    rt
}

/// Loads the configuration directory, warning about files a same-named network shadows.
fn load(dir: &Path) -> Result<Vec<(PathBuf, Vec<u8>, NetConfList)>, Error> {
    let loaded = load_dir(dir)?;
    for (ignored, winner) in &loaded.shadowed {
        eprintln!(
            "corvid: warning: {} is ignored: {} defines the same network first",
            ignored.display(),
            winner.display()
        );
    }
    Ok(loaded.networks)
}

fn find_network(dir: &Path, name: &str) -> Result<(Vec<u8>, NetConfList), Error> {
    let lists = load(dir)?;
    let names: Vec<String> = lists.iter().map(|(_, _, l)| l.name.clone()).collect();
    lists
        .into_iter()
        .find(|(_, _, l)| l.name == name)
        .map(|(_, bytes, list)| (bytes, list))
        .ok_or_else(|| {
            Error::new(
                corvid_cni::ErrorCode::InvalidNetworkConfig,
                format!("network \"{name}\" is not configured in {}", dir.display()),
            )
            .with_details(format!("configured: {}", names.join(", ")))
        })
}

fn runtime_conf(a: &Attach) -> Result<RuntimeConf, Error> {
    let args = corvid_cni::args::CniArgs::parse(&a.args)?.0;
    let capability_args = match &a.capability_args {
        None => Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => m,
            _ => return Err(usage("--capability-args must be a JSON object")),
        },
    };
    let container_id = a.container_id.clone().unwrap_or_else(|| {
        let mut h = fnv::FnvHasher::default();
        std::hash::Hasher::write(&mut h, a.netns.as_bytes());
        format!("corvid-{:016x}", std::hash::Hasher::finish(&h))
    });
    Ok(RuntimeConf {
        container_id,
        netns: a.netns.clone(),
        ifname: a.ifname.clone(),
        args,
        capability_args,
    })
}

fn describe(result: &Value) -> String {
    let mut lines = Vec::new();
    let ifaces = result["interfaces"].as_array().cloned().unwrap_or_default();
    for ip in result["ips"].as_array().into_iter().flatten() {
        let iface = ip["interface"]
            .as_u64()
            .and_then(|i| ifaces.get(i as usize))
            .and_then(|i| i["name"].as_str())
            .unwrap_or("-");
        let gw = ip["gateway"]
            .as_str()
            .map(|g| format!(" via {g}"))
            .unwrap_or_default();
        lines.push(format!(
            "{iface} {}{gw}",
            ip["address"].as_str().unwrap_or("?")
        ));
    }
    for r in result["routes"].as_array().into_iter().flatten() {
        let gw = r["gw"]
            .as_str()
            .map(|g| format!(" via {g}"))
            .unwrap_or_default();
        lines.push(format!("route {}{gw}", r["dst"].as_str().unwrap_or("?")));
    }
    lines.join("\n")
}

fn attach(paths: &Paths, a: &Attach, command: Command) -> Result<Option<Value>, Error> {
    let (bytes, list) = find_network(&paths.conf_dir, &a.network)?;
    let conf = runtime_conf(a)?;
    let rt = runtime(paths);
    match command {
        Command::Add => rt.add(&bytes, &list, &conf).map(Some),
        Command::Del => rt.del(&list, &conf).map(|_| None),
        _ => rt.check(&list, &conf).map(|_| None),
    }
}

fn list(paths: &Paths) -> Result<(), Error> {
    let rt = runtime(paths);
    let lists = load(&paths.conf_dir)?;
    let mut out = Vec::new();
    for (path, _, l) in &lists {
        let attachments: Vec<Value> = rt
            .cached_attachments(&l.name)
            .into_iter()
            .map(|c| {
                serde_json::json!({"containerID": c.container_id, "ifname": c.if_name,
                                   "netns": c.netns, "result": c.result})
            })
            .collect();
        let plugins: Vec<&str> = l
            .plugins
            .iter()
            .filter_map(|p| p["type"].as_str())
            .collect();
        out.push(
            serde_json::json!({"name": l.name, "cniVersion": l.version.as_str(),
            "file": path, "plugins": plugins, "attachments": attachments}),
        );
    }
    if paths.json {
        println!("{}", Value::Array(out));
        return Ok(());
    }
    for n in &out {
        println!(
            "{} (CNI {}, {}): {}",
            n["name"].as_str().unwrap_or_default(),
            n["cniVersion"].as_str().unwrap_or_default(),
            n["file"].as_str().unwrap_or_default(),
            n["plugins"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" -> ")
        );
        for a in n["attachments"].as_array().into_iter().flatten() {
            let ips: Vec<&str> = a["result"]["ips"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|ip| ip["address"].as_str())
                .collect();
            println!(
                "  {} {} {} {}",
                a["containerID"].as_str().unwrap_or_default(),
                a["ifname"].as_str().unwrap_or_default(),
                a["netns"].as_str().unwrap_or_default(),
                ips.join(" ")
            );
        }
    }
    Ok(())
}

fn gc(paths: &Paths, network: &str, keep: &[String]) -> Result<(), Error> {
    let (_, list) = find_network(&paths.conf_dir, network)?;
    let rt = runtime(paths);
    let valid: Vec<Attachment> = if keep.is_empty() {
        rt.cached_attachments(network)
            .into_iter()
            .map(|c| Attachment {
                container_id: c.container_id,
                ifname: c.if_name,
            })
            .collect()
    } else {
        keep.iter()
            .map(|k| {
                let (id, ifname) = k
                    .split_once('/')
                    .ok_or_else(|| usage(format!("--keep {k}: expected CONTAINER_ID/IFNAME")))?;
                Ok(Attachment {
                    container_id: id.into(),
                    ifname: ifname.into(),
                })
            })
            .collect::<Result<_, Error>>()?
    };
    rt.gc(&list, &valid)
}

fn netns(cmd: &NetnsCommand) -> Result<(), Error> {
    let net = |e: corvid_net::Error| Error::new(corvid_cni::ErrorCode::Io, e.to_string());
    match cmd {
        NetnsCommand::Add { name } => corvid_net::Netns::create_named(name)
            .map(|p| println!("{}", p.display()))
            .map_err(net),
        NetnsCommand::Del { name } => {
            if name.contains('/') {
                return Err(usage(format!("invalid namespace name {name}")));
            }
            corvid_net::Netns::delete_path(&Path::new(corvid_net::netns::NETNS_RUN_DIR).join(name))
                .map_err(net)
        }
    }
}

/// Runs one `corvid cni` command.
pub fn run(args: CniArgs) -> ExitCode {
    let paths = &args.paths;
    let outcome = match &args.command {
        CniCommand::Install { dir, from } => install(dir, from.as_deref()),
        CniCommand::Add(a) => attach(paths, a, Command::Add).map(|result| {
            if let Some(r) = result {
                if paths.json {
                    println!("{r}");
                } else {
                    println!("{}", describe(&r));
                }
            }
        }),
        CniCommand::Del(a) => attach(paths, a, Command::Del).map(drop),
        CniCommand::Check(a) => attach(paths, a, Command::Check).map(drop),
        CniCommand::Gc { network, keep } => gc(paths, network, keep),
        CniCommand::Status { network } => find_network(&paths.conf_dir, network)
            .and_then(|(_, list)| runtime(paths).status(&list)),
        CniCommand::List => list(paths),
        CniCommand::Netns(cmd) => netns(cmd),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(paths, &e),
    }
}

fn install(dir: &Path, from: Option<&Path>) -> Result<(), Error> {
    let from = match from {
        Some(f) => f.to_path_buf(),
        None => corvid_plugins::install::sibling_binary().map_err(|e| {
            Error::new(
                corvid_cni::ErrorCode::Io,
                format!("cannot find my own executable: {e}"),
            )
        })?,
    };
    let made = corvid_plugins::install::install(&from, dir)
        .map_err(|e| Error::new(corvid_cni::ErrorCode::Io, e.to_string()))?;
    for p in made {
        println!("{}", p.display());
    }
    Ok(())
}
