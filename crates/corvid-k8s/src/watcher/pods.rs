//! The pod reconciler: every scheduled pod off the host's network a port on its
//! namespace's network, bound to its node and named by its UID, written back onto the pod
//! as the `corvid.io/port` annotation; a finished or gone pod's port deleted.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use corvid_api::{ApiError, Client, Port, PortCreate, PortUpdate};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

use super::namespaces::NamespaceNetwork;
use super::retry::{pod_key, Retry};
use super::{warning_event, Ctx};
use crate::annotation::{PortAnnotation, PortError, ERROR_KEY, KEY};
use crate::ids;
use crate::metrics;

/// What a pod should have of the watcher.
#[derive(Debug, PartialEq)]
pub enum Wanted {
    /// Nothing: not scheduled yet, on the host's network, or not yet named by a UID.
    Nothing,
    /// No port: the pod has finished. The UID.
    NoPort(String),
    /// Its port, already annotated on it.
    Done,
    /// A port on its namespace's network.
    Port(PodPort),
}

/// The pod a port is made for.
#[derive(Debug, PartialEq)]
pub struct PodPort {
    /// The pod's UID, which names the port.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The node it is scheduled on, whose agent plugs the port.
    pub node: String,
    /// The security groups its NetworkPolicies give it; the project's default when none.
    pub security_groups: Option<Vec<String>>,
    /// Whether those are its groups for sure (every list in), so that a port found made
    /// is given them; else they only make a new port, shut until they are.
    pub groups_final: bool,
}

/// What `p` should have.
pub fn wanted(p: &Pod) -> Wanted {
    let Some(uid) = p.uid() else {
        return Wanted::Nothing;
    };
    let spec = p.spec.as_ref();
    let Some(node) = spec
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
    else {
        return Wanted::Nothing;
    };
    if spec.and_then(|s| s.host_network) == Some(true) {
        return Wanted::Nothing;
    }
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        // A finished pod keeps no address.
        return Wanted::NoPort(uid);
    }
    // An annotation already naming this pod's port: nothing to do (this is the pod's own
    // MODIFIED event after the patch, mostly).
    let annotated = p
        .annotations()
        .get(KEY)
        .and_then(|t| PortAnnotation::parse(t).ok())
        .is_some_and(|a| a.pod_uid == uid && a.port_id == ids::port(&uid));
    if annotated && !p.annotations().contains_key(ERROR_KEY) {
        return Wanted::Done;
    }
    Wanted::Port(PodPort {
        uid,
        namespace: p.namespace().unwrap_or_default(),
        name: p.name_any(),
        node,
        security_groups: None,
        groups_final: false,
    })
}

/// The port to make for `pod` on the network `network_id`.
pub fn port_body(pod: &PodPort, network_id: &str) -> PortCreate {
    PortCreate {
        id: Some(ids::port(&pod.uid)),
        network_id: network_id.to_string(),
        name: Some(format!("{}/{}", pod.namespace, pod.name)),
        device_id: Some(pod.uid.clone()),
        device_owner: Some(ids::POD_OWNER.to_string()),
        host_id: Some(pod.node.clone()),
        security_groups: pod.security_groups.clone(),
        tags: Some(vec![
            ids::namespace_tag(&pod.namespace),
            ids::pod_tag(&pod.name),
        ]),
        ..Default::default()
    }
}

/// The IDs of the watcher's ports whose pods, of `pods`, are gone.
pub fn stale<'a>(ports: &'a [Port], pods: &HashSet<String>) -> Vec<&'a str> {
    ports
        .iter()
        .filter(|p| p.device_owner == ids::POD_OWNER && !pods.contains(&p.device_id))
        .map(|p| p.id.as_str())
        .collect()
}

/// How many pods' ports are made at once: enough for the controller to commit them in
/// groups, few enough not to queue up behind its writer.
const PARALLEL_PODS: usize = 16;

