//! Services to load balancers: members from the API's endpoint objects, readiness,
//! affinity, hairpin, node ports and floating IPs, on both nodes; services labelled for
//! another proxy left alone; hostPorts through portmap, chained as the deployment does.

use super::*;

#[test]
fn a_restarted_watcher_keeps_every_service_member_while_it_loads() {
    let (cluster, kube) = setup("ko");
    let mut watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "4"]);
    namespace(&kube, "o");
    let _served = served_pods(&cluster, &kube, "o", &[("p0", 0, "web"), ("p1", 1, "web")]);
    service(
        &kube,
        "o",
        "web",
        json!({"spec": {"selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http"}]}}),
        false,
    );
    // The web pods' members (the `kubernetes` service has the API server's).
    let members = || {
        cluster
            .api(|c| c.list::<corvid_api::Member>(&[("protocol_port", "8080")]))
            .map(|l| l.0.len())
            .unwrap_or(0)
    };
    wait_until("both members", Duration::from_secs(20), || members() == 2);
    // Pods no node runs yet: the watcher leaves them alone, but they make its pod list
    // long, so a restarted watcher has its services well before its pods.
    kube.admin(|c| async move {
        let api = Api::<Pod>::namespaced(c, "o");
        for i in 0..300 {
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("pending{i}"), "labels": {"app": "other"}},
                "spec": {"containers": [{"name": "c", "image": "cvt-pause"}]},
            }))
            .unwrap();
            api.create(&PostParams::default(), &p).await.unwrap();
        }
    });
    // A restarted watcher lists services and pods in either order: the members stay
    // while it has not seen every pod (they once went for 20-30 ms).
    watcher.kill9();
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "1"]);
    let until = std::time::Instant::now() + Duration::from_secs(8);
    let mut least = usize::MAX;
    while std::time::Instant::now() < until {
        least = least.min(members());
    }
    assert_eq!(least, 2, "a member went while the watcher restarted");
}

