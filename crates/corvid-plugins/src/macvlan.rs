//! macvlan: the container's interface is a macvlan of a device of the host (`master`, by
//! default the one the default route leaves through) or of the container itself
//! (`linkInContainer`), in mode bridge, private, vepa or passthru. With an IPAM section it
//! gets addresses and routes; without, it is only brought up (layer 2).

use crate::attach::{self, ipam_type};
use crate::{delegate, errors};
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::Command;
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::binding::configure;
use corvid_net::link::{Link, LinkKind, MacvlanMode, MacvlanSpec};
use corvid_net::{sysctl, Netlink, Netns};
use ipnet::IpNet;
use serde::Deserialize;

/// The macvlan plugin.
pub struct Macvlan;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    #[serde(default)]
    master: String,
    #[serde(default)]
    mode: String,
    #[serde(default)]
    mtu: i64,
    #[serde(default)]
    mac: String,
    #[serde(default)]
    link_in_container: bool,
    #[serde(default)]
    bcqueuelen: u32,
    #[serde(default)]
    runtime_config: RuntimeConfig,
}

#[derive(Deserialize, Default)]
struct RuntimeConfig {
    #[serde(default)]
    mac: String,
}

/// The configuration with its defaults resolved against the kernel.
struct Setup {
    master: Link,
    mode: MacvlanMode,
    mtu: Option<u32>,
    mac: Option<String>,
    bcqueuelen: Option<u32>,
    link_in_container: bool,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidNetworkConfig, msg)
}

/// The link the default route leaves through, in the namespace of `nl`.
fn default_route_link(nl: &mut Netlink) -> Result<Option<Link>, Error> {
    let main = Some(254);
    let oif = nl
        .routes()
        .map_err(errors::net)?
        .into_iter()
        .find(|r| r.dst.prefix_len() == 0 && r.table == main)
        .map(|r| r.oif);
    match oif {
        Some(i) => nl.link_by_index(i).map_err(errors::net),
        None => Ok(None),
    }
}

/// Reads the configuration and finds the master where it lives: on the host (`host`) or,
/// with `linkInContainer`, in the container (`container`).
fn load(args: &CmdArgs, host: &mut Netlink, container: &mut Netlink) -> Result<Setup, Error> {
    let c: Conf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    let parent_nl = if c.link_in_container { container } else { host };
    args.args.only("macvlan", &["MAC"])?;
    let mode = MacvlanMode::parse(&c.mode)
        .ok_or_else(|| invalid(format!("unknown macvlan mode: \"{}\"", c.mode)))?;
    let where_ = if c.link_in_container {
        "the container"
    } else {
        "the host"
    };
    let master = if c.master.is_empty() {
        default_route_link(parent_nl)?.ok_or_else(|| {
            invalid(format!(
                "macvlan: no \"master\" given and no default route in {where_} to take it from"
            ))
        })?
    } else {
        parent_nl
            .link_by_name(&c.master)
            .map_err(errors::net)?
            .ok_or_else(|| {
                invalid(format!(
                    "macvlan: master \"{}\" not found in {where_}",
                    c.master
                ))
            })?
    };
    if c.mtu < 0 || c.mtu > i64::from(master.mtu) {
        return Err(invalid(format!(
            "invalid MTU {}, must be [0, master MTU({})]",
            c.mtu, master.mtu
        )));
    }
    let mac = [
        args.args.get("MAC").unwrap_or_default(),
        &c.runtime_config.mac,
    ]
    .into_iter()
    .rev()
    .chain(std::iter::once(c.mac.as_str()))
    .find(|m| !m.is_empty())
    .map(str::to_string);
    if let Some(m) = &mac {
        if corvid_net::link::parse_mac(m).is_none() {
            return Err(invalid(format!("invalid args {m} for MAC addr")));
        }
    }
    Ok(Setup {
        master,
        mode,
        mtu: (c.mtu > 0).then_some(c.mtu as u32),
        mac,
        bcqueuelen: (c.bcqueuelen > 0).then_some(c.bcqueuelen),
        link_in_container: c.link_in_container,
    })
}

