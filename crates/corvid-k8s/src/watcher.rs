//! `corvid kube-watch`: namespaces to networks, pods to ports, each pod's port written
//! back onto it as the `corvid.io/port` annotation, and services to load balancers.
//!
//! One loop takes the namespace and pod watch streams in turn and reconciles each object
//! on its own (idempotent: IDs derive from UIDs, a create that finds its object done
//! shows it). No finalizers: they would block every pod deletion while the watcher is
//! down. Instead, once a full list has arrived and every `resync` after, ports whose pod
//! is gone and networks whose namespace is gone are swept.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use corvid_api::{ApiError, Client, Network, Port, Subnet, SubnetPool};
use futures::{Stream, StreamExt};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Event as K8sEvent, Namespace, Pod, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector;
use kube::runtime::watcher::{self, Event};
use kube::ResourceExt;
use serde_json::json;

use crate::annotation::{PortAnnotation, PortError, ERROR_KEY, KEY};
use crate::endpoints::{self, object_key};
use crate::ids;
use crate::leader::{Candidate, Election};
use crate::metrics::{self, Kind, Phase};
use crate::services::{self, Made, Trouble};

/// What `corvid kube-watch` is told.
#[derive(Debug, Clone)]
pub struct Config {
    /// Kubeconfig path; `$KUBECONFIG`, then the in-cluster account, when none.
    pub kubeconfig: Option<PathBuf>,
    /// The controller's URL.
    pub controller: String,
    /// The token and TLS side the controller is reached with.
    pub credentials: corvid_api::Credentials,
    /// The API server's `--service-cluster-ip-range`; found from the API server when
    /// not given.
    pub service_cidr: Option<IpNet>,
    /// The network floating IPs come from; must exist when named.
    pub public_network: Option<String>,
    /// Where the namespaces' subnets are carved from.
    pub pod_pool: IpNet,
    /// The prefix length of each namespace's subnet.
    pub namespace_prefix: u8,
    /// How often ports and networks left by missed deletions are swept.
    pub resync: Duration,
    /// The lease that elects the one acting watcher.
    pub election: Election,
}

/// A failure that ends the watcher, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server could not be used.
    #[error("API server: {0}")]
    Kube(String),
    /// The controller refused or could not be reached.
    #[error("controller: {0}")]
    Controller(#[from] ApiError),
    /// Start-up found something the operator must fix.
    #[error("{0}")]
    Setup(String),
}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Error::Kube(e.to_string())
    }
}

/// Runs the watcher: waits for the lease, sets up, reconciles until the lease is lost or
/// a watch ends for good.
pub async fn run(cfg: Config) -> Result<(), Error> {
    let kube = crate::connect(cfg.kubeconfig.as_deref())
        .await
        .map_err(Error::Kube)?;
    let ctl = cfg
        .credentials
        .client(&cfg.controller)
        .map_err(Error::Setup)?;
    let mut candidate = Candidate::new(kube.clone(), cfg.election.clone());
    metrics::phase(Phase::Standby);
    candidate.acquire().await;
    metrics::phase(Phase::SettingUp);
    let mut watcher = Watcher::new(kube, ctl, cfg);
    tokio::select! {
        r = watcher.run() => r,
        lost = candidate.hold() => {
            Err(Error::Kube(format!("leadership lost ({lost}): stopping so that only one watcher acts")))
        }
    }
}

/// A namespace's network as far as the watcher has made it.
#[derive(Clone)]
struct NamespaceNetwork {
    network: Network,
    subnets: Vec<Subnet>,
}

/// Work that failed and is tried again.
enum Retry {
    Pod(Box<Pod>),
    Namespace(Box<Namespace>),
    /// A service, by UID.
    Service(String),
    /// The port of a gone pod, by the pod's UID.
    PortDelete(String),
    /// The network of a gone namespace, by the namespace's UID.
    NetworkDelete(String),
}

impl Retry {
    /// What the backoff of this retry is counted by.
    fn key(&self) -> String {
        match self {
            Retry::Pod(p) => pod_key(&p.uid().unwrap_or_default()),
            Retry::Namespace(n) => format!("namespace/{}", n.uid().unwrap_or_default()),
            Retry::Service(uid) => format!("service/{uid}"),
            Retry::PortDelete(uid) => format!("port/{uid}"),
            Retry::NetworkDelete(uid) => format!("network/{uid}"),
        }
    }
}

/// The backoff key of a pod's work, by its UID.
fn pod_key(uid: &str) -> String {
    format!("pod/{uid}")
}

/// How long each piece of failed work waits before it is tried again: one second after
/// its first failure, doubling to half a minute, so a controller that is down for long
/// is not asked every second for every pod.
#[derive(Clone, Default)]
struct Backoff(Arc<std::sync::Mutex<HashMap<String, u32>>>);

