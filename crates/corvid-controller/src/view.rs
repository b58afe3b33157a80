//! The controller's in-memory copy of the store, kept current by one store watch. Reads
//! and list filters are served from here; writes go to the store as compare-and-swap
//! transactions and count only once the view has applied them, so the store stays the
//! single source of truth even with several controllers on one etcd.

use std::borrow::Borrow;
use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hash, RandomState};
use std::net::IpAddr;
use std::sync::Arc;

use compact_str::CompactString;
use corvid_api::{
    EventKind, FloatingIp, Host, Network, Port, Router, SecurityGroup, SecurityGroupRule, Subnet,
    SubnetPool,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::compact_port::{CompactPort, Interner};
use crate::keys::{self, Parsed};
use crate::store::{Event, KeyValue};
use crate::wakers::Touched;

/// How many changes the watch feed keeps for agents to resume from.
pub const FEED_LEN: usize = 10_000;

/// How many of the newest feed entries keep a port's JSON text. Polls that keep up are
/// answered from these, a port written once however many hosts it goes to; further back
/// a port is written again from its compact form, which its entry shares with the view
/// while the port is unchanged (the text of all 10,000 entries was about 11 MiB).
pub const FEED_TEXT_LEN: usize = 1_000;

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

impl Entry<CompactPort> {
    /// The entry with the port as the API shows it.
    pub fn expand(&self) -> Entry<Port> {
        Entry {
            obj: Arc::new(self.obj.expand()),
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
        }
    }
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

/// One change of the watch feed.
#[derive(Debug)]
pub struct FeedEntry {
    /// Store revision.
    pub revision: i64,
    /// Created or updated, or deleted.
    pub kind: EventKind,
    /// Collection name (shared with the view's other strings).
    pub resource: Arc<str>,
    /// Object ID.
    pub id: Arc<str>,
    /// The object, after a put or before a delete.
    pub object: FeedObject,
    /// Hosts the change concerns (a port's binding before and after).
    pub hosts: [Option<Arc<str>>; 2],
}

/// A feed entry's object, kept as JSON text until someone asks for it: a parsed tree of
/// each of the feed's 10,000 entries would cost several times as much.
#[derive(Debug)]
pub enum FeedObject {
    /// Anything but a port: its text.
    Text(Box<RawValue>),
    /// A port: its compact form, and its text while the entry is among the newest
    /// [`FEED_TEXT_LEN`].
    Port(Arc<CompactPort>, Option<Box<RawValue>>),
}

/// Written as the text when there is one, else as the port (the same JSON).
impl Serialize for FeedObject {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            FeedObject::Text(text) | FeedObject::Port(_, Some(text)) => text.serialize(s),
            FeedObject::Port(port, None) => port.serialize(s),
        }
    }
}

/// Secondary indexes of ports, for the filters adapters use on every call. They hold a
/// hash of each value, not the value: the port has it, and a lookup checks it there (names
/// and device IDs are mostly one port's own, and a copy of each was a tenth of the view).
/// Empty values are not indexed: most ports have no name, and a set of them all would cost
/// every port a slot for a filter nobody sends.
#[derive(Debug, Default)]
pub struct PortIndex {
    by: HashMap<&'static str, HashMap<u64, Ids>>,
    hasher: RandomState,
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

/// Addresses or MACs in use, counted: within one store revision a change may put the new
/// holder of an address before it deletes the old one, and the address stays taken.
#[derive(Debug)]
pub struct Taken<T>(HashMap<T, u32>);

impl<T> Default for Taken<T> {
    fn default() -> Self {
        Taken(HashMap::new())
    }
}

impl<T: Hash + Eq> Taken<T> {
    /// True when something holds `k`.
    pub fn contains<Q: Hash + Eq + ?Sized>(&self, k: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        self.0.contains_key(k)
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn add(&mut self, k: T) {
        *self.0.entry(k).or_default() += 1;
    }

    fn remove<Q: Hash + Eq + ?Sized>(&mut self, k: &Q)
    where
        T: Borrow<Q>,
    {
        if let Some(n) = self.0.get_mut(k) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(k);
            }
        }
    }
}

