//! NetworkPolicy onto security groups, as a pure state machine fed with namespaces, pods,
//! policies and hosts, each change recomputing only the pods and groups it can touch.
//!
//! The mapping:
//! - every policy is a group with its rules for the directions it affects, which the pods
//!   it selects join (one group per way the pods name the policy's named ports: a named
//!   port means each pod's own container port);
//! - every distinct peer (`podSelector`, `namespaceSelector`, both) is a rule-less group
//!   the matching pods join, so the policy's rules name it as a remote group and a label
//!   change is one port update, one set element on each host;
//! - pods no policy selects for a direction join `k8s-open-ingress` / `k8s-open-egress`;
//! - every pod joins its node's group (`k8s-node-<node>`): that host's own address in and
//!   out, since traffic to and from a pod's node is always allowed, and a node's traffic
//!   into a pod leaves from its underlay address.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use corvid_api::{
    Direction, Ethertype, SecurityGroupCreate, SecurityGroupRule, SecurityGroupRuleCreate,
};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::selectors::{Labels, Namespaces, Peer, Selector};
use crate::ids;

/// A security group's ID.
pub type GroupId = String;

/// The tag on every security group the watcher keeps.
pub const POLICY_TAG: &str = "corvid:k8s-policy";

/// The label the API server sets on namespaces from 1.21; the watcher sets it itself so
/// that selectors using it work on older ones too.
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A protocol a NetworkPolicy port names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Protocol {
    /// TCP (the default).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    fn parse(p: Option<&str>) -> Result<Protocol, String> {
        match p.unwrap_or("TCP") {
            "TCP" => Ok(Protocol::Tcp),
            "UDP" => Ok(Protocol::Udp),
            "SCTP" => Ok(Protocol::Sctp),
            other => Err(format!("unknown protocol {other:?}")),
        }
    }

    /// The name Neutron's rules take.
    pub fn neutron(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The protocol of a rule read back from the controller, by name or number.
    fn of_neutron(p: &str) -> Option<Protocol> {
        match corvid_api::protocols::number(p)? {
            6 => Some(Protocol::Tcp),
            17 => Some(Protocol::Udp),
            132 => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// Whose addresses a rule lets in or out.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Remote {
    /// Anyone's.
    Any,
    /// A prefix's.
    Prefix(IpNet),
    /// A group's members'.
    Group(GroupId),
}

/// One rule of a group the watcher keeps, comparable with what the controller holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    /// In or out.
    pub direction: Direction,
    /// IPv4 or IPv6.
    pub ethertype: Ethertype,
    /// Any protocol when `None`.
    pub protocol: Option<Protocol>,
    /// The destination ports, all when `None`.
    pub ports: Option<(u16, u16)>,
    /// Whose addresses.
    pub remote: Remote,
}

impl Rule {
    /// The request that adds it to `group`.
    pub fn create(&self, group: &str) -> SecurityGroupRuleCreate {
        let mut r = SecurityGroupRuleCreate::new(group, self.direction);
        r.ethertype = Some(self.ethertype);
        r.protocol = self.protocol.map(|p| p.neutron().to_string());
        r.port_range_min = self.ports.map(|p| p.0);
        r.port_range_max = self.ports.map(|p| p.1);
        match &self.remote {
            Remote::Any => {}
            Remote::Prefix(net) => r.remote_ip_prefix = Some(*net),
            Remote::Group(g) => r.remote_group_id = Some(g.clone()),
        }
        r
    }

    /// A rule the controller holds, as the watcher would have written it; `None` for one
    /// it never writes (another protocol), which is then removed.
    pub fn of(r: &SecurityGroupRule) -> Option<Rule> {
        let protocol = match r.protocol.as_deref() {
            None | Some("any") | Some("0") => None,
            Some(p) => Some(Protocol::of_neutron(p)?),
        };
        let ports = match (r.port_range_min, r.port_range_max) {
            (Some(min), max) => Some((min, max.unwrap_or(min))),
            (None, _) => None,
        };
        let remote = match (&r.remote_group_id, r.normalized_cidr.or(r.remote_ip_prefix)) {
            (Some(g), _) => Remote::Group(g.clone()),
            (None, Some(net)) if net.prefix_len() > 0 => Remote::Prefix(net),
            (None, _) => Remote::Any,
        };
        Some(Rule {
            direction: r.direction,
            ethertype: r.ethertype,
            protocol,
            ports,
            remote,
        })
    }
}

/// What a group the watcher keeps should be.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSpec {
    /// Its name.
    pub name: String,
    /// Why it is there, for whoever lists groups.
    pub description: String,
    /// Its rules.
    pub rules: BTreeSet<Rule>,
}

