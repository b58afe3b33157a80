//! What the plugins that attach an interface (bridge, ptp, macvlan, host-device) share:
//! opening the container's namespace, the result's routes as the kernel takes them, the
//! container's interface in a result, finding the container's end on DEL, the addresses
//! whose masquerade DEL removes, CHECK's comparison with `prevResult`, and GC and STATUS
//! passed to the IPAM plugin.

use crate::{attachments, delegate, errors};
use corvid_cni::result::Interface;
use corvid_cni::skel::CmdArgs;
use corvid_cni::Command;
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::link::Link;
use corvid_net::nftables::masquerade;
use corvid_net::route::RouteSpec;
use corvid_net::{Netlink, Netns};
use ipnet::IpNet;

/// The IPAM plugin's type, when the configuration has an IPAM section.
pub(crate) fn ipam_type(args: &CmdArgs) -> Option<&str> {
    args.conf.ipam.as_ref().map(|i| i.ipam_type.as_str())
}

/// CNI_NETNS, which ADD and CHECK need.
pub(crate) fn netns_path(args: &CmdArgs) -> Result<&std::path::Path, Error> {
    args.netns
        .as_deref()
        .ok_or_else(|| Error::new(ErrorCode::InvalidEnvironment, "CNI_NETNS is required"))
}

/// The outcome of an in-process IPAM call run on its own thread.
pub(crate) fn joined(
    h: std::thread::ScopedJoinHandle<'_, Result<Option<CniResult>, Error>>,
) -> Result<Option<CniResult>, Error> {
    h.join()
        .unwrap_or_else(|_| Err(Error::new(ErrorCode::Internal, "IPAM thread panicked")))
}

/// What DEL finds of the container's end of the pair.
pub(crate) enum ContainerEnd {
    /// The namespace is gone.
    Gone,
    /// The namespace is there, the interface is not.
    Removed,
    /// The interface, and a socket in its namespace.
    Plugged(Netlink, Link),
}

/// The container's end of the pair, as DEL finds it.
pub(crate) fn container_end(args: &CmdArgs) -> Result<ContainerEnd, Error> {
    let Some(ns) = args.netns.as_ref().and_then(|p| Netns::open(p).ok()) else {
        return Ok(ContainerEnd::Gone);
    };
    let mut container = Netlink::open_in(&ns).map_err(errors::net)?;
    Ok(
        match container.link_by_name(&args.ifname).map_err(errors::net)? {
            Some(link) => ContainerEnd::Plugged(container, link),
            None => ContainerEnd::Removed,
        },
    )
}

/// The addresses whose masquerade DEL removes: those on the container's interface, as
/// the reference reads them, and prevResult's; none known means look for the tag.
pub(crate) fn masqueraded(args: &CmdArgs, end: &mut ContainerEnd) -> Option<Vec<IpNet>> {
    let mut addrs: Vec<IpNet> = Vec::new();
    if let ContainerEnd::Plugged(container, link) = end {
        addrs.extend(
            container
                .addresses(Some(link.index))
                .unwrap_or_default()
                .into_iter()
                .map(|(_, a)| a)
                .filter(|a| !matches!(a, IpNet::V6(v6) if v6.addr().is_unicast_link_local())),
        );
    }
    if let Some(prev) = &args.prev_result {
        addrs.extend(prev.ips.iter().map(|ip| ip.address));
    }
    addrs.sort();
    addrs.dedup();
    (!addrs.is_empty()).then_some(addrs)
}

/// CHECK: every address of `prev` for the interface (`own`, its index there) is on
/// `link`, and every route of `prev` is in the namespace.
pub(crate) fn check_addresses_and_routes(
    container: &mut Netlink,
    link: &Link,
    prev: &CniResult,
    own: Option<usize>,
    ns: &Netns,
) -> Result<(), Error> {
    let fail = |msg: String| Err(Error::new(ErrorCode::CheckFailed, msg));
    let have = container.addresses(Some(link.index)).map_err(errors::net)?;
    for ip in prev
        .ips
        .iter()
        .filter(|ip| ip.interface.is_none() || ip.interface == own)
    {
        if !have.iter().any(|(_, a)| *a == ip.address) {
            return fail(format!(
                "address {} is missing from {}",
                ip.address, link.name
            ));
        }
    }
    let routes = container.routes().map_err(errors::net)?;
    for r in &prev.routes {
        let found = routes
            .iter()
            .any(|k| k.dst == r.dst.trunc() && r.gw.is_none_or(|gw| k.gw == Some(gw)));
        if !found {
            return fail(format!(
                "route to {} is missing in {}",
                r.dst,
                ns.path().display()
            ));
        }
    }
    Ok(())
}

/// GC: the IPAM plugin's, then the masquerade of attachments not kept.
pub(crate) fn gc(args: &CmdArgs, ip_masq: bool) -> Result<(), Error> {
    if let Some(t) = ipam_type(args) {
        delegate::run(t, Command::Gc, args)?;
    }
    if ip_masq {
        masquerade::gc_masquerade(&args.conf.name, &attachments::valid(args))
            .map_err(errors::net)?;
    }
    Ok(())
}

