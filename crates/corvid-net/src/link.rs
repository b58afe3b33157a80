//! Links: look up, create bridges and veth pairs, set state, master, bridge-port options.

use crate::netlink::Netlink;
use crate::netns::Netns;
use crate::{netlink_err, Result};
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_ECHO, NLM_F_EXCL};
use netlink_packet_route::link::{
    AfSpecBridge, AfSpecInet6, AfSpecUnspec, BridgeVlanInfo, BridgeVlanInfoFlags, In6AddrGenMode,
    InfoBridge, InfoBridgePort, InfoData, InfoIpVlan, InfoKind, InfoMacVlan, InfoPortData,
    InfoPortKind, InfoVeth, InfoVlan, InfoVrf, IpVlanMode, LinkAttribute, LinkExtentMask,
    LinkFlags, LinkInfo, LinkMessage, MacVlanMode,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

/// What kind of device a link is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkKind {
    /// A Linux bridge.
    Bridge,
    /// One end of a veth pair.
    Veth,
    /// A VLAN sub-interface.
    Vlan,
    /// A VXLAN tunnel device.
    Vxlan,
    /// A macvlan on a parent device.
    Macvlan,
    /// An ipvlan on a parent device.
    Ipvlan,
    /// A dummy device.
    Dummy,
    /// A VRF device (a routing table of its own for its ports).
    Vrf,
    /// Anything else (loopback, physical, ...), with the kernel's kind name if any.
    Other(String),
}

/// A link as the kernel reports it.
#[derive(Debug, Clone)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Hardware address as aa:bb:cc:dd:ee:ff, empty when the link has none.
    pub mac: String,
    /// MTU.
    pub mtu: u32,
    /// Index of the bridge it is attached to.
    pub master: Option<u32>,
    /// For a veth, the peer's index (in the peer's namespace).
    pub peer_index: Option<u32>,
    /// Device kind.
    pub kind: LinkKind,
    /// True when administratively up.
    pub up: bool,
    /// True when in promiscuous mode.
    pub promisc: bool,
    /// True when receiving all multicast.
    pub allmulti: bool,
    /// The transmit queue length.
    pub txqlen: u32,
    /// For a macvlan, ipvlan or VLAN, how it shares its parent.
    pub child: Option<ChildKind>,
    /// For a VRF, its routing table.
    pub vrf_table: Option<u32>,
    /// The link's alias (`ip link set X alias Y`), empty when none.
    pub alias: String,
}

/// How a macvlan shares its parent device with its siblings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacvlanMode {
    /// Siblings reach each other directly.
    Bridge,
    /// Siblings cannot reach each other.
    Private,
    /// Traffic between siblings goes out to the switch and back.
    Vepa,
    /// The one macvlan takes the parent over.
    Passthru,
}

impl MacvlanMode {
    /// The mode named as the reference plugin names it (empty: bridge).
    pub fn parse(s: &str) -> Option<MacvlanMode> {
        match s {
            "" | "bridge" => Some(MacvlanMode::Bridge),
            "private" => Some(MacvlanMode::Private),
            "vepa" => Some(MacvlanMode::Vepa),
            "passthru" => Some(MacvlanMode::Passthru),
            _ => None,
        }
    }

    fn to_kernel(self) -> MacVlanMode {
        match self {
            MacvlanMode::Bridge => MacVlanMode::Bridge,
            MacvlanMode::Private => MacVlanMode::Private,
            MacvlanMode::Vepa => MacVlanMode::Vepa,
            MacvlanMode::Passthru => MacVlanMode::Passthrough,
        }
    }

    fn from_kernel(m: MacVlanMode) -> Option<MacvlanMode> {
        match m {
            MacVlanMode::Bridge => Some(MacvlanMode::Bridge),
            MacVlanMode::Private => Some(MacvlanMode::Private),
            MacVlanMode::Vepa => Some(MacvlanMode::Vepa),
            MacVlanMode::Passthrough => Some(MacvlanMode::Passthru),
            _ => None,
        }
    }
}