/// The pods that exist, and the port work in flight for them.
pub struct Pods {
    /// UIDs of the pods that exist.
    known: HashSet<String>,
    /// The UIDs of a list in progress.
    listing: Option<HashSet<String>>,
    /// The first whole list has arrived.
    pub listed: bool,
    /// Each pod's port work in flight, by pod UID.
    inflight: HashMap<String, tokio::task::JoinHandle<()>>,
    /// How many pods' ports are made at once.
    permits: Arc<tokio::sync::Semaphore>,
}

impl Pods {
    /// No pods yet.
    pub fn new() -> Self {
        Pods {
            known: HashSet::new(),
            listing: None,
            listed: false,
            inflight: HashMap::new(),
            permits: Arc::new(tokio::sync::Semaphore::new(PARALLEL_PODS)),
        }
    }

    /// The UIDs of the pods that exist.
    pub fn known(&self) -> &HashSet<String> {
        &self.known
    }

    /// Whether the pod exists, as far as the watch and a list in progress say.
    pub fn exists(&self, uid: &str) -> bool {
        self.known.contains(uid) || self.listing.as_ref().is_some_and(|l| l.contains(uid))
    }

    /// A (re)list begins.
    pub fn listing(&mut self) {
        self.listing = Some(HashSet::new());
    }

    /// A pod the list or the watch brings.
    pub fn seen(&mut self, p: &Pod) {
        let Some(uid) = p.uid() else { return };
        match &mut self.listing {
            Some(l) => l.insert(uid),
            None => self.known.insert(uid),
        };
    }

    /// The list is whole: what it held is what exists.
    pub fn listed(&mut self) {
        self.known = self.listing.take().unwrap_or_default();
        self.listed = true;
    }

    /// A pod is gone.
    pub fn forget(&mut self, uid: &str) {
        self.known.remove(uid);
    }

    /// Waits for the pod's port work in flight, if any.
    pub async fn settle(&mut self, uid: &str) {
        if let Some(earlier) = self.inflight.remove(uid) {
            let _ = earlier.await;
        }
    }

    /// Starts making the pod's port and annotation; pods are plugged concurrently, each
    /// pod's work after its previous work.
    pub async fn reconcile(&mut self, ctx: &Ctx, p: &Pod, want: PodPort, net: NamespaceNetwork) {
        self.settle(&want.uid).await;
        let work = PodWork {
            ctx: ctx.clone(),
            permits: self.permits.clone(),
        };
        let uid = want.uid.clone();
        self.inflight.retain(|_, t| !t.is_finished());
        self.inflight
            .insert(uid, tokio::spawn(work.port(p.clone(), want, net)));
    }

    /// Deletes the port of a gone or finished pod; true once it is gone.
    pub async fn remove_port(&mut self, ctx: &Ctx, pod_uid: &str) -> bool {
        self.settle(pod_uid).await;
        let id = ids::port(pod_uid);
        let port = id.clone();
        let retry = Retry::PortDelete(pod_uid.to_string());
        match ctx.call(move |c| c.delete_if_present::<Port>(&port)).await {
            Ok(deleted) => {
                ctx.queue.done(&retry.key());
                if deleted {
                    tracing::info!(port = %id, pod_uid, "port of a gone pod deleted");
                }
                true
            }
            Err(e) => {
                tracing::warn!(port = %id, "deleting the port of a gone pod: {e}; trying again");
                ctx.queue.retry(retry);
                false
            }
        }
    }

    /// Deletes the ports of pods that went while the watcher was not looking.
    pub async fn sweep(&self, ctx: &Ctx) {
        let pods = self.known.clone();
        let swept = ctx
            .call(move |c| {
                let (ports, _) = c.list::<Port>(&[("device_owner", ids::POD_OWNER)])?;
                let mut n = 0;
                for id in stale(&ports, &pods) {
                    n += usize::from(c.delete_if_present::<Port>(id)?);
                }
                Ok(n)
            })
            .await;
        match swept {
            Ok(0) => {}
            Ok(n) => tracing::info!("swept {n} ports of pods that are gone"),
            Err(e) => tracing::warn!("sweeping ports: {e}"),
        }
    }
}

