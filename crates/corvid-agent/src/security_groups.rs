//! What the security group filter holds on this host, from the cache and the plans: the
//! ports plugged here with port security on, their groups' rules, and the members of
//! every group those rules name as a remote end (the members may be anywhere).
//!
//! A port's change costs the same however many ports the cluster holds: the planner
//! keeps what it planned, with each port's addresses as counted into the member sets,
//! and looks at the changed port, this host's ports' groups, and nothing else (for a
//! network planned again, the ports on it). A group or rule change plans everything
//! anew.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use corvid_api::protocols::{self, ICMP_PROTOCOLS, PORT_PROTOCOLS};
use corvid_api::{Direction, Ethertype, Port, SecurityGroupRule};
use corvid_net::nftables::security_groups::{Group, PortFilter, Remote, Rule, Touched, Want};
use ipnet::IpNet;

use crate::cache::Cache;
use crate::plan::NetworkPlan;

/// IPv6's ICMP: what an IPv6 rule naming `icmp` means, as Neutron reads it.
const IPV6_ICMP: u8 = 58;

/// The filter's plan and what it was made from.
#[derive(Debug, Default)]
pub struct Planner {
    want: Want,
    /// The (group, address) pairs each port put in the member sets.
    counted: HashMap<String, Vec<(String, IpAddr)>>,
    /// How many ports put each address in each member set (keepalived's pair of ports
    /// share their VIP).
    counts: HashMap<(String, IpAddr), u32>,
    /// What changed since the filter was last synced; none after a full plan.
    touched: Option<Touched>,
}

impl Planner {
    /// The filter as last planned.
    pub fn want(&self) -> &Want {
        &self.want
    }

    /// Plans again what changed ports and networks touch. A network planned again (an
    /// interface of its router, a subnet) may have gained or lost its local ports: those
    /// are looked at, not all.
    pub fn changes(
        &mut self,
        cache: &Cache,
        plans: &BTreeMap<String, NetworkPlan>,
        ports: &BTreeSet<String>,
        networks: &BTreeSet<String>,
    ) {
        let mut ids = ports.clone();
        for net in networks {
            if let Some(n) = plans.get(net) {
                ids.extend(n.ports.keys().chain(n.external.keys()).cloned());
            }
            let bridge = corvid_net::names::bridge(net);
            let on = self.want.ports.iter().filter(|(_, p)| p.bridge == bridge);
            ids.extend(on.map(|(id, _)| id.clone()));
        }
        self.ports(cache, plans, &ids);
    }

    /// What changed since the last call, for the filter's sync to look at alone; none
    /// when everything was planned anew.
    pub fn take_touched(&mut self) -> Option<Touched> {
        self.touched.replace(Touched::default())
    }

    fn touch(&mut self) -> Option<&mut Touched> {
        self.touched.as_mut()
    }

    /// Plans everything anew: the filtered ports of `plans`.
    pub fn full(&mut self, cache: &Cache, plans: &BTreeMap<String, NetworkPlan>) {
        *self = Planner::default();
        for n in plans.values() {
            let local = n.ports.values().map(|p| (&p.id, &p.host_veth));
            for (id, veth) in local.chain(&n.external) {
                if let Some(f) = filter(cache, id, veth, &n.bridge) {
                    self.want.ports.insert(id.clone(), f);
                }
            }
        }
        self.regroup(cache);
    }

