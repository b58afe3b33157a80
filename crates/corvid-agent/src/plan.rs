//! What this host's datapath should look like, computed from the cache alone: pure, so
//! every reconcile decision is unit-tested without root.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use corvid_api::{Ipv6Mode, Network, Port, Status, Subnet};
use corvid_net::overlay::{FdbEntry, NeighbourEntry};
use corvid_net::router_advert::Advertisement;
use ipnet::IpNet;

use crate::cache::Cache;
use corvid_net::names;

/// A port this agent plugs.
#[derive(Debug, Clone, PartialEq)]
pub struct PortPlan {
    /// Port ID.
    pub id: String,
    /// Its revision, so a failed plug is retried only once the port changes.
    pub revision: u64,
    /// Host end of the veth pair.
    pub host_veth: String,
    /// Interface name inside the namespace.
    pub ifname: String,
    /// The namespace path.
    pub netns: String,
    /// MAC of the container end.
    pub mac: String,
    /// Addresses with their subnet's prefix.
    pub addrs: Vec<IpNet>,
    /// Its allowed address pairs' prefixes: what the namespace may hold besides (a
    /// keepalived VIP), which a check leaves alone.
    pub kept: Vec<IpNet>,
    /// Routes: the default via the gateway, then the subnets' host routes.
    pub routes: Vec<(IpNet, Option<IpAddr>)>,
    /// The status the controller shows.
    pub status: Status,
}

/// What one port asks of this host's datapath.
#[derive(Debug, Clone, PartialEq)]
pub enum PortRole {
    /// Plugged here by the agent.
    Local(PortPlan),
    /// Bound here but plugged by another adapter (Docker's Join): its host end is kept.
    External(String),
    /// On another host: its MAC is found through the overlay and its addresses answered.
    Remote(RemotePort),
}

/// A port on another host, as this host reaches it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemotePort {
    /// Where its MAC lives: behind the other host's underlay address.
    pub fdb: FdbEntry,
    /// Its addresses, answered by the vxlan device with its MAC.
    pub neighbours: Vec<NeighbourEntry>,
    /// Those of its addresses routed straight to the other host, which shares this
    /// host's underlay segment (direct routing): answered with the bridge's MAC instead,
    /// so that pods send them to this host to route.
    pub direct: Vec<IpAddr>,
}

impl RemotePort {
    /// Its FDB entry, needed unless every address of it is routed directly.
    pub fn fdb(&self) -> Option<&FdbEntry> {
        (self.direct.is_empty() || self.direct.len() < self.neighbours.len()).then_some(&self.fdb)
    }

    /// Its neighbour entries, those routed directly with `bridge_mac`.
    pub fn neighbours<'a>(
        &'a self,
        bridge_mac: &'a str,
    ) -> impl Iterator<Item = NeighbourEntry> + 'a {
        self.neighbours.iter().map(move |n| NeighbourEntry {
            ip: n.ip,
            mac: if self.direct.contains(&n.ip) {
                bridge_mac.to_string()
            } else {
                n.mac.clone()
            },
        })
    }

    /// Its direct routes: each address routed directly, via its host's underlay address.
    pub fn direct_routes(&self) -> impl Iterator<Item = (IpAddr, IpAddr)> + '_ {
        self.direct.iter().map(|ip| (*ip, self.fdb.dst))
    }
}

/// This host as a plan sees it.
#[derive(Debug, Clone, Copy)]
pub struct Here<'a> {
    /// Its ID, which ports name in `binding:host_id`.
    pub host: &'a str,
    /// The subnet of its underlay address when it routes directly to hosts on it.
    pub segment: Option<IpNet>,
}

impl<'a> From<&'a str> for Here<'a> {
    fn from(host: &'a str) -> Here<'a> {
        Here {
            host,
            segment: None,
        }
    }
}

