//! Security groups: stateful filtering per port, in two tables of one name. The bridge
//! family sees the port's own interface (what it sends as, what reaches it); the inet
//! family sees connection tracking, for bridged traffic through br_netfilter. This
//! kernel family has no connection tracking of its own in the bridge family, so the
//! inet side marks packets of established connections and the bridge side reads the
//! mark.
//!
//! ```text
//! table bridge corvid-sg {
//!   map sg-spoof { type ifname : verdict }           port's interface -> sg-s-<port>
//!   map sg-to    { type ifname : verdict }           port's interface -> sg-i-<port>
//!   set sg-m4-<group> { type ipv4_addr }             the group's members (and sg-m6-)
//!   chain sg-prerouting  { hook prerouting priority -300; iifname vmap @sg-spoof }
//!   chain sg-postrouting { hook postrouting priority 0; arp and neighbour discovery
//!       accept; oifname vmap @sg-to }
//!   chain sg-s-<port> { router advertisements drop; ether saddr <mac> ip saddr <addr>
//!       accept ...; drop }
//!   chain sg-i-<port> { meta mark & EST != 0 accept (stateful); jump sg-gi-<group> ...;
//!       drop }
//!   chain sg-gi-<group> { one rule per ingress rule: ... accept }
//! }
//! table inet corvid-sg {
//!   map sg-from { type ifname . ether_addr : verdict }  bridge . a MAC the port may send
//!                                                       from (its own, its pairs') -> sg-e-<port>
//!   chain sg-forward { hook forward priority 0; ct state established,related
//!       meta mark set mark | EST; neighbour discovery accept;
//!       iifname . ether saddr vmap @sg-from }           (sg-input alike)
//!   chain sg-output { hook output priority 0; ct state established,related mark | EST }
//!   chain sg-e-<port> { meta mark & EST != 0 accept (stateful); jump sg-ge-<group> ...;
//!       drop }
//!   chain sg-ge-<group> { one rule per egress rule: ... accept }
//! }
//! ```
//!
//! A port comes or goes with three chains and three map elements, whatever the number
//! of ports; a member joins a group with one element per table; a group's rules change
//! with its two chains. The agent keeps what it committed in memory and sends only the
//! difference.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_netfilter::nftables::Expressions;

use super::expr::{self, ethertypes, reg32, Field, Reg, Verdict};
use super::{addr_bytes, TableRef};
use super::{padded, BaseChain, Batch, ChainType, DataType, HookPoint, Nftables, SetSpec};
use crate::Result;

/// The tables' name, in the bridge and the inet family.
pub const TABLE: &str = "corvid-sg";
/// The mark bit the inet table sets on packets of established or related connections,
/// for the bridge table to let them reach a port.
pub const ESTABLISHED_MARK: u32 = 0x0002_0000;

const SPOOF: &str = "sg-spoof";
const TO: &str = "sg-to";
const FROM: &str = "sg-from";
const ETHER: DataType = DataType::ETHER;
/// ICMPv6 router solicitation, neighbour solicitation and advertisement: what a port
/// sends to find its neighbours.
const ND_OUT: [u8; 3] = [133, 135, 136];
/// Router advertisement, neighbour solicitation and advertisement: what it receives.
const ND_IN: [u8; 3] = [134, 135, 136];
const ICMPV6: u8 = 58;
/// ICMPv6's router advertisement.
const ROUTER_ADVERT: u8 = 134;

/// Where a rule's remote end is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remote {
    /// Anywhere.
    Any,
    /// Inside a prefix.
    Prefix(IpNet),
    /// An address of a member of a group (which [`Want::members`] must hold).
    Group(String),
}

/// One rule of a group, matched in its direction: ingress on traffic to the port, the
/// remote end being the source; egress on traffic from it, the remote the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// The IP protocol number, none for any.
    pub protocol: Option<u8>,
    /// The destination ports, first and last (TCP, UDP, SCTP and the like).
    pub ports: Option<(u16, u16)>,
    /// ICMP's type and code, for ICMP and ICMPv6.
    pub icmp: Option<(u8, Option<u8>)>,
    /// The remote end.
    pub remote: Remote,
}

