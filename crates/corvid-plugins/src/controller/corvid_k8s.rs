//! corvid-k8s: the node side of `corvid kube-watch`. ADD waits, on a watch of the one pod,
//! for the `corvid.io/port` annotation the watcher writes, plugs the pod through the same
//! binding as the bridge plugin, the agent and the Docker driver, tells the controller
//! where the port is plugged (so the host's agent links it into the overlay and reports
//! it ACTIVE), and answers the port's addresses. DEL unplugs; the watcher deletes the port
//! when the pod goes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use corvid_api::{ApiError, Client, Port};
use corvid_cni::result::{Interface, IpConfig, Route};
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_k8s::annotation::{PortAnnotation, PortError, ERROR_KEY, KEY};
use corvid_net::binding::{ensure_bridge, ensure_plugged, BridgeSpec, VethSpec};
use corvid_net::{names, Netlink, Netns};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, WatchEvent, WatchParams};
use kube::ResourceExt;
use serde::Deserialize;
use serde_json::json;

use super::corvid::Code as ControllerCode;
use super::wait::{self, NotActive};
use crate::errors;

/// The Kubernetes pod plugin.
pub struct CorvidK8s;

/// This plugin's own CNI error codes, beside the controller ones it shares with `corvid`
/// (106 unreachable, 108 refused, 109 the agent failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Code {
    /// 110: the API server could not be reached.
    ApiServerUnreachable = 110,
    /// 111: the API server refused the plugin's credentials (401) or its RBAC role lacks
    /// get/list/watch on pods (403).
    Forbidden = 111,
    /// 112: the pod's `corvid.io/port` annotation is not one the plugin can use.
    AnnotationMalformed = 112,
}

impl From<Code> for u32 {
    fn from(c: Code) -> u32 {
        c as u32
    }
}

fn default_kubeconfig() -> PathBuf {
    PathBuf::from("/etc/cni/net.d/corvid-k8s.kubeconfig")
}

fn default_controller() -> String {
    "http://127.0.0.1:9696".into()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    #[serde(default = "default_kubeconfig")]
    kubeconfig: PathBuf,
    #[serde(default = "default_controller")]
    controller: String,
    #[serde(flatten)]
    access: super::credentials::ControllerAccess,
    #[serde(default)]
    host_id: Option<String>,
    /// The client `access` describes, made (and its files checked) by `load`.
    #[serde(skip)]
    client: Option<Client>,
    #[serde(default = "wait::default_timeout")]
    timeout: u64,
}

impl Conf {
    fn host_id(&self) -> String {
        self.host_id.clone().unwrap_or_else(corvid_net::hostname)
    }

    fn client(&self) -> Client {
        self.client
            .clone()
            .unwrap_or_else(|| Client::new(&self.controller))
    }
}

/// The pod the runtime names in CNI_ARGS.
struct PodRef {
    namespace: String,
    name: String,
    uid: Option<String>,
}

