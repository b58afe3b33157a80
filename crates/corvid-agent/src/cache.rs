//! The agent's copy of what the controller knows and this host needs: networks, subnets,
//! ports, hosts, load balancers, floating IPs, routers and security groups, loaded by
//! listing and kept current by the watch feed.

use std::collections::{BTreeSet, HashMap};

use corvid_api::{
    ApiError, Client, EventKind, FloatingIp, Host, Listener, LoadBalancer, Member, Network, Pool,
    Port, Resource, Router, SecurityGroup, SecurityGroupRule, Subnet, WatchEvent, ROUTER_INTERFACE,
};
use serde_json::Value;

/// Controller objects by ID, current at `revision`.
#[derive(Debug, Default, Clone)]
pub struct Cache {
    /// The revision to resume the watch from.
    pub revision: i64,
    /// Networks.
    pub networks: HashMap<String, Network>,
    /// Subnets.
    pub subnets: HashMap<String, Subnet>,
    /// Ports of every host (remote ones feed the overlay).
    pub ports: HashMap<String, Port>,
    /// Hosts with an agent.
    pub hosts: HashMap<String, Host>,
    /// Load balancers, served on every host.
    pub loadbalancers: HashMap<String, LoadBalancer>,
    /// Their listeners.
    pub listeners: HashMap<String, Listener>,
    /// Their pools.
    pub pools: HashMap<String, Pool>,
    /// The pools' members.
    pub members: HashMap<String, Member>,
    /// Floating IPs.
    pub floatingips: HashMap<String, FloatingIp>,
    /// Routers.
    pub routers: HashMap<String, Router>,
    /// Security groups (without their rules, which come one by one).
    pub security_groups: HashMap<String, SecurityGroup>,
    /// Security group rules.
    pub security_group_rules: HashMap<String, SecurityGroupRule>,
    /// Rule IDs by group, and port IDs by group: a group's rules and members without a
    /// scan.
    pub group_rules: HashMap<String, BTreeSet<String>>,
    /// Port IDs by the security groups they are in.
    pub group_ports: HashMap<String, BTreeSet<String>>,
    /// Which listeners (services) changed since the last look.
    pub services_changed: Changed,
    /// Listeners by load balancer, pools by listener, members by pool.
    pub index: ServiceIndex,
    /// Port IDs by network, so planning one network does not scan every port.
    pub network_ports: HashMap<String, BTreeSet<String>>,
    /// Interface port IDs by router, so a router's networks are found without a scan.
    pub router_ports: HashMap<String, BTreeSet<String>>,
}

/// The router a port is an interface of.
fn router_of(p: &Port) -> Option<&str> {
    (p.device_owner == ROUTER_INTERFACE && !p.device_id.is_empty()).then_some(p.device_id.as_str())
}

/// Which services changed since the agent last served them.
#[derive(Debug, Default, Clone, PartialEq)]
pub enum Changed {
    /// None.
    #[default]
    Nothing,
    /// These listeners.
    Listeners(BTreeSet<String>),
    /// Any of them, and the floating IPs: plan everything.
    All,
}

impl Changed {
    fn listener(&mut self, id: &str) {
        match self {
            Changed::All => {}
            Changed::Listeners(set) => {
                set.insert(id.to_string());
            }
            Changed::Nothing => *self = Changed::Listeners(BTreeSet::from([id.to_string()])),
        }
    }
}

/// The children of load balancers by parent, kept with the cache so that planning one
/// service does not scan them all.
#[derive(Debug, Default, Clone)]
pub struct ServiceIndex {
    /// Listener IDs by load balancer.
    pub listeners: HashMap<String, BTreeSet<String>>,
    /// Pool IDs by the listener they were made with.
    pub pools: HashMap<String, BTreeSet<String>>,
    /// Member IDs by pool.
    pub members: HashMap<String, BTreeSet<String>>,
    /// Floating IP IDs by the port they map to.
    pub floating: HashMap<String, BTreeSet<String>>,
}

