//! Services as load balancers: what a Service should be on the controller (pure, from
//! the Service and the pods the watcher knows), and the calls that make the controller
//! match it, sending only what changed since the watcher last looked.
//!
//! A Service with a cluster IP is a load balancer whose VIP port holds that IP on the
//! service network; each service port is a listener with one pool, whose members are
//! the ready endpoints the API's endpoint objects give for the port's name (see
//! `endpoints`), as kube-proxy takes them. A `type: LoadBalancer` service also gets a
//! floating IP from the public network, associated with the VIP port, and written into
//! `status.loadBalancer.ingress`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use corvid_api::{
    ApiError, Client, FloatingIp, FloatingIpCreate, LbProtocol, Listener, ListenerCreate,
    ListenerUpdate, LoadBalancer, LoadBalancerCreate, Member, MemberCreate, Pool, PoolCreate,
    PoolUpdate, SessionPersistence, NODE_PORT_TAG,
};
use k8s_openapi::api::core::v1::{Service, ServicePort};

use super::endpoints::{protocol_of, EndpointGroup};
use crate::ids;

/// One service port as a listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedListener {
    /// TCP, UDP or SCTP.
    pub protocol: LbProtocol,
    /// The port on the cluster IP.
    pub port: u16,
    /// The node port the API server gave it, if any.
    pub node_port: Option<u16>,
    /// Client affinity timeout in seconds (`sessionAffinity: ClientIP`).
    pub affinity: Option<u64>,
    /// Members: address and port.
    pub members: BTreeSet<(IpAddr, u16)>,
}

impl WantedListener {
    /// The listener's key among the service's: `TCP/80`.
    pub fn key(&self) -> String {
        format!("{}/{}", protocol_name(self.protocol), self.port)
    }
}

/// What a Service should be on the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The cluster IP: the VIP.
    pub vip: IpAddr,
    /// By key (`TCP/80`).
    pub listeners: BTreeMap<String, WantedListener>,
    /// `type: LoadBalancer`: a floating IP, this one if `loadBalancerIP` asks for it.
    pub floating: Option<Option<IpAddr>>,
}

fn protocol_name(p: LbProtocol) -> &'static str {
    match p {
        LbProtocol::Tcp => "TCP",
        LbProtocol::Udp => "UDP",
        LbProtocol::Sctp => "SCTP",
        LbProtocol::Other => "OTHER",
    }
}

/// Kubernetes' default for `sessionAffinityConfig.clientIP.timeoutSeconds`.
const DEFAULT_AFFINITY_SECONDS: u64 = 10800;

/// Labels that hand a service to another proxy (`service-proxy-name`) or to none
/// (`headless`): kube-proxy leaves such services alone, and so does corvid.
const NOT_OURS: [&str; 2] = [
    "service.kubernetes.io/service-proxy-name",
    "service.kubernetes.io/headless",
];

/// What `svc` should be, given its endpoints' groups; none for a service that gets no
/// load balancer (headless, ExternalName, no cluster IP yet, labelled [`NOT_OURS`]).
pub fn wanted<'a>(
    svc: &Service,
    groups: impl Iterator<Item = &'a EndpointGroup> + Clone,
) -> Option<Wanted> {
    wanted_at(svc, 0, groups)
}

/// What a dual-stack service's second cluster IP (`spec.clusterIPs[1]`, of the other
/// family) should be: a load balancer of its own, with that family's members and the
/// same node ports, and no floating IP (the public network's are IPv4).
pub fn wanted_secondary<'a>(
    svc: &Service,
    groups: impl Iterator<Item = &'a EndpointGroup> + Clone,
) -> Option<Wanted> {
    wanted_at(svc, 1, groups)
}

/// The key the second cluster IP's load balancer is named by, where the first's is the
/// service's UID: its objects' IDs derive from it, and its tag carries it.
pub fn secondary_key(service_uid: &str) -> String {
    format!("{service_uid}/secondary")
}

/// The service's UID of a key [`secondary_key`] made, or of a UID itself.
pub fn service_of(key: &str) -> &str {
    key.strip_suffix("/secondary").unwrap_or(key)
}