    /// Plans again what the changed ports `ids` touch: their own filter when they are
    /// plugged here, and their addresses in the member sets.
    pub fn ports<'a>(
        &mut self,
        cache: &Cache,
        plans: &BTreeMap<String, NetworkPlan>,
        ids: impl IntoIterator<Item = &'a String>,
    ) {
        for id in ids {
            let here = cache.ports.get(id).and_then(|p| {
                let n = plans.get(&p.network_id)?;
                let veth = n.ports.get(id).map(|p| &p.host_veth);
                filter(cache, id, veth.or(n.external.get(id))?, &n.bridge)
            });
            match here {
                Some(f) => self.want.ports.insert(id.clone(), f),
                None => self.want.ports.remove(id),
            };
            if let Some(t) = self.touch() {
                t.ports.insert(id.clone());
            }
            self.recount(cache, id);
        }
        self.regroup(cache);
    }

    /// Takes port `id`'s addresses out of the member sets and puts them in again as
    /// the cache has the port now.
    fn recount(&mut self, cache: &Cache, id: &str) {
        for (g, a) in self.counted.remove(id).unwrap_or_default() {
            let key = (g, a);
            let n = self.counts.get_mut(&key).expect("counted with the port");
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&key);
                if let Some(set) = self.want.members.get_mut(&key.0) {
                    set.remove(&key.1);
                }
                if let Some(t) = self.touch() {
                    t.members.insert(key);
                }
            }
        }
        let Some(port) = cache.ports.get(id) else {
            return;
        };
        let groups: Vec<String> = port
            .security_groups
            .iter()
            .filter(|g| self.want.members.contains_key(*g))
            .cloned()
            .collect();
        for g in groups {
            self.count_in(cache, id, &g);
        }
    }

    /// Makes the groups those of this host's filtered ports, and the member sets those
    /// of the groups their rules name: a group that comes is read from the cache, one
    /// that goes is dropped.
    fn regroup(&mut self, cache: &Cache) {
        let used: BTreeSet<String> = self
            .want
            .ports
            .values()
            .flat_map(|p| p.groups.iter().cloned())
            .collect();
        let unused: Vec<String> = self
            .want
            .groups
            .keys()
            .filter(|g| !used.contains(*g))
            .cloned()
            .collect();
        for g in unused {
            self.want.groups.remove(&g);
            if let Some(t) = self.touch() {
                t.groups.insert(g);
            }
        }
        for g in used {
            if !self.want.groups.contains_key(&g) {
                self.want.groups.insert(g.clone(), group(cache, &g));
                if let Some(t) = self.touch() {
                    t.groups.insert(g);
                }
            }
        }
        let remotes: BTreeSet<String> = self
            .want
            .groups
            .values()
            .flat_map(|g| g.ingress.iter().chain(&g.egress))
            .filter_map(|r| match &r.remote {
                Remote::Group(g) => Some(g.clone()),
                _ => None,
            })
            .collect();
        let gone: Vec<String> = self
            .want
            .members
            .keys()
            .filter(|g| !remotes.contains(*g))
            .cloned()
            .collect();
        for g in gone {
            self.want.members.remove(&g);
            if let Some(t) = self.touch() {
                t.groups.insert(g.clone());
            }
            self.counts.retain(|(group, _), _| *group != g);
            for pairs in self.counted.values_mut() {
                pairs.retain(|(group, _)| *group != g);
            }
            self.counted.retain(|_, pairs| !pairs.is_empty());
        }
        for g in remotes {
            if self.want.members.contains_key(&g) {
                continue;
            }
            self.want.members.insert(g.clone(), BTreeSet::new());
            if let Some(t) = self.touch() {
                t.groups.insert(g.clone());
            }
            let members: Vec<String> = cache
                .group_ports
                .get(&g)
                .into_iter()
                .flatten()
                .cloned()
                .collect();
            for id in members {
                self.count_in(cache, &id, &g);
            }
        }
    }

    /// Counts port `id`'s addresses into group `g`'s member set (which must exist).
    fn count_in(&mut self, cache: &Cache, id: &str, g: &str) {
        let Some(port) = cache.ports.get(id) else {
            return;
        };
        for a in host_addresses(port) {
            *self.counts.entry((g.to_string(), a)).or_default() += 1;
            self.want
                .members
                .get_mut(g)
                .expect("made by the caller")
                .insert(a);
            self.counted
                .entry(id.to_string())
                .or_default()
                .push((g.to_string(), a));
            if let Some(t) = self.touch() {
                t.members.insert((g.to_string(), a));
            }
        }
    }
}

/// Port `id`'s filter when its port security is on, plugged as `veth` on `bridge`.
fn filter(cache: &Cache, id: &str, veth: &str, bridge: &str) -> Option<PortFilter> {
    let port = cache.ports.get(id).filter(|p| p.port_security_enabled)?;
    let f = port_filter(cache, port, veth, bridge);
    if f.is_none() {
        tracing::warn!(port = %id, mac = %port.mac_address, "not filtered: its MAC cannot be read");
    }
    f
}

