//! bridge: a veth pair from the container to a Linux bridge on the host, addresses from
//! the IPAM plugin, optional gateway, default route and masquerade.

use crate::attach::{
    self, container_end, ipam_type, joined, masqueraded, netns_path, ContainerEnd,
};
use crate::{attachments, delegate, errors};
use corvid_cni::result::{Interface, Route};
use corvid_cni::skel::{validate_ifname, CmdArgs, Plugin};
use corvid_cni::Command;
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_net::binding::{
    configure, ensure_bridge, ensure_gateway, plug, BridgeSpec, VethPair, VethSpec,
};
use corvid_net::link::{Link, LinkKind};
use corvid_net::nftables::masquerade;
use corvid_net::nftables::Nftables;
use corvid_net::{sysctl, Netlink, Netns};
use ipnet::IpNet;
use serde::Deserialize;

/// The bridge plugin.
pub struct Bridge;

fn default_bridge() -> String {
    "cni0".into()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BridgeConf {
    #[serde(default = "default_bridge")]
    bridge: String,
    #[serde(default)]
    is_gateway: bool,
    #[serde(default)]
    is_default_gateway: bool,
    #[serde(default)]
    force_address: bool,
    #[serde(default)]
    ip_masq: bool,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    hairpin_mode: bool,
    #[serde(default)]
    promisc_mode: bool,
    #[serde(default)]
    vlan: u16,
    #[serde(default)]
    preserve_default_vlan: Option<bool>,
    #[serde(flatten)]
    unsupported: Unsupported,
}

/// Fields of the reference bridge that corvid's does not implement: asking for what they
/// do is refused with CNI error 2, not silently ignored, so a drop-in user learns at once.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Unsupported {
    #[serde(default)]
    vlan_trunk: Option<serde_json::Value>,
    #[serde(default)]
    macspoofchk: bool,
    #[serde(default)]
    enabledad: bool,
    #[serde(default)]
    disable_container_interface: bool,
    #[serde(default)]
    port_isolation: bool,
    #[serde(default)]
    ip_masq_backend: Option<String>,
}

impl Unsupported {
    /// The first field that asks for something corvid does not do, and why not.
    fn refused(&self) -> Option<(&'static str, &'static str)> {
        let trunk = self
            .vlan_trunk
            .as_ref()
            .is_some_and(|t| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty()));
        [
            (trunk, "vlanTrunk", "VLAN trunk ports are not implemented"),
            (
                self.macspoofchk,
                "macspoofchk",
                "MAC spoofing checks are not implemented",
            ),
            (
                self.enabledad,
                "enabledad",
                "duplicate address detection is not implemented",
            ),
            (
                self.disable_container_interface,
                "disableContainerInterface",
                "the container interface is always brought up",
            ),
            (
                self.port_isolation,
                "portIsolation",
                "port isolation is not implemented",
            ),
            (
                self.ip_masq_backend
                    .as_deref()
                    .is_some_and(|b| b != "nftables"),
                "ipMasqBackend",
                "masquerade is done with nftables only",
            ),
        ]
        .into_iter()
        .find(|(asked, _, _)| *asked)
        .map(|(_, field, why)| (field, why))
    }
}

fn load(args: &CmdArgs) -> Result<BridgeConf, Error> {
    let mut c: BridgeConf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    if let Some((field, why)) = c.unsupported.refused() {
        return Err(Error::new(
            ErrorCode::UnsupportedField,
            format!("unsupported field \"{field}\": {why} by corvid's bridge plugin"),
        ));
    }
    validate_ifname(&c.bridge).map_err(|e| Error {
        code: ErrorCode::InvalidNetworkConfig as u32,
        msg: format!("invalid \"bridge\": {}", e.msg),
        ..e
    })?;
    if c.vlan > 4094 {
        return Err(Error::new(
            ErrorCode::InvalidNetworkConfig,
            format!("invalid VLAN ID {} (must be between 0 and 4094)", c.vlan),
        ));
    }
    if let Some(mtu) = c.mtu {
        if !(68..=65535).contains(&mtu) {
            return Err(Error::new(
                ErrorCode::InvalidNetworkConfig,
                format!("invalid mtu {mtu}"),
            ));
        }
    }
    c.is_gateway |= c.is_default_gateway;
    Ok(c)
}

/// What ADD has made so far, undone in reverse when a later step fails.
struct Undo<'a> {
    args: &'a CmdArgs,
    ipam: bool,
    masq: Option<(corvid_net::nftables::AttachmentTag, Vec<IpNet>)>,
}