/// How an ipvlan tells its siblings' traffic apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpvlanMode {
    /// By address at layer 2: siblings share the parent's MAC and see broadcasts.
    L2,
    /// Routed at layer 3: no broadcasts or multicast.
    L3,
    /// As L3, with netfilter seeing the traffic in the parent's namespace.
    L3s,
}

impl IpvlanMode {
    /// The mode named as the reference plugin names it (empty: l2).
    pub fn parse(s: &str) -> Option<IpvlanMode> {
        match s {
            "" | "l2" => Some(IpvlanMode::L2),
            "l3" => Some(IpvlanMode::L3),
            "l3s" => Some(IpvlanMode::L3s),
            _ => None,
        }
    }

    fn to_kernel(self) -> IpVlanMode {
        match self {
            IpvlanMode::L2 => IpVlanMode::L2,
            IpvlanMode::L3 => IpVlanMode::L3,
            IpvlanMode::L3s => IpVlanMode::L3S,
        }
    }

    fn from_kernel(m: IpVlanMode) -> Option<IpvlanMode> {
        match m {
            IpVlanMode::L2 => Some(IpvlanMode::L2),
            IpVlanMode::L3 => Some(IpvlanMode::L3),
            IpVlanMode::L3S => Some(IpvlanMode::L3s),
            _ => None,
        }
    }
}

/// What a link made on a parent device is, and how it shares the parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildKind {
    /// A macvlan, with a MAC of its own.
    Macvlan(MacvlanMode),
    /// An ipvlan, with the parent's MAC.
    Ipvlan(IpvlanMode),
    /// An 802.1Q VLAN of this ID.
    Vlan(u16),
}

/// A macvlan, ipvlan or VLAN to create on a parent device.
#[derive(Debug, Clone)]
pub struct ChildSpec<'a> {
    /// Its name in the target namespace.
    pub name: &'a str,
    /// The parent device's index (in the namespace of the socket that creates it).
    pub parent: u32,
    /// What it is.
    pub kind: ChildKind,
    /// MTU; the parent's when none.
    pub mtu: Option<u32>,
    /// MAC, for a macvlan; a random one when none.
    pub mac: Option<&'a str>,
    /// Length of a macvlan's broadcast queue, when set.
    pub bcqueuelen: Option<u32>,
}