impl Backoff {
    /// The wait before the next try of `key`, counting this failure.
    fn next(&self, key: &str) -> Duration {
        let mut failures = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(key.to_string()).or_insert(0);
        *n += 1;
        (RETRY_AFTER * 2u32.pow((*n - 1).min(5))).min(MAX_RETRY_AFTER)
    }

    /// `key` worked: its next failure starts again at one second.
    fn reset(&self, key: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    /// Whether `key` failed before (so its trouble was reported already).
    fn failed_before(&self, key: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(key)
    }
}

/// Sends `r` to the watcher's queue after `key`'s backoff.
fn requeue(tx: &tokio::sync::mpsc::UnboundedSender<Retry>, backoff: &Backoff, r: Retry) {
    let wait = backoff.next(&r.key());
    let tx = tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        let _ = tx.send(r);
    });
}

/// One event from either watch, or a timer.
enum Input {
    Namespace(Box<Event<Namespace>>),
    Pod(Box<Event<Pod>>),
    Service(Box<Event<Service>>),
    Endpoints(Box<Event<endpoints::Change>>),
    WatchFailed(&'static str, String),
    Retry(Retry),
    Resync,
}

struct Watcher {
    kube: kube::Client,
    ctl: Arc<Client>,
    cfg: Config,
    /// Namespace name to UID, as listed and watched.
    namespaces: reflector::Store<Namespace>,
    namespaces_writer: Option<reflector::store::Writer<Namespace>>,
    /// Networks made, by namespace UID.
    networks: HashMap<String, NamespaceNetwork>,
    /// UIDs of the pods that exist.
    pods: HashSet<String>,
    pods_listing: Option<HashSet<String>>,
    listed: (bool, bool),
    retry_tx: tokio::sync::mpsc::UnboundedSender<Retry>,
    retry_rx: Option<tokio::sync::mpsc::UnboundedReceiver<Retry>>,
    /// Each pod's port work in flight, by pod UID.
    inflight: HashMap<String, tokio::task::JoinHandle<()>>,
    /// How many pods' ports are made at once.
    permits: Arc<tokio::sync::Semaphore>,
    /// Services by UID, as listed and watched.
    services: HashMap<String, Service>,
    services_listing: Option<HashMap<String, Service>>,
    services_listed: bool,
    /// What the controller holds for each service, by service UID.
    made: HashMap<String, Made>,
    /// The last trouble reported for each service, so that it is reported once.
    troubles: HashMap<String, &'static str>,
    /// The public network's ID, once looked up.
    public_network: Option<String>,
    /// The controller's cluster ID, which annotations carry to the plugin.
    cluster: Arc<str>,
    /// The endpoint objects, by service: what services serve.
    endpoints: endpoints::Index,
    /// Failed work's tries so far, for its backoff.
    backoff: Backoff,
    /// Gone namespaces whose networks wait for their last ports, by UID: each port of a
    /// gone pod deleted tries them again, rather than the next sweep.
    pending_networks: HashSet<String>,
}

/// How many pods' ports are made at once: enough for the controller to commit them in
/// groups, few enough not to queue up behind its writer.
const PARALLEL_PODS: usize = 16;

/// How long failed work waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest wait between tries of failed work.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl Watcher {
    fn new(kube: kube::Client, ctl: Client, cfg: Config) -> Self {
        let (retry_tx, retry_rx) = tokio::sync::mpsc::unbounded_channel();
        let (namespaces, writer) = reflector::store();
        Watcher {
            kube,
            ctl: Arc::new(ctl),
            cfg,
            namespaces,
            namespaces_writer: Some(writer),
            networks: HashMap::new(),
            pods: HashSet::new(),
            pods_listing: None,
            listed: (false, false),
            retry_tx,
            retry_rx: Some(retry_rx),
            inflight: HashMap::new(),
            permits: Arc::new(tokio::sync::Semaphore::new(PARALLEL_PODS)),
            services: HashMap::new(),
            services_listing: None,
            services_listed: false,
            made: HashMap::new(),
            troubles: HashMap::new(),
            public_network: None,
            cluster: Arc::from(""),
            endpoints: endpoints::Index::default(),
            backoff: Backoff::default(),
            pending_networks: HashSet::new(),
        }
    }

