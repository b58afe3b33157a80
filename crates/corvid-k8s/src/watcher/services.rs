//! The service reconciler: every service with a cluster IP a load balancer whose members
//! follow its endpoints (what it should be is `load_balancer::wanted`; making the
//! controller hold it, `load_balancer::apply`), its floating IP written into its status,
//! and what cannot be done said once on it, as an event and its `corvid.io/Serving`
//! condition.

use std::collections::HashMap;

use corvid_api::LoadBalancer;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::Event;
use kube::ResourceExt;
use serde_json::json;

use super::endpoints::{self, object_key};
use super::load_balancer::{self, Made, Trouble, Wanted};
use super::retry::Retry;
use super::{warning_event, Ctx};
use crate::ids;
use crate::metrics::{self, Kind};

/// Why a service whose load balancer is made still serves nothing: its selector matches no
/// ready pod.
pub fn unserved(svc: &Service, want: &Wanted) -> Option<Trouble> {
    let selector = svc.spec.as_ref()?.selector.as_ref()?;
    let empty = !want.listeners.is_empty() && want.listeners.values().all(|l| l.members.is_empty());
    empty.then(|| Trouble {
        reason: "NoReadyPods",
        message: format!(
            "no ready endpoint for the selector {selector:?}: connections to {} are refused",
            want.vip
        ),
    })
}

/// The UIDs of the services whose load balancers the controller holds but which are gone.
pub fn gone(lbs: &[LoadBalancer], known: &HashMap<String, Service>) -> Vec<String> {
    let mut uids: Vec<String> = lbs
        .iter()
        .filter_map(|lb| lb.tags.iter().find_map(|t| t.strip_prefix("service-uid:")))
        .map(load_balancer::service_of)
        .filter(|uid| !known.contains_key(*uid))
        .map(str::to_string)
        .collect();
    uids.sort();
    uids.dedup();
    uids
}

/// The services and endpoints as listed and watched, and what the controller holds for
/// each service.
#[derive(Default)]
pub struct Services {
    /// Services by UID.
    known: HashMap<String, Service>,
    /// The services of a list in progress.
    listing: Option<HashMap<String, Service>>,
    /// The first whole list has arrived.
    listed: bool,
    /// What the controller holds for each service, by service UID.
    made: HashMap<String, Made>,
    /// The last trouble reported for each service, so that it is reported once.
    troubles: HashMap<String, &'static str>,
    /// The endpoint objects, by service: what services serve.
    endpoints: endpoints::Index,
    /// The public network's ID, where floating IPs come from.
    public: Option<String>,
}

impl Services {
    /// No services yet; floating IPs from the network `public`.
    pub fn new(public: Option<String>) -> Self {
        Services {
            public,
            ..Default::default()
        }
    }

    /// The public network's ID, where floating IPs come from.
    pub fn public_network(&self) -> Option<&str> {
        self.public.as_deref()
    }

    /// Keeps the services, and brings each changed one up to date; after a whole list,
    /// every one, and those gone meanwhile are swept.
    pub async fn event(&mut self, ctx: &Ctx, e: Event<Service>) {
        metrics::event(Kind::Service);
        match e {
            Event::Init => self.listing = Some(HashMap::new()),
            Event::InitApply(s) => {
                if let (Some(l), Some(uid)) = (&mut self.listing, s.uid()) {
                    l.insert(uid, s);
                }
            }
            Event::InitDone => {
                self.known = self.listing.take().unwrap_or_default();
                self.listed = true;
                let all: Vec<String> = self.known.keys().cloned().collect();
                for uid in all {
                    self.reconcile(ctx, &uid).await;
                }
                self.sweep(ctx).await;
            }
            Event::Apply(s) => {
                if let Some(uid) = s.uid() {
                    self.known.insert(uid.clone(), s);
                    self.reconcile(ctx, &uid).await;
                }
            }
            Event::Delete(s) => {
                if let Some(uid) = s.uid() {
                    self.known.remove(&uid);
                    self.reconcile(ctx, &uid).await;
                }
            }
        }
    }

    /// Keeps the endpoint objects, and brings the services whose members they changed up
    /// to date; after the first whole list, every service.
    pub async fn endpoints_event(&mut self, ctx: &Ctx, e: Event<endpoints::Change>) {
        metrics::event(Kind::Service);
        let first = matches!(e, Event::InitDone) && !self.endpoints.listed();
        let changed = self.endpoints.apply(e);
        let affected: Vec<String> = self
            .known
            .iter()
            .filter(|(_, s)| first || changed.contains(&object_key(*s)))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in affected {
            self.reconcile(ctx, &uid).await;
        }
    }

    /// Makes the controller hold what the service with UID `uid` should be (nothing once
    /// it is gone), and its status show its floating IP; a dual-stack service's second
    /// cluster IP is a load balancer of its own.
    pub async fn reconcile(&mut self, ctx: &Ctx, uid: &str) {
        self.reconcile_primary(ctx, uid).await;
        self.reconcile_secondary(ctx, uid).await;
    }

