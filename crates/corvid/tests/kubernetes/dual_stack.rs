//! Dual stack in Kubernetes: the watcher given a pod pool of each family gives every
//! namespace a subnet of each, and every pod an address in both, which the `corvid-k8s`
//! plugin answers to the kubelet (its `status.podIPs`); pods reach each other over both
//! families, across nodes and across namespaces, over an IPv6 underlay too.

use super::*;
use support::cluster::ns::Ns;

#[test]
fn pods_get_an_address_of_each_family_and_reach_each_other_over_both() {
    let (mut cluster, kube) = setup("kd");
    // The nodes tunnel over IPv6, whose VXLAN headers are 70 bytes: a pod's MTU is then
    // 1430 on the underlay's 1500, below the network's 1450.
    for i in 0..2 {
        cluster.agents[i].take();
        let underlay = support::cluster::underlay_ip6(i);
        cluster.start_agent_with(i, &["--underlay-ip", &underlay]);
    }
    wait_until(
        "the nodes to register over IPv6",
        Duration::from_secs(10),
        || {
            let hosts = cluster.api(|c| c.list::<corvid_api::Host>(&[]).unwrap().0);
            hosts.len() == 2 && hosts.iter().all(|h| h.underlay_ip.is_ipv6())
        },
    );
    let _watcher = start_watcher(
        &cluster,
        &kube,
        &["--pod-pool", "10.64.0.0/10", "--pod-pool", "fd64::/48"],
    );
    // (namespace, pod, node)
    let pods = [("a", "p0", 0), ("a", "p1", 1), ("b", "p0", 1)];
    for ns in ["a", "b"] {
        namespace(&kube, ns);
    }
    let mut sandboxes = Vec::new();
    for (ns, name, host) in pods {
        let uid = pod(&kube, ns, name, &format!("h{}", host + 1));
        let a = wait_annotation(&kube, ns, name);
        let families: Vec<bool> = a.addresses.iter().map(|a| a.addr().is_ipv6()).collect();
        assert_eq!(families, [false, true], "{:?}", a.addresses);
        assert_eq!(a.addresses[1].prefix_len(), 64);
        assert!("fd64::/48"
            .parse::<ipnet::IpNet>()
            .unwrap()
            .contains(&a.addresses[1].addr()));
        let netns = cluster.pod(&format!("{ns}{name}"));
        let result = cni_result(&run_plugin(
            &cluster,
            &K8sCall {
                host,
                command: "ADD",
                ns,
                name,
                uid: &uid,
                netns: Some(&netns.path),
            },
        ));
        let got = support::cluster::result_ips(&result);
        assert_eq!(got.len(), 2, "{result}");
        assert!(
            result["ips"][1]["gateway"]
                .as_str()
                .is_some_and(|g| g.contains(':')),
            "the IPv6 address names its gateway: {result}"
        );
        let routes: Vec<&str> = result["routes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["dst"].as_str().unwrap())
            .collect();
        assert!(routes.contains(&"::/0"), "{result}");
        wait_until("the port ACTIVE", Duration::from_secs(10), || {
            port(&cluster, &a.port_id).is_some_and(|p| p.status == Status::Active)
        });
        sandboxes.push((ns, name, netns, got));
    }
    // Each namespace's network has a subnet of each family, both on the cluster router.
    let net = &networks_of_namespace(&cluster, "a")[0];
    assert_eq!(net.subnets.len(), 2, "{net:?}");
    let on_router = cluster
        .api(|c| {
            c.list::<Port>(&[
                ("network_id", net.id.as_str()),
                ("device_owner", corvid_api::ROUTER_INTERFACE),
            ])
        })
        .unwrap()
        .0;
    let routed: std::collections::BTreeSet<&str> = on_router
        .iter()
        .flat_map(|p| p.fixed_ips.iter().map(|f| f.subnet_id.as_str()))
        .collect();
    assert_eq!(routed.len(), 2, "{on_router:?}");
    // Over both families: across nodes in a namespace, and to the other namespace.
    for (i, j) in [(0, 1), (1, 0), (0, 2), (2, 1)] {
        let (from, to) = (&sandboxes[i], &sandboxes[j]);
        for addr in &to.3 {
            wait_until(
                &format!("{}/{} to reach {}/{} at {addr}", from.0, from.1, to.0, to.1),
                Duration::from_secs(10),
                || from.2.ping(addr),
            );
        }
    }
    // Full-sized packets that may not be fragmented cross the nodes in both families.
    for (_, _, netns, _) in &sandboxes {
        let eth0 = netns.netlink().link_by_name("eth0").unwrap().unwrap();
        assert_eq!(eth0.mtu, 1430, "the pod's MTU over an IPv6 underlay");
    }
    let (from, to) = (&sandboxes[0], &sandboxes[1]);
    for addr in &to.3 {
        let header = if addr.contains(':') { 48 } else { 28 };
        let size = (1430 - header).to_string();
        let out = from
            .2
            .command("ping")
            .args(["-c", "1", "-W", "2", "-M", "do", "-s", &size, addr])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "a DF ping of {size} bytes to {addr}: {out:?}"
        );
    }
    for (ns, name, ..) in &sandboxes {
        delete_pod(&kube, ns, name);
    }
    for ns in ["a", "b"] {
        delete_namespace(&kube, ns);
    }
    wait_until(
        "both subnets of each namespace to go with it",
        Duration::from_secs(60),
        || {
            cluster
                .api(|c| c.list::<Subnet>(&[]))
                .unwrap()
                .0
                .iter()
                .all(|s| !s.name.starts_with("k8s-a") && !s.name.starts_with("k8s-b"))
        },
    );
}

