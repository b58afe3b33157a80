//! The NetworkPolicy reconciler: policies, pods and namespaces into the engine
//! (`translate`), and the engine's changes onto the controller (`apply`) as security
//! groups and ports' groups, which every agent run with `--security-groups` enforces.
//!
//! Nothing that exists changes before the namespaces, the pods and the policies have
//! all been listed: a restarted watcher that knew only some of them would open or close
//! pods for a moment, and then rewrite it all back. A port made before then is made shut.

pub mod apply;
pub mod selectors;
pub mod translate;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use corvid_api::Host;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::watcher::Event;
use kube::ResourceExt;

use super::pods::Pods;
use super::retry::Retry;
use super::Ctx;
use apply::{Applied, Work};
use translate::{Engine, GroupId, PodInfo, Policy};

/// How often the hosts are listed again for a pod whose node is not one yet.
const HOSTS_EVERY: Duration = Duration::from_secs(1);

/// The engine, the controller's side, and what is still to be brought over.
pub struct Policies {
    engine: Engine,
    /// `None` until read from the controller.
    applied: Option<Applied>,
    groups: BTreeSet<GroupId>,
    ports: BTreeSet<String>,
    /// The UIDs of a list of policies in progress.
    listing: Option<HashSet<String>>,
    /// The first whole list of policies has arrived.
    pub listed: bool,
    hosts_read: Option<Instant>,
    /// A retry is on its way: failures meanwhile add none.
    retrying: bool,
}

impl Policies {
    /// Nothing known yet.
    pub fn new() -> Policies {
        Policies {
            engine: Engine::new(),
            applied: None,
            groups: BTreeSet::new(),
            ports: BTreeSet::new(),
            listing: None,
            listed: false,
            hosts_read: None,
            retrying: false,
        }
    }

    /// A policy event.
    pub fn event(&mut self, e: Event<NetworkPolicy>) {
        match e {
            Event::Init => self.listing = Some(HashSet::new()),
            Event::InitApply(np) | Event::Apply(np) => {
                let Some(uid) = np.uid() else { return };
                if let Some(l) = &mut self.listing {
                    l.insert(uid.clone());
                }
                match Policy::from_k8s(&np) {
                    Ok(p) => self.engine.set_policy(&uid, p),
                    // Dropping it would open what it isolates: what was understood of it
                    // before stays.
                    Err(e) => {
                        let ns = np.namespace().unwrap_or_default();
                        tracing::warn!(namespace = %ns, policy = %np.name_any(), "NetworkPolicy not understood, its last version kept: {e}");
                    }
                }
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                for uid in unlisted(self.engine.policies(), &listed) {
                    self.engine.remove_policy(&uid);
                }
                self.listed = true;
            }
            Event::Delete(np) => {
                if let Some(uid) = np.uid() {
                    self.engine.remove_policy(&uid);
                }
            }
        }
    }

    /// A namespace as listed or watched.
    pub fn namespace(&mut self, n: &Namespace) {
        self.engine.set_namespace(&n.name_any(), n.labels().clone());
    }

    /// A namespace is gone.
    pub fn namespace_gone(&mut self, name: &str) {
        self.engine.remove_namespace(name);
    }

    /// The namespaces a whole list brought are all there are.
    pub fn namespaces_listed(&mut self, live: &HashSet<String>) {
        for n in unlisted(self.engine.namespaces(), live) {
            self.engine.remove_namespace(&n);
        }
    }

    /// A pod that has (or gets) a port; lists the hosts again when its node is not one.
    pub async fn pod(&mut self, ctx: &Ctx, uid: &str, p: &Pod) {
        self.engine.set_pod(uid, PodInfo::of(p));
        let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let stale = self.hosts_read.is_none_or(|at| at.elapsed() >= HOSTS_EVERY);
        if node.is_some_and(|n| !self.engine.knows_host(n)) && stale {
            self.read_hosts(ctx).await;
        }
    }

    /// A pod is gone, or has no port.
    pub fn pod_gone(&mut self, uid: &str) {
        self.engine.remove_pod(uid);
    }

    /// The pods a whole list brought are all there are.
    pub fn pods_listed(&mut self, live: &HashSet<String>) {
        for uid in unlisted(self.engine.pods(), live) {
            self.engine.remove_pod(&uid);
        }
    }

    /// The groups a new port of the pod is made with. Once every list is in
    /// (`complete`) and each of its groups holds its rules, they are its own, recorded so
    /// that no sync changes a port being made; before, the port is made shut (its node's
    /// group only, when that holds) and given its groups by a later sync.
    pub fn port_groups(&mut self, uid: &str, complete: bool) -> Option<Vec<GroupId>> {
        self.collect();
        let groups = self.engine.groups_of(uid)?;
        let holds = |g: &GroupId| !self.groups.contains(g);
        if !(complete && self.applied.is_some() && groups.iter().all(holds)) {
            return Some(
                self.engine
                    .node_group_of(uid)
                    .filter(holds)
                    .into_iter()
                    .collect(),
            );
        }
        self.ports.remove(uid);
        if let Some(a) = &mut self.applied {
            a.port_made(uid, groups.clone());
        }
        Some(groups)
    }