/// Makes the port, or finds the one an earlier attempt made; with `fix`, a port found with
/// other groups than `body` names is given them (its pod's policies changed meanwhile).
fn made_with_groups(c: &Client, id: &str, body: PortCreate, fix: bool) -> Result<Port, ApiError> {
    let sorted = |g: &[String]| {
        let mut g = g.to_vec();
        g.sort();
        g
    };
    let want = body.security_groups.as_deref().map(sorted);
    let port: Port = c.create_or_get(id, body)?;
    match want {
        Some(want) if fix && sorted(&port.security_groups) != want => {
            let update = PortUpdate {
                security_groups: Some(want),
                ..Default::default()
            };
            c.update(id, update)
        }
        _ => Ok(port),
    }
}

/// What making one pod's port needs, apart from the reconciler's state.
struct PodWork {
    ctx: Ctx,
    permits: Arc<tokio::sync::Semaphore>,
}

impl PodWork {
    /// Makes the pod's port (or finds the one an earlier attempt made) and annotates the
    /// pod with it.
    async fn port(self, p: Pod, want: PodPort, net: NamespaceNetwork) {
        let started = std::time::Instant::now();
        let Ok(_permit) = self.permits.clone().acquire_owned().await else {
            return;
        };
        let (ns, name, uid) = (&want.namespace, &want.name, &want.uid);
        let port_id = ids::port(uid);
        let body = port_body(&want, &net.network.id);
        let id = port_id.clone();
        let api = Api::<Pod>::namespaced(self.ctx.kube.clone(), ns);
        let fix = want.groups_final;
        let port = match self
            .ctx
            .call(move |c| made_with_groups(c, &id, body, fix))
            .await
        {
            Ok(port) => port,
            Err(e) => return self.refused(&p, &api, e).await,
        };
        let annotation =
            PortAnnotation::of(&port, uid, &net.network, &net.subnets, &self.ctx.cluster);
        // The resourceVersion makes the patch apply to the pod as read: a pod deleted and
        // recreated meanwhile is not annotated with another pod's port.
        let patch = json!({"metadata": {
            "resourceVersion": p.resource_version(),
            "uid": uid,
            "annotations": {KEY: annotation.to_text(), ERROR_KEY: null},
        }});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                self.ctx.queue.done(&pod_key(uid));
                metrics::METRICS
                    .annotation_seconds
                    .observe(started.elapsed().as_secs_f64());
                tracing::info!(namespace = %ns, pod = %name, port = %port_id, "annotated")
            }
            // A newer version of the pod is on its way through the watch.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) => {
                tracing::warn!(namespace = %ns, pod = %name, "annotating: {e}");
                self.ctx.queue.retry(Retry::Pod(Box::new(p)));
            }
        }
    }

    /// The controller could not make the pod's port: says so on the pod (once per
    /// outage, once per refusal) and tries again after the pod's backoff.
    async fn refused(&self, p: &Pod, api: &Api<Pod>, e: ApiError) {
        let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
        tracing::warn!(namespace = %ns, pod = %name, "making the pod's port: {e}");
        let key = pod_key(&p.uid().unwrap_or_default());
        // The pod's only other sign would be the plugin's code 11 after its timeout.
        if matches!(e, ApiError::Transport(_)) && !self.ctx.queue.failed_before(&key) {
            warning_event(
                &self.ctx.kube,
                p,
                "ControllerUnreachable",
                &format!("the corvid controller cannot be reached, so the pod has no port yet (retrying): {e}"),
            )
            .await;
        }
        // The controller's refusal goes onto the pod, where `kubectl describe` shows it.
        if let ApiError::Neutron { kind, message, .. } = &e {
            let error = PortError {
                reason: kind.clone(),
                message: message.clone(),
            };
            if p.annotations().get(ERROR_KEY) != Some(&error.to_text()) {
                let patch = json!({"metadata": {"annotations": {ERROR_KEY: error.to_text()}}});
                let _ = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                // Once per refusal, where the kubelet's sandbox error sends people.
                let reason = if kind.is_empty() {
                    "ControllerRefused"
                } else {
                    kind
                };
                warning_event(
                    &self.ctx.kube,
                    p,
                    reason,
                    &format!("the corvid controller refuses the pod a port: {message}"),
                )
                .await;
            }
        }
        let wait = self.ctx.queue.retry(Retry::Pod(Box::new(p.clone())));
        tracing::debug!(namespace = %ns, pod = %name, "the pod's port is tried again in {wait:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn scheduled(extra_spec: serde_json::Value, status: serde_json::Value) -> Pod {
        let mut spec = json!({"containers": [], "nodeName": "h1"});
        spec.as_object_mut()
            .unwrap()
            .extend(extra_spec.as_object().unwrap().clone());
        pod(
            json!({"metadata": {"name": "web", "namespace": "team-a", "uid": "u1"},
            "spec": spec, "status": status}),
        )
    }

    #[test]
    fn a_pod_exists_while_a_list_that_brought_it_is_in_progress() {
        let mut pods = Pods::new();
        let p = scheduled(json!({}), json!({}));
        pods.seen(&p);
        assert!(pods.exists("u1"));
        pods.listing();
        assert!(pods.exists("u1"), "known from before the list");
        pods.listed();
        assert!(!pods.exists("u1"), "the list did not bring it: gone");
        pods.listing();
        pods.seen(&p);
        assert!(pods.exists("u1"), "brought by the list in progress");
        pods.listed();
        assert!(pods.exists("u1"));
    }

    #[test]
    fn a_scheduled_pod_gets_a_port_named_by_its_uid_on_its_node() {
        let Wanted::Port(want) = wanted(&scheduled(json!({}), json!({"phase": "Pending"}))) else {
            panic!("a scheduled pod wants a port");
        };
        assert_eq!((want.uid.as_str(), want.node.as_str()), ("u1", "h1"));
        let body = port_body(&want, "net-1");
        assert_eq!(body.id, Some(ids::port("u1")));
        assert_eq!(body.network_id, "net-1");
        assert_eq!(body.host_id.as_deref(), Some("h1"));
        assert_eq!(body.device_id.as_deref(), Some("u1"));
        assert_eq!(body.device_owner.as_deref(), Some(ids::POD_OWNER));
        assert_eq!(body.name.as_deref(), Some("team-a/web"));
    }

    #[test]
    fn unscheduled_host_network_and_finished_pods_get_no_port() {
        let unscheduled = pod(
            json!({"metadata": {"name": "p", "namespace": "n", "uid": "u1"},
            "spec": {"containers": []}}),
        );
        assert_eq!(wanted(&unscheduled), Wanted::Nothing);
        let host = scheduled(json!({"hostNetwork": true}), json!({}));
        assert_eq!(wanted(&host), Wanted::Nothing);
        for phase in ["Succeeded", "Failed"] {
            let done = scheduled(json!({}), json!({"phase": phase}));
            assert_eq!(wanted(&done), Wanted::NoPort("u1".into()), "{phase}");
        }
    }

    #[test]
    fn an_annotated_pod_is_done_unless_the_annotation_is_another_pods_or_an_error() {
        let mut p = scheduled(json!({}), json!({"phase": "Running"}));
        let of = |uid: &str| {
            PortAnnotation {
                port_id: ids::port(uid),
                network_id: "n".into(),
                pod_uid: uid.into(),
                mac: "02:00:00:00:00:01".into(),
                addresses: vec!["10.1.0.5/24".parse().unwrap()],
                gateway: None,
                routes: Vec::new(),
                mtu: 1450,
                cluster: String::new(),
            }
            .to_text()
        };
        p.annotations_mut().insert(KEY.into(), of("u1"));
        assert_eq!(wanted(&p), Wanted::Done);
        // A StatefulSet's pod recreated under the same name carries the old pod's.
        p.annotations_mut().insert(KEY.into(), of("u0"));
        assert!(matches!(wanted(&p), Wanted::Port(_)));
        p.annotations_mut().insert(KEY.into(), of("u1"));
        p.annotations_mut().insert(ERROR_KEY.into(), "{}".into());
        assert!(matches!(wanted(&p), Wanted::Port(_)));
    }
}
