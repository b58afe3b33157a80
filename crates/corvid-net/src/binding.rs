//! Binding: put an interface named IFNAME into a namespace, attached to a Linux bridge on
//! this host, with its addresses and routes. Every adapter that binds (the bridge plugin
//! now, the agent later) calls these functions.

use crate::link::{Link, LinkKind};
use crate::netlink::Netlink;
use crate::netns::Netns;
use crate::route::RouteSpec;
use crate::{netlink_err, Error, Result};
use ipnet::IpNet;
use std::io;
use std::net::IpAddr;

/// The bridge a port attaches to.
#[derive(Debug, Clone)]
pub struct BridgeSpec<'a> {
    /// Bridge name.
    pub name: &'a str,
    /// MTU when the bridge is created.
    pub mtu: Option<u32>,
    /// Enable VLAN filtering (needed for tagged ports).
    pub vlan_filtering: bool,
    /// Put the bridge in promiscuous mode.
    pub promisc: bool,
    /// The owner mark to give it as its alias ([`crate::names::owner_mark`]).
    pub alias: Option<&'a str>,
    /// Whether the host speaks IPv6 on it, kept so when it exists; `None` leaves the
    /// kernel's default. Set through the calling thread's /proc/sys, so `host` must be
    /// that namespace's socket ([`crate::sysctl::set_ipv6`]).
    pub ipv6: Option<bool>,
}

/// Returns the bridge, creating it (up) when missing; a same-named non-bridge is an error.
///
/// A bridge without a MAC of its own takes the lowest MAC among its ports, so the
/// gateway's MAC would change whenever a container comes or goes, and the others would
/// keep sending to the old one until their ARP entry expires. A new bridge is therefore
/// given a random MAC at creation, and an existing one whose MAC still follows its
/// ports (made by an older corvid, or by hand) is fixed to the MAC it has now, which
/// is the one its containers know.
pub fn ensure_bridge(host: &mut Netlink, spec: &BridgeSpec) -> Result<Link> {
    let mut made = false;
    let mut existing = match host.link_by_name(spec.name)? {
        Some(link) => link,
        None => {
            let mac = random_mac();
            let ipv6 = spec.ipv6 != Some(false);
            match host.add_bridge(spec.name, spec.mtu, spec.vlan_filtering, Some(&mac), ipv6) {
                Err(e) if e.errno() == Some(libc::EEXIST) => {}
                r => {
                    r?;
                    made = true;
                }
            }
            host.link_by_name(spec.name)?
                .ok_or_else(|| Error::Netlink {
                    op: format!("find bridge {} after creating it", spec.name),
                    source: io::Error::from_raw_os_error(libc::ENODEV),
                })?
        }
    };
    if existing.kind != LinkKind::Bridge {
        return Err(Error::Netlink {
            op: format!(
                "use {} as a bridge: it is a {:?} device",
                spec.name, existing.kind
            ),
            source: io::Error::from_raw_os_error(libc::EEXIST),
        });
    }
    // One made here was given its MAC at birth.
    if !made && !mac_is_fixed(host, &existing)? {
        let mac = if existing.mac.is_empty() || existing.mac == ZERO_MAC {
            random_mac()
        } else {
            existing.mac.clone()
        };
        host.set_mac(&existing, &mac)?;
        existing.mac = mac;
    }
    if spec.vlan_filtering {
        host.set_vlan_filtering(&existing)?;
    }
    if let Some(on) = spec.ipv6 {
        crate::sysctl::set_ipv6(spec.name, on)?;
    }
    if !existing.up {
        host.set_up(&existing)?;
    }
    if spec.promisc && !existing.promisc {
        host.set_promisc(&existing, true)?;
    }
    mark(host, &mut existing, spec.alias)?;
    Ok(existing)
}

/// What an unfixed bridge shows once its last port has left.
const ZERO_MAC: &str = "00:00:00:00:00:00";

/// The kernel's NET_ADDR_SET: the MAC was chosen by someone, not inherited from a port.
const ADDR_SET: &str = "3";

