//! Makes the kernel match a plan, through corvid-net only: the same binding functions
//! the bridge plugin uses, plus the overlay's vxlan device, FDB and neighbour entries.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use corvid_net::announce::Announcer;
use corvid_net::binding::{
    ensure_bridge, ensure_gateway, ensure_plugged, BridgeSpec, Plugged, VethSpec,
};
use corvid_net::conntrack::TcpTimeouts;
use corvid_net::link::{Link, LinkKind};
use corvid_net::nftables::masquerade;
use corvid_net::nftables::routing::Routing;
use corvid_net::nftables::security_groups::{Report, SecurityGroups, Touched, Want};
use corvid_net::nftables::services::{Services, SyncReport};
use corvid_net::overlay::{NeighbourEntry, OverlayEntries, VxlanSpec};
use corvid_net::route::RouteSpec;
use corvid_net::router_advert::{Advertisement, Advertiser};
use corvid_net::{sysctl, Error, Netlink, Netns, Result};
use ipnet::IpNet;

use crate::plan::{ExtraRoute, NetworkPlan, PortPlan, RemotePort};
use crate::services::ServicePlan;
use corvid_net::names::{self, BRIDGE_PREFIX, VETH_PREFIX, VXLAN_PREFIX};

/// This host's datapath: a netlink socket, what masquerade rules were last written, and
/// the services' table with what it holds.
pub struct Datapath {
    nl: Netlink,
    /// The controller's cluster ID: devices are marked with it, and only devices marked
    /// with it (or with no mark, from an older corvid) are this agent's to remove.
    cluster: String,
    local: IpAddr,
    /// This host's own addresses, one per family, that what it sends into a bridge
    /// leaves from: the underlay address and, on the same device, one of the other family.
    host_addresses: Vec<IpAddr>,
    /// The largest MTU a pod's frame may have and still cross the underlay once
    /// encapsulated; a network's own MTU above it is lowered to it on this host.
    max_mtu: u32,
    masquerade: Option<BTreeMap<String, Vec<IpNet>>>,
    services: Option<Services>,
    /// Which bridges may forward to which, opened at the first sync.
    routing: Option<Routing>,
    /// The routers' extra routes as last made; none before the first sync.
    extra_routes: Option<BTreeSet<ExtraRoute>>,
    /// The interface floating IPs are answered on, and the ones it was given.
    public: Option<(String, BTreeSet<IpAddr>)>,
    /// Set when the services' table opens.
    conntrack: TcpTimeouts,
    /// The security groups' filter: opened at the first sync when the agent filters,
    /// and `Removed` once a filter an earlier agent left is gone when it does not.
    security: SecurityState,
    /// Tells local ports where a remote port's address now is; none when no packet
    /// socket could be opened (announcing is best effort).
    announcer: Option<Announcer>,
    /// Direct routing's routes, and where they go when it is on.
    direct: Direct,
    /// Sends the bridges' router advertisements; none when no ICMPv6 socket could be
    /// opened (advertising is best effort, as announcing is).
    advertiser: Option<Advertiser>,
    /// The bridge (by index) of each network that advertises.
    advertised: HashMap<String, u32>,
    /// Whether corvid's bridges hand their frames to netfilter's IP hooks.
    hooks: BridgeHooks,
}

/// Bridged frames pass the IP layer's netfilter hooks (br_netfilter) only on bridges
/// that need them: where a reply translated by a service, or a port's security groups,
/// must be seen by connection tracking. The agent sets it per bridge and leaves the
/// namespace's `bridge-nf-call-iptables` to the host (1 wherever br_netfilter is loaded,
/// unless set to 0): other bridges are not its to hook, and every hooked frame pays for
/// conntrack and corvid's chains.
#[derive(Default)]
struct BridgeHooks {
    /// What the bridges were last set to; none before the first sync.
    on: Option<bool>,
    /// Services are served here.
    services: bool,
    /// Security groups are filtered here; none until the agent has said (its first
    /// pass), so that what an earlier agent set is not undone and done again.
    security: Option<bool>,
    /// The bridges (by index: one made again is another) set on.
    set: BTreeSet<u32>,
}

