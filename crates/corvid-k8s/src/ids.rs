//! The controller objects that stand for Kubernetes objects, named from their UIDs: a
//! retried create finds what the first attempt made, and a pod recreated under the same
//! name (a StatefulSet's) gets a port of its own.

use uuid::Uuid;

/// The namespace of these name-based UUIDs: version 5 of `corvid:kubernetes` in the URL
/// namespace.
const K8S: Uuid = uuid::uuid!("a74b2c53-b512-588a-83ca-08db43b5e6c3");

fn derive(kind: &str, key: &str) -> String {
    Uuid::new_v5(&K8S, format!("{kind}/{key}").as_bytes()).to_string()
}

/// The port of the pod with UID `pod_uid`.
pub fn port(pod_uid: &str) -> String {
    derive("port", pod_uid)
}

/// The network of the namespace with UID `namespace_uid`.
pub fn network(namespace_uid: &str) -> String {
    derive("network", namespace_uid)
}

/// The subnet of the namespace with UID `namespace_uid`.
pub fn subnet(namespace_uid: &str) -> String {
    derive("subnet", namespace_uid)
}

/// The IPv6 subnet of the namespace with UID `namespace_uid` (its IPv4 one is
/// [`subnet`]'s, named as before dual stack).
pub fn subnet6(namespace_uid: &str) -> String {
    derive("subnet6", namespace_uid)
}

/// The subnet pool the namespaces' IPv4 subnets are carved from.
pub fn pod_pool() -> String {
    derive("subnetpool", "pods")
}

/// The subnet pool the namespaces' IPv6 subnets are carved from.
pub fn pod_pool6() -> String {
    derive("subnetpool", "pods6")
}

/// The service network and its subnet (its IPv4 one on a dual-stack cluster).
pub fn service_network() -> (String, String) {
    (derive("network", "services"), derive("subnet", "services"))
}

/// The service network's IPv6 subnet on a dual-stack cluster.
pub fn service_subnet6() -> String {
    derive("subnet6", "services")
}

/// The cluster router every namespace's network is attached to.
pub fn cluster_router() -> String {
    derive("router", "cluster")
}

/// The cluster router's interface port on the service network.
pub fn service_router_port() -> String {
    derive("port", "services-router")
}

/// The load balancer of the service with UID `service_uid`.
pub fn load_balancer(service_uid: &str) -> String {
    derive("loadbalancer", service_uid)
}

/// The listener of one port (`TCP/80`) of a service, and its pool.
pub fn listener(service_uid: &str, port: &str) -> (String, String) {
    let key = format!("{service_uid}/{port}");
    (derive("listener", &key), derive("pool", &key))
}

/// The member of a pool that sends to `target` (`10.1.0.5:8080`).
pub fn member(pool: &str, target: &str) -> String {
    derive("member", &format!("{pool}/{target}"))
}

/// The floating IP of a `type: LoadBalancer` service.
pub fn floating_ip(service_uid: &str) -> String {
    derive("floatingip", service_uid)
}

/// A security group the watcher keeps for NetworkPolicies, named by what it stands for
/// (`open-ingress`, `policy/<uid>`, `peer/<selector>`).
pub fn security_group(key: &str) -> String {
    derive("securitygroup", key)
}

/// The tag on every load balancer and floating IP the watcher makes.
pub const SERVICE_TAG: &str = "corvid:k8s-service";

/// Tag carrying a service's UID on its load balancer.
pub fn service_uid_tag(uid: &str) -> String {
    format!("service-uid:{uid}")
}

/// `device_owner` of the ports the watcher makes.
pub const POD_OWNER: &str = "corvid:k8s-pod";

/// The tag on every network the watcher makes.
pub const NETWORK_TAG: &str = "corvid:k8s";

/// Tag naming a namespace (`namespace:<name>`) on its network and its pods' ports.
pub fn namespace_tag(name: &str) -> String {
    format!("namespace:{name}")
}

/// Tag carrying a namespace's UID on its network.
pub fn namespace_uid_tag(uid: &str) -> String {
    format!("namespace-uid:{uid}")
}

/// Tag naming a pod on its port.
pub fn pod_tag(name: &str) -> String {
    format!("pod:{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_uid_not_the_name() {
        assert_eq!(port("u1"), port("u1"));
        assert_ne!(port("u1"), port("u2"));
        assert_ne!(port("u1"), network("u1"));
        assert_ne!(network("u1"), subnet("u1"));
        assert_eq!(Uuid::parse_str(&port("u1")).unwrap().get_version_num(), 5);
    }
}
