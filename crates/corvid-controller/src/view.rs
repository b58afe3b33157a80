//! The controller's in-memory copy of the store, kept current by one store watch. Reads
//! and list filters are served from here; writes go to the store as compare-and-swap
//! transactions and count only once the view has applied them, so the store stays the
//! single source of truth even with several controllers on one etcd.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;

use corvid_api::{
    EventKind, FloatingIp, Host, Network, Port, Router, SecurityGroup, SecurityGroupRule, Subnet,
    SubnetPool,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::keys::{self, Parsed};
use crate::store::{Event, KeyValue};
use crate::wakers::Touched;

/// How many changes the watch feed keeps for agents to resume from.
pub const FEED_LEN: usize = 10_000;

/// The Octavia collections, stored as plain JSON objects.
pub const LBAAS: [&str; 4] = ["loadbalancers", "listeners", "pools", "members"];

/// One object with the store revisions its compare-and-swap writes check.
#[derive(Debug)]
pub struct Entry<T> {
    /// The object.
    pub obj: Arc<T>,
    /// Store revision that created the key.
    pub create_revision: i64,
    /// Store revision of its last change.
    pub mod_revision: i64,
}

impl<T> Clone for Entry<T> {
    fn clone(&self) -> Self {
        Entry {
            obj: self.obj.clone(),
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
        }
    }
}

/// Objects of one collection by ID. The ID is shared (`Arc<str>`) with the port indexes,
/// so 100k ports do not hold five copies of every ID.
pub type Table<T> = HashMap<Arc<str>, Entry<T>>;

/// One change of the watch feed, kept as JSON text until someone asks for it.
#[derive(Debug, Clone)]
pub struct FeedEntry {
    /// Store revision.
    pub revision: i64,
    /// Created or updated, or deleted.
    pub kind: EventKind,
    /// Collection name.
    pub resource: Arc<str>,
    /// Object ID.
    pub id: Arc<str>,
    /// The object (after a put, before a delete) as JSON text: a parsed tree of each of
    /// the feed's 10,000 entries would cost several times as much.
    pub object: Arc<RawValue>,
    /// Hosts the change concerns (a port's binding before and after).
    pub hosts: Vec<String>,
}

/// Secondary indexes of ports, for the filters adapters use on every call.
#[derive(Debug, Default)]
pub struct PortIndex {
    by: HashMap<&'static str, HashMap<String, Ids>>,
}

/// The ports holding one indexed value. Most device IDs and names belong to one port
/// only, and a set for each would cost more than the port itself.
#[derive(Debug)]
enum Ids {
    One(Arc<str>),
    Many(HashSet<Arc<str>>),
}

impl Ids {
    fn insert(&mut self, id: Arc<str>) {
        match self {
            Ids::One(first) if *first == id => {}
            Ids::One(first) => *self = Ids::Many(HashSet::from([first.clone(), id])),
            Ids::Many(set) => {
                set.insert(id);
            }
        }
    }

    /// Removes `id`; true when none is left.
    fn remove(&mut self, id: &str) -> bool {
        match self {
            Ids::One(first) => &**first == id,
            Ids::Many(set) => {
                set.remove(id);
                set.is_empty()
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Arc<str>> {
        let (one, many) = match self {
            Ids::One(id) => (Some(id), None),
            Ids::Many(set) => (None, Some(set.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

/// Port attributes with an index.
pub const INDEXED: [&str; 4] = ["device_id", "network_id", "binding:host_id", "name"];

fn indexed_values(p: &Port) -> [(&'static str, &str); 4] {
    [
        ("device_id", &p.device_id),
        ("network_id", &p.network_id),
        ("binding:host_id", &p.binding_host_id),
        ("name", &p.name),
    ]
}

impl PortIndex {
    fn insert(&mut self, id: &Arc<str>, p: &Port) {
        for (attr, v) in indexed_values(p) {
            let m = self.by.entry(attr).or_default();
            match m.get_mut(v) {
                Some(ids) => ids.insert(id.clone()),
                None => {
                    m.insert(v.to_string(), Ids::One(id.clone()));
                }
            }
        }
    }

    fn remove(&mut self, p: &Port) {
        for (attr, v) in indexed_values(p) {
            if let Some(m) = self.by.get_mut(attr) {
                if m.get_mut(v).is_some_and(|ids| ids.remove(&p.id)) {
                    m.remove(v);
                }
            }
        }
    }

    /// IDs of ports whose `attr` is one of `values`; `None` if `attr` has no index.
    pub fn lookup(&self, attr: &str, values: &[String]) -> Option<HashSet<Arc<str>>> {
        if !INDEXED.contains(&attr) {
            return None;
        }
        let m = self.by.get(attr);
        let mut out = HashSet::new();
        for v in values {
            if let Some(ids) = m.and_then(|m| m.get(v)) {
                out.extend(ids.iter().cloned());
            }
        }
        Some(out)
    }
}

/// Everything the controller knows, at `revision`.
#[derive(Debug, Default)]
pub struct View {
    /// The store revision applied last.
    pub revision: i64,
    /// Networks.
    pub networks: Table<Network>,
    /// Subnets.
    pub subnets: Table<Subnet>,
    /// Subnet pools.
    pub subnetpools: Table<SubnetPool>,
    /// Ports.
    pub ports: Table<Port>,
    /// Floating IPs.
    pub floatingips: Table<FloatingIp>,
    /// Routers.
    pub routers: Table<Router>,
    /// Security groups, as stored: without their rules.
    pub security_groups: Table<SecurityGroup>,
    /// Security group rules.
    pub security_group_rules: Table<SecurityGroupRule>,
    /// The rules of each security group by ID, so in creation order (IDs are time-ordered).
    pub group_rules: HashMap<String, BTreeSet<Arc<str>>>,
    /// Hosts with an agent.
    pub hosts: Table<Host>,
    /// Octavia objects by collection.
    pub lbaas: HashMap<&'static str, Table<Value>>,
    /// Taken addresses by subnet.
    pub ips: HashMap<String, HashSet<IpAddr>>,
    /// MACs in use.
    pub macs: HashSet<String>,
    /// Port indexes.
    pub port_index: PortIndex,
    /// Recent changes for the watch feed.
    pub feed: VecDeque<FeedEntry>,
    /// The oldest revision the feed can resume from.
    pub feed_start: i64,
    /// The revision of the last entry trimmed from the feed that every filter passes (or
    /// of the load), and of the last one of each host's ports: a poll filtered on a host
    /// resumes from further back than `feed_start` when nothing it wants was trimmed.
    trimmed: (i64, HashMap<String, i64>),
}

fn put<T: DeserializeOwned>(table: &mut Table<T>, kv: &KeyValue, id: Arc<str>) -> Option<Arc<T>> {
    let obj: T = serde_json::from_slice(&kv.value).ok()?;
    let obj = Arc::new(obj);
    table.insert(
        id,
        Entry {
            obj: obj.clone(),
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
        },
    );
    Some(obj)
}

fn json<T: Serialize>(obj: &T) -> Option<Box<RawValue>> {
    serde_json::value::to_raw_value(obj).ok()
}

/// The stored JSON text of a put, for the feed: it is what `json` of the parsed object
/// would write again, without the second pass.
fn stored_json(kv: &KeyValue) -> Option<Box<RawValue>> {
    RawValue::from_string(String::from_utf8(kv.value.clone()).ok()?).ok()
}

impl View {
    /// How many objects of each kind the view holds.
    pub fn counts(&self) -> Vec<(&'static str, usize)> {
        let mut counts = vec![
            ("networks", self.networks.len()),
            ("subnets", self.subnets.len()),
            ("subnetpools", self.subnetpools.len()),
            ("ports", self.ports.len()),
            ("floatingips", self.floatingips.len()),
            ("routers", self.routers.len()),
            ("security_groups", self.security_groups.len()),
            ("security_group_rules", self.security_group_rules.len()),
            ("hosts", self.hosts.len()),
        ];
        counts.extend(self.lbaas.iter().map(|(kind, t)| (*kind, t.len())));
        counts
    }

    /// The rules of security group `group`, oldest first.
    pub fn rules_of<'a>(&'a self, group: &str) -> impl Iterator<Item = &'a Arc<SecurityGroupRule>> {
        self.group_rules
            .get(group)
            .into_iter()
            .flatten()
            .filter_map(|id| self.security_group_rules.get(id).map(|e| &e.obj))
    }

    /// A view of a full `range` of the store at `revision`.
    pub fn load(kvs: Vec<KeyValue>, revision: i64) -> View {
        let mut v = View {
            feed_start: revision + 1,
            trimmed: (revision, HashMap::new()),
            ..View::default()
        };
        for kv in kvs {
            v.apply_one(&Event::Put(kv), false);
        }
        v.revision = revision;
        v
    }

    /// Applies the changes of one store revision.
    pub fn apply(&mut self, events: &[Event]) {
        for e in events {
            self.apply_one(e, true);
            self.revision = self.revision.max(e.revision());
        }
        while self.feed.len() > FEED_LEN {
            if let Some(old) = self.feed.pop_front() {
                self.feed_start = old.revision + 1;
                if &*old.resource == "ports" {
                    for h in &old.hosts {
                        self.trimmed.1.insert(h.clone(), old.revision);
                    }
                } else {
                    self.trimmed.0 = old.revision;
                }
            }
        }
    }

    /// The oldest revision a poll filtered on `host` (or not) can resume from: a host's
    /// poll that no change of its own woke is not sent back to list everything because
    /// other hosts' changes went through the feed meanwhile.
    pub fn feed_start_for(&self, host: Option<&str>) -> i64 {
        match host {
            None => self.feed_start,
            Some(h) => {
                self.trimmed
                    .0
                    .max(self.trimmed.1.get(h).copied().unwrap_or(0))
                    + 1
            }
        }
    }

    /// Whom the feed's entries after `revision` concern.
    pub fn touched_since(&self, revision: i64) -> Touched {
        let mut touched = Touched::default();
        for e in self.feed.iter().rev().take_while(|e| e.revision > revision) {
            if &*e.resource == "ports" {
                touched.hosts.extend(e.hosts.iter().cloned());
            } else {
                touched.all = true;
            }
        }
        touched
    }

    fn apply_one(&mut self, e: &Event, record: bool) {
        let (kv, deleted) = match e {
            Event::Put(kv) => (kv, false),
            Event::Delete(kv) => (kv, true),
        };
        match keys::parse(&kv.key) {
            Parsed::Ip(subnet, ip) => {
                let set = self.ips.entry(subnet.to_string()).or_default();
                if deleted {
                    set.remove(&ip);
                } else {
                    set.insert(ip);
                }
            }
            Parsed::Mac(mac) => {
                if deleted {
                    self.macs.remove(mac);
                } else {
                    self.macs.insert(mac.to_string());
                }
            }
            Parsed::Resource(coll, id) => {
                let (object, hosts) = self.apply_resource(coll, id, kv, deleted);
                if let (true, Some(object)) = (record, object) {
                    self.feed.push_back(FeedEntry {
                        revision: kv.mod_revision,
                        kind: if deleted {
                            EventKind::Delete
                        } else {
                            EventKind::Put
                        },
                        resource: coll.into(),
                        id: id.into(),
                        object: object.into(),
                        hosts,
                    });
                }
            }
            Parsed::Other => {}
        }
    }

    /// Updates one collection; returns the object for the feed and the hosts it concerns.
    fn apply_resource(
        &mut self,
        coll: &str,
        id: &str,
        kv: &KeyValue,
        deleted: bool,
    ) -> (Option<Box<RawValue>>, Vec<String>) {
        macro_rules! plain {
            ($table:expr) => {{
                let old = $table.remove(id).and_then(|e| json(&*e.obj));
                if deleted {
                    (old, Vec::new())
                } else {
                    (
                        put(&mut $table, kv, id.into()).and_then(|_| stored_json(kv)),
                        Vec::new(),
                    )
                }
            }};
        }
        match coll {
            "networks" => plain!(self.networks),
            "subnets" => plain!(self.subnets),
            "subnetpools" => plain!(self.subnetpools),
            "floatingips" => plain!(self.floatingips),
            "routers" => plain!(self.routers),
            "security_groups" => plain!(self.security_groups),
            "security_group_rules" => {
                let old = self.security_group_rules.remove(id).map(|e| {
                    let group = &e.obj.security_group_id;
                    if let Some(rules) = self.group_rules.get_mut(group.as_str()) {
                        rules.remove(id);
                        if rules.is_empty() {
                            self.group_rules.remove(group.as_str());
                        }
                    }
                    e.obj
                });
                if deleted {
                    return (old.and_then(|o| json(&*o)), Vec::new());
                }
                let key: Arc<str> = id.into();
                let new = put(&mut self.security_group_rules, kv, key.clone());
                if let Some(r) = &new {
                    self.group_rules
                        .entry(r.security_group_id.clone())
                        .or_default()
                        .insert(key);
                }
                (new.and_then(|_| stored_json(kv)), Vec::new())
            }
            "hosts" => plain!(self.hosts),
            "ports" => {
                let mut hosts = Vec::new();
                let old = self.ports.remove(id).map(|e| {
                    self.port_index.remove(&e.obj);
                    hosts.push(e.obj.binding_host_id.clone());
                    e.obj
                });
                if deleted {
                    return (old.and_then(|o| json(&*o)), hosts);
                }
                let key: Arc<str> = id.into();
                let new = put(&mut self.ports, kv, key.clone());
                if let Some(p) = &new {
                    self.port_index.insert(&key, p);
                    if !hosts.contains(&p.binding_host_id) {
                        hosts.push(p.binding_host_id.clone());
                    }
                }
                (new.and_then(|_| stored_json(kv)), hosts)
            }
            other => match LBAAS.iter().find(|c| **c == other) {
                Some(c) => plain!(self.lbaas.entry(c).or_default()),
                None => (None, Vec::new()),
            },
        }
    }
}