    /// Runs a blocking controller call off the async workers.
    async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Client) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        call(&self.ctl, f).await
    }

    async fn run(&mut self) -> Result<(), Error> {
        self.setup().await?;
        metrics::phase(Phase::Watching);
        // The namespaces' reflector keeps the store network_of and the sweep read.
        let writer = self.namespaces_writer.take().expect("run is called once");
        let namespaces = reflector::reflector(
            writer,
            watcher::watcher(Api::<Namespace>::all(self.kube.clone()), Default::default()),
        )
        .map(|e| {
            e.map_or_else(
                |e| Input::WatchFailed("namespaces", e.to_string()),
                |e| Input::Namespace(Box::new(e)),
            )
        });
        let pods =
            watcher::watcher(Api::<Pod>::all(self.kube.clone()), Default::default()).map(|e| {
                e.map_or_else(
                    |e| Input::WatchFailed("pods", e.to_string()),
                    |e| Input::Pod(Box::new(e)),
                )
            });
        let services = watcher::watcher(Api::<Service>::all(self.kube.clone()), Default::default())
            .map(|e| {
                e.map_or_else(
                    |e| Input::WatchFailed("services", e.to_string()),
                    |e| Input::Service(Box::new(e)),
                )
            });
        let source = endpoints::Source::discover(&self.kube).await;
        tracing::info!("services' members from {}", source.name());
        let endpoints = source.watch(self.kube.clone()).map(|e| {
            e.map_or_else(
                |e| Input::WatchFailed("endpoints", e.to_string()),
                |e| Input::Endpoints(Box::new(e)),
            )
        });
        let retries = self
            .retry_rx
            .take()
            .map(tokio_stream_of)
            .expect("run is called once");
        let resync = interval_stream(self.cfg.resync).map(|_| Input::Resync);
        let mut inputs = futures::stream::select_all([
            namespaces.boxed(),
            pods.boxed(),
            services.boxed(),
            endpoints.boxed(),
            retries.map(Input::Retry).boxed(),
            resync.boxed(),
        ]);
        while let Some(input) = inputs.next().await {
            match input {
                Input::Namespace(e) => self.namespace_event(*e).await,
                Input::Pod(e) => self.pod_event(*e).await,
                Input::Service(e) => self.service_event(*e).await,
                Input::Endpoints(e) => self.endpoints_event(*e).await,
                Input::Retry(Retry::Pod(p)) => self.pod(&p).await,
                Input::Retry(Retry::Namespace(n)) => self.namespace(&n).await,
                Input::Retry(Retry::Service(uid)) => self.service(&uid).await,
                Input::Retry(Retry::PortDelete(uid)) => {
                    // Gone for good unless the pod came back meanwhile.
                    if !self.pods.contains(&uid) {
                        self.remove_port(&uid).await;
                    }
                }
                Input::Retry(Retry::NetworkDelete(uid)) => self.remove_network(&uid).await,
                Input::Resync => {
                    self.sweep().await;
                    self.sweep_services().await;
                }
                // The watcher retries by itself (with backoff); say so once per failure.
                Input::WatchFailed(what, e) => tracing::warn!("watching {what}: {e}"),
            }
        }
        Ok(())
    }

    /// Start-up as the flat-mode design lists it: the pod pool, the default namespace's
    /// network, the service network, and the public network checked.
    async fn setup(&mut self) -> Result<(), Error> {
        self.cluster = Arc::from(self.call(|c| c.cluster_id()).await?);
        if let Some(public) = self.cfg.public_network.clone() {
            let name = public.clone();
            let by_name = self
                .call(move |c| c.list::<Network>(&[("name", &name)]).map(|l| l.0))
                .await?;
            let id = public.clone();
            let by_id = self
                .call(move |c| match c.get::<Network>(&id) {
                    Ok(n) => Ok(Some(n)),
                    Err(ApiError::Neutron { status: 404, .. }) => Ok(None),
                    Err(e) => Err(e),
                })
                .await?;
            self.public_network = by_id
                .map(|n| n.id)
                .or_else(|| by_name.first().map(|n| n.id.clone()));
            if self.public_network.is_none() {
                return Err(Error::Setup(format!(
                    "the public network {public:?} does not exist: create it first, e.g. \
                     POST /v2.0/networks {{\"network\": {{\"name\": \"{public}\", \"router:external\": true}}}} \
                     and a subnet for its floating IPs, or name another with --public-network"
                )));
            }
        }
        let pool = json!({
            "id": ids::pod_pool(), "name": "k8s-pods",
            "prefixes": [self.cfg.pod_pool.to_string()],
            "default_prefixlen": self.cfg.namespace_prefix,
        });
        self.call(move |c| c.create_or_get::<SubnetPool>(&ids::pod_pool(), pool))
            .await?;
        let (net_id, subnet_id) = ids::service_network();
        let cidr = match self.cfg.service_cidr {
            Some(cidr) => cidr,
            None => {
                let found = crate::service_cidr::discover(&self.kube)
                    .await
                    .map_err(Error::Setup)?;
                tracing::info!(service_cidr = %found, "the API server's service range");
                self.cfg.service_cidr = Some(found);
                found
            }
        };
        let net = json!({"id": net_id, "name": "k8s-services", "tags": [ids::NETWORK_TAG]});
        let subnet = json!({
            "id": subnet_id, "network_id": net_id, "name": "k8s-services",
            "cidr": cidr.to_string(), "ip_version": if cidr.addr().is_ipv4() { 4 } else { 6 },
            // The API server gives the range's first address to the `kubernetes`
            // service: no gateway takes it.
            "gateway_ip": null,
        });
        self.call(move |c| {
            c.create_or_get::<Network>(&net_id, net)?;
            c.create_or_get::<Subnet>(&subnet_id, subnet)
        })
        .await?;
        // The API server makes `default` shortly after it starts: the namespace watch
        // brings it if it is not there yet.
        if let Some(default) = Api::<Namespace>::all(self.kube.clone())
            .get_opt("default")
            .await?
        {
            self.namespace(&default).await;
        }
        tracing::info!(
            pod_pool = %self.cfg.pod_pool, service_cidr = %cidr,
            "set up: the pod pool, the service network and the default namespace's network"
        );
        Ok(())
    }

    fn retry(&self, r: Retry) {
        requeue(&self.retry_tx, &self.backoff, r);
    }

    async fn namespace_event(&mut self, e: Event<Namespace>) {
        metrics::event(Kind::Namespace);
        match e {
            Event::Init => {}
            Event::InitApply(n) | Event::Apply(n) => self.namespace(&n).await,
            Event::InitDone => {
                self.listed.0 = true;
                self.sweep().await;
            }
            Event::Delete(n) => {
                if let Some(uid) = n.uid() {
                    self.remove_network(&uid).await;
                }
            }
        }
    }

    /// Makes the namespace's network and subnet, unless it is going away.
    async fn namespace(&mut self, n: &Namespace) {
        let (name, Some(uid)) = (n.name_any(), n.uid()) else {
            return;
        };
        if n.metadata.deletion_timestamp.is_some() || self.networks.contains_key(&uid) {
            return;
        }
        match self.make_network(&name, &uid).await {
            Ok(made) => {
                tracing::info!(namespace = %name, network = %made.network.id, "namespace network ready");
                self.networks.insert(uid, made);
            }
            Err(e) => {
                tracing::warn!(namespace = %name, "making the namespace's network: {e}");
                self.retry(Retry::Namespace(Box::new(n.clone())));
            }
        }
    }

    async fn make_network(&self, name: &str, uid: &str) -> Result<NamespaceNetwork, ApiError> {
        let (net_id, subnet_id) = (ids::network(uid), ids::subnet(uid));
        let tags = [
            ids::NETWORK_TAG.to_string(),
            ids::namespace_tag(name),
            ids::namespace_uid_tag(uid),
        ];
        let net = json!({"id": net_id, "name": format!("k8s-{name}"), "tags": tags});
        let subnet = json!({
            "id": subnet_id, "network_id": net_id, "name": format!("k8s-{name}"),
            "ip_version": 4, "subnetpool_id": ids::pod_pool(),
            "prefixlen": self.cfg.namespace_prefix,
        });
        self.call(move |c| {
            let network = c.create_or_get::<Network>(&net_id, net)?;
            let subnet = c.create_or_get::<Subnet>(&subnet_id, subnet)?;
            Ok(NamespaceNetwork {
                network,
                subnets: vec![subnet],
            })
        })
        .await
    }

    /// The network of the namespace named `name`, made now if the namespace watch has
    /// not brought it yet.
    async fn network_of(&mut self, name: &str) -> Option<NamespaceNetwork> {
        let known = self
            .namespaces
            .get(&kube::runtime::reflector::ObjectRef::new(name))
            .and_then(|n| n.uid());
        let uid = match known {
            Some(uid) => uid,
            None => {
                let n = Api::<Namespace>::all(self.kube.clone())
                    .get_opt(name)
                    .await
                    .ok()??;
                self.namespace(&n).await;
                n.uid()?
            }
        };
        if !self.networks.contains_key(&uid) {
            let made = self.make_network(name, &uid).await.ok()?;
            self.networks.insert(uid.clone(), made);
        }
        self.networks.get(&uid).cloned()
    }

    async fn pod_event(&mut self, e: Event<Pod>) {
        metrics::event(Kind::Pod);
        match e {
            Event::Init => self.pods_listing = Some(HashSet::new()),
            Event::InitApply(p) => {
                if let (Some(l), Some(uid)) = (&mut self.pods_listing, p.uid()) {
                    l.insert(uid);
                }
                self.pod(&p).await;
            }
            Event::InitDone => {
                self.pods = self.pods_listing.take().unwrap_or_default();
                self.listed.1 = true;
                self.sweep().await;
            }
            Event::Apply(p) => {
                if let Some(uid) = p.uid() {
                    self.pods.insert(uid);
                }
                self.pod(&p).await;
            }
            Event::Delete(p) => {
                if let Some(uid) = p.uid() {
                    self.pods.remove(&uid);
                    self.settle(&uid).await;
                    self.remove_port(&uid).await;
                }
            }
        }
    }

    /// Keeps the endpoint objects, and brings the services whose members they changed up
    /// to date; after the first whole list, every service.
    async fn endpoints_event(&mut self, e: Event<endpoints::Change>) {
        metrics::event(Kind::Service);
        let first = matches!(e, Event::InitDone) && !self.endpoints.listed();
        let changed = self.endpoints.apply(e);
        let affected: Vec<String> = self
            .services
            .iter()
            .filter(|(_, s)| first || changed.contains(&object_key(*s)))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in affected {
            self.service(&uid).await;
        }
    }

    async fn service_event(&mut self, e: Event<Service>) {
        metrics::event(Kind::Service);
        match e {
            Event::Init => self.services_listing = Some(HashMap::new()),
            Event::InitApply(s) => {
                if let (Some(l), Some(uid)) = (&mut self.services_listing, s.uid()) {
                    l.insert(uid, s);
                }
            }
            Event::InitDone => {
                self.services = self.services_listing.take().unwrap_or_default();
                self.services_listed = true;
                let all: Vec<String> = self.services.keys().cloned().collect();
                for uid in all {
                    self.service(&uid).await;
                }
                self.sweep_services().await;
            }
            Event::Apply(s) => {
                if let Some(uid) = s.uid() {
                    self.services.insert(uid.clone(), s);
                    self.service(&uid).await;
                }
            }
            Event::Delete(s) => {
                if let Some(uid) = s.uid() {
                    self.services.remove(&uid);
                    self.service(&uid).await;
                }
            }
        }
    }

    /// Makes the controller hold what the service with UID `uid` should be (nothing once
    /// it is gone), and its status show its floating IP.
    async fn service(&mut self, uid: &str) {
        // Before the first whole list of endpoints, a service's members are not known: a
        // restarted watcher would take every healthy service's members away for a moment.
        // A gone service's load balancer goes at once.
        if !self.endpoints.listed() && self.services.contains_key(uid) {
            return;
        }
        let svc = self.services.get(uid).cloned();
        let want = svc
            .as_ref()
            .and_then(|s| services::wanted(s, self.endpoints.groups_of(&object_key(s))));
        let name = svc
            .as_ref()
            .map(|s| format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()))
            .unwrap_or_default();
        let known = self.made.get(uid).cloned();
        let (service_uid, public) = (uid.to_string(), self.public_network.clone());
        let (want2, name2) = (want.clone(), name.clone());
        let result = self
            .call(move |c| {
                let mut made = match known {
                    Some(m) => m,
                    None => services::load(c, &service_uid)?,
                };
                let nets = services::Networks {
                    service_subnet: &ids::service_network().1,
                    public: public.as_deref(),
                };
                let r = services::apply(c, &service_uid, &name2, want2.as_ref(), &nets, &mut made);
                Ok((made, r))
            })
            .await;
        let trouble = match result {
            Ok((made, r)) => {
                let floating = made.floating;
                let done = made == Made::default() && want.is_none();
                if done {
                    self.made.remove(uid);
                } else {
                    self.made.insert(uid.to_string(), made);
                }
                match r {
                    Ok(t) => {
                        if let (Some(s), Some(ip)) = (&svc, floating) {
                            self.ingress(s, ip).await;
                        }
                        t
                    }
                    Err(e) => {
                        tracing::warn!(service = %name, "making the service's load balancer: {e}");
                        self.retry(Retry::Service(uid.to_string()));
                        None
                    }
                }
            }
            Err(e) => {
                tracing::warn!(service = %name, "reading the service's load balancer: {e}");
                self.retry(Retry::Service(uid.to_string()));
                None
            }
        };
        let trouble = trouble.or_else(|| {
            let want = want.as_ref()?;
            let selector = svc.as_ref()?.spec.as_ref()?.selector.as_ref()?;
            let empty =
                !want.listeners.is_empty() && want.listeners.values().all(|l| l.members.is_empty());
            empty.then(|| Trouble {
                reason: "NoReadyPods",
                message: format!(
                    "no ready endpoint for the selector {selector:?}: connections to {} are refused",
                    want.vip
                ),
            })
        });
        let had_trouble = self.troubles.contains_key(uid);
        match (trouble, &svc) {
            (Some(t), Some(s)) => self.report(s, t).await,
            (None, Some(s)) if had_trouble => {
                self.troubles.remove(uid);
                self.condition(s, None).await;
            }
            (None, _) => {
                self.troubles.remove(uid);
            }
            _ => {}
        }
    }

    /// Writes the floating IP into the service's status, unless it is there.
    async fn ingress(&self, svc: &Service, ip: std::net::IpAddr) {
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
        self.patch_status(svc, &patch, "the load balancer's address")
            .await;
    }

    /// Merge-patches the service's status; a failure is logged (the next reconcile
    /// writes it again).
    async fn patch_status(&self, svc: &Service, patch: &serde_json::Value, what: &str) {
        let api =
            Api::<Service>::namespaced(self.kube.clone(), &svc.namespace().unwrap_or_default());
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

    /// Sets the service's `corvid.io/Serving` condition: false with the trouble's reason
    /// and message, or true once it is gone.
    async fn condition(&self, svc: &Service, trouble: Option<&Trouble>) {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let (status, reason, message) = match trouble {
            Some(t) => ("False", t.reason, t.message.as_str()),
            None => ("True", "Serving", "the service is served on every node"),
        };
        let patch = json!({"status": {"conditions": [{"type": "corvid.io/Serving",
            "status": status, "reason": reason, "message": message,
            "lastTransitionTime": now}]}});
        self.patch_status(svc, &patch, "the service's condition")
            .await;
    }

    /// Says once, as a warning event on the service, its condition and in the log, what
    /// could not be done.
    async fn report(&mut self, svc: &Service, t: Trouble) {
        let uid = svc.uid().unwrap_or_default();
        if self.troubles.get(&uid) == Some(&t.reason) {
            return;
        }
        self.troubles.insert(uid.clone(), t.reason);
        let ns = svc.namespace().unwrap_or_default();
        tracing::warn!(service = %format!("{ns}/{}", svc.name_any()), reason = t.reason, "{}", t.message);
        warning_event(&self.kube, svc, t.reason, &t.message).await;
        self.condition(svc, Some(&t)).await;
    }

    /// Deletes the load balancers and floating IPs of services that are gone (deleted
    /// while the watcher was down).
    async fn sweep_services(&mut self) {
        metrics::sweep(Kind::Service);
        if !self.services_listed {
            return;
        }
        let listed = self
            .call(|c| c.list::<corvid_api::LoadBalancer>(&[("tags", ids::SERVICE_TAG)]))
            .await;
        let lbs = match listed {
            Ok((lbs, _)) => lbs,
            Err(e) => {
                tracing::warn!("sweeping load balancers: {e}");
                return;
            }
        };
        let gone: Vec<String> = lbs
            .iter()
            .filter_map(|lb| lb.tags.iter().find_map(|t| t.strip_prefix("service-uid:")))
            .filter(|uid| !self.services.contains_key(*uid))
            .map(str::to_string)
            .collect();
        for uid in gone {
            tracing::info!(service_uid = %uid, "load balancer of a gone service deleted");
            self.made.remove(&uid);
            self.service(&uid).await;
        }
    }

    /// Gives a scheduled pod on the pod network its port and annotation.
    async fn pod(&mut self, p: &Pod) {
        let Some(uid) = p.uid() else { return };
        let spec = p.spec.clone().unwrap_or_default();
        let Some(node) = spec.node_name.filter(|n| !n.is_empty()) else {
            return;
        };
        if spec.host_network == Some(true) {
            return;
        }
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            // A finished pod keeps no address.
            self.settle(&uid).await;
            self.remove_port(&uid).await;
            return;
        }
        let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
        let Some(net) = self.network_of(&ns).await else {
            tracing::warn!(namespace = %ns, pod = %name, "no network for the namespace yet");
            self.retry(Retry::Pod(Box::new(p.clone())));
            return;
        };
        // An annotation already naming this pod's port: nothing to do (this is the pod's
        // own MODIFIED event after the patch, mostly).
        let annotated = p
            .annotations()
            .get(KEY)
            .and_then(|t| PortAnnotation::parse(t).ok())
            .is_some_and(|a| a.pod_uid == uid && a.port_id == ids::port(&uid));
        if annotated && !p.annotations().contains_key(ERROR_KEY) {
            return;
        }
        // Pods are plugged concurrently, each pod's work after its previous work.
        self.settle(&uid).await;
        let work = PodWork {
            kube: self.kube.clone(),
            ctl: self.ctl.clone(),
            retry: self.retry_tx.clone(),
            permits: self.permits.clone(),
            cluster: self.cluster.clone(),
            backoff: self.backoff.clone(),
        };
        let pod = p.clone();
        self.inflight.retain(|_, t| !t.is_finished());
        self.inflight
            .insert(uid.clone(), tokio::spawn(work.port(pod, uid, node, net)));
    }

    /// Waits for the pod's port work in flight, if any.
    async fn settle(&mut self, uid: &str) {
        if let Some(earlier) = self.inflight.remove(uid) {
            let _ = earlier.await;
        }
    }

    async fn remove_port(&mut self, pod_uid: &str) {
        let id = ids::port(pod_uid);
        let port = id.clone();
        let retry = Retry::PortDelete(pod_uid.to_string());
        match self.call(move |c| c.delete_if_present::<Port>(&port)).await {
            Ok(deleted) => {
                self.backoff.reset(&retry.key());
                if deleted {
                    tracing::info!(port = %id, pod_uid, "port of a gone pod deleted");
                }
                // It may have been the last port keeping a gone namespace's network.
                let pending: Vec<String> = self.pending_networks.iter().cloned().collect();
                for uid in pending {
                    self.remove_network(&uid).await;
                }
            }
            Err(e) => {
                tracing::warn!(port = %id, "deleting the port of a gone pod: {e}; trying again");
                self.retry(retry);
            }
        }
    }

    /// Deletes a gone namespace's network once its ports are gone; while some remain it
    /// is tried again as each goes (and at the next sweep), and after a failure with
    /// backoff.
    async fn remove_network(&mut self, namespace_uid: &str) {
        let (net, subnet) = (ids::network(namespace_uid), ids::subnet(namespace_uid));
        let (n, s) = (net.clone(), subnet.clone());
        let pods = self.pods.clone();
        let done = self
            .call(move |c| {
                let (ports, _) = c.list::<Port>(&[("network_id", &n)])?;
                let mut left = 0;
                for p in ports {
                    if p.device_owner == ids::POD_OWNER && !pods.contains(&p.device_id) {
                        c.delete_if_present::<Port>(&p.id)?;
                    } else {
                        left += 1;
                    }
                }
                if left > 0 {
                    return Ok(false);
                }
                c.delete_if_present::<Subnet>(&s)?;
                c.delete_if_present::<Network>(&n)?;
                Ok(true)
            })
            .await;
        let retry = Retry::NetworkDelete(namespace_uid.to_string());
        match done {
            Ok(true) => {
                self.networks.remove(namespace_uid);
                self.pending_networks.remove(namespace_uid);
                self.backoff.reset(&retry.key());
                tracing::info!(network = %net, "network of a gone namespace deleted");
            }
            Ok(false) => {
                self.pending_networks.insert(namespace_uid.to_string());
            }
            Err(e) => {
                tracing::warn!(network = %net, "deleting the network of a gone namespace: {e}; trying again");
                self.pending_networks.insert(namespace_uid.to_string());
                self.retry(retry);
            }
        }
    }

    /// Deletes what deletions the watcher missed left behind: ports whose pod is gone,
    /// networks whose namespace is gone. Only once both lists have arrived.
    async fn sweep(&mut self) {
        metrics::sweep(Kind::Namespace);
        if self.listed != (true, true) {
            return;
        }
        let pods = self.pods.clone();
        let swept = self
            .call(move |c| {
                let (ports, _) = c.list::<Port>(&[("device_owner", ids::POD_OWNER)])?;
                let mut n = 0;
                for p in ports.iter().filter(|p| !pods.contains(&p.device_id)) {
                    n += usize::from(c.delete_if_present::<Port>(&p.id)?);
                }
                Ok(n)
            })
            .await;
        match swept {
            Ok(0) => {}
            Ok(n) => tracing::info!("swept {n} ports of pods that are gone"),
            Err(e) => tracing::warn!("sweeping ports: {e}"),
        }
        let live: HashSet<String> = self
            .namespaces
            .state()
            .iter()
            .filter_map(|n| n.uid())
            .collect();
        let networks = self
            .call(|c| {
                c.list::<Network>(&[("tags", ids::NETWORK_TAG)])
                    .map(|l| l.0)
            })
            .await;
        let gone: Vec<String> = match networks {
            Ok(nets) => nets
                .iter()
                .filter_map(|n| {
                    n.tags
                        .iter()
                        .find_map(|t| t.strip_prefix("namespace-uid:"))
                        .filter(|uid| !live.contains(*uid))
                        .map(str::to_string)
                })
                .collect(),
            Err(e) => {
                tracing::warn!("sweeping networks: {e}");
                Vec::new()
            }
        };
        for uid in gone {
            self.remove_network(&uid).await;
        }
    }
}

