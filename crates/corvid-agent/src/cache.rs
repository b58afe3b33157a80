//! The agent's copy of what the controller knows and this host needs: networks, subnets,
//! ports, hosts, load balancers and floating IPs, loaded by listing and kept current by the
//! watch feed.

use std::collections::{BTreeSet, HashMap};

use corvid_api::{
    ApiError, Client, EventKind, FloatingIp, Host, Listener, LoadBalancer, Member, Network, Pool,
    Port, Resource, Subnet, WatchEvent,
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
    /// Whether a change since the last look concerned services or floating IPs.
    pub services_changed: bool,
}

/// Which networks a batch of changes touched.
#[derive(Debug, Default, PartialEq)]
pub enum Dirty {
    /// Nothing this host cares about.
    #[default]
    None,
    /// These networks.
    Networks(BTreeSet<String>),
    /// Everything (a host moved or left).
    All,
}

impl Dirty {
    /// What either touched.
    pub fn merge(self, other: Dirty) -> Dirty {
        match (self, other) {
            (Dirty::All, _) | (_, Dirty::All) => Dirty::All,
            (Dirty::None, d) | (d, Dirty::None) => d,
            (Dirty::Networks(mut a), Dirty::Networks(b)) => {
                a.extend(b);
                Dirty::Networks(a)
            }
        }
    }

    fn network(&mut self, id: &str) {
        match self {
            Dirty::All => {}
            Dirty::Networks(set) => {
                set.insert(id.to_string());
            }
            Dirty::None => *self = Dirty::Networks(BTreeSet::from([id.to_string()])),
        }
    }
}

fn list<R: Resource>(client: &Client) -> Result<(HashMap<String, R>, i64), ApiError> {
    let (objs, revision) = client.list::<R>(&[])?;
    Ok((
        objs.into_iter().map(|o| (o.id().to_string(), o)).collect(),
        revision,
    ))
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
        Ok(Cache {
            revision: [r1, r2, r3, r4, r5, r6, r7, r8, r9]
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
            services_changed: true,
        })
    }

    /// Applies watch events and reports what they touched.
    pub fn apply(&mut self, events: &[WatchEvent]) -> Dirty {
        let mut dirty = Dirty::None;
        for e in events {
            match e.resource.as_str() {
                "networks" => {
                    upsert(&mut self.networks, e);
                    dirty.network(&e.id);
                }
                "subnets" => {
                    let old = upsert(&mut self.subnets, e);
                    if let Some(n) = network_of(&e.object) {
                        dirty.network(n);
                    }
                    if let Some(old) = old {
                        dirty.network(&old.network_id);
                    }
                }
                "ports" => {
                    let old = upsert(&mut self.ports, e);
                    if let Some(n) = network_of(&e.object) {
                        dirty.network(n);
                    }
                    if let Some(old) = old {
                        dirty.network(&old.network_id);
                    }
                }
                "hosts" => {
                    upsert(&mut self.hosts, e);
                    dirty = Dirty::All;
                }
                "loadbalancers" => self.service_event(|c| upsert(&mut c.loadbalancers, e)),
                "listeners" => self.service_event(|c| upsert(&mut c.listeners, e)),
                "pools" => self.service_event(|c| upsert(&mut c.pools, e)),
                "members" => self.service_event(|c| upsert(&mut c.members, e)),
                "floatingips" => self.service_event(|c| upsert(&mut c.floatingips, e)),
                _ => {}
            }
        }
        dirty
    }
}

impl Cache {
    fn service_event<T>(&mut self, apply: impl FnOnce(&mut Cache) -> T) {
        apply(self);
        self.services_changed = true;
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
    fn port_events_dirty_their_network_and_hosts_dirty_everything() {
        let mut c = Cache::default();
        let d = c.apply(&[event(
            EventKind::Put,
            "ports",
            "p1",
            json!({"id": "p1", "network_id": "n1"}),
        )]);
        assert_eq!(d, Dirty::Networks(BTreeSet::from(["n1".to_string()])));
        let d = c.apply(&[event(
            EventKind::Put,
            "hosts",
            "h",
            json!({"id": "h", "underlay_ip": "10.0.0.1", "created_at": "", "updated_at": "", "revision_number": 1}),
        )]);
        assert_eq!(d, Dirty::All);
        assert!(c.hosts.contains_key("h"));
        c.services_changed = false;
        assert_eq!(
            c.apply(&[event(
                EventKind::Put,
                "loadbalancers",
                "x",
                json!({"id": "x"})
            )]),
            Dirty::None
        );
        assert!(c.services_changed && c.loadbalancers.contains_key("x"));
    }

    #[test]
    fn merged_dirt_covers_both() {
        let nets = |ids: &[&str]| Dirty::Networks(ids.iter().map(|s| s.to_string()).collect());
        assert_eq!(nets(&["a"]).merge(nets(&["b"])), nets(&["a", "b"]));
        assert_eq!(Dirty::None.merge(nets(&["a"])), nets(&["a"]));
        assert_eq!(nets(&["a"]).merge(Dirty::None), nets(&["a"]));
        assert_eq!(nets(&["a"]).merge(Dirty::All), Dirty::All);
        assert_eq!(Dirty::None.merge(Dirty::None), Dirty::None);
    }
}