fn wanted_at<'a>(
    svc: &Service,
    index: usize,
    groups: impl Iterator<Item = &'a EndpointGroup> + Clone,
) -> Option<Wanted> {
    build(svc, index, |p, protocol| {
        let name = p.name.as_deref().unwrap_or("");
        groups
            .clone()
            .filter_map(|g| Some((g, g.port(name, protocol)?)))
            .flat_map(|(g, port)| g.addresses.iter().map(move |a| (*a, port)))
            .collect()
    })
}

/// The load balancer of the service's cluster IP number `index` with each port's
/// members as `members` gives them (by the service port and its protocol); the VIP's
/// family only.
fn build(
    svc: &Service,
    index: usize,
    members: impl Fn(&ServicePort, LbProtocol) -> Vec<(IpAddr, u16)>,
) -> Option<Wanted> {
    let spec = svc.spec.as_ref()?;
    let not_ours =
        (svc.metadata.labels.as_ref()).is_some_and(|m| NOT_OURS.iter().any(|l| m.contains_key(*l)));
    if spec.type_.as_deref() == Some("ExternalName") || not_ours {
        return None;
    }
    // `clusterIPs` (1.20 and later) lists the families' addresses, the first being
    // `clusterIP`.
    let vip: IpAddr = match (index, spec.cluster_ips.as_deref()) {
        (_, Some(ips)) if !ips.is_empty() => ips.get(index)?.parse().ok()?,
        (0, _) => spec.cluster_ip.as_deref()?.parse().ok()?,
        _ => return None,
    };
    let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref()?.timeout_seconds)
            .and_then(|t| u64::try_from(t).ok())
            .unwrap_or(DEFAULT_AFFINITY_SECONDS)
    });
    let mut listeners = BTreeMap::new();
    for p in spec.ports.iter().flatten() {
        let protocol = protocol_of(p.protocol.as_deref());
        let Ok(port) = u16::try_from(p.port) else {
            continue;
        };
        let listener = WantedListener {
            protocol,
            port,
            node_port: p.node_port.and_then(|n| u16::try_from(n).ok()),
            affinity,
            members: members(p, protocol)
                .into_iter()
                .filter(|(ip, _)| ip.is_ipv4() == vip.is_ipv4())
                .collect(),
        };
        listeners.insert(listener.key(), listener);
    }
    let floating = (index == 0 && spec.type_.as_deref() == Some("LoadBalancer")).then(|| {
        spec.load_balancer_ip
            .as_deref()
            .and_then(|ip| ip.parse().ok())
    });
    Some(Wanted {
        vip,
        listeners,
        floating,
    })
}

/// What the controller holds for one service, as far as the watcher knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Made {
    /// The load balancer exists.
    pub load_balancer: bool,
    /// The listeners by key.
    pub listeners: BTreeMap<String, WantedListener>,
    /// The floating IP's address, when there is one.
    pub floating: Option<IpAddr>,
}

/// Why a service is not (entirely) what it should be, for its event.
#[derive(Debug)]
pub struct Trouble {
    /// The event's reason (`LoadBalancerIPTaken`, ...).
    pub reason: &'static str,
    /// What happened and what to do.
    pub message: String,
}

/// Where the watcher's load balancers live.
pub struct Networks<'a> {
    /// The service network's IPv4 subnet.
    pub service_subnet: &'a str,
    /// Its IPv6 subnet.
    pub service_subnet6: &'a str,
    /// The public network floating IPs come from, if there is one.
    pub public: Option<&'a str>,
}

fn tags(service_uid: &str) -> Option<Vec<String>> {
    Some(vec![
        ids::SERVICE_TAG.to_string(),
        ids::service_uid_tag(service_uid),
    ])
}

fn listener_tags(service_uid: &str, l: &WantedListener) -> Option<Vec<String>> {
    let mut t = tags(service_uid)?;
    if let Some(n) = l.node_port {
        t.push(format!("{NODE_PORT_TAG}{n}"));
    }
    Some(t)
}

/// The pool's session persistence, `Some(None)` for none: it is cleared when affinity goes.
fn persistence(l: &WantedListener) -> Option<Option<SessionPersistence>> {
    Some(l.affinity.map(|t| SessionPersistence {
        kind: "SOURCE_IP".into(),
        persistence_timeout: Some(t),
    }))
}

