//! ptp: a veth pair per container and no bridge. The container's address comes without
//! its subnet route; the subnet is reached through the gateway, which is on the host's
//! end of the pair (a /32 or /128), and the host routes the container's address to that
//! end. Optional masquerade, as bridge's.

use crate::attach::{self, container_end, ipam_type, masqueraded, ContainerEnd};
use crate::{attachments, delegate, errors};
use corvid_cni::result::Interface;
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::Command;
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::binding::{pair, VethPair, VethSpec};
use corvid_net::link::LinkKind;
use corvid_net::nftables::{masquerade, Nftables};
use corvid_net::route::RouteSpec;
use corvid_net::{sysctl, Netlink};
use ipnet::IpNet;
use serde::Deserialize;

/// The ptp plugin.
pub struct Ptp;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PtpConf {
    #[serde(default)]
    ip_masq: bool,
    #[serde(default)]
    ip_masq_backend: Option<String>,
    #[serde(default)]
    mtu: Option<u32>,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidNetworkConfig, msg)
}

fn load(args: &CmdArgs) -> Result<PtpConf, Error> {
    let c: PtpConf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    if c.ip_masq_backend
        .as_deref()
        .is_some_and(|b| b != "nftables")
    {
        return Err(Error::new(
            ErrorCode::UnsupportedField,
            "unsupported field \"ipMasqBackend\": masquerade is done with nftables only by corvid's ptp plugin",
        ));
    }
    if let Some(mtu) = c.mtu.filter(|m| *m != 0 && !(68..=65535).contains(m)) {
        return Err(invalid(format!("invalid mtu {mtu}")));
    }
    if ipam_type(args).is_none_or(str::is_empty) {
        return Err(invalid(
            "ptp: an \"ipam\" section with a \"type\" is required",
        ));
    }
    Ok(c)
}