impl Undo<'_> {
    fn run(self, host: &mut Netlink, port: &VethPair) {
        if let Some((tag, addrs)) = &self.masq {
            if let Ok(mut nft) = Nftables::open() {
                let _ = masquerade::delete_masquerade(&mut nft, tag, Some(addrs));
            }
        }
        let _ = host.delete_link(&port.host);
        if self.ipam {
            if let Some(t) = ipam_type(self.args) {
                let _ = delegate::run(t, Command::Del, self.args);
            }
        }
    }
}

fn ensure_bridge_and_plug(
    host: &mut Netlink,
    container: &mut Netlink,
    ns: &Netns,
    conf: &BridgeConf,
    ifname: &str,
) -> Result<(Link, VethPair), Error> {
    let bridge = ensure_bridge(
        host,
        &BridgeSpec {
            name: &conf.bridge,
            mtu: conf.mtu,
            vlan_filtering: conf.vlan != 0,
            promisc: conf.promisc_mode,
            alias: None,
            ipv6: None,
        },
    )
    .map_err(|e| {
        if conf.vlan != 0 && e.errno() == Some(libc::EOPNOTSUPP) {
            Error::new(
                ErrorCode::Kernel,
                format!("vlan {} needs bridge VLAN filtering, which this kernel lacks (CONFIG_BRIDGE_VLAN_FILTERING)", conf.vlan),
            )
            .with_details(e.to_string())
        } else {
            errors::net(e)
        }
    })?;
    let port = plug(
        host,
        container,
        ns,
        &bridge,
        &VethSpec {
            ifname,
            mtu: conf.mtu,
            hairpin: conf.hairpin_mode,
            vlan: (conf.vlan != 0).then_some(conf.vlan),
            keep_default_vlan: conf.preserve_default_vlan.unwrap_or(true),
            mac: None,
            host_name: None,
            alias: None,
            kept: &[],
        },
    )
    .map_err(errors::net)?;
    Ok((bridge, port))
}

fn add(args: &CmdArgs, conf: &BridgeConf) -> Result<CniResult, Error> {
    let (ns, mut container) = attach::open_free(args)?;
    let mut host = Netlink::open().map_err(errors::net)?;
    // This binary's own host-local needs no interface, so it allocates on a second thread
    // while the kernel builds the veth pair. An exec'd IPAM plugin runs after the pair
    // exists, as the spec orders it: dhcp, for one, sends its requests through it.
    let early_ipam = ipam_type(args).and_then(|t| delegate::in_process(t, args));
    std::thread::scope(|s| {
        let early = early_ipam.map(|p| s.spawn(move || delegate::call(p, Command::Add, args)));
        let plugged = ensure_bridge_and_plug(&mut host, &mut container, &ns, conf, &args.ifname);
        let early = early.map(joined);
        let (bridge, port) = match plugged {
            Ok(p) => p,
            Err(e) => {
                if let (Some(Ok(_)), Some(t)) = (&early, ipam_type(args)) {
                    let _ = delegate::run(t, Command::Del, args);
                }
                return Err(e);
            }
        };
        let mut undo = Undo {
            args,
            ipam: matches!(early, Some(Ok(_))),
            masq: None,
        };
        let finished = (|| {
            let mut result = match (early, ipam_type(args)) {
                (Some(allocated), _) => allocated?.unwrap_or_default(),
                (None, Some(t)) => {
                    undo.ipam = true;
                    delegate::run(t, Command::Add, args)?.unwrap_or_default()
                }
                (None, None) => CniResult::default(),
            };
            finish(
                args,
                conf,
                &ns,
                &mut host,
                &mut container,
                &bridge,
                &port,
                &mut result,
                &mut undo,
            )?;
            Ok(result)
        })();
        finished.inspect_err(|_| undo.run(&mut host, &port))
    })
}