/// Formats a hardware address the way `ip link` and CNI results do.
pub fn format_mac(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff` into six bytes.
pub fn parse_mac(s: &str) -> Option<Vec<u8>> {
    let bytes: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16).ok().filter(|_| p.len() == 2))
        .collect::<Option<_>>()?;
    (bytes.len() == 6).then_some(bytes)
}

fn mac_bytes(mac: &str, link: &str) -> Result<Vec<u8>> {
    parse_mac(mac).ok_or_else(|| crate::Error::Netlink {
        op: format!("set the MAC of {link}: {mac} is not a MAC address"),
        source: std::io::Error::from_raw_os_error(libc::EINVAL),
    })
}

impl Link {
    fn from_message(m: LinkMessage) -> Link {
        let mut link = Link {
            index: m.header.index,
            name: String::new(),
            mac: String::new(),
            mtu: 0,
            master: None,
            peer_index: None,
            kind: LinkKind::Other(String::new()),
            child: None,
            vrf_table: None,
            alias: String::new(),
            up: m.header.flags.contains(LinkFlags::Up),
            promisc: m.header.flags.contains(LinkFlags::Promisc),
            allmulti: m.header.flags.contains(LinkFlags::Allmulti),
            txqlen: 0,
        };
        for attr in m.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n,
                LinkAttribute::IfAlias(a) => link.alias = a,
                LinkAttribute::Address(a) => link.mac = format_mac(&a),
                LinkAttribute::Mtu(v) => link.mtu = v,
                LinkAttribute::TxQueueLen(v) => link.txqlen = v,
                LinkAttribute::Controller(v) => link.master = Some(v),
                LinkAttribute::Link(v) => link.peer_index = Some(v),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        match &info {
                            LinkInfo::Data(InfoData::MacVlan(data)) => {
                                link.child = data.iter().find_map(|d| match d {
                                    InfoMacVlan::Mode(m) => {
                                        MacvlanMode::from_kernel(*m).map(ChildKind::Macvlan)
                                    }
                                    _ => None,
                                });
                            }
                            LinkInfo::Data(InfoData::IpVlan(data)) => {
                                link.child = data.iter().find_map(|d| match d {
                                    InfoIpVlan::Mode(m) => {
                                        IpvlanMode::from_kernel(*m).map(ChildKind::Ipvlan)
                                    }
                                    _ => None,
                                });
                            }
                            LinkInfo::Data(InfoData::Vlan(data)) => {
                                link.child = data.iter().find_map(|d| match d {
                                    InfoVlan::Id(id) => Some(ChildKind::Vlan(*id)),
                                    _ => None,
                                });
                            }
                            LinkInfo::Data(InfoData::Vrf(data)) => {
                                link.vrf_table = data.iter().find_map(|d| match d {
                                    InfoVrf::TableId(t) => Some(*t),
                                    _ => None,
                                });
                            }
                            _ => {}
                        }
                        if let LinkInfo::Kind(k) = info {
                            link.kind = match k {
                                InfoKind::Bridge => LinkKind::Bridge,
                                InfoKind::Veth => LinkKind::Veth,
                                InfoKind::Vlan => LinkKind::Vlan,
                                InfoKind::Vxlan => LinkKind::Vxlan,
                                InfoKind::MacVlan => LinkKind::Macvlan,
                                InfoKind::IpVlan => LinkKind::Ipvlan,
                                InfoKind::Dummy => LinkKind::Dummy,
                                InfoKind::Vrf => LinkKind::Vrf,
                                other => LinkKind::Other(other.to_string()),
                            };
                        }
                    }
                }
                _ => {}
            }
        }
        link
    }
}

/// A request for a new link named `name`, administratively up, with an optional MTU.
pub(crate) fn new_up_link(name: &str, mtu: Option<u32>) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.header.flags = LinkFlags::Up;
    m.header.change_mask = LinkFlags::Up;
    m.attributes.push(LinkAttribute::IfName(name.to_string()));
    if let Some(mtu) = mtu {
        m.attributes.push(LinkAttribute::Mtu(mtu));
    }
    m
}

fn single_queue() -> [LinkAttribute; 2] {
    [LinkAttribute::NumTxQueues(1), LinkAttribute::NumRxQueues(1)]
}

fn change(index: u32) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.header.index = index;
    m
}

impl Netlink {
    fn get_link(&mut self, m: LinkMessage, what: &str) -> Result<Option<Link>> {
        match self.request(RouteNetlinkMessage::GetLink(m), 0) {
            Ok(mut replies) => Ok(replies.pop().and_then(|r| match r {
                RouteNetlinkMessage::NewLink(m) => Some(Link::from_message(m)),
                _ => None,
            })),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(netlink_err(format!("look up link {what}"))(e)),
        }
    }

    /// The link with this name, if there is one.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.get_link(m, name)
    }

    /// The link with this index, if there is one.
    pub fn link_by_index(&mut self, index: u32) -> Result<Option<Link>> {
        self.get_link(change(index), &format!("#{index}"))
    }

    /// Every link in the namespace.
    pub fn links(&mut self) -> Result<Vec<Link>> {
        let replies = self
            .request(
                RouteNetlinkMessage::GetLink(LinkMessage::default()),
                NLM_F_DUMP,
            )
            .map_err(netlink_err("list links"))?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewLink(m) => Some(Link::from_message(m)),
                _ => None,
            })
            .collect())
    }

    fn change_link(&mut self, m: LinkMessage, op: String) -> Result<()> {
        self.request(RouteNetlinkMessage::NewLink(m), NLM_F_ACK)
            .map(drop)
            .map_err(netlink_err(op))
    }

    /// Creates link `m` (asked up), with the host's IPv6 on it turned off before it
    /// comes up unless `ipv6`: see [`crate::sysctl::set_ipv6`], which reaches the calling
    /// thread's namespace, so this socket must be that namespace's.
    pub(crate) fn create_link(&mut self, mut m: LinkMessage, ipv6: bool, op: &str) -> Result<()> {
        let name = m.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        });
        let name = name.expect("a link to create is named");
        if !ipv6 {
            m.header.flags = LinkFlags::empty();
        }
        self.request(
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(op.to_string()))?;
        if ipv6 {
            return Ok(());
        }
        let up = crate::sysctl::set_ipv6(&name, false)
            .and_then(|()| self.change_link(new_up_link(&name, None), format!("set {name} up")));
        if let Err(e) = up {
            // Nothing half-made stays: a later attempt creates it whole.
            if let Ok(Some(link)) = self.link_by_name(&name) {
                let _ = self.delete_link(&link);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Creates a bridge, up; fails with EEXIST when the name is taken. With `mac` the
    /// bridge's MAC is fixed from birth: the kernel then never replaces it with the
    /// lowest MAC among its ports, which changes as ports come and go. Without `ipv6`
    /// the host's IPv6 is off on it from the start ([`crate::sysctl::set_ipv6`]; this
    /// socket must be the calling thread's namespace's).
    pub fn add_bridge(
        &mut self,
        name: &str,
        mtu: Option<u32>,
        vlan_filtering: bool,
        mac: Option<&str>,
        ipv6: bool,
    ) -> Result<()> {
        let mut m = new_up_link(name, mtu);
        if let Some(mac) = mac {
            m.attributes
                .push(LinkAttribute::Address(mac_bytes(mac, name)?));
        }
        let mut info = vec![LinkInfo::Kind(InfoKind::Bridge)];
        if vlan_filtering {
            info.push(LinkInfo::Data(InfoData::Bridge(vec![
                InfoBridge::VlanFiltering(true),
            ])));
        }
        m.attributes.push(LinkAttribute::LinkInfo(info));
        self.create_link(m, ipv6, &format!("create bridge {name}"))
    }

    /// Makes the bridge hand (`on`) or not hand its IPv4 and IPv6 frames to the IP
    /// layer's netfilter hooks, whatever the namespace's `bridge-nf-call-iptables` says
    /// (which, when on, the bridge cannot turn off: the kernel takes either). Without
    /// br_netfilter loaded the setting is kept but nothing calls the hooks.
    pub fn set_bridge_hooks(&mut self, bridge: &Link, on: bool) -> Result<()> {
        let mut m = change(bridge.index);
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Bridge),
            LinkInfo::Data(InfoData::Bridge(vec![
                InfoBridge::NfCallIpTables(on),
                InfoBridge::NfCallIp6Tables(on),
            ])),
        ]));
        self.change_link(m, format!("set netfilter hooks on bridge {}", bridge.name))
    }

    /// Turns VLAN filtering on for an existing bridge.
    pub fn set_vlan_filtering(&mut self, bridge: &Link) -> Result<()> {
        let mut m = change(bridge.index);
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Bridge),
            LinkInfo::Data(InfoData::Bridge(vec![InfoBridge::VlanFiltering(true)])),
        ]));
        self.change_link(m, format!("enable vlan filtering on {}", bridge.name))
    }

    /// Creates a veth pair in one request: `name` here, up and attached to `master`;
    /// `peer_name` directly inside `peer_ns`, down, with `peer_mac` when given. Either
    /// both ends exist or neither. Returns the new host end as the kernel echoes it
    /// (index, MAC, the peer's index), or None from kernels that do not echo.
    pub fn add_veth(
        &mut self,
        name: &str,
        master: Option<u32>,
        peer_name: &str,
        peer_ns: &Netns,
        mtu: Option<u32>,
        peer_mac: Option<&str>,
    ) -> Result<Option<Link>> {
        // The peer cannot be set up in this request: the kernel opens it before the two
        // ends are joined and refuses (ENOTCONN). The caller brings it up afterwards.
        let mut peer = LinkMessage::default();
        peer.attributes
            .push(LinkAttribute::IfName(peer_name.to_string()));
        // Unasked, the kernel gives each end a queue per CPU and then cuts the active ones
        // to one, waiting out an RCU grace period per end; asking for one skips both waits.
        peer.attributes.extend(single_queue());
        peer.attributes.push(LinkAttribute::NetNsFd(peer_ns.fd()));
        if let Some(mac) = peer_mac {
            peer.attributes
                .push(LinkAttribute::Address(mac_bytes(mac, peer_name)?));
        }
        let mut m = new_up_link(name, mtu);
        m.attributes.extend(single_queue());
        if let Some(mtu) = mtu {
            peer.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(master) = master {
            m.attributes.push(LinkAttribute::Controller(master));
        }
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
        ]));
        let replies = self
            .request(
                RouteNetlinkMessage::NewLink(m),
                NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK | NLM_F_ECHO,
            )
            .map_err(netlink_err(format!(
                "create veth {name} with peer {peer_name}"
            )))?;
        Ok(replies.into_iter().find_map(|r| match r {
            RouteNetlinkMessage::NewLink(m) => Some(Link::from_message(m)),
            _ => None,
        }))
    }

    /// Creates a macvlan, ipvlan or VLAN on `spec.parent`, down, directly in `netns` when
    /// given (the parent stays where it is), else next to its parent.
    pub fn add_child(&mut self, spec: &ChildSpec, netns: Option<&Netns>) -> Result<()> {
        let mut m = LinkMessage::default();
        m.attributes
            .push(LinkAttribute::IfName(spec.name.to_string()));
        m.attributes.push(LinkAttribute::Link(spec.parent));
        if let Some(mtu) = spec.mtu {
            m.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(mac) = spec.mac {
            m.attributes
                .push(LinkAttribute::Address(mac_bytes(mac, spec.name)?));
        }
        if let Some(ns) = netns {
            m.attributes.push(LinkAttribute::NetNsFd(ns.fd()));
        }
        let (kind, data, what) = match spec.kind {
            ChildKind::Macvlan(mode) => {
                let mut data = vec![InfoMacVlan::Mode(mode.to_kernel())];
                if let Some(len) = spec.bcqueuelen {
                    data.push(InfoMacVlan::BcQueueLen(len));
                }
                (InfoKind::MacVlan, InfoData::MacVlan(data), "macvlan")
            }
            ChildKind::Ipvlan(mode) => (
                InfoKind::IpVlan,
                InfoData::IpVlan(vec![InfoIpVlan::Mode(mode.to_kernel())]),
                "ipvlan",
            ),
            ChildKind::Vlan(id) => (
                InfoKind::Vlan,
                InfoData::Vlan(vec![InfoVlan::Id(id)]),
                "vlan",
            ),
        };
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(kind),
            LinkInfo::Data(data),
        ]));
        self.request(
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(format!("create {what} {}", spec.name)))
    }

    /// Creates a dummy device, down, directly in `netns` when given.
    pub fn add_dummy(&mut self, name: &str, mtu: Option<u32>, netns: Option<&Netns>) -> Result<()> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        if let Some(mtu) = mtu {
            m.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(ns) = netns {
            m.attributes.push(LinkAttribute::NetNsFd(ns.fd()));
        }
        m.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Dummy,
            )]));
        self.request(
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(format!("create dummy {name}")))
    }

    /// Creates a VRF device bound to routing table `table`, up.
    pub fn add_vrf(&mut self, name: &str, table: u32) -> Result<()> {
        let mut m = new_up_link(name, None);
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Vrf),
            LinkInfo::Data(InfoData::Vrf(vec![InfoVrf::TableId(table)])),
        ]));
        self.request(
            RouteNetlinkMessage::NewLink(m),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(format!("create vrf {name} (table {table})")))
    }

    /// Makes `master` (a bridge or VRF) the master of `link`, or frees it with `None`.
    pub fn set_master(&mut self, link: &Link, master: Option<&Link>) -> Result<()> {
        let mut m = change(link.index);
        m.attributes
            .push(LinkAttribute::Controller(master.map_or(0, |l| l.index)));
        let what = match master {
            Some(l) => format!("put {} into {}", link.name, l.name),
            None => format!("free {} from its master", link.name),
        };
        self.change_link(m, what)
    }

    /// Moves `link` into `netns` as `name`, with `alias`, up or down, in one request: the
    /// name is only looked up in `netns`, so a link of that name here is no conflict.
    pub fn move_link(
        &mut self,
        link: &Link,
        netns: &Netns,
        name: &str,
        alias: &str,
        up: bool,
    ) -> Result<()> {
        let mut m = change(link.index);
        m.header.change_mask = LinkFlags::Up;
        if up {
            m.header.flags = LinkFlags::Up;
        }
        m.attributes.push(LinkAttribute::NetNsFd(netns.fd()));
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        m.attributes.push(LinkAttribute::IfAlias(alias.to_string()));
        self.change_link(
            m,
            format!("move {} to {} as {name}", link.name, netns.path().display()),
        )
    }

    /// Gives a link no IPv6 link-local address (`addrgenmode none`): set before its carrier
    /// comes up, the kernel never makes one, so a bridge port does no duplicate-address
    /// detection or MLD (flooded to every port, the growth of an ADD with the bridge's
    /// size). The kernel refuses it at creation. Without IPv6 there is nothing to do.
    pub fn set_no_link_local(&mut self, link: &Link) -> Result<()> {
        let mut m = change(link.index);
        m.attributes
            .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(
                vec![AfSpecInet6::AddrGenMode(In6AddrGenMode::None)],
            )]));
        match self.change_link(m, format!("turn off IPv6 link-local on {}", link.name)) {
            Err(e) if e.errno() == Some(libc::EAFNOSUPPORT) => Ok(()),
            r => r,
        }
    }

    /// Sets a link's alias (`ip link set X alias Y`); the kernel takes none at creation.
    pub fn set_alias(&mut self, link: &Link, alias: &str) -> Result<()> {
        let mut m = change(link.index);
        m.attributes.push(LinkAttribute::IfAlias(alias.to_string()));
        self.change_link(m, format!("set the alias of {} to {alias}", link.name))
    }

    /// Puts a link in interface group `group` (nftables' `iifgroup`, `oifgroup`).
    pub fn set_group(&mut self, link: &Link, group: u32) -> Result<()> {
        let mut m = change(link.index);
        m.attributes.push(LinkAttribute::Group(group));
        self.change_link(m, format!("put {} in group {group}", link.name))
    }

    /// Sets a link's MAC. The kernel marks the address as chosen, so a bridge keeps it
    /// whatever ports join or leave.
    pub fn set_mac(&mut self, link: &Link, mac: &str) -> Result<()> {
        let mut m = change(link.index);
        m.attributes
            .push(LinkAttribute::Address(mac_bytes(mac, &link.name)?));
        self.change_link(m, format!("set the MAC of {} to {mac}", link.name))
    }

    /// The links attached to a bridge (the kernel filters the dump).
    pub fn bridge_ports(&mut self, bridge: &Link) -> Result<Vec<Link>> {
        let mut q = LinkMessage::default();
        q.attributes.push(LinkAttribute::Controller(bridge.index));
        // Counters are most of each port's answer and nobody here reads them.
        q.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        let replies = self
            .request(RouteNetlinkMessage::GetLink(q), NLM_F_DUMP)
            .map_err(netlink_err(format!("list the ports of {}", bridge.name)))?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewLink(m) => Some(Link::from_message(m)),
                _ => None,
            })
            .filter(|l| l.master == Some(bridge.index))
            .collect())
    }

    /// Sets a link administratively up.
    pub fn set_up(&mut self, link: &Link) -> Result<()> {
        let mut m = change(link.index);
        m.header.flags = LinkFlags::Up;
        m.header.change_mask = LinkFlags::Up;
        self.change_link(m, format!("set {} up", link.name))
    }

    /// Sets a link administratively down.
    pub fn set_down(&mut self, link: &Link) -> Result<()> {
        let mut m = change(link.index);
        m.header.change_mask = LinkFlags::Up;
        self.change_link(m, format!("set {} down", link.name))
    }

    /// Turns promiscuous mode on or off.
    pub fn set_promisc(&mut self, link: &Link, on: bool) -> Result<()> {
        self.set_flag(link, LinkFlags::Promisc, on, "promiscuous mode")
    }

    /// Turns all-multicast reception on or off.
    pub fn set_allmulti(&mut self, link: &Link, on: bool) -> Result<()> {
        self.set_flag(link, LinkFlags::Allmulti, on, "all-multicast mode")
    }

    fn set_flag(&mut self, link: &Link, flag: LinkFlags, on: bool, what: &str) -> Result<()> {
        let mut m = change(link.index);
        if on {
            m.header.flags = flag;
        }
        m.header.change_mask = flag;
        let state = if on { "on" } else { "off" };
        self.change_link(m, format!("turn {what} {state} on {}", link.name))
    }

    /// Sets a link's MTU.
    pub fn set_mtu(&mut self, link: &Link, mtu: u32) -> Result<()> {
        let mut m = change(link.index);
        m.attributes.push(LinkAttribute::Mtu(mtu));
        self.change_link(m, format!("set the MTU of {} to {mtu}", link.name))
    }

    /// Sets a link's transmit queue length.
    pub fn set_txqlen(&mut self, link: &Link, len: u32) -> Result<()> {
        let mut m = change(link.index);
        m.attributes.push(LinkAttribute::TxQueueLen(len));
        self.change_link(
            m,
            format!("set the transmit queue length of {} to {len}", link.name),
        )
    }

    /// Lets frames leave a bridge port on the port they came in (hairpin).
    pub fn set_hairpin(&mut self, port: &Link, on: bool) -> Result<()> {
        let mut m = change(port.index);
        m.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::PortKind(InfoPortKind::Bridge),
            LinkInfo::PortData(InfoPortData::BridgePort(vec![InfoBridgePort::HairpinMode(
                on,
            )])),
        ]));
        self.change_link(m, format!("set hairpin mode on {}", port.name))
    }

    /// Makes `vid` the port's untagged PVID and, unless `keep_default`, drops VLAN 1.
    /// With `on_bridge` the VLAN is added to the bridge device itself.
    pub fn set_port_vlan(
        &mut self,
        port: &Link,
        vid: u16,
        keep_default: bool,
        on_bridge: bool,
    ) -> Result<()> {
        if !keep_default && !on_bridge {
            self.bridge_vlan(port, 1, BridgeVlanInfoFlags::empty(), false)?;
        }
        let mut flags = BridgeVlanInfoFlags::Pvid | BridgeVlanInfoFlags::Untagged;
        if on_bridge {
            flags = BridgeVlanInfoFlags::empty();
        }
        self.bridge_vlan(port, vid, flags, true)
    }

    fn bridge_vlan(
        &mut self,
        link: &Link,
        vid: u16,
        flags: BridgeVlanInfoFlags,
        add: bool,
    ) -> Result<()> {
        let mut m = change(link.index);
        m.header.interface_family = AddressFamily::Bridge;
        let mut spec = Vec::new();
        if link.kind == LinkKind::Bridge {
            spec.push(AfSpecBridge::Flags(
                netlink_packet_route::link::BridgeFlag::LowerDev,
            ));
        }
        spec.push(AfSpecBridge::VlanInfo(BridgeVlanInfo { flags, vid }));
        m.attributes.push(LinkAttribute::AfSpecBridge(spec));
        let (msg, verb) = if add {
            (RouteNetlinkMessage::SetLink(m), "add")
        } else {
            (RouteNetlinkMessage::DelLink(m), "remove")
        };
        self.request(msg, NLM_F_ACK)
            .map(drop)
            .map_err(netlink_err(format!("{verb} vlan {vid} on {}", link.name)))
    }

    /// Deletes a link; one that is already gone is fine.
    pub fn delete_link(&mut self, link: &Link) -> Result<()> {
        match self.request(RouteNetlinkMessage::DelLink(change(link.index)), NLM_F_ACK) {
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(()),
            r => r
                .map(drop)
                .map_err(netlink_err(format!("delete link {}", link.name))),
        }
    }
}