fn pod_ref(args: &CmdArgs) -> Result<PodRef, Error> {
    let get = |k: &str| {
        args.args
            .get(k)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    match (get("K8S_POD_NAMESPACE"), get("K8S_POD_NAME")) {
        (Some(namespace), Some(name)) => Ok(PodRef {
            namespace,
            name,
            uid: get("K8S_POD_UID"),
        }),
        _ => Err(Error::new(
            ErrorCode::InvalidEnvironment,
            "CNI_ARGS must name the pod (K8S_POD_NAMESPACE and K8S_POD_NAME), as the kubelet and CRI runtimes do",
        )),
    }
}

fn load(args: &CmdArgs) -> Result<Conf, Error> {
    let mut c: Conf = serde_json::from_slice(&args.stdin).map_err(errors::config)?;
    if !c.controller.starts_with("http://") && !c.controller.starts_with("https://") {
        return Err(Error::new(
            ErrorCode::InvalidNetworkConfig,
            format!(
                "\"controller\" must be an http:// or https:// URL, not {}",
                c.controller
            ),
        ));
    }
    c.client = Some(c.access.client(&c.controller)?);
    Ok(c)
}

/// An API server failure as the CNI error a person can act on.
fn kube_error(e: kube::Error, doing: &str) -> Error {
    match e {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => Error::new(
            Code::Forbidden,
            format!("{doing}: the API server refused the plugin ({} {}): check the kubeconfig's token and that its user may get, list and watch pods", s.code, s.reason),
        )
        .with_details(s.message),
        e => Error::new(
            Code::ApiServerUnreachable,
            format!("{doing}: the API server could not be reached"),
        )
        .with_details(e.to_string()),
    }
}

/// A controller failure as a CNI error.
fn controller_error(e: ApiError, conf: &Conf, doing: &str) -> Error {
    match e {
        ApiError::Transport(why) => Error::new(
            ControllerCode::ControllerUnreachable,
            format!(
                "{doing}: the corvid controller at {} is unreachable",
                conf.controller
            ),
        )
        .with_details(why),
        e => Error::new(ControllerCode::ControllerRefused, format!("{doing}: {e}")),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::new(ErrorCode::Io, format!("starting the runtime: {e}")))
}

async fn pods(conf: &Conf, pod: &PodRef) -> Result<Api<Pod>, Error> {
    if !conf.kubeconfig.exists() {
        return Err(Error::new(
            ErrorCode::InvalidNetworkConfig,
            format!(
                "kubeconfig {} does not exist: set \"kubeconfig\" in the network configuration",
                conf.kubeconfig.display()
            ),
        ));
    }
    let client = corvid_k8s::connect(Some(&conf.kubeconfig))
        .await
        .map_err(|e| Error::new(ErrorCode::InvalidNetworkConfig, e))?;
    Ok(Api::namespaced(client, &pod.namespace))
}

/// The pod's annotation if it is there and meant for this pod.
fn annotation_of(p: &Pod, want_uid: Option<&str>) -> Result<Option<PortAnnotation>, Error> {
    let uid = p.uid().unwrap_or_default();
    if want_uid.is_some_and(|w| w != uid) {
        return Ok(None);
    }
    let Some(text) = p.annotations().get(KEY) else {
        if let Some(e) = p
            .annotations()
            .get(ERROR_KEY)
            .and_then(|t| serde_json::from_str::<PortError>(t).ok())
        {
            let code: u32 = if e.reason == "IpAddressGenerationFailure" {
                ErrorCode::AddressExhausted.into()
            } else {
                ControllerCode::ControllerRefused.into()
            };
            return Err(Error::new(
                code,
                format!(
                    "corvid kube-watch cannot make a port for pod {}: {}",
                    p.name_any(),
                    e.message
                ),
            ));
        }
        return Ok(None);
    };
    let a = PortAnnotation::parse(text).map_err(|e| {
        Error::new(
            Code::AnnotationMalformed,
            format!("pod {}: {e}", p.name_any()),
        )
    })?;
    Ok((a.pod_uid == uid).then_some(a))
}

/// Waits, on a watch of the one pod, until it carries its annotation.
async fn wait_annotation(conf: &Conf, pod: &PodRef) -> Result<PortAnnotation, Error> {
    let api = pods(conf, pod).await?;
    let deadline = Instant::now() + Duration::from_secs(conf.timeout);
    let uid = pod.uid.as_deref();
    let doing = format!("reading pod {}/{}", pod.namespace, pod.name);
    'read: loop {
        let mut version = "0".to_string();
        if let Some(p) = api
            .get_opt(&pod.name)
            .await
            .map_err(|e| kube_error(e, &doing))?
        {
            if let Some(a) = annotation_of(&p, uid)? {
                return Ok(a);
            }
            version = p.resource_version().unwrap_or(version);
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now()).as_secs();
            if left == 0 {
                return Err(Error::new(
                    ErrorCode::TryAgainLater,
                    format!(
                        "pod {}/{} has no {KEY} annotation after {}s: is `corvid kube-watch` running?",
                        pod.namespace, pod.name, conf.timeout
                    ),
                ));
            }
            let params = WatchParams::default()
                .fields(&format!("metadata.name={}", pod.name))
                .timeout(left.min(290) as u32);
            let mut events = api
                .watch(&params, &version)
                .await
                .map_err(|e| kube_error(e, &doing))?
                .boxed();
            while let Some(event) = events.next().await {
                match event.map_err(|e| kube_error(e, &doing))? {
                    WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                        if let Some(a) = annotation_of(&p, uid)? {
                            return Ok(a);
                        }
                        version = p.resource_version().unwrap_or(version);
                    }
                    WatchEvent::Bookmark(b) => version = b.metadata.resource_version,
                    WatchEvent::Deleted(_) => {}
                    // Too old a version: read the pod again.
                    WatchEvent::Error(_) => continue 'read,
                }
            }
        }
    }
}