fn gone_ok(r: Result<bool, ApiError>) -> Result<(), ApiError> {
    r.map(drop)
}

/// Reads back what the controller holds for a service the watcher has not looked at since
/// it started.
pub fn load(ctl: &Client, service_uid: &str) -> Result<Made, ApiError> {
    let lb_id = ids::load_balancer(service_uid);
    match ctl.get::<LoadBalancer>(&lb_id) {
        Err(ApiError::Neutron { status: 404, .. }) => return Ok(Made::default()),
        r => r?,
    };
    let mut made = Made {
        load_balancer: true,
        ..Made::default()
    };
    let (listeners, _) = ctl.list::<Listener>(&[("loadbalancer_id", &lb_id)])?;
    for l in listeners {
        let (_, pool_id) = ids::listener(
            service_uid,
            &format!("{}/{}", protocol_name(l.protocol), l.protocol_port),
        );
        let pool = match ctl.get::<Pool>(&pool_id) {
            Err(ApiError::Neutron { status: 404, .. }) => None,
            r => Some(r?),
        };
        let (members, _) = ctl.list::<Member>(&[("pool_id", &pool_id)])?;
        let wanted = WantedListener {
            protocol: l.protocol,
            port: l.protocol_port,
            node_port: l
                .tags
                .iter()
                .find_map(|t| t.strip_prefix(NODE_PORT_TAG)?.parse().ok()),
            affinity: pool
                .and_then(|p| p.session_persistence)
                .map(|s| s.persistence_timeout.unwrap_or(DEFAULT_AFFINITY_SECONDS)),
            members: members
                .iter()
                .map(|m| (m.address, m.protocol_port))
                .collect(),
        };
        made.listeners.insert(wanted.key(), wanted);
    }
    made.floating = match ctl.get::<FloatingIp>(&ids::floating_ip(service_uid)) {
        Err(ApiError::Neutron { status: 404, .. }) => None,
        r => Some(r?.floating_ip_address),
    };
    Ok(made)
}

