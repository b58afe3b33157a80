//! What this host's service datapath should hold, computed from the cache alone (pure,
//! unit-tested): every load balancer's listeners with their members, served on every
//! host, and the floating IPs of ports that are not VIPs.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use corvid_api::{LbProtocol, Pool, NODE_PORT_TAG};
use corvid_net::nftables::portmap::Protocol;
use corvid_net::nftables::services::Service;
use ipnet::IpNet;

use crate::cache::Cache;

/// How long a client stays with its member when its pool asks for affinity without
/// saying (Kubernetes' default for `sessionAffinity: ClientIP`).
pub const DEFAULT_AFFINITY: Duration = Duration::from_secs(10800);

/// The services by listener ID, and the floating IPs (public to fixed) of plain ports.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ServicePlan {
    /// One entry per listener.
    pub services: BTreeMap<String, Service>,
    /// Floating IPs associated with ports that are not a load balancer's VIP.
    pub floating: BTreeMap<IpAddr, IpAddr>,
    /// The subnets of routers that SNAT through their gateway, with the gateway address.
    pub router_snat: BTreeMap<IpNet, IpAddr>,
}

impl ServicePlan {
    /// Every public address this plan serves: the floating IPs of ports and of VIPs, and
    /// the routers' gateway addresses that replies to their SNAT come back to.
    pub fn public_addresses(&self) -> std::collections::BTreeSet<IpAddr> {
        self.floating
            .keys()
            .copied()
            .chain(self.router_snat.values().copied())
            .chain(
                self.services
                    .values()
                    .flat_map(|s| s.external.iter().copied()),
            )
            .collect()
    }
}

fn protocol(p: LbProtocol) -> Option<Protocol> {
    match p {
        LbProtocol::Tcp => Some(Protocol::Tcp),
        LbProtocol::Udp => Some(Protocol::Udp),
        LbProtocol::Sctp => Some(Protocol::Sctp),
        LbProtocol::Other => None,
    }
}

fn affinity(pool: &Pool) -> Option<Duration> {
    let persistence = pool
        .session_persistence
        .as_ref()
        .filter(|s| s.kind == "SOURCE_IP");
    if persistence.is_none() && pool.lb_algorithm != "SOURCE_IP" {
        return None;
    }
    Some(
        persistence
            .and_then(|s| s.persistence_timeout)
            .map_or(DEFAULT_AFFINITY, Duration::from_secs),
    )
}

/// The service datapath of every load balancer in the cache.
pub fn plan(cache: &Cache) -> ServicePlan {
    let mut out = ServicePlan::default();
    for id in cache.listeners.keys() {
        if let Some(s) = plan_listener(cache, id) {
            out.services.insert(id.clone(), s);
        }
    }
    let vip_ports: std::collections::HashSet<&str> = cache
        .loadbalancers
        .values()
        .filter_map(|lb| lb.vip_port_id.as_deref())
        .collect();
    for f in cache.floatingips.values() {
        if let (Some(port), Some(fixed)) = (&f.port_id, f.fixed_ip_address) {
            if !vip_ports.contains(port.as_str()) {
                out.floating.insert(f.floating_ip_address, fixed);
            }
        }
    }
    out.router_snat = router_snat(cache);
    out
}

/// Each subnet of a router whose gateway has SNAT on, with the gateway's address of the
/// subnet's family.
pub fn router_snat(cache: &Cache) -> BTreeMap<IpNet, IpAddr> {
    let mut out = BTreeMap::new();
    for r in cache.routers.values() {
        let Some(gw) = r.external_gateway_info.as_ref().filter(|g| g.enable_snat) else {
            continue;
        };
        let interfaces = cache.router_ports.get(&r.id).into_iter().flatten();
        for ip in interfaces
            .filter_map(|p| cache.ports.get(p))
            .flat_map(|p| &p.fixed_ips)
        {
            let Some(subnet) = cache.subnets.get(&ip.subnet_id) else {
                continue;
            };
            let family = subnet.cidr.addr().is_ipv4();
            let address = gw
                .external_fixed_ips
                .iter()
                .map(|f| f.ip_address)
                .find(|a| a.is_ipv4() == family);
            if let Some(a) = address {
                out.insert(subnet.cidr, a);
            }
        }
    }
    out
}

