//! The namespace reconciler: every namespace a network with a subnet carved from each pod
//! pool (one per family: dual stack with two), deleted once the namespace and the last of
//! its pods' ports are gone.

use std::collections::{HashMap, HashSet};

use corvid_api::{
    ApiError, Client, Network, NetworkCreate, Port, RouterInterface, Subnet, SubnetCreate,
    ROUTER_INTERFACE,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::runtime::reflector::{self, store::Writer, ObjectRef};
use kube::ResourceExt;

use super::retry::{namespace_key, Retry};
use super::{Ctx, PodPool};
use crate::ids;
use crate::metrics::{self, Kind};

/// A namespace's network as far as the watcher has made it.
#[derive(Debug, Clone)]
pub struct NamespaceNetwork {
    /// The network.
    pub network: Network,
    /// Its subnets.
    pub subnets: Vec<Subnet>,
}

/// What the controller should hold for a namespace.
#[derive(Debug, PartialEq)]
pub struct Wanted {
    /// The namespace's UID, which names both.
    pub uid: String,
    /// Its network.
    pub network: NetworkCreate,
    /// Its subnets, one of each pod pool.
    pub subnets: Vec<SubnetCreate>,
}

/// The IDs of a namespace's subnets, IPv4's first; the IDs of both families, whichever
/// it has.
fn subnet_ids(namespace_uid: &str) -> [String; 2] {
    [ids::subnet(namespace_uid), ids::subnet6(namespace_uid)]
}

/// What `n` should have: a network and a subnet of each of `pools`, unless it is going
/// away.
pub fn wanted(n: &Namespace, pools: &[PodPool]) -> Option<Wanted> {
    let (name, uid) = (n.name_any(), n.uid()?);
    if n.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let network_id = ids::network(&uid);
    let network = NetworkCreate {
        id: Some(network_id.clone()),
        name: Some(format!("k8s-{name}")),
        tags: Some(vec![
            ids::NETWORK_TAG.to_string(),
            ids::namespace_tag(&name),
            ids::namespace_uid_tag(&uid),
        ]),
        ..Default::default()
    };
    let subnets = pools
        .iter()
        .map(|pool| {
            let v6 = pool.cidr.addr().is_ipv6();
            SubnetCreate {
                id: Some(subnet_ids(&uid)[usize::from(v6)].clone()),
                network_id: network_id.clone(),
                name: Some(format!("k8s-{name}")),
                ip_version: Some(if v6 { 6 } else { 4 }),
                subnetpool_id: Some(pool.id()),
                prefixlen: Some(pool.prefix),
                ..Default::default()
            }
        })
        .collect();
    Some(Wanted {
        uid,
        network,
        subnets,
    })
}

/// The UIDs of the namespaces whose networks the controller holds but which are gone.
pub fn gone(networks: &[Network], live: &HashSet<String>) -> Vec<String> {
    networks
        .iter()
        .filter_map(|n| n.tags.iter().find_map(|t| t.strip_prefix("namespace-uid:")))
        .filter(|uid| !live.contains(*uid))
        .map(str::to_string)
        .collect()
}

/// Of a gone namespace's ports, the IDs of those to delete now (the watcher's, whose pod
/// is gone too) and whether others remain (pods still stopping, or not the watcher's).
/// Router interfaces are neither: they go with the subnet.
pub fn leftover<'a>(ports: &'a [Port], pods: &HashSet<String>) -> (Vec<&'a str>, bool) {
    let (delete, stay): (Vec<&Port>, Vec<&Port>) = ports
        .iter()
        .filter(|p| p.device_owner != ROUTER_INTERFACE)
        .partition(|p| p.device_owner == ids::POD_OWNER && !pods.contains(&p.device_id));
    (
        delete.iter().map(|p| p.id.as_str()).collect(),
        !stay.is_empty(),
    )
}

