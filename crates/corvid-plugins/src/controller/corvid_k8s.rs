//! corvid-k8s: the node side of `corvid kube-watch`. The pod's port is named by its UID
//! (`ids::port`), so ADD needs no API server: it waits, on the controller's watch feed,
//! for the port the watcher makes, reads its network and subnets, plugs the pod through
//! the same binding as the bridge plugin, the agent and the Docker driver, tells the
//! controller where the port is plugged (so the host's agent links it into the overlay
//! and reports it ACTIVE), and answers the port's addresses. DEL unplugs; the watcher
//! deletes the port when the pod goes. No Kubernetes client is linked: the watcher's
//! `corvid.io/port` annotation stays for people and tools.

use std::path::PathBuf;
use std::time::Duration;

use corvid_api::{ApiError, Client, Network, Port, PortUpdate, Subnet};
use corvid_cni::result::{Interface, IpConfig, Route};
use corvid_cni::skel::{CmdArgs, Plugin};
use corvid_cni::{CniResult, Error, ErrorCode};
use corvid_k8s::annotation::PortAnnotation;
use corvid_net::binding::{ensure_bridge, ensure_plugged, BridgeSpec, VethSpec};
use corvid_net::{names, Netlink, Netns};
use serde::Deserialize;

use super::corvid::Code as ControllerCode;
use super::wait::{self, NotActive};
use crate::errors;

/// The Kubernetes pod plugin.
pub struct CorvidK8s;