#[allow(clippy::too_many_arguments)]
fn finish(
    args: &CmdArgs,
    conf: &BridgeConf,
    ns: &Netns,
    host: &mut Netlink,
    container: &mut Netlink,
    bridge: &Link,
    port: &VethPair,
    result: &mut CniResult,
    undo: &mut Undo,
) -> Result<(), Error> {
    // Interfaces go after those of a previous plugin, and our addresses point at ours.
    let mut prev = args.prev_result.clone().unwrap_or_default();
    let base = prev.interfaces.len();
    let container_index = base + 2;
    for ip in &mut result.ips {
        ip.interface = Some(container_index);
    }
    if conf.is_default_gateway {
        for ip in &result.ips {
            let Some(gw) = ip.gateway else { continue };
            let default: IpNet = if gw.is_ipv4() { "0.0.0.0/0" } else { "::/0" }
                .parse()
                .expect("literal");
            if !result.routes.iter().any(|r| r.dst == default) {
                result.routes.push(Route {
                    dst: default,
                    gw: Some(gw),
                    ..Route::default()
                });
            }
        }
    }
    let addrs: Vec<IpNet> = result.ips.iter().map(|ip| ip.address).collect();
    let routes = attach::result_routes(result, port.container.index);
    corvid_net::binding::enable_ipv6_for(ns, &port.container, &addrs).map_err(errors::net)?;
    configure(container, &port.container, &addrs, &routes).map_err(errors::net)?;
    corvid_net::announce::announce(container, ns, &port.container, &addrs);
    if conf.is_gateway {
        for ip in &result.ips {
            let Some(gw) = ip.gateway else { continue };
            let gw_net =
                IpNet::new(gw, ip.address.prefix_len()).expect("prefix from a valid address");
            ensure_gateway(host, bridge, gw_net, conf.force_address).map_err(errors::net)?;
            let key = if gw.is_ipv4() {
                "net/ipv4/ip_forward"
            } else {
                "net/ipv6/conf/all/forwarding"
            };
            sysctl::set(key, "1").map_err(errors::net)?;
        }
    }
    if conf.ip_masq && !addrs.is_empty() {
        let tag = attachments::tag(args);
        undo.masq = Some((tag.clone(), addrs.clone()));
        let mut nft = Nftables::open().map_err(errors::net)?;
        masquerade::add_masquerade(&mut nft, &tag, &addrs).map_err(errors::net)?;
    }
    prev.interfaces.extend([
        Interface {
            name: bridge.name.clone(),
            mac: bridge.mac.clone(),
            ..Interface::default()
        },
        Interface {
            name: port.host.name.clone(),
            mac: port.host.mac.clone(),
            ..Interface::default()
        },
        Interface {
            name: port.container.name.clone(),
            mac: port.container.mac.clone(),
            sandbox: ns.path().display().to_string(),
            ..Interface::default()
        },
    ]);
    prev.ips.append(&mut result.ips);
    prev.routes.append(&mut result.routes);
    // The network's own dns wins; without one, the IPAM plugin's is reported.
    match args.conf.dns.as_ref().filter(|d| !d.is_empty()) {
        Some(dns) => prev.dns = dns.clone(),
        None if !result.dns.is_empty() => prev.dns = result.dns.clone(),
        None => {}
    }
    *result = prev;
    Ok(())
}

/// Removes the container's veth pair, from inside the namespace when it still exists.
fn unplug(args: &CmdArgs, conf: &BridgeConf, end: ContainerEnd) -> Result<(), Error> {
    match end {
        ContainerEnd::Plugged(mut container, link) => {
            container.delete_link(&link).map_err(errors::net)
        }
        ContainerEnd::Removed => Ok(()),
        // The namespace is gone; the kernel destroys the pair with it, but not at once:
        // remove the host end now when prevResult names it.
        ContainerEnd::Gone => delete_host_end(args, conf),
    }
}

fn delete_host_end(args: &CmdArgs, conf: &BridgeConf) -> Result<(), Error> {
    let Some(prev) = &args.prev_result else {
        return Ok(());
    };
    let mut host = Netlink::open().map_err(errors::net)?;
    let Some(bridge) = host.link_by_name(&conf.bridge).map_err(errors::net)? else {
        return Ok(());
    };
    for iface in prev
        .interfaces
        .iter()
        .filter(|i| i.sandbox.is_empty() && i.name != conf.bridge)
    {
        if let Some(link) = host.link_by_name(&iface.name).map_err(errors::net)? {
            if link.kind == LinkKind::Veth && link.master == Some(bridge.index) {
                host.delete_link(&link).map_err(errors::net)?;
            }
        }
    }
    Ok(())
}

