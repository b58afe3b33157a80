//! What the controller holds of the watcher's groups and its pods' ports' groups, and the
//! calls that bring it to what the engine wants: only the differences, so that a restart
//! that finds everything in place makes no call and the hosts rewrite nothing.

use std::collections::{BTreeSet, HashMap};

use corvid_api::{ApiError, Client, Port, PortUpdate, SecurityGroup, SecurityGroupRule};

use super::translate::{GroupId, GroupSpec, Rule, POLICY_TAG};
use crate::ids;

/// One group as the controller holds it.
#[derive(Debug, Default)]
struct Held {
    /// Its rules, with their IDs.
    rules: HashMap<Rule, String>,
    /// Rules the watcher never writes (Neutron's default egress rules of a new group),
    /// by ID: removed.
    strays: Vec<String>,
}

impl Held {
    fn of(g: &SecurityGroup) -> Held {
        let mut held = Held::default();
        for r in &g.security_group_rules {
            match Rule::of(r) {
                Some(rule) => {
                    held.rules.insert(rule, r.id.clone());
                }
                None => held.strays.push(r.id.clone()),
            }
        }
        held
    }
}

/// What one pass is to bring about.
#[derive(Debug)]
pub struct Work {
    /// Groups, with what they should be (`None`: gone).
    pub groups: Vec<(GroupId, Option<GroupSpec>)>,
    /// Pods' ports, by pod UID, with their groups (`None`: the pod is gone).
    pub ports: Vec<(String, Option<Vec<GroupId>>)>,
    /// Only make groups the controller lacks: what the engine knows is not whole yet, and
    /// nothing that exists may change on its word.
    pub only_new: bool,
}

/// What one pass did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Groups now as they should be.
    pub groups: Vec<GroupId>,
    /// Ports now as they should be.
    pub ports: Vec<String>,
    /// What failed, for the log; the rest is tried again.
    pub errors: Vec<String>,
}

/// The controller's side, as last read or written.
#[derive(Debug, Default)]
pub struct Applied {
    groups: HashMap<GroupId, Held>,
    /// Each pod's port's groups, sorted, by pod UID.
    ports: HashMap<String, Vec<GroupId>>,
}

impl Applied {
    /// Reads the watcher's groups and its pods' ports' groups.
    pub fn load(c: &Client) -> Result<Applied, ApiError> {
        let (groups, _) = c.list::<SecurityGroup>(&[("tags", POLICY_TAG)])?;
        let (ports, _) = c.list::<Port>(&[("device_owner", ids::POD_OWNER)])?;
        Ok(Applied {
            groups: groups.iter().map(|g| (g.id.clone(), Held::of(g))).collect(),
            ports: ports
                .into_iter()
                .map(|p| {
                    let mut groups = p.security_groups;
                    groups.sort();
                    (p.device_id, groups)
                })
                .collect(),
        })
    }

    /// The groups the controller holds.
    pub fn groups(&self) -> impl Iterator<Item = &GroupId> {
        self.groups.keys()
    }

    /// The pods whose ports the controller holds.
    pub fn pods(&self) -> impl Iterator<Item = &String> {
        self.ports.keys()
    }

    /// A port was just made with `groups`.
    pub fn port_made(&mut self, pod_uid: &str, groups: Vec<GroupId>) {
        self.ports.insert(pod_uid.to_string(), groups);
    }

