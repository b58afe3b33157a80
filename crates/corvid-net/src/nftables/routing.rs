//! Which corvid bridges may forward to which. The host holds every gateway of its
//! networks, so the kernel would route between any two of them; only networks on one
//! router may reach each other. Each bridge belongs to one domain, its router's or, on
//! no router, its own, and the domain is the bridge's interface group: a packet
//! forwarded between two bridges of corvid's domains passes when both groups are one.
//! One lookup per packet, and one link change and at most two elements per change,
//! whatever the number of networks. Written by the agent, which keeps what it committed
//! in memory and sends only the difference.
//!
//! ```text
//! set routing-domains { type ifgroup }                every domain in use
//! set routing-same    { type ifgroup . ifgroup }      (d . d) for each domain d
//! set routing-direct4 { type ipv4_addr }              remote ports routed straight to
//!                                                     their host (and routing-direct6)
//! set routing-direct-ok4 { type ipv4_addr . ifgroup } (port . its bridge's domain)
//! chain routing-forward { type filter hook forward priority -5
//!     iifgroup . oifgroup @routing-same accept       (most packets: one lookup)
//!     ip daddr @routing-direct4 meta mark set mark | DIRECT_MARK        (and ip6)
//!     ip saddr @routing-direct4 meta mark set mark | DIRECT_MARK        (and ip6)
//!     ct status dnat accept                           (a service's backends may be anywhere)
//!     iifgroup @routing-domains oifgroup @routing-domains drop
//!     meta mark & DIRECT_MARK != 0 iifgroup @routing-domains
//!         ip daddr . iifgroup != @routing-direct-ok4 drop }               (and ip6)
//! ```
//!
//! Links outside corvid's domains (another cluster's bridges, the uplink) are left alone.
//! A port reached by direct routing leaves through the underlay device, not a bridge, so
//! its address stands for its bridge: only its own domain may forward to it, and the mark
//! tells masquerade to leave it alone as it leaves a bridge's traffic between networks.
//! What such a port sends arrives by the underlay device too: the mark on it is what
//! corvid's iptables accept lets through where FORWARD drops (dockerd, ufw).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use super::expr::{self, reg32, Field};
use super::{addr_bytes, BaseChain, Batch, ChainType, DataType, HookPoint, Nftables, SetSpec};
use crate::{Netlink, Result};

const CHAIN: &str = "routing-forward";
const DOMAINS: &str = "routing-domains";
const SAME: &str = "routing-same";
const DIRECT4: &str = "routing-direct4";
const DIRECT6: &str = "routing-direct6";
const DIRECT_OK4: &str = "routing-direct-ok4";
const DIRECT_OK6: &str = "routing-direct-ok6";
/// The mark bit on a packet forwarded to a port reached by direct routing, which
/// masquerade leaves alone.
pub const DIRECT_MARK: u32 = 0x0008_0000;
/// The first group number corvid gives out ("cv" above, so as not to meet groups
/// administrators number from 1).
const FIRST_GROUP: u32 = 0x6376_0001;

/// The domain key of a bridge: its router's ID, or none for a network on no router.
pub type Router = Option<String>;

/// The routing filter of this namespace's corvid table and what it holds.
pub struct Routing {
    nft: Nftables,
    started: bool,
    /// Bridges with their router and the group committed for them.
    bridges: HashMap<String, (Router, u32)>,
    /// Groups of routers, with how many bridges are in each.
    routers: HashMap<String, (u32, usize)>,
    next: u32,
    free: Vec<u32>,
    /// Remote ports' addresses reached by direct routing, by the bridge of their network.
    direct: HashMap<String, BTreeSet<IpAddr>>,
}

/// The sets of direct routing's addresses of one family, and of their pairs.
fn direct_sets(v6: bool) -> (&'static str, &'static str) {
    if v6 {
        (DIRECT6, DIRECT_OK6)
    } else {
        (DIRECT4, DIRECT_OK4)
    }
}

fn direct_pair(addr: IpAddr, group: u32) -> Vec<u8> {
    [addr_bytes(addr), group.to_ne_bytes().to_vec()].concat()
}

fn same(group: u32) -> Vec<u8> {
    [group.to_ne_bytes(), group.to_ne_bytes()].concat()
}

impl Routing {
    /// Opens the calling thread's namespace's table; the first sync replaces what an
    /// earlier owner left.
    pub fn open() -> Result<Routing> {
        Ok(Routing {
            nft: Nftables::open()?,
            started: false,
            bridges: HashMap::new(),
            routers: HashMap::new(),
            next: FIRST_GROUP,
            free: Vec::new(),
            direct: HashMap::new(),
        })
    }

    /// Whether the filter holds what was last committed (false before the first sync and
    /// after a failed one).
    pub fn is_started(&self) -> bool {
        self.started
    }