fn netns_of(args: &CmdArgs) -> Result<PathBuf, Error> {
    args.netns
        .clone()
        .ok_or_else(|| Error::new(ErrorCode::InvalidEnvironment, "CNI_NETNS is required"))
}

/// Plugs the pod's interface as the annotation says; true when the host's agent had
/// already linked the network into the overlay here (its VXLAN device on the bridge).
fn plug(a: &PortAnnotation, args: &CmdArgs, netns: &Netns) -> Result<bool, Error> {
    let mut host = Netlink::open().map_err(errors::net)?;
    let mut pod = Netlink::open_in(netns).map_err(errors::net)?;
    // Marked as the node's agent marks them, so another corvid's agent leaves them.
    let mark =
        |object: &str| (!a.cluster.is_empty()).then(|| names::owner_mark(&a.cluster, object));
    let bridge = ensure_bridge(
        &mut host,
        &BridgeSpec {
            name: &names::bridge(&a.network_id),
            mtu: Some(a.mtu),
            vlan_filtering: false,
            promisc: false,
            alias: mark(&a.network_id).as_deref(),
        },
    )
    .map_err(errors::net)?;
    let routes: Vec<_> = a.routes.iter().map(|r| (r.dst, r.gw)).collect();
    ensure_plugged(
        &mut host,
        &mut pod,
        netns,
        &bridge,
        &VethSpec {
            ifname: &args.ifname,
            mtu: Some(a.mtu),
            // A pod reaching a service through its VIP may be sent to itself.
            hairpin: true,
            vlan: None,
            keep_default_vlan: true,
            mac: Some(&a.mac),
            host_name: Some(&names::host_veth(&a.port_id)),
            alias: mark(&a.port_id).as_deref(),
        },
        &a.addresses,
        &routes,
    )
    .map_err(errors::net)?;
    let vxlan = host
        .link_by_name(&names::vxlan(&a.network_id))
        .map_err(errors::net)?;
    Ok(vxlan.is_some_and(|v| v.master == Some(bridge.index) && v.up))
}

/// Removes the pod's end of its veth pair, which takes the host end with it; a
/// namespace or interface already gone leaves nothing to do.
fn unplug_pod_side(netns: &std::path::Path, ifname: &str) -> Result<(), Error> {
    let Ok(ns) = Netns::open(netns) else {
        return Ok(());
    };
    let mut nl = Netlink::open_in(&ns).map_err(errors::net)?;
    match nl.link_by_name(ifname).map_err(errors::net)? {
        Some(l) if l.kind == corvid_net::link::LinkKind::Veth => {
            nl.delete_link(&l).map_err(errors::net)
        }
        _ => Ok(()),
    }
}

/// Removes the pod's veth pair (one end takes the other with it).
fn unplug(port_id: &str) -> Result<(), Error> {
    let mut host = Netlink::open().map_err(errors::net)?;
    if let Some(l) = host
        .link_by_name(&names::host_veth(port_id))
        .map_err(errors::net)?
    {
        host.delete_link(&l).map_err(errors::net)?;
    }
    Ok(())
}