/// What making one pod's port needs, apart from the watcher's state.
struct PodWork {
    kube: kube::Client,
    ctl: Arc<Client>,
    retry: tokio::sync::mpsc::UnboundedSender<Retry>,
    permits: Arc<tokio::sync::Semaphore>,
    cluster: Arc<str>,
    backoff: Backoff,
}

impl PodWork {
    fn retry(&self, p: Pod) {
        requeue(&self.retry, &self.backoff, Retry::Pod(Box::new(p)));
    }

    /// Makes the pod's port (or finds the one an earlier attempt made) and annotates the
    /// pod with it.
    async fn port(self, p: Pod, uid: String, node: String, net: NamespaceNetwork) {
        let started = std::time::Instant::now();
        let Ok(_permit) = self.permits.clone().acquire_owned().await else {
            return;
        };
        let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
        let port_id = ids::port(&uid);
        let attrs = json!({
            "id": port_id, "network_id": net.network.id, "name": format!("{ns}/{name}"),
            "device_id": uid, "device_owner": ids::POD_OWNER, "binding:host_id": node,
            "tags": [ids::namespace_tag(&ns), ids::pod_tag(&name)],
        });
        let id = port_id.clone();
        let api = Api::<Pod>::namespaced(self.kube.clone(), &ns);
        let port = match call(&self.ctl, move |c| c.create_or_get::<Port>(&id, attrs)).await {
            Ok(port) => port,
            Err(e) => {
                tracing::warn!(namespace = %ns, pod = %name, "making the pod's port: {e}");
                // The pod's only other sign would be the plugin's code 11 after its
                // timeout: say it on the pod, once per outage.
                let key = pod_key(&uid);
                if matches!(e, ApiError::Transport(_)) && !self.backoff.failed_before(&key) {
                    warning_event(
                        &self.kube,
                        &p,
                        "ControllerUnreachable",
                        &format!("the corvid controller cannot be reached, so the pod has no port yet (retrying): {e}"),
                    )
                    .await;
                }
                // The controller's refusal goes onto the pod, where `kubectl describe`
                // shows it.
                if let ApiError::Neutron { kind, message, .. } = &e {
                    let error = PortError {
                        reason: kind.clone(),
                        message: message.clone(),
                    };
                    if p.annotations().get(ERROR_KEY) != Some(&error.to_text()) {
                        let patch =
                            json!({"metadata": {"annotations": {ERROR_KEY: error.to_text()}}});
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
                            &self.kube,
                            &p,
                            reason,
                            &format!("the corvid controller refuses the pod a port: {message}"),
                        )
                        .await;
                    }
                }
                self.retry(p);
                return;
            }
        };
        let want = PortAnnotation::of(&port, &uid, &net.network, &net.subnets, &self.cluster);
        // The resourceVersion makes the patch apply to the pod as read: a pod deleted and
        // recreated meanwhile is not annotated with another pod's port.
        let patch = json!({"metadata": {
            "resourceVersion": p.resource_version(),
            "uid": uid,
            "annotations": {KEY: want.to_text(), ERROR_KEY: null},
        }});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                self.backoff.reset(&pod_key(&uid));
                metrics::METRICS
                    .annotation_seconds
                    .observe(started.elapsed().as_secs_f64());
                tracing::info!(namespace = %ns, pod = %name, port = %port_id, "annotated")
            }
            // A newer version of the pod is on its way through the watch.
            Err(e) if is_conflict(&e) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                tracing::warn!(namespace = %ns, pod = %name, "annotating: {e}");
                self.retry(p);
            }
        }
    }
}