#[test]
fn dual_stack_services_are_served_on_both_cluster_ips_and_node_ports() {
    let (cluster, kube) = setup_with(
        "kv",
        &[
            "--feature-gates=IPv6DualStack=true",
            "--service-cluster-ip-range=10.0.0.0/24,fd00:10::/112",
        ],
    );
    let _watcher = start_watcher(
        &cluster,
        &kube,
        &[
            "--pod-pool",
            "10.64.0.0/10",
            "--pod-pool",
            "fd64::/48",
            "--service-cidr",
            "10.0.0.0/24,fd00:10::/112",
        ],
    );
    namespace(&kube, "shop");
    let served = served_pods(
        &cluster,
        &kube,
        "shop",
        &[("p0", 0, "web"), ("p1", 1, "web"), ("client", 0, "client")],
    );
    let client = &served.pods[2].3;
    let svc = service(
        &kube,
        "shop",
        "web",
        json!({"spec": {"selector": {"app": "web"}, "type": "NodePort",
            "ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"],
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
        false,
    );
    let spec = svc.spec.unwrap();
    let vips = spec.cluster_ips.unwrap();
    assert_eq!(vips.len(), 2, "{vips:?}");
    assert!(vips[1].contains(':'), "{vips:?}");
    let node_port = spec.ports.unwrap()[0].node_port.unwrap() as u16;
    let web = std::collections::BTreeSet::from(["p0", "p1"]);
    // Each cluster IP reaches both members, of its own family.
    for vip in &vips {
        wait_until(
            &format!("both members to answer on {vip}"),
            Duration::from_secs(30),
            || answers_of(&client.connect(vip, 80, 20, false)) == web,
        );
    }
    // The node port on each node's address of each family.
    for node in ["10.99.0.2", "fd99::2"] {
        wait_until(
            &format!("both members to answer on {node}:{node_port}"),
            Duration::from_secs(20),
            || answers_of(&cluster.lan.connect(node, node_port, 20, false)) == web,
        );
    }
    // Deleted, the service leaves no load balancer of either family.
    let name = "web".to_string();
    kube.admin(|c| async move {
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(c, "shop")
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    });
    wait_until("both load balancers to go", Duration::from_secs(20), || {
        cluster
            .api(|c| c.list::<corvid_api::LoadBalancer>(&[("tags", corvid_k8s::ids::SERVICE_TAG)]))
            .unwrap()
            .0
            .iter()
            .all(|lb| lb.name != "shop/web")
    });
    wait_until(
        "the IPv6 cluster IP to serve no more",
        Duration::from_secs(10),
        || {
            let after = client.connect(&vips[1], 80, 1, false);
            !web.contains(after[0].as_str())
        },
    );
}

/// NetworkPolicy over both families (agents filtering with `--security-groups`): a
/// policy letting in only pods of one label holds for IPv6 as for IPv4, and an IPv6
/// address block opens IPv6 alone.
#[test]
fn network_policies_hold_over_both_families() {
    let (mut cluster, kube) = setup("kn");
    cluster.filtering_agents(None);
    let _watcher = start_watcher(
        &cluster,
        &kube,
        &["--pod-pool", "10.64.0.0/10", "--pod-pool", "fd64::/48"],
    );
    namespace(&kube, "a");
    let served = served_pods(
        &cluster,
        &kube,
        "a",
        &[
            ("web", 0, "web"),
            ("friend", 1, "friend"),
            ("stranger", 1, "stranger"),
        ],
    );
    let v6 = |name: &str| {
        wait_annotation(&kube, "a", name).addresses[1]
            .addr()
            .to_string()
    };
    let web = [served.pods[0].4.clone(), v6("web")];
    let (friend, stranger) = (&served.pods[1].3, &served.pods[2].3);
    let reaches = |from: &Ns, addr: &str, udp: bool| from.connect(addr, 8080, 1, udp) == ["web"];
    let dropped =
        |from: &Ns, addr: &str, udp: bool| from.connect(addr, 8080, 1, udp) == ["timeout"];
    for addr in &web {
        wait_until(
            &format!("the stranger to reach {addr}"),
            Duration::from_secs(20),
            || reaches(stranger, addr, false),
        );
    }
    network_policy(
        &kube,
        "a",
        "web",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "friend"}}}]}]}),
    );
    for addr in &web {
        for udp in [false, true] {
            wait_until(
                &format!("the stranger to be kept from {addr} (udp {udp})"),
                Duration::from_secs(20),
                || dropped(stranger, addr, udp),
            );
            assert!(
                reaches(friend, addr, udp),
                "the friend at {addr} (udp {udp})"
            );
        }
    }
    // The stranger's own IPv6 address let in: over IPv6 only.
    delete_network_policy(&kube, "a", "web");
    network_policy(
        &kube,
        "a",
        "web",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"ipBlock": {"cidr": format!("{}/128", v6("stranger"))}}]}]}),
    );
    wait_until(
        "the stranger to reach web over IPv6",
        Duration::from_secs(20),
        || reaches(stranger, &web[1], false),
    );
    assert!(dropped(stranger, &web[0], false), "the stranger over IPv4");
    assert!(dropped(friend, &web[1], false), "the friend over IPv6");
}
