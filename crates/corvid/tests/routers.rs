//! Routers on two simulated hosts: two networks on one router reach each other across
//! hosts, both ways, over TCP and UDP, with their own addresses; a third network on no
//! router is reached by neither; an extra route carries to its next hop; an interface
//! removed cuts the route; restarted agents find it all again; a gateway SNATs what
//! leaves through the public side. Runs as root, in namespaces only (see `overlay.rs`).

#[path = "support/cluster.rs"]
mod cluster;

use std::time::{Duration, Instant};

use cluster::ns::{wait_until, Ns};
use cluster::{cni_result, result_ip, Cluster};
use corvid_api::{requests::RouterInterface, Router, Subnet};
use corvid_net::{names, sysctl};
use serde_json::json;

/// What a server on `to` port 8080 sees as the client's address, over TCP and UDP.
fn seen_by(from: &Ns, to: &str) -> [Vec<String>; 2] {
    [false, true].map(|udp| from.connect(to, 8080, 1, udp))
}

/// Neither TCP nor UDP gets through (dropped, or no route: nothing answered).
fn cut(from: &Ns, to: &str) -> bool {
    seen_by(from, to)
        .iter()
        .all(|a| a == &["timeout"] || a == &["error"])
}

fn set_routes(cluster: &Cluster, router: &Router, routes: serde_json::Value) {
    cluster.api(|c| {
        c.update::<Router>(&router.id, json!({ "routes": routes }))
            .unwrap()
    });
}

fn interface(subnet: &Subnet) -> RouterInterface {
    RouterInterface {
        subnet_id: Some(subnet.id.clone()),
        port_id: None,
    }
}