/// A group's rules, by direction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Group {
    /// What may reach its ports.
    pub ingress: Vec<Rule>,
    /// What its ports may start.
    pub egress: Vec<Rule>,
}

/// A port plugged here that its groups filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortFilter {
    /// The host end of its veth pair.
    pub ifname: String,
    /// The bridge that end is on.
    pub bridge: String,
    /// The port's MAC address.
    pub mac: [u8; 6],
    /// What it may send as: its MAC and addresses, and its allowed address pairs.
    pub sources: Vec<([u8; 6], IpNet)>,
    /// Its groups, whose rules are a union.
    pub groups: Vec<String>,
    /// Replies to what its rules allowed pass (false when its groups are stateless).
    pub stateful: bool,
}

/// What the filter holds: ports by ID, groups by ID, and each remote group's members.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Want {
    /// The filtered ports plugged here.
    pub ports: BTreeMap<String, PortFilter>,
    /// The groups of those ports.
    pub groups: BTreeMap<String, Group>,
    /// The addresses of every group a rule names as its remote end.
    pub members: BTreeMap<String, BTreeSet<IpAddr>>,
}

/// What changed since the last sync, as the caller knows it: a sync given it looks at
/// these alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touched {
    /// Ports whose filter may have come, gone or changed.
    pub ports: BTreeSet<String>,
    /// Groups whose rules or member sets may have come, gone or changed whole.
    pub groups: BTreeSet<String>,
    /// Members that may have joined or left a group's set.
    pub members: BTreeSet<(String, IpAddr)>,
}

impl Want {
    /// Takes from `want` what `touched` names: the ports, the groups (rules and member
    /// sets), the single members; the rest stays as it is.
    pub fn follow(&mut self, want: &Want, touched: &Touched) {
        for g in &touched.groups {
            copy(&mut self.members, &want.members, g);
            copy(&mut self.groups, &want.groups, g);
        }
        for (g, a) in &touched.members {
            if let (Some(now), Some(then)) = (want.members.get(g), self.members.get_mut(g)) {
                if now.contains(a) {
                    then.insert(*a);
                } else {
                    then.remove(a);
                }
            }
        }
        for id in &touched.ports {
            copy(&mut self.ports, &want.ports, id);
        }
    }
}

/// Sets `key` of `to` as it is in `from`: copied, or removed.
fn copy<V: Clone>(to: &mut BTreeMap<String, V>, from: &BTreeMap<String, V>, key: &str) {
    match from.get(key) {
        Some(v) => {
            to.insert(key.to_string(), v.clone());
        }
        None => {
            to.remove(key);
        }
    }
}

/// How many elements and chains a sync changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Ports added, changed or removed.
    pub ports: usize,
    /// Groups whose rules were written or removed.
    pub groups: usize,
    /// Member addresses added or removed.
    pub members: usize,
}

/// The security groups' tables of this namespace and what they hold.
pub struct SecurityGroups {
    nft: Nftables,
    started: bool,
    held: Want,
    /// The `sg-from` keys committed (bridge . MAC), each with the port it sends to.
    claims: BTreeMap<Vec<u8>, String>,
}

fn spoof_chain(port: &str) -> String {
    format!("sg-s-{port}")
}
fn ingress_chain(port: &str) -> String {
    format!("sg-i-{port}")
}
fn egress_chain(port: &str) -> String {
    format!("sg-e-{port}")
}
fn group_chain(group: &str, ingress: bool) -> String {
    format!("sg-g{}-{group}", if ingress { 'i' } else { 'e' })
}
fn members_set(group: &str, v6: bool) -> String {
    format!("sg-m{}-{group}", if v6 { 6 } else { 4 })
}

/// The `sg-from` keys of a port: its bridge with each MAC it may send from (its own and
/// its allowed pairs'), so that no MAC it is let send from skips its egress rules.
fn from_keys(p: &PortFilter) -> BTreeSet<Vec<u8>> {
    std::iter::once(p.mac)
        .chain(p.sources.iter().map(|(mac, _)| *mac))
        .map(|mac| {
            let mut key = expr::ifname_bytes(&p.bridge).to_vec();
            key.extend(padded(&mac));
            key
        })
        .collect()
}