fn default_controller() -> String {
    "http://127.0.0.1:9696".into()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
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

/// The pod's UID, which names its port.
fn uid_of(pod: &PodRef) -> Result<&str, Error> {
    pod.uid.as_deref().ok_or_else(|| {
        Error::new(
            ErrorCode::InvalidEnvironment,
            format!(
                "CNI_ARGS must carry the pod's UID (K8S_POD_UID), as containerd and CRI-O pass it: pod {}/{}",
                pod.namespace, pod.name
            ),
        )
    })
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

/// What the pod's port is, as the watcher's annotation would say it: the port (once the
/// watcher has made it, waiting up to the configured timeout on the controller's feed),
/// its network, its subnets and the controller's cluster ID.
fn port_of(conf: &Conf, client: &Client, pod: &PodRef, uid: &str) -> Result<PortAnnotation, Error> {
    let id = corvid_k8s::ids::port(uid);
    let doing = "reading the pod's port";
    let port = wait::exists(client, &id, Duration::from_secs(conf.timeout))
        .map_err(|e| controller_error(e, conf, doing))?
        .ok_or_else(|| {
            Error::new(
                ErrorCode::TryAgainLater,
                format!(
                    "pod {}/{} has no port ({id}) on the controller after {}s: is `corvid kube-watch` running? \
                     If it is, the pod's events say why it cannot make one",
                    pod.namespace, pod.name, conf.timeout
                ),
            )
        })?;
    describe(conf, client, &port, uid)
}

/// What the annotation would say of `port`: read with its network, its subnets and the
/// controller's cluster ID.
fn describe(conf: &Conf, client: &Client, port: &Port, uid: &str) -> Result<PortAnnotation, Error> {
    let doing = "reading the pod's port";
    let network: Network = client
        .get(&port.network_id)
        .map_err(|e| controller_error(e, conf, doing))?;
    let (subnets, _) = client
        .list::<Subnet>(&[("network_id", &port.network_id)])
        .map_err(|e| controller_error(e, conf, doing))?;
    let cluster = client
        .cluster_id()
        .map_err(|e| controller_error(e, conf, doing))?;
    Ok(PortAnnotation::of(port, uid, &network, &subnets, &cluster))
}

/// The MTU a network of `network_mtu` gets on this node: the agent's, which lowers it to
/// what the node's underlay carries once encapsulated (found from the underlay address
/// the agent registered; the network's own before it has).
fn pod_mtu(conf: &Conf, network_mtu: u32) -> Result<u32, Error> {
    let underlay = conf
        .client()
        .registered_underlay(&conf.host_id())
        .map_err(|e| controller_error(e, conf, "reading this node's underlay address"))?;
    let mut nl = Netlink::open().map_err(errors::net)?;
    corvid_net::overlay::pod_mtu(&mut nl, underlay, network_mtu).map_err(errors::net)
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
            ipv6: None,
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
            kept: &[],
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
/// The change that says a port is plugged nowhere.
fn unbound() -> PortUpdate {
    PortUpdate {
        network_ns: Some(None),
        veth_name: Some(None),
        ..Default::default()
    }
}

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
                // The annotation's gateway is IPv4's; IPv6's is its default route's.
                gateway: a
                    .gateway
                    .filter(|g| g.is_ipv4() == addr.addr().is_ipv4())
                    .or_else(|| {
                        a.routes
                            .iter()
                            .find(|r| {
                                r.dst.prefix_len() == 0
                                    && r.dst.addr().is_ipv4() == addr.addr().is_ipv4()
                            })
                            .and_then(|r| r.gw)
                    }),
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

/// The pod ports bound to this host.
fn ports_here(conf: &Conf) -> Result<Vec<Port>, Error> {
    conf.client()
        .list::<Port>(&[
            ("binding:host_id", &conf.host_id()),
            ("device_owner", corvid_k8s::ids::POD_OWNER),
        ])
        .map(|(ports, _)| ports)
        .map_err(|e| controller_error(e, conf, "listing this host's pod ports"))
}

/// The pod port this host bound to `netns` and `ifname`, for a DEL without the pod's UID.
fn bound_port(
    conf: &Conf,
    ifname: &str,
    netns: Option<&std::path::Path>,
) -> Result<Option<String>, Error> {
    let Some(netns) = netns else { return Ok(None) };
    let netns = netns.display().to_string();
    Ok(ports_here(conf)?
        .into_iter()
        .find(|p| p.network_ns.as_deref() == Some(&netns) && p.veth_name.as_deref() == Some(ifname))
        .map(|p| p.id))
}

impl Plugin for CorvidK8s {
    fn add(&self, args: &CmdArgs) -> Result<CniResult, Error> {
        let conf = load(args)?;
        let pod = pod_ref(args)?;
        let netns_path = netns_of(args)?;
        let netns = Netns::open(&netns_path).map_err(errors::net)?;
        let mut a = port_of(&conf, &conf.client(), &pod, uid_of(&pod)?)?;
        a.mtu = pod_mtu(&conf, a.mtu)?;
        let done = plug(&a, args, &netns).and_then(|overlay_here| {
            let client = conf.client();
            let host_id = conf.host_id();
            let netns = netns_path.display().to_string();
            client
                .update(
                    &a.port_id,
                    PortUpdate {
                        host_id: Some(host_id.clone()),
                        network_ns: Some(Some(netns.clone())),
                        veth_name: Some(Some(args.ifname.clone())),
                        ..Default::default()
                    },
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
            let _ = conf.client().update(&a.port_id, unbound());
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
            // Without the UID, the port this host bound to the namespace and interface.
            None => bound_port(&conf, &args.ifname, args.netns.as_deref()).unwrap_or_else(|e| {
                tracing::warn!("DEL: the pod's port is left to the watcher: {}", e.msg);
                None
            }),
        };
        let Some(port_id) = port_id else {
            return Ok(());
        };
        unplug(&port_id)?;
        // The binding is the controller's side: the watcher deletes the ports of pods
        // that are gone, the next ADD binds anew, and the agent's pass cleans up.
        match conf.client().update(&port_id, unbound()) {
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
        let uid = uid_of(&pod)?;
        let client = conf.client();
        let id = corvid_k8s::ids::port(uid);
        let doing = "reading the pod's port";
        let port: Port = match client.get(&id) {
            Err(ApiError::Neutron { status: 404, .. }) => {
                return Err(fail(format!(
                    "pod {}/{} has no port ({id}) on the controller",
                    pod.namespace, pod.name
                )))
            }
            r => r.map_err(|e| controller_error(e, &conf, doing))?,
        };
        let a = describe(&conf, &client, &port, uid)?;
        let ns = Netns::open(netns_of(args)?).map_err(errors::net)?;
        let mut nl = Netlink::open_in(&ns).map_err(errors::net)?;
        let link = nl
            .link_by_name(&args.ifname)
            .map_err(errors::net)?
            .ok_or_else(|| fail(format!("interface {} is missing", args.ifname)))?;
        if !link.mac.eq_ignore_ascii_case(&a.mac) {
            return Err(fail(format!(
                "interface {} has MAC {}, its port says {}",
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
        for p in ports_here(&conf)? {
            let Some(ns) = &p.network_ns else { continue };
            if Netns::open(ns).is_ok() {
                continue;
            }
            unplug(&p.id)?;
            match client.update(&p.id, unbound()) {
                Ok(_) | Err(ApiError::Neutron { status: 404, .. }) => {}
                Err(e) => return Err(controller_error(e, &conf, "unbinding a port")),
            }
        }
        Ok(())
    }

    fn status(&self, args: &CmdArgs) -> Result<(), Error> {
        let conf = load(args)?;
        conf.client()
            .list::<Port>(&[("id", "none")])
            .map(drop)
            .map_err(|e| {
                let e = controller_error(e, &conf, "reaching the controller");
                Error::new(ErrorCode::PluginNotAvailable, e.msg)
            })
    }
}