/// Makes the controller hold `want` for the service (none: nothing), starting from
/// `made`, which is updated as each call succeeds. Returns what could not be done and is
/// not worth retrying (a taken or exhausted floating IP).
pub fn apply(
    ctl: &Client,
    service_uid: &str,
    name: &str,
    want: Option<&Wanted>,
    nets: &Networks,
    made: &mut Made,
) -> Result<Option<Trouble>, ApiError> {
    let lb_id = ids::load_balancer(service_uid);
    let Some(want) = want else {
        if made.floating.is_some() || made.load_balancer {
            gone_ok(ctl.delete_if_present::<FloatingIp>(&ids::floating_ip(service_uid)))?;
            made.floating = None;
            let path = format!("/v2/lbaas/loadbalancers/{lb_id}?cascade=true");
            match ctl.request("DELETE", &path, None) {
                Ok(_) | Err(ApiError::Neutron { status: 404, .. }) => {}
                Err(e) => return Err(e),
            }
        }
        *made = Made::default();
        return Ok(None);
    };
    if !made.load_balancer {
        let made_lb = ctl.create_or_get(
            &lb_id,
            LoadBalancerCreate {
                id: Some(lb_id.clone()),
                name: Some(name.to_string()),
                vip_subnet_id: Some(
                    if want.vip.is_ipv6() {
                        nets.service_subnet6
                    } else {
                        nets.service_subnet
                    }
                    .to_string(),
                ),
                vip_address: Some(want.vip),
                tags: tags(service_uid),
                ..Default::default()
            },
        );
        match made_lb {
            Ok(_) => made.load_balancer = true,
            // The cluster IP is not the controller's to give: nothing is made, and trying
            // again will not help until someone frees it.
            Err(ApiError::Neutron {
                status: 400 | 409,
                message,
                ..
            }) => {
                return Ok(Some(Trouble {
                    reason: "ClusterIPUnavailable",
                    message: format!(
                        "the cluster IP {} cannot be the load balancer's VIP: {message}",
                        want.vip
                    ),
                }))
            }
            Err(e) => return Err(e),
        }
    }
    let stale: Vec<String> = made
        .listeners
        .keys()
        .filter(|k| !want.listeners.contains_key(*k))
        .cloned()
        .collect();
    for key in stale {
        let (listener, pool) = ids::listener(service_uid, &key);
        gone_ok(ctl.delete_if_present::<Pool>(&pool))?;
        gone_ok(ctl.delete_if_present::<Listener>(&listener))?;
        made.listeners.remove(&key);
    }
    for (key, l) in &want.listeners {
        let (listener_id, pool_id) = ids::listener(service_uid, key);
        let had = made.listeners.get(key).cloned();
        match &had {
            None => {
                ctl.create_or_get(
                    &listener_id,
                    ListenerCreate {
                        id: Some(listener_id.clone()),
                        tags: listener_tags(service_uid, l),
                        ..ListenerCreate::new(&lb_id, l.protocol, l.port)
                    },
                )?;
                ctl.create_or_get(
                    &pool_id,
                    PoolCreate {
                        id: Some(pool_id.clone()),
                        listener_id: Some(listener_id.clone()),
                        loadbalancer_id: Some(lb_id.clone()),
                        session_persistence: persistence(l),
                        ..PoolCreate::new(l.protocol, "ROUND_ROBIN")
                    },
                )?;
            }
            Some(h) => {
                if h.node_port != l.node_port {
                    ctl.update(
                        &listener_id,
                        ListenerUpdate {
                            tags: listener_tags(service_uid, l),
                            ..Default::default()
                        },
                    )?;
                }
                if h.affinity != l.affinity {
                    ctl.update(
                        &pool_id,
                        PoolUpdate {
                            session_persistence: persistence(l),
                            ..Default::default()
                        },
                    )?;
                }
            }
        }
        let before = had.map(|h| h.members).unwrap_or_default();
        let mut now = WantedListener {
            members: before.clone(),
            ..l.clone()
        };
        for (ip, port) in before.difference(&l.members) {
            let id = ids::member(&pool_id, &format!("{ip}:{port}"));
            gone_ok(ctl.delete_if_present::<Member>(&id))?;
            now.members.remove(&(*ip, *port));
            made.listeners.insert(key.clone(), now.clone());
        }
        for (ip, port) in l.members.difference(&before) {
            let id = ids::member(&pool_id, &format!("{ip}:{port}"));
            ctl.create_or_get(
                &id,
                MemberCreate {
                    id: Some(id.clone()),
                    pool_id: Some(pool_id.clone()),
                    tags: tags(service_uid),
                    ..MemberCreate::new(*ip, *port)
                },
            )?;
            now.members.insert((*ip, *port));
            made.listeners.insert(key.clone(), now.clone());
        }
        made.listeners.insert(key.clone(), now);
    }
    floating(ctl, service_uid, want, nets, made)
}

