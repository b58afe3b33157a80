//! The `corvid.io/port` pod annotation: what the watcher allocated for a pod, for people
//! and tools to read on the pod. The node's CNI plugin builds the same from the controller
//! (the port its UID names, its network and subnets), and plugs from that.

use std::net::IpAddr;

use corvid_api::{Network, Port, Subnet};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The annotation's key.
pub const KEY: &str = "corvid.io/port";

/// The key of the annotation that says why a pod has no port yet.
pub const ERROR_KEY: &str = "corvid.io/port-error";

/// Why an annotation's text is not a port's annotation.
#[derive(Debug, thiserror::Error)]
pub enum AnnotationError {
    /// Not the annotation's JSON.
    #[error("{KEY} is malformed: {0}")]
    Malformed(#[from] serde_json::Error),
    /// A port, network or pod left empty.
    #[error("{KEY} names no port, network or pod")]
    Unnamed,
    /// No address for the pod.
    #[error("{KEY} of port {0} has no address")]
    NoAddress(String),
}

/// Why the watcher could not make a pod's port; it keeps trying, and removes this once the
/// port is made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortError {
    /// The controller's error type (`IpAddressGenerationFailure` when the namespace's
    /// network is full).
    pub reason: String,
    /// What the controller said.
    pub message: String,
}

impl PortError {
    /// The annotation's text.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// One route of the pod's interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination.
    pub dst: IpNet,
    /// Next hop; none for an on-link route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
}

/// The annotation's value: one flat JSON object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortAnnotation {
    /// The controller's port.
    pub port_id: String,
    /// The network the port is on (the plugin plugs into its bridge).
    pub network_id: String,
    /// The pod the port was made for: a pod recreated under the same name has another UID,
    /// and must not take this port.
    pub pod_uid: String,
    /// The interface's MAC.
    pub mac: String,
    /// The addresses, with their subnets' prefix lengths.
    pub addresses: Vec<IpNet>,
    /// The IPv4 gateway, if the subnet has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Routes: the default route through the gateway, then the subnets' host routes.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// The network's MTU.
    pub mtu: u32,
    /// The controller's cluster ID: the plugin marks the devices it makes with it, so
    /// that another corvid's agent on the node leaves them alone.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
}

impl PortAnnotation {
    /// The annotation of `port` for pod `pod_uid`, given the port's network and subnets
    /// and the controller's cluster ID.
    pub fn of(
        port: &Port,
        pod_uid: &str,
        network: &Network,
        subnets: &[Subnet],
        cluster: &str,
    ) -> Self {
        let mut addresses = Vec::new();
        let mut gateway = None;
        let mut routes = Vec::new();
        for ip in &port.fixed_ips {
            let Some(s) = subnets.iter().find(|s| s.id == ip.subnet_id) else {
                continue;
            };
            if let Ok(a) = IpNet::new(ip.ip_address, s.cidr.prefix_len()) {
                addresses.push(a);
            }
            if let Some(gw) = s.gateway_ip {
                let default = if gw.is_ipv4() {
                    gateway.get_or_insert(gw);
                    IpNet::V4(Default::default())
                } else {
                    IpNet::V6(Default::default())
                };
                if !routes.iter().any(|r: &Route| r.dst == default) {
                    routes.push(Route {
                        dst: default,
                        gw: Some(gw),
                    });
                }
            }
            for r in &s.host_routes {
                routes.push(Route {
                    dst: r.destination,
                    gw: Some(r.nexthop),
                });
            }
        }
        PortAnnotation {
            port_id: port.id.clone(),
            network_id: network.id.clone(),
            pod_uid: pod_uid.to_string(),
            mac: port.mac_address.clone(),
            addresses,
            gateway,
            routes,
            mtu: network.mtu,
            cluster: cluster.to_string(),
        }
    }

    /// Reads an annotation's text; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, AnnotationError> {
        let a: PortAnnotation = serde_json::from_str(text)?;
        if a.port_id.is_empty() || a.pod_uid.is_empty() || a.network_id.is_empty() {
            return Err(AnnotationError::Unnamed);
        }
        if a.addresses.is_empty() {
            return Err(AnnotationError::NoAddress(a.port_id));
        }
        Ok(a)
    }

    /// The annotation's text.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PortAnnotation {
        PortAnnotation {
            port_id: "p1".into(),
            network_id: "n1".into(),
            pod_uid: "u1".into(),
            mac: "fa:16:3e:00:00:01".into(),
            addresses: vec!["10.64.0.5/16".parse().unwrap()],
            gateway: Some("10.64.0.1".parse().unwrap()),
            routes: vec![Route {
                dst: "0.0.0.0/0".parse().unwrap(),
                gw: Some("10.64.0.1".parse().unwrap()),
            }],
            mtu: 1450,
            cluster: "c1".into(),
        }
    }

    #[test]
    fn the_annotation_is_flat_camel_case_json_and_reads_back() {
        let a = sample();
        let text = a.to_text();
        assert!(text.contains("\"portId\":\"p1\""), "{text}");
        assert!(text.contains("\"addresses\":[\"10.64.0.5/16\"]"), "{text}");
        assert_eq!(PortAnnotation::parse(&text).unwrap(), a);
    }

    #[test]
    fn a_malformed_annotation_is_refused_with_the_reason() {
        assert!(PortAnnotation::parse("{")
            .unwrap_err()
            .to_string()
            .contains("malformed"));
        let mut a = sample();
        a.addresses.clear();
        assert!(PortAnnotation::parse(&a.to_text())
            .unwrap_err()
            .to_string()
            .contains("no address"));
        let newer = sample().to_text().replace('{', "{\"fromANewerWatcher\":1,");
        assert_eq!(PortAnnotation::parse(&newer).unwrap(), sample());
    }
}