#[test]
fn services_without_a_selector_and_the_kubernetes_service_are_served() {
    let (cluster, kube) = setup("kn");
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "4"]);
    namespace(&kube, "x");
    let served = served_pods(
        &cluster,
        &kube,
        "x",
        &[("m0", 0, "none"), ("client", 1, "client")],
    );
    let (member_ip, client) = (served.pods[0].4.clone(), &served.pods[1].3);
    // A service whose endpoints are written by hand.
    let svc = service(
        &kube,
        "x",
        "manual",
        json!({"spec": {"ports": [{"name": "http", "port": 80, "targetPort": 9999}]}}),
        false,
    );
    let endpoints = json!({
        "metadata": {"name": "manual"},
        "subsets": [{"addresses": [{"ip": member_ip}], "ports": [{"name": "http", "port": 8080}]}],
    });
    kube.admin(|c| async move {
        let ep: k8s_openapi::api::core::v1::Endpoints = serde_json::from_value(endpoints).unwrap();
        Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(c, "x")
            .create(&PostParams::default(), &ep)
            .await
            .unwrap();
    });
    let vip = svc.spec.unwrap().cluster_ip.unwrap();
    wait_until(
        "the hand-written endpoint to answer",
        Duration::from_secs(20),
        || client.connect(&vip, 80, 1, false) == ["m0"],
    );
    // Labelled for another proxy, or for none, the service is not corvid's to serve, as
    // it is not kube-proxy's; unlabelled, it is again.
    for label in [
        "service.kubernetes.io/service-proxy-name",
        "service.kubernetes.io/headless",
    ] {
        let labelled = |value: Value| json!({"metadata": {"labels": {label: value}}});
        service(&kube, "x", "manual", labelled(json!("other")), true);
        wait_until(
            &format!("nothing to answer the service labelled {label}"),
            Duration::from_secs(20),
            || client.connect(&vip, 80, 1, false) != ["m0"],
        );
        service(&kube, "x", "manual", labelled(Value::Null), true);
        wait_until(
            &format!("the service to answer again without {label}"),
            Duration::from_secs(20),
            || client.connect(&vip, 80, 1, false) == ["m0"],
        );
    }
    // A hand-written EndpointSlice and no Endpoints: the members are the slices', as
    // kube-proxy takes them.
    let svc = service(
        &kube,
        "x",
        "sliced",
        json!({"spec": {"ports": [{"name": "http", "port": 80, "targetPort": 9999}]}}),
        false,
    );
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice",
        "metadata": {"name": "sliced-1", "labels": {"kubernetes.io/service-name": "sliced"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [member_ip], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    });
    kube.admin(|c| async move {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "discovery.k8s.io",
            "v1beta1",
            "EndpointSlice",
        ));
        Api::<DynamicObject>::namespaced_with(c, "x", &ar)
            .create(
                &PostParams::default(),
                &serde_json::from_value(slice).unwrap(),
            )
            .await
            .unwrap();
    });
    let sliced = svc.spec.unwrap().cluster_ip.unwrap();
    wait_until(
        "the hand-written slice's endpoint to answer",
        Duration::from_secs(20),
        || client.connect(&sliced, 80, 1, false) == ["m0"],
    );
    // The `kubernetes` service, whose endpoints the API server writes: the API server's
    // own address, outside every corvid network, reached through the node.
    let kubernetes = kubernetes_cluster_ip(&kube);
    // With the API server's TLS: its certificate, checked against the CA, names the
    // cluster IP.
    let script = format!(
        "import socket, ssl\nc = ssl.create_default_context(cafile='{}')\n\
         s = c.wrap_socket(socket.create_connection(('{kubernetes}', 443), timeout=3), server_hostname='{kubernetes}')\n\
         s.sendall(b'GET /version HTTP/1.1\\r\\nHost: kubernetes\\r\\nConnection: close\\r\\n\\r\\n')\n\
         print(s.recv(100).decode().split()[0])",
        kube.ca().display()
    );
    let answered = || {
        client
            .command("python3")
            .args(["-c", &script])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "HTTP/1.1")
    };
    wait_until(
        "the API server through kubernetes.default",
        Duration::from_secs(20),
        answered,
    );
}