/// Which port each `sg-from` key sends to: the first port by ID that has it (two ports
/// of one bridge may share a pair's MAC, VRRP's).
fn claims(want: &Want) -> BTreeMap<Vec<u8>, String> {
    let mut out = BTreeMap::new();
    for (id, p) in &want.ports {
        for key in from_keys(p) {
            out.entry(key).or_insert_with(|| id.clone());
        }
    }
    out
}

fn ifname_key(name: &str) -> Vec<u8> {
    expr::ifname_bytes(name).to_vec()
}

impl SecurityGroups {
    /// Opens the calling thread's namespace's tables; the first sync replaces what an
    /// earlier owner left.
    pub fn open() -> Result<SecurityGroups> {
        Ok(SecurityGroups {
            nft: Nftables::open()?,
            started: false,
            held: Want::default(),
            claims: BTreeMap::new(),
        })
    }

    /// Starts over at the next sync when either table lost its base chains (a
    /// `nft flush ruleset`, a firewall's reload): what was committed is not there to diff
    /// against.
    pub fn check(&mut self) -> Result<()> {
        if self.started
            && !(self
                .nft
                .has_chain_in(TableRef::SG_BRIDGE, "sg-postrouting")?
                && self.nft.has_chain_in(TableRef::SG_INET, "sg-forward")?)
        {
            self.started = false;
        }
        Ok(())
    }

    /// What the last sync committed.
    pub fn held(&self) -> &Want {
        &self.held
    }

    /// Makes the tables hold `want`, sending only what differs from the last commit
    /// (everything, made anew, before the first or after a failed one).
    pub fn sync(&mut self, want: &Want) -> Result<Report> {
        self.sync_touched(want, None)
    }