/// One network's datapath on this host.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkPlan {
    /// Network ID.
    pub id: String,
    /// The Linux bridge.
    pub bridge: String,
    /// The vxlan device on it.
    pub vxlan: String,
    /// VXLAN network identifier.
    pub vni: u32,
    /// MTU of the bridge ports.
    pub mtu: u32,
    /// Gateway addresses the bridge holds.
    pub gateways: Vec<IpNet>,
    /// Subnets to masquerade (empty unless the network asks for it).
    pub masquerade: Vec<IpNet>,
    /// What the bridge advertises as the IPv6 router, for subnets with an
    /// `ipv6_ra_mode`.
    pub advertisement: Option<Advertisement>,
    /// The router it is routed by: this host routes between its networks.
    pub router: Option<String>,
    /// Ports to plug here, by ID.
    pub ports: BTreeMap<String, PortPlan>,
    /// Host ends of ports bound here that another adapter plugs, by port ID.
    pub external: BTreeMap<String, String>,
    /// Where each remote port's MAC lives and its addresses, by port ID.
    pub remote: BTreeMap<String, RemotePort>,
}

impl NetworkPlan {
    /// Puts port `id` in its role (none: out of the plan); returns the role it had.
    pub fn place(&mut self, id: &str, role: Option<PortRole>) -> Option<PortRole> {
        let old = self
            .ports
            .remove(id)
            .map(PortRole::Local)
            .or_else(|| self.external.remove(id).map(PortRole::External))
            .or_else(|| self.remote.remove(id).map(PortRole::Remote));
        match role {
            Some(PortRole::Local(p)) => {
                self.ports.insert(id.to_string(), p);
            }
            Some(PortRole::External(veth)) => {
                self.external.insert(id.to_string(), veth);
            }
            Some(PortRole::Remote(r)) => {
                self.remote.insert(id.to_string(), r);
            }
            None => {}
        }
        old
    }

    /// Whether port `id` has a role here.
    pub fn holds(&self, id: &str) -> bool {
        self.ports.contains_key(id)
            || self.external.contains_key(id)
            || self.remote.contains_key(id)
    }

    /// Whether a port is bound here: without one the network has no datapath here.
    pub fn is_local(&self) -> bool {
        !self.ports.is_empty() || !self.external.is_empty()
    }

    /// Where each remote port's MAC lives.
    pub fn fdb(&self) -> BTreeSet<FdbEntry> {
        self.remote
            .values()
            .filter_map(|r| r.fdb().cloned())
            .collect()
    }

    /// Each remote port's addresses, answered by the vxlan device (with `bridge_mac`
    /// for those routed directly).
    pub fn neighbours(&self, bridge_mac: &str) -> BTreeSet<NeighbourEntry> {
        self.remote
            .values()
            .flat_map(|r| r.neighbours(bridge_mac))
            .collect()
    }

    /// The direct routes of its remote ports: address, via.
    pub fn direct_routes(&self) -> BTreeSet<(IpAddr, IpAddr)> {
        self.remote
            .values()
            .flat_map(RemotePort::direct_routes)
            .collect()
    }
}

/// The datapath of every network with a port bound to `host`, and of every network
/// routed with one of them (of every router, with `all_routers`): a host routes its
/// pods' traffic to the other networks of their router itself.
pub fn plan(cache: &Cache, here: Here, all_routers: bool) -> BTreeMap<String, NetworkPlan> {
    let mut out = BTreeMap::new();
    for p in cache
        .ports
        .values()
        .filter(|p| p.binding_host_id == here.host)
    {
        let Some(net) = cache.networks.get(&p.network_id) else {
            continue;
        };
        if !out.contains_key(&net.id) {
            out.insert(net.id.clone(), network_plan(cache, net, here));
        }
    }
    let routers: BTreeSet<String> = if all_routers {
        cache
            .routers_with_interfaces()
            .map(str::to_string)
            .collect()
    } else {
        out.values().filter_map(|n| n.router.clone()).collect()
    };
    for r in &routers {
        for id in cache.router_networks(r) {
            if let (false, Some(net)) = (out.contains_key(id), cache.networks.get(id)) {
                out.insert(id.to_string(), network_plan(cache, net, here));
            }
        }
    }
    out
}

