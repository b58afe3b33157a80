//! The VXLAN overlay between hosts: one vxlan device per network on its bridge, with
//! static forwarding (FDB) and neighbour entries instead of multicast or learning, so
//! every remote MAC and address is known before the first frame leaves.

use crate::link::{parse_mac, Link};
use crate::netlink::Netlink;
use crate::{netlink_err, Result};
use netlink_packet_core::{NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE};
use netlink_packet_route::link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkInfo};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::IpAddr;

/// The IANA VXLAN port.
pub const VXLAN_PORT: u16 = 4789;

/// The MAC of an FDB entry that floods broadcast and unknown frames to a remote host.
pub const FLOOD_MAC: &str = "00:00:00:00:00:00";

/// The largest MTU a pod's frame may have and still cross an underlay device of MTU
/// `device_mtu` once encapsulated from `local`: VXLAN adds the outer IP, UDP and VXLAN
/// headers and the inner Ethernet header, 50 bytes over IPv4 and 70 over IPv6.
pub fn encapsulated_mtu(local: IpAddr, device_mtu: u32) -> u32 {
    let outer_ip = if local.is_ipv6() { 40 } else { 20 };
    device_mtu.saturating_sub(outer_ip + 8 + 8 + 14)
}

/// The MTU a network of MTU `network_mtu` gets on the host whose underlay address is
/// `local`: its own, unless the device holding `local` cannot carry that much once
/// encapsulated (the controller's default of 1450 fits an IPv4 underlay of 1500, not an
/// IPv6 one). The network's own when `local` is unknown or no device holds it.
pub fn pod_mtu(nl: &mut Netlink, local: Option<IpAddr>, network_mtu: u32) -> Result<u32> {
    let Some(local) = local else {
        return Ok(network_mtu);
    };
    let Some((index, _)) = nl
        .addresses(None)?
        .into_iter()
        .find(|(_, a)| a.addr() == local)
    else {
        return Ok(network_mtu);
    };
    Ok(match nl.link_by_index(index)? {
        Some(device) => network_mtu.min(encapsulated_mtu(local, device.mtu)),
        None => network_mtu,
    })
}

/// A vxlan device to create.
#[derive(Debug, Clone)]
pub struct VxlanSpec<'a> {
    /// Device name.
    pub name: &'a str,
    /// VXLAN network identifier.
    pub vni: u32,
    /// This host's underlay address (the tunnels' source).
    pub local: IpAddr,
    /// The bridge the device is a port of.
    pub master: u32,
    /// MTU; the kernel derives one when none.
    pub mtu: Option<u32>,
}

/// One static forwarding entry: frames for `mac` go to the host at `dst`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FdbEntry {
    /// Destination MAC, `FLOOD_MAC` for the flood list.
    pub mac: String,
    /// The remote host's underlay address.
    pub dst: IpAddr,
}

/// One static neighbour entry: `ip` answers at `mac` (the vxlan device replies to ARP for it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NeighbourEntry {
    /// The remote port's address.
    pub ip: IpAddr,
    /// Its MAC.
    pub mac: String,
}

fn address(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(v) => NeighbourAddress::Inet(v),
        IpAddr::V6(v) => NeighbourAddress::Inet6(v),
    }
}

