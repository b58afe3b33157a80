//! Which routers have a network with a port bound here, and which networks' plans changed,
//! kept up as each plan changes: an interface change then costs the same whether its
//! router has ten networks or a thousand.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::plan::NetworkPlan;

/// The routers present here and what changed since it was last asked.
#[derive(Debug, Default)]
pub struct Presence {
    /// The router of each network with a port bound here, for those on one.
    router_of: HashMap<String, String>,
    /// How many such networks each router has.
    networks: HashMap<String, usize>,
    /// Routers that came here or left since [`Presence::take_flips`].
    flips: BTreeSet<String>,
    /// Networks whose plan was set since [`Presence::take_changed`].
    changed: BTreeSet<String>,
}

impl Presence {
    /// Takes network `id`'s plan as now set (`None`: no plan here).
    pub fn note(&mut self, id: &str, plan: Option<&NetworkPlan>) {
        self.changed.insert(id.to_string());
        let now = plan.filter(|n| n.is_local()).and_then(|n| n.router.clone());
        let was = self.router_of.remove(id);
        if was == now {
            if let Some(r) = now {
                self.router_of.insert(id.to_string(), r);
            }
            return;
        }
        if let Some(r) = was {
            let count = self.networks.get_mut(&r).expect("counted when noted");
            *count -= 1;
            if *count == 0 {
                self.networks.remove(&r);
                self.flips.insert(r);
            }
        }
        if let Some(r) = now {
            let count = self.networks.entry(r.clone()).or_default();
            *count += 1;
            if *count == 1 {
                self.flips.insert(r.clone());
            }
            self.router_of.insert(id.to_string(), r);
        }
    }

    /// Starts again from `plans` whole (a full pass): every network counts as changed.
    pub fn reset(&mut self, plans: &BTreeMap<String, NetworkPlan>) {
        *self = Presence::default();
        for (id, n) in plans {
            self.note(id, Some(n));
        }
        self.flips.clear();
    }

    /// Whether router `r` has a network with a port bound here.
    pub fn is_here(&self, r: &str) -> bool {
        self.networks.contains_key(r)
    }

    /// The routers that came here or left since last asked.
    pub fn take_flips(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.flips)
    }

    /// The networks whose plan was set since last asked.
    pub fn take_changed(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.changed)
    }

    /// The routers present here.
    pub fn routers(&self) -> impl Iterator<Item = &str> {
        self.networks.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(id: &str, router: Option<&str>, local: bool) -> NetworkPlan {
        let external = if local {
            BTreeMap::from([("p".to_string(), "cvp".to_string())])
        } else {
            BTreeMap::new()
        };
        NetworkPlan {
            id: id.into(),
            bridge: format!("cvb{id}"),
            vxlan: format!("cvx{id}"),
            vni: 1,
            mtu: 1450,
            gateways: Vec::new(),
            masquerade: Vec::new(),
            advertisement: None,
            router: router.map(str::to_string),
            ports: BTreeMap::new(),
            external,
            remote: BTreeMap::new(),
        }
    }

    #[test]
    fn a_router_comes_with_its_first_local_network_and_goes_with_its_last() {
        let mut p = Presence::default();
        p.note("a", Some(&plan("a", Some("r"), false)));
        assert!(
            !p.is_here("r"),
            "a network with no port here brings no router"
        );
        assert!(p.take_flips().is_empty());

        p.note("a", Some(&plan("a", Some("r"), true)));
        p.note("b", Some(&plan("b", Some("r"), true)));
        assert!(p.is_here("r"));
        assert_eq!(p.take_flips(), BTreeSet::from(["r".to_string()]));
        assert_eq!(p.take_changed().len(), 2);

        p.note("a", None);
        assert!(p.is_here("r"), "b still holds it");
        assert!(p.take_flips().is_empty());
        // Moved to another router: r leaves, s comes.
        p.note("b", Some(&plan("b", Some("s"), true)));
        assert!(!p.is_here("r") && p.is_here("s"));
        let flips = BTreeSet::from(["r".to_string(), "s".to_string()]);
        assert_eq!(p.take_flips(), flips);
        assert_eq!(p.routers().collect::<Vec<_>>(), ["s"]);
    }

    #[test]
    fn a_reset_counts_every_plan_and_flips_nothing() {
        let mut p = Presence::default();
        p.note("old", Some(&plan("old", Some("q"), true)));
        let plans = BTreeMap::from([
            ("a".to_string(), plan("a", Some("r"), true)),
            ("b".to_string(), plan("b", Some("r"), false)),
        ]);
        p.reset(&plans);
        assert!(p.is_here("r") && !p.is_here("q"));
        assert!(p.take_flips().is_empty());
        assert_eq!(p.take_changed().len(), 2);
    }
}