    /// The load balancer of the service's second cluster IP, if it has one (or had).
    /// What it is not, is remembered as empty, so a single-stack service costs no call
    /// after the first.
    async fn reconcile_secondary(&mut self, ctx: &Ctx, uid: &str) {
        if !self.endpoints.listed() && self.known.contains_key(uid) {
            return;
        }
        let key = load_balancer::secondary_key(uid);
        let svc = self.known.get(uid).cloned();
        let want = svc.as_ref().and_then(|s| {
            load_balancer::wanted_secondary(s, self.endpoints.groups_of(&object_key(s)))
        });
        let known = self.made.get(&key).cloned();
        if want.is_none() && known == Some(Made::default()) {
            if svc.is_none() {
                self.made.remove(&key);
            }
            return;
        }
        let name = svc
            .as_ref()
            .map(|s| format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()))
            .unwrap_or_default();
        let (k, want2, name2) = (key.clone(), want.clone(), name.clone());
        let result = ctx
            .call(move |c| {
                let mut made = match known {
                    Some(m) => m,
                    None => load_balancer::load(c, &k)?,
                };
                let nets = load_balancer::Networks {
                    service_subnet: &ids::service_network().1,
                    service_subnet6: &ids::service_subnet6(),
                    public: None,
                };
                let r = load_balancer::apply(c, &k, &name2, want2.as_ref(), &nets, &mut made);
                Ok((made, r))
            })
            .await;
        match result {
            Ok((made, Ok(trouble))) => {
                if svc.is_none() && made == Made::default() {
                    self.made.remove(&key);
                } else {
                    self.made.insert(key, made);
                }
                if let Some(t) = trouble {
                    tracing::warn!(service = %name, reason = t.reason, "{}", t.message);
                }
            }
            Ok((made, Err(e))) => {
                self.made.insert(key, made);
                tracing::warn!(service = %name, "making the load balancer of its second cluster IP: {e}");
                ctx.queue.retry(Retry::Service(uid.to_string()));
            }
            Err(e) => {
                tracing::warn!(service = %name, "reading the load balancer of its second cluster IP: {e}");
                ctx.queue.retry(Retry::Service(uid.to_string()));
            }
        }
    }

    /// The load balancer of the service's (first) cluster IP, its floating IP and what
    /// it reports.
    async fn reconcile_primary(&mut self, ctx: &Ctx, uid: &str) {
        // Before the first whole list of endpoints, a service's members are not known: a
        // restarted watcher would take every healthy service's members away for a moment.
        // A gone service's load balancer goes at once.
        if !self.endpoints.listed() && self.known.contains_key(uid) {
            return;
        }
        let svc = self.known.get(uid).cloned();
        let want = svc
            .as_ref()
            .and_then(|s| load_balancer::wanted(s, self.endpoints.groups_of(&object_key(s))));
        let name = svc
            .as_ref()
            .map(|s| format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()))
            .unwrap_or_default();
        let known = self.made.get(uid).cloned();
        let (service_uid, public) = (uid.to_string(), self.public.clone());
        let (want2, name2) = (want.clone(), name.clone());
        let result = ctx
            .call(move |c| {
                let mut made = match known {
                    Some(m) => m,
                    None => load_balancer::load(c, &service_uid)?,
                };
                let nets = load_balancer::Networks {
                    service_subnet: &ids::service_network().1,
                    service_subnet6: &ids::service_subnet6(),
                    public: public.as_deref(),
                };
                let r =
                    load_balancer::apply(c, &service_uid, &name2, want2.as_ref(), &nets, &mut made);
                Ok((made, r))
            })
            .await;
        let retry = Retry::Service(uid.to_string());
        let trouble = match result {
            Ok((made, r)) => {
                let floating = made.floating;
                if made == Made::default() && want.is_none() {
                    self.made.remove(uid);
                } else {
                    self.made.insert(uid.to_string(), made);
                }
                match r {
                    Ok(t) => {
                        ctx.queue.done(&retry.key());
                        if let (Some(s), Some(ip)) = (&svc, floating) {
                            ingress(ctx, s, ip).await;
                        }
                        t
                    }
                    Err(e) => {
                        tracing::warn!(service = %name, "making the service's load balancer: {e}");
                        ctx.queue.retry(retry);
                        None
                    }
                }
            }
            Err(e) => {
                tracing::warn!(service = %name, "reading the service's load balancer: {e}");
                ctx.queue.retry(retry);
                None
            }
        };
        let trouble = trouble.or_else(|| unserved(svc.as_ref()?, want.as_ref()?));
        let had_trouble = self.troubles.contains_key(uid);
        match (trouble, &svc) {
            (Some(t), Some(s)) => self.report(ctx, s, t).await,
            (None, Some(s)) if had_trouble => {
                self.troubles.remove(uid);
                condition(ctx, s, None).await;
            }
            (None, _) => {
                self.troubles.remove(uid);
            }
            _ => {}
        }
    }

    /// Says once, as a warning event on the service, its condition and in the log, what
    /// could not be done.
    async fn report(&mut self, ctx: &Ctx, svc: &Service, t: Trouble) {
        let uid = svc.uid().unwrap_or_default();
        if self.troubles.get(&uid) == Some(&t.reason) {
            return;
        }
        self.troubles.insert(uid.clone(), t.reason);
        let ns = svc.namespace().unwrap_or_default();
        tracing::warn!(service = %format!("{ns}/{}", svc.name_any()), reason = t.reason, "{}", t.message);
        warning_event(&ctx.kube, svc, t.reason, &t.message).await;
        condition(ctx, svc, Some(&t)).await;
    }

    /// Deletes the load balancers and floating IPs of services that went while the
    /// watcher was not looking.
    pub async fn sweep(&mut self, ctx: &Ctx) {
        metrics::sweep(Kind::Service);
        if !self.listed {
            return;
        }
        let listed = ctx
            .call(|c| c.list::<LoadBalancer>(&[("tags", ids::SERVICE_TAG)]))
            .await;
        let lbs = match listed {
            Ok((lbs, _)) => lbs,
            Err(e) => {
                tracing::warn!("sweeping load balancers: {e}");
                return;
            }
        };
        for uid in gone(&lbs, &self.known) {
            tracing::info!(service_uid = %uid, "load balancer of a gone service deleted");
            self.made.remove(&uid);
            self.reconcile(ctx, &uid).await;
        }
    }
}