/// The namespaces as listed and watched, and the networks made for them.
pub struct Namespaces {
    store: reflector::Store<Namespace>,
    writer: Option<Writer<Namespace>>,
    /// Networks made, by namespace UID.
    networks: HashMap<String, NamespaceNetwork>,
    /// Gone namespaces whose networks wait for their last ports, by UID: each port of a
    /// gone pod deleted tries them again, rather than the next sweep.
    pending: HashSet<String>,
    /// The first whole list has arrived.
    pub listed: bool,
    /// The pools each namespace has a subnet of.
    pools: Vec<PodPool>,
    /// The router the networks are attached to, once set up.
    router: Option<String>,
}

impl Namespaces {
    /// No namespaces yet; subnets of `pools`.
    pub fn new(pools: Vec<PodPool>) -> Self {
        let (store, writer) = reflector::store();
        Namespaces {
            store,
            writer: Some(writer),
            networks: HashMap::new(),
            pending: HashSet::new(),
            listed: false,
            pools,
            router: None,
        }
    }

    /// Attaches every network made from now on to `router`.
    pub fn set_router(&mut self, router: String) {
        self.router = Some(router);
    }

    /// The writer the namespace watch's reflector keeps the store with.
    pub fn writer(&mut self) -> Option<Writer<Namespace>> {
        self.writer.take()
    }

    /// The names of the namespaces the watch has brought.
    pub fn names(&self) -> HashSet<String> {
        self.store.state().iter().map(|n| n.name_any()).collect()
    }

    /// Makes the namespace's network and subnet, unless it is going away or made.
    pub async fn reconcile(&mut self, ctx: &Ctx, n: &Namespace) {
        // Every pod's reconcile comes through here: a network already made costs a lookup.
        if n.uid().is_some_and(|uid| self.networks.contains_key(&uid)) {
            return;
        }
        let Some(want) = wanted(n, &self.pools) else {
            return;
        };
        let uid = want.uid.clone();
        match make(ctx, want, self.router.clone()).await {
            Ok(made) => {
                ctx.queue.done(&namespace_key(&uid));
                tracing::info!(namespace = %n.name_any(), network = %made.network.id, "namespace network ready");
                self.networks.insert(uid, made);
            }
            Err(e) => {
                tracing::warn!(namespace = %n.name_any(), "making the namespace's network: {e}");
                ctx.queue.retry(Retry::Namespace(Box::new(n.clone())));
            }
        }
    }

    /// The network of the namespace named `name`, made now if the namespace watch has
    /// not brought it yet.
    pub async fn network_of(&mut self, ctx: &Ctx, name: &str) -> Option<NamespaceNetwork> {
        let n = match self.store.get(&ObjectRef::new(name)) {
            Some(n) => (*n).clone(),
            None => Api::<Namespace>::all(ctx.kube.clone())
                .get_opt(name)
                .await
                .ok()??,
        };
        self.reconcile(ctx, &n).await;
        self.networks.get(&n.uid()?).cloned()
    }

    /// Deletes a gone namespace's network once its ports are gone (deleting those whose
    /// pod, of `pods`, is gone too); while some remain it is tried again as each goes (and
    /// at the next sweep), and after a failure with backoff.
    pub async fn remove(&mut self, ctx: &Ctx, namespace_uid: &str, pods: &HashSet<String>) {
        let net = ids::network(namespace_uid);
        let (n, subnets) = (net.clone(), subnet_ids(namespace_uid));
        let pods = pods.clone();
        let done = ctx
            .call(move |c| {
                let (ports, _) = c.list::<Port>(&[("network_id", &n)])?;
                let (delete, stay) = leftover(&ports, &pods);
                if !stay {
                    // The router's interface first: the subnet cannot go while it has one.
                    for p in ports.iter().filter(|p| p.device_owner == ROUTER_INTERFACE) {
                        for s in p
                            .fixed_ips
                            .iter()
                            .filter(|f| subnets.contains(&f.subnet_id))
                        {
                            detach(c, &p.device_id, &s.subnet_id)?;
                        }
                    }
                }
                for id in delete {
                    c.delete_if_present::<Port>(id)?;
                }
                if stay {
                    return Ok(false);
                }
                for s in &subnets {
                    c.delete_if_present::<Subnet>(s)?;
                }
                c.delete_if_present::<Network>(&n)?;
                Ok(true)
            })
            .await;
        let retry = Retry::NetworkDelete(namespace_uid.to_string());
        match done {
            Ok(true) => {
                self.networks.remove(namespace_uid);
                self.pending.remove(namespace_uid);
                ctx.queue.done(&retry.key());
                tracing::info!(network = %net, "network of a gone namespace deleted");
            }
            Ok(false) => {
                self.pending.insert(namespace_uid.to_string());
            }
            Err(e) => {
                tracing::warn!(network = %net, "deleting the network of a gone namespace: {e}; trying again");
                self.pending.insert(namespace_uid.to_string());
                ctx.queue.retry(retry);
            }
        }
    }