fn from_address(a: &NeighbourAddress) -> Option<IpAddr> {
    match a {
        NeighbourAddress::Inet(v) => Some(IpAddr::V4(*v)),
        NeighbourAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        // FDB dumps (family AF_BRIDGE) carry the remote address as raw bytes.
        NeighbourAddress::Other(b) => match b.len() {
            4 => <[u8; 4]>::try_from(&b[..]).ok().map(IpAddr::from),
            16 => <[u8; 16]>::try_from(&b[..]).ok().map(IpAddr::from),
            _ => None,
        },
        _ => None,
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

fn fdb_message(link: &Link, e: &FdbEntry) -> io::Result<NeighbourMessage> {
    let mac = parse_mac(&e.mac).ok_or_else(|| invalid(format!("bad MAC {}", e.mac)))?;
    let mut m = NeighbourMessage::default();
    m.header.family = AddressFamily::Bridge;
    m.header.ifindex = link.index;
    m.header.state = NeighbourState::Permanent;
    m.header.flags = NeighbourFlags::Own;
    m.attributes.push(NeighbourAttribute::LinkLayerAddress(mac));
    m.attributes
        .push(NeighbourAttribute::Destination(address(e.dst)));
    Ok(m)
}

fn neighbour_message(link: &Link, e: &NeighbourEntry) -> io::Result<NeighbourMessage> {
    let mac = parse_mac(&e.mac).ok_or_else(|| invalid(format!("bad MAC {}", e.mac)))?;
    let mut m = NeighbourMessage::default();
    m.header.family = if e.ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    m.header.ifindex = link.index;
    m.header.state = NeighbourState::Permanent;
    m.attributes
        .push(NeighbourAttribute::Destination(address(e.ip)));
    m.attributes.push(NeighbourAttribute::LinkLayerAddress(mac));
    Ok(m)
}

/// Deletes are fine when the entry is already gone.
fn gone_ok(r: io::Result<Vec<RouteNetlinkMessage>>) -> io::Result<()> {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r.map(drop),
    }
}

impl Netlink {
    /// Creates a vxlan device, up, on `spec.master`, with learning off and ARP answered
    /// from its neighbour entries; fails with EEXIST when the name is taken. The host's
    /// IPv6 is off on it, as a bridge port needs none ([`crate::sysctl::set_ipv6`]; this
    /// socket must be the calling thread's namespace's).
    pub fn add_vxlan(&mut self, spec: &VxlanSpec) -> Result<()> {
        let mut m = crate::link::new_up_link(spec.name, spec.mtu);
        m.attributes.push(LinkAttribute::Controller(spec.master));
        let local = match spec.local {
            IpAddr::V4(v) => InfoVxlan::Local(v),
            IpAddr::V6(v) => InfoVxlan::Local6(v),
        };
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Vxlan),
            LinkInfo::Data(InfoData::Vxlan(vec![
                InfoVxlan::Id(spec.vni),
                local,
                InfoVxlan::Port(VXLAN_PORT),
                InfoVxlan::Learning(false),
                InfoVxlan::Proxy(true),
            ])),
        ]));
        let op = format!("create vxlan {} (vni {})", spec.name, spec.vni);
        self.create_link(m, false, &op)
    }

    /// Adds an FDB entry on a vxlan device; flood entries to several hosts coexist.
    pub fn add_fdb(&mut self, vxlan: &Link, e: &FdbEntry) -> Result<()> {
        let op = || format!("add fdb {} dst {} on {}", e.mac, e.dst, vxlan.name);
        let m = fdb_message(vxlan, e).map_err(netlink_err(op()))?;
        let flags = if e.mac == FLOOD_MAC {
            NLM_F_CREATE | NLM_F_APPEND | NLM_F_ACK
        } else {
            NLM_F_CREATE | NLM_F_REPLACE | NLM_F_ACK
        };
        match self.request(RouteNetlinkMessage::NewNeighbour(m), flags) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            r => r.map(drop).map_err(netlink_err(op())),
        }
    }

    /// Removes an FDB entry; one that is already gone is fine.
    pub fn delete_fdb(&mut self, vxlan: &Link, e: &FdbEntry) -> Result<()> {
        let op = || format!("delete fdb {} dst {} on {}", e.mac, e.dst, vxlan.name);
        let m = fdb_message(vxlan, e).map_err(netlink_err(op()))?;
        gone_ok(self.request(RouteNetlinkMessage::DelNeighbour(m), NLM_F_ACK))
            .map_err(netlink_err(op()))
    }

    /// The static FDB entries of a vxlan device (those with a remote destination).
    pub fn fdb(&mut self, vxlan: &Link) -> Result<BTreeSet<FdbEntry>> {
        Ok(self
            .fdb_by_device()?
            .remove(&vxlan.index)
            .unwrap_or_default())
    }

    /// Every device's static FDB and permanent neighbour entries, from one dump of each
    /// table: what a pass over many devices reads, as a dump walks the whole namespace
    /// whichever device it is for.
    pub fn overlay_entries(&mut self) -> Result<OverlayEntries> {
        Ok(OverlayEntries {
            fdb: self.fdb_by_device()?,
            neighbours: self.neighbours_by_device()?,
        })
    }

    /// The static FDB entries with a remote destination, by device, from one dump.
    fn fdb_by_device(&mut self) -> Result<HashMap<u32, BTreeSet<FdbEntry>>> {
        let mut out: HashMap<u32, BTreeSet<FdbEntry>> = HashMap::new();
        let mut m = NeighbourMessage::default();
        m.header.family = AddressFamily::Bridge;
        let replies = self
            .request(RouteNetlinkMessage::GetNeighbour(m), NLM_F_DUMP)
            .map_err(netlink_err("list the fdb".to_string()))?;
        for (index, mac, dst) in permanent(replies) {
            if let Some(dst) = dst {
                out.entry(index).or_default().insert(FdbEntry { mac, dst });
            }
        }
        Ok(out)
    }

    /// The permanent neighbour entries (IPv4 and IPv6) by device, from one dump of each.
    fn neighbours_by_device(&mut self) -> Result<HashMap<u32, BTreeSet<NeighbourEntry>>> {
        let mut out: HashMap<u32, BTreeSet<NeighbourEntry>> = HashMap::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut m = NeighbourMessage::default();
            m.header.family = family;
            let replies = self
                .request(RouteNetlinkMessage::GetNeighbour(m), NLM_F_DUMP)
                .map_err(netlink_err("list the neighbours".to_string()))?;
            for (index, mac, ip) in permanent(replies) {
                if let Some(ip) = ip {
                    out.entry(index)
                        .or_default()
                        .insert(NeighbourEntry { ip, mac });
                }
            }
        }
        Ok(out)
    }

    /// The index of the device a bridge's forwarding table sends `mac` to (untagged), if
    /// it has an entry for it: the bridge's own index for the bridge's own address.
    pub fn fdb_owner(&mut self, bridge: &Link, mac: &str) -> Result<Option<u32>> {
        let op = || format!("look up {mac} in the fdb of {}", bridge.name);
        let bytes = parse_mac(mac)
            .ok_or_else(|| netlink_err(op())(io::Error::from_raw_os_error(libc::EINVAL)))?;
        let mut m = NeighbourMessage::default();
        m.header.family = AddressFamily::Bridge;
        m.attributes
            .push(NeighbourAttribute::LinkLayerAddress(bytes));
        m.attributes
            .push(NeighbourAttribute::Controller(bridge.index));
        match self.request(RouteNetlinkMessage::GetNeighbour(m), 0) {
            Ok(replies) => Ok(replies.into_iter().find_map(|r| match r {
                RouteNetlinkMessage::NewNeighbour(n) => Some(n.header.ifindex),
                _ => None,
            })),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(netlink_err(op())(e)),
        }
    }

    /// Adds or replaces a permanent neighbour entry on a device.
    pub fn set_neighbour(&mut self, link: &Link, e: &NeighbourEntry) -> Result<()> {
        let op = || format!("set neighbour {} at {} on {}", e.ip, e.mac, link.name);
        let m = neighbour_message(link, e).map_err(netlink_err(op()))?;
        self.request(
            RouteNetlinkMessage::NewNeighbour(m),
            NLM_F_CREATE | NLM_F_REPLACE | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(op()))
    }

    /// Removes a neighbour entry; one that is already gone is fine.
    pub fn delete_neighbour(&mut self, link: &Link, e: &NeighbourEntry) -> Result<()> {
        let op = || format!("delete neighbour {} on {}", e.ip, link.name);
        let m = neighbour_message(link, e).map_err(netlink_err(op()))?;
        gone_ok(self.request(RouteNetlinkMessage::DelNeighbour(m), NLM_F_ACK))
            .map_err(netlink_err(op()))
    }

    /// The permanent neighbour entries of a device.
    pub fn neighbours(&mut self, link: &Link) -> Result<BTreeSet<NeighbourEntry>> {
        Ok(self
            .neighbours_by_device()?
            .remove(&link.index)
            .unwrap_or_default())
    }
}

