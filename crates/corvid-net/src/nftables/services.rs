//! Load-balanced services and floating IPs in corvid's table, written by one long-lived
//! owner (the agent) that keeps what it committed in memory and sends only the
//! difference: a change to one service touches its own elements and chain, and nothing
//! is listed on a sync. Learnt from kube-proxy's nftables mode.
//!
//! ```text
//! map service-ips4       { type ipv4_addr . inet_proto . inet_service : verdict }  cluster IPs
//! map service-external4  { same }               floating IPs of load balancers (masqueraded)
//! map service-nodeports4 { type inet_proto . inet_service : verdict }  a family's own:
//!                          a dual-stack service's node port leads to that family's members
//! set service-reject4    { type ipv4_addr . inet_proto . inet_service }  no member: refused
//! set service-nodeports-reject4 { type inet_proto . inet_service }
//! map service-members4   { type mark . mark : ipv4_addr . inet_service }
//!                          (index . service number) to a member
//! set service-hairpin4   { type ipv4_addr . ipv4_addr }        (member . member)
//! set service-outside4   { type ipv4_addr }   members outside corvid's networks
//! map floating-ips4      { type ipv4_addr : ipv4_addr }        public to fixed
//! map floating-fixed4    { type ipv4_addr : ipv4_addr }        fixed to public
//!     (and the same for IPv6)
//! chain services-prerouting, services-output { type nat hook ... priority dstnat
//!     jump services }
//! chain services {
//!     ip daddr . meta l4proto . th dport vmap @service-ips4
//!     ip daddr . meta l4proto . th dport @service-external4 meta mark set mark | 0x40000
//!     ip daddr . meta l4proto . th dport vmap @service-external4
//!     meta nfproto ipv4 fib daddr type local meta l4proto . th dport @service-nodeports4 mark set ...
//!     meta nfproto ipv4 fib daddr type local meta l4proto . th dport vmap @service-nodeports4
//!     ip daddr @floating-ips4 meta mark set ...; dnat ip to ip daddr map @floating-ips4 }
//! chain svc-<hash> {                            one per service port
//!     [ip saddr . <i> @affinity-<hash> update @affinity-<hash> { ip saddr . <i> }
//!         dnat to (<i> . <number>) map @service-members4]  each i; sessionAffinity
//!     dnat to (numgen random mod N . <number>) map @service-members4
//!                             [update @affinity-<hash> { ip saddr . the index }] }
//! chain services-filter-prerouting, services-filter-output { type filter priority -110
//!     ct state new jump svc-reject }           (a connection's later packets pay one test)
//! chain svc-reject {
//!     ... @service-reject4 reject (TCP reset, else port unreachable) }
//! chain services-postrouting { type nat hook postrouting priority srcnat
//!     ct status dnat ip saddr . ip daddr @service-hairpin4 masquerade   (a pod to itself)
//!     ct status dnat ip daddr @service-outside4 masquerade    (replies come back here)
//!     meta mark & 0x40000 masquerade                      (from outside, replies come back)
//!     oifname <public> snat ip to ip saddr map @floating-fixed4
//!     oifname <public> jump router-snat }
//! chain router-snat {                               rewritten whole when routers change
//!     ip saddr <subnet> snat to <router's gateway address>   each subnet of a router
//!                                                   with a gateway and enable_snat }
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use super::expr::{self, reg32, Field, Reg};
use super::portmap::Protocol;
use super::{
    addr_bytes, fnv1a, padded, target, BaseChain, Batch, ChainType, DataType, HookPoint, Nftables,
    SetSpec,
};
use crate::conntrack::Conntrack;
use crate::Result;
use ipnet::IpNet;
use netlink_packet_netfilter::nftables::Expressions;

/// One service port as the datapath serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// The virtual IP (a load balancer's VIP, a Kubernetes cluster IP).
    pub vip: IpAddr,
    /// Floating IPs of the load balancer: served like the VIP, masqueraded.
    pub external: Vec<IpAddr>,
    /// TCP, UDP or SCTP.
    pub protocol: Protocol,
    /// The port on the VIP.
    pub port: u16,
    /// The port every host's own addresses forward to this service, if any.
    pub node_port: Option<u16>,
    /// Addresses and ports connections are spread over; the VIP's family only.
    pub members: Vec<(IpAddr, u16)>,
    /// The members' addresses outside every corvid network (the API server behind the
    /// `kubernetes` service), reached through this host's own routes: connections to
    /// them are masqueraded, since nothing there routes back to a pod.
    pub outside: BTreeSet<IpAddr>,
    /// Keep sending a client to the member it got first, until it is idle this long.
    pub affinity: Option<Duration>,
}