/// Direct routing's state: remote ports on hosts of this host's underlay subnet are
/// routed to those hosts' underlay addresses, not encapsulated.
#[derive(Default)]
struct Direct {
    /// The subnet of the underlay address, when direct routing is on.
    segment: Option<IpNet>,
    /// The device holding it, which the routes leave through.
    device: u32,
    /// Whether a full pass has looked for routes an earlier agent left: with direct
    /// routing off, that one pass reads the routes.
    swept: bool,
    /// The direct routes (address, via) committed, by network.
    routes: HashMap<String, BTreeSet<(IpAddr, IpAddr)>>,
    /// Networks whose addresses changed since the routing filter last heard of them.
    changed: BTreeSet<String>,
    /// Networks whose last sync failed midway: their routes are all sent again.
    unsure: BTreeSet<String>,
    /// The kernel's direct routes, read at the start of a full pass.
    kernel: Option<BTreeSet<(IpAddr, IpAddr)>>,
}

/// The networks of `held` that `planned` does not have.
fn unplanned<V>(held: &HashMap<String, V>, planned: &BTreeMap<String, NetworkPlan>) -> Vec<String> {
    held.keys()
        .filter(|id| !planned.contains_key(*id))
        .cloned()
        .collect()
}

fn missing(what: String) -> Error {
    Error::Netlink {
        op: what,
        source: std::io::Error::from_raw_os_error(libc::ENODEV),
    }
}

/// The security groups' filter as this agent found or made it.
enum SecurityState {
    /// Not looked at yet.
    Unknown,
    /// Filtering, with what was committed.
    Filtering(SecurityGroups),
    /// Not filtering, and no filter left behind.
    Removed,
}

