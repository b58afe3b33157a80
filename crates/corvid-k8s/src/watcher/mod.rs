//! `corvid kube-watch`: namespaces to networks, pods to ports, each pod's port written
//! back onto it as the `corvid.io/port` annotation, and services to load balancers.
//!
//! One reconciler per kind (`namespaces`, `pods`, `services`), each a pure function of
//! what an object should have, tested without a cluster, and the calls that make the
//! controller hold it (idempotent: IDs derive from UIDs, a create that finds its object
//! done shows it). One loop takes the watch streams in turn and hands each event to its
//! reconciler; failed work comes back through `retry`'s queue with a backoff per object.
//! No finalizers: they would block every pod deletion while the watcher is down. Instead,
//! once a full list has arrived and every `resync` after, ports whose pod is gone,
//! networks whose namespace is gone and load balancers whose service is gone are swept.

pub mod endpoints;
pub mod load_balancer;
mod namespaces;
mod pods;
mod policies;
mod retry;
mod services;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use corvid_api::{
    ApiError, Client, FixedIpRequest, GatewayRequest, Network, NetworkCreate, Port, PortCreate,
    Router, RouterCreate, RouterInterface, RouterUpdate, Subnet, SubnetCreate, SubnetPoolCreate,
    ROUTER_INTERFACE,
};
use futures::{Stream, StreamExt};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Event as K8sEvent, Namespace, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::runtime::reflector;
use kube::runtime::watcher::{self, Event};
use kube::ResourceExt;
use serde_json::json;

use crate::ids;
use crate::leader::{Candidate, Election};
use crate::metrics::{self, Kind, Phase};
pub use crate::Error;
use namespaces::Namespaces;
use pods::Pods;
use policies::Policies;
use retry::{Queue, Retry};
use services::Services;

/// One family's pod pool: the range, and the prefix length of each namespace's subnet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodPool {
    /// The range.
    pub cidr: IpNet,
    /// The length of each namespace's subnet of it.
    pub prefix: u8,
}

impl PodPool {
    /// The controller's subnet pool for this family.
    pub fn id(&self) -> String {
        if self.cidr.addr().is_ipv6() {
            ids::pod_pool6()
        } else {
            ids::pod_pool()
        }
    }
}

/// What `corvid kube-watch` is told.
#[derive(Debug, Clone)]
pub struct Config {
    /// Kubeconfig path; `$KUBECONFIG`, then the in-cluster account, when none.
    pub kubeconfig: Option<PathBuf>,
    /// The controller's URL.
    pub controller: String,
    /// The token and TLS side the controller is reached with.
    pub credentials: corvid_api::Credentials,
    /// The API server's `--service-cluster-ip-range`, a range per family; found from
    /// the API server when none is given.
    pub service_cidrs: Vec<IpNet>,
    /// The network floating IPs come from; must exist when named.
    pub public_network: Option<String>,
    /// The router every namespace's network is attached to (ID or name); the watcher
    /// makes its own when none.
    pub router: Option<String>,
    /// Where the namespaces' subnets are carved from: one pool per family, each
    /// namespace a subnet of each (dual stack with both).
    pub pod_pools: Vec<PodPool>,
    /// How often ports and networks left by missed deletions are swept.
    pub resync: Duration,
    /// The lease that elects the one acting watcher.
    pub election: Election,
}

/// Runs the watcher: waits for the lease, sets up, reconciles until the lease is lost or
/// a watch ends for good.
pub async fn run(cfg: Config) -> Result<(), Error> {
    let kube = crate::connect(cfg.kubeconfig.as_deref()).await?;
    let ctl = cfg.credentials.client(&cfg.controller)?;
    let mut candidate = Candidate::new(kube.clone(), cfg.election.clone());
    metrics::phase(Phase::Standby);
    candidate.acquire().await;
    metrics::phase(Phase::SettingUp);
    let mut watcher = Watcher::new(kube, ctl, cfg);
    tokio::select! {
        r = watcher.run() => r,
        lost = candidate.hold() => {
            Err(Error::LeadershipLost(lost))
        }
    }
}

/// What every reconciler reaches the API server and the controller through.
#[derive(Clone)]
struct Ctx {
    kube: kube::Client,
    ctl: Arc<Client>,
    queue: Queue,
    /// The controller's cluster ID, which annotations carry to the plugin.
    cluster: Arc<str>,
}