    /// Tries the sync again after the backoff, unless a retry is on its way already.
    fn again(&mut self, ctx: &Ctx) {
        if !self.retrying {
            self.retrying = true;
            ctx.queue.retry(Retry::Policies);
        }
    }

    /// The retry has come.
    pub fn retried(&mut self) {
        self.retrying = false;
    }

    /// Takes what the engine changed into what is still to be brought over.
    fn collect(&mut self) {
        let (groups, ports) = self.engine.take_dirty();
        self.groups.extend(groups);
        self.ports.extend(ports);
    }

    /// Reads the hosts' underlay addresses: the nodes' traffic every pod lets through.
    pub async fn read_hosts(&mut self, ctx: &Ctx) {
        self.hosts_read = Some(Instant::now());
        match ctx.call(|c| c.list::<Host>(&[]).map(|l| l.0)).await {
            Ok(hosts) => self.engine.set_hosts(
                hosts
                    .into_iter()
                    .map(|h| (h.id, h.underlay_ip))
                    .collect::<BTreeMap<_, _>>(),
            ),
            Err(e) => tracing::warn!("listing hosts for the nodes' group: {e}"),
        }
    }

    /// Reads the controller's side again and compares all of it at the next sync: what
    /// was changed or lost behind the watcher's back is mended.
    pub async fn reload(&mut self, ctx: &Ctx) {
        match ctx.call(Applied::load).await {
            Ok(applied) => {
                self.groups.extend(applied.groups().cloned());
                self.ports.extend(applied.pods().cloned());
                self.groups.extend(self.engine.groups());
                self.ports.extend(self.engine.pods().cloned());
                self.applied = Some(applied);
            }
            Err(e) => tracing::warn!("reading the NetworkPolicies' groups: {e}"),
        }
    }

    /// Brings the engine's changes over to the controller. `complete` once namespaces,
    /// pods and policies have all been listed; before, only missing groups are made.
    pub async fn sync(&mut self, ctx: &Ctx, pods: &mut Pods, complete: bool) {
        self.collect();
        if self.groups.is_empty() && (self.ports.is_empty() || !complete) {
            return;
        }
        if self.applied.is_none() {
            self.reload(ctx).await;
        }
        let Some(mut applied) = self.applied.take() else {
            self.again(ctx);
            return;
        };
        let work = Work {
            groups: self
                .groups
                .iter()
                .map(|id| (id.clone(), self.engine.group(id)))
                .collect(),
            ports: if complete {
                self.ports
                    .iter()
                    .map(|uid| (uid.clone(), self.engine.groups_of(uid)))
                    .collect()
            } else {
                Vec::new()
            },
            only_new: !complete,
        };
        // A port being made is made first: its groups are then changed, not raced.
        for (uid, _) in &work.ports {
            pods.settle(uid).await;
        }
        let (back, out) = ctx
            .call(move |c| {
                let out = applied.apply(c, &work);
                Ok((applied, out))
            })
            .await
            .map_or((None, None), |(a, o)| (Some(a), Some(o)));
        // A lost state (the call's thread died) is read again.
        self.applied = back;
        let Some(out) = out else {
            self.again(ctx);
            return;
        };
        for g in &out.groups {
            self.groups.remove(g);
        }
        for p in &out.ports {
            self.ports.remove(p);
        }
        if !out.errors.is_empty() {
            for e in &out.errors {
                tracing::warn!("NetworkPolicy groups: {e}");
            }
            self.again(ctx);
        } else if complete {
            ctx.queue.done(&Retry::Policies.key());
        }
    }
}

/// Of the objects known, those a whole list did not bring: gone while no one watched.
fn unlisted<'a>(known: impl Iterator<Item = &'a String>, listed: &HashSet<String>) -> Vec<String> {
    known.filter(|k| !listed.contains(*k)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A new port is made shut until every list is in and each of its groups holds its
    /// rules: its node's group when that one holds, nothing before; then its own groups,
    /// recorded as its, so that no sync changes the port being made.
    #[test]
    fn a_new_port_is_made_shut_until_its_groups_are_sure() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "a", "uid": "u1"},
            "spec": {"containers": [], "nodeName": "h1"},
        }))
        .unwrap();
        let mut p = Policies::new();
        p.engine.set_pod("u1", PodInfo::of(&pod));
        let node = translate::node("h1");
        assert_eq!(
            p.port_groups("u1", false),
            Some(vec![]),
            "nothing holds yet"
        );
        p.collect();
        p.groups.remove(&node);
        assert_eq!(p.port_groups("u1", false), Some(vec![node.clone()]));
        assert_eq!(
            p.port_groups("u1", true),
            Some(vec![node.clone()]),
            "the controller's side not read yet"
        );
        p.applied = Some(Applied::default());
        assert_eq!(
            p.port_groups("u1", true),
            Some(vec![node.clone()]),
            "open groups pending"
        );
        assert!(
            p.ports.contains("u1"),
            "a later sync gives the port its groups"
        );
        p.groups.clear();
        let all = p.engine.groups_of("u1").unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(p.port_groups("u1", true), Some(all));
        assert!(
            !p.ports.contains("u1"),
            "made with its groups: nothing owed"
        );
        assert_eq!(
            p.port_groups("u2", true),
            None,
            "a pod the engine does not know"
        );
    }
}