/// STATUS: the IPAM plugin's.
pub(crate) fn status(args: &CmdArgs) -> Result<(), Error> {
    match ipam_type(args) {
        Some(t) => delegate::run(t, Command::Status, args).map(drop),
        None => Ok(()),
    }
}

/// The container's namespace and a socket in it, for an ADD: CNI_IFNAME must be free there.
pub(crate) fn open_free(args: &CmdArgs) -> Result<(Netns, Netlink), Error> {
    let ns = Netns::open(netns_path(args)?).map_err(errors::net)?;
    let mut container = Netlink::open_in(&ns).map_err(errors::net)?;
    if container
        .link_by_name(&args.ifname)
        .map_err(errors::net)?
        .is_some()
    {
        return Err(Error::new(
            ErrorCode::InterfaceExists,
            format!(
                "interface \"{}\" already exists in {}",
                args.ifname,
                ns.path().display()
            ),
        ));
    }
    Ok((ns, container))
}

/// The result's routes on interface `oif`; a route without a gateway goes through the
/// gateway of its family's first address, as the reference's plugins install them.
pub(crate) fn result_routes(result: &CniResult, oif: u32) -> Vec<RouteSpec> {
    result
        .routes
        .iter()
        .map(|r| {
            let gw = r.gw.or_else(|| {
                result
                    .ips
                    .iter()
                    .find(|ip| ip.address.addr().is_ipv4() == r.dst.addr().is_ipv4())
                    .and_then(|ip| ip.gateway)
            });
            let mut spec = RouteSpec::new(r.dst, gw, oif);
            spec.mtu = r.mtu;
            spec.advmss = r.advmss;
            spec.priority = r.priority;
            spec.table = r.table;
            spec.scope = r.scope;
            spec
        })
        .collect()
}

/// Finishes a one-interface result: `link` in `ns` as its only interface, and the
/// network's own `dns` when it has one.
pub(crate) fn single_interface(args: &CmdArgs, result: &mut CniResult, link: &Link, ns: &Netns) {
    result.interfaces = vec![Interface {
        name: link.name.clone(),
        mac: link.mac.clone(),
        sandbox: ns.path().display().to_string(),
        ..Interface::default()
    }];
    if let Some(dns) = args.conf.dns.as_ref() {
        result.dns = dns.clone();
    }
}

/// What CHECK compares: `prevResult`'s entry for the container's interface, and that
/// interface in the namespace.
pub(crate) struct Checked {
    /// The namespace.
    pub ns: Netns,
    /// A socket in it.
    pub container: Netlink,
    /// The interface there.
    pub link: Link,
    /// Its index in `prevResult`'s interfaces.
    pub own: usize,
}

/// CHECK's start, for `plugin`: `prevResult` is there, the IPAM plugin agrees, and the
/// interface `prevResult` puts in this namespace exists.
pub(crate) fn checked<'a>(
    args: &'a CmdArgs,
    plugin: &str,
) -> Result<(&'a CniResult, Checked), Error> {
    let fail = |msg: String| Error::new(ErrorCode::CheckFailed, msg);
    let prev = args.prev_result.as_ref().ok_or_else(|| {
        Error::new(
            ErrorCode::InvalidNetworkConfig,
            format!("{plugin}: Required prevResult missing"),
        )
    })?;
    if let Some(t) = ipam_type(args).filter(|t| !t.is_empty()) {
        delegate::run(t, Command::Check, args)?;
    }
    let ns = Netns::open(netns_path(args)?).map_err(errors::net)?;
    let sandbox = ns.path().display().to_string();
    let own = prev
        .interfaces
        .iter()
        .position(|i| i.name == args.ifname && i.sandbox == sandbox)
        .ok_or_else(|| {
            fail(format!(
                "prevResult has no interface {} in {sandbox}",
                args.ifname
            ))
        })?;
    let mut container = Netlink::open_in(&ns).map_err(errors::net)?;
    let link = container
        .link_by_name(&args.ifname)
        .map_err(errors::net)?
        .ok_or_else(|| {
            fail(format!(
                "interface {} does not exist in {sandbox}",
                args.ifname
            ))
        })?;
    Ok((
        prev,
        Checked {
            ns,
            container,
            link,
            own,
        },
    ))
}

/// CHECK: the MAC `prevResult` gives the interface, if any, is the interface's.
pub(crate) fn check_mac(prev: &CniResult, c: &Checked) -> Result<(), Error> {
    let want = &prev.interfaces[c.own].mac;
    if !want.is_empty() && !want.eq_ignore_ascii_case(&c.link.mac) {
        return Err(Error::new(
            ErrorCode::CheckFailed,
            format!(
                "interface {} has MAC {}, the result says {want}",
                c.link.name, c.link.mac
            ),
        ));
    }
    Ok(())
}