#[test]
fn networks_on_one_router_reach_each_other_across_hosts_and_no_one_else() {
    let mut cluster = Cluster::new("rt");
    // Red masquerades its egress: what it sends to green must keep its own address.
    let (_, red) = cluster.network("red", "10.60.0.0/24", true);
    let (_, green) = cluster.network("green", "10.61.0.0/24", false);
    cluster.network("blue", "10.62.0.0/24", false);
    let router: Router = cluster.api(|c| c.create(json!({"name": "r1"})).unwrap());
    cluster.api(|c| {
        for s in [&red, &green] {
            c.add_router_interface(&router.id, &interface(s)).unwrap();
        }
    });
    let (r1, g2, b1, b2) = (
        cluster.pod("r1"),
        cluster.pod("g2"),
        cluster.pod("b1"),
        cluster.pod("b2"),
    );
    let ip_r1 = result_ip(&cni_result(&cluster.add(0, "red", &r1)));
    let ip_g2 = result_ip(&cni_result(&cluster.add(1, "green", &g2)));
    let ip_b1 = result_ip(&cni_result(&cluster.add(0, "blue", &b1)));
    let ip_b2 = result_ip(&cni_result(&cluster.add(1, "blue", &b2)));
    let _servers: Vec<_> = [&r1, &g2, &b1, &b2]
        .iter()
        .map(|p| p.serve_name("@peer", 8080))
        .collect();
    wait_until("red to reach green", Duration::from_secs(10), || {
        r1.ping(&ip_g2)
    });
    let no_nat = |ip: &str| [vec![ip.to_string()], vec![ip.to_string()]];
    assert_eq!(seen_by(&r1, &ip_g2), no_nat(&ip_r1), "red to green");
    assert_eq!(seen_by(&g2, &ip_r1), no_nat(&ip_g2), "green to red");
    // Blue is on no router: its own pods reach each other, nobody else reaches them.
    assert!(b1.ping(&ip_b2));
    for (from, to) in [
        (&r1, &ip_b1),
        (&r1, &ip_b2),
        (&g2, &ip_b2),
        (&b1, &ip_r1),
        (&b2, &ip_g2),
    ] {
        assert!(cut(from, to), "{} reaches {to}", from.name());
    }

    // An extra route: 10.70.0.0/24 through g2, which holds 10.70.0.7 itself.
    g2.ip("addr add 10.70.0.7/32 dev lo");
    set_routes(
        &cluster,
        &router,
        json!([{"destination": "10.70.0.0/24", "nexthop": ip_g2}]),
    );
    wait_until("the extra route to carry", Duration::from_secs(10), || {
        r1.connect("10.70.0.7", 8080, 1, false) == [ip_r1.clone()]
    });

    // Agents restarted: the routes and the isolation come back as they were.
    for i in 0..2 {
        cluster.agents[i].take().unwrap().kill9();
        cluster.start_agent(i);
    }
    wait_until("red to reach green again", Duration::from_secs(20), || {
        r1.ping(&ip_g2)
    });
    assert!(cut(&r1, &ip_b1));
    wait_until("the extra route again", Duration::from_secs(10), || {
        r1.connect("10.70.0.7", 8080, 1, false) == [ip_r1.clone()]
    });
    // The route removed: gone from h1's kernel.
    set_routes(&cluster, &router, json!([]));
    wait_until("the extra route to go", Duration::from_secs(10), || {
        cut(&r1, "10.70.0.7")
    });

    // Green leaves the router: h1 stops routing to it, and h1 keeps no green bridge.
    let removed = Instant::now();
    cluster.api(|c| {
        c.remove_router_interface(&router.id, &interface(&green))
            .unwrap()
    });
    wait_until("red and green to be cut", Duration::from_secs(10), || {
        r1.connect(&ip_g2, 8080, 1, true) == ["timeout"]
    });
    eprintln!("cut within {:?}", removed.elapsed());
    assert!(cut(&g2, &ip_r1));
    let bridges = |host: &Ns| host.links(names::BRIDGE_PREFIX).len();
    // Red alone on the router: h2 keeps no red bridge either.
    wait_until(
        "each host to keep its own two",
        Duration::from_secs(10),
        || cluster.hosts.iter().all(|h| bridges(h) == 2),
    );
    // IPv4 networks: the hosts' IPv6 is off on their devices, so one coming or going
    // does not walk every other's IPv6 routes.
    for h in &cluster.hosts {
        let devices = [names::BRIDGE_PREFIX, names::VXLAN_PREFIX].map(|p| h.links(p));
        for link in devices.concat() {
            let key = format!("net/ipv6/conf/{link}/disable_ipv6");
            let off = h.open().run(|| sysctl::get(&key).unwrap()).unwrap();
            assert_eq!(off, "1", "{link}");
        }
    }
    cluster.api(|c| {
        c.remove_router_interface(&router.id, &interface(&red))
            .unwrap();
        c.delete::<Router>(&router.id).unwrap();
    });
    for (pod, net, host) in [
        (&r1, "red", 0),
        (&g2, "green", 1),
        (&b1, "blue", 0),
        (&b2, "blue", 1),
    ] {
        assert!(cluster.del(host, net, pod).status.success());
    }
    wait_until("every bridge to go", Duration::from_secs(10), || {
        cluster.hosts.iter().all(|h| bridges(h) == 0)
    });
}