impl GroupSpec {
    /// The request that makes it (its rules come one by one after).
    pub fn create(&self, id: &str) -> SecurityGroupCreate {
        SecurityGroupCreate {
            id: Some(id.to_string()),
            name: Some(self.name.clone()),
            description: Some(self.description.clone()),
            tags: Some(vec![POLICY_TAG.to_string()]),
            ..Default::default()
        }
    }
}

/// The group of pods no policy selects for ingress.
pub fn open_ingress() -> GroupId {
    ids::security_group("open-ingress")
}

/// The group of pods no policy selects for egress.
pub fn open_egress() -> GroupId {
    ids::security_group("open-egress")
}

/// The group of the pods on `node`: its underlay address in and out.
pub fn node(node: &str) -> GroupId {
    ids::security_group(&format!("node/{node}"))
}

fn peer_group(peer: &Peer) -> GroupId {
    ids::security_group(&format!("peer/{}", peer.key()))
}

/// A port of a rule: its protocol, and a number (with `endPort`) or a name, or all.
#[derive(Debug, Clone, PartialEq)]
enum PortRef {
    All,
    Range(u16, u16),
    Named(String),
}

/// One peer of a rule.
#[derive(Debug, Clone, PartialEq)]
enum PeerRef {
    Pods(Peer),
    Prefixes(Vec<IpNet>),
}

/// One ingress or egress rule of a policy.
#[derive(Debug, Clone, PartialEq)]
struct PolicyRule {
    /// `None`: from or to anyone.
    peers: Option<Vec<PeerRef>>,
    /// Empty: every port of every protocol.
    ports: Vec<(Protocol, PortRef)>,
}

/// A NetworkPolicy as the groups need it.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    namespace: String,
    name: String,
    selector: Selector,
    /// `None` when the policy does not affect ingress.
    ingress: Option<Vec<PolicyRule>>,
    /// `None` when the policy does not affect egress.
    egress: Option<Vec<PolicyRule>>,
}

impl Policy {
    /// `np` read as networking.k8s.io/v1 defines it; what the API server would refuse is
    /// an error.
    pub fn from_k8s(np: &NetworkPolicy) -> Result<Policy, String> {
        let namespace = np.namespace().unwrap_or_default();
        let spec = np.spec.clone().unwrap_or_default();
        let selector = match &spec.pod_selector {
            Some(s) => Selector::from_k8s(s)?,
            None => Selector::everything(),
        };
        // Without policyTypes: ingress always, egress when the policy has egress rules.
        let types = spec.policy_types.clone().unwrap_or_else(|| {
            let mut t = vec!["Ingress".to_string()];
            if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) {
                t.push("Egress".into());
            }
            t
        });
        let wants = |t: &str| types.iter().any(|x| x == t);
        let ingress = if wants("Ingress") {
            let list = spec.ingress.unwrap_or_default();
            let rules = list.into_iter().map(|r| rule(&namespace, r.from, r.ports));
            Some(rules.collect::<Result<Vec<_>, String>>()?)
        } else {
            None
        };
        let egress = if wants("Egress") {
            let list = spec.egress.unwrap_or_default();
            let rules = list.into_iter().map(|r| rule(&namespace, r.to, r.ports));
            Some(rules.collect::<Result<Vec<_>, String>>()?)
        } else {
            None
        };
        if let Some(bad) = types.iter().find(|t| *t != "Ingress" && *t != "Egress") {
            return Err(format!("unknown policy type {bad:?}"));
        }
        Ok(Policy {
            name: np.name_any(),
            namespace,
            selector,
            ingress,
            egress,
        })
    }

    fn rules(&self) -> impl Iterator<Item = (Direction, &PolicyRule)> {
        let ingress = self
            .ingress
            .iter()
            .flatten()
            .map(|r| (Direction::Ingress, r));
        let egress = self.egress.iter().flatten().map(|r| (Direction::Egress, r));
        ingress.chain(egress)
    }

    fn peers(&self) -> impl Iterator<Item = &Peer> {
        self.rules()
            .flat_map(|(_, r)| r.peers.iter().flatten())
            .filter_map(|p| match p {
                PeerRef::Pods(peer) => Some(peer),
                PeerRef::Prefixes(_) => None,
            })
    }

    /// The port names of its rules in `direction`.
    fn names(&self, direction: Direction) -> BTreeSet<(String, Protocol)> {
        self.rules()
            .filter(|(d, _)| *d == direction)
            .flat_map(|(_, r)| r.ports.iter())
            .filter_map(|(proto, p)| match p {
                PortRef::Named(n) => Some((n.clone(), *proto)),
                _ => None,
            })
            .collect()
    }
}