/// Moves `id` from `old` parent's set to `new` parent's.
fn reindex(
    index: &mut HashMap<String, BTreeSet<String>>,
    id: &str,
    old: Option<&str>,
    new: Option<&str>,
) {
    if let Some(o) = old {
        if let Some(set) = index.get_mut(o) {
            set.remove(id);
            if set.is_empty() {
                index.remove(o);
            }
        }
    }
    if let Some(n) = new {
        index
            .entry(n.to_string())
            .or_default()
            .insert(id.to_string());
    }
}

/// What a batch of changes touched.
#[derive(Debug, Default, PartialEq)]
pub struct Dirty {
    /// Everything (a host came, moved or left, or a full pass is due).
    pub all: bool,
    /// Networks whose object or subnets changed: planned whole.
    pub networks: BTreeSet<String>,
    /// Ports that changed: planned one by one.
    pub ports: BTreeSet<String>,
    /// Routers whose interfaces or routes changed: their networks are looked at again.
    pub routers: BTreeSet<String>,
    /// A security group or rule changed (ports that changed are in `ports`).
    pub security: bool,
    /// The network each changed port was on before the change, for those the cache
    /// knew: where a deleted port is found without looking through every plan.
    pub was_on: HashMap<String, String>,
}

impl Dirty {
    /// Everything.
    pub fn all() -> Dirty {
        Dirty {
            all: true,
            ..Dirty::default()
        }
    }

    /// Nothing this host cares about.
    pub fn is_empty(&self) -> bool {
        !self.all
            && !self.security
            && self.networks.is_empty()
            && self.ports.is_empty()
            && self.routers.is_empty()
    }

    /// What either touched.
    pub fn merge(mut self, other: Dirty) -> Dirty {
        self.all |= other.all;
        self.security |= other.security;
        self.networks.extend(other.networks);
        self.ports.extend(other.ports);
        self.routers.extend(other.routers);
        for (port, network) in other.was_on {
            self.was_on.entry(port).or_insert(network);
        }
        self
    }
}

fn list<R: Resource>(client: &Client) -> Result<(HashMap<String, R>, i64), ApiError> {
    let (objs, revision) = client.list::<R>(&[])?;
    Ok((
        objs.into_iter().map(|o| (o.id().to_string(), o)).collect(),
        revision,
    ))
}

/// A list a controller from before the collection existed does not serve (404): none,
/// at a revision that leaves the others' the oldest.
fn list_if_served<R: Resource>(client: &Client) -> Result<(HashMap<String, R>, i64), ApiError> {
    match list(client) {
        Err(ApiError::Neutron { status: 404, .. }) => Ok((HashMap::new(), i64::MAX)),
        r => r,
    }
}

fn upsert<R: Resource>(table: &mut HashMap<String, R>, e: &WatchEvent) -> Option<R> {
    if e.kind == EventKind::Delete {
        return table.remove(&e.id);
    }
    match e.decode::<R>() {
        Ok(obj) => table.insert(e.id.clone(), obj),
        Err(_) => None,
    }
}

fn network_of(v: &Value) -> Option<&str> {
    v.get("network_id").and_then(Value::as_str)
}

impl Cache {
    /// Lists everything; the watch resumes from the oldest list's revision, so a change
    /// made between two lists is replayed rather than missed.
    pub fn load(client: &Client) -> Result<Cache, ApiError> {
        let (networks, r1) = list(client)?;
        let (subnets, r2) = list(client)?;
        let (ports, r3) = list(client)?;
        let (hosts, r4) = list(client)?;
        let (loadbalancers, r5) = list(client)?;
        let (listeners, r6) = list(client)?;
        let (pools, r7) = list(client)?;
        let (members, r8) = list(client)?;
        let (floatingips, r9) = list(client)?;
        let (routers, r10) = list(client)?;
        let (security_groups, r11) = list_if_served(client)?;
        let (security_group_rules, r12) = list_if_served(client)?;
        let mut cache = Cache {
            revision: [r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12]
                .into_iter()
                .min()
                .unwrap_or(0),
            networks,
            subnets,
            ports,
            hosts,
            loadbalancers,
            listeners,
            pools,
            members,
            floatingips,
            routers,
            security_groups,
            security_group_rules,
            group_rules: HashMap::new(),
            group_ports: HashMap::new(),
            services_changed: Changed::All,
            index: ServiceIndex::default(),
            network_ports: HashMap::new(),
            router_ports: HashMap::new(),
        };
        cache.reindex();
        Ok(cache)
    }