    /// Tries the networks that waited for their last ports again.
    pub async fn remove_pending(&mut self, ctx: &Ctx, pods: &HashSet<String>) {
        let pending: Vec<String> = self.pending.iter().cloned().collect();
        for uid in pending {
            self.remove(ctx, &uid, pods).await;
        }
    }

    /// Deletes the networks of namespaces that went while the watcher was not looking.
    pub async fn sweep(&mut self, ctx: &Ctx, pods: &HashSet<String>) {
        metrics::sweep(Kind::Namespace);
        let live: HashSet<String> = self.store.state().iter().filter_map(|n| n.uid()).collect();
        let listed = ctx
            .call(|c| {
                c.list::<Network>(&[("tags", ids::NETWORK_TAG)])
                    .map(|l| l.0)
            })
            .await;
        let networks = match listed {
            Ok(networks) => networks,
            Err(e) => {
                tracing::warn!("sweeping networks: {e}");
                return;
            }
        };
        for uid in gone(&networks, &live) {
            self.remove(ctx, &uid, pods).await;
        }
    }
}

/// Makes (or finds) the namespace's network and subnets, each attached to `router`.
async fn make(
    ctx: &Ctx,
    want: Wanted,
    router: Option<String>,
) -> Result<NamespaceNetwork, ApiError> {
    ctx.call(move |c| {
        let network = c.create_or_get(&ids::network(&want.uid), want.network)?;
        let mut subnets: Vec<Subnet> = Vec::new();
        for create in want.subnets {
            let id = create.id.clone().unwrap_or_default();
            subnets.push(c.create_or_get(&id, create)?);
        }
        if let Some(router) = router {
            let (attached, _) = c.list::<Port>(&[
                ("network_id", network.id.as_str()),
                ("device_owner", ROUTER_INTERFACE),
                ("device_id", router.as_str()),
            ])?;
            for subnet in &subnets {
                let on = attached
                    .iter()
                    .any(|p| p.fixed_ips.iter().any(|f| f.subnet_id == subnet.id));
                if !on {
                    c.add_router_interface(&router, &on_subnet(&subnet.id))?;
                }
            }
        }
        Ok(NamespaceNetwork { network, subnets })
    })
    .await
}

fn on_subnet(id: &str) -> RouterInterface {
    RouterInterface {
        subnet_id: Some(id.to_string()),
        port_id: None,
    }
}