    /// As [`SecurityGroups::sync`], looking only at what `touched` names when given (the
    /// caller knows what changed since the last sync): a member joining a group of
    /// 10,000 costs one comparison, not a walk of the group.
    pub fn sync_touched(&mut self, want: &Want, touched: Option<&Touched>) -> Result<Report> {
        let mut b = Batch::new();
        let mut report = Report::default();
        let touched = touched.filter(|_| self.started);
        if !self.started {
            rebuild(&mut b);
            self.held = Want::default();
            self.claims.clear();
        }
        let held = &self.held;
        let union = |a: Vec<&String>, b: Vec<&String>| -> BTreeSet<String> {
            a.into_iter().chain(b).cloned().collect()
        };
        let (sets, groups, ports) = match touched {
            Some(t) => (t.groups.clone(), t.groups.clone(), t.ports.clone()),
            None => (
                union(want.members.keys().collect(), held.members.keys().collect()),
                union(want.groups.keys().collect(), held.groups.keys().collect()),
                union(want.ports.keys().collect(), held.ports.keys().collect()),
            ),
        };
        let empty = BTreeSet::new();
        // Member sets that come, and whole sets compared.
        for g in &sets {
            let Some(members) = want.members.get(g) else {
                continue;
            };
            let old = held.members.get(g);
            if old.is_none() {
                for table in [TableRef::SG_BRIDGE, TableRef::SG_INET] {
                    b.in_table(table);
                    for v6 in [false, true] {
                        b.add_set(&SetSpec::new(&members_set(g, v6), DataType::addr(v6), None));
                    }
                }
            }
            let old = old.unwrap_or(&empty);
            for table in [TableRef::SG_BRIDGE, TableRef::SG_INET] {
                b.in_table(table);
                for a in old.difference(members) {
                    b.delete_element(&members_set(g, a.is_ipv6()), &addr_bytes(*a));
                }
                for a in members.difference(old) {
                    b.add_element(&members_set(g, a.is_ipv6()), &addr_bytes(*a), None, g);
                }
            }
            report.members += old.symmetric_difference(members).count();
        }
        // Single members of sets that stay.
        let members: Vec<&(String, IpAddr)> = touched
            .map(|t| {
                t.members
                    .iter()
                    .filter(|(g, _)| !sets.contains(g))
                    .collect()
            })
            .unwrap_or_default();
        for (g, a) in &members {
            let (Some(now), Some(then)) = (want.members.get(g), held.members.get(g)) else {
                continue;
            };
            let set = members_set(g, a.is_ipv6());
            match (now.contains(a), then.contains(a)) {
                (true, false) => {
                    for table in [TableRef::SG_BRIDGE, TableRef::SG_INET] {
                        b.in_table(table);
                        b.add_element(&set, &addr_bytes(*a), None, g);
                    }
                }
                (false, true) => {
                    for table in [TableRef::SG_BRIDGE, TableRef::SG_INET] {
                        b.in_table(table);
                        b.delete_element(&set, &addr_bytes(*a));
                    }
                }
                _ => continue,
            }
            report.members += 1;
        }
        for g in &groups {
            let Some(group) = want.groups.get(g) else {
                continue;
            };
            let old = held.groups.get(g);
            if old == Some(group) {
                continue;
            }
            report.groups += 1;
            for ingress in [true, false] {
                let chain = group_chain(g, ingress);
                b.in_table(side(ingress));
                if old.is_some() {
                    b.flush_chain(&chain);
                } else {
                    b.add_chain(&chain, None);
                }
                let rules = if ingress {
                    &group.ingress
                } else {
                    &group.egress
                };
                for r in rules {
                    b.add_rule(&chain, rule(r, ingress), None);
                }
            }
        }
        // Elements that jump to a port's chains go before the chains; all of a sync's
        // removals before its additions, so a key a port gives up is free for another.
        let claims = claims(want);
        b.in_table(TableRef::SG_INET);
        for (key, port) in &self.claims {
            if claims.get(key) != Some(port) {
                b.delete_element(FROM, key);
            }
        }
        for id in &ports {
            let Some(p) = held.ports.get(id) else {
                continue;
            };
            match want.ports.get(id) {
                None => unplug(&mut b, id, p, true),
                Some(new) if new != p => unplug(&mut b, id, p, false),
                Some(_) => continue,
            }
            report.ports += 1;
        }
        for id in &ports {
            let Some(p) = want.ports.get(id) else {
                continue;
            };
            let old = held.ports.get(id);
            if old == Some(p) {
                continue;
            }
            if old.is_none() {
                report.ports += 1;
            }
            plug(&mut b, id, p, old.is_some());
        }
        b.in_table(TableRef::SG_INET);
        for (key, port) in &claims {
            if self.claims.get(key) != Some(port) {
                b.add_jump_element(FROM, key, &egress_chain(port));
            }
        }
        for g in &groups {
            if held.groups.contains_key(g) && !want.groups.contains_key(g) {
                report.groups += 1;
                for ingress in [true, false] {
                    b.in_table(side(ingress));
                    let chain = group_chain(g, ingress);
                    b.flush_chain(&chain);
                    b.delete_chain(&chain);
                }
            }
        }
        for g in &sets {
            if let (Some(members), false) = (held.members.get(g), want.members.contains_key(g)) {
                report.members += members.len();
                for table in [TableRef::SG_BRIDGE, TableRef::SG_INET] {
                    b.in_table(table);
                    for v6 in [false, true] {
                        b.delete_set(&members_set(g, v6));
                    }
                }
            }
        }
        if let Err(e) = self.nft.commit(b) {
            // What the kernel holds is unknown: the next sync starts again.
            self.started = false;
            return Err(e);
        }
        self.started = true;
        self.claims = claims;
        match touched {
            None => self.held = want.clone(),
            Some(t) => {
                self.held.follow(want, t);
                // What the caller named is all that changed: a test of that promise.
                debug_assert_eq!(self.held, *want, "a change the caller did not name");
            }
        }
        Ok(report)
    }

    /// Removes both tables, with everything in them.
    pub fn remove(&mut self) -> Result<()> {
        let mut b = Batch::new();
        for table in [TableRef::SG_BRIDGE, TableRef::SG_INET] {
            b.in_table(table);
            b.add_table();
            b.delete_table();
        }
        self.nft.commit(b)?;
        self.started = false;
        self.held = Want::default();
        self.claims.clear();
        Ok(())
    }
}

/// The table a direction's group chains are in: ingress is matched on the bridge (the
/// port's interface), egress in inet (after connection tracking and DNAT).
fn side(ingress: bool) -> TableRef {
    if ingress {
        TableRef::SG_BRIDGE
    } else {
        TableRef::SG_INET
    }
}