    /// Applies watch events and reports what they touched.
    pub fn apply(&mut self, events: &[WatchEvent]) -> Dirty {
        let mut dirty = Dirty::default();
        for e in events {
            match e.resource.as_str() {
                "networks" => {
                    upsert(&mut self.networks, e);
                    dirty.networks.insert(e.id.clone());
                }
                "subnets" => {
                    let old = upsert(&mut self.subnets, e);
                    if let Some(n) = network_of(&e.object) {
                        dirty.networks.insert(n.to_string());
                    }
                    if let Some(old) = old {
                        dirty.networks.insert(old.network_id);
                    }
                }
                "ports" => {
                    let old = upsert(&mut self.ports, e);
                    let new = self.ports.get(&e.id);
                    reindex(
                        &mut self.network_ports,
                        &e.id,
                        old.as_ref().map(|p| p.network_id.as_str()),
                        new.map(|p| p.network_id.as_str()),
                    );
                    let (was, is) = (old.as_ref().and_then(router_of), new.and_then(router_of));
                    reindex(&mut self.router_ports, &e.id, was, is);
                    let groups = |p: Option<&Port>| p.map(|p| p.security_groups.clone());
                    for g in groups(old.as_ref()).unwrap_or_default() {
                        reindex(&mut self.group_ports, &e.id, Some(&g), None);
                    }
                    for g in groups(new).unwrap_or_default() {
                        reindex(&mut self.group_ports, &e.id, None, Some(&g));
                    }
                    let snat = |r: Option<&str>| {
                        r.and_then(|r| self.routers.get(r))
                            .is_some_and(|r| r.external_gateway_info.is_some())
                    };
                    if snat(was) || snat(is) {
                        // The subnets its gateway SNATs changed.
                        self.services_changed = Changed::All;
                    }
                    if was.is_some() || is.is_some() {
                        // Its network's router changed: planned whole.
                        let nets = [old.as_ref(), new].into_iter().flatten();
                        dirty.networks.extend(nets.map(|p| p.network_id.clone()));
                    }
                    dirty
                        .routers
                        .extend([was, is].into_iter().flatten().map(str::to_string));
                    if let Some(old) = old {
                        dirty.was_on.entry(e.id.clone()).or_insert(old.network_id);
                    }
                    dirty.ports.insert(e.id.clone());
                }
                "routers" => {
                    let old = upsert(&mut self.routers, e);
                    dirty.routers.insert(e.id.clone());
                    // A new gateway moves the SNAT of its subnets; an interface change
                    // bumps the router's revision and leaves services alone.
                    let gateway = |r: Option<&Router>| r.map(|r| r.external_gateway_info.clone());
                    if gateway(old.as_ref()) != gateway(self.routers.get(&e.id)) {
                        self.services_changed = Changed::All;
                    }
                }
                "hosts" => {
                    upsert(&mut self.hosts, e);
                    dirty.all = true;
                }
                "security_groups" => {
                    upsert(&mut self.security_groups, e);
                    dirty.security = true;
                }
                "security_group_rules" => {
                    let old = upsert(&mut self.security_group_rules, e);
                    let new = self.security_group_rules.get(&e.id);
                    reindex(
                        &mut self.group_rules,
                        &e.id,
                        old.as_ref().map(|r| r.security_group_id.as_str()),
                        new.map(|r| r.security_group_id.as_str()),
                    );
                    dirty.security = true;
                }
                "loadbalancers" => {
                    upsert(&mut self.loadbalancers, e);
                    for l in self.index.listeners.get(&e.id).cloned().unwrap_or_default() {
                        self.services_changed.listener(&l);
                    }
                }
                "listeners" => {
                    let old = upsert(&mut self.listeners, e);
                    let new = self.listeners.get(&e.id);
                    reindex(
                        &mut self.index.listeners,
                        &e.id,
                        old.as_ref().map(|l| l.loadbalancer_id.as_str()),
                        new.map(|l| l.loadbalancer_id.as_str()),
                    );
                    self.services_changed.listener(&e.id);
                }
                "pools" => {
                    let old = upsert(&mut self.pools, e);
                    let new = self.pools.get(&e.id).cloned();
                    let (was, is) = (
                        old.as_ref().and_then(|p| p.listener_id.clone()),
                        new.as_ref().and_then(|p| p.listener_id.clone()),
                    );
                    reindex(&mut self.index.pools, &e.id, was.as_deref(), is.as_deref());
                    for pool in [old, new].into_iter().flatten() {
                        self.pool_changed(pool.listener_id.as_deref());
                    }
                }
                "members" => {
                    let old = upsert(&mut self.members, e);
                    let new = self.members.get(&e.id).map(|m| m.pool_id.clone());
                    let was = old.map(|m| m.pool_id);
                    reindex(
                        &mut self.index.members,
                        &e.id,
                        was.as_deref(),
                        new.as_deref(),
                    );
                    for pool in [was, new].into_iter().flatten() {
                        // A member of a pool not known (yet) serves nothing.
                        if let Some(listener) = self.pools.get(&pool).map(|p| p.listener_id.clone())
                        {
                            self.pool_changed(listener.as_deref());
                        }
                    }
                }
                "floatingips" => {
                    let old = upsert(&mut self.floatingips, e).and_then(|f| f.port_id);
                    let new = self.floatingips.get(&e.id).and_then(|f| f.port_id.clone());
                    reindex(
                        &mut self.index.floating,
                        &e.id,
                        old.as_deref(),
                        new.as_deref(),
                    );
                    self.services_changed = Changed::All;
                }
                _ => {}
            }
        }
        dirty
    }
}