/// The mark bit of connections that come from outside and are masqueraded so that the
/// replies come back through this host. Clear of the bits others on a node set: the
/// kubelet drops packets with 0x8000 in INPUT and OUTPUT (KUBE-FIREWALL) and kube-proxy
/// masquerades 0x4000, portmap 0x2000, the security groups' 0x20000.
pub const MASQUERADE_MARK: u32 = 0x0004_0000;

const CHAIN: &str = "services";
const PREROUTING: &str = "services-prerouting";
const OUTPUT: &str = "services-output";
const POSTROUTING: &str = "services-postrouting";
const FILTER_PREROUTING: &str = "services-filter-prerouting";
const FILTER_OUTPUT: &str = "services-filter-output";
/// Named as a service's chain so that an older agent, which flushes and deletes those
/// at start, also takes this one before the sets its rules use.
const REJECT: &str = "svc-reject";
const ROUTER_SNAT: &str = "router-snat";
const BASE_CHAINS: [&str; 8] = [
    PREROUTING,
    OUTPUT,
    POSTROUTING,
    FILTER_PREROUTING,
    FILTER_OUTPUT,
    CHAIN,
    REJECT,
    ROUTER_SNAT,
];
const SERVICE_CHAIN_PREFIX: &str = "svc-";
const AFFINITY_PREFIX: &str = "affinity-";
/// The node ports' maps of an agent from before they were per family: removed at start.
const LEGACY_NODEPORTS: [&str; 2] = ["service-nodeports", "service-nodeports-reject"];

/// Refuses what `matched` loads into registers 0 on when it is in `set`: TCP with a reset,
/// the rest with port unreachable.
fn add_rejects(batch: &mut Batch, matched: impl Fn() -> Vec<Expressions>, set: &str) {
    for tcp in [true, false] {
        let mut reject = matched();
        reject.push(expr::lookup(set, reg32(0), true));
        if tcp {
            reject.extend(expr::is_tcp());
        }
        reject.push(expr::reject(tcp));
        batch.add_rule(REJECT, reject, None);
    }
}

/// The per-family maps and sets.
struct Family {
    ips: &'static str,
    external: &'static str,
    reject: &'static str,
    members: &'static str,
    hairpin: &'static str,
    outside: &'static str,
    floating: &'static str,
    fixed: &'static str,
    nodeports: &'static str,
    nodeports_reject: &'static str,
}

const V4: Family = Family {
    ips: "service-ips4",
    external: "service-external4",
    reject: "service-reject4",
    members: "service-members4",
    hairpin: "service-hairpin4",
    outside: "service-outside4",
    floating: "floating-ips4",
    fixed: "floating-fixed4",
    nodeports: "service-nodeports4",
    nodeports_reject: "service-nodeports-reject4",
};
const V6: Family = Family {
    ips: "service-ips6",
    external: "service-external6",
    reject: "service-reject6",
    members: "service-members6",
    hairpin: "service-hairpin6",
    outside: "service-outside6",
    floating: "floating-ips6",
    fixed: "floating-fixed6",
    nodeports: "service-nodeports6",
    nodeports_reject: "service-nodeports-reject6",
};

fn family(v6: bool) -> &'static Family {
    if v6 {
        &V6
    } else {
        &V4
    }
}

fn port_key(protocol: Protocol, port: u16) -> Vec<u8> {
    let mut k = padded(&[protocol.number()]);
    k.extend(padded(&port.to_be_bytes()));
    k
}

fn frontend_key(addr: IpAddr, protocol: Protocol, port: u16) -> Vec<u8> {
    let mut k = addr_bytes(addr);
    k.extend(port_key(protocol, port));
    k
}

fn member_key(number: u32, index: u32) -> Vec<u8> {
    let mut k = index.to_ne_bytes().to_vec();
    k.extend(number.to_ne_bytes());
    k
}

/// The chain and affinity set of the service `id`.
fn names(id: &str) -> (String, String) {
    let hash = fnv1a(&[id]);
    (
        format!("{SERVICE_CHAIN_PREFIX}{hash:016x}"),
        format!("{AFFINITY_PREFIX}{hash:016x}"),
    )
}

/// What the kernel holds of one service.
struct Committed {
    service: Service,
    number: u32,
}

/// Counts of what one sync changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SyncReport {
    /// Services added.
    pub added: usize,
    /// Services changed.
    pub changed: usize,
    /// Services removed.
    pub removed: usize,
    /// UDP flows forgotten because their member went.
    pub forgotten: usize,
}