/// The service of one listener, from the cache's indexes (its cost does not grow with
/// the other services); none when it serves nothing (gone, down, no VIP, not TCP, UDP
/// or SCTP).
pub fn plan_listener(cache: &Cache, id: &str) -> Option<Service> {
    let l = cache.listeners.get(id).filter(|l| l.admin_state_up)?;
    let lb = cache.loadbalancers.get(&l.loadbalancer_id)?;
    let (vip, protocol) = (lb.vip_address?, protocol(l.protocol)?);
    let pool = l
        .default_pool_id
        .as_ref()
        .and_then(|p| cache.pools.get(p))
        .or_else(|| {
            let made_with = cache.index.pools.get(id)?;
            made_with.iter().find_map(|p| cache.pools.get(p))
        });
    let serving = lb.admin_state_up && pool.is_some_and(|p| p.admin_state_up);
    let mut members: Vec<(IpAddr, u16)> = pool
        .filter(|_| serving)
        .and_then(|p| cache.index.members.get(&p.id))
        .into_iter()
        .flatten()
        .filter_map(|m| cache.members.get(m))
        .filter(|m| m.admin_state_up && !m.backup)
        .map(|m| (m.address, m.protocol_port))
        .collect();
    members.sort();
    members.dedup();
    // A member in no corvid subnet is reached through the host (the API server behind
    // the `kubernetes` service).
    let outside = members
        .iter()
        .map(|(a, _)| *a)
        .filter(|a| !cache.subnets.values().any(|s| s.cidr.contains(a)))
        .collect();
    let mut external: Vec<IpAddr> = lb
        .vip_port_id
        .as_ref()
        .and_then(|p| cache.index.floating.get(p))
        .into_iter()
        .flatten()
        .filter_map(|f| cache.floatingips.get(f))
        .map(|f| f.floating_ip_address)
        .collect();
    external.sort();
    Some(Service {
        vip,
        external,
        protocol,
        port: l.protocol_port,
        node_port: l
            .tags
            .iter()
            .find_map(|t| t.strip_prefix(NODE_PORT_TAG)?.parse().ok()),
        members,
        outside,
        affinity: pool.and_then(affinity),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cache() -> Cache {
        let mut c = Cache::default();
        c.loadbalancers.insert(
            "lb".into(),
            serde_json::from_value(json!({"id": "lb", "vip_address": "10.96.0.10",
                "vip_port_id": "vip"}))
            .unwrap(),
        );
        c.listeners.insert(
            "l80".into(),
            serde_json::from_value(json!({"id": "l80", "loadbalancer_id": "lb",
                "protocol": "TCP", "protocol_port": 80, "default_pool_id": "p80",
                "tags": ["node-port:30080"]}))
            .unwrap(),
        );
        c.listeners.insert(
            "l53".into(),
            serde_json::from_value(json!({"id": "l53", "loadbalancer_id": "lb",
                "protocol": "UDP", "protocol_port": 53, "default_pool_id": null}))
            .unwrap(),
        );
        c.pools.insert(
            "p80".into(),
            serde_json::from_value(json!({"id": "p80", "listener_id": "l80",
                "loadbalancer_id": "lb", "lb_algorithm": "ROUND_ROBIN",
                "session_persistence": {"type": "SOURCE_IP", "persistence_timeout": 60}}))
            .unwrap(),
        );
        c.pools.insert(
            "p53".into(),
            serde_json::from_value(json!({"id": "p53", "listener_id": "l53",
                "loadbalancer_id": "lb", "lb_algorithm": "ROUND_ROBIN",
                "session_persistence": null}))
            .unwrap(),
        );
        for (id, pool, addr, up) in [
            ("m1", "p80", "10.1.0.5", true),
            ("m2", "p80", "10.1.0.6", true),
            ("m3", "p80", "10.1.0.7", false),
            ("m4", "p53", "10.1.0.5", true),
        ] {
            c.members.insert(
                id.into(),
                serde_json::from_value(json!({"id": id, "pool_id": pool, "address": addr,
                    "protocol_port": 8080, "admin_state_up": up}))
                .unwrap(),
            );
        }
        c.reindex();
        c
    }

    fn fip(id: &str, public: &str, port: &str, fixed: &str) -> corvid_api::FloatingIp {
        serde_json::from_value(json!({
            "id": id, "tenant_id": "", "project_id": "", "floating_ip_address": public,
            "floating_network_id": "pub", "router_id": null, "port_id": port,
            "fixed_ip_address": fixed, "status": "DOWN", "description": "",
            "port_details": null, "tags": [], "created_at": "", "updated_at": "",
            "revision_number": 1
        }))
        .unwrap()
    }

    #[test]
    fn listeners_become_services_with_their_pools_up_members() {
        let p = plan(&cache());
        let web = &p.services["l80"];
        assert_eq!(web.vip, "10.96.0.10".parse::<IpAddr>().unwrap());
        assert_eq!(web.port, 80);
        assert_eq!(web.node_port, Some(30080));
        assert_eq!(
            web.members,
            [
                ("10.1.0.5".parse().unwrap(), 8080),
                ("10.1.0.6".parse().unwrap(), 8080)
            ]
        );
        assert_eq!(web.affinity, Some(Duration::from_secs(60)));
        // A listener without default_pool_id finds the pool made with it.
        let dns = &p.services["l53"];
        assert_eq!((dns.protocol, dns.affinity), (Protocol::Udp, None));
        assert_eq!(dns.members.len(), 1);
    }

    #[test]
    fn floating_ips_of_vips_serve_the_listeners_and_the_others_map_to_their_port() {
        let mut c = cache();
        c.floatingips
            .insert("f1".into(), fip("f1", "192.0.2.10", "vip", "10.96.0.10"));
        c.floatingips
            .insert("f2".into(), fip("f2", "192.0.2.11", "pod", "10.1.0.5"));
        c.reindex();
        let p = plan(&c);
        assert_eq!(
            p.services["l80"].external,
            ["192.0.2.10".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            p.floating,
            BTreeMap::from([("192.0.2.11".parse().unwrap(), "10.1.0.5".parse().unwrap())])
        );
    }

    #[test]
    fn a_load_balancer_set_down_serves_no_member() {
        let mut c = cache();
        c.loadbalancers.get_mut("lb").unwrap().admin_state_up = false;
        assert!(plan(&c).services.values().all(|s| s.members.is_empty()));
    }
}