impl Cache {
    /// A pool of `listener` changed; a pool made without a listener (named by a
    /// listener's `default_pool_id`) may be any listener's.
    fn pool_changed(&mut self, listener: Option<&str>) {
        match listener {
            Some(l) => self.services_changed.listener(l),
            None => self.services_changed = Changed::All,
        }
    }

    /// The ports of a network.
    pub fn ports_of<'a>(&'a self, network: &str) -> impl Iterator<Item = &'a Port> + 'a {
        self.network_ports
            .get(network)
            .into_iter()
            .flatten()
            .filter_map(|id| self.ports.get(id))
    }

    /// The networks router `id` has an interface on.
    pub fn router_networks(&self, id: &str) -> BTreeSet<&str> {
        self.router_ports
            .get(id)
            .into_iter()
            .flatten()
            .filter_map(|p| self.ports.get(p))
            .map(|p| p.network_id.as_str())
            .collect()
    }

    /// The routers that have interfaces.
    pub fn routers_with_interfaces(&self) -> impl Iterator<Item = &str> {
        self.router_ports.keys().map(String::as_str)
    }

    /// The router network `id` is routed by: the first of its subnets' routers (a
    /// network on several routers is routed by one; see docs/architecture.md).
    pub fn network_router(&self, id: &str) -> Option<&str> {
        self.ports_of(id).filter_map(router_of).min()
    }

    /// Builds the indexes: the service index from the load balancers' children, and the
    /// ports by network.
    pub fn reindex(&mut self) {
        self.network_ports = HashMap::new();
        self.router_ports = HashMap::new();
        self.group_ports = HashMap::new();
        for p in self.ports.values() {
            reindex(&mut self.network_ports, &p.id, None, Some(&p.network_id));
            reindex(&mut self.router_ports, &p.id, None, router_of(p));
            for g in &p.security_groups {
                reindex(&mut self.group_ports, &p.id, None, Some(g));
            }
        }
        self.group_rules = HashMap::new();
        for r in self.security_group_rules.values() {
            reindex(
                &mut self.group_rules,
                &r.id,
                None,
                Some(&r.security_group_id),
            );
        }
        self.index = ServiceIndex::default();
        for l in self.listeners.values() {
            reindex(
                &mut self.index.listeners,
                &l.id,
                None,
                Some(&l.loadbalancer_id),
            );
        }
        for p in self.pools.values() {
            reindex(&mut self.index.pools, &p.id, None, p.listener_id.as_deref());
        }
        for m in self.members.values() {
            reindex(&mut self.index.members, &m.id, None, Some(&m.pool_id));
        }
        for f in self.floatingips.values() {
            reindex(&mut self.index.floating, &f.id, None, f.port_id.as_deref());
        }
    }

    /// What changed since the last call.
    pub fn take_changed(&mut self) -> Changed {
        std::mem::take(&mut self.services_changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: EventKind, resource: &str, id: &str, object: Value) -> WatchEvent {
        WatchEvent {
            revision: 1,
            kind,
            resource: resource.into(),
            id: id.into(),
            object,
        }
    }

    #[test]
    fn port_events_dirty_their_port_and_hosts_dirty_everything() {
        let mut c = Cache::default();
        let d = c.apply(&[event(
            EventKind::Put,
            "ports",
            "p1",
            json!({"id": "p1", "network_id": "n1"}),
        )]);
        assert_eq!(d.ports, BTreeSet::from(["p1".to_string()]));
        assert!(!d.all && d.networks.is_empty());
        let d = c.apply(&[event(
            EventKind::Put,
            "hosts",
            "h",
            json!({"id": "h", "underlay_ip": "10.0.0.1", "created_at": "", "updated_at": "", "revision_number": 1}),
        )]);
        assert!(d.all);
        assert!(c.hosts.contains_key("h"));
        assert_eq!(
            c.apply(&[event(
                EventKind::Put,
                "listeners",
                "l",
                json!({"id": "l", "loadbalancer_id": "x", "protocol": "TCP", "protocol_port": 80})
            )]),
            Dirty::default()
        );
        let only_l = || Changed::Listeners(BTreeSet::from(["l".to_string()]));
        assert_eq!(c.take_changed(), only_l());
        // A load balancer's change is its listeners'; a member's, its pool's listener's.
        c.apply(&[event(
            EventKind::Put,
            "loadbalancers",
            "x",
            json!({"id": "x"}),
        )]);
        assert_eq!(c.take_changed(), only_l());
        c.apply(&[event(
            EventKind::Put,
            "pools",
            "p",
            json!({"id": "p", "listener_id": "l", "lb_algorithm": "ROUND_ROBIN"}),
        )]);
        assert_eq!(c.take_changed(), only_l());
        c.apply(&[event(
            EventKind::Put,
            "members",
            "m",
            json!({"id": "m", "pool_id": "p", "address": "10.0.0.5", "protocol_port": 80}),
        )]);
        assert_eq!(c.take_changed(), only_l());
        assert_eq!(c.index.members["p"], BTreeSet::from(["m".to_string()]));
        c.apply(&[event(EventKind::Delete, "members", "m", json!({}))]);
        assert_eq!(c.take_changed(), only_l());
        assert!(!c.index.members.contains_key("p"));
        assert_eq!(c.take_changed(), Changed::Nothing);
    }

    #[test]
    fn merged_dirt_covers_both() {
        let nets = |ids: &[&str]| Dirty {
            networks: ids.iter().map(|s| s.to_string()).collect(),
            ..Dirty::default()
        };
        assert_eq!(nets(&["a"]).merge(nets(&["b"])), nets(&["a", "b"]));
        assert_eq!(Dirty::default().merge(nets(&["a"])), nets(&["a"]));
        assert!(nets(&["a"]).merge(Dirty::all()).all);
        assert!(Dirty::default().merge(Dirty::default()).is_empty());
    }
}