/// Takes `subnet` off `router`; already off is done.
fn detach(c: &Client, router: &str, subnet: &str) -> Result<(), ApiError> {
    match c.remove_router_interface(router, &on_subnet(subnet)) {
        Err(ApiError::Neutron { status: 404, .. }) => Ok(()),
        r => r.map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn namespace(v: serde_json::Value) -> Namespace {
        serde_json::from_value(v).unwrap()
    }

    fn port(id: &str, owner: &str, device: &str) -> Port {
        serde_json::from_value(json!({
            "id": id, "name": "", "network_id": "n", "tenant_id": "", "project_id": "",
            "mac_address": "", "admin_state_up": true, "status": "DOWN", "device_id": device,
            "device_owner": owner, "fixed_ips": [], "binding:host_id": "", "binding:profile": {},
            "binding:vnic_type": "normal", "binding:vif_type": "", "binding:vif_details": {},
            "port_security_enabled": true, "security_groups": [], "allowed_address_pairs": [],
            "extra_dhcp_opts": [], "ip_allocation": "immediate", "description": "", "tags": [],
            "created_at": "", "updated_at": "", "revision_number": 0,
        }))
        .unwrap()
    }

    #[test]
    fn a_namespace_gets_a_network_named_by_its_uid_and_a_subnet_from_the_pool() {
        let v4 = PodPool {
            cidr: "10.64.0.0/10".parse().unwrap(),
            prefix: 24,
        };
        let w = wanted(
            &namespace(json!({"metadata": {"name": "team-a", "uid": "u1"}})),
            &[v4],
        )
        .unwrap();
        assert_eq!(w.network.id.as_deref(), Some(ids::network("u1").as_str()));
        let [subnet] = &w.subnets[..] else {
            panic!("one subnet: {:?}", w.subnets)
        };
        assert_eq!(subnet.id, Some(ids::subnet("u1")));
        assert_eq!(subnet.network_id, ids::network("u1"));
        assert_eq!(subnet.subnetpool_id, Some(ids::pod_pool()));
        assert_eq!(subnet.prefixlen, Some(24));
        // Dual stack: a subnet of each pool, of each one's prefix, named apart.
        let v6 = PodPool {
            cidr: "fd64::/48".parse().unwrap(),
            prefix: 64,
        };
        let dual = wanted(
            &namespace(json!({"metadata": {"name": "team-a", "uid": "u1"}})),
            &[v4, v6],
        )
        .unwrap();
        let got: Vec<_> = dual
            .subnets
            .iter()
            .map(|s| {
                (
                    s.id.clone().unwrap(),
                    s.ip_version,
                    s.subnetpool_id.clone().unwrap(),
                    s.prefixlen,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (ids::subnet("u1"), Some(4), ids::pod_pool(), Some(24)),
                (ids::subnet6("u1"), Some(6), ids::pod_pool6(), Some(64))
            ]
        );
        let tags = w.network.tags.unwrap();
        assert!(tags.contains(&"namespace:team-a".to_string()), "{tags:?}");
        assert!(tags.contains(&"namespace-uid:u1".to_string()), "{tags:?}");
        // Going away, or not yet named by the API server: nothing.
        let deleting = json!({"metadata": {"name": "b", "uid": "u2",
            "deletionTimestamp": "2026-01-01T00:00:00Z"}});
        assert_eq!(wanted(&namespace(deleting), &[v4]), None);
        assert_eq!(
            wanted(&namespace(json!({"metadata": {"name": "c"}})), &[v4]),
            None
        );
    }

    #[test]
    fn only_the_networks_of_gone_namespaces_are_swept() {
        let net = |uid: &str| -> Network {
            let mut n: Network = serde_json::from_value(json!({
                "id": uid, "name": "", "tenant_id": "", "project_id": "", "admin_state_up": true,
                "mtu": 1450, "status": "ACTIVE", "subnets": [], "shared": false,
                "router:external": false, "port_security_enabled": true, "description": "",
                "tags": [], "created_at": "", "updated_at": "", "revision_number": 0,
            }))
            .unwrap();
            n.tags = vec![ids::NETWORK_TAG.into(), ids::namespace_uid_tag(uid)];
            n
        };
        let live = HashSet::from(["a".to_string()]);
        assert_eq!(gone(&[net("a"), net("b")], &live), ["b"]);
    }

    #[test]
    fn a_gone_namespaces_network_waits_for_pods_still_stopping_and_foreign_ports() {
        let pods = HashSet::from(["running".to_string()]);
        let ports = [
            port("p1", ids::POD_OWNER, "gone"),
            port("p2", ids::POD_OWNER, "running"),
        ];
        assert_eq!(leftover(&ports, &pods), (vec!["p1"], true));
        assert_eq!(leftover(&ports[..1], &pods), (vec!["p1"], false));
        let foreign = [port("p3", "compute:nova", "vm")];
        assert_eq!(leftover(&foreign, &pods), (vec![], true));
        // The router's interface goes with the subnet, not before.
        let interface = [port("p4", ROUTER_INTERFACE, "router")];
        assert_eq!(leftover(&interface, &pods), (vec![], false));
    }
}