fn check(args: &CmdArgs, conf: &BridgeConf) -> Result<(), Error> {
    let fail = |msg: String| Err(Error::new(ErrorCode::CheckFailed, msg));
    let prev = args
        .prev_result
        .as_ref()
        .expect("skel requires prevResult for CHECK");
    if let Some(t) = ipam_type(args) {
        delegate::run(t, Command::Check, args)?;
    }
    let ns = Netns::open(netns_path(args)?).map_err(errors::net)?;
    let mut container = Netlink::open_in(&ns).map_err(errors::net)?;
    let mut host = Netlink::open().map_err(errors::net)?;
    let Some(bridge) = host.link_by_name(&conf.bridge).map_err(errors::net)? else {
        return fail(format!("bridge {} does not exist", conf.bridge));
    };
    let Some(link) = container.link_by_name(&args.ifname).map_err(errors::net)? else {
        return fail(format!(
            "interface {} does not exist in {}",
            args.ifname,
            ns.path().display()
        ));
    };
    if link.kind != LinkKind::Veth {
        return fail(format!("interface {} is not a veth", args.ifname));
    }
    let own = prev
        .interfaces
        .iter()
        .position(|i| i.name == args.ifname && !i.sandbox.is_empty());
    if let Some(i) = own {
        let want = &prev.interfaces[i].mac;
        if !want.is_empty() && !want.eq_ignore_ascii_case(&link.mac) {
            return fail(format!(
                "interface {} has MAC {}, the result says {want}",
                args.ifname, link.mac
            ));
        }
    }
    let peer = link
        .peer_index
        .and_then(|i| host.link_by_index(i).ok().flatten());
    if peer.as_ref().and_then(|p| p.master) != Some(bridge.index) {
        return fail(format!(
            "the host end of {} is not attached to {}",
            args.ifname, conf.bridge
        ));
    }
    attach::check_addresses_and_routes(&mut container, &link, prev, own, &ns)
}

impl Plugin for Bridge {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        add(args, &load(args)?)
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        let conf = load(args)?;
        // Every step runs whatever the others did: a lease must not outlive its veth
        // because the veth could not be deleted, nor the other way round.
        let mut failures = Vec::new();
        let mut end = container_end(args).unwrap_or_else(|e| {
            failures.push(e.during(&format!("find {} in its namespace", args.ifname)));
            ContainerEnd::Removed
        });
        // Masquerade goes before the lease: until then no other container can hold the
        // address. Its socket stays open until the veth is gone (see delete_masquerade).
        let mut nft = None;
        if conf.ip_masq {
            let tag = attachments::tag(args);
            let addrs = masqueraded(args, &mut end);
            let removed = Nftables::open().and_then(|mut n| {
                let r = masquerade::delete_masquerade(&mut n, &tag, addrs.as_deref());
                nft = Some(n);
                r
            });
            if let Err(e) = removed {
                failures.push(errors::net(e).during("remove the masquerade"));
            }
        }
        let own_ipam = ipam_type(args).and_then(|t| delegate::in_process(t, args));
        if let (None, Some(t)) = (own_ipam, ipam_type(args)) {
            if let Err(e) = delegate::run(t, Command::Del, args) {
                failures.push(e.during(&format!("release the address ({t})")));
            }
        }
        // Most of a DEL is the kernel waiting out RCU callbacks after the veth goes; this
        // binary's own host-local releases the lease meanwhile.
        let (released, unplugged) = std::thread::scope(|s| {
            let released = own_ipam.map(|p| s.spawn(move || delegate::call(p, Command::Del, args)));
            let unplugged = unplug(args, &conf, end);
            (released.map(joined).transpose(), unplugged)
        });
        drop(nft);
        if let Err(e) = released {
            failures.push(e.during("release the address"));
        }
        if let Err(e) = unplugged {
            let netns = args.netns.as_ref().map(|p| p.display().to_string());
            failures.push(e.during(&format!(
                "unplug {} in {}",
                args.ifname,
                netns.as_deref().unwrap_or("a namespace already gone")
            )));
        }
        Error::all(failures)
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        check(args, &load(args)?)
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

    fn refused(conf: serde_json::Value) -> Option<&'static str> {
        serde_json::from_value::<Unsupported>(conf)
            .unwrap()
            .refused()
            .map(|(field, _)| field)
    }

    #[test]
    fn reference_fields_left_off_are_accepted_and_asked_for_are_refused() {
        let off = serde_json::json!({"macspoofchk": false, "vlanTrunk": [], "enabledad": false,
            "disableContainerInterface": false, "portIsolation": false, "ipMasqBackend": "nftables"});
        assert_eq!(refused(off), None);
        assert_eq!(refused(serde_json::json!({})), None);
        assert_eq!(
            refused(serde_json::json!({"vlanTrunk": [{"minID": 1, "maxID": 9}]})),
            Some("vlanTrunk")
        );
        assert_eq!(
            refused(serde_json::json!({"portIsolation": true})),
            Some("portIsolation")
        );
        assert_eq!(
            refused(serde_json::json!({"disableContainerInterface": true})),
            Some("disableContainerInterface")
        );
    }
}