#[test]
fn where_endpoint_slices_are_not_served_members_come_from_endpoints() {
    let (cluster, kube) = setup_with("ke", &["--runtime-config=discovery.k8s.io/v1beta1=false"]);
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "4"]);
    namespace(&kube, "old");
    let served = served_pods(
        &cluster,
        &kube,
        "old",
        &[("p0", 0, "web"), ("p1", 1, "web"), ("client", 1, "client")],
    );
    let client = &served.pods[2].3;
    let svc = service(
        &kube,
        "old",
        "web",
        json!({"spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
        false,
    );
    let vip = svc.spec.unwrap().cluster_ip.unwrap();
    let web = std::collections::BTreeSet::from(["p0", "p1"]);
    wait_until("both members to answer", Duration::from_secs(20), || {
        answers_of(&client.connect(&vip, 80, 20, false)) == web
    });
    set_ready(&kube, "old", "p1", false);
    wait_until("p1 left out", Duration::from_secs(20), || {
        answers_of(&client.connect(&vip, 80, 10, false)) == std::collections::BTreeSet::from(["p0"])
    });
}

#[test]
fn services_spread_over_ready_pods_and_follow_them() {
    let (cluster, kube) = setup("kp");
    let _watcher = start_watcher(&cluster, &kube, &[]);
    namespace(&kube, "shop");
    let served = served_pods(
        &cluster,
        &kube,
        "shop",
        &[
            ("p0", 0, "web"),
            ("p1", 1, "web"),
            ("p2", 0, "web"),
            ("client", 0, "client"),
        ],
    );
    let client = &served.pods[3].3;
    let svc = service(
        &kube,
        "shop",
        "web",
        json!({"spec": {"selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http"},
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}}),
        false,
    );
    let vip = svc.spec.unwrap().cluster_ip.unwrap();
    let web = std::collections::BTreeSet::from(["p0", "p1", "p2"]);
    wait_until(
        "every member to answer on the VIP",
        Duration::from_secs(20),
        || answers_of(&client.connect(&vip, 80, 20, false)) == web,
    );
    // 60 connections from a client pod reach all three, across both nodes; UDP too.
    let answers = client.connect(&vip, 80, 60, false);
    assert_eq!(answers_of(&answers), web, "{answers:?}");
    let answers = client.connect(&vip, 53, 30, true);
    assert_eq!(answers_of(&answers), web, "{answers:?}");
    // A pod through the VIP to itself and the others.
    let answers = served.pods[0].3.connect(&vip, 80, 30, false);
    assert_eq!(answers_of(&answers), web, "hairpin: {answers:?}");

    // ClientIP affinity: one member.
    service(
        &kube,
        "shop",
        "web",
        json!({"spec": {"sessionAffinity": "ClientIP"}}),
        true,
    );
    wait_until("affinity", Duration::from_secs(20), || {
        answers_of(&client.connect(&vip, 80, 10, false)).len() == 1
    });
    service(
        &kube,
        "shop",
        "web",
        json!({"spec": {"sessionAffinity": "None"}}),
        true,
    );

    // A deleted pod stops receiving connections at once.
    delete_pod(&kube, "shop", "p1");
    let deleted = std::time::Instant::now();
    wait_until("p1 to be left out", Duration::from_secs(20), || {
        !client
            .connect(&vip, 80, 10, false)
            .contains(&"p1".to_string())
    });
    let left_out = deleted.elapsed();
    let answers = client.connect(&vip, 80, 30, false);
    assert_eq!(
        answers_of(&answers),
        std::collections::BTreeSet::from(["p0", "p2"]),
        "{answers:?}"
    );
    eprintln!("a deleted member left out after {left_out:?}");

    // No ready pod: refused at once, not a timeout.
    set_ready(&kube, "shop", "p0", false);
    set_ready(&kube, "shop", "p2", false);
    wait_until("refusal", Duration::from_secs(20), || {
        client.connect(&vip, 80, 1, false) == ["refused"]
    });
    let start = std::time::Instant::now();
    assert_eq!(client.connect(&vip, 80, 5, false), ["refused"; 5]);
    assert!(start.elapsed() < Duration::from_secs(2));
    wait_until("the event", Duration::from_secs(10), || {
        events(&kube, "shop").contains(&("NoReadyPods".into(), "web".into()))
    });
    assert_eq!(
        serving_condition(&kube, "shop", "web"),
        Some(("False".into(), "NoReadyPods".into()))
    );
    // publishNotReadyAddresses: the endpoint controllers publish pods that are not ready,
    // and so they serve.
    let publish = |on: bool| {
        service(
            &kube,
            "shop",
            "web",
            json!({"spec": {"publishNotReadyAddresses": on}}),
            true,
        )
    };
    publish(true);
    let not_ready = std::collections::BTreeSet::from(["p0", "p2"]);
    wait_until(
        "the pods that are not ready to serve",
        Duration::from_secs(20),
        || answers_of(&client.connect(&vip, 80, 20, false)) == not_ready,
    );
    publish(false);
    wait_until("refusal again", Duration::from_secs(20), || {
        client.connect(&vip, 80, 1, false) == ["refused"]
    });
    set_ready(&kube, "shop", "p0", true);
    wait_until("the service served again", Duration::from_secs(10), || {
        serving_condition(&kube, "shop", "web") == Some(("True".into(), "Serving".into()))
    });
    assert_eq!(client.connect(&vip, 80, 5, false), ["p0"; 5]);

    // A selector that matches nothing is said so; a cluster IP the controller already
    // gave away gets no load balancer, and says so.
    service(
        &kube,
        "shop",
        "nobody",
        json!({"spec": {"selector": {"app": "nobody"}, "ports": [{"port": 80}]}}),
        false,
    );
    // An address the API server has not handed out at random to an earlier service.
    let taken: Vec<String> = kube.admin(|c| async move {
        Api::<k8s_openapi::api::core::v1::Service>::all(c)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|s| s.spec?.cluster_ip)
            .collect()
    });
    let clash_ip = (200..255)
        .map(|i| format!("10.0.0.{i}"))
        .find(|ip| !taken.contains(ip))
        .unwrap();
    cluster
        .api(|c| {
            c.request(
                "POST",
                "/v2/lbaas/loadbalancers",
                Some(&json!({"loadbalancer": {"name": "squatter",
                "vip_subnet_id": corvid_k8s::ids::service_network().1, "vip_address": clash_ip}})),
            )
        })
        .unwrap();
    service(
        &kube,
        "shop",
        "clash",
        json!({"spec": {"clusterIP": clash_ip, "selector": {"app": "web"}, "ports": [{"port": 80}]}}),
        false,
    );
    wait_until("the events", Duration::from_secs(10), || {
        let e = events(&kube, "shop");
        e.contains(&("NoReadyPods".into(), "nobody".into()))
            && e.contains(&("ClusterIPUnavailable".into(), "clash".into()))
    });
    let lbs: Vec<corvid_api::LoadBalancer> = cluster.api(|c| c.list(&[])).unwrap().0;
    assert_eq!(
        lbs.iter()
            .filter(|l| l.vip_address.map(|a| a.to_string()) == Some(clash_ip.clone()))
            .count(),
        1,
        "only the squatter holds {clash_ip}"
    );
}