fn result_of(a: &PortAnnotation, args: &CmdArgs, netns: &str) -> CniResult {
    CniResult {
        interfaces: vec![Interface {
            name: args.ifname.clone(),
            mac: a.mac.clone(),
            sandbox: netns.to_string(),
            ..Interface::default()
        }],
        ips: a
            .addresses
            .iter()
            .map(|addr| IpConfig {
                address: *addr,
                gateway: a.gateway.filter(|g| g.is_ipv4() == addr.addr().is_ipv4()),
                interface: Some(0),
            })
            .collect(),
        routes: a
            .routes
            .iter()
            .map(|r| Route {
                dst: r.dst,
                gw: r.gw,
                ..Route::default()
            })
            .collect(),
        ..CniResult::default()
    }
}

impl Plugin for CorvidK8s {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        let conf = load(args)?;
        let pod = pod_ref(args)?;
        let netns_path = netns_of(args)?;
        let netns = Netns::open(&netns_path).map_err(errors::net)?;
        let a = runtime()?.block_on(wait_annotation(&conf, &pod))?;
        let done = plug(&a, args, &netns).and_then(|overlay_here| {
            let client = conf.client();
            let host_id = conf.host_id();
            let netns = netns_path.display().to_string();
            client
                .update::<Port>(
                    &a.port_id,
                    json!({"binding:host_id": host_id, "network_ns": netns, "veth_name": args.ifname}),
                )
                .map_err(|e| controller_error(e, &conf, "binding the port"))?;
            if overlay_here {
                // The agent reports the port ACTIVE when it sees it; the pod's traffic
                // already flows, so the pod need not wait for that.
                return Ok(result_of(&a, args, &netns));
            }
            // The first pod of the network on this host: wait until the agent has linked
            // the network into the overlay, or the pod would start cut off from the others.
            wait::active(&client, &host_id, &a.port_id, Duration::from_secs(conf.timeout))
                .map_err(|e| match e {
                    NotActive::Failed => Error::new(
                        ControllerCode::PortFailed,
                        format!("the agent of host {host_id} could not take port {}: see its log", a.port_id),
                    ),
                    NotActive::Timeout => Error::new(
                        ErrorCode::TryAgainLater,
                        format!("port {} is not ACTIVE after {}s: is `corvid agent --host-id {host_id}` running here?", a.port_id, conf.timeout),
                    ),
                    NotActive::Gone => Error::new(
                        ControllerCode::ControllerRefused,
                        format!("port {} was deleted while plugging it (was the pod deleted?)", a.port_id),
                    ),
                    NotActive::Api(e) => controller_error(e, &conf, "waiting for the port"),
                })?;
            Ok(result_of(&a, args, &netns))
        });
        if done.is_err() {
            // Nothing half-made stays: the pair goes, and the port forgets the namespace.
            let _ = unplug(&a.port_id);
            let _ = conf
                .client()
                .update::<Port>(&a.port_id, json!({"network_ns": null, "veth_name": null}));
        }
        done
    }

    fn del(&self, args: &CmdArgs) -> Result<(), Error> {
        let conf = load(args)?;
        let pod = pod_ref(args)?;
        // The host side first, from what the runtime gives alone: a DEL succeeds whenever
        // it can undo what is local, whatever the API server and the controller say.
        if let Some(netns) = &args.netns {
            unplug_pod_side(netns, &args.ifname)?;
        }
        let port_id = match &pod.uid {
            Some(uid) => Some(corvid_k8s::ids::port(uid)),
            // Without the UID the annotation names the port; a pod that is gone took it.
            None => {
                let found = runtime()?.block_on(async {
                    let api = pods(&conf, &pod).await?;
                    let p = api
                        .get_opt(&pod.name)
                        .await
                        .map_err(|e| kube_error(e, "reading the pod"))?;
                    Ok::<_, Error>(p.and_then(|p| annotation_of(&p, None).ok().flatten()))
                });
                match found {
                    Ok(a) => a.map(|a| a.port_id),
                    Err(e) => {
                        tracing::warn!("DEL: the pod's port is left to the watcher: {}", e.msg);
                        None
                    }
                }
            }
        };
        let Some(port_id) = port_id else {
            return Ok(());
        };
        unplug(&port_id)?;
        // The binding is the controller's side: the watcher deletes the ports of pods
        // that are gone, the next ADD binds anew, and the agent's pass cleans up.
        match conf
            .client()
            .update::<Port>(&port_id, json!({"network_ns": null, "veth_name": null}))
        {
            Ok(_) | Err(ApiError::Neutron { status: 404, .. }) => {}
            Err(e) => {
                let e = controller_error(e, &conf, "unbinding the port");
                tracing::warn!(port = %port_id, "DEL: {} (left to the controller side)", e.msg);
            }
        }
        Ok(())
    }

    fn check(&self, args: &CmdArgs) -> Result<(), Error> {
        let conf = load(args)?;
        let pod = pod_ref(args)?;
        let fail = |msg: String| Error::new(ErrorCode::CheckFailed, msg);
        let a = runtime()?.block_on(async {
            let api = pods(&conf, &pod).await?;
            let p = api
                .get_opt(&pod.name)
                .await
                .map_err(|e| kube_error(e, "reading the pod"))?
                .ok_or_else(|| fail(format!("pod {}/{} is gone", pod.namespace, pod.name)))?;
            annotation_of(&p, pod.uid.as_deref())?.ok_or_else(|| {
                fail(format!(
                    "pod {}/{} has no {KEY} annotation",
                    pod.namespace, pod.name
                ))
            })
        })?;
        let ns = Netns::open(netns_of(args)?).map_err(errors::net)?;
        let mut nl = Netlink::open_in(&ns).map_err(errors::net)?;
        let link = nl
            .link_by_name(&args.ifname)
            .map_err(errors::net)?
            .ok_or_else(|| fail(format!("interface {} is missing", args.ifname)))?;
        if !link.mac.eq_ignore_ascii_case(&a.mac) {
            return Err(fail(format!(
                "interface {} has MAC {}, the annotation says {}",
                args.ifname, link.mac, a.mac
            )));
        }
        let have = nl.addresses(Some(link.index)).map_err(errors::net)?;
        for want in &a.addresses {
            if !have.iter().any(|(_, got)| got == want) {
                return Err(fail(format!(
                    "interface {} lacks address {want}",
                    args.ifname
                )));
            }
        }
        Ok(())
    }

    fn gc(&self, args: &CmdArgs) -> Result<(), Error> {
        // The watcher deletes ports whose pod is gone; here, pairs whose pod namespace is
        // gone are removed and their ports told so.
        let conf = load(args)?;
        let client = conf.client();
        let (ports, _) = client
            .list::<Port>(&[
                ("binding:host_id", &conf.host_id()),
                ("device_owner", corvid_k8s::ids::POD_OWNER),
            ])
            .map_err(|e| controller_error(e, &conf, "listing this host's pod ports"))?;
        for p in ports {
            let Some(ns) = &p.network_ns else { continue };
            if Netns::open(ns).is_ok() {
                continue;
            }
            unplug(&p.id)?;
            match client.update::<Port>(&p.id, json!({"network_ns": null, "veth_name": null})) {
                Ok(_) | Err(ApiError::Neutron { status: 404, .. }) => {}
                Err(e) => return Err(controller_error(e, &conf, "unbinding a port")),
            }
        }
        Ok(())
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        let conf = load(args)?;
        let unavailable = |e: Error| Error::new(ErrorCode::PluginNotAvailable, e.msg);
        conf.client()
            .list::<Port>(&[("id", "none")])
            .map_err(|e| unavailable(controller_error(e, &conf, "reaching the controller")))?;
        runtime()?
            .block_on(async {
                let api = pods(
                    &conf,
                    &PodRef {
                        namespace: "default".into(),
                        name: String::new(),
                        uid: None,
                    },
                )
                .await?;
                api.list_metadata(&kube::api::ListParams::default().limit(1))
                    .await
                    .map(drop)
                    .map_err(|e| kube_error(e, "listing pods"))
            })
            .map_err(unavailable)
    }
}