/// The host prefix of `ip`'s family: 32 or 128.
fn host_prefix(ip: std::net::IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

/// What ADD made, undone in reverse when a later step fails.
#[derive(Default)]
struct Made {
    pair: Option<VethPair>,
    masq: Option<Vec<IpNet>>,
}

impl Made {
    fn undo(self, args: &CmdArgs, host: &mut Netlink) {
        if let Some(addrs) = &self.masq {
            if let Ok(mut nft) = Nftables::open() {
                let _ =
                    masquerade::delete_masquerade(&mut nft, &attachments::tag(args), Some(addrs));
            }
        }
        if let Some(p) = &self.pair {
            let _ = host.delete_link(&p.host);
        }
        if let Some(t) = ipam_type(args) {
            let _ = delegate::run(t, Command::Del, args);
        }
    }
}

fn add(args: &CmdArgs, conf: &PtpConf) -> Result<CniResult, Error> {
    let (ns, mut container) = attach::open_free(args)?;
    let mut host = Netlink::open().map_err(errors::net)?;
    let t = ipam_type(args).unwrap_or_default();
    let mut result = delegate::run(t, Command::Add, args)?.unwrap_or_default();
    let mut made = Made::default();
    let done = (|| {
        if result.ips.is_empty() {
            return Err(Error::new(
                ErrorCode::InvalidNetworkConfig,
                format!("ptp: IPAM plugin {t} returned no address"),
            ));
        }
        if let Some(ip) = result.ips.iter().find(|ip| ip.gateway.is_none()) {
            return Err(invalid(format!(
                "ptp: address {} has no gateway, which a point-to-point link routes through: give the IPAM configuration one",
                ip.address
            )));
        }
        for ip in &result.ips {
            let key = if ip.address.addr().is_ipv4() {
                "net/ipv4/ip_forward"
            } else {
                "net/ipv6/conf/all/forwarding"
            };
            sysctl::set(key, "1").map_err(errors::net)?;
        }
        let p = pair(
            &mut host,
            &mut container,
            &ns,
            &VethSpec {
                ifname: &args.ifname,
                mtu: conf.mtu.filter(|m| *m != 0),
                hairpin: false,
                vlan: None,
                keep_default_vlan: true,
                mac: None,
                host_name: None,
                alias: None,
                kept: &[],
            },
        )
        .map_err(errors::net)?;
        made.pair = Some(p.clone());
        let addrs: Vec<IpNet> = result.ips.iter().map(|ip| ip.address).collect();
        corvid_net::binding::enable_ipv6_for(&ns, &p.container, &addrs).map_err(errors::net)?;
        configure_container(&mut container, &p, &mut result)?;
        configure_host(&mut host, &p, &result)?;
        corvid_net::announce::announce(&mut container, &ns, &p.container, &addrs);
        if conf.ip_masq {
            let addrs: Vec<IpNet> = result.ips.iter().map(|ip| ip.address).collect();
            made.masq = Some(addrs.clone());
            let mut nft = Nftables::open().map_err(errors::net)?;
            masquerade::add_masquerade(&mut nft, &attachments::tag(args), &addrs)
                .map_err(errors::net)?;
        }
        result.interfaces = vec![
            Interface {
                name: p.host.name.clone(),
                mac: p.host.mac.clone(),
                ..Interface::default()
            },
            Interface {
                name: p.container.name.clone(),
                mac: p.container.mac.clone(),
                sandbox: ns.path().display().to_string(),
                ..Interface::default()
            },
        ];
        for ip in &mut result.ips {
            ip.interface = Some(1);
        }
        // The network's own dns wins over the IPAM plugin's.
        if let Some(dns) = args.conf.dns.as_ref().filter(|d| !d.is_empty()) {
            result.dns = dns.clone();
        }
        Ok(())
    })();
    match done {
        Ok(()) => Ok(result),
        Err(e) => {
            made.undo(args, &mut host);
            Err(e)
        }
    }
}

/// The container's end: each address without its subnet route, a link route to the
/// gateway and the subnet through it, then the result's routes.
fn configure_container(
    container: &mut Netlink,
    p: &VethPair,
    result: &mut CniResult,
) -> Result<(), Error> {
    let index = p.container.index;
    let mut routes = Vec::new();
    for ip in &result.ips {
        let gw = ip.gateway.expect("checked before");
        container
            .add_address_without_subnet_route(index, &ip.address)
            .map_err(errors::net)?;
        let gw_net = IpNet::new(gw, host_prefix(gw)).expect("a host prefix");
        let mut to_gw = RouteSpec::new(gw_net, None, index);
        to_gw.src = Some(ip.address.addr());
        let mut subnet = RouteSpec::new(ip.address.trunc(), Some(gw), index);
        subnet.src = Some(ip.address.addr());
        routes.extend([to_gw, subnet]);
    }
    routes.extend(attach::result_routes(result, index));
    for r in &routes {
        match container.add_route(r) {
            // A default route another network put first stays, as the spec asks.
            Err(e) if e.errno() == Some(libc::EEXIST) && r.dst.prefix_len() == 0 => {}
            other => other.map_err(errors::net)?,
        }
    }
    Ok(())
}

/// The host's end: each gateway as a host address, and a route to each container address.
fn configure_host(host: &mut Netlink, p: &VethPair, result: &CniResult) -> Result<(), Error> {
    for ip in &result.ips {
        let gw = ip.gateway.expect("checked before");
        let addr = ip.address.addr();
        match host.add_address(
            p.host.index,
            &IpNet::new(gw, host_prefix(gw)).expect("a host prefix"),
        ) {
            Err(e) if e.errno() == Some(libc::EEXIST) => {}
            other => other.map_err(errors::net)?,
        }
        let to_container = RouteSpec::new(
            IpNet::new(addr, host_prefix(addr)).expect("a host prefix"),
            None,
            p.host.index,
        );
        match host.add_route(&to_container) {
            Err(e) if e.errno() == Some(libc::EEXIST) => {}
            other => other.map_err(errors::net)?,
        }
    }
    Ok(())
}

/// Removes the host end named in `prevResult` when the namespace is already gone (the
/// kernel destroys the pair with the namespace, but not at once).
fn delete_host_end(args: &CmdArgs) -> Result<(), Error> {
    let Some(name) = args
        .prev_result
        .as_ref()
        .and_then(|p| p.interfaces.iter().find(|i| i.sandbox.is_empty()))
        .map(|i| i.name.clone())
    else {
        return Ok(());
    };
    let mut host = Netlink::open().map_err(errors::net)?;
    match host.link_by_name(&name).map_err(errors::net)? {
        Some(l) if l.kind == LinkKind::Veth => host.delete_link(&l).map_err(errors::net),
        _ => Ok(()),
    }
}

fn check(args: &CmdArgs) -> Result<(), Error> {
    let (prev, mut c) = attach::checked(args, "ptp")?;
    if c.link.kind != LinkKind::Veth {
        return Err(Error::new(
            ErrorCode::CheckFailed,
            format!("interface {} is not a veth", args.ifname),
        ));
    }
    attach::check_mac(prev, &c)?;
    attach::check_addresses_and_routes(&mut c.container, &c.link, prev, Some(c.own), &c.ns)
}

impl Plugin for Ptp {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        add(args, &load(args)?)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        let conf = load(args)?;
        // Every step runs whatever the others did, and all failures are reported.
        let mut failures = Vec::new();
        if let Some(t) = ipam_type(args) {
            if let Err(e) = delegate::run(t, Command::Del, args) {
                failures.push(e.during(&format!("release the address ({t})")));
            }
        }
        let mut end = container_end(args).unwrap_or_else(|e| {
            failures.push(e.during(&format!("find {} in its namespace", args.ifname)));
            ContainerEnd::Removed
        });
        if conf.ip_masq {
            let addrs = masqueraded(args, &mut end);
            let removed = Nftables::open().and_then(|mut n| {
                masquerade::delete_masquerade(&mut n, &attachments::tag(args), addrs.as_deref())
            });
            if let Err(e) = removed {
                failures.push(errors::net(e).during("remove the masquerade"));
            }
        }
        let unplugged = match end {
            ContainerEnd::Plugged(mut container, link) => {
                container.delete_link(&link).map_err(errors::net)
            }
            ContainerEnd::Removed => Ok(()),
            ContainerEnd::Gone => delete_host_end(args),
        };
        if let Err(e) = unplugged {
            failures.push(e.during(&format!("remove {}", args.ifname)));
        }
        Error::all(failures)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        check(args)
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        attach::gc(args, load(args)?.ip_masq)
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        load(args)?;
        attach::status(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_prefixes_by_family() {
        assert_eq!(host_prefix("10.0.0.1".parse().unwrap()), 32);
        assert_eq!(host_prefix("fd00::1".parse().unwrap()), 128);
    }
}