fn rule(
    namespace: &str,
    peers: Option<Vec<NetworkPolicyPeer>>,
    ports: Option<Vec<NetworkPolicyPort>>,
) -> Result<PolicyRule, String> {
    // An empty list is no list: from or to anyone.
    let peers = match peers.filter(|p| !p.is_empty()) {
        None => None,
        Some(list) => Some(
            list.iter()
                .map(|p| peer(namespace, p))
                .collect::<Result<_, _>>()?,
        ),
    };
    let mut out = Vec::new();
    for p in ports.unwrap_or_default() {
        let proto = Protocol::parse(p.protocol.as_deref())?;
        let port = match p.port {
            None => PortRef::All,
            Some(IntOrString::String(name)) => match name.parse::<u16>() {
                Ok(n) => PortRef::Range(n, n),
                Err(_) => PortRef::Named(name),
            },
            Some(IntOrString::Int(n)) => {
                let n = u16::try_from(n).map_err(|_| format!("port {n} out of range"))?;
                let end = match p.end_port {
                    None => n,
                    Some(e) => u16::try_from(e).map_err(|_| format!("endPort {e} out of range"))?,
                };
                if end < n {
                    return Err(format!("endPort {end} below port {n}"));
                }
                PortRef::Range(n, end)
            }
        };
        out.push((proto, port));
    }
    Ok(PolicyRule { peers, ports: out })
}

fn peer(namespace: &str, p: &NetworkPolicyPeer) -> Result<PeerRef, String> {
    if let Some(block) = &p.ip_block {
        let cidr: IpNet = block
            .cidr
            .parse()
            .map_err(|_| format!("bad ipBlock cidr {:?}", block.cidr))?;
        let mut nets = vec![cidr.trunc()];
        for e in block.except.iter().flatten() {
            let e: IpNet = e.parse().map_err(|_| format!("bad ipBlock except {e:?}"))?;
            nets = nets
                .into_iter()
                .flat_map(|n| subtract(n, e.trunc()))
                .collect();
        }
        return Ok(PeerRef::Prefixes(nets));
    }
    let pods = match &p.pod_selector {
        Some(s) => Selector::from_k8s(s)?,
        None => Selector::everything(),
    };
    let namespaces = match &p.namespace_selector {
        Some(s) => Namespaces::Matching(Selector::from_k8s(s)?),
        None => Namespaces::Named(namespace.to_string()),
    };
    Ok(PeerRef::Pods(Peer { namespaces, pods }))
}

