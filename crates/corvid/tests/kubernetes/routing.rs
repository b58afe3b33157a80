//! The Kubernetes network model through the cluster router: pods of every namespace reach
//! each other across nodes with their own addresses, and a "DNS" service in kube-system
//! answers them all; a restarted watcher attaches what came meanwhile; a deleted
//! namespace takes its router interface with it.

use super::*;
use corvid_api::{Router, ROUTER_INTERFACE};

/// The cluster router's interfaces, by network.
fn interfaces(cluster: &Cluster) -> Vec<String> {
    let router = corvid_k8s::ids::cluster_router();
    let (ports, _) = cluster
        .api(|c| {
            c.list::<Port>(&[
                ("device_owner", ROUTER_INTERFACE),
                ("device_id", router.as_str()),
            ])
        })
        .unwrap();
    ports.into_iter().map(|p| p.network_id).collect()
}

#[test]
fn pods_of_every_namespace_reach_each_other_and_kube_system_dns() {
    let (cluster, kube) = setup("kr");
    let mut watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "1"]);
    for ns in ["a", "b"] {
        namespace(&kube, ns);
    }
    let a = served_pods(&cluster, &kube, "a", &[("a0", 0, "a")]);
    let b = served_pods(&cluster, &kube, "b", &[("b1", 1, "b")]);
    let dns = served_pods(&cluster, &kube, "kube-system", &[("dns", 1, "dns")]);
    let vip = service(
        &kube,
        "kube-system",
        "dns",
        json!({"spec": {"selector": {"app": "dns"}, "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}}),
        false,
    )
    .spec
    .unwrap()
    .cluster_ip
    .unwrap();
    let router: Router = cluster
        .api(|c| c.get(&corvid_k8s::ids::cluster_router()))
        .unwrap();
    assert!(router
        .tags
        .contains(&corvid_k8s::ids::NETWORK_TAG.to_string()));
    // The service network too (a floating IP reaches a VIP through the router).
    assert!(interfaces(&cluster).contains(&corvid_k8s::ids::service_network().0));
    let (pa, pb, pdns) = (&a.pods[0], &b.pods[0], &dns.pods[0]);
    // Across nodes and namespaces, by pod IP, both ways, the server seeing the pod's own
    // address.
    wait_until("a0 to reach b1", Duration::from_secs(20), || {
        pa.3.connect(&pb.4, 8080, 1, false) == ["b1"]
    });
    assert_eq!(pb.3.connect(&pa.4, 8080, 1, false), ["a0"]);
    // A node reaches a pod on the other node (the API server's proxy, a host-network
    // pod): it leaves with the node's own address, not the gateway every node holds.
    assert_eq!(cluster.hosts[0].connect(&pb.4, 8080, 1, false), ["b1"]);
    assert_eq!(pa.3.connect(&pdns.4, 5353, 1, true), ["dns"]);
    let dns_answers = |from: &support::cluster::ns::Ns| {
        wait_until("the DNS service to answer", Duration::from_secs(20), || {
            from.connect(&vip, 53, 1, true) == ["dns"]
        })
    };
    dns_answers(&pa.3);
    dns_answers(&pb.3);

    // The watcher is down while a namespace and its pod come: the restarted one attaches
    // the namespace's network to the router, and its pod reaches the others.
    watcher.kill9();
    namespace(&kube, "c");
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "1"]);
    let c = served_pods(&cluster, &kube, "c", &[("c0", 0, "c")]);
    let pc = &c.pods[0];
    wait_until("c0 to reach b1", Duration::from_secs(20), || {
        pc.3.connect(&pb.4, 8080, 1, false) == ["b1"]
    });
    dns_answers(&pc.3);
    let c_network = networks_of_namespace(&cluster, "c")[0].id.clone();
    assert!(interfaces(&cluster).contains(&c_network));

    // c deleted: its pod's port, the router's interface and the network go.
    unplugged(&cluster, 0, ["c", "c0", &pc.2], &pc.3.path, "DEL of c0");
    delete_pod(&kube, "c", "c0");
    delete_namespace(&kube, "c");
    wait_until("c's network to go", Duration::from_secs(30), || {
        networks_of_namespace(&cluster, "c").is_empty()
    });
    assert!(!interfaces(&cluster).contains(&c_network));
    assert_eq!(pa.3.connect(&pb.4, 8080, 1, false), ["b1"]);
}