/// A Kubernetes node reaches every pod (kubelet, host-network pods, the API server's
/// proxy on a control-plane node), with or without pods of its own: `--all-routers`.
#[test]
fn a_host_holding_every_router_reaches_pods_it_has_none_of() {
    let mut cluster = Cluster::new("ra");
    cluster.agents[0].take();
    cluster.start_agent_with(0, &["--all-routers"]);
    let (_, red) = cluster.network("red", "10.63.0.0/24", false);
    let (_, green) = cluster.network("green", "10.64.0.0/24", false);
    let (_, blue) = cluster.network("blue", "10.65.0.0/24", false);
    let router: Router = cluster.api(|c| c.create(json!({"name": "r1"})).unwrap());
    cluster.api(|c| {
        for s in [&red, &green] {
            c.add_router_interface(&router.id, &interface(s)).unwrap();
        }
    });
    let (g2, b2) = (cluster.pod("g2"), cluster.pod("b2"));
    let ip_g2 = result_ip(&cni_result(&cluster.add(1, "green", &g2)));
    let ip_b2 = result_ip(&cni_result(&cluster.add(1, "blue", &b2)));
    let _servers: Vec<_> = [&g2, &b2]
        .iter()
        .map(|p| p.serve_name("@peer", 8080))
        .collect();
    let h1 = &cluster.hosts[0];
    wait_until("h1 to reach green's pod", Duration::from_secs(10), || {
        h1.ping(&ip_g2)
    });
    // From the node's own address: no NAT on the way.
    assert_eq!(
        h1.connect(&ip_g2, 8080, 1, false),
        [cluster::underlay_ip(0)]
    );
    assert!(cut(h1, &ip_b2), "blue is on no router");
    let bridges = |host: &Ns| host.links(names::BRIDGE_PREFIX).len();
    assert_eq!(bridges(h1), 2, "red's and green's");

    // A router made later comes here whole; one's interface removed goes.
    let second: Router = cluster.api(|c| c.create(json!({"name": "r2"})).unwrap());
    cluster.api(|c| {
        c.add_router_interface(&second.id, &interface(&blue))
            .unwrap()
    });
    wait_until("h1 to reach blue's pod", Duration::from_secs(10), || {
        h1.ping(&ip_b2)
    });
    cluster.api(|c| {
        c.remove_router_interface(&router.id, &interface(&green))
            .unwrap()
    });
    wait_until("green to leave h1", Duration::from_secs(10), || {
        bridges(h1) == 2 && cut(h1, &ip_g2)
    });

    // Restarted, the agent finds the same again.
    cluster.agents[0].take().unwrap().kill9();
    cluster.start_agent_with(0, &["--all-routers"]);
    let h1 = &cluster.hosts[0];
    wait_until(
        "h1 to reach blue's pod again",
        Duration::from_secs(20),
        || h1.ping(&ip_b2),
    );
    assert_eq!(bridges(h1), 2, "red's and blue's");
    for (pod, net) in [(&g2, "green"), (&b2, "blue")] {
        assert!(cluster.del(1, net, pod).status.success());
    }
}

#[test]
fn a_router_gateway_snats_what_its_subnets_send_out_of_the_public_side() {
    let mut cluster = Cluster::new("rg");
    // Host 1 is on the public network through its underlay interface.
    cluster.agents[0].take();
    cluster.start_agent_with(0, &["--public-interface", "eth0"]);
    let public = cluster.public_network(150);
    // Red masquerades: without the router's SNAT its pods would leave as host 1.
    let (_, red) = cluster.network("red", "10.63.0.0/24", true);
    let router: Router = cluster.api(|c| {
        let r: Router = c
            .create(json!({"name": "edge", "external_gateway_info": {"network_id": public.id}}))
            .unwrap();
        c.add_router_interface(&r.id, &interface(&red)).unwrap();
        r
    });
    let gateway = router
        .external_gateway_info
        .as_ref()
        .unwrap()
        .external_fixed_ips[0]
        .ip_address
        .to_string();
    let pod = cluster.pod("r1");
    cni_result(&cluster.add(0, "red", &pod));
    let _server = cluster.lan.serve_name("@peer", 7070);
    wait_until(
        "the router's address to be seen",
        Duration::from_secs(10),
        || pod.connect("10.99.0.254", 7070, 1, false) == [gateway.clone()],
    );
    assert_eq!(
        pod.connect("10.99.0.254", 7070, 1, true),
        [gateway.as_str()]
    );
    // SNAT off: the network's own masquerade again, from host 1's address.
    cluster.api(|c| {
        c.update::<Router>(
            &router.id,
            json!({"external_gateway_info": {"network_id": public.id, "enable_snat": false}}),
        )
        .unwrap()
    });
    wait_until(
        "host 1's address to be seen",
        Duration::from_secs(10),
        || pod.connect("10.99.0.254", 7070, 1, false) == [cluster::underlay_ip(0)],
    );
    // The gateway's address is no longer answered for on the public side.
    let addrs = cluster.hosts[0].netlink().addresses(None).unwrap();
    assert!(
        !addrs.iter().any(|(_, a)| a.addr().to_string() == gateway),
        "{addrs:?}"
    );
    assert!(cluster.del(0, "red", &pod).status.success());
}