/// `net` without `hole`: the fewest prefixes that cover the rest.
pub fn subtract(net: IpNet, hole: IpNet) -> Vec<IpNet> {
    if !net.contains(&hole.network()) && !hole.contains(&net.network()) {
        return vec![net];
    }
    if hole.contains(&net) {
        return Vec::new();
    }
    net.subnets(net.prefix_len() + 1)
        .expect("a prefix that holds a smaller one splits")
        .flat_map(|half| subtract(half, hole))
        .collect()
}

/// A pod as the groups need it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodInfo {
    namespace: String,
    labels: Labels,
    /// Its containers' named ports.
    ports: BTreeSet<(String, Protocol, u16)>,
    /// The node it runs on.
    node: Option<String>,
}

impl PodInfo {
    /// What of `p` the groups depend on.
    pub fn of(p: &Pod) -> PodInfo {
        let ports = p
            .spec
            .iter()
            // Sidecars (init containers that keep running) serve ports too.
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|cp| {
                let name = cp.name.clone()?;
                let proto = Protocol::parse(cp.protocol.as_deref()).ok()?;
                Some((name, proto, u16::try_from(cp.container_port).ok()?))
            })
            .collect();
        PodInfo {
            namespace: p.namespace().unwrap_or_default(),
            labels: p.labels().clone(),
            ports,
            node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        }
    }
}

/// A rule's protocol (any when `None`) and destination ports (all when `None`).
type Match = (Option<Protocol>, Option<(u16, u16)>);

/// What a policy's named ports resolve to for the pods of one of its groups.
type Resolution = BTreeMap<(String, Protocol), BTreeSet<u16>>;

/// What a group that exists while pods use it stands for.
#[derive(Debug, Clone, PartialEq)]
enum Made {
    /// A policy, for pods that resolve its ingress named ports alike.
    Policy(String, Resolution),
    /// A node, for its pods.
    Node(String),
}

/// A group that exists while pods use it, and how many do.
#[derive(Debug)]
struct Variant {
    made: Made,
    users: usize,
}

/// Everything the groups are computed from, what they are, and what changed since last
/// taken.
#[derive(Debug, Default)]
pub struct Engine {
    namespaces: HashMap<String, Labels>,
    pods: HashMap<String, PodInfo>,
    pods_in: HashMap<String, BTreeSet<String>>,
    policies: HashMap<String, Policy>,
    policies_in: HashMap<String, BTreeSet<String>>,
    /// The peers policies name, by group, with how many policy rules name each.
    peers: HashMap<GroupId, (Peer, usize)>,
    /// Every pod's named ports, counted: where egress rules' named ports go.
    named: HashMap<(String, Protocol), BTreeMap<u16, usize>>,
    hosts: BTreeMap<String, IpAddr>,
    pod_groups: HashMap<String, BTreeSet<GroupId>>,
    variants: HashMap<GroupId, Variant>,
    dirty_pods: BTreeSet<String>,
    dirty_groups: BTreeSet<GroupId>,
}

impl Engine {
    /// Nothing known yet; the fixed groups are due.
    pub fn new() -> Engine {
        let mut e = Engine::default();
        e.dirty_groups.extend([open_ingress(), open_egress()]);
        e
    }

    /// A namespace and its labels.
    pub fn set_namespace(&mut self, name: &str, mut labels: Labels) {
        labels.insert(NAME_LABEL.into(), name.into());
        if self.namespaces.get(name) == Some(&labels) {
            return;
        }
        self.namespaces.insert(name.to_string(), labels);
        self.recompute_namespace(name);
    }

    /// A namespace is gone.
    pub fn remove_namespace(&mut self, name: &str) {
        if self.namespaces.remove(name).is_some() {
            self.recompute_namespace(name);
        }
    }

    /// The namespaces known, by name.
    pub fn namespaces(&self) -> impl Iterator<Item = &String> {
        self.namespaces.keys()
    }

    fn recompute_namespace(&mut self, name: &str) {
        let pods: Vec<String> = self
            .pods_in
            .get(name)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        for uid in pods {
            self.recompute(&uid);
        }
    }