    /// Makes groups first (a rule may name another as its remote, a port may join it),
    /// then their rules, then ports, then deletes groups no port holds any more.
    pub fn apply(&mut self, c: &Client, work: &Work) -> Outcome {
        let mut out = Outcome::default();
        let wanted: Vec<(&GroupId, &GroupSpec)> = work
            .groups
            .iter()
            .filter_map(|(id, s)| s.as_ref().map(|s| (id, s)))
            .collect();
        let mut made = BTreeSet::new();
        // Groups not as they should be: no port joins them in this pass (a new group
        // still has the rules letting everything out).
        let mut unsure = BTreeSet::new();
        for (id, spec) in &wanted {
            if self.groups.contains_key(*id) {
                continue;
            }
            match c.create_or_get::<SecurityGroup>(id, spec.create(id)) {
                Ok(g) => {
                    self.groups.insert(g.id.clone(), Held::of(&g));
                    made.insert(g.id);
                }
                Err(e) => {
                    unsure.insert((*id).clone());
                    out.errors.push(format!("making group {id}: {e}"))
                }
            }
        }
        for (id, spec) in &wanted {
            if work.only_new && !made.contains(*id) {
                continue;
            }
            match self.rules(c, id, spec) {
                Ok(true) => out.groups.push((*id).clone()),
                Ok(false) => {}
                Err(e) => {
                    unsure.insert((*id).clone());
                    out.errors.push(format!("rules of group {id}: {e}"))
                }
            }
        }
        if work.only_new {
            return out;
        }
        // Ports that only join groups first (a peer's members), then those that leave
        // some (the open group a policy now closes): a pod is not isolated before the
        // pods it lets in are in the group that lets them.
        let mut calls: Vec<(&String, &Vec<GroupId>)> = Vec::new();
        for (uid, want) in &work.ports {
            let Some(want) = want else {
                self.ports.remove(uid);
                out.ports.push(uid.clone());
                continue;
            };
            if let Some(g) = want.iter().find(|g| unsure.contains(*g)) {
                out.errors
                    .push(format!("pod {uid}'s port waits for group {g}"));
            } else if self.ports.get(uid) == Some(want) {
                out.ports.push(uid.clone());
            } else {
                calls.push((uid, want));
            }
        }
        let joins_only = |(uid, want): &(&String, &Vec<GroupId>)| {
            self.ports
                .get(*uid)
                .is_some_and(|has| has.iter().all(|g| want.contains(g)))
        };
        let (first, then): (Vec<_>, Vec<_>) = calls.into_iter().partition(joins_only);
        for phase in [first, then] {
            for ((uid, want), r) in phase.iter().zip(set_ports(c, &phase)) {
                match r {
                    Ok(true) => {
                        self.ports.insert((*uid).clone(), (*want).clone());
                        out.ports.push((*uid).clone());
                    }
                    // Not made yet: what it is made with is not known here.
                    Ok(false) => {
                        self.ports.remove(*uid);
                        out.ports.push((*uid).clone());
                    }
                    Err(e) => out.errors.push(format!("groups of pod {uid}'s port: {e}")),
                }
            }
        }
        for (id, spec) in &work.groups {
            if spec.is_some() {
                continue;
            }
            match c.delete_if_present::<SecurityGroup>(id) {
                Ok(_) => {
                    self.groups.remove(id);
                    out.groups.push(id.clone());
                }
                Err(e) => out.errors.push(format!("deleting group {id}: {e}")),
            }
        }
        out
    }

    /// Adds the rules `spec` has and the group lacks, removes the others; true once the
    /// group is as `spec` says.
    fn rules(&mut self, c: &Client, id: &str, spec: &GroupSpec) -> Result<bool, ApiError> {
        let Some(held) = self.groups.get_mut(id) else {
            return Ok(false);
        };
        // What should go goes first: a rule too many lets through what no policy
        // allows, one too few only holds back what is about to be let through.
        let extra: Vec<(Option<Rule>, String)> = held
            .rules
            .iter()
            .filter(|(r, _)| !spec.rules.contains(*r))
            .map(|(r, rid)| (Some(r.clone()), rid.clone()))
            .chain(held.strays.iter().map(|rid| (None, rid.clone())))
            .collect();
        for (rule, rid) in extra {
            c.delete_if_present::<SecurityGroupRule>(&rid)?;
            match rule {
                Some(r) => held.rules.remove(&r),
                None => {
                    held.strays.retain(|s| *s != rid);
                    None
                }
            };
        }
        let mut failed = None;
        for rule in &spec.rules {
            if held.rules.contains_key(rule) {
                continue;
            }
            match c.create::<SecurityGroupRule>(rule.create(id)) {
                Ok(r) => {
                    held.rules.insert(rule.clone(), r.id);
                }
                // Made by an attempt whose answer was lost: read the group again.
                Err(ApiError::Neutron { status: 409, .. }) => {
                    *held = Held::of(&c.get::<SecurityGroup>(id)?);
                    if !held.rules.contains_key(rule) {
                        failed = Some(ApiError::Transport(format!(
                            "rule {rule:?} refused as existing but not found"
                        )));
                    }
                }
                Err(e) => failed = Some(e),
            }
        }
        failed.map_or(Ok(true), Err)
    }
}

/// How many port updates are in flight at once: a policy of a namespace of thousands of
/// pods changes thousands of ports, and the controller commits concurrent writes together.
const PARALLEL_PORTS: usize = 8;

/// Gives each pod's port its groups, several at once: true where it did, false where the
/// port is not made yet (it is made with the groups the engine has then).
fn set_ports(c: &Client, ports: &[(&String, &Vec<GroupId>)]) -> Vec<Result<bool, ApiError>> {
    let one = |(uid, want): &(&String, &Vec<GroupId>)| {
        let update = PortUpdate {
            security_groups: Some((*want).clone()),
            ..Default::default()
        };
        match c.update::<Port>(&ids::port(uid), update) {
            Ok(_) => Ok(true),
            Err(ApiError::Neutron {
                status: 404, kind, ..
            }) if kind == "PortNotFound" => Ok(false),
            Err(e) => Err(e),
        }
    };
    let chunk = ports.len().div_ceil(PARALLEL_PORTS).max(1);
    std::thread::scope(|s| {
        let running: Vec<_> = ports
            .chunks(chunk)
            .map(|part| s.spawn(move || part.iter().map(one).collect::<Vec<_>>()))
            .collect();
        running
            .into_iter()
            .flat_map(|t| t.join().expect("a port update does not panic"))
            .collect()
    })
}