/// Whether the bridge keeps its MAC when ports come and go.
fn mac_is_fixed(host: &mut Netlink, bridge: &Link) -> Result<bool> {
    if let Some(kind) = sysfs_addr_assign_type(bridge) {
        return Ok(kind == ADDR_SET);
    }
    // Without the kernel's word: a bridge that took its MAC from a port finds that MAC's
    // forwarding entry on the port; its own MAC's entry is on the bridge itself.
    if bridge.mac.is_empty() || bridge.mac == ZERO_MAC {
        return Ok(false);
    }
    Ok(host.fdb_owner(bridge, &bridge.mac)? == Some(bridge.index))
}

/// The bridge's `addr_assign_type` from sysfs, when sysfs shows this namespace: it
/// shows the one it was mounted in, which a caller that only entered a namespace (no
/// `ip netns exec`) does not share, so the device found must be the same one.
fn sysfs_addr_assign_type(bridge: &Link) -> Option<String> {
    let dir = std::path::Path::new("/sys/class/net").join(&bridge.name);
    let read = |file: &str| {
        std::fs::read_to_string(dir.join(file))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let same = read("ifindex")? == bridge.index.to_string() && read("address")? == bridge.mac;
    same.then(|| read("addr_assign_type")).flatten()
}

/// How a port is plugged.
#[derive(Debug, Clone)]
pub struct VethSpec<'a> {
    /// The interface name inside the container.
    pub ifname: &'a str,
    /// MTU of both veth ends.
    pub mtu: Option<u32>,
    /// Hairpin mode on the bridge port.
    pub hairpin: bool,
    /// VLAN to tag the port with (untagged PVID).
    pub vlan: Option<u16>,
    /// Keep VLAN 1 on a tagged port.
    pub keep_default_vlan: bool,
    /// MAC of the container end; a random locally administered one when none.
    pub mac: Option<&'a str>,
    /// Name of the host end; a random `vethXXXXXXXX` when none.
    pub host_name: Option<&'a str>,
    /// The owner mark to give the host end as its alias ([`crate::names::owner_mark`]).
    pub alias: Option<&'a str>,
    /// Allowed address pairs: an address a pair names alone (a keepalived VIP) may stay
    /// in the container besides its own; a check removes any other. (A wider pair keeps
    /// nothing, or a former address of the port inside it would stay.)
    pub kept: &'a [IpNet],
}

/// Gives `link` the alias `alias`, if one is asked and it has another.
pub fn mark(host: &mut Netlink, link: &mut Link, alias: Option<&str>) -> Result<()> {
    if let Some(alias) = alias.filter(|a| *a != link.alias) {
        host.set_alias(link, alias)?;
        link.alias = alias.to_string();
    }
    Ok(())
}

/// A plugged port: the host end on the bridge, the container end in the namespace.
#[derive(Debug, Clone)]
pub struct VethPair {
    /// The host end.
    pub host: Link,
    /// The container end.
    pub container: Link,
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // Fails only without any entropy source, where nothing else would work either.
    getrandom::fill(&mut b).expect("the kernel's random source");
    b
}