    /// A pod with a port, by UID.
    pub fn set_pod(&mut self, uid: &str, info: PodInfo) {
        let old = self.pods.get(uid);
        if old == Some(&info) {
            return;
        }
        let old_ports = old.map(|o| o.ports.clone()).unwrap_or_default();
        if let Some(o) = old.filter(|o| o.namespace != info.namespace) {
            let ns = o.namespace.clone();
            self.unindex(&ns, uid);
        }
        self.count_names(&old_ports, &info.ports);
        self.pods_in
            .entry(info.namespace.clone())
            .or_default()
            .insert(uid.to_string());
        self.pods.insert(uid.to_string(), info);
        self.recompute(uid);
    }

    /// A pod is gone, or has no port any more.
    pub fn remove_pod(&mut self, uid: &str) {
        let Some(old) = self.pods.remove(uid) else {
            return;
        };
        self.unindex(&old.namespace, uid);
        self.count_names(&old.ports, &BTreeSet::new());
        for g in self.pod_groups.remove(uid).unwrap_or_default() {
            self.release(&g);
        }
        self.dirty_pods.insert(uid.to_string());
    }

    /// The pods known, by UID.
    pub fn pods(&self) -> impl Iterator<Item = &String> {
        self.pods.keys()
    }

    fn unindex(&mut self, namespace: &str, uid: &str) {
        if let Some(set) = self.pods_in.get_mut(namespace) {
            set.remove(uid);
            if set.is_empty() {
                self.pods_in.remove(namespace);
            }
        }
    }

    /// Keeps the count of named ports; policies whose egress names a port whose numbers
    /// changed are due.
    fn count_names(
        &mut self,
        old: &BTreeSet<(String, Protocol, u16)>,
        new: &BTreeSet<(String, Protocol, u16)>,
    ) {
        let mut changed = BTreeSet::new();
        for (name, proto, port) in old.difference(new) {
            let key = (name.clone(), *proto);
            if let Some(counts) = self.named.get_mut(&key) {
                let c = counts.entry(*port).or_default();
                *c = c.saturating_sub(1);
                if *c == 0 {
                    counts.remove(port);
                    changed.insert(key.clone());
                }
                if counts.is_empty() {
                    self.named.remove(&key);
                }
            }
        }
        for (name, proto, port) in new.difference(old) {
            let key = (name.clone(), *proto);
            let c = self
                .named
                .entry(key.clone())
                .or_default()
                .entry(*port)
                .or_default();
            *c += 1;
            if *c == 1 {
                changed.insert(key);
            }
        }
        if changed.is_empty() {
            return;
        }
        let due: BTreeSet<&String> = self
            .policies
            .iter()
            .filter(|(_, p)| !p.names(Direction::Egress).is_disjoint(&changed))
            .map(|(uid, _)| uid)
            .collect();
        let groups = self
            .variants
            .iter()
            .filter(|(_, v)| matches!(&v.made, Made::Policy(p, _) if due.contains(p)))
            .map(|(g, _)| g.clone());
        self.dirty_groups.extend(groups);
    }

    /// A policy, by UID.
    pub fn set_policy(&mut self, uid: &str, policy: Policy) {
        if self.policies.get(uid) == Some(&policy) {
            return;
        }
        let old = self.policies.insert(uid.to_string(), policy.clone());
        self.policies_in
            .entry(policy.namespace.clone())
            .or_default()
            .insert(uid.to_string());
        self.changed_policy(uid, old, Some(&policy));
    }

    /// A policy is gone.
    pub fn remove_policy(&mut self, uid: &str) {
        let Some(old) = self.policies.remove(uid) else {
            return;
        };
        if let Some(set) = self.policies_in.get_mut(&old.namespace) {
            set.remove(uid);
            if set.is_empty() {
                self.policies_in.remove(&old.namespace);
            }
        }
        self.changed_policy(uid, Some(old), None);
    }

    /// The policies known, by UID.
    pub fn policies(&self) -> impl Iterator<Item = &String> {
        self.policies.keys()
    }