/// Drops both tables and makes them anew, empty of ports and groups.
fn rebuild(b: &mut Batch) {
    for table in [TableRef::SG_BRIDGE, TableRef::SG_INET] {
        b.in_table(table);
        b.add_table();
        b.delete_table();
        b.add_table();
    }
    let filter = |hook, priority| {
        Some(BaseChain {
            kind: ChainType::Filter,
            hook,
            priority,
        })
    };
    b.in_table(TableRef::SG_BRIDGE);
    for map in [SPOOF, TO] {
        b.add_set(&SetSpec::new(
            map,
            DataType::IFNAME,
            Some(DataType::VERDICT),
        ));
    }
    // Before br_netfilter hands the frame to the inet hooks (priority 0).
    b.add_chain("sg-prerouting", filter(HookPoint::Prerouting, -300));
    b.add_rule(
        "sg-prerouting",
        vec![
            expr::load_ifname(true, reg32(0)),
            expr::vmap(SPOOF, reg32(0)),
        ],
        None,
    );
    b.add_chain("sg-postrouting", filter(HookPoint::Postrouting, 0));
    let mut arp = expr::ethertype(ethertypes::ARP);
    arp.push(expr::verdict(Verdict::Accept));
    b.add_rule("sg-postrouting", arp, None);
    for t in ND_IN {
        let mut nd = expr::ethertype(ethertypes::IPV6);
        nd.extend(neighbour_discovery(t));
        b.add_rule("sg-postrouting", nd, None);
    }
    b.add_rule(
        "sg-postrouting",
        vec![expr::load_ifname(false, reg32(0)), expr::vmap(TO, reg32(0))],
        None,
    );

    b.in_table(TableRef::SG_INET);
    b.add_set(&SetSpec::new(
        FROM,
        DataType::concat(&[DataType::IFNAME, ETHER]),
        Some(DataType::VERDICT),
    ));
    let mut established = expr::ct_state(expr::ct::ESTABLISHED | expr::ct::RELATED);
    established.extend(expr::set_mark(ESTABLISHED_MARK));
    for (chain, hook) in [
        ("sg-forward", HookPoint::Forward),
        ("sg-input", HookPoint::Input),
        ("sg-output", HookPoint::Output),
    ] {
        b.add_chain(chain, filter(hook, 0));
        b.add_rule(chain, established.clone(), None);
        if hook == HookPoint::Output {
            continue;
        }
        for t in ND_OUT {
            let mut nd = expr::nfproto(true);
            nd.extend(neighbour_discovery(t));
            b.add_rule(chain, nd, None);
        }
        let mut from = expr::iif_ethernet();
        from.extend([
            expr::load_ifname(true, reg32(0)),
            expr::load_ether(true, reg32(4)),
            expr::vmap(FROM, reg32(0)),
        ]);
        b.add_rule(chain, from, None);
    }
}

/// An ICMPv6 neighbour discovery message of `kind`, accepted.
fn neighbour_discovery(kind: u8) -> Vec<Expressions> {
    let mut out = expr::l4proto(ICMPV6);
    out.extend(expr::icmp(kind, None));
    out.push(expr::verdict(Verdict::Accept));
    out
}

/// One group rule as an nftables rule that accepts what it allows.
fn rule(r: &Rule, ingress: bool) -> Vec<Expressions> {
    let mut out = if ingress {
        expr::ethertype(if r.v6 {
            ethertypes::IPV6
        } else {
            ethertypes::IPV4
        })
    } else {
        expr::nfproto(r.v6)
    };
    let remote = if ingress {
        Field::SrcAddr
    } else {
        Field::DstAddr
    };
    match &r.remote {
        Remote::Any => {}
        Remote::Prefix(net) => out.extend(expr::in_prefix(remote, *net, true)),
        Remote::Group(g) => {
            out.push(expr::load(remote, r.v6, Reg::Reg1));
            out.push(expr::lookup(&members_set(g, r.v6), Reg::Reg1, true));
        }
    }
    if let Some(p) = r.protocol {
        out.extend(expr::l4proto(p));
    }
    if let Some((min, max)) = r.ports {
        out.extend(expr::dport_range(min, max));
    }
    if let Some((kind, code)) = r.icmp {
        out.extend(expr::icmp(kind, code));
    }
    out.push(expr::verdict(Verdict::Accept));
    out
}