/// Records a warning event on `object` (a pod, a service), as `kubectl describe` shows.
async fn warning_event<K>(kube: &kube::Client, object: &K, reason: &str, message: &str)
where
    K: kube::Resource<DynamicType = ()>,
{
    let ns = object.namespace().unwrap_or_default();
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let built = serde_json::from_value::<K8sEvent>(json!({
        "metadata": {"generateName": format!("{}.", object.name_any())},
        "involvedObject": {"apiVersion": K::api_version(&()), "kind": K::kind(&()),
            "name": object.name_any(), "namespace": ns, "uid": object.uid()},
        "reason": reason, "message": message, "type": "Warning", "count": 1,
        "source": {"component": "corvid-kube-watch"},
    }));
    let Ok(mut event) = built else { return };
    event.first_timestamp = Some(now.clone());
    event.last_timestamp = Some(now);
    if let Err(e) = Api::<K8sEvent>::namespaced(kube.clone(), &ns)
        .create(&Default::default(), &event)
        .await
    {
        tracing::warn!("recording an event: {e}");
    }
}

/// Runs a blocking controller call off the async workers.
async fn call<T: Send + 'static>(
    ctl: &Arc<Client>,
    f: impl FnOnce(&Client) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let ctl = ctl.clone();
    tokio::task::spawn_blocking(move || f(&ctl))
        .await
        .unwrap_or_else(|e| Err(ApiError::Transport(e.to_string())))
}

fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn interval_stream(every: Duration) -> impl Stream<Item = ()> + Send {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    futures::stream::poll_fn(move |cx| tick.poll_tick(cx).map(|_| Some(())))
}