/// Static FDB and permanent neighbour entries by device index.
#[derive(Debug, Default)]
pub struct OverlayEntries {
    /// FDB entries with a remote destination.
    pub fdb: HashMap<u32, BTreeSet<FdbEntry>>,
    /// Neighbour entries.
    pub neighbours: HashMap<u32, BTreeSet<NeighbourEntry>>,
}

impl OverlayEntries {
    /// Takes out device `index`'s FDB and neighbour entries.
    pub fn take(&mut self, index: u32) -> (BTreeSet<FdbEntry>, BTreeSet<NeighbourEntry>) {
        (
            self.fdb.remove(&index).unwrap_or_default(),
            self.neighbours.remove(&index).unwrap_or_default(),
        )
    }
}

/// (device index, MAC, address) of the permanent entries in a neighbour dump.
fn permanent(
    replies: Vec<RouteNetlinkMessage>,
) -> impl Iterator<Item = (u32, String, Option<IpAddr>)> {
    replies.into_iter().filter_map(move |r| {
        let RouteNetlinkMessage::NewNeighbour(m) = r else {
            return None;
        };
        if m.header.state != NeighbourState::Permanent {
            return None;
        }
        let mut mac = None;
        let mut dst = None;
        for a in &m.attributes {
            match a {
                NeighbourAttribute::LinkLayerAddress(b) => mac = Some(crate::link::format_mac(b)),
                NeighbourAttribute::Destination(d) => dst = from_address(d),
                _ => {}
            }
        }
        Some((m.header.ifindex, mac?, dst))
    })
}