impl Ctx {
    /// Runs a blocking controller call off the async workers.
    async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Client) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let ctl = self.ctl.clone();
        tokio::task::spawn_blocking(move || f(&ctl))
            .await
            .unwrap_or_else(|e| Err(ApiError::Transport(e.to_string())))
    }
}

/// One event from a watch, a retry or a timer.
enum Input {
    Namespace(Box<Event<Namespace>>),
    Pod(Box<Event<Pod>>),
    Service(Box<Event<Service>>),
    Policy(Box<Event<NetworkPolicy>>),
    Endpoints(Box<Event<endpoints::Change>>),
    WatchFailed(&'static str, String),
    Retry(Retry),
    Resync,
}

struct Watcher {
    ctx: Ctx,
    cfg: Config,
    retries: Option<tokio::sync::mpsc::UnboundedReceiver<Retry>>,
    namespaces: Namespaces,
    pods: Pods,
    services: Services,
    policies: Policies,
}

impl Watcher {
    fn new(kube: kube::Client, ctl: Client, cfg: Config) -> Self {
        let (queue, retries) = Queue::new();
        Watcher {
            ctx: Ctx {
                kube,
                ctl: Arc::new(ctl),
                queue,
                cluster: Arc::from(""),
            },
            namespaces: Namespaces::new(cfg.pod_pools.clone()),
            pods: Pods::new(),
            services: Services::new(None),
            policies: Policies::new(),
            retries: Some(retries),
            cfg,
        }
    }