fn floating(
    ctl: &Client,
    service_uid: &str,
    want: &Wanted,
    nets: &Networks,
    made: &mut Made,
) -> Result<Option<Trouble>, ApiError> {
    let fip_id = ids::floating_ip(service_uid);
    let asked = match want.floating {
        None => {
            if made.floating.take().is_some() {
                gone_ok(ctl.delete_if_present::<FloatingIp>(&fip_id))?;
            }
            return Ok(None);
        }
        Some(asked) => asked,
    };
    if let (Some(have), Some(asked)) = (made.floating, asked) {
        if have != asked {
            gone_ok(ctl.delete_if_present::<FloatingIp>(&fip_id))?;
            made.floating = None;
        }
    }
    if made.floating.is_some() {
        return Ok(None);
    }
    let Some(public) = nets.public else {
        return Ok(Some(Trouble {
            reason: "NoPublicNetwork",
            message: "type LoadBalancer needs a public network: start corvid kube-watch with --public-network".into(),
        }));
    };
    let lb: LoadBalancer = ctl.get(&ids::load_balancer(service_uid))?;
    let attrs = FloatingIpCreate {
        id: Some(fip_id.clone()),
        floating_network_id: public.to_string(),
        port_id: lb.vip_port_id,
        floating_ip_address: asked,
        tags: tags(service_uid),
        ..Default::default()
    };
    match ctl.create_or_get(&fip_id, attrs) {
        Ok(f) => {
            made.floating = Some(f.floating_ip_address);
            Ok(None)
        }
        Err(ApiError::Neutron {
            status: 409,
            kind,
            message,
        }) => Ok(Some(Trouble {
            reason: if kind == "IpAddressAlreadyAllocated" {
                "LoadBalancerIPTaken"
            } else {
                "NoPublicAddress"
            },
            message: format!("no floating IP for the service: {message}"),
        })),
        Err(ApiError::Neutron {
            status: 400,
            message,
            ..
        }) => Ok(Some(Trouble {
            reason: "LoadBalancerIPInvalid",
            message: format!("no floating IP for the service: {message}"),
        })),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(spec: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "s1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn group(ips: &[&str], ports: &[(&str, u16, LbProtocol)]) -> EndpointGroup {
        EndpointGroup {
            addresses: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            ports: ports
                .iter()
                .map(|(n, p, l)| (n.to_string(), *p, *l))
                .collect(),
        }
    }

    #[test]
    fn a_service_labelled_for_another_proxy_or_none_gets_no_load_balancer() {
        let spec = json!({"clusterIP": "10.96.0.10", "ports": [{"port": 80}]});
        assert!(wanted(&svc(spec.clone()), [].iter()).is_some());
        for label in NOT_OURS {
            let mut s = svc(spec.clone());
            s.metadata.labels = Some([(label.to_string(), String::new())].into());
            assert!(wanted(&s, [].iter()).is_none(), "{label}");
        }
    }

    #[test]
    fn each_port_takes_the_groups_that_serve_its_name_and_protocol() {
        // Two slices: their pods resolved the named port to different numbers.
        let groups = [
            group(
                &["10.1.0.5"],
                &[
                    ("http", 8081, LbProtocol::Tcp),
                    ("dns", 5353, LbProtocol::Udp),
                ],
            ),
            group(&["10.1.0.6", "fd00::6"], &[("http", 9090, LbProtocol::Tcp)]),
        ];
        let s = svc(
            json!({"clusterIP": "10.96.0.10", "selector": {"app": "web"},
            "sessionAffinity": "ClientIP",
            "ports": [{"name": "http", "port": 80, "targetPort": "http"},
                {"name": "dns", "port": 53, "protocol": "UDP"}]}),
        );
        let w = wanted(&s, groups.iter()).unwrap();
        let tcp = &w.listeners["TCP/80"];
        assert_eq!(
            tcp.members,
            BTreeSet::from([
                ("10.1.0.5".parse().unwrap(), 8081),
                ("10.1.0.6".parse().unwrap(), 9090)
            ])
        );
        assert_eq!(tcp.affinity, Some(10800));
        assert_eq!(
            w.listeners["UDP/53"].members,
            BTreeSet::from([("10.1.0.5".parse().unwrap(), 5353)])
        );
        assert_eq!(w.floating, None);
    }

    #[test]
    fn headless_and_external_name_services_get_no_load_balancer() {
        let none = svc(json!({"clusterIP": "None", "ports": [{"port": 80}]}));
        assert_eq!(wanted(&none, [].iter()), None);
        let ext = svc(json!({"type": "ExternalName", "externalName": "example.org"}));
        assert_eq!(wanted(&ext, [].iter()), None);
    }

    #[test]
    fn a_load_balancer_service_asks_for_its_ip_and_keeps_its_node_ports() {
        let s = svc(json!({"clusterIP": "10.96.0.11", "type": "LoadBalancer",
            "loadBalancerIP": "192.0.2.7", "selector": {"app": "none"},
            "ports": [{"port": 80, "nodePort": 30080}]}));
        let w = wanted(&s, [].iter()).unwrap();
        assert_eq!(w.floating, Some(Some("192.0.2.7".parse().unwrap())));
        assert_eq!(w.listeners["TCP/80"].node_port, Some(30080));
        assert!(w.listeners["TCP/80"].members.is_empty());
    }
}