/// The UDP members (address, port) of `old` that `new` does not have: their translated
/// flows would otherwise stay with them.
fn udp_members_gone(old: Option<&Service>, new: Option<&Service>) -> Vec<(IpAddr, u16)> {
    let Some(old) = old.filter(|o| o.protocol == Protocol::Udp) else {
        return Vec::new();
    };
    let kept = new
        .filter(|n| n.protocol == Protocol::Udp)
        .map_or(&[][..], |n| &n.members[..]);
    old.members
        .iter()
        .filter(|m| !kept.contains(m))
        .copied()
        .collect()
}

/// The services and floating IPs of this host's kernel, as last committed.
pub struct Services {
    nft: Nftables,
    /// Where the UDP flows of members that went are forgotten.
    conntrack: Conntrack,
    /// Set once the table was rebuilt from scratch (the first sync).
    started: bool,
    committed: HashMap<String, Committed>,
    next_number: u32,
    free_numbers: Vec<u32>,
    /// How many services each member address serves (its hairpin element's users).
    hairpins: HashMap<IpAddr, usize>,
    /// How many services send to each member address outside corvid's networks.
    outsides: HashMap<IpAddr, usize>,
    floating: BTreeMap<IpAddr, IpAddr>,
    /// Router subnets and the gateway address what they send out leaves from.
    router_snat: Option<BTreeMap<IpNet, IpAddr>>,
    public_interface: Option<String>,
    /// This host's own addresses, one per family, that connections from outside leave
    /// with.
    sources: Vec<IpAddr>,
}

impl Services {
    /// Opens the calling thread's namespace's table; `public_interface` is where floating
    /// IPs' traffic leaves (their SNAT), if this host has one. Connections from outside
    /// (floating IPs, node ports) leave with the address of `sources` (addresses of this
    /// host only, one per family) of their family, so that a member on another host
    /// answers here: an interface's own address may be a gateway every host holds.
    /// Without one of their family they are masqueraded.
    pub fn open(public_interface: Option<String>, sources: Vec<IpAddr>) -> Result<Services> {
        Ok(Services {
            nft: Nftables::open()?,
            conntrack: Conntrack::open()?,
            started: false,
            committed: HashMap::new(),
            next_number: 0,
            free_numbers: Vec::new(),
            hairpins: HashMap::new(),
            outsides: HashMap::new(),
            floating: BTreeMap::new(),
            router_snat: None,
            public_interface,
            sources,
        })
    }

    /// Makes what a router's subnet sends out of the public interface leave from the
    /// router's gateway address (`snat`: subnet to address), after the floating IPs,
    /// which take precedence, and before the networks' masquerade, which it replaces
    /// there. Rewritten whole when it changes: routers' gateways change rarely. Nothing
    /// without a public interface, or before the first [`Services::sync`].
    pub fn sync_router_snat(&mut self, snat: &BTreeMap<IpNet, IpAddr>) -> Result<()> {
        if self.public_interface.is_none()
            || !self.started
            || self.router_snat.as_ref() == Some(snat)
        {
            return Ok(());
        }
        let mut batch = Batch::new();
        batch.flush_chain(ROUTER_SNAT);
        for (subnet, gateway) in snat {
            if subnet.addr().is_ipv6() != gateway.is_ipv6() {
                continue;
            }
            let v6 = gateway.is_ipv6();
            let mut rule = expr::nfproto(v6);
            rule.extend(expr::in_prefix(Field::SrcAddr, *subnet, true));
            rule.extend([
                expr::immediate(reg32(0), &addr_bytes(*gateway)),
                expr::snat(v6, reg32(0)),
            ]);
            batch.add_rule(ROUTER_SNAT, rule, None);
        }
        let _lock = super::lock()?;
        self.nft.commit(batch)?;
        self.router_snat = Some(snat.clone());
        Ok(())
    }

    /// Makes the kernel serve `want` (by service ID) and map `floating` (public to fixed
    /// address), in one transaction. The first call replaces whatever an earlier owner
    /// left; later ones send only what changed.
    pub fn sync(
        &mut self,
        want: &BTreeMap<String, Service>,
        floating: &BTreeMap<IpAddr, IpAddr>,
    ) -> Result<SyncReport> {
        let gone: BTreeSet<String> = self
            .committed
            .keys()
            .filter(|id| !want.contains_key(*id))
            .cloned()
            .collect();
        let ids = gone.iter().chain(want.keys());
        self.sync_some(want, ids, floating)
    }

    /// As [`Services::sync`], looking only at the services `changed` names (absent from
    /// `want`: removed), so that one change costs the same among ten services or
    /// thousands. Before the first full sync, it is one.
    pub fn sync_changed(
        &mut self,
        want: &BTreeMap<String, Service>,
        changed: &BTreeSet<String>,
        floating: &BTreeMap<IpAddr, IpAddr>,
    ) -> Result<SyncReport> {
        if !self.started {
            return self.sync(want, floating);
        }
        self.sync_some(want, changed.iter(), floating)
    }