fn add(args: &CmdArgs) -> Result<CniResult, Error> {
    let (ns, mut container) = attach::open_free(args)?;
    let mut host = Netlink::open().map_err(errors::net)?;
    let setup = load(args, &mut host, &mut container)?;
    let spec = MacvlanSpec {
        name: &args.ifname,
        parent: setup.master.index,
        mode: setup.mode,
        mtu: setup.mtu,
        mac: setup.mac.as_deref(),
        bcqueuelen: setup.bcqueuelen,
    };
    let created = if setup.link_in_container {
        container.add_macvlan(&spec, None)
    } else {
        host.add_macvlan(&spec, Some(&ns))
    };
    created.map_err(errors::net)?;
    let link = container
        .link_by_name(&args.ifname)
        .map_err(errors::net)?
        .ok_or_else(|| {
            Error::new(
                ErrorCode::Internal,
                format!("macvlan {} vanished", args.ifname),
            )
        })?;
    let mut ipam_done = false;
    let done = (|| {
        let mut result = CniResult::default();
        if let Some(t) = ipam_type(args).filter(|t| !t.is_empty()) {
            result = delegate::run(t, Command::Add, args)?.unwrap_or_default();
            ipam_done = true;
            if result.ips.is_empty() {
                return Err(Error::new(
                    ErrorCode::InvalidNetworkConfig,
                    format!("macvlan: IPAM plugin {t} returned no address"),
                ));
            }
            // Neighbours learn the new address at once, as the reference asks.
            ns.run(|| {
                let _ = sysctl::set(&format!("net/ipv4/conf/{}/arp_notify", args.ifname), "1");
                let _ = sysctl::set(&format!("net/ipv6/conf/{}/ndisc_notify", args.ifname), "1");
            })
            .map_err(errors::net)?;
            let addrs: Vec<IpNet> = result.ips.iter().map(|ip| ip.address).collect();
            let routes = attach::result_routes(&result, link.index);
            container.set_up(&link).map_err(errors::net)?;
            configure(&mut container, &link, &addrs, &routes).map_err(errors::net)?;
            for ip in &mut result.ips {
                ip.interface = Some(0);
            }
        } else {
            container.set_up(&link).map_err(errors::net)?;
        }
        attach::single_interface(args, &mut result, &link, &ns);
        Ok(result)
    })();
    done.inspect_err(|_| {
        let _ = container.delete_link(&link);
        if ipam_done {
            if let Some(t) = ipam_type(args) {
                let _ = delegate::run(t, Command::Del, args);
            }
        }
    })
}

fn check(args: &CmdArgs) -> Result<(), Error> {
    let fail = |msg: String| Err(Error::new(ErrorCode::CheckFailed, msg));
    let (prev, mut c) = attach::checked(args, "macvlan")?;
    let mut host = Netlink::open().map_err(errors::net)?;
    let setup = load(args, &mut host, &mut c.container)?;
    if c.link.kind != LinkKind::Macvlan {
        return fail(format!("interface {} is not a macvlan", args.ifname));
    }
    if c.link.macvlan_mode != Some(setup.mode) {
        return fail(format!(
            "interface {} is in mode {:?}, the configuration says {:?}",
            args.ifname, c.link.macvlan_mode, setup.mode
        ));
    }
    attach::check_mac(prev, &c)?;
    attach::check_addresses_and_routes(&mut c.container, &c.link, prev, Some(c.own), &c.ns)
}

impl Plugin for Macvlan {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        add(args)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        serde_json::from_slice::<Conf>(&args.stdin).map_err(errors::config)?;
        let mut failures = Vec::new();
        if let Some(t) = ipam_type(args).filter(|t| !t.is_empty()) {
            if let Err(e) = delegate::run(t, Command::Del, args) {
                failures.push(e.during(&format!("release the address ({t})")));
            }
        }
        // Gone with its namespace, or already removed: nothing to do.
        if let Some(ns) = args.netns.as_ref().and_then(|p| Netns::open(p).ok()) {
            let removed =
                Netlink::open_in(&ns).and_then(|mut nl| match nl.link_by_name(&args.ifname)? {
                    Some(l) => nl.delete_link(&l),
                    None => Ok(()),
                });
            if let Err(e) = removed {
                failures.push(errors::net(e).during(&format!("remove {}", args.ifname)));
            }
        }
        Error::all(failures)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        check(args)
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        attach::gc(args, false)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        attach::status(args)
    }
}