/// Port attributes with an index.
pub const INDEXED: [&str; 4] = ["device_id", "network_id", "binding:host_id", "name"];

fn indexed_values(p: &CompactPort) -> [(&'static str, &str); 4] {
    [
        ("device_id", &p.device_id),
        ("network_id", &p.network_id),
        ("binding:host_id", &p.binding_host_id),
        ("name", &p.name),
    ]
}

fn indexed_value<'a>(p: &'a CompactPort, attr: &str) -> Option<&'a str> {
    indexed_values(p)
        .into_iter()
        .find_map(|(a, v)| (a == attr).then_some(v))
}

impl PortIndex {
    fn insert(&mut self, id: &Arc<str>, p: &CompactPort) {
        for (attr, v) in indexed_values(p).into_iter().filter(|(_, v)| !v.is_empty()) {
            let h = self.hasher.hash_one(v);
            match self.by.entry(attr).or_default().entry(h) {
                MapEntry::Occupied(mut ids) => ids.get_mut().insert(id.clone()),
                MapEntry::Vacant(slot) => {
                    slot.insert(Ids::One(id.clone()));
                }
            }
        }
    }

    fn remove(&mut self, p: &CompactPort) {
        for (attr, v) in indexed_values(p).into_iter().filter(|(_, v)| !v.is_empty()) {
            let h = self.hasher.hash_one(v);
            if let Some(m) = self.by.get_mut(attr) {
                if m.get_mut(&h).is_some_and(|ids| ids.remove(&p.id)) {
                    m.remove(&h);
                }
            }
        }
    }