    fn sync_some<'a>(
        &mut self,
        want: &BTreeMap<String, Service>,
        ids: impl Iterator<Item = &'a String>,
        floating: &BTreeMap<IpAddr, IpAddr>,
    ) -> Result<SyncReport> {
        let mut batch = Batch::new();
        if !self.started {
            self.rebuild(&mut batch)?;
        }
        let mut report = SyncReport::default();
        let mut gone_udp = BTreeSet::new();
        for id in ids {
            let old = self.committed.remove(id);
            gone_udp.extend(udp_members_gone(
                old.as_ref().map(|c| &c.service),
                want.get(id),
            ));
            match (old, want.get(id)) {
                (None, None) => {}
                (Some(old), None) => {
                    self.remove(&mut batch, id, &old);
                    self.free_numbers.push(old.number);
                    report.removed += 1;
                }
                (Some(old), Some(new)) if old.service == *new => {
                    self.committed.insert(id.clone(), old);
                }
                (Some(old), Some(new)) => {
                    self.change(&mut batch, id, &old, new);
                    let number = old.number;
                    self.committed.insert(
                        id.clone(),
                        Committed {
                            service: new.clone(),
                            number,
                        },
                    );
                    report.changed += 1;
                }
                (None, Some(new)) => {
                    let number = self.free_numbers.pop().unwrap_or_else(|| {
                        self.next_number += 1;
                        self.next_number
                    });
                    self.add(&mut batch, id, new, number);
                    self.committed.insert(
                        id.clone(),
                        Committed {
                            service: new.clone(),
                            number,
                        },
                    );
                    report.added += 1;
                }
            }
        }
        self.sync_floating(&mut batch, floating);
        // The plugins' lock: a plugin's last DEL removes corvid's table when it holds
        // nothing else, which must not cross this commit.
        let _lock = super::lock()?;
        self.nft.commit(batch)?;
        self.started = true;
        // After the commit, so that the flows' next packets find the new members. The
        // table is as committed either way, so a failure here is only said.
        match self.conntrack.forget_udp_translated_to(&gone_udp) {
            Ok(n) => report.forgotten = n,
            Err(e) => tracing::warn!("forgetting the UDP flows of members that went: {e}"),
        }
        Ok(report)
    }

    /// Forgets what was committed, so that the next sync rebuilds the table's services
    /// (after a failed commit, whose effect is unknown).
    pub fn reset(&mut self) {
        self.started = false;
        self.committed.clear();
        self.hairpins.clear();
        self.outsides.clear();
        self.floating.clear();
        self.router_snat = None;
        self.next_number = 0;
        self.free_numbers.clear();
    }

    /// Removes what an earlier owner made and makes the fixed part anew, in `batch`.
    fn rebuild(&mut self, batch: &mut Batch) -> Result<()> {
        self.reset();
        let chains = self.nft.chains()?;
        let sets = self.nft.sets()?;
        let ours =
            |c: &String| BASE_CHAINS.contains(&c.as_str()) || c.starts_with(SERVICE_CHAIN_PREFIX);
        // Rules first (they use the maps), then the maps, then the chains they jumped to.
        for c in chains.iter().filter(|c| ours(c)) {
            batch.flush_chain(c);
        }
        let fixed: Vec<&str> = [&V4, &V6]
            .iter()
            .flat_map(|f| {
                [
                    f.ips,
                    f.external,
                    f.reject,
                    f.members,
                    f.hairpin,
                    f.outside,
                    f.floating,
                    f.fixed,
                    f.nodeports,
                    f.nodeports_reject,
                ]
            })
            .chain(LEGACY_NODEPORTS)
            .collect();
        for s in sets
            .iter()
            .filter(|s| fixed.contains(&s.as_str()) || s.starts_with(AFFINITY_PREFIX))
        {
            batch.delete_set(s);
        }
        for c in chains.iter().filter(|c| ours(c)) {
            batch.delete_chain(c);
        }
        self.skeleton(batch);
        Ok(())
    }

    fn skeleton(&self, batch: &mut Batch) {
        batch.add_table();
        let port = [DataType::INET_PROTO, DataType::INET_SERVICE];
        let verdict = Some(DataType::VERDICT);
        for v6 in [false, true] {
            let f = family(v6);
            let addr = DataType::addr(v6);
            let frontend = DataType::concat(&[addr, port[0], port[1]]);
            let to = Some(DataType::concat(&[addr, DataType::INET_SERVICE]));
            for (name, key, data) in [
                (f.ips, frontend, verdict),
                (f.external, frontend, verdict),
                (f.reject, frontend, None),
                (
                    f.members,
                    DataType::concat(&[DataType::NUMBER, DataType::NUMBER]),
                    to,
                ),
                (f.hairpin, DataType::concat(&[addr, addr]), None),
                (f.outside, addr, None),
                (f.floating, addr, Some(addr)),
                (f.fixed, addr, Some(addr)),
                (f.nodeports, DataType::concat(&port), verdict),
                (f.nodeports_reject, DataType::concat(&port), None),
            ] {
                batch.add_set(&SetSpec::new(name, key, data));
            }
        }
        let base = |kind, hook, priority| {
            Some(BaseChain {
                kind,
                hook,
                priority,
            })
        };
        batch.add_chain(CHAIN, None);
        batch.add_chain(REJECT, None);
        batch.add_chain(ROUTER_SNAT, None);
        batch.add_chain(
            PREROUTING,
            base(ChainType::Nat, HookPoint::Prerouting, -100),
        );
        batch.add_chain(OUTPUT, base(ChainType::Nat, HookPoint::Output, -100));
        batch.add_chain(
            POSTROUTING,
            base(ChainType::Nat, HookPoint::Postrouting, 100),
        );
        batch.add_chain(
            FILTER_PREROUTING,
            base(ChainType::Filter, HookPoint::Prerouting, -110),
        );
        batch.add_chain(
            FILTER_OUTPUT,
            base(ChainType::Filter, HookPoint::Output, -110),
        );
        for chain in [PREROUTING, OUTPUT] {
            batch.add_rule(chain, vec![expr::verdict(expr::Verdict::Jump(CHAIN))], None);
        }
        // Every packet passes these hooks, bridged ones too where br_netfilter runs: only
        // a connection's first packet can be refused, so the rest pass after one test.
        for chain in [FILTER_PREROUTING, FILTER_OUTPUT] {
            let mut new = expr::ct_state(expr::ct::NEW);
            new.push(expr::verdict(expr::Verdict::Jump(REJECT)));
            batch.add_rule(chain, new, None);
        }
        for v6 in [false, true] {
            let f = family(v6);
            let w = if v6 { 4 } else { 1 };
            let frontend = || {
                let mut e = expr::nfproto(v6);
                e.extend([
                    expr::load(Field::DstAddr, v6, reg32(0)),
                    expr::load_l4proto(reg32(w)),
                    expr::load(Field::DstPort, v6, reg32(w + 1)),
                ]);
                e
            };
            let mut cluster = frontend();
            cluster.push(expr::vmap(f.ips, reg32(0)));
            batch.add_rule(CHAIN, cluster, None);
            let mut mark = frontend();
            mark.push(expr::lookup(f.external, reg32(0), true));
            mark.extend(expr::set_mark(MASQUERADE_MARK));
            batch.add_rule(CHAIN, mark, None);
            let mut external = frontend();
            external.push(expr::vmap(f.external, reg32(0)));
            batch.add_rule(CHAIN, external, None);
            add_rejects(batch, frontend, f.reject);
            let mut hairpin = expr::nfproto(v6);
            hairpin.extend(expr::ct_status(expr::ct_status::DNAT));
            hairpin.extend([
                expr::load(Field::SrcAddr, v6, reg32(0)),
                expr::load(Field::DstAddr, v6, reg32(w)),
                expr::lookup(f.hairpin, reg32(0), true),
                expr::masquerade(),
            ]);
            batch.add_rule(POSTROUTING, hairpin, None);
            let mut outside = expr::nfproto(v6);
            outside.extend(expr::ct_status(expr::ct_status::DNAT));
            outside.extend([
                expr::load(Field::DstAddr, v6, reg32(0)),
                expr::lookup(f.outside, reg32(0), true),
                expr::masquerade(),
            ]);
            batch.add_rule(POSTROUTING, outside, None);
        }
        for v6 in [false, true] {
            let f = family(v6);
            let nodeport = || {
                let mut e = expr::nfproto(v6);
                e.extend(expr::daddr_local());
                e.extend([
                    expr::load_l4proto(reg32(0)),
                    expr::load(Field::DstPort, false, reg32(1)),
                ]);
                e
            };
            let mut mark = nodeport();
            mark.push(expr::lookup(f.nodeports, reg32(0), true));
            mark.extend(expr::set_mark(MASQUERADE_MARK));
            batch.add_rule(CHAIN, mark, None);
            let mut jump = nodeport();
            jump.push(expr::vmap(f.nodeports, reg32(0)));
            batch.add_rule(CHAIN, jump, None);
            add_rejects(batch, nodeport, f.nodeports_reject);
        }
        for v6 in [false, true] {
            let f = family(v6);
            let mut mark = expr::nfproto(v6);
            mark.extend([
                expr::load(Field::DstAddr, v6, reg32(0)),
                expr::lookup(f.floating, reg32(0), true),
            ]);
            mark.extend(expr::set_mark(MASQUERADE_MARK));
            batch.add_rule(CHAIN, mark, None);
            let mut dnat = expr::nfproto(v6);
            dnat.extend([
                expr::load(Field::DstAddr, v6, reg32(0)),
                expr::map(f.floating, reg32(0), reg32(0)),
                expr::dnat(v6, reg32(0), None),
            ]);
            batch.add_rule(CHAIN, dnat, None);
        }
        for &source in &self.sources {
            let v6 = source.is_ipv6();
            let mut snat = expr::nfproto(v6);
            snat.extend(expr::has_mark(MASQUERADE_MARK));
            snat.extend([
                expr::immediate(reg32(0), &addr_bytes(source)),
                expr::snat(v6, reg32(0)),
            ]);
            batch.add_rule(POSTROUTING, snat, None);
        }
        let mut masquerade = expr::has_mark(MASQUERADE_MARK);
        masquerade.push(expr::masquerade());
        batch.add_rule(POSTROUTING, masquerade, None);
        if let Some(public) = &self.public_interface {
            for v6 in [false, true] {
                let mut snat = expr::nfproto(v6);
                snat.extend([
                    expr::load_ifname(false, Reg::Reg1),
                    expr::cmp(Reg::Reg1, true, &expr::ifname_bytes(public)),
                    expr::load(Field::SrcAddr, v6, reg32(0)),
                    expr::map(family(v6).fixed, reg32(0), reg32(0)),
                    expr::snat(v6, reg32(0)),
                ]);
                batch.add_rule(POSTROUTING, snat, None);
            }
            batch.add_rule(
                POSTROUTING,
                vec![
                    expr::load_ifname(false, Reg::Reg1),
                    expr::cmp(Reg::Reg1, true, &expr::ifname_bytes(public)),
                    expr::verdict(expr::Verdict::Jump(ROUTER_SNAT)),
                ],
                None,
            );
        }
    }

    /// The rules of a service's chain: pick a member at random (first the one this
    /// client had, with affinity) and send the connection there.
    ///
    /// Affinity is a set of (client . member index), one rule per index, as kube-proxy
    /// keeps one set per endpoint: a rule that wrote a looked-up member into a map
    /// would be one nft 1.0.6's `list ruleset` aborts on, and an index names another
    /// member only when the members change, which flushes the set.
    fn rules(batch: &mut Batch, id: &str, s: &Service, number: u32) {
        let (chain, affinity) = names(id);
        let v6 = s.vip.is_ipv6();
        let f = family(v6);
        let w = if v6 { 4 } else { 1 };
        // Registers: the client's address from 0, the member's index in w, the
        // service's number after it; the member lookup then writes the member's address
        // from 0 and its port in w.
        let to_member = [
            expr::immediate(reg32(w + 1), &number.to_ne_bytes()),
            expr::map(f.members, reg32(w), reg32(0)),
            expr::dnat(v6, reg32(0), Some(reg32(w))),
        ];
        let n = Self::members(s).count() as u32;
        if s.affinity.is_some() {
            for i in 0..n {
                let mut sticky = expr::nfproto(v6);
                sticky.extend([
                    expr::load(Field::SrcAddr, v6, reg32(0)),
                    expr::immediate(reg32(w), &i.to_ne_bytes()),
                    expr::lookup(&affinity, reg32(0), true),
                    expr::update_set(&affinity, reg32(0)),
                ]);
                sticky.extend(to_member.clone());
                batch.add_rule(&chain, sticky, None);
            }
        }
        // The chain is only reached for packets of the VIP's family: the check is for
        // nft, which prints the client's address as such after it.
        let mut pick = expr::nfproto(v6);
        pick.push(expr::random(reg32(w), n));
        if s.affinity.is_some() {
            pick.extend([
                expr::load(Field::SrcAddr, v6, reg32(0)),
                expr::update_set(&affinity, reg32(0)),
            ]);
        }
        pick.extend(to_member);
        batch.add_rule(&chain, pick, None);
    }

    fn affinity_set(batch: &mut Batch, name: &str, v6: bool, timeout: Duration) {
        batch.add_set(&SetSpec {
            name,
            key: DataType::concat(&[DataType::addr(v6), DataType::NUMBER]),
            data: None,
            interval: false,
            timeout: Some(timeout),
        });
    }

    /// The frontends (map or set, key) a service answers on.
    fn frontends(s: &Service) -> Vec<(&'static str, Vec<u8>, bool)> {
        let f = family(s.vip.is_ipv6());
        let serving = Self::members(s).next().is_some();
        let mut out = vec![(
            if serving { f.ips } else { f.reject },
            frontend_key(s.vip, s.protocol, s.port),
            serving,
        )];
        for ip in s
            .external
            .iter()
            .filter(|ip| ip.is_ipv6() == s.vip.is_ipv6())
        {
            out.push((
                if serving { f.external } else { f.reject },
                frontend_key(*ip, s.protocol, s.port),
                serving,
            ));
        }
        if let Some(p) = s.node_port {
            out.push((
                if serving {
                    f.nodeports
                } else {
                    f.nodeports_reject
                },
                port_key(s.protocol, p),
                serving,
            ));
        }
        out
    }

    fn members(s: &Service) -> impl Iterator<Item = &(IpAddr, u16)> {
        s.members
            .iter()
            .filter(move |(a, _)| a.is_ipv6() == s.vip.is_ipv6())
    }

    fn add(&mut self, batch: &mut Batch, id: &str, s: &Service, number: u32) {
        self.hairpins(batch, &BTreeSet::new(), &Self::addresses(s));
        self.outsides(batch, &BTreeSet::new(), &Self::outside(s));
        let (chain, affinity) = names(id);
        let v6 = s.vip.is_ipv6();
        batch.add_chain(&chain, None);
        if let Some(t) = s.affinity {
            Self::affinity_set(batch, &affinity, v6, t);
        }
        let f = family(v6);
        for (i, (addr, port)) in Self::members(s).enumerate() {
            batch.add_element(
                f.members,
                &member_key(number, i as u32),
                Some(target(*addr, *port)),
                id,
            );
        }
        if Self::members(s).next().is_some() {
            Self::rules(batch, id, s, number);
        }
        for (set, key, serving) in Self::frontends(s) {
            if serving {
                batch.add_jump_element(set, &key, &chain);
            } else {
                batch.add_element(set, &key, None, id);
            }
        }
    }

    fn remove(&mut self, batch: &mut Batch, id: &str, old: &Committed) {
        let (chain, affinity) = names(id);
        let s = &old.service;
        self.hairpins(batch, &Self::addresses(s), &BTreeSet::new());
        self.outsides(batch, &Self::outside(s), &BTreeSet::new());
        for (set, key, _) in Self::frontends(s) {
            batch.delete_element(set, &key);
        }
        let f = family(s.vip.is_ipv6());
        for i in 0..Self::members(s).count() {
            batch.delete_element(f.members, &member_key(old.number, i as u32));
        }
        batch.flush_chain(&chain);
        if s.affinity.is_some() {
            batch.delete_set(&affinity);
        }
        batch.delete_chain(&chain);
    }

    fn change(&mut self, batch: &mut Batch, id: &str, old: &Committed, new: &Service) {
        let (chain, affinity) = names(id);
        let s = &old.service;
        self.hairpins(batch, &Self::addresses(s), &Self::addresses(new));
        self.outsides(batch, &Self::outside(s), &Self::outside(new));
        let (before, after) = (Self::frontends(s), Self::frontends(new));
        for (set, key, serving) in &before {
            if !after.contains(&(*set, key.clone(), *serving)) {
                batch.delete_element(set, key);
            }
        }
        let (was, now): (Vec<_>, Vec<_>) =
            (Self::members(s).collect(), Self::members(new).collect());
        let same_rules = was.len() == now.len()
            && s.affinity == new.affinity
            && s.vip.is_ipv6() == new.vip.is_ipv6();
        if same_rules && was != now {
            // Only whom the indexes name changed: the elements, not the chain. A new rule
            // would make the kernel check the whole table at commit (its nat expression
            // asks for validation), a cost that grows with the services.
            let f = family(new.vip.is_ipv6());
            for (i, (old_target, new_target)) in was.iter().zip(&now).enumerate() {
                if old_target != new_target {
                    let key = member_key(old.number, i as u32);
                    batch.delete_element(f.members, &key);
                    batch.add_element(
                        f.members,
                        &key,
                        Some(target(new_target.0, new_target.1)),
                        id,
                    );
                }
            }
            if s.affinity.is_some() {
                // Nobody may stay with a member that is gone.
                batch.flush_set(&affinity);
            }
        } else if !same_rules {
            let f = family(s.vip.is_ipv6());
            for i in 0..Self::members(s).count() {
                batch.delete_element(f.members, &member_key(old.number, i as u32));
            }
            batch.flush_chain(&chain);
            match (s.affinity, new.affinity) {
                (Some(a), Some(b)) if a == b && s.vip.is_ipv6() == new.vip.is_ipv6() => {
                    // The members changed: nobody may stay with one that is gone.
                    batch.flush_set(&affinity);
                }
                (was, now) => {
                    if was.is_some() {
                        batch.delete_set(&affinity);
                    }
                    if let Some(t) = now {
                        Self::affinity_set(batch, &affinity, new.vip.is_ipv6(), t);
                    }
                }
            }
            let f = family(new.vip.is_ipv6());
            for (i, (addr, port)) in Self::members(new).enumerate() {
                batch.add_element(
                    f.members,
                    &member_key(old.number, i as u32),
                    Some(target(*addr, *port)),
                    id,
                );
            }
            if Self::members(new).next().is_some() {
                Self::rules(batch, id, new, old.number);
            }
        }
        for (set, key, serving) in &after {
            if !before.contains(&(*set, key.clone(), *serving)) {
                if *serving {
                    batch.add_jump_element(set, key, &chain);
                } else {
                    batch.add_element(set, key, None, id);
                }
            }
        }
    }

    /// Counts the services that send to each member address, keeping one hairpin
    /// element per address in use: `gone` are a service's addresses before, `come`
    /// after.
    fn hairpins(&mut self, batch: &mut Batch, gone: &BTreeSet<IpAddr>, come: &BTreeSet<IpAddr>) {
        count_users(
            &mut self.hairpins,
            batch,
            gone,
            come,
            hairpin_key,
            "hairpin",
        );
    }

    /// As [`Services::hairpins`], for the members outside corvid's networks.
    fn outsides(&mut self, batch: &mut Batch, gone: &BTreeSet<IpAddr>, come: &BTreeSet<IpAddr>) {
        let key = |a: IpAddr| (family(a.is_ipv6()).outside, addr_bytes(a));
        count_users(&mut self.outsides, batch, gone, come, key, "outside");
    }

    fn outside(s: &Service) -> BTreeSet<IpAddr> {
        Self::addresses(s)
            .into_iter()
            .filter(|a| s.outside.contains(a))
            .collect()
    }

    fn addresses(s: &Service) -> BTreeSet<IpAddr> {
        Self::members(s).map(|(a, _)| *a).collect()
    }

    fn sync_floating(&mut self, batch: &mut Batch, want: &BTreeMap<IpAddr, IpAddr>) {
        for (public, fixed) in &self.floating {
            if want.get(public) != Some(fixed) {
                let f = family(public.is_ipv6());
                batch.delete_element(f.floating, &addr_bytes(*public));
                batch.delete_element(f.fixed, &addr_bytes(*fixed));
            }
        }
        for (public, fixed) in want {
            if public.is_ipv6() != fixed.is_ipv6() || self.floating.get(public) == Some(fixed) {
                continue;
            }
            let f = family(public.is_ipv6());
            batch.add_element(
                f.floating,
                &addr_bytes(*public),
                Some(addr_bytes(*fixed)),
                "floating",
            );
            batch.add_element(
                f.fixed,
                &addr_bytes(*fixed),
                Some(addr_bytes(*public)),
                "floating",
            );
        }
        self.floating = want
            .iter()
            .filter(|(p, f)| p.is_ipv6() == f.is_ipv6())
            .map(|(p, f)| (*p, *f))
            .collect();
    }
}

/// Keeps one element per address in use in `users` (how many services use each):
/// `gone` are a service's addresses before, `come` after.
fn count_users(
    users: &mut HashMap<IpAddr, usize>,
    batch: &mut Batch,
    gone: &BTreeSet<IpAddr>,
    come: &BTreeSet<IpAddr>,
    key: impl Fn(IpAddr) -> (&'static str, Vec<u8>),
    comment: &str,
) {
    for a in gone.difference(come) {
        if let Some(n) = users.get_mut(a) {
            *n -= 1;
            if *n == 0 {
                users.remove(a);
                let (set, k) = key(*a);
                batch.delete_element(set, &k);
            }
        }
    }
    for a in come.difference(gone) {
        let n = users.entry(*a).or_default();
        *n += 1;
        if *n == 1 {
            let (set, k) = key(*a);
            batch.add_element(set, &k, None, comment);
        }
    }
}

fn hairpin_key(addr: IpAddr) -> (&'static str, Vec<u8>) {
    let mut k = addr_bytes(addr);
    k.extend(addr_bytes(addr));
    (family(addr.is_ipv6()).hairpin, k)
}