/// A port's single addresses (fixed IPs and allowed pairs of one address): what a
/// member set holds of it.
fn host_addresses(p: &Port) -> impl Iterator<Item = IpAddr> {
    addresses(p).into_iter().filter(is_host).map(|a| a.addr())
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
    // 0 (`ip`, `hopopt`) is any protocol to Neutron's drivers, which leave it out.
    .filter(|p| *p != 0)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::{cache, port};
    use corvid_api::{EventKind, WatchEvent};
    use serde_json::json;

    fn event(resource: &str, id: &str, object: serde_json::Value) -> WatchEvent {
        WatchEvent {
            revision: 1,
            kind: EventKind::Put,
            resource: resource.into(),
            id: id.into(),
            object,
        }
    }

    fn rule(id: &str, group: &str, remote: &str) -> WatchEvent {
        event(
            "security_group_rules",
            id,
            json!({"id": id, "security_group_id": group, "direction": "ingress",
                "ethertype": "IPv4", "protocol": "tcp", "port_range_min": 80,
                "port_range_max": 80, "remote_ip_prefix": null, "normalized_cidr": null,
                "remote_group_id": remote, "description": "", "tenant_id": "p",
                "project_id": "p", "created_at": "", "updated_at": "", "revision_number": 0}),
        )
    }

    fn parsed(rule: serde_json::Value) -> Option<Rule> {
        let mut base = json!({"id": "r", "security_group_id": "g", "direction": "ingress",
            "ethertype": "IPv4", "protocol": null, "port_range_min": null,
            "port_range_max": null, "remote_ip_prefix": null, "normalized_cidr": null,
            "remote_group_id": null, "description": "", "tenant_id": "p",
            "project_id": "p", "created_at": "", "updated_at": "", "revision_number": 0});
        base.as_object_mut()
            .unwrap()
            .extend(rule.as_object().unwrap().clone());
        super::rule(&serde_json::from_value(base).unwrap())
    }

    /// Rules read as Neutron's drivers read them: protocol names and numbers, `0` and
    /// `any` for any protocol, `icmp` on IPv6 as ipv6-icmp, ports only where the
    /// protocol has them, ICMP's type and code, the normalized prefix.
    #[test]
    fn rules_are_read_as_neutron_reads_them() {
        let r = parsed(json!({"protocol": "TCP", "port_range_min": 80})).unwrap();
        assert_eq!(
            (r.protocol, r.ports, r.icmp),
            (Some(6), Some((80, 80)), None)
        );
        for any in ["0", "ip", "hopopt", "any"] {
            assert_eq!(
                parsed(json!({"protocol": any})).unwrap().protocol,
                None,
                "{any}"
            );
        }
        let r = parsed(json!({"ethertype": "IPv6", "protocol": "icmp",
            "port_range_min": 128, "port_range_max": 0}))
        .unwrap();
        assert_eq!(
            (r.v6, r.protocol, r.icmp),
            (true, Some(58), Some((128, Some(0))))
        );
        assert_eq!(r.ports, None);
        // GRE has no ports: a range given is not matched as one.
        let r = parsed(json!({"protocol": "47", "port_range_min": 1})).unwrap();
        assert_eq!((r.protocol, r.ports), (Some(47), None));
        let r = parsed(json!({"remote_ip_prefix": "10.0.0.5/24",
            "normalized_cidr": "10.0.0.0/24"}))
        .unwrap();
        assert_eq!(r.remote, Remote::Prefix("10.0.0.0/24".parse().unwrap()));
        let r = parsed(json!({"remote_group_id": "g2"})).unwrap();
        assert_eq!(r.remote, Remote::Group("g2".into()));
        assert!(parsed(json!({"protocol": "no-such"})).is_none());
    }

    /// A port change planned alone leaves the planner where planning everything would:
    /// a long walk of group changes, port security flips, readdressing and deletions.
    #[test]
    fn a_port_change_planned_alone_equals_a_full_plan() {
        let mut c = cache();
        c.apply(&[
            rule("r1", "g1", "g2"),
            rule("r2", "g2", "g1"),
            rule("r3", "g3", "g3"),
        ]);
        let mut planner = Planner::default();
        planner.full(&c, &crate::plan::plan(&c, "h1".into(), false));
        let mut held = planner.want().clone();
        planner.take_touched();
        let groups = [vec![], vec!["g1"], vec!["g2"], vec!["g1", "g2"], vec!["g3"]];
        let ids = ["p01", "p02", "p03", "p04", "p05"];
        let mut seed = 7u64;
        let mut seen = (false, false);
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize % n
        };
        for step in 0..400 {
            let id = ids[next(ids.len())];
            // Two ports plugged here (p01, p03), so groups are shared and left.
            let ns = match id {
                "p01" => Some("/run/netns/a"),
                "p03" => Some("/run/netns/c"),
                _ => None,
            };
            let host = ["h1", "h2", "h1", "h3", ""][id[2..].parse::<usize>().unwrap() - 1];
            let mut p =
                serde_json::to_value(port(id, host, &format!("10.1.0.{}", 5 + next(3)), ns))
                    .unwrap();
            p["port_security_enabled"] = json!(next(4) != 0);
            p["security_groups"] = json!(groups[next(groups.len())]);
            if next(3) == 0 {
                p["allowed_address_pairs"] = json!([{"ip_address": "10.1.0.100"}]);
            }
            let mut e = event("ports", id, p);
            if next(6) == 0 {
                e.kind = EventKind::Delete;
            }
            let dirty = c.apply(&[e]);
            let plans = crate::plan::plan(&c, "h1".into(), false);
            if next(5) == 0 {
                // The network planned again, with no port named: its ports are found.
                let n1 = BTreeSet::from(["n1".to_string()]);
                let skipped: BTreeSet<String> = dirty
                    .ports
                    .iter()
                    .filter(|p| *p != "p01" && *p != "p03")
                    .cloned()
                    .collect();
                planner.changes(&c, &plans, &skipped, &n1);
            } else {
                planner.changes(&c, &plans, &dirty.ports, &BTreeSet::new());
            }
            let mut full = Planner::default();
            full.full(&c, &plans);
            assert_eq!(planner.want(), full.want(), "step {step}: {id}");
            // What the planner says it touched is all that changed: the filter's sync
            // looks at nothing else.
            match planner.take_touched() {
                Some(t) => held.follow(planner.want(), &t),
                None => held = planner.want().clone(),
            }
            assert_eq!(&held, planner.want(), "step {step}: {id}, touched");
            seen.0 |= planner.want().ports.len() == 2;
            seen.1 |= planner.want().members.values().any(|m| m.len() >= 2);
        }
        // The walk went through two filtered ports at once and shared member sets.
        assert_eq!(seen, (true, true));
    }
}