    fn changed_policy(&mut self, uid: &str, old: Option<Policy>, new: Option<&Policy>) {
        if let Some(o) = &old {
            if new.is_none_or(|n| n.namespace != o.namespace) {
                if let Some(set) = self.policies_in.get_mut(&o.namespace) {
                    set.remove(uid);
                }
            }
        }
        // The pods whose groups may change: those the policy selected or selects, and the
        // members of peers that come or go. One selector test per pod of its namespace,
        // not a recomputation of each.
        let mut due: BTreeSet<String> = BTreeSet::new();
        for p in old.iter().chain(new) {
            let selected = self
                .pods_in
                .get(&p.namespace)
                .into_iter()
                .flatten()
                .filter(|uid| {
                    self.pods
                        .get(*uid)
                        .is_some_and(|pod| p.selector.matches(&pod.labels))
                })
                .cloned();
            due.extend(selected);
        }
        let named_peers = |p: Option<&Policy>| -> Vec<Peer> {
            p.map(|p| p.peers().cloned().collect()).unwrap_or_default()
        };
        for peer in named_peers(new) {
            let id = peer_group(&peer);
            let entry = self.peers.entry(id.clone()).or_insert((peer.clone(), 0));
            entry.1 += 1;
            if entry.1 == 1 {
                self.dirty_groups.insert(id);
                due.extend(self.matching(&peer));
            }
        }
        for peer in named_peers(old.as_ref()) {
            let id = peer_group(&peer);
            if let Some(entry) = self.peers.get_mut(&id) {
                entry.1 -= 1;
                if entry.1 == 0 {
                    self.peers.remove(&id);
                    self.dirty_groups.insert(id.clone());
                    due.extend(
                        self.pod_groups
                            .iter()
                            .filter(|(_, g)| g.contains(&id))
                            .map(|(uid, _)| uid.clone()),
                    );
                }
            }
        }
        let variants = self
            .variants
            .iter()
            .filter(|(_, v)| matches!(&v.made, Made::Policy(p, _) if p == uid))
            .map(|(g, _)| g.clone());
        self.dirty_groups.extend(variants);
        for pod in due {
            self.recompute(&pod);
        }
    }