    /// Makes the filter hold exactly `want` (bridge to router), sending what changed and
    /// putting each bridge that `nl` finds in its domain's group.
    pub fn sync(&mut self, nl: &mut Netlink, want: &BTreeMap<String, Router>) -> Result<()> {
        if !self.started {
            return self.update(nl, want.iter().map(|(b, r)| (b.clone(), Some(r.clone()))));
        }
        let gone = self
            .bridges
            .keys()
            .filter(|b| !want.contains_key(*b))
            .map(|b| (b.clone(), None));
        let changes: Vec<_> = gone
            .chain(want.iter().map(|(b, r)| (b.clone(), Some(r.clone()))))
            .collect();
        self.update(nl, changes)
    }

    /// Applies changes to some bridges alone: each to its router (`Some`), or out of the
    /// filter (`None`); a bridge already as asked costs nothing. Before the first sync
    /// (or after a failed one) the filter is made anew holding just these, so a caller
    /// that knows only changes calls [`Routing::sync`] then.
    pub fn update(
        &mut self,
        nl: &mut Netlink,
        changes: impl IntoIterator<Item = (String, Option<Router>)>,
    ) -> Result<()> {
        let mut batch = Batch::new();
        if !self.started {
            self.rebuild(&mut batch)?;
        }
        let mut regroup = Vec::new();
        for (bridge, want) in changes {
            match (self.bridges.get(&bridge), &want) {
                (Some((r, _)), Some(w)) if r == w => continue,
                (None, None) => continue,
                (Some(_), _) => self.remove(&mut batch, &bridge),
                (None, Some(_)) => {}
            }
            let group = match &want {
                Some(router) => self.add(&mut batch, &bridge, router),
                None => 0,
            };
            regroup.push((bridge, group));
        }
        if !batch.is_empty() {
            let _lock = super::lock()?;
            if let Err(e) = self.nft.commit(batch) {
                // What the kernel holds is unknown: the next sync starts again.
                self.started = false;
                return Err(e);
            }
            self.started = true;
        }
        // Groups after the elements: a bridge joins a domain the filter already knows.
        for (bridge, group) in regroup {
            if let Some(link) = nl.link_by_name(&bridge)? {
                if let Err(e) = nl.set_group(&link, group) {
                    self.started = false;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Counts `bridge` into its domain, adding the domain's elements when it is new.
    fn add(&mut self, batch: &mut Batch, bridge: &str, router: &Router) -> u32 {
        let existing = router.as_ref().and_then(|r| self.routers.get_mut(r));
        let group = match existing {
            Some((g, users)) => {
                *users += 1;
                *g
            }
            None => {
                let g = self.free.pop().unwrap_or_else(|| {
                    self.next += 1;
                    self.next - 1
                });
                if let Some(r) = router {
                    self.routers.insert(r.clone(), (g, 1));
                }
                let name = router.as_deref().unwrap_or(bridge);
                batch.add_element(DOMAINS, &g.to_ne_bytes(), None, name);
                batch.add_element(SAME, &same(g), None, name);
                g
            }
        };
        self.bridges
            .insert(bridge.to_string(), (router.clone(), group));
        for addr in self.direct.get(bridge).into_iter().flatten() {
            let (_, ok) = direct_sets(addr.is_ipv6());
            batch.add_element(ok, &direct_pair(*addr, group), None, bridge);
        }
        group
    }

    /// Makes the addresses reached by direct routing through each bridge named exactly
    /// those given, sending what changed. A bridge not in the filter keeps its addresses
    /// waiting for its domain: until then, none may forward to them.
    pub fn set_direct(
        &mut self,
        changes: impl IntoIterator<Item = (String, BTreeSet<IpAddr>)>,
    ) -> Result<()> {
        if !self.started {
            // Made whole by the caller's sync, which comes before.
            return Ok(());
        }
        let mut batch = Batch::new();
        for (bridge, want) in changes {
            let had = self.direct.get(&bridge).cloned().unwrap_or_default();
            let group = self.bridges.get(&bridge).map(|(_, g)| *g);
            for addr in had.difference(&want) {
                let (set, ok) = direct_sets(addr.is_ipv6());
                batch.delete_element(set, &addr_bytes(*addr));
                if let Some(g) = group {
                    batch.delete_element(ok, &direct_pair(*addr, g));
                }
            }
            for addr in want.difference(&had) {
                let (set, ok) = direct_sets(addr.is_ipv6());
                batch.add_element(set, &addr_bytes(*addr), None, &bridge);
                if let Some(g) = group {
                    batch.add_element(ok, &direct_pair(*addr, g), None, &bridge);
                }
            }
            if want.is_empty() {
                self.direct.remove(&bridge);
            } else {
                self.direct.insert(bridge, want);
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        let _lock = super::lock()?;
        self.nft.commit(batch).inspect_err(|_| self.started = false)
    }

    /// Counts `bridge` out of its domain, removing the domain's elements when it empties.
    fn remove(&mut self, batch: &mut Batch, bridge: &str) {
        let Some((router, group)) = self.bridges.remove(bridge) else {
            return;
        };
        for addr in self.direct.get(bridge).into_iter().flatten() {
            let (_, ok) = direct_sets(addr.is_ipv6());
            batch.delete_element(ok, &direct_pair(*addr, group));
        }
        if let Some(r) = &router {
            let (_, users) = self.routers.get_mut(r).expect("counted when added");
            *users -= 1;
            if *users > 0 {
                return;
            }
            self.routers.remove(r);
        }
        batch.delete_element(DOMAINS, &group.to_ne_bytes());
        batch.delete_element(SAME, &same(group));
        self.free.push(group);
    }

    /// Removes the chain and sets an earlier owner made and makes them anew, empty.
    fn rebuild(&mut self, batch: &mut Batch) -> Result<()> {
        self.bridges.clear();
        self.routers.clear();
        self.free.clear();
        self.direct.clear();
        self.next = FIRST_GROUP;
        let had_chain = self.nft.chains()?.iter().any(|c| c == CHAIN);
        let sets = self.nft.sets()?;
        batch.add_table();
        if had_chain {
            batch.flush_chain(CHAIN);
        }
        for s in [DOMAINS, SAME, DIRECT4, DIRECT6, DIRECT_OK4, DIRECT_OK6] {
            if sets.iter().any(|x| x == s) {
                batch.delete_set(s);
            }
        }
        batch.add_set(&SetSpec::new(DOMAINS, DataType::DEVGROUP, None));
        batch.add_set(&SetSpec::new(
            SAME,
            DataType::concat(&[DataType::DEVGROUP, DataType::DEVGROUP]),
            None,
        ));
        for (set, ok, addr) in [
            (DIRECT4, DIRECT_OK4, DataType::IPV4),
            (DIRECT6, DIRECT_OK6, DataType::IPV6),
        ] {
            batch.add_set(&SetSpec::new(set, addr, None));
            batch.add_set(&SetSpec::new(
                ok,
                DataType::concat(&[addr, DataType::DEVGROUP]),
                None,
            ));
        }
        batch.add_chain(
            CHAIN,
            Some(BaseChain {
                kind: ChainType::Filter,
                hook: HookPoint::Forward,
                priority: -5,
            }),
        );
        // Every packet forwarded, bridged ones too where br_netfilter runs, passes here:
        // traffic within a domain leaves after one lookup, and nothing after it concerns it
        // (direct routing's addresses are reached through the underlay device, in no domain).
        batch.add_rule(
            CHAIN,
            vec![
                expr::load_ifgroup(true, reg32(0)),
                expr::load_ifgroup(false, reg32(1)),
                expr::lookup(SAME, reg32(0), true),
                expr::verdict(expr::Verdict::Accept),
            ],
            None,
        );
        for (v6, field) in [false, true]
            .into_iter()
            .flat_map(|v6| [(v6, Field::DstAddr), (v6, Field::SrcAddr)])
        {
            let (set, _) = direct_sets(v6);
            let mut rule = expr::nfproto(v6);
            rule.extend([
                expr::load(field, v6, reg32(0)),
                expr::lookup(set, reg32(0), true),
            ]);
            rule.extend(expr::set_mark(DIRECT_MARK));
            batch.add_rule(CHAIN, rule, None);
        }
        let mut services = expr::ct_status(expr::ct_status::DNAT);
        services.push(expr::verdict(expr::Verdict::Accept));
        batch.add_rule(CHAIN, services, None);
        batch.add_rule(
            CHAIN,
            vec![
                expr::load_ifgroup(true, reg32(0)),
                expr::lookup(DOMAINS, reg32(0), true),
                expr::load_ifgroup(false, reg32(0)),
                expr::lookup(DOMAINS, reg32(0), true),
                expr::verdict(expr::Verdict::Drop),
            ],
            None,
        );
        for v6 in [false, true] {
            let (_, ok) = direct_sets(v6);
            // The group after the address, in the register that follows it.
            let group = reg32(if v6 { 4 } else { 1 });
            let mut rule = expr::nfproto(v6);
            rule.extend(expr::has_mark(DIRECT_MARK));
            rule.extend([
                expr::load_ifgroup(true, group),
                expr::lookup(DOMAINS, group, true),
                expr::load(Field::DstAddr, v6, reg32(0)),
                expr::lookup(ok, reg32(0), false),
                expr::verdict(expr::Verdict::Drop),
            ]);
            batch.add_rule(CHAIN, rule, None);
        }
        Ok(())
    }
}