#[test]
fn load_balancer_services_get_floating_ips_node_ports_and_leave_nothing() {
    let (mut cluster, kube) = setup("kl");
    // .100 to .103: the router's gateway takes .103, the services the others. The router
    // is the test's own (--router), so its gateway's address is known.
    let public = cluster.public_network(103);
    cluster.api(|c| {
        c.create::<corvid_api::Router>(json!({"name": "edge", "external_gateway_info": {
            "network_id": public.id, "external_fixed_ips": [{"ip_address": "10.99.0.103"}]}}))
            .unwrap()
    });
    // Node 1 is on the public side (its underlay interface, here).
    cluster.agents[0].take();
    cluster.start_agent_with(0, &["--public-interface", "eth0"]);
    let args = ["--public-network", "public", "--router", "edge"];
    let mut watcher = start_watcher(&cluster, &kube, &args);
    namespace(&kube, "shop");
    let served = served_pods(
        &cluster,
        &kube,
        "shop",
        &[("p0", 0, "web"), ("p1", 1, "web")],
    );
    let web = std::collections::BTreeSet::from(["p0", "p1"]);
    let svc = service(
        &kube,
        "shop",
        "web",
        json!({"spec": {"type": "LoadBalancer", "loadBalancerIP": "10.99.0.101",
            "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
        false,
    );
    let spec = svc.spec.unwrap();
    let node_port = spec.ports.unwrap()[0].node_port.unwrap() as u16;
    wait_until(
        "the ingress IP in the status",
        Duration::from_secs(20),
        || service_status_ip(&kube, "shop", "web").as_deref() == Some("10.99.0.101"),
    );
    // From the public side, outside the overlay: the floating IP, and the node port on
    // each node's address.
    wait_until("the floating IP to answer", Duration::from_secs(20), || {
        answers_of(&cluster.lan.connect("10.99.0.101", 80, 20, false)) == web
    });
    for node in ["10.99.0.1", "10.99.0.2"] {
        let answers = cluster.lan.connect(node, node_port, 20, false);
        assert_eq!(
            answers_of(&answers),
            web,
            "node port on {node}: {answers:?}"
        );
    }
    // From the nodes themselves (host-network pods, the kubelet): their own address and
    // the other node's; the nodes as the kubelet leaves them, its KUBE-FIREWALL dropping
    // packets marked 0x8000 in INPUT and OUTPUT.
    for host in &cluster.hosts {
        for rule in [
            "-N KUBE-FIREWALL",
            "-A KUBE-FIREWALL -m mark --mark 0x8000/0x8000 -j DROP",
            "-I INPUT -j KUBE-FIREWALL",
            "-I OUTPUT -j KUBE-FIREWALL",
        ] {
            let out = host
                .command("iptables")
                .args(["-w"])
                .args(rule.split(' '))
                .output()
                .unwrap();
            assert!(out.status.success(), "iptables {rule}: {out:?}");
        }
    }
    for (h, host) in cluster.hosts.iter().enumerate() {
        for node in ["10.99.0.1", "10.99.0.2"] {
            let answers = host.connect(node, node_port, 20, false);
            assert_eq!(
                answers_of(&answers),
                web,
                "node port on {node} from h{}: {answers:?}",
                h + 1
            );
        }
    }

    // An agent restarted keeps an open connection working and repairs a deleted rule.
    let vip = spec.cluster_ip.unwrap();
    let client = &served.pods[0].3;
    let (first, mut held) = client.hold(vip.as_str(), 80);
    assert!(web.contains(first.as_str()), "{first}");
    cluster.agents[0].take();
    let mut nft = cluster.hosts[0]
        .open()
        .run(corvid_net::nftables::Nftables::open)
        .unwrap()
        .unwrap();
    let mut batch = corvid_net::nftables::Batch::new();
    batch.flush_chain("services");
    nft.commit(batch).unwrap();
    let answers = client.connect(&vip, 80, 3, false);
    assert!(
        !answers.iter().any(|a| a.starts_with('p')),
        "the rule is gone: {answers:?}"
    );
    cluster.start_agent_with(0, &["--public-interface", "eth0"]);
    wait_until(
        "the agent to repair the rule",
        Duration::from_secs(20),
        || answers_of(&client.connect(&vip, 80, 10, false)) == web,
    );
    assert_eq!(held.echo("again"), "again", "the open connection survived");

    // Bad input: a loadBalancerIP that another service holds; an exhausted public
    // network. Both are reported as events, and neither leaves a floating IP.
    service(
        &kube,
        "shop",
        "taken",
        json!({"spec": {"type": "LoadBalancer", "loadBalancerIP": "10.99.0.101",
            "selector": {"app": "web"}, "ports": [{"port": 81, "targetPort": 8080}]}}),
        false,
    );
    for name in ["more1", "more2", "more3"] {
        service(
            &kube,
            "shop",
            name,
            json!({"spec": {"type": "LoadBalancer", "selector": {"app": "web"},
                "ports": [{"port": 82, "targetPort": 8080}]}}),
            false,
        );
    }
    wait_until("the events", Duration::from_secs(20), || {
        let e = events(&kube, "shop");
        e.contains(&("LoadBalancerIPTaken".into(), "taken".into()))
            && e.iter().any(|(r, _)| r == "NoPublicAddress")
    });
    assert_eq!(service_status_ip(&kube, "shop", "taken"), None);
    assert_eq!(
        serving_condition(&kube, "shop", "taken"),
        Some(("False".into(), "LoadBalancerIPTaken".into()))
    );
    let fips: Vec<corvid_api::FloatingIp> = cluster.api(|c| c.list(&[])).unwrap().0;
    assert_eq!(
        fips.len(),
        3,
        "two free addresses taken by two of more1..3, and web's (the router has the fourth)"
    );

    // The watcher down while services are deleted: its restart sweeps them.
    watcher.kill9();
    for name in ["web", "taken", "more1", "more2", "more3"] {
        let name = name.to_string();
        kube.admin(|c| async move {
            Api::<k8s_openapi::api::core::v1::Service>::namespaced(c, "shop")
                .delete(&name, &DeleteParams::default())
                .await
                .unwrap();
        });
    }
    let _watcher = start_watcher(&cluster, &kube, &args);
    // The API server's own `kubernetes` service keeps its load balancer; no other is left.
    let names = || {
        let lbs: Vec<corvid_api::LoadBalancer> = cluster.api(|c| c.list(&[])).unwrap().0;
        lbs.into_iter().map(|l| l.name).collect::<Vec<_>>()
    };
    let started = std::time::Instant::now();
    while names() != ["default/kubernetes"] {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the sweep left {:?}",
            names()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let fips: Vec<corvid_api::FloatingIp> = cluster.api(|c| c.list(&[])).unwrap().0;
    assert_eq!(fips, []);
    let vip_ports = cluster
        .ports()
        .into_iter()
        .filter(|p| p.device_owner == "Octavia")
        .count();
    assert_eq!(vip_ports, 1);
    for (i, host) in cluster.hosts.iter().enumerate() {
        wait_until(
            "the hosts' service chains to go",
            Duration::from_secs(10),
            || {
                let chains = host
                    .open()
                    .run(|| corvid_net::nftables::Nftables::open()?.chains())
                    .unwrap()
                    .unwrap();
                chains
                    .iter()
                    .filter(|c| c.starts_with("svc-") && *c != "svc-reject")
                    .count()
                    == 1
            },
        );
        let addrs: Vec<String> = host
            .netlink()
            .addresses(None)
            .unwrap()
            .iter()
            .map(|(_, a)| a.addr().to_string())
            .collect();
        // No floating IP is left; the router's gateway stays where the public side is.
        let left: Vec<&String> = addrs
            .iter()
            .filter(|a| a.starts_with("10.99.0.10"))
            .collect();
        let router = if i == 0 { vec!["10.99.0.103"] } else { vec![] };
        assert_eq!(left, router, "host {i}: {addrs:?}");
    }
}

#[test]
fn pods_run_through_containerds_cri_are_reached_by_service_and_host_port() {
    use support::cluster::ns::serve_name_with;
    let (cluster, kube) = setup("kk");
    let _watcher = start_watcher(&cluster, &kube, &[]);
    namespace(&kube, "web");
    let nodes = cri_nodes(&cluster);
    let mut netns = Vec::new();
    let mut sandboxes = Vec::new();
    let mut servers = Vec::new();
    for (name, h, app) in [("p0", 0, "web"), ("p1", 1, "web"), ("client", 0, "client")] {
        let uid = pod_labelled(
            &kube,
            "web",
            name,
            &format!("h{}", h + 1),
            json!({"app": app}),
        );
        // p0 publishes 8080 on its node as hostPort 30080.
        let mut config = nodes[h].sandbox_config("web", name, &uid);
        if name == "p0" {
            config.port_mappings = vec![k8s_cri::v1::PortMapping {
                protocol: k8s_cri::v1::Protocol::Tcp as i32,
                container_port: 8080,
                host_port: 30080,
                host_ip: String::new(),
            }];
        }
        let (id, status) = nodes[h].run_sandbox(config);
        sandboxes.push((h, id));
        let path = support::cri::sandbox_netns(&status);
        if app == "web" {
            servers.push(serve_name_with(in_netns(&path, "python3"), name, 8080));
            set_ready(&kube, "web", name, true);
        }
        netns.push(path);
    }
    let svc = service(
        &kube,
        "web",
        "web",
        json!({"spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
        false,
    );
    let vip = svc.spec.unwrap().cluster_ip.unwrap();
    let connect = |n: usize| connect_from(&netns[2], &vip, 80, n);
    let both = std::collections::BTreeSet::from(["p0", "p1"]);
    wait_until(
        "both sandboxes to answer on the VIP",
        Duration::from_secs(20),
        || answers_of(&connect(20)) == both,
    );
    let node = support::cluster::underlay_ip(0);
    wait_until(
        "p0's hostPort on its node, from the other node",
        Duration::from_secs(20),
        || cluster.hosts[1].connect(&node, 30080, 1, false) == ["p0"],
    );
    drop(servers);
    // As the kubelet ends pods: nothing of containerd's is left.
    for (h, id) in sandboxes {
        nodes[h].remove_sandbox(id);
    }
}