/// Writes the floating IP into the service's status, unless it is there.
async fn ingress(ctx: &Ctx, svc: &Service, ip: std::net::IpAddr) {
    let shown = svc.status.as_ref().and_then(|s| {
        s.load_balancer
            .as_ref()?
            .ingress
            .as_ref()?
            .first()?
            .ip
            .clone()
    });
    if shown.as_deref() == Some(ip.to_string().as_str()) {
        return;
    }
    let patch = json!({"status": {"loadBalancer": {"ingress": [{"ip": ip.to_string()}]}}});
    patch_status(ctx, svc, &patch, "the load balancer's address").await;
}

/// Merge-patches the service's status; a failure is logged (the next reconcile writes it
/// again).
async fn patch_status(ctx: &Ctx, svc: &Service, patch: &serde_json::Value, what: &str) {
    let api = Api::<Service>::namespaced(ctx.kube.clone(), &svc.namespace().unwrap_or_default());
    if let Err(e) = api
        .patch_status(
            &svc.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
    {
        tracing::warn!(service = %svc.name_any(), "writing {what}: {e}");
    }
}

/// Sets the service's `corvid.io/Serving` condition: false with the trouble's reason and
/// message, or true once it is gone.
async fn condition(ctx: &Ctx, svc: &Service, trouble: Option<&Trouble>) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let (status, reason, message) = match trouble {
        Some(t) => ("False", t.reason, t.message.as_str()),
        None => ("True", "Serving", "the service is served on every node"),
    };
    let patch = json!({"status": {"conditions": [{"type": "corvid.io/Serving",
        "status": status, "reason": reason, "message": message,
        "lastTransitionTime": now}]}});
    patch_status(ctx, svc, &patch, "the service's condition").await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use corvid_api::LbProtocol;

    use super::load_balancer::WantedListener;

    fn service(selector: Option<serde_json::Value>) -> Service {
        let mut spec = json!({"clusterIP": "10.96.0.10", "ports": [{"port": 80}]});
        if let Some(s) = selector {
            spec["selector"] = s;
        }
        serde_json::from_value(
            json!({"metadata": {"name": "web", "namespace": "a", "uid": "s1"},
            "spec": spec}),
        )
        .unwrap()
    }

    fn want(members: &[&str]) -> Wanted {
        let l = WantedListener {
            protocol: LbProtocol::Tcp,
            port: 80,
            node_port: None,
            affinity: None,
            members: members
                .iter()
                .map(|ip| (ip.parse().unwrap(), 8080))
                .collect(),
        };
        Wanted {
            vip: "10.96.0.10".parse().unwrap(),
            listeners: BTreeMap::from([(l.key(), l)]),
            floating: None,
        }
    }

    #[test]
    fn a_selector_that_matches_no_ready_pod_is_a_trouble_and_one_without_a_selector_is_not() {
        let selected = service(Some(json!({"app": "web"})));
        let t = unserved(&selected, &want(&[])).expect("no members: trouble");
        assert_eq!(t.reason, "NoReadyPods");
        assert!(t.message.contains("10.96.0.10"), "{}", t.message);
        assert!(unserved(&selected, &want(&["10.1.0.5"])).is_none());
        // Its endpoints are the user's to write: no members is not the watcher's trouble.
        assert!(unserved(&service(None), &want(&[])).is_none());
    }

    #[test]
    fn only_the_load_balancers_of_gone_services_are_swept() {
        let lb = |uid: &str| LoadBalancer {
            id: ids::load_balancer(uid),
            name: String::new(),
            vip_address: None,
            vip_port_id: None,
            admin_state_up: true,
            tags: vec![ids::SERVICE_TAG.into(), ids::service_uid_tag(uid)],
        };
        let known = HashMap::from([("s1".to_string(), service(None))]);
        assert_eq!(gone(&[lb("s1"), lb("s2")], &known), ["s2"]);
    }
}
