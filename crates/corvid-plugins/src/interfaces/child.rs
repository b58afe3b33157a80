//! What macvlan, ipvlan, vlan and dummy share: the container's interface is made in
//! one request (on a parent device, the `master`, for the first three), then gets its
//! addresses and routes; a failure after it exists removes it and releases the addresses.
//! DEL releases and removes; CHECK compares the interface with what was asked.

use crate::attach::{self, ipam_type};
use crate::{delegate, errors};
use corvid_cni::skel::CmdArgs;
use corvid_cni::{CniResult, Command, Error, ErrorCode};
use corvid_net::binding::configure;
use corvid_net::link::{ChildKind, ChildSpec, Link, LinkKind};
use corvid_net::{sysctl, Netlink, Netns};
use ipnet::IpNet;

/// A refused configuration.
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidNetworkConfig, msg)
}

/// The link the default route leaves through, in the namespace of `nl`.
fn default_route_link(nl: &mut Netlink) -> Result<Option<Link>, Error> {
    let main = Some(corvid_net::route::MAIN_TABLE);
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

/// The parent device named `name`, on the host or, with `linkInContainer`
/// (`in_container`), in the container; with no name the one the default route leaves
/// through there.
pub(crate) fn master(
    host: &mut Netlink,
    container: &mut Netlink,
    in_container: bool,
    plugin: &str,
    name: &str,
) -> Result<Link, Error> {
    let (nl, where_) = if in_container {
        (container, "the container")
    } else {
        (host, "the host")
    };
    if name.is_empty() {
        return default_route_link(nl)?.ok_or_else(|| {
            invalid(format!(
                "{plugin}: no \"master\" given and no default route in {where_} to take it from"
            ))
        });
    }
    nl.link_by_name(name)
        .map_err(errors::net)?
        .ok_or_else(|| invalid(format!("{plugin}: master \"{name}\" not found in {where_}")))
}

/// Refuses an MTU outside [0, the master's].
pub(crate) fn check_mtu(mtu: i64, master: &Link) -> Result<Option<u32>, Error> {
    if mtu < 0 || mtu > i64::from(master.mtu) {
        return Err(invalid(format!(
            "invalid MTU {mtu}, must be [0, master MTU({})]",
            master.mtu
        )));
    }
    Ok((mtu > 0).then_some(mtu as u32))
}

/// Where the container's interface gets its addresses.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Addressing {
    /// From the IPAM section, which must be there.
    Ipam,
    /// From the IPAM section if there is one; without, the interface is only brought up.
    IpamIfAny,
    /// From `prevResult`'s addresses when there is no IPAM section (ipvlan chained after
    /// a plugin that allocated them), else from IPAM.
    PreviousOrIpam,
}

/// Opens the container's namespace (CNI_IFNAME must be free there) and the host's socket.
pub(crate) fn open(args: &CmdArgs) -> Result<(Netns, Netlink, Netlink), Error> {
    let (ns, container) = attach::open_free(args)?;
    let host = Netlink::open().map_err(errors::net)?;
    Ok((ns, container, host))
}

/// Creates CNI_IFNAME in the container from `spec` on `parent_nl` (the host's socket, or
/// the container's with `linkInContainer`), then addresses it.
pub(crate) fn add_child(
    args: &CmdArgs,
    plugin: &str,
    ns: &Netns,
    container: &mut Netlink,
    parent_nl: Option<&mut Netlink>,
    spec: &ChildSpec,
    addressing: Addressing,
) -> Result<CniResult, Error> {
    let made = match parent_nl {
        Some(host) => host.add_child(spec, Some(ns)),
        None => container.add_child(spec, None),
    };
    made.map_err(errors::net)?;
    address(args, plugin, ns, container, addressing)
}

/// Gives the new CNI_IFNAME its addresses and routes and brings it up; on failure removes
/// it and releases what IPAM gave.
pub(crate) fn address(
    args: &CmdArgs,
    plugin: &str,
    ns: &Netns,
    container: &mut Netlink,
    addressing: Addressing,
) -> Result<CniResult, Error> {
    let link = container
        .link_by_name(&args.ifname)
        .map_err(errors::net)?
        .ok_or_else(|| {
            Error::new(
                ErrorCode::Internal,
                format!("{plugin}: {} vanished", args.ifname),
            )
        })?;
    let ipam = ipam_type(args).filter(|t| !t.is_empty());
    let mut ipam_done = false;
    let done = (|| {
        let mut result = match (ipam, addressing) {
            (None, Addressing::PreviousOrIpam) => match &args.prev_result {
                Some(prev) if !prev.ips.is_empty() => prev.clone(),
                _ => {
                    return Err(invalid(format!(
                        "{plugin}: no IPAM section and no addresses in prevResult"
                    )))
                }
            },
            (None, Addressing::Ipam) => {
                return Err(invalid(format!(
                    "{plugin} interface requires an IPAM configuration"
                )))
            }
            (None, Addressing::IpamIfAny) => {
                container.set_up(&link).map_err(errors::net)?;
                let mut result = CniResult::default();
                attach::single_interface(args, &mut result, &link, ns);
                return Ok(result);
            }
            (Some(t), _) => {
                let r = delegate::run(t, Command::Add, args)?.unwrap_or_default();
                ipam_done = true;
                r
            }
        };
        if result.ips.is_empty() {
            return Err(invalid(format!(
                "{plugin}: IPAM plugin {} returned no address",
                ipam.unwrap_or_default()
            )));
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
        configure(container, &link, &addrs, &routes).map_err(errors::net)?;
        for ip in &mut result.ips {
            ip.interface = Some(0);
        }
        result.interfaces.clear();
        attach::single_interface(args, &mut result, &link, ns);
        Ok(result)
    })();
    done.inspect_err(|_| {
        let _ = container.delete_link(&link);
        if ipam_done {
            if let Some(t) = ipam {
                let _ = delegate::run(t, Command::Del, args);
            }
        }
    })
}

/// DEL: IPAM releases the addresses, then CNI_IFNAME goes (with its namespace, it is
/// already gone). Every failure is reported.
pub(crate) fn del(args: &CmdArgs) -> Result<(), Error> {
    let mut failures = Vec::new();
    if let Some(t) = ipam_type(args).filter(|t| !t.is_empty()) {
        if let Err(e) = delegate::run(t, Command::Del, args) {
            failures.push(e.during(&format!("release the address ({t})")));
        }
    }
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

/// CHECK: CNI_IFNAME is a `kind` (and, for a child link, `child`) with the MAC, addresses
/// and routes of `prevResult`.
pub(crate) fn check(
    args: &CmdArgs,
    plugin: &str,
    kind: LinkKind,
    child: Option<ChildKind>,
) -> Result<(), Error> {
    let fail = |msg: String| Err(Error::new(ErrorCode::CheckFailed, msg));
    let (prev, mut c) = attach::checked(args, plugin)?;
    if c.link.kind != kind {
        return fail(format!("interface {} is not a {plugin}", args.ifname));
    }
    if child.is_some() && c.link.child != child {
        return fail(format!(
            "interface {} is {:?}, the configuration says {:?}",
            args.ifname, c.link.child, child
        ));
    }
    attach::check_mac(prev, &c)?;
    attach::check_addresses_and_routes(&mut c.container, &c.link, prev, Some(c.own), &c.ns)
}
