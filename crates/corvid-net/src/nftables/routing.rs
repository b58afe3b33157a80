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
//! chain routing-forward { type filter hook forward priority -5
//!     ct status dnat accept                           (a service's backends may be anywhere)
//!     iifgroup @routing-domains oifgroup @routing-domains
//!         iifgroup . oifgroup != @routing-same drop }
//! ```
//!
//! Links outside corvid's domains (another cluster's bridges, the uplink) are left alone.

use std::collections::{BTreeMap, HashMap};

use super::expr::{self, reg32};
use super::{BaseChain, Batch, ChainType, DataType, HookPoint, Nftables, SetSpec};
use crate::{Netlink, Result};

const CHAIN: &str = "routing-forward";
const DOMAINS: &str = "routing-domains";
const SAME: &str = "routing-same";
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
        group
    }

    /// Counts `bridge` out of its domain, removing the domain's elements when it empties.
    fn remove(&mut self, batch: &mut Batch, bridge: &str) {
        let Some((router, group)) = self.bridges.remove(bridge) else {
            return;
        };
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
        self.next = FIRST_GROUP;
        let had_chain = self.nft.chains()?.iter().any(|c| c == CHAIN);
        let sets = self.nft.sets()?;
        batch.add_table();
        if had_chain {
            batch.flush_chain(CHAIN);
        }
        for s in [DOMAINS, SAME] {
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
        batch.add_chain(
            CHAIN,
            Some(BaseChain {
                kind: ChainType::Filter,
                hook: HookPoint::Forward,
                priority: -5,
            }),
        );
        let mut services = expr::ct_status(expr::ct_status::DNAT);
        services.push(expr::verdict(expr::Verdict::Accept));
        batch.add_rule(CHAIN, services, None);
        batch.add_rule(
            CHAIN,
            vec![
                expr::load_ifgroup(true, reg32(0)),
                expr::lookup(DOMAINS, reg32(0), true),
                expr::load_ifgroup(false, reg32(1)),
                expr::lookup(DOMAINS, reg32(1), true),
                expr::lookup(SAME, reg32(0), false),
                expr::verdict(expr::Verdict::Drop),
            ],
            None,
        );
        Ok(())
    }
}