/// A router's extra route as this host holds it: the next hop is reached on `bridge`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ExtraRoute {
    /// Where to.
    pub destination: IpNet,
    /// Through whom.
    pub nexthop: IpAddr,
    /// The bridge of the router's network the next hop is on.
    pub bridge: String,
}

/// The extra routes of `routers` (those present here), each through the bridge of the
/// router's network whose subnet holds its next hop; a router without routes costs one
/// lookup, however many networks it has.
pub fn extra_routes<'a>(
    cache: &Cache,
    plans: &BTreeMap<String, NetworkPlan>,
    routers: impl Iterator<Item = &'a str>,
) -> BTreeSet<ExtraRoute> {
    let mut out = BTreeSet::new();
    for r in routers {
        let Some(router) = cache.routers.get(r).filter(|r| !r.routes.is_empty()) else {
            continue;
        };
        let networks: Vec<&NetworkPlan> = cache
            .router_networks(r)
            .into_iter()
            .filter_map(|id| plans.get(id))
            .filter(|n| n.router.as_deref() == Some(r))
            .collect();
        for route in &router.routes {
            let bridge = networks
                .iter()
                .find(|n| n.gateways.iter().any(|g| g.contains(&route.nexthop)));
            if let Some(n) = bridge {
                out.insert(ExtraRoute {
                    destination: route.destination.trunc(),
                    nexthop: route.nexthop,
                    bridge: n.bridge.clone(),
                });
            }
        }
    }
    out
}

/// The datapath of one network, whether or not it has local ports.
pub fn network_plan(cache: &Cache, net: &Network, here: Here) -> NetworkPlan {
    let subnets: Vec<_> = net
        .subnets
        .iter()
        .filter_map(|id| cache.subnets.get(id))
        .collect();
    let gateways = subnets
        .iter()
        .filter_map(|s| IpNet::new(s.gateway_ip?, s.cidr.prefix_len()).ok())
        .collect();
    let masquerade = if net.masquerade {
        subnets.iter().map(|s| s.cidr).collect()
    } else {
        Vec::new()
    };
    let mut plan = NetworkPlan {
        id: net.id.clone(),
        bridge: names::bridge(&net.id),
        vxlan: names::vxlan(&net.id),
        vni: net.segmentation_id,
        mtu: net.mtu,
        advertisement: advertisement(net, &subnets),
        gateways,
        masquerade,
        router: cache.network_router(&net.id).map(str::to_string),
        ports: BTreeMap::new(),
        external: BTreeMap::new(),
        remote: BTreeMap::new(),
    };
    for p in cache.ports_of(&net.id) {
        plan.place(&p.id, port_role(cache, p, here));
    }
    plan
}

/// The router advertisement of `net`'s IPv6 subnets that have an `ipv6_ra_mode` and a
/// gateway, as Neutron's radvd makes it: M for a stateful subnet, O for a stateless one,
/// each prefix on-link and autonomous unless stateful; none without such a subnet.
fn advertisement(net: &Network, subnets: &[&Subnet]) -> Option<Advertisement> {
    let advertised: Vec<(&Subnet, Ipv6Mode)> = subnets
        .iter()
        .filter(|s| s.gateway_ip.is_some_and(|g| g.is_ipv6()))
        .filter_map(|s| Some((*s, s.ipv6_ra_mode?)))
        .collect();
    if advertised.is_empty() {
        return None;
    }
    let prefixes = advertised
        .iter()
        .filter_map(|(s, mode)| match s.cidr {
            IpNet::V6(p) => Some((p.trunc(), mode.is_auto_address())),
            IpNet::V4(_) => None,
        })
        .collect();
    let mut dns: Vec<std::net::Ipv6Addr> = Vec::new();
    for d in advertised.iter().flat_map(|(s, _)| &s.dns_nameservers) {
        if let Ok(d) = d.parse() {
            if !dns.contains(&d) && dns.len() < 3 {
                dns.push(d);
            }
        }
    }
    Some(Advertisement {
        managed: advertised
            .iter()
            .any(|(_, m)| *m == Ipv6Mode::Dhcpv6Stateful),
        other: advertised
            .iter()
            .any(|(_, m)| *m == Ipv6Mode::Dhcpv6Stateless),
        mtu: Some(net.mtu),
        prefixes,
        dns,
    })
}