    /// IDs of the ports of `ports` whose `attr` is one of `values`; `None` if `attr` has
    /// no index or a value is empty.
    pub fn lookup(
        &self,
        ports: &Table<CompactPort>,
        attr: &str,
        values: &[String],
    ) -> Option<HashSet<Arc<str>>> {
        if !INDEXED.contains(&attr) || values.iter().any(String::is_empty) {
            return None;
        }
        let m = self.by.get(attr);
        let mut out = HashSet::new();
        for v in values {
            let h = self.hasher.hash_one(v.as_str());
            let ids = m.and_then(|m| m.get(&h)).into_iter().flat_map(Ids::iter);
            out.extend(
                ids.filter(|id| {
                    ports
                        .get(&***id)
                        .and_then(|e| indexed_value(&e.obj, attr))
                        .is_some_and(|x| x == v)
                })
                .cloned(),
            );
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
    /// Ports, compact: at 100,000 they are most of what the view holds.
    pub ports: Table<CompactPort>,
    /// The strings ports share.
    strings: Interner,
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
    /// Taken addresses by subnet: the ports' and the floating IPs'. The store's address
    /// and MAC keys say the same; the view works them out of the objects instead of
    /// reading them, which at 100,000 ports is two keys in three of a restart's load.
    pub ips: HashMap<Arc<str>, Taken<IpAddr>>,
    /// The ports' MACs (inline: a MAC's text fits).
    pub macs: Taken<CompactString>,
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
    let obj: T = parsed(kv)?;
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

/// The object a stored key holds; none, said in the log, when it does not parse (written
/// by another version, or by hand), since the view then goes on without it.
fn parsed<T: DeserializeOwned>(kv: &KeyValue) -> Option<T> {
    serde_json::from_slice(&kv.value)
        .map_err(|e| {
            tracing::warn!(key = %kv.key, error = %e, "a stored object does not parse: left out of the view");
        })
        .ok()
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
    pub fn load(kvs: impl IntoIterator<Item = KeyValue>, revision: i64) -> View {
        View::from_objects(kvs).at(revision)
    }

    /// The objects of a full `range` of the store, taken as they come; the view is whole
    /// once [`View::at`] says the revision they were read at.
    pub fn from_objects(kvs: impl IntoIterator<Item = KeyValue>) -> View {
        let mut v = View::default();
        for kv in kvs {
            v.apply_one(&Event::Put(kv), false);
        }
        // A floating IP's subnet is found through its network, which may load after it.
        let ports: Vec<_> = v.ports.values().map(|e| e.obj.clone()).collect();
        for p in ports {
            v.take_port(&p, true);
        }
        let fips: Vec<_> = v.floatingips.values().map(|e| e.obj.clone()).collect();
        for f in fips {
            v.take_floating_ip(&f, true);
        }
        v
    }

    /// The view as of `revision`, the one its objects were read at: its feed starts
    /// after it.
    pub fn at(mut self, revision: i64) -> View {
        self.feed_start = revision + 1;
        self.trimmed = (revision, HashMap::new());
        self.revision = revision;
        self
    }

    /// Counts the address and MAC of `p` as taken, or no longer.
    fn take_port(&mut self, p: &CompactPort, taken: bool) {
        for f in &p.fixed_ips {
            self.take_ip(&f.subnet_id, f.ip_address, taken);
        }
        if taken {
            self.macs.add(p.mac_address.clone());
        } else {
            self.macs.remove(p.mac_address.as_str());
        }
    }

    /// Counts the address of `f` as taken in its subnet, or no longer.
    fn take_floating_ip(&mut self, f: &FloatingIp, taken: bool) {
        let subnet = self
            .networks
            .get(f.floating_network_id.as_str())
            .into_iter()
            .flat_map(|n| n.obj.subnets.iter())
            .filter_map(|s| self.subnets.get(s.as_str()))
            .find(|s| s.obj.cidr.contains(&f.floating_ip_address))
            .map(|s| s.obj.id.clone());
        if let Some(subnet) = subnet {
            let subnet = self.strings.get(&subnet);
            self.take_ip(&subnet, f.floating_ip_address, taken);
        }
    }

    fn take_ip(&mut self, subnet: &Arc<str>, ip: IpAddr, taken: bool) {
        if taken {
            self.ips.entry(subnet.clone()).or_default().add(ip);
        } else if let Some(set) = self.ips.get_mut(subnet) {
            set.remove(&ip);
            if set.is_empty() {
                self.ips.remove(subnet);
            }
        }
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
                    for h in old.hosts.iter().flatten() {
                        self.trimmed.1.insert(h.to_string(), old.revision);
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
                touched
                    .hosts
                    .extend(e.hosts.iter().flatten().map(|h| h.to_string()));
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
            Parsed::Resource(coll, id) => {
                let (object, hosts) = self.apply_resource(coll, id, kv, deleted, record);
                if let (true, Some(object)) = (record, object) {
                    let id = match &object {
                        FeedObject::Port(p, _) => p.id.clone(),
                        FeedObject::Text(_) => id.into(),
                    };
                    self.feed.push_back(FeedEntry {
                        revision: kv.mod_revision,
                        kind: if deleted {
                            EventKind::Delete
                        } else {
                            EventKind::Put
                        },
                        resource: self.strings.get(coll),
                        id,
                        object,
                        hosts,
                    });
                    // Every entry passes this place once, as later ones are pushed.
                    if let Some(old) = self
                        .feed
                        .len()
                        .checked_sub(FEED_TEXT_LEN + 1)
                        .and_then(|i| self.feed.get_mut(i))
                    {
                        if let FeedObject::Port(_, text) = &mut old.object {
                            *text = None;
                        }
                    }
                }
            }
            Parsed::Ip(..) | Parsed::Mac(_) | Parsed::Other => {}
        }
    }

    /// Updates one collection; returns the object for the feed and the hosts it concerns.
    /// The taken addresses follow the change unless `load` works them out at its end.
    fn apply_resource(
        &mut self,
        coll: &str,
        id: &str,
        kv: &KeyValue,
        deleted: bool,
        count: bool,
    ) -> (Option<FeedObject>, [Option<Arc<str>>; 2]) {
        let text = |t: Option<Box<RawValue>>| (t.map(FeedObject::Text), [None, None]);
        macro_rules! plain {
            ($table:expr) => {{
                let old = $table.remove(id).and_then(|e| json(&*e.obj));
                if deleted {
                    text(old)
                } else {
                    text(put(&mut $table, kv, id.into()).and_then(|_| stored_json(kv)))
                }
            }};
        }
        match coll {
            "networks" => plain!(self.networks),
            "subnets" => plain!(self.subnets),
            "subnetpools" => plain!(self.subnetpools),
            "floatingips" => {
                let old = self.floatingips.remove(id).map(|e| e.obj);
                if let (true, Some(f)) = (count, &old) {
                    self.take_floating_ip(f, false);
                }
                if deleted {
                    return text(old.and_then(|o| json(&*o)));
                }
                let new = put(&mut self.floatingips, kv, id.into());
                if let (true, Some(f)) = (count, &new) {
                    self.take_floating_ip(f, true);
                }
                text(new.and_then(|_| stored_json(kv)))
            }
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
                    return text(old.and_then(|o| json(&*o)));
                }
                let key: Arc<str> = id.into();
                let new = put(&mut self.security_group_rules, kv, key.clone());
                if let Some(r) = &new {
                    self.group_rules
                        .entry(r.security_group_id.clone())
                        .or_default()
                        .insert(key);
                }
                text(new.and_then(|_| stored_json(kv)))
            }
            "hosts" => plain!(self.hosts),
            "ports" => {
                let old = self.ports.remove(id).map(|e| {
                    self.port_index.remove(&e.obj);
                    e.obj
                });
                let mut hosts = [old.as_ref().map(|o| o.binding_host_id.clone()), None];
                if let (true, Some(p)) = (count, &old) {
                    self.take_port(p, false);
                }
                if deleted {
                    let object = old.map(|o| {
                        let text = json(&*o);
                        FeedObject::Port(o, text)
                    });
                    return (object, hosts);
                }
                let Some(p) = parsed::<Port>(kv) else {
                    return (None, hosts);
                };
                let key: Arc<str> = id.into();
                let p = Arc::new(CompactPort::new(p, key.clone(), &mut self.strings));
                self.port_index.insert(&key, &p);
                if count {
                    self.take_port(&p, true);
                }
                if hosts[0].as_deref() != Some(&*p.binding_host_id) {
                    hosts[1] = Some(p.binding_host_id.clone());
                }
                self.ports.insert(
                    key,
                    Entry {
                        obj: p.clone(),
                        create_revision: kv.create_revision,
                        mod_revision: kv.mod_revision,
                    },
                );
                (Some(FeedObject::Port(p, stored_json(kv))), hosts)
            }
            other => match LBAAS.iter().find(|c| **c == other) {
                Some(c) => plain!(self.lbaas.entry(c).or_default()),
                None => (None, [None, None]),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(id: &str, name: &str) -> Event {
        port_with(id, name, "fa:16:3e:00:00:01", &[])
    }

    fn put(key: String, obj: serde_json::Value) -> KeyValue {
        KeyValue {
            key,
            value: serde_json::to_vec(&obj).unwrap(),
            create_revision: 2,
            mod_revision: 2,
        }
    }

    fn port_with(id: &str, name: &str, mac: &str, ips: &[(&str, &str)]) -> Event {
        let fixed: Vec<_> = ips
            .iter()
            .map(|(s, ip)| serde_json::json!({"subnet_id": s, "ip_address": ip}))
            .collect();
        let p = serde_json::json!({
            "id": id, "name": name, "network_id": "n1", "tenant_id": "t", "project_id": "t",
            "mac_address": mac, "admin_state_up": true, "status": "DOWN",
            "device_id": "", "device_owner": "", "fixed_ips": fixed, "binding:host_id": "h1",
            "binding:profile": {}, "binding:vnic_type": "normal", "binding:vif_type": "veth",
            "binding:vif_details": {}, "port_security_enabled": true, "security_groups": [],
            "allowed_address_pairs": [], "extra_dhcp_opts": [], "ip_allocation": "immediate",
            "description": "", "tags": [], "created_at": "", "updated_at": "",
            "revision_number": 1
        });
        Event::Put(put(keys::resource("ports", id), p))
    }

    fn delete(coll: &str, id: &str) -> Event {
        Event::Delete(KeyValue {
            key: keys::resource(coll, id),
            value: Vec::new(),
            create_revision: 0,
            mod_revision: 3,
        })
    }

    fn taken(v: &View, subnet: &str, ip: &str) -> bool {
        let ip: IpAddr = ip.parse().unwrap();
        v.ips.get(subnet).is_some_and(|t| t.contains(&ip))
    }

    fn names(v: &View, name: &str) -> Vec<String> {
        let ids = v.port_index.lookup(&v.ports, "name", &[name.to_string()]);
        let mut ids: Vec<String> = ids.unwrap().iter().map(|i| i.to_string()).collect();
        ids.sort();
        ids
    }

    #[test]
    fn the_port_index_answers_by_value_and_checks_the_port() {
        let mut v = View::load(Vec::new(), 1);
        v.apply(&[port("p1", "web"), port("p2", "web"), port("p3", "db")]);
        assert_eq!(names(&v, "web"), ["p1", "p2"]);
        assert_eq!(names(&v, "db"), ["p3"]);
        v.apply(&[port("p2", "db")]);
        assert_eq!(names(&v, "web"), ["p1"]);
        assert_eq!(names(&v, "db"), ["p2", "p3"]);
        // Two values with one hash: the index holds p1 under "cache"'s hash too, and the
        // lookup must not take p1 for a port named "cache".
        let h = v.port_index.hasher.hash_one("cache");
        v.port_index
            .by
            .get_mut("name")
            .unwrap()
            .insert(h, Ids::One("p1".into()));
        assert!(names(&v, "cache").is_empty());
        assert!(v.port_index.lookup(&v.ports, "mac_address", &[]).is_none());
        // Unnamed ports are not indexed: a filter on the empty name is left to the scan.
        v.apply(&[port("p4", "")]);
        let empty = v.port_index.hasher.hash_one("");
        assert!(!v.port_index.by["name"].contains_key(&empty));
        assert!(v
            .port_index
            .lookup(&v.ports, "name", &[String::new()])
            .is_none());
    }

    #[test]
    fn addresses_and_macs_are_worked_out_of_the_objects() {
        let mut v = View::load(Vec::new(), 1);
        let a = port_with("a", "", "fa:16:3e:00:00:0a", &[("s1", "10.0.0.5")]);
        v.apply(&[a]);
        assert!(taken(&v, "s1", "10.0.0.5") && v.macs.contains("fa:16:3e:00:00:0a"));
        // One revision that hands the address and MAC from a to b, the put first.
        let b = port_with("b", "", "fa:16:3e:00:00:0a", &[("s1", "10.0.0.5")]);
        v.apply(&[b, delete("ports", "a")]);
        assert!(taken(&v, "s1", "10.0.0.5") && v.macs.contains("fa:16:3e:00:00:0a"));
        // An update that moves b to another address frees the old one.
        v.apply(&[port_with(
            "b",
            "",
            "fa:16:3e:00:00:0b",
            &[("s1", "10.0.0.6")],
        )]);
        assert!(!taken(&v, "s1", "10.0.0.5") && taken(&v, "s1", "10.0.0.6"));
        assert!(!v.macs.contains("fa:16:3e:00:00:0a") && v.macs.contains("fa:16:3e:00:00:0b"));
        v.apply(&[delete("ports", "b")]);
        assert!(v.ips.is_empty() && v.macs.is_empty());
    }

    #[test]
    fn a_loaded_floating_ip_takes_its_address_in_its_subnet() {
        // In the store's order: the floating IP's key sorts before its network's and subnet's.
        let fip = serde_json::json!({
            "id": "f1", "tenant_id": "t", "project_id": "t",
            "floating_ip_address": "203.0.113.7", "floating_network_id": "pub",
            "router_id": null, "port_id": null, "fixed_ip_address": null, "status": "DOWN",
            "description": "", "port_details": null, "tags": [], "created_at": "",
            "updated_at": "", "revision_number": 1
        });
        let net = serde_json::json!({
            "id": "pub", "name": "public", "tenant_id": "t", "project_id": "t",
            "admin_state_up": true, "mtu": 1450, "status": "ACTIVE", "subnets": ["s6", "s4"],
            "shared": false, "router:external": true, "port_security_enabled": true,
            "description": "", "tags": [], "created_at": "", "updated_at": "",
            "revision_number": 1
        });
        let subnet = |id: &str, cidr: &str, version: u8| {
            serde_json::json!({
                "id": id, "name": "", "tenant_id": "t", "project_id": "t",
                "network_id": "pub", "ip_version": version, "subnetpool_id": null,
                "enable_dhcp": false, "ipv6_ra_mode": null, "ipv6_address_mode": null,
                "gateway_ip": null, "cidr": cidr, "allocation_pools": [], "host_routes": [],
                "dns_nameservers": [], "description": "", "service_types": [], "tags": [],
                "created_at": "", "updated_at": "", "revision_number": 1
            })
        };
        let kvs = vec![
            put(keys::resource("floatingips", "f1"), fip.clone()),
            put(keys::resource("networks", "pub"), net),
            put(
                keys::resource("subnets", "s4"),
                subnet("s4", "203.0.113.0/24", 4),
            ),
            put(
                keys::resource("subnets", "s6"),
                subnet("s6", "2001:db8::/64", 6),
            ),
        ];
        let mut v = View::load(kvs, 2);
        assert_eq!(
            (v.networks.len(), v.subnets.len(), v.floatingips.len()),
            (1, 2, 1)
        );
        assert!(taken(&v, "s4", "203.0.113.7"));
        assert!(!v.ips.contains_key("s6"));
        v.apply(&[delete("floatingips", "f1")]);
        assert!(v.ips.is_empty());
        v.apply(&[Event::Put(put(keys::resource("floatingips", "f1"), fip))]);
        assert!(taken(&v, "s4", "203.0.113.7"));
    }

    /// The feed entry's object as a client reads it.
    fn written(e: &FeedEntry) -> Value {
        serde_json::from_str(&serde_json::to_string(&e.object).unwrap()).unwrap()
    }

    #[test]
    fn old_feed_entries_write_the_port_as_it_was() {
        let mut v = View::load(Vec::new(), 1);
        v.apply(&[port("p0", "first")]);
        let as_stored: Port = match &v.feed[0].object {
            FeedObject::Port(_, Some(text)) => serde_json::from_str(text.get()).unwrap(),
            other => panic!("a new port entry without its text: {other:?}"),
        };
        // p0 renamed, then enough other changes to push its first entry past the text.
        v.apply(&[port("p0", "second")]);
        for i in 1..FEED_TEXT_LEN {
            v.apply(&[port(&format!("p{i}"), "web")]);
        }
        let first = &v.feed[0];
        assert!(matches!(first.object, FeedObject::Port(_, None)));
        assert_eq!(written(first), serde_json::to_value(&as_stored).unwrap());
        assert_eq!(written(first)["name"], "first");
        assert!(matches!(v.feed[1].object, FeedObject::Port(_, Some(_))));
        assert_eq!(written(&v.feed[1])["name"], "second");
        // The current port and its newest entry are one copy.
        match &v.feed[1].object {
            FeedObject::Port(p, _) => assert!(Arc::ptr_eq(p, &v.ports["p0"].obj)),
            other => panic!("not a port: {other:?}"),
        }
        v.apply(&[delete("ports", "p0")]);
        let gone = v.feed.back().unwrap();
        assert_eq!(
            (gone.kind, written(gone)["name"].clone()),
            (EventKind::Delete, "second".into())
        );
        assert_eq!(gone.hosts, [Some("h1".into()), None]);
    }
}