/// Writes port `id`'s chains and map elements; `existing` when its chains are there,
/// emptied by [`unplug`].
fn plug(b: &mut Batch, id: &str, p: &PortFilter, existing: bool) {
    let (spoof, ingress, egress) = (spoof_chain(id), ingress_chain(id), egress_chain(id));
    b.in_table(TableRef::SG_BRIDGE);
    if !existing {
        b.add_chain(&spoof, None);
        b.add_chain(&ingress, None);
    }
    // A port is no router: its router advertisements go nowhere.
    let mut advert = expr::ethertype(ethertypes::IPV6);
    advert.extend(expr::l4proto(ICMPV6));
    advert.extend(expr::icmp(ROUTER_ADVERT, None));
    advert.push(expr::verdict(Verdict::Drop));
    b.add_rule(&spoof, advert, None);
    for rule in sources(p) {
        b.add_rule(&spoof, rule, None);
    }
    b.add_rule(&spoof, vec![expr::verdict(Verdict::Drop)], None);
    verdicts(b, &ingress, p, true);
    b.add_jump_element(SPOOF, &ifname_key(&p.ifname), &spoof);
    b.add_jump_element(TO, &ifname_key(&p.ifname), &ingress);
    b.in_table(TableRef::SG_INET);
    if !existing {
        b.add_chain(&egress, None);
    }
    verdicts(b, &egress, p, false);
}

/// A port chain of one direction: replies, then each group's rules, then drop.
fn verdicts(b: &mut Batch, chain: &str, p: &PortFilter, ingress: bool) {
    if p.stateful {
        let mut replies = expr::has_mark(ESTABLISHED_MARK);
        replies.push(expr::verdict(Verdict::Accept));
        b.add_rule(chain, replies, None);
    }
    for g in &p.groups {
        b.add_rule(
            chain,
            vec![expr::verdict(Verdict::Jump(&group_chain(g, ingress)))],
            None,
        );
    }
    b.add_rule(chain, vec![expr::verdict(Verdict::Drop)], None);
}

/// Takes port `id`'s map elements out and empties its chains, deleting them when
/// `gone`.
fn unplug(b: &mut Batch, id: &str, p: &PortFilter, gone: bool) {
    b.in_table(TableRef::SG_BRIDGE);
    b.delete_element(SPOOF, &ifname_key(&p.ifname));
    b.delete_element(TO, &ifname_key(&p.ifname));
    for chain in [spoof_chain(id), ingress_chain(id)] {
        b.flush_chain(&chain);
        if gone {
            b.delete_chain(&chain);
        }
    }
    b.in_table(TableRef::SG_INET);
    let chain = egress_chain(id);
    b.flush_chain(&chain);
    if gone {
        b.delete_chain(&chain);
    }
}

/// The anti-spoofing rules: what the port may send as, each accepted.
fn sources(p: &PortFilter) -> Vec<Vec<Expressions>> {
    let any4: IpNet = "0.0.0.0/32".parse().expect("valid prefix");
    let link_local: IpNet = "fe80::/10".parse().expect("valid prefix");
    let unspecified: IpNet = "::/128".parse().expect("valid prefix");
    let mut allowed: Vec<([u8; 6], IpNet)> = p.sources.clone();
    // An ARP probe, IPv6's link-local addresses and duplicate address detection.
    allowed.extend([(p.mac, any4), (p.mac, link_local), (p.mac, unspecified)]);
    let mut out = Vec::new();
    for (mac, net) in allowed {
        let v6 = matches!(net, IpNet::V6(_));
        let mut ip = expr::ether_source(mac, true);
        ip.extend(expr::ethertype(if v6 {
            ethertypes::IPV6
        } else {
            ethertypes::IPV4
        }));
        ip.extend(expr::in_prefix(Field::SrcAddr, net, true));
        ip.push(expr::verdict(Verdict::Accept));
        out.push(ip);
        if !v6 {
            let mut arp = expr::ether_source(mac, true);
            arp.extend(expr::ethertype(ethertypes::ARP));
            arp.extend(expr::arp_sender_in(net));
            arp.push(expr::verdict(Verdict::Accept));
            out.push(arp);
        }
    }
    out
}