fn random_suffix() -> String {
    random_bytes::<4>()
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// A random unicast, locally administered MAC, as the kernel would pick.
fn random_mac() -> String {
    let mut b = random_bytes::<6>();
    b[0] = (b[0] & 0xfe) | 0x02;
    crate::link::format_mac(&b)
}

/// Creates a veth pair: the host end (`spec.host_name` or a fresh `vethXXXXXXXX`) on
/// the bridge, up, and `spec.ifname` inside `netns`, up. The caller has checked that `spec.ifname` is free there.
pub fn plug(
    host: &mut Netlink,
    container: &mut Netlink,
    netns: &Netns,
    bridge: &Link,
    spec: &VethSpec,
) -> Result<VethPair> {
    make_pair(host, container, netns, Some(bridge), spec)
}

/// As [`plug`], with the host end on no bridge: a point-to-point link (ptp).
pub fn pair(
    host: &mut Netlink,
    container: &mut Netlink,
    netns: &Netns,
    spec: &VethSpec,
) -> Result<VethPair> {
    make_pair(host, container, netns, None, spec)
}

fn make_pair(
    host: &mut Netlink,
    container: &mut Netlink,
    netns: &Netns,
    bridge: Option<&Link>,
    spec: &VethSpec,
) -> Result<VethPair> {
    // Choosing the container end's MAC here, with the kernel echoing the host end (and
    // the peer's index), spares two lookups that wait on the kernel's work on the new pair.
    let peer_mac = spec.mac.map_or_else(random_mac, str::to_string);
    let mut attempt = 0;
    let (host_name, echoed) = loop {
        let name = match spec.host_name {
            Some(n) => n.to_string(),
            None => format!("veth{}", random_suffix()),
        };
        match host.add_veth(
            &name,
            bridge.map(|b| b.index),
            spec.ifname,
            netns,
            spec.mtu,
            Some(&peer_mac),
        ) {
            Err(e)
                if e.errno() == Some(libc::EEXIST) && attempt < 3 && spec.host_name.is_none() =>
            {
                if container.link_by_name(spec.ifname)?.is_some() {
                    return Err(e);
                }
                attempt += 1;
            }
            Err(e) if e.errno() == Some(libc::EXFULL) => {
                return Err(crate::Error::Netlink {
                    op: format!(
                        "plug {name} into bridge {}: it has the 1,024 ports a Linux bridge \
                         can take",
                        bridge.map_or("", |b| b.name.as_str())
                    ),
                    source: io::Error::from_raw_os_error(libc::EXFULL),
                })
            }
            r => break (name, r?),
        }
    };
    let port = match echoed {
        Some(
            host_link @ Link {
                peer_index: Some(peer),
                ..
            },
        ) => VethPair {
            container: Link {
                index: peer,
                name: spec.ifname.to_string(),
                mac: peer_mac,
                mtu: host_link.mtu,
                master: None,
                peer_index: Some(host_link.index),
                kind: LinkKind::Veth,
                child: None,
                vrf_table: None,
                alias: String::new(),
                up: false,
                promisc: false,
                allmulti: false,
                txqlen: host_link.txqlen,
            },
            host: host_link,
        },
        _ => {
            let host_link = host.link_by_name(&host_name)?;
            let container_link = container.link_by_name(spec.ifname)?;
            let (Some(host), Some(container)) = (host_link, container_link) else {
                return Err(netlink_err(format!(
                    "find veth pair {host_name}/{}",
                    spec.ifname
                ))(io::Error::from_raw_os_error(
                    libc::ENODEV,
                )));
            };
            VethPair { host, container }
        }
    };
    let mut port = port;
    let configured = (|| {
        mark(host, &mut port.host, spec.alias)?;
        if bridge.is_some() {
            // A bridge port never needs an IPv6 address of its own (the bridge holds the
            // gateways); the peer is still down, so its carrier too, and none is made yet.
            host.set_no_link_local(&port.host)?;
        }
        set_ipv6(netns, &port.container.name, false)?;
        container.set_up(&port.container)?;
        if spec.hairpin {
            host.set_hairpin(&port.host, true)?;
        }
        if let Some(vid) = spec.vlan {
            host.set_port_vlan(&port.host, vid, spec.keep_default_vlan, false)?;
        }
        Ok(())
    })();
    if let Err(e) = configured {
        let _ = host.delete_link(&port.host);
        return Err(e);
    }
    Ok(port)
}

/// Turns IPv6 on or off on the interface `ifname` of `netns`; a kernel without IPv6 has
/// nothing to turn.
fn set_ipv6(netns: &Netns, ifname: &str, on: bool) -> Result<()> {
    let key = format!("net/ipv6/conf/{ifname}/disable_ipv6");
    let value = if on { "0" } else { "1" };
    match netns.run(|| crate::sysctl::set(&key, value))? {
        Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Turns IPv6 back on for a container end that gets an IPv6 address, before it gets it.
///
/// A pair's container end starts with IPv6 off, as Docker's interfaces on IPv4-only
/// networks have since CVE-2024-32473: no address a router's advertisement could give
/// it, and none of the link-local address's duplicate detection, listener reports and
/// router solicitations, which the bridge floods to every port (most of an ADD's
/// growth with the bridge's size).
pub fn enable_ipv6_for(netns: &Netns, link: &Link, addrs: &[IpNet]) -> Result<()> {
    if addrs.iter().any(|a| a.addr().is_ipv6()) {
        set_ipv6(netns, &link.name, true)?;
    }
    Ok(())
}

/// Gives an interface its addresses and routes; an existing default route is kept, as
/// the spec asks when another network installed one first.
pub fn configure(
    nl: &mut Netlink,
    link: &Link,
    addrs: &[IpNet],
    routes: &[RouteSpec],
) -> Result<()> {
    for addr in addrs {
        match nl.add_address(link.index, addr) {
            Err(e) if e.errno() == Some(libc::EEXIST) => {}
            r => r?,
        }
    }
    for route in routes {
        match nl.add_route(route) {
            Err(e) if e.errno() == Some(libc::EEXIST) && route.dst.prefix_len() == 0 => {}
            r => r?,
        }
    }
    Ok(())
}

/// Makes sure the bridge holds `gateway` (with the subnet's prefix). Without `force`, a
/// different address of the same family in the same subnet is an error; with it, that
/// address is replaced.
pub fn ensure_gateway(
    host: &mut Netlink,
    bridge: &Link,
    gateway: IpNet,
    force: bool,
) -> Result<()> {
    let current = host.addresses(Some(bridge.index))?;
    if current.iter().any(|(_, a)| *a == gateway) {
        return Ok(());
    }
    for (_, other) in current {
        let same_family = other.addr().is_ipv4() == gateway.addr().is_ipv4();
        let same_subnet = other.trunc() == gateway.trunc();
        if same_family && same_subnet && gateway.addr().is_ipv4() {
            if !force {
                return Err(Error::Netlink {
                    op: format!(
                        "bridge {} has address {other}, not the gateway {gateway} (set forceAddress to replace it)",
                        bridge.name
                    ),
                    source: io::Error::from_raw_os_error(libc::EEXIST),
                });
            }
            host.delete_address(bridge.index, &other)?;
        }
    }
    match host.add_address(bridge.index, &gateway) {
        Err(e) if e.errno() == Some(libc::EEXIST) => Ok(()),
        r => r,
    }
}

/// What [`ensure_plugged`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plugged {
    /// Both ends and the namespace side were as asked.
    Intact,
    /// A new pair was made; `replaced` when an unusable one was removed first (a
    /// namespace end missing or with another MAC, a host end off the bridge).
    New {
        /// An old pair was removed first.
        replaced: bool,
    },
    /// The pair was there but its namespace side was not finished: these steps were done.
    Finished(Vec<String>),
}

/// Makes a port plugged as asked, whatever an interrupted earlier attempt or a hand
/// left behind: the pair is kept when both ends are there, joined, on `bridge` and with
/// the asked MAC, and then finished in place (both ends up, the addresses exactly
/// `addrs`, bar IPv6 link-local ones, and each of `routes` present); otherwise it is
/// removed and plugged anew. `spec.host_name` names the host end and is required: it
/// is how the pair is found again. Routes the port does not ask for are left alone, as
/// something else in the namespace may have added them.
pub fn ensure_plugged(
    host: &mut Netlink,
    container: &mut Netlink,
    netns: &Netns,
    bridge: &Link,
    spec: &VethSpec,
    addrs: &[IpNet],
    routes: &[(IpNet, Option<IpAddr>)],
) -> Result<Plugged> {
    let Some(host_name) = spec.host_name else {
        return Err(netlink_err(format!(
            "check port {}: no host end name to find it by",
            spec.ifname
        ))(io::Error::from_raw_os_error(libc::EINVAL)));
    };
    let host_end = host.link_by_name(host_name)?;
    let pod_end = container.link_by_name(spec.ifname)?;
    let replaced = match (host_end, pod_end) {
        (Some(mut h), Some(c)) if is_pair(&h, &c, bridge, spec) => {
            // A pair from before the marks gets its owner's; it is not a repair.
            mark(host, &mut h, spec.alias)?;
            let mut done = Vec::new();
            if !h.up {
                host.set_up(&h)?;
                done.push(format!("{host_name} set up"));
            }
            if !c.up {
                container.set_up(&c)?;
                done.push(format!("{} set up", spec.ifname));
            }
            if spec.hairpin {
                // Pairs plugged before hairpin was asked for get it too (the link dump
                // does not say whether a port has it).
                host.set_hairpin(&h, true)?;
            }
            enable_ipv6_for(netns, &c, addrs)?;
            let readdressed = sync_addresses(container, &c, addrs, spec.kept)?;
            if !readdressed.is_empty() {
                crate::announce::announce(container, netns, &c, addrs);
            }
            done.extend(readdressed);
            done.extend(sync_routes(container, &c, routes)?);
            return Ok(if done.is_empty() {
                Plugged::Intact
            } else {
                Plugged::Finished(done)
            });
        }
        (h, c) => {
            if let Some(h) = &h {
                host.delete_link(h)?;
            }
            // Deleting the host end took its peer along; what still holds the name is
            // not this port's and is not ours to remove.
            if c.is_some() && container.link_by_name(spec.ifname)?.is_some() {
                return Err(netlink_err(format!(
                    "plug {host_name}: {} already exists in {} and is not its peer",
                    spec.ifname,
                    netns.path().display()
                ))(io::Error::from_raw_os_error(
                    libc::EEXIST,
                )));
            }
            h.is_some()
        }
    };
    let port = plug(host, container, netns, bridge, spec)?;
    let routes: Vec<RouteSpec> = routes
        .iter()
        .map(|(dst, gw)| RouteSpec::new(*dst, *gw, port.container.index))
        .collect();
    enable_ipv6_for(netns, &port.container, addrs)
        .and_then(|()| configure(container, &port.container, addrs, &routes))
        .inspect_err(|_| drop(host.delete_link(&port.host)))?;
    crate::announce::announce(container, netns, &port.container, addrs);
    Ok(Plugged::New { replaced })
}

/// Whether `h` and `c` are the two ends of one pair, `h` on the bridge and `c` with the
/// asked MAC.
fn is_pair(h: &Link, c: &Link, bridge: &Link, spec: &VethSpec) -> bool {
    h.kind == LinkKind::Veth
        && c.kind == LinkKind::Veth
        && c.peer_index == Some(h.index)
        && h.peer_index == Some(c.index)
        && h.master == Some(bridge.index)
        && spec.mac.is_none_or(|m| m.eq_ignore_ascii_case(&c.mac))
}

fn is_host(net: &IpNet) -> bool {
    net.prefix_len() == net.max_prefix_len()
}

fn is_link_local(a: &IpNet) -> bool {
    matches!(a.addr(), IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// Adds the missing addresses and removes the others, but for IPv6 link-local ones and
/// those `kept` names alone.
fn sync_addresses(
    nl: &mut Netlink,
    link: &Link,
    want: &[IpNet],
    kept: &[IpNet],
) -> Result<Vec<String>> {
    let have: Vec<IpNet> = nl
        .addresses(Some(link.index))?
        .into_iter()
        .map(|(_, a)| a)
        .collect();
    let mut done = Vec::new();
    // Removals first: deleting a primary IPv4 address takes the secondaries of its
    // subnet with it, so one added before would go too.
    for a in have
        .iter()
        .filter(|a| !want.contains(a) && !is_link_local(a))
        .filter(|a| !kept.iter().any(|k| k.addr() == a.addr() && is_host(k)))
    {
        nl.delete_address(link.index, a)?;
        done.push(format!("address {a} removed from {}", link.name));
    }
    for a in want.iter().filter(|a| !have.contains(a)) {
        match nl.add_address(link.index, a) {
            Err(e) if e.errno() == Some(libc::EEXIST) => {}
            r => r?,
        }
        done.push(format!("address {a} added to {}", link.name));
    }
    Ok(done)
}

/// Adds the missing routes, replacing one to the same destination via another gateway.
fn sync_routes(
    nl: &mut Netlink,
    link: &Link,
    want: &[(IpNet, Option<IpAddr>)],
) -> Result<Vec<String>> {
    let main = Some(crate::route::MAIN_TABLE);
    let have: Vec<RouteSpec> = nl
        .routes()?
        .into_iter()
        .filter(|r| r.oif == link.index && r.table == main)
        .collect();
    let mut done = Vec::new();
    for (dst, gw) in want {
        let dst = dst.trunc();
        if have.iter().any(|r| r.dst == dst && r.gw == *gw) {
            continue;
        }
        for stale in have.iter().filter(|r| r.dst == dst) {
            nl.delete_route(stale)?;
        }
        match nl.add_route(&RouteSpec::new(dst, *gw, link.index)) {
            // Another network's interface holds the default route: it keeps it.
            Err(e) if e.errno() == Some(libc::EEXIST) && dst.prefix_len() == 0 => continue,
            r => r?,
        }
        let via = gw.map(|g| format!(" via {g}")).unwrap_or_default();
        done.push(format!("route to {dst}{via} added"));
    }
    Ok(done)
}
