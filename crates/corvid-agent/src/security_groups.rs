//! What the security group filter holds on this host, from the cache and the plans: the
//! ports plugged here with port security on, their groups' rules, and the members of
//! every group those rules name as a remote end (the members may be anywhere).

use std::collections::{BTreeMap, BTreeSet};

use corvid_api::protocols::{self, ICMP_PROTOCOLS, PORT_PROTOCOLS};
use corvid_api::{Direction, Ethertype, Port, SecurityGroupRule};
use corvid_net::nftables::security_groups::{Group, PortFilter, Remote, Rule, Want};
use ipnet::IpNet;

use crate::cache::Cache;
use crate::plan::NetworkPlan;

/// IPv6's ICMP: what an IPv6 rule naming `icmp` means, as Neutron reads it.
const IPV6_ICMP: u8 = 58;

/// The filter for the ports of `plans` (plugged by the agent, or by an adapter that
/// plugs its own) whose port security is on.
pub fn plan(cache: &Cache, plans: &BTreeMap<String, NetworkPlan>) -> Want {
    let mut want = Want::default();
    for n in plans.values() {
        let local = n.ports.values().map(|p| (&p.id, &p.host_veth));
        for (id, veth) in local.chain(&n.external) {
            let Some(port) = cache.ports.get(id).filter(|p| p.port_security_enabled) else {
                continue;
            };
            let Some(filter) = port_filter(cache, port, veth, &n.bridge) else {
                tracing::warn!(port = %id, mac = %port.mac_address, "not filtered: its MAC cannot be read");
                continue;
            };
            want.ports.insert(id.clone(), filter);
        }
    }
    let used: BTreeSet<&String> = want.ports.values().flat_map(|p| &p.groups).collect();
    let mut remotes = BTreeSet::new();
    for g in used {
        let group = group(cache, g);
        for r in group.ingress.iter().chain(&group.egress) {
            if let Remote::Group(remote) = &r.remote {
                remotes.insert(remote.clone());
            }
        }
        want.groups.insert(g.clone(), group);
    }
    for g in remotes {
        let members = cache
            .group_ports
            .get(&g)
            .into_iter()
            .flatten()
            .filter_map(|id| cache.ports.get(id))
            .flat_map(|p| addresses(p).into_iter().filter(is_host).map(|a| a.addr()))
            .collect();
        want.members.insert(g, members);
    }
    want
}

fn is_host(net: &IpNet) -> bool {
    net.prefix_len() == net.max_prefix_len()
}

/// A port's addresses: its fixed IPs and its allowed address pairs' prefixes.
fn addresses(p: &Port) -> Vec<IpNet> {
    let fixed = p.fixed_ips.iter().map(|f| IpNet::from(f.ip_address));
    fixed
        .chain(p.address_pairs().into_iter().map(|(_, net)| net))
        .collect()
}

fn mac(s: &str) -> Option<[u8; 6]> {
    corvid_net::link::parse_mac(s)?.try_into().ok()
}

fn port_filter(cache: &Cache, p: &Port, ifname: &str, bridge: &str) -> Option<PortFilter> {
    let own = mac(&p.mac_address)?;
    let mut sources: Vec<([u8; 6], IpNet)> = p
        .fixed_ips
        .iter()
        .map(|f| (own, IpNet::from(f.ip_address)))
        .collect();
    sources.extend(
        p.address_pairs()
            .into_iter()
            .filter_map(|(m, net)| Some((mac(m)?, net))),
    );
    // Neutron allows no mix of stateful and stateless groups on a port; a group not
    // known yet is taken as stateful, the default.
    let stateful = p.security_groups.is_empty()
        || p.security_groups.iter().any(|g| {
            cache
                .security_groups
                .get(g)
                .is_none_or(|group| group.stateful)
        });
    Some(PortFilter {
        ifname: ifname.to_string(),
        bridge: bridge.to_string(),
        mac: own,
        sources,
        groups: p.security_groups.clone(),
        stateful,
    })
}

/// Group `id`'s rules by direction, in the cache's order of rule IDs; a group not known
/// (yet) has none, so its ports are closed until it comes.
fn group(cache: &Cache, id: &str) -> Group {
    let mut out = Group::default();
    let rules = cache.group_rules.get(id).into_iter().flatten();
    for r in rules.filter_map(|r| cache.security_group_rules.get(r)) {
        let Some(rule) = rule(r) else {
            tracing::warn!(rule = %r.id, protocol = ?r.protocol, "rule left out: its protocol is not known");
            continue;
        };
        match r.direction {
            Direction::Ingress => out.ingress.push(rule),
            Direction::Egress => out.egress.push(rule),
        }
    }
    out
}

/// A rule as the filter takes it; none when its protocol has no number.
fn rule(r: &SecurityGroupRule) -> Option<Rule> {
    let v6 = r.ethertype == Ethertype::Ipv6;
    let protocol = match r.protocol.as_deref() {
        None | Some("any") => None,
        Some(p) => Some(protocols::number(&p.to_ascii_lowercase())?),
    }
    .map(|p| if v6 && p == 1 { IPV6_ICMP } else { p });
    let range = r
        .port_range_min
        .map(|min| (min, r.port_range_max.unwrap_or(min)));
    let of = |set: &[u8]| protocol.is_some_and(|p| set.contains(&p));
    let remote = match (&r.remote_group_id, r.normalized_cidr.or(r.remote_ip_prefix)) {
        (Some(g), _) => Remote::Group(g.clone()),
        (None, Some(net)) => Remote::Prefix(net),
        (None, None) => Remote::Any,
    };
    Some(Rule {
        v6,
        protocol,
        ports: range.filter(|_| of(&PORT_PROTOCOLS)),
        icmp: r
            .port_range_min
            .filter(|_| of(&ICMP_PROTOCOLS))
            .map(|kind| (kind as u8, r.port_range_max.map(|code| code as u8))),
        remote,
    })
}