    async fn run(&mut self) -> Result<(), Error> {
        self.setup().await?;
        metrics::phase(Phase::Watching);
        let kube = self.ctx.kube.clone();
        // The namespaces' reflector keeps the store network_of and the sweep read.
        let writer = self.namespaces.writer().expect("run is called once");
        let namespaces = reflector::reflector(
            writer,
            watcher::watcher(Api::<Namespace>::all(kube.clone()), Default::default()),
        )
        .map(|e| {
            e.map_or_else(
                |e| Input::WatchFailed("namespaces", e.to_string()),
                |e| Input::Namespace(Box::new(e)),
            )
        });
        let pods = watcher::watcher(Api::<Pod>::all(kube.clone()), Default::default()).map(|e| {
            e.map_or_else(
                |e| Input::WatchFailed("pods", e.to_string()),
                |e| Input::Pod(Box::new(e)),
            )
        });
        let services =
            watcher::watcher(Api::<Service>::all(kube.clone()), Default::default()).map(|e| {
                e.map_or_else(
                    |e| Input::WatchFailed("services", e.to_string()),
                    |e| Input::Service(Box::new(e)),
                )
            });
        let policies =
            watcher::watcher(Api::<NetworkPolicy>::all(kube.clone()), Default::default()).map(
                |e| {
                    e.map_or_else(
                        |e| Input::WatchFailed("networkpolicies", e.to_string()),
                        |e| Input::Policy(Box::new(e)),
                    )
                },
            );
        let source = endpoints::Source::discover(&kube).await;
        tracing::info!("services' members from {}", source.name());
        let endpoints = source.watch(kube).map(|e| {
            e.map_or_else(
                |e| Input::WatchFailed("endpoints", e.to_string()),
                |e| Input::Endpoints(Box::new(e)),
            )
        });
        let retries = self
            .retries
            .take()
            .map(tokio_stream_of)
            .expect("run is called once");
        let resync = interval_stream(self.cfg.resync).map(|_| Input::Resync);
        let mut inputs = futures::stream::select_all([
            namespaces.boxed(),
            pods.boxed(),
            services.boxed(),
            policies.boxed(),
            endpoints.boxed(),
            retries.map(Input::Retry).boxed(),
            resync.boxed(),
        ]);
        while let Some(input) = inputs.next().await {
            let ctx = &self.ctx;
            match input {
                Input::Namespace(e) => self.namespace_event(*e).await,
                Input::Pod(e) => self.pod_event(*e).await,
                Input::Service(e) => self.services.event(ctx, *e).await,
                Input::Policy(e) => {
                    metrics::event(Kind::NetworkPolicy);
                    self.policies.event(*e);
                    self.sync_policies().await;
                }
                Input::Retry(Retry::Policies) => {
                    self.policies.retried();
                    self.sync_policies().await
                }
                Input::Endpoints(e) => self.services.endpoints_event(ctx, *e).await,
                // A pod deleted since is not made a port; its groups are the engine's,
                // which follows the watch, not this older copy.
                Input::Retry(Retry::Pod(p)) => {
                    if p.uid().is_some_and(|uid| self.pods.exists(&uid)) {
                        self.pod(&p).await
                    }
                }
                Input::Retry(Retry::Namespace(n)) => self.namespaces.reconcile(ctx, &n).await,
                Input::Retry(Retry::Service(uid)) => self.services.reconcile(ctx, &uid).await,
                Input::Retry(Retry::PortDelete(uid)) => {
                    // Gone for good unless the pod came back meanwhile.
                    if !self.pods.known().contains(&uid) {
                        self.remove_port(&uid).await;
                    }
                }
                Input::Retry(Retry::NetworkDelete(uid)) => {
                    self.namespaces.remove(ctx, &uid, self.pods.known()).await
                }
                Input::Resync => {
                    self.sweep().await;
                    self.services.sweep(&self.ctx).await;
                    self.policies.read_hosts(&self.ctx).await;
                    self.policies.reload(&self.ctx).await;
                    self.sync_policies().await;
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
        self.ctx.cluster = Arc::from(self.ctx.call(|c| c.cluster_id()).await?);
        if let Some(public) = self.cfg.public_network.clone() {
            let name = public.clone();
            let by_name = self
                .ctx
                .call(move |c| c.list::<Network>(&[("name", &name)]).map(|l| l.0))
                .await?;
            let id = public.clone();
            let by_id = self
                .ctx
                .call(move |c| match c.get::<Network>(&id) {
                    Ok(n) => Ok(Some(n)),
                    Err(ApiError::Neutron { status: 404, .. }) => Ok(None),
                    Err(e) => Err(e),
                })
                .await?;
            let found = by_id
                .map(|n| n.id)
                .or_else(|| by_name.first().map(|n| n.id.clone()));
            if found.is_none() {
                return Err(Error::NoPublicNetwork(public));
            }
            self.services = Services::new(found);
        }
        let router = self.router().await?;
        tracing::info!(router = %router, "namespaces' networks are routed by it");
        self.namespaces.set_router(router.clone());
        for pool in self.cfg.pod_pools.clone() {
            let id = pool.id();
            let create = SubnetPoolCreate {
                id: Some(id.clone()),
                name: Some(
                    if pool.cidr.addr().is_ipv6() {
                        "k8s-pods6"
                    } else {
                        "k8s-pods"
                    }
                    .into(),
                ),
                prefixes: vec![pool.cidr],
                default_prefixlen: Some(pool.prefix),
                ..Default::default()
            };
            self.ctx.call(move |c| c.create_or_get(&id, create)).await?;
        }
        let (net_id, subnet_id) = ids::service_network();
        if self.cfg.service_cidrs.is_empty() {
            let found = crate::service_cidr::discover(&self.ctx.kube).await?;
            tracing::info!(service_cidr = %found, "the API server's service range");
            self.cfg.service_cidrs.push(found);
        }
        let net = NetworkCreate {
            id: Some(net_id.clone()),
            name: Some("k8s-services".into()),
            tags: Some(vec![ids::NETWORK_TAG.into()]),
            ..Default::default()
        };
        // A subnet per family, named by it: load balancers find theirs by their VIP's.
        let subnets: Vec<SubnetCreate> = self
            .cfg
            .service_cidrs
            .iter()
            .map(|cidr| {
                let v6 = cidr.addr().is_ipv6();
                SubnetCreate {
                    id: Some(if v6 {
                        ids::service_subnet6()
                    } else {
                        subnet_id.clone()
                    }),
                    network_id: net_id.clone(),
                    name: Some("k8s-services".into()),
                    cidr: Some(*cidr),
                    ip_version: Some(if v6 { 6 } else { 4 }),
                    // The API server gives the range's first address to the `kubernetes`
                    // service: no gateway takes it.
                    gateway_ip: Some(None),
                    ..Default::default()
                }
            })
            .collect();
        self.ctx
            .call(move |c| {
                c.create_or_get(&net_id, net)?;
                for create in subnets {
                    let id = create.id.clone().unwrap_or_default();
                    let subnet: Subnet = c.create_or_get(&id, create)?;
                    // Floating IPs, which are IPv4, reach VIPs through the router.
                    if subnet.cidr.addr().is_ipv4() {
                        attach_services(c, &router, &subnet)?;
                    }
                }
                Ok(())
            })
            .await?;
        // The groups every pod's port names exist before the first port is made.
        self.policies.read_hosts(&self.ctx).await;
        self.sync_policies().await;
        // The API server makes `default` shortly after it starts: the namespace watch
        // brings it if it is not there yet.
        if let Some(default) = Api::<Namespace>::all(self.ctx.kube.clone())
            .get_opt("default")
            .await?
        {
            self.namespaces.reconcile(&self.ctx, &default).await;
        }
        tracing::info!(
            pod_pools = ?self.cfg.pod_pools.iter().map(|p| p.cidr.to_string()).collect::<Vec<_>>(),
            service_cidrs = ?self.cfg.service_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
            "set up: the pod pool, the service network and the default namespace's network"
        );
        Ok(())
    }

    /// The router the namespaces' networks are attached to: the one `--router` names,
    /// else the cluster's own, made now (a restart finds it by its derived ID); its
    /// gateway is the public network's when there is one.
    async fn router(&self) -> Result<String, Error> {
        let public = self.services.public_network().map(str::to_string);
        let Some(named) = self.cfg.router.clone() else {
            let want = RouterCreate {
                id: Some(ids::cluster_router()),
                name: Some("k8s-cluster".into()),
                tags: Some(vec![ids::NETWORK_TAG.into()]),
                external_gateway_info: public.clone().map(|network_id| GatewayRequest {
                    network_id,
                    ..Default::default()
                }),
                ..Default::default()
            };
            let router = self
                .ctx
                .call(move |c| {
                    let r: Router = c.create_or_get(&ids::cluster_router(), want)?;
                    let has = r
                        .external_gateway_info
                        .as_ref()
                        .map(|g| g.network_id.clone());
                    match public {
                        Some(p) if has.as_ref() != Some(&p) => c.update::<Router>(
                            &r.id,
                            RouterUpdate {
                                external_gateway_info: Some(Some(GatewayRequest {
                                    network_id: p,
                                    ..Default::default()
                                })),
                                ..Default::default()
                            },
                        ),
                        _ => Ok(r),
                    }
                })
                .await?;
            return Ok(router.id);
        };
        let key = named.clone();
        let found = self
            .ctx
            .call(move |c| match c.get::<Router>(&key) {
                Ok(r) => Ok(Some(r)),
                Err(ApiError::Neutron { status: 404, .. }) => c
                    .list::<Router>(&[("name", &key)])
                    .map(|l| l.0.into_iter().next()),
                Err(e) => Err(e),
            })
            .await?;
        found.map(|r| r.id).ok_or(Error::NoRouter(named))
    }

    async fn namespace_event(&mut self, e: Event<Namespace>) {
        metrics::event(Kind::Namespace);
        match e {
            Event::Init => {}
            Event::InitApply(n) | Event::Apply(n) => {
                self.policies.namespace(&n);
                self.namespaces.reconcile(&self.ctx, &n).await
            }
            Event::InitDone => {
                self.namespaces.listed = true;
                self.policies.namespaces_listed(&self.namespaces.names());
                self.sweep().await;
            }
            Event::Delete(n) => {
                self.policies.namespace_gone(&n.name_any());
                if let Some(uid) = n.uid() {
                    self.namespaces
                        .remove(&self.ctx, &uid, self.pods.known())
                        .await;
                }
            }
        }
        self.sync_policies().await;
    }

    async fn pod_event(&mut self, e: Event<Pod>) {
        metrics::event(Kind::Pod);
        match e {
            Event::Init => self.pods.listing(),
            Event::InitApply(p) | Event::Apply(p) => {
                self.pods.seen(&p);
                self.pod_policies(&p).await;
                self.pod(&p).await;
            }
            Event::InitDone => {
                self.pods.listed();
                self.policies.pods_listed(self.pods.known());
                self.sync_policies().await;
                self.sweep().await;
            }
            Event::Delete(p) => {
                if let Some(uid) = p.uid() {
                    self.pods.forget(&uid);
                    // The port first: a group it was the last to hold can go then.
                    self.remove_port(&uid).await;
                    self.policies.pod_gone(&uid);
                    self.sync_policies().await;
                }
            }
        }
    }

    /// A pod as the watch brings it, into the NetworkPolicies' engine.
    async fn pod_policies(&mut self, p: &Pod) {
        let Some(uid) = p.uid() else { return };
        match pods::wanted(p) {
            pods::Wanted::Port(_) | pods::Wanted::Done => {
                self.policies.pod(&self.ctx, &uid, p).await
            }
            pods::Wanted::Nothing | pods::Wanted::NoPort(_) => self.policies.pod_gone(&uid),
        }
        self.sync_policies().await;
    }

    /// Whether namespaces, pods and NetworkPolicies have all been listed: until then the
    /// engine's word changes nothing that exists.
    fn listed(&self) -> bool {
        self.namespaces.listed && self.pods.listed && self.policies.listed
    }

    /// Brings the NetworkPolicies' changes over to the controller.
    async fn sync_policies(&mut self) {
        let complete = self.listed();
        self.policies
            .sync(&self.ctx, &mut self.pods, complete)
            .await;
    }

    /// Gives a pod what `pods::wanted` says it should have.
    async fn pod(&mut self, p: &Pod) {
        let mut want = pods::wanted(p);
        if let pods::Wanted::Port(w) = &mut want {
            // The groups the port is made with exist before it is.
            self.sync_policies().await;
            let complete = self.listed();
            w.security_groups = self.policies.port_groups(&w.uid, complete);
            w.groups_final = complete;
        }
        match want {
            pods::Wanted::Nothing | pods::Wanted::Done => {}
            pods::Wanted::NoPort(uid) => self.remove_port(&uid).await,
            pods::Wanted::Port(want) => {
                let Some(net) = self.namespaces.network_of(&self.ctx, &want.namespace).await else {
                    tracing::warn!(namespace = %want.namespace, pod = %want.name, "no network for the namespace yet");
                    self.ctx.queue.retry(Retry::Pod(Box::new(p.clone())));
                    return;
                };
                self.pods.reconcile(&self.ctx, p, want, net).await;
            }
        }
    }

    /// Deletes a gone or finished pod's port; it may have been the last keeping a gone
    /// namespace's network.
    async fn remove_port(&mut self, pod_uid: &str) {
        if self.pods.remove_port(&self.ctx, pod_uid).await {
            self.namespaces
                .remove_pending(&self.ctx, self.pods.known())
                .await;
        }
    }

    /// Deletes what deletions the watcher missed left behind: ports whose pod is gone,
    /// networks whose namespace is gone. Only once both lists have arrived.
    async fn sweep(&mut self) {
        if !(self.namespaces.listed && self.pods.listed) {
            metrics::sweep(Kind::Namespace);
            return;
        }
        self.pods.sweep(&self.ctx).await;
        self.namespaces.sweep(&self.ctx, self.pods.known()).await;
    }
}

/// Puts the service network on `router`, so that a floating IP reaches a service's VIP
/// through it (Neutron's rule for floating IPs). The subnet has no gateway address (the
/// range's first is the `kubernetes` service's): the interface is a port on the range's
/// broadcast address, which the API server never gives a service.
fn attach_services(c: &Client, router: &str, subnet: &Subnet) -> Result<(), ApiError> {
    let (attached, _) = c.list::<Port>(&[
        ("network_id", subnet.network_id.as_str()),
        ("device_owner", ROUTER_INTERFACE),
        ("device_id", router),
    ])?;
    if !attached.is_empty() {
        return Ok(());
    }
    let id = ids::service_router_port();
    let port: Port = c.create_or_get(
        &id,
        PortCreate {
            id: Some(id.clone()),
            network_id: subnet.network_id.clone(),
            name: Some("k8s-services-router".into()),
            fixed_ips: Some(vec![FixedIpRequest {
                subnet_id: Some(subnet.id.clone()),
                ip_address: Some(subnet.cidr.broadcast()),
            }]),
            tags: Some(vec![ids::NETWORK_TAG.into()]),
            ..Default::default()
        },
    )?;
    c.add_router_interface(
        router,
        &RouterInterface {
            subnet_id: None,
            port_id: Some(port.id),
        },
    )
    .map(drop)
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