/// What a network's existing vxlan device holds, as [`Datapath::sync_network`] is told.
pub enum Held<'a> {
    /// Not known: the kernel is asked.
    Unknown,
    /// What the network's previous plan put there (a change pass; drift by hand waits
    /// for the next full pass).
    Planned(&'a NetworkPlan),
    /// Taken from one dump of every device (a full pass).
    Dumped(&'a mut OverlayEntries),
}

/// What the agent takes from the device holding the underlay address: its MTU, and its
/// global address of the other family, if any.
#[derive(Default)]
struct Underlay {
    mtu: Option<u32>,
    other_family: Option<IpAddr>,
    /// The device and the underlay address's subnet.
    segment: Option<(u32, IpNet)>,
}

/// The device holding the underlay address, as [`Underlay`] says; nothing when no
/// device holds it (the agent then trusts the networks' MTUs).
fn underlay(nl: &mut Netlink, local: IpAddr) -> Result<Underlay> {
    let addresses = nl.addresses(None)?;
    let Some(&(index, net)) = addresses.iter().find(|(_, a)| a.addr() == local) else {
        tracing::warn!("no device holds the underlay address {local}: networks' MTUs are not checked against it");
        return Ok(Underlay::default());
    };
    let other_family = addresses
        .iter()
        .filter(|(i, a)| *i == index && a.addr().is_ipv4() != local.is_ipv4())
        .map(|(_, a)| a.addr())
        .find(|a| match a {
            IpAddr::V4(v4) => !v4.is_link_local() && !v4.is_loopback(),
            IpAddr::V6(v6) => !v6.is_unicast_link_local() && !v6.is_loopback(),
        });
    Ok(Underlay {
        mtu: nl.link_by_index(index)?.map(|l| l.mtu),
        other_family,
        segment: Some((index, net.trunc())),
    })
}

impl Datapath {
    /// The MTU a network's devices get on this host: its own, unless the underlay
    /// cannot carry that much once encapsulated (an IPv6 underlay's headers are 20 bytes
    /// longer than the 50 the controller's default allows for).
    pub fn mtu(&self, network_mtu: u32) -> u32 {
        network_mtu.min(self.max_mtu)
    }

    /// Opens the datapath of the calling thread's namespace; `local` is the underlay
    /// address, and with `direct_routing` hosts on its subnet are routed to directly.
    pub fn open(
        local: IpAddr,
        public_interface: Option<String>,
        conntrack: TcpTimeouts,
        direct_routing: bool,
    ) -> Result<Datapath> {
        let mut nl = Netlink::open()?;
        let underlay = underlay(&mut nl, local)?;
        let direct = match (direct_routing, underlay.segment) {
            (false, _) => Direct::default(),
            (true, None) => {
                tracing::warn!(
                    "direct routing is off: no device holds the underlay address {local}"
                );
                Direct::default()
            }
            (true, Some((device, segment))) => Direct {
                segment: Some(segment),
                device,
                ..Direct::default()
            },
        };
        let max_mtu = underlay.mtu.map_or(u32::MAX, |m| {
            corvid_net::overlay::encapsulated_mtu(local, m)
        });
        Ok(Datapath {
            cluster: String::new(),
            nl,
            local,
            host_addresses: std::iter::once(local)
                .chain(underlay.other_family)
                .collect(),
            max_mtu,
            masquerade: None,
            services: None,
            routing: None,
            extra_routes: None,
            public: public_interface.map(|i| (i, BTreeSet::new())),
            conntrack,
            security: SecurityState::Unknown,
            announcer: Announcer::open()
                .inspect_err(|e| tracing::warn!("remote ports will not be announced: {e}"))
                .ok(),
            direct,
            advertiser: Advertiser::open()
                .inspect_err(|e| tracing::warn!("no router advertisements will be sent: {e}"))
                .ok(),
            advertised: HashMap::new(),
            hooks: BridgeHooks::default(),
        })
    }

    /// The underlay's subnet, whose hosts are routed to directly; none without direct
    /// routing.
    pub fn segment(&self) -> Option<IpNet> {
        self.direct.segment
    }

    /// Reads the kernel's direct routes once for the full pass about to sync every
    /// network.
    pub fn begin_full_pass(&mut self) -> Result<()> {
        let d = &mut self.direct;
        if d.segment.is_none() && d.swept {
            return Ok(());
        }
        let held = self
            .nl
            .routes()?
            .into_iter()
            .filter(|r| r.protocol == Some(names::DIRECT_ROUTE_PROTOCOL))
            .filter_map(|r| Some((r.dst.addr(), r.gw?)))
            .collect();
        d.kernel = Some(held);
        Ok(())
    }

    /// Ends a full pass over the networks of `planned`: the router advertisements and
    /// direct routes of no network planned (an earlier agent's, or one that failed) go.
    pub fn end_full_pass(&mut self, planned: &BTreeMap<String, NetworkPlan>) -> Result<()> {
        // A pass removes the bridges of networks no longer planned without taking each
        // down, so their advertisements would go on to a dead (or reused) index.
        for id in unplanned(&self.advertised, planned) {
            self.advertise(&id, None);
        }
        let d = &mut self.direct;
        let Some(kernel) = d.kernel.take() else {
            return Ok(());
        };
        for id in unplanned(&d.routes, planned) {
            d.routes.remove(&id);
            d.changed.insert(id);
        }
        let wanted: BTreeSet<&(IpAddr, IpAddr)> = d.routes.values().flatten().collect();
        let device = d.device;
        for r in kernel.iter().filter(|r| !wanted.contains(r)) {
            self.nl.delete_route(&direct_route(*r, device))?;
        }
        self.direct.swept = true;
        Ok(())
    }

    /// Takes away network `id`'s direct routes and router advertisements: it has no
    /// datapath here any more.
    pub fn forget_network(&mut self, id: &str) -> Result<()> {
        self.advertise(id, None);
        self.sync_direct(id, BTreeSet::new())
    }

    /// Makes network `id`'s bridge advertise `ad` (with this host's MTU), or nothing.
    fn advertise(&mut self, id: &str, ad: Option<(&Link, &Advertisement)>) {
        let Some(advertiser) = &self.advertiser else {
            return;
        };
        let index = ad.map(|(bridge, _)| bridge.index);
        match self.advertised.remove(id) {
            Some(old) if Some(old) != index => advertiser.set(old, [0; 6], None),
            _ => {}
        }
        let Some((bridge, ad)) = ad else {
            return;
        };
        let mac =
            corvid_net::link::parse_mac(&bridge.mac).and_then(|m| <[u8; 6]>::try_from(m).ok());
        let Some(mac) = mac else {
            advertiser.set(bridge.index, [0; 6], None);
            tracing::warn!(bridge = %bridge.name, mac = %bridge.mac, "no router advertisements: the bridge's MAC is unreadable");
            return;
        };
        let ad = Advertisement {
            mtu: ad.mtu.map(|m| self.mtu(m)),
            ..ad.clone()
        };
        advertiser.set(bridge.index, mac, Some(&ad));
        self.advertised.insert(id.to_string(), bridge.index);
    }

    /// Makes network `id`'s direct routes `want`, against what was committed (and, in
    /// a full pass, what the kernel holds).
    fn sync_direct(&mut self, id: &str, want: BTreeSet<(IpAddr, IpAddr)>) -> Result<()> {
        let d = &mut self.direct;
        let had = d.routes.remove(id).unwrap_or_default();
        if had.is_empty() && want.is_empty() {
            return Ok(());
        }
        let unsure = d.unsure.remove(id);
        let device = d.device;
        let mut send = || -> Result<()> {
            for r in had.difference(&want) {
                // An address moved to another host keeps its route, replaced below.
                if !want.iter().any(|w| w.0 == r.0) {
                    self.nl.delete_route(&direct_route(*r, device))?;
                }
            }
            for r in &want {
                let held = match &self.direct.kernel {
                    _ if unsure => false,
                    Some(kernel) => kernel.contains(r),
                    None => had.contains(r),
                };
                if !held {
                    self.nl.replace_route(&direct_route(*r, device))?;
                }
            }
            Ok(())
        };
        let sent = send();
        let d = &mut self.direct;
        if had != want || sent.is_err() {
            d.changed.insert(id.to_string());
        }
        // Failed midway, the kernel holds some of both: the next sync removes what is
        // not wanted then and sends every route it wants.
        let held: BTreeSet<_> = match sent {
            Ok(()) => want,
            Err(_) => {
                d.unsure.insert(id.to_string());
                had.union(&want).copied().collect()
            }
        };
        if !held.is_empty() {
            d.routes.insert(id.to_string(), held);
        }
        sent
    }

    /// Announces remote neighbour entries just added into the bridge `bridge`, so that
    /// a local port that knew one of the addresses under an older MAC (a deleted port's,
    /// whose address went to a new one) follows at once.
    fn announce<'a>(
        &self,
        bridge: Option<u32>,
        added: impl IntoIterator<Item = &'a NeighbourEntry>,
    ) {
        let (Some(announcer), Some(bridge)) = (&self.announcer, bridge) else {
            return;
        };
        for e in added {
            let sent = match e.ip {
                IpAddr::V4(ip) => announcer.gratuitous_arp(bridge, &e.mac, ip),
                IpAddr::V6(ip) => announcer.unsolicited_na(bridge, &e.mac, ip),
            };
            if let Err(e) = sent {
                tracing::debug!("{e}");
            }
        }
    }

    /// Makes the services' table serve `plan`, sending only what changed since the last
    /// call (the first one rebuilds what an earlier agent left), and gives the public
    /// interface the floating IPs so that this host answers ARP for them.
    /// With `changed`, only those services are looked at (and the floating IPs, which
    /// the caller leaves unchanged, are not).
    pub fn sync_services(
        &mut self,
        plan: &ServicePlan,
        changed: Option<&BTreeSet<String>>,
    ) -> Result<SyncReport> {
        // A pod reaching a VIP through its host may get the answer over its bridge (the
        // member on its network): only with bridged traffic in conntrack is it translated
        // back. Floating IPs and node ports are masqueraded, so their answers are routed.
        self.hooks.services = !plan.services.is_empty();
        if let Err(e) = self.sync_bridge_hooks() {
            tracing::error!("bridges' netfilter hooks: {e}");
        }
        if self.services.is_none() {
            let public = self.public.as_ref().map(|(i, _)| i.clone());
            self.services = Some(Services::open(public, self.host_addresses.clone())?);
            if let Err(e) = self.conntrack.apply() {
                tracing::warn!("conntrack's TCP timeouts: {e}");
            }
        }
        let services = self.services.as_mut().expect("opened above");
        let synced = match changed {
            Some(ids) => services.sync_changed(&plan.services, ids, &plan.floating),
            None => services.sync(&plan.services, &plan.floating),
        };
        let report = match synced {
            Ok(r) => r,
            Err(e) => {
                services.reset();
                return Err(e);
            }
        };
        if changed.is_some() {
            return Ok(report);
        }
        if let Err(e) = services.sync_router_snat(&plan.router_snat) {
            services.reset();
            return Err(e);
        }
        if let Some((name, given)) = &mut self.public {
            let link = self
                .nl
                .link_by_name(name)?
                .ok_or_else(|| missing(format!("find the public interface {name}")))?;
            let want = plan.public_addresses();
            for ip in given.difference(&want) {
                self.nl.delete_address(link.index, &IpNet::from(*ip))?;
            }
            for ip in want.difference(given) {
                match self.nl.add_address(link.index, &IpNet::from(*ip)) {
                    Err(e) if e.errno() == Some(libc::EEXIST) => {}
                    r => r?,
                }
            }
            *given = want;
        }
        Ok(report)
    }

    /// Makes the security groups' filter hold `want` when `enabled`, sending what
    /// changed (looking only at `touched` when given; and, when `full`, starting over if
    /// the tables lost what was committed);
    /// when not, removes the filter once (an earlier agent's). The report is none when
    /// nothing was synced.
    pub fn sync_security_groups(
        &mut self,
        want: &Want,
        touched: Option<&Touched>,
        enabled: bool,
        full: bool,
    ) -> Result<Option<Report>> {
        self.hooks.security = Some(enabled);
        // A port is reported filtered only once its bridge's frames reach the filter.
        self.sync_bridge_hooks()?;
        if !enabled {
            if matches!(self.security, SecurityState::Removed) {
                return Ok(None);
            }
            // Tried once: a kernel without the bridge family's tables has none to remove.
            self.security = SecurityState::Removed;
            return SecurityGroups::open()?.remove().map(|_| None);
        }
        if !matches!(self.security, SecurityState::Filtering(_)) {
            self.security = SecurityState::Filtering(SecurityGroups::open()?);
        }
        let SecurityState::Filtering(sg) = &mut self.security else {
            unreachable!("set above");
        };
        if full {
            sg.check()?;
        }
        sg.sync_touched(want, touched).map(Some)
    }

    /// Sets every bridge of the agent's as [`BridgeHooks`] now asks, when that changed
    /// (or at the first call, for what an earlier agent left); after a failure the next
    /// call tries again.
    fn sync_bridge_hooks(&mut self) -> Result<()> {
        let Some(security) = self.hooks.security else {
            return Ok(());
        };
        let on = self.hooks.services || security;
        if self.hooks.on == Some(on) {
            return Ok(());
        }
        self.set_bridge_hooks(on)
            .inspect_err(|_| self.hooks.on = None)
    }

    fn set_bridge_hooks(&mut self, on: bool) -> Result<()> {
        if on && sysctl::get("net/bridge/bridge-nf-call-iptables").is_err() {
            tracing::warn!("br_netfilter is not loaded: pods cannot reach services on their own bridge, and security groups do not hold on bridged traffic (IPv4 or IPv6)");
        }
        self.hooks.set.clear();
        let bridges: Vec<Link> = self
            .owned_links()?
            .into_values()
            .filter(|l| l.kind == LinkKind::Bridge)
            .collect();
        for bridge in bridges {
            match self.nl.set_bridge_hooks(&bridge, on) {
                // Removed since it was listed.
                Err(e) if e.errno() == Some(libc::ENODEV) => continue,
                r => r?,
            }
            if on {
                self.hooks.set.insert(bridge.index);
            }
        }
        self.hooks.on = Some(on);
        Ok(())
    }

    /// Sets the cluster whose devices this datapath makes and owns.
    pub fn set_cluster(&mut self, cluster: String) {
        self.cluster = cluster;
    }

    /// Whether `link` is one of the agent's: a bridge, vxlan device or port's host end
    /// marked with this cluster, or with no mark (made before the marks).
    pub fn owns(&self, link: &Link) -> bool {
        [BRIDGE_PREFIX, VXLAN_PREFIX, VETH_PREFIX]
            .iter()
            .any(|p| link.name.starts_with(p) && link.name.len() == 15)
            && names::marked_cluster(&link.alias).is_none_or(|c| c == self.cluster)
    }

    /// The links the agent owns (bridges, vxlan devices, host ends of ports) by name.
    pub fn owned_links(&mut self) -> Result<HashMap<String, Link>> {
        let links = self.nl.links()?;
        Ok(links
            .into_iter()
            .filter(|l| self.owns(l))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|l| (l.name.clone(), l))
            .collect())
    }

    /// Keeps corvid's bridges allowed through iptables' FORWARD while any is on this
    /// host.
    pub fn sync_forwarding(&mut self) -> Result<corvid_net::iptables::Change> {
        corvid_net::iptables::sync_bridges_allowance(&mut self.nl)
    }

    /// Deletes a link the agent owns (a veth's peer in its namespace goes with it).
    pub fn remove(&mut self, link: &Link) -> Result<()> {
        self.hooks.set.remove(&link.index);
        self.nl.delete_link(link)
    }

    /// Every device's overlay entries, from one dump of each table: a full pass hands
    /// them to each network's [`Datapath::sync_network`] instead of dumping per network.
    pub fn overlay_entries(&mut self) -> Result<OverlayEntries> {
        self.nl.overlay_entries()
    }

    /// Makes the network's bridge, vxlan device, gateways, FDB and neighbours match the
    /// plan, taking the vxlan device's entries to be what `held` says; returns the
    /// bridge and the vxlan device.
    pub fn sync_network(&mut self, n: &NetworkPlan, held: Held) -> Result<(Link, Link)> {
        let mark = names::owner_mark(&self.cluster, &n.id);
        let mtu = self.mtu(n.mtu);
        let bridge = ensure_bridge(
            &mut self.nl,
            &BridgeSpec {
                name: &n.bridge,
                mtu: Some(mtu),
                vlan_filtering: false,
                promisc: false,
                alias: Some(&mark),
                ipv6: Some(n.gateways.iter().any(|g| g.addr().is_ipv6())),
            },
        )?;
        if self.hooks.on == Some(true) && self.hooks.set.insert(bridge.index) {
            // The network's ports are still plugged; the next sync tries again.
            if let Err(e) = self.nl.set_bridge_hooks(&bridge, true) {
                tracing::error!("bridge's netfilter hooks: {e}");
                self.hooks.set.remove(&bridge.index);
            }
        }
        let mut fresh = false;
        let vxlan = match self.nl.link_by_name(&n.vxlan)? {
            Some(l) if l.kind == LinkKind::Vxlan => l,
            other => {
                fresh = true;
                if let Some(stale) = other {
                    self.nl.delete_link(&stale)?;
                }
                self.nl.add_vxlan(&VxlanSpec {
                    name: &n.vxlan,
                    vni: n.vni,
                    local: self.local,
                    master: bridge.index,
                    mtu: Some(mtu),
                })?;
                self.nl
                    .link_by_name(&n.vxlan)?
                    .ok_or_else(|| missing(format!("find vxlan {} after creating it", n.vxlan)))?
            }
        };
        let mut vxlan = vxlan;
        if n.gateways.iter().any(|g| g.addr().is_ipv6()) {
            sysctl::set_ipv6_neighbours_only(&n.vxlan)?;
        } else if !fresh {
            // Made by an older corvid with the kernel's default, or for a network that
            // has lost its IPv6 subnet.
            sysctl::set_ipv6(&n.vxlan, false)?;
        }
        corvid_net::binding::mark(&mut self.nl, &mut vxlan, Some(&mark))?;
        // Overlay entries before the gateway: its address brings the connected route, and
        // a packet routed into the bridge before its neighbour is known waits a second for
        // the next ARP try.
        let (want_fdb, want_neighbours) = (n.fdb(), n.neighbours(&bridge.mac));
        // A device just made holds nothing. Dumps walk the host's whole tables, so a
        // change pass goes by the plan it applied before.
        let (fdb, neighbours) = match held {
            _ if fresh => Default::default(),
            Held::Planned(old) => (old.fdb(), old.neighbours(&bridge.mac)),
            Held::Dumped(all) => all.take(vxlan.index),
            Held::Unknown => self.nl.overlay_entries()?.take(vxlan.index),
        };
        for e in fdb.difference(&want_fdb) {
            self.nl.delete_fdb(&vxlan, e)?;
        }
        for e in want_fdb.difference(&fdb) {
            self.nl.add_fdb(&vxlan, e)?;
        }
        for e in neighbours.difference(&want_neighbours) {
            self.nl.delete_neighbour(&vxlan, e)?;
        }
        for e in want_neighbours.difference(&neighbours) {
            self.nl.set_neighbour(&vxlan, e)?;
        }
        self.announce(Some(bridge.index), want_neighbours.difference(&neighbours));
        self.sync_direct(&n.id, n.direct_routes())?;
        for gw in &n.gateways {
            ensure_gateway(&mut self.nl, &bridge, *gw, true)?;
        }
        if n.gateways.iter().any(|g| g.addr().is_ipv4())
            && sysctl::get("net/ipv4/ip_forward")?.trim() != "1"
        {
            sysctl::set("net/ipv4/ip_forward", "1")?;
        }
        if n.gateways.iter().any(|g| g.addr().is_ipv6()) {
            for dev in sysctl::enable_ipv6_forwarding(names::PREFIX)? {
                tracing::info!(
                    device = %dev,
                    "IPv6 forwarding on: accept_ra set to 2 so the device keeps its router advertisements"
                );
            }
        }
        self.advertise(&n.id, n.advertisement.as_ref().map(|a| (&bridge, a)));
        Ok((bridge, vxlan))
    }

    /// One remote port moved: its overlay entries on `vxlan` (whose bridge has
    /// `bridge_mac`), `old` taken out (what `new` does not keep), `new` put in.
    pub fn move_remote(
        &mut self,
        (vxlan, bridge_mac): (&Link, &str),
        old: Option<&RemotePort>,
        new: Option<&RemotePort>,
    ) -> Result<()> {
        let fdb = |r: Option<&RemotePort>| r.and_then(|r| r.fdb().cloned());
        let neighbours = |r: Option<&RemotePort>| -> BTreeSet<NeighbourEntry> {
            r.map(|r| r.neighbours(bridge_mac).collect())
                .unwrap_or_default()
        };
        let (old_fdb, new_fdb) = (fdb(old), fdb(new));
        let (old_neighbours, new_neighbours) = (neighbours(old), neighbours(new));
        if let Some(f) = old_fdb.as_ref().filter(|f| new_fdb.as_ref() != Some(*f)) {
            self.nl.delete_fdb(vxlan, f)?;
        }
        for e in old_neighbours.difference(&new_neighbours) {
            // An address whose MAC changed is replaced, not deleted.
            if !new_neighbours.iter().any(|n| n.ip == e.ip) {
                self.nl.delete_neighbour(vxlan, e)?;
            }
        }
        if let Some(f) = new_fdb.as_ref().filter(|f| old_fdb.as_ref() != Some(*f)) {
            self.nl.add_fdb(vxlan, f)?;
        }
        for e in &new_neighbours {
            self.nl.set_neighbour(vxlan, e)?;
        }
        self.announce(vxlan.master, new_neighbours.difference(&old_neighbours));
        Ok(())
    }

    /// One remote port of network `net` moved: its direct routes, `old`'s taken out and
    /// `new`'s put in, whatever became of its overlay entries.
    pub fn move_direct(
        &mut self,
        net: &str,
        old: Option<&RemotePort>,
        new: Option<&RemotePort>,
    ) -> Result<()> {
        let routes = |r: Option<&RemotePort>| -> BTreeSet<(IpAddr, IpAddr)> {
            r.map(|r| r.direct_routes().collect()).unwrap_or_default()
        };
        let (old_routes, new_routes) = (routes(old), routes(new));
        if old_routes == new_routes {
            return Ok(());
        }
        let committed = self.direct.routes.get(net).cloned().unwrap_or_default();
        let want = committed
            .difference(&old_routes)
            .chain(&new_routes)
            .copied()
            .collect();
        self.sync_direct(net, want)
    }

    /// An owned link by name.
    pub fn link(&mut self, name: &str) -> Result<Option<Link>> {
        self.nl.link_by_name(name)
    }

    /// Makes a port plugged as its plan says: its veth pair on the bridge, and in its
    /// namespace the interface up with the port's MAC, addresses and routes. A pair left
    /// half-made (an agent killed mid-plug) or altered by hand is finished or made anew;
    /// nothing is left behind when a step fails.
    pub fn ensure_port(&mut self, bridge: &Link, mtu: u32, p: &PortPlan) -> Result<Plugged> {
        let ns = Netns::open(&p.netns)?;
        let mut container = Netlink::open_in(&ns)?;
        ensure_plugged(
            &mut self.nl,
            &mut container,
            &ns,
            bridge,
            &VethSpec {
                ifname: &p.ifname,
                mtu: Some(mtu),
                // A pod reaching a service through its VIP may be sent to itself.
                hairpin: true,
                vlan: None,
                keep_default_vlan: true,
                mac: Some(&p.mac),
                host_name: Some(&p.host_veth),
                alias: Some(&names::owner_mark(&self.cluster, &p.id)),
                kept: &p.kept,
            },
            &p.addrs,
            &p.routes,
        )
    }

    /// Lets the bridges of `plans` forward to each other as their routers say: those of
    /// the networks in `changed` alone, or all of them when `full` (which also writes
    /// the whole filter anew and puts every bridge in its group again) or when the
    /// filter was not made whole last time.
    pub fn sync_routing(
        &mut self,
        plans: &BTreeMap<String, NetworkPlan>,
        changed: &BTreeSet<String>,
        full: bool,
    ) -> Result<()> {
        if full || self.routing.is_none() {
            self.routing = Some(Routing::open()?);
        }
        let routing = self.routing.as_mut().expect("opened above");
        let direct_addresses = |id: &str, routes: &BTreeSet<(IpAddr, IpAddr)>| {
            (names::bridge(id), routes.iter().map(|r| r.0).collect())
        };
        if !routing.is_started() {
            let want = plans
                .values()
                .map(|n| (n.bridge.clone(), n.router.clone()))
                .collect();
            routing.sync(&mut self.nl, &want)?;
            let d = &mut self.direct;
            d.changed.clear();
            return routing.set_direct(d.routes.iter().map(|(id, r)| direct_addresses(id, r)));
        }
        let changes = changed.iter().map(|id| match plans.get(id) {
            Some(n) => (n.bridge.clone(), Some(n.router.clone())),
            None => (names::bridge(id), None),
        });
        routing.update(&mut self.nl, changes)?;
        let d = &mut self.direct;
        let empty = BTreeSet::new();
        let changed = std::mem::take(&mut d.changed);
        routing.set_direct(
            changed
                .iter()
                .map(|id| direct_addresses(id, d.routes.get(id).unwrap_or(&empty))),
        )
    }

    /// Whether direct routes changed since the routing filter last heard of them.
    pub fn direct_changed(&self) -> bool {
        !self.direct.changed.is_empty()
    }

    /// Whether the routing filter and the extra routes were last made whole: after a
    /// failure they are made again at the next reconcile, whatever it changes.
    pub fn routing_settled(&self) -> bool {
        self.routing.as_ref().is_some_and(Routing::is_started) && self.extra_routes.is_some()
    }

    /// Makes the routers' extra routes the kernel holds (marked with corvid's route
    /// protocol) exactly `want`; `full` looks at the kernel's again.
    pub fn sync_extra_routes(&mut self, want: &BTreeSet<ExtraRoute>, full: bool) -> Result<()> {
        if full {
            self.extra_routes = None;
        }
        if self.extra_routes.as_ref() == Some(want) {
            return Ok(());
        }
        let spec = |nl: &mut Netlink, r: &ExtraRoute| -> Result<Option<RouteSpec>> {
            let Some(bridge) = nl.link_by_name(&r.bridge)? else {
                return Ok(None);
            };
            let mut s = RouteSpec::new(r.destination, Some(r.nexthop), bridge.index);
            s.protocol = Some(names::ROUTE_PROTOCOL);
            Ok(Some(s))
        };
        match self.extra_routes.take() {
            Some(had) => {
                for r in had.difference(want) {
                    if let Some(s) = spec(&mut self.nl, r)? {
                        match self.nl.delete_route(&s) {
                            Err(e) if e.errno() == Some(libc::ESRCH) => {}
                            other => other?,
                        }
                    }
                }
            }
            None => {
                // A restart: what an earlier agent made and nobody wants any more goes.
                let wanted: BTreeSet<(IpNet, Option<IpAddr>)> = want
                    .iter()
                    .map(|r| (r.destination, Some(r.nexthop)))
                    .collect();
                for s in self.nl.routes()? {
                    let ours = s.protocol == Some(names::ROUTE_PROTOCOL)
                        && s.table.is_none_or(|t| t == libc::RT_TABLE_MAIN as u32);
                    if ours && !wanted.contains(&(s.dst, s.gw)) {
                        self.nl.delete_route(&s)?;
                    }
                }
            }
        }
        for r in want {
            if let Some(s) = spec(&mut self.nl, r)? {
                self.nl.replace_route(&s)?;
            }
        }
        self.extra_routes = Some(want.clone());
        Ok(())
    }

    /// Masquerades what leaves the networks that ask for it: the networks in `changed`
    /// are looked at, or all of `plans` when `full` (or after a failed write); the
    /// chain is written anew only when what it holds changes.
    pub fn sync_masquerade(
        &mut self,
        plans: &BTreeMap<String, NetworkPlan>,
        changed: &BTreeSet<String>,
        full: bool,
    ) -> Result<()> {
        let asked = |n: &NetworkPlan| (!n.masquerade.is_empty()).then(|| n.masquerade.clone());
        let (want, moved) = match self.masquerade.take() {
            Some(mut held) if !full => {
                let mut moved = false;
                for id in changed {
                    let now = plans.get(id).and_then(asked);
                    if held.get(id) != now.as_ref() {
                        moved = true;
                        match now {
                            Some(subnets) => held.insert(id.clone(), subnets),
                            None => held.remove(id),
                        };
                    }
                }
                (held, moved)
            }
            before => {
                let want: BTreeMap<String, Vec<IpNet>> = plans
                    .iter()
                    .filter_map(|(id, n)| Some((id.clone(), asked(n)?)))
                    .collect();
                let moved = before.as_ref() != Some(&want);
                (want, moved)
            }
        };
        if moved {
            let networks: Vec<(&str, &[IpNet])> = want
                .iter()
                .map(|(id, subnets)| (id.as_str(), subnets.as_slice()))
                .collect();
            // On failure nothing is held: the next pass writes the whole chain.
            masquerade::set_network_masquerade(&networks, &self.host_addresses)?;
        }
        self.masquerade = Some(want);
        Ok(())
    }
}

/// A direct route as the kernel holds it: the address alone, via a host on the
/// underlay's subnet, marked as the agent's.
fn direct_route((addr, via): (IpAddr, IpAddr), device: u32) -> RouteSpec {
    let mut r = RouteSpec::new(IpNet::from(addr), Some(via), device);
    r.protocol = Some(names::DIRECT_ROUTE_PROTOCOL);
    r
}