/// What `p` asks of this host: none when it is bound nowhere or to a host not
/// registered.
pub fn port_role(cache: &Cache, p: &Port, here: Here) -> Option<PortRole> {
    if p.binding_host_id.is_empty() {
        return None;
    }
    if p.binding_host_id != here.host {
        let remote = cache.hosts.get(&p.binding_host_id)?;
        let mac = p.mac_address.to_ascii_lowercase();
        let neighbours = p
            .fixed_ips
            .iter()
            .map(|ip| NeighbourEntry {
                ip: ip.ip_address,
                mac: mac.clone(),
            })
            .collect();
        // Routed without encapsulation when the other host is on this one's segment;
        // addresses of the underlay's family alone, which its address can be a next hop of.
        let underlay = remote.underlay_ip;
        let direct = if here.segment.is_some_and(|s| s.contains(&underlay)) {
            p.fixed_ips
                .iter()
                .map(|ip| ip.ip_address)
                .filter(|ip| ip.is_ipv4() == underlay.is_ipv4())
                .collect()
        } else {
            Vec::new()
        };
        return Some(PortRole::Remote(RemotePort {
            fdb: FdbEntry { mac, dst: underlay },
            neighbours,
            direct,
        }));
    }
    let (Some(ifname), Some(netns)) = (&p.veth_name, &p.network_ns) else {
        return Some(PortRole::External(names::host_veth(&p.id)));
    };
    let mut addrs = Vec::new();
    let mut routes = Vec::new();
    for ip in &p.fixed_ips {
        let Some(s) = cache.subnets.get(&ip.subnet_id) else {
            continue;
        };
        if let Ok(a) = IpNet::new(ip.ip_address, s.cidr.prefix_len()) {
            addrs.push(a);
        }
        if let Some(gw) = s.gateway_ip {
            let default: IpNet = if gw.is_ipv4() {
                IpNet::V4(Default::default())
            } else {
                IpNet::V6(Default::default())
            };
            if !routes.iter().any(|(d, _)| *d == default) {
                routes.push((default, Some(gw)));
            }
        }
        for r in &s.host_routes {
            routes.push((r.destination, Some(r.nexthop)));
        }
    }
    Some(PortRole::Local(PortPlan {
        id: p.id.clone(),
        revision: p.revision_number,
        host_veth: names::host_veth(&p.id),
        ifname: ifname.clone(),
        netns: netns.clone(),
        mac: p.mac_address.to_ascii_lowercase(),
        addrs,
        kept: p.address_pairs().into_iter().map(|(_, net)| net).collect(),
        routes,
        status: p.status,
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use corvid_api::{FixedIp, Host, Subnet};
    use serde_json::json;

    /// Port `id` on network n1 bound to `host`, plugged into `ns` when given.
    pub(crate) fn port(id: &str, host: &str, ip: &str, ns: Option<&str>) -> Port {
        serde_json::from_value(json!({
            "id": id, "name": "", "network_id": "n1", "tenant_id": "p", "project_id": "p",
            "mac_address": format!("FA:16:3E:00:00:{}", &id[1..]), "admin_state_up": true,
            "status": "DOWN", "device_id": "", "device_owner": "",
            "fixed_ips": [FixedIp { subnet_id: "s1".into(), ip_address: ip.parse().unwrap() }],
            "binding:host_id": host, "binding:profile": {}, "binding:vnic_type": "normal",
            "binding:vif_type": "ovs", "binding:vif_details": {}, "port_security_enabled": false,
            "security_groups": [], "allowed_address_pairs": [], "extra_dhcp_opts": [],
            "ip_allocation": "immediate", "description": "", "tags": [],
            "veth_name": ns.map(|_| "eth0"), "network_ns": ns,
            "created_at": "", "updated_at": "", "revision_number": 3
        }))
        .unwrap()
    }

    /// Network n1 (subnet s1, 10.1.0.0/24), hosts h1 and h2, and five ports: p01 plugged
    /// on h1, p02 on h2, p03 bound to h1 with no namespace, p04 on an unknown host, p05
    /// unbound.
    pub(crate) fn cache() -> Cache {
        let mut c = Cache::default();
        let net: Network = serde_json::from_value(json!({
            "id": "n1", "name": "", "tenant_id": "p", "project_id": "p", "admin_state_up": true,
            "mtu": 1450, "status": "ACTIVE", "subnets": ["s1"], "shared": false,
            "router:external": false, "port_security_enabled": true, "description": "",
            "tags": [], "created_at": "", "updated_at": "", "revision_number": 1,
            "provider:segmentation_id": 42, "corvid:masquerade": true
        }))
        .unwrap();
        let subnet: Subnet = serde_json::from_value(json!({
            "id": "s1", "name": "", "tenant_id": "p", "project_id": "p", "network_id": "n1",
            "ip_version": 4, "subnetpool_id": null, "enable_dhcp": true, "ipv6_ra_mode": null,
            "ipv6_address_mode": null, "gateway_ip": "10.1.0.1", "cidr": "10.1.0.0/24",
            "allocation_pools": [], "host_routes": [{"destination": "10.9.0.0/16", "nexthop": "10.1.0.254"}],
            "dns_nameservers": [], "description": "", "service_types": [], "tags": [],
            "created_at": "", "updated_at": "", "revision_number": 1
        }))
        .unwrap();
        c.networks.insert("n1".into(), net);
        c.subnets.insert("s1".into(), subnet);
        for (id, host) in [("h1", "10.99.0.1"), ("h2", "10.99.0.2")] {
            c.hosts.insert(
                id.into(),
                Host {
                    id: id.into(),
                    underlay_ip: host.parse().unwrap(),
                    description: String::new(),
                    tags: vec![],
                    created_at: String::new(),
                    updated_at: String::new(),
                    revision_number: 1,
                },
            );
        }
        for p in [
            port("p01", "h1", "10.1.0.5", Some("/run/netns/a")),
            port("p02", "h2", "10.1.0.6", Some("/run/netns/b")),
            port("p03", "h1", "10.1.0.7", None),
            port("p04", "h3", "10.1.0.8", Some("/run/netns/c")),
            port("p05", "", "10.1.0.9", None),
        ] {
            c.ports.insert(p.id.clone(), p);
        }
        c.reindex();
        c
    }

    /// Adds to n1 an IPv6 subnet `id` with `cidr`, its gateway the prefix's first
    /// address unless `gateway` is false, and router advertisement mode `mode`.
    fn ipv6_subnet(c: &mut Cache, id: &str, cidr: &str, mode: Option<&str>, gateway: bool) {
        let net: IpNet = cidr.parse().unwrap();
        let gw = gateway.then(|| net.hosts().next().unwrap().to_string());
        let subnet: Subnet = serde_json::from_value(json!({
            "id": id, "name": "", "tenant_id": "p", "project_id": "p", "network_id": "n1",
            "ip_version": 6, "subnetpool_id": null, "enable_dhcp": true, "ipv6_ra_mode": mode,
            "ipv6_address_mode": mode, "gateway_ip": gw, "cidr": cidr,
            "allocation_pools": [], "host_routes": [], "dns_nameservers": ["fd53::53", "10.0.0.53"],
            "description": "", "service_types": [], "tags": [],
            "created_at": "", "updated_at": "", "revision_number": 1
        }))
        .unwrap();
        c.subnets.insert(id.into(), subnet);
        c.networks.get_mut("n1").unwrap().subnets.push(id.into());
    }

    #[test]
    fn subnets_with_a_router_advertisement_mode_are_advertised_as_neutron_does() {
        let mut c = cache();
        let advert = |c: &Cache| plan(c, "h1".into(), false)["n1"].advertisement.clone();
        assert_eq!(advert(&c), None, "IPv4 alone");
        ipv6_subnet(&mut c, "s6", "fd53::/64", None, true);
        assert_eq!(advert(&c), None, "no mode: an outside router advertises");
        ipv6_subnet(&mut c, "s7", "fd54::/64", Some("slaac"), false);
        assert_eq!(advert(&c), None, "no gateway: no router to advertise");
        ipv6_subnet(&mut c, "s8", "fd55::/64", Some("slaac"), true);
        let ad = advert(&c).unwrap();
        assert!(!ad.managed && !ad.other);
        assert_eq!(ad.mtu, Some(1450));
        assert_eq!(ad.prefixes, [("fd55::/64".parse().unwrap(), true)]);
        assert_eq!(ad.dns, ["fd53::53".parse::<std::net::Ipv6Addr>().unwrap()]);
        ipv6_subnet(&mut c, "s9", "fd56::/64", Some("dhcpv6-stateful"), true);
        ipv6_subnet(&mut c, "sa", "fd57::/64", Some("dhcpv6-stateless"), true);
        let ad = advert(&c).unwrap();
        assert!(ad.managed && ad.other);
        assert_eq!(ad.dns.len(), 1, "each server once");
        let autonomous: Vec<bool> = ad.prefixes.iter().map(|(_, a)| *a).collect();
        assert_eq!(autonomous, [true, false, true]);
    }

    #[test]
    fn local_ports_are_plugged_and_remote_ones_tunnelled() {
        let plans = plan(&cache(), "h1".into(), false);
        let n = &plans["n1"];
        assert_eq!(n.vni, 42);
        assert_eq!(n.gateways, vec!["10.1.0.1/24".parse::<IpNet>().unwrap()]);
        assert_eq!(n.masquerade, vec!["10.1.0.0/24".parse::<IpNet>().unwrap()]);
        // p03 has no namespace (a Docker endpoint): it keeps the network here, and its
        // host end (made by the Docker driver) is kept, but the agent does not plug it.
        assert_eq!(n.ports.len(), 1);
        assert_eq!(
            n.external,
            BTreeMap::from([("p03".to_string(), names::host_veth("p03"))])
        );
        let p = &n.ports["p01"];
        assert_eq!(p.id, "p01");
        assert_eq!(p.mac, "fa:16:3e:00:00:01");
        assert_eq!(p.addrs, vec!["10.1.0.5/24".parse::<IpNet>().unwrap()]);
        assert_eq!(
            p.routes,
            vec![
                (
                    "0.0.0.0/0".parse().unwrap(),
                    Some("10.1.0.1".parse().unwrap())
                ),
                (
                    "10.9.0.0/16".parse().unwrap(),
                    Some("10.1.0.254".parse().unwrap())
                ),
            ]
        );
        // Only p02: p04's host never registered, p05 is bound nowhere.
        assert_eq!(
            n.fdb(),
            BTreeSet::from([FdbEntry {
                mac: "fa:16:3e:00:00:02".into(),
                dst: "10.99.0.2".parse().unwrap()
            }])
        );
        assert_eq!(
            n.neighbours("02:00:00:00:00:01"),
            BTreeSet::from([NeighbourEntry {
                ip: "10.1.0.6".parse().unwrap(),
                mac: "fa:16:3e:00:00:02".into()
            }])
        );
    }

    #[test]
    fn networks_on_a_router_with_a_local_network_come_here_without_local_ports() {
        let mut c = cache();
        for (id, ip) in [("n2", "10.2.0.1"), ("n3", "10.3.0.1")] {
            let mut n = c.networks["n1"].clone();
            n.id = id.into();
            c.networks.insert(id.into(), n);
            let mut remote = port(&format!("p1{}", &id[1..]), "h2", ip, Some("/run/netns/x"));
            remote.network_id = id.into();
            c.ports.insert(remote.id.clone(), remote);
        }
        let interface = |id: &str, net: &str, router: &str| {
            let mut p = port(id, "", "10.0.0.1", None);
            p.network_id = net.into();
            p.device_owner = corvid_api::ROUTER_INTERFACE.into();
            p.device_id = router.into();
            p
        };
        for p in [interface("p21", "n1", "r1"), interface("p22", "n2", "r1")] {
            c.ports.insert(p.id.clone(), p);
        }
        c.reindex();
        let plans = plan(&c, "h1".into(), false);
        assert_eq!(plans.keys().collect::<Vec<_>>(), ["n1", "n2"]);
        assert_eq!(plans["n2"].router.as_deref(), Some("r1"));
        assert!(!plans["n2"].is_local());
        // n2's remote port is reached through the overlay from here.
        assert_eq!(plans["n2"].remote.len(), 1);
        // A host with no port on the router's networks has none of them, unless it
        // holds every router's (a Kubernetes node).
        assert!(plan(&c, "h9".into(), false).is_empty());
        let everywhere = plan(&c, "h9".into(), true);
        assert_eq!(everywhere.keys().collect::<Vec<_>>(), ["n1", "n2"]);
        assert!(everywhere.values().all(|n| !n.is_local()));
        c.ports.remove("p21");
        c.reindex();
        assert_eq!(
            plan(&c, "h1".into(), false).keys().collect::<Vec<_>>(),
            ["n1"]
        );
    }

    #[test]
    fn hosts_on_the_underlay_subnet_are_routed_to_directly() {
        let mut c = cache();
        c.ports.get_mut("p02").unwrap().fixed_ips.push(FixedIp {
            subnet_id: "s1".into(),
            ip_address: "fd01::6".parse().unwrap(),
        });
        let here = |segment: &str| Here {
            host: "h1",
            segment: Some(segment.parse().unwrap()),
        };
        let n = &plan(&c, here("10.99.0.0/24"), false)["n1"];
        let bridge = "02:00:00:00:00:01";
        // The IPv4 address goes straight to h2's underlay address and is answered with
        // the bridge's MAC; the IPv6 one, which an IPv4 next hop cannot carry, keeps
        // the overlay, and so the port's FDB entry.
        assert_eq!(
            n.direct_routes(),
            BTreeSet::from([("10.1.0.6".parse().unwrap(), "10.99.0.2".parse().unwrap())])
        );
        assert_eq!(
            n.neighbours(bridge),
            BTreeSet::from([
                NeighbourEntry {
                    ip: "10.1.0.6".parse().unwrap(),
                    mac: bridge.into()
                },
                NeighbourEntry {
                    ip: "fd01::6".parse().unwrap(),
                    mac: "fa:16:3e:00:00:02".into()
                },
            ])
        );
        assert_eq!(n.fdb().len(), 1);
        // IPv4 alone: no FDB entry, nothing crosses the overlay.
        c.ports.get_mut("p02").unwrap().fixed_ips.pop();
        let n = &plan(&c, here("10.99.0.0/24"), false)["n1"];
        assert!(n.fdb().is_empty());
        // A host on another subnet is reached through the overlay, as without a segment.
        let far = &plan(&c, here("10.98.0.0/24"), false)["n1"];
        assert!(far.direct_routes().is_empty());
        assert_eq!(far, &plan(&c, "h1".into(), false)["n1"]);
    }

    #[test]
    fn a_host_without_ports_has_no_datapath() {
        assert!(plan(&cache(), "h9".into(), false).is_empty());
        let mut c = cache();
        c.ports.retain(|_, p| p.binding_host_id != "h1");
        c.reindex();
        assert!(plan(&c, "h1".into(), false).is_empty());
    }
}