    /// The pods `peer` names.
    fn matching(&self, peer: &Peer) -> Vec<String> {
        self.pods
            .iter()
            .filter(|(_, p)| {
                peer.matches(&p.namespace, self.namespaces.get(&p.namespace), &p.labels)
            })
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// The hosts' underlay addresses, by host ID.
    pub fn set_hosts(&mut self, hosts: BTreeMap<String, IpAddr>) {
        if self.hosts == hosts {
            return;
        }
        let changed = |v: &Variant| match &v.made {
            Made::Node(n) => self.hosts.get(n) != hosts.get(n),
            Made::Policy(..) => false,
        };
        let due: Vec<GroupId> = self
            .variants
            .iter()
            .filter(|(_, v)| changed(v))
            .map(|(g, _)| g.clone())
            .collect();
        self.dirty_groups.extend(due);
        self.hosts = hosts;
    }

    /// The group of the node pod `uid` runs on.
    pub fn node_group_of(&self, uid: &str) -> Option<GroupId> {
        self.pods.get(uid)?.node.as_deref().map(node)
    }

    /// Whether `host` is one of the hosts known.
    pub fn knows_host(&self, host: &str) -> bool {
        self.hosts.contains_key(host)
    }

    /// The groups a pod's port should have, sorted; `None` for a pod not known.
    pub fn groups_of(&self, uid: &str) -> Option<Vec<GroupId>> {
        self.pod_groups
            .get(uid)
            .map(|g| g.iter().cloned().collect())
    }

    /// Every group there should be.
    pub fn groups(&self) -> Vec<GroupId> {
        let mut out = vec![open_ingress(), open_egress()];
        out.extend(self.peers.keys().cloned());
        out.extend(self.variants.keys().cloned());
        out
    }

    /// The pods and groups changed since the last call.
    pub fn take_dirty(&mut self) -> (BTreeSet<GroupId>, BTreeSet<String>) {
        (
            std::mem::take(&mut self.dirty_groups),
            std::mem::take(&mut self.dirty_pods),
        )
    }

    /// What group `id` should be; `None` when it should not be.
    pub fn group(&self, id: &str) -> Option<GroupSpec> {
        let any = |direction| {
            [Ethertype::Ipv4, Ethertype::Ipv6].map(|ethertype| Rule {
                direction,
                ethertype,
                protocol: None,
                ports: None,
                remote: Remote::Any,
            })
        };
        if id == open_ingress() {
            return Some(GroupSpec {
                name: "k8s-open-ingress".into(),
                description: "pods no NetworkPolicy selects for ingress".into(),
                rules: any(Direction::Ingress).into(),
            });
        }
        if id == open_egress() {
            return Some(GroupSpec {
                name: "k8s-open-egress".into(),
                description: "pods no NetworkPolicy selects for egress".into(),
                rules: any(Direction::Egress).into(),
            });
        }
        if let Some((peer, _)) = self.peers.get(id) {
            return Some(GroupSpec {
                name: "k8s-peer".into(),
                description: format!("pods a NetworkPolicy peer names: {}", peer.key()),
                rules: BTreeSet::new(),
            });
        }
        match &self.variants.get(id)?.made {
            Made::Policy(uid, resolution) => {
                let policy = self.policies.get(uid)?;
                Some(GroupSpec {
                    name: format!("k8s-np-{}-{}", policy.namespace, policy.name),
                    description: format!(
                        "NetworkPolicy {}/{} ({uid})",
                        policy.namespace, policy.name
                    ),
                    rules: self.rules(policy, resolution),
                })
            }
            Made::Node(node) => {
                let rules = self
                    .hosts
                    .get(node)
                    .into_iter()
                    .flat_map(|ip| {
                        [Direction::Ingress, Direction::Egress].map(|direction| Rule {
                            direction,
                            ethertype: Ethertype::of(*ip),
                            protocol: None,
                            ports: None,
                            remote: Remote::Prefix(IpNet::from(*ip)),
                        })
                    })
                    .collect();
                Some(GroupSpec {
                    name: format!("k8s-node-{node}"),
                    description: format!("the pods on node {node}: its traffic"),
                    rules,
                })
            }
        }
    }

    fn rules(&self, policy: &Policy, resolution: &Resolution) -> BTreeSet<Rule> {
        let mut out = BTreeSet::new();
        for (direction, r) in policy.rules() {
            let remotes: Vec<Remote> = match &r.peers {
                None => vec![Remote::Any],
                Some(peers) => peers
                    .iter()
                    .flat_map(|p| match p {
                        PeerRef::Pods(peer) => vec![Remote::Group(peer_group(peer))],
                        PeerRef::Prefixes(nets) => {
                            nets.iter().copied().map(Remote::Prefix).collect()
                        }
                    })
                    .collect(),
            };
            let ports: Vec<Match> = if r.ports.is_empty() {
                vec![(None, None)]
            } else {
                r.ports
                    .iter()
                    .flat_map(|(proto, p)| -> Vec<Match> {
                        match p {
                            PortRef::All => vec![(Some(*proto), None)],
                            PortRef::Range(a, b) => vec![(Some(*proto), Some((*a, *b)))],
                            PortRef::Named(name) => {
                                let key = (name.clone(), *proto);
                                // Ingress: the pod's own port; egress: any pod's port
                                // of that name.
                                let numbers: Vec<u16> = match direction {
                                    Direction::Ingress => resolution
                                        .get(&key)
                                        .into_iter()
                                        .flatten()
                                        .copied()
                                        .collect(),
                                    Direction::Egress => self
                                        .named
                                        .get(&key)
                                        .into_iter()
                                        .flat_map(|c| c.keys())
                                        .copied()
                                        .collect(),
                                };
                                numbers
                                    .into_iter()
                                    .map(|n| (Some(*proto), Some((n, n))))
                                    .collect()
                            }
                        }
                    })
                    .collect()
            };
            for remote in &remotes {
                let families: &[Ethertype] = match remote {
                    Remote::Prefix(net) => &[Ethertype::of(net.addr())],
                    _ => &[Ethertype::Ipv4, Ethertype::Ipv6],
                };
                // The controller (as Neutron) holds a /0 as no prefix: one rule, not two.
                let remote = &match remote {
                    Remote::Prefix(net) if net.prefix_len() == 0 => Remote::Any,
                    other => other.clone(),
                };
                for (protocol, range) in &ports {
                    for ethertype in families {
                        out.insert(Rule {
                            direction,
                            ethertype: *ethertype,
                            protocol: *protocol,
                            ports: *range,
                            remote: remote.clone(),
                        });
                    }
                }
            }
        }
        out
    }

    /// Recomputes a pod's groups; what changed is due.
    fn recompute(&mut self, uid: &str) {
        let Some(want) = self.desired(uid) else {
            return;
        };
        let old = self.pod_groups.get(uid).cloned().unwrap_or_default();
        if old == want.0 {
            return;
        }
        for g in old.difference(&want.0) {
            self.release(g);
        }
        for g in want.0.difference(&old) {
            if let Some(made) = want.1.get(g) {
                let v = self.variants.entry(g.clone()).or_insert_with(|| Variant {
                    made: made.clone(),
                    users: 0,
                });
                v.users += 1;
                if v.users == 1 {
                    self.dirty_groups.insert(g.clone());
                }
            }
        }
        self.pod_groups.insert(uid.to_string(), want.0);
        self.dirty_pods.insert(uid.to_string());
    }

    /// A pod leaves group `g`: a policy's or node's group no pod uses any more goes.
    fn release(&mut self, g: &GroupId) {
        if let Some(v) = self.variants.get_mut(g) {
            v.users -= 1;
            if v.users == 0 {
                self.variants.remove(g);
                self.dirty_groups.insert(g.clone());
            }
        }
    }

    /// A pod's groups, and of those the groups that exist while pods use them, with
    /// what they stand for.
    fn desired(&self, uid: &str) -> Option<(BTreeSet<GroupId>, HashMap<GroupId, Made>)> {
        let pod = self.pods.get(uid)?;
        let mut groups = BTreeSet::new();
        let mut variants = HashMap::new();
        if let Some(n) = &pod.node {
            groups.insert(node(n));
            variants.insert(node(n), Made::Node(n.clone()));
        }
        let (mut ingress, mut egress) = (false, false);
        for puid in self.policies_in.get(&pod.namespace).into_iter().flatten() {
            let Some(p) = self.policies.get(puid) else {
                continue;
            };
            if !p.selector.matches(&pod.labels) {
                continue;
            }
            ingress |= p.ingress.is_some();
            egress |= p.egress.is_some();
            let resolution: Resolution = p
                .names(Direction::Ingress)
                .into_iter()
                .map(|(name, proto)| {
                    let numbers = pod
                        .ports
                        .iter()
                        .filter(|(n, pr, _)| *n == name && *pr == proto)
                        .map(|(_, _, port)| *port)
                        .collect();
                    ((name, proto), numbers)
                })
                .collect();
            let key = if resolution.is_empty() {
                format!("policy/{puid}")
            } else {
                let text = serde_json::to_string(&resolution.iter().collect::<Vec<_>>())
                    .expect("a resolution serializes");
                format!("policy/{puid}/{text}")
            };
            let id = ids::security_group(&key);
            groups.insert(id.clone());
            variants.insert(id, Made::Policy(puid.clone(), resolution));
        }
        if !ingress {
            groups.insert(open_ingress());
        }
        if !egress {
            groups.insert(open_egress());
        }
        let ns_labels = self.namespaces.get(&pod.namespace);
        for (id, (peer, _)) in &self.peers {
            if peer.matches(&pod.namespace, ns_labels, &pod.labels) {
                groups.insert(id.clone());
            }
        }
        Some((groups, variants))
    }
}

#[cfg(test)]
mod tests;
