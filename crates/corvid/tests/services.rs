//! Load balancers made through the controller's Octavia API are served by the agents on
//! both simulated hosts: pods reach the VIP's members on either host, and from the public
//! side (the lan namespace) a floating IP on the VIP reaches them too. Runs as root, in
//! namespaces only.

#[path = "support/cluster.rs"]
mod cluster;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use cluster::ns::{wait_until, Ns};
use cluster::{cni_result, result_ip, Cluster};
use corvid_api::{FloatingIp, Network, RouterInterface, Subnet};
use serde_json::{json, Value};

fn post(cluster: &Cluster, path: &str, body: Value) -> Value {
    let (status, v, _) = cluster
        .api(|c| c.request("POST", path, Some(&body)))
        .unwrap();
    assert_eq!(status, 201, "{path}: {v}");
    v
}

fn answered(answers: &[String]) -> BTreeSet<&str> {
    answers.iter().map(String::as_str).collect()
}

/// A network for VIPs, with one subnet and no gateway.
fn services_network(cluster: &Cluster, cidr: &str) -> (Network, Subnet) {
    cluster.api(|c| {
        let n: Network = c.create(json!({"name": "services"})).unwrap();
        let s: Subnet = c
            .create(json!({"network_id": n.id, "cidr": cidr, "ip_version": 4, "gateway_ip": null}))
            .unwrap();
        (n, s)
    })
}

/// A member of `pool` at `ip`, port 8080; its ID.
fn add_member(cluster: &Cluster, pool: &str, ip: &str) -> String {
    let m = post(
        cluster,
        "/v2/lbaas/members",
        json!({"member": {"pool_id": pool, "address": ip, "protocol_port": 8080}}),
    );
    m["member"]["id"].as_str().unwrap().to_string()
}

/// Whether each of corvid's bridges on `host` hands its IPv4 and its IPv6 frames to
/// netfilter's IP hooks (both, or neither: anything else is a failure).
fn bridge_hooks(host: &Ns) -> BTreeMap<String, bool> {
    let out = host
        .command("ip")
        .args(["-d", "link", "show", "type", "bridge"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut hooks = BTreeMap::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.split(": ").nth(1).filter(|_| !line.starts_with(' ')) {
            name = Some(n.to_string());
        }
        let setting = |key: &str| {
            line.find(key)
                .map(|at| line[at + key.len()..].starts_with('1'))
        };
        if let (Some(n), Some(v4), Some(v6)) = (
            &name,
            setting("nf_call_iptables "),
            setting("nf_call_ip6tables "),
        ) {
            if n.starts_with("cvb") {
                assert_eq!(v4, v6, "{n}: {line}");
                hooks.insert(n.clone(), v4);
            }
        }
    }
    hooks
}

#[test]
fn load_balancers_are_served_on_every_host_and_through_floating_ips() {
    let mut cluster = Cluster::new("sv");
    // Hosts whose administrator keeps bridged frames out of iptables (both settings 0;
    // br_netfilter's default is 1): the agents, started afresh on them, hook their own
    // bridges where services need it and leave the settings alone.
    cluster.agents[0].take();
    cluster.agents[1].take();
    for host in &cluster.hosts {
        host.set_bridge_nf_call("0");
    }
    // Host 1 answers for floating IPs on its underlay interface, the public side here.
    cluster.start_agent_with(0, &["--public-interface", "eth0"]);
    cluster.start_agent_with(1, &[]);
    let (_, blue) = cluster.network("blue", "10.51.0.0/24", false);
    let pods: Vec<_> = ["a1", "a2", "b1", "client"]
        .iter()
        .map(|n| cluster.pod(n))
        .collect();
    let hosts = [0, 0, 1, 0];
    let ips: Vec<String> = pods
        .iter()
        .zip(hosts)
        .map(|(p, h)| result_ip(&cni_result(&cluster.add(h, "blue", p))))
        .collect();
    let _servers: Vec<_> = pods[..3]
        .iter()
        .zip(["a1", "a2", "b1"])
        .map(|(p, n)| p.serve_name(n, 8080))
        .collect();

    let hooks = bridge_hooks(&cluster.hosts[0]);
    assert!(
        !hooks.is_empty() && hooks.values().all(|on| !on),
        "no service yet, no bridge hooked: {hooks:?}"
    );

    let (svc_net, svc_subnet) = services_network(&cluster, "10.97.0.0/24");
    let lb = post(
        &cluster,
        "/v2/lbaas/loadbalancers",
        json!({"loadbalancer": {"name": "web", "vip_subnet_id": svc_subnet.id, "vip_address": "10.97.0.10"}}),
    );
    let lb = &lb["loadbalancer"];
    assert_eq!(lb["vip_network_id"], svc_net.id.as_str());
    let listener = post(
        &cluster,
        "/v2/lbaas/listeners",
        json!({"listener": {"loadbalancer_id": lb["id"], "protocol": "TCP", "protocol_port": 80}}),
    );
    let pool = post(
        &cluster,
        "/v2/lbaas/pools",
        json!({"pool": {"listener_id": listener["listener"]["id"], "loadbalancer_id": lb["id"],
            "protocol": "TCP", "lb_algorithm": "ROUND_ROBIN"}}),
    );
    let pool_id = pool["pool"]["id"].as_str().unwrap().to_string();
    for ip in &ips[..3] {
        add_member(&cluster, &pool_id, ip);
    }

    // From a pod on host 1 and from one on host 2: every member answers, wherever it is.
    let all = BTreeSet::from(["a1", "a2", "b1"]);
    for client in [&pods[3], &pods[2]] {
        wait_until("the VIP to answer", Duration::from_secs(10), || {
            answered(&client.connect("10.97.0.10", 80, 1, false))
                .iter()
                .all(|a| all.contains(a))
        });
        let answers = client.connect("10.97.0.10", 80, 40, false);
        assert_eq!(answered(&answers), all, "{answers:?}");
    }
    // A network made once services exist has its bridge hooked as it comes.
    cluster.network("green", "10.52.0.0/24", false);
    let green = cluster.pod("g1");
    cni_result(&cluster.add(0, "green", &green));
    for host in &cluster.hosts {
        let hooks = bridge_hooks(host);
        assert!(hooks.values().all(|on| *on), "{hooks:?}");
    }
    assert_eq!(bridge_hooks(&cluster.hosts[0]).len(), 2, "blue and green");
    // Green leaves host 1 with its last pod and comes back: its new bridge is hooked too.
    assert!(cluster.del(0, "green", &green).status.success());
    wait_until("green's bridge to go", Duration::from_secs(10), || {
        bridge_hooks(&cluster.hosts[0]).len() == 1
    });
    cni_result(&cluster.add(0, "green", &green));
    let hooks = bridge_hooks(&cluster.hosts[0]);
    assert!(
        hooks.len() == 2 && hooks.values().all(|on| *on),
        "{hooks:?}"
    );

    // A floating IP on the VIP: from the public side, outside the overlay, through a
    // router with its gateway there and an interface on each network (the services'
    // subnet has no gateway address: its interface is a port on its broadcast address,
    // which no VIP takes).
    let public = cluster.public_network(150);
    cluster.api(|c| {
        let router: corvid_api::Router = c
            .create(json!({"name": "edge", "external_gateway_info": {"network_id": public.id}}))
            .unwrap();
        let edge: corvid_api::Port = c
            .create(json!({"network_id": svc_net.id,
                "fixed_ips": [{"subnet_id": svc_subnet.id, "ip_address": "10.97.0.255"}]}))
            .unwrap();
        for which in [
            RouterInterface {
                subnet_id: Some(blue.id.clone()),
                port_id: None,
            },
            RouterInterface {
                subnet_id: None,
                port_id: Some(edge.id),
            },
        ] {
            c.add_router_interface(&router.id, &which).unwrap();
        }
    });
    let fip: FloatingIp = cluster.api(|c| {
        c.create(json!({"floating_network_id": public.id, "port_id": lb["vip_port_id"]}))
            .unwrap()
    });
    let fip_addr = fip.floating_ip_address.to_string();
    wait_until("the floating IP to answer", Duration::from_secs(10), || {
        answered(&cluster.lan.connect(&fip_addr, 80, 1, false))
            .iter()
            .all(|a| all.contains(a))
    });
    let answers = cluster.lan.connect(&fip_addr, 80, 40, false);
    assert_eq!(answered(&answers), all, "{answers:?}");

    // A floating IP of a plain port: reached from the public side, and what the pod
    // opens towards it leaves from the floating IP.
    let a1_port = cluster
        .ports()
        .into_iter()
        .find(|p| {
            p.fixed_ips
                .iter()
                .any(|f| f.ip_address.to_string() == ips[0])
        })
        .unwrap();
    let pod_fip: FloatingIp = cluster.api(|c| {
        c.create(json!({"floating_network_id": public.id, "port_id": a1_port.id}))
            .unwrap()
    });
    let pod_fip_addr = pod_fip.floating_ip_address.to_string();
    wait_until(
        "the pod's floating IP to answer",
        Duration::from_secs(10),
        || cluster.lan.connect(&pod_fip_addr, 8080, 1, false) == ["a1"],
    );
    let _peer = cluster.lan.serve_name("@peer", 7070);
    assert_eq!(
        pods[0].connect("10.99.0.254", 7070, 1, false),
        vec![pod_fip_addr]
    );
    cluster
        .api(|c| c.delete::<FloatingIp>(&pod_fip.id))
        .unwrap();

    // Deleting the load balancer (the floating IP first) stops both, on both hosts.
    cluster.api(|c| c.delete::<FloatingIp>(&fip.id)).unwrap();
    let path = format!(
        "/v2/lbaas/loadbalancers/{}?cascade=true",
        lb["id"].as_str().unwrap()
    );
    assert_eq!(
        cluster.api(|c| c.request("DELETE", &path, None)).unwrap().0,
        204
    );
    wait_until("the VIP to stop answering", Duration::from_secs(10), || {
        !pods[3].connect("10.97.0.10", 80, 1, false)[0].starts_with(['a', 'b'])
    });
    for host in &cluster.hosts {
        let chains = host
            .open()
            .run(|| corvid_net::nftables::Nftables::open()?.chains())
            .unwrap()
            .unwrap();
        assert!(chains.contains(&"services".to_string()), "{chains:?}");
        assert!(
            !chains
                .iter()
                .any(|c| c.starts_with("svc-") && c != "svc-reject"),
            "{chains:?}"
        );
    }
    let addrs = cluster.hosts[0].netlink().addresses(None).unwrap();
    assert!(
        !addrs.iter().any(|(_, a)| a.addr().to_string() == fip_addr),
        "{addrs:?}"
    );
    for host in &cluster.hosts {
        wait_until(
            "no bridge hooked, no service left",
            Duration::from_secs(10),
            || bridge_hooks(host).values().all(|on| !on),
        );
        assert_eq!(host.bridge_nf_call(), ["0", "0"]);
    }
}

/// A pool's members changed through the controller while a client keeps connecting: a
/// member taken out is never chosen again; and a listener moved to a pool of as many
/// members, one of them another (one change for the agent: the same count, one member
/// swapped), keeps every connection answered, and the one that went is not chosen again.
#[test]
fn members_changed_under_traffic_are_followed_at_once() {
    let cluster = Cluster::new("sm");
    cluster.network("green", "10.52.0.0/24", false);
    let names = ["m1", "m2", "m3", "m4"];
    let hosts = [0, 1, 0, 1];
    let pods: Vec<_> = names.iter().map(|n| cluster.pod(n)).collect();
    let ip: BTreeMap<&str, String> = names
        .iter()
        .zip(&pods)
        .zip(hosts)
        .map(|((n, p), h)| (*n, result_ip(&cni_result(&cluster.add(h, "green", p)))))
        .collect();
    let _servers: Vec<_> = pods
        .iter()
        .zip(names)
        .map(|(p, n)| p.serve_name(n, 8080))
        .collect();
    let client = cluster.pod("client");
    cni_result(&cluster.add(0, "green", &client));

    let (_, subnet) = services_network(&cluster, "10.98.0.0/24");
    let lb = post(
        &cluster,
        "/v2/lbaas/loadbalancers",
        json!({"loadbalancer": {"name": "web", "vip_subnet_id": subnet.id, "vip_address": "10.98.0.10"}}),
    );
    let lb_id = lb["loadbalancer"]["id"].as_str().unwrap();
    let listener = post(
        &cluster,
        "/v2/lbaas/listeners",
        json!({"listener": {"loadbalancer_id": lb_id, "protocol": "TCP", "protocol_port": 80}}),
    );
    let listener_id = listener["listener"]["id"].as_str().unwrap();
    let pool = |listener: Option<&str>| {
        let mut pool = json!({"loadbalancer_id": lb_id, "protocol": "TCP",
            "lb_algorithm": "ROUND_ROBIN"});
        if let Some(l) = listener {
            pool["listener_id"] = json!(l);
        }
        let p = post(&cluster, "/v2/lbaas/pools", json!({ "pool": pool }));
        p["pool"]["id"].as_str().unwrap().to_string()
    };
    let first = pool(Some(listener_id));
    let member: BTreeMap<&str, String> = names[..3]
        .iter()
        .map(|n| (*n, add_member(&cluster, &first, &ip[n])))
        .collect();
    let vip = "10.98.0.10";
    let chosen_from = |members: &[&str]| {
        let answers = client.connect(vip, 80, 30, false);
        answered(&answers) == members.iter().copied().collect()
    };
    wait_until("the VIP to answer", Duration::from_secs(10), || {
        chosen_from(&names[..3])
    });

    // m1 goes.
    let path = format!("/v2/lbaas/members/{}", member["m1"]);
    assert_eq!(
        cluster.api(|c| c.request("DELETE", &path, None)).unwrap().0,
        204
    );
    wait_until("the agent to drop m1", Duration::from_secs(10), || {
        chosen_from(&["m2", "m3"])
    });
    let answers = client.connect(vip, 80, 40, false);
    assert_eq!(
        answered(&answers),
        BTreeSet::from(["m2", "m3"]),
        "m1 chosen again, or the others not: {answers:?}"
    );

    // The listener moves to a pool of two as well: m2 stays, m4 comes for m3.
    // Connections go on meanwhile.
    let second = pool(None);
    for n in ["m2", "m4"] {
        add_member(&cluster, &second, &ip[n]);
    }
    let path = format!("/v2/lbaas/listeners/{listener_id}");
    let body = json!({"listener": {"default_pool_id": second}});
    // Nothing in the scope may panic before the traffic stops: the scope would wait for
    // it forever.
    let moved = std::sync::atomic::AtomicBool::new(false);
    let (during, put, swapped) = std::thread::scope(|s| {
        let traffic = s.spawn(|| {
            let mut during = Vec::new();
            while !moved.load(std::sync::atomic::Ordering::SeqCst) {
                during.extend(client.connect(vip, 80, 1, false));
            }
            during
        });
        let put = cluster.api(|c| c.request("PUT", &path, Some(&body)));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut swapped = false;
        while !swapped && Instant::now() < deadline {
            swapped = chosen_from(&["m2", "m4"]);
        }
        moved.store(true, std::sync::atomic::Ordering::SeqCst);
        (traffic.join().unwrap(), put, swapped)
    });
    let (status, v, _) = put.unwrap();
    assert_eq!(status, 200, "{v}");
    assert!(swapped, "the agent did not swap m3 for m4");
    assert!(
        during
            .iter()
            .all(|a| ["m2", "m3", "m4"].contains(&a.as_str())),
        "a connection went unanswered during the swap: {during:?}"
    );
    let answers = client.connect(vip, 80, 40, false);
    assert_eq!(
        answered(&answers),
        BTreeSet::from(["m2", "m4"]),
        "m3 chosen again, or the others not: {answers:?}"
    );
}

#[test]
fn a_connection_half_closed_through_a_vip_keeps_its_translation_for_an_hour() {
    let cluster = Cluster::new("sc");
    cluster.network("teal", "10.53.0.0/24", false);
    let (server, client) = (cluster.pod("srv"), cluster.pod("client"));
    let server_ip = result_ip(&cni_result(&cluster.add(1, "teal", &server)));
    cni_result(&cluster.add(0, "teal", &client));
    // A server that greets and never closes its side: after a client's FIN, the
    // connection is CLOSE_WAIT in the client host's conntrack.
    let (_server, _) = server.python_ready(
        "import socket\n\
         s = socket.socket(); s.bind(('0.0.0.0', 8080)); s.listen(8)\n\
         print('ready', flush=True)\n\
         held = []\n\
         while True:\n\
         \x20   c, _ = s.accept(); c.sendall(b'hi'); held.append(c)",
    );
    let (_, subnet) = services_network(&cluster, "10.96.0.0/24");
    let lb = post(
        &cluster,
        "/v2/lbaas/loadbalancers",
        json!({"loadbalancer": {"name": "web", "vip_subnet_id": subnet.id, "vip_address": "10.96.0.10"}}),
    );
    let listener = post(
        &cluster,
        "/v2/lbaas/listeners",
        json!({"listener": {"loadbalancer_id": lb["loadbalancer"]["id"], "protocol": "TCP", "protocol_port": 80}}),
    );
    let pool = post(
        &cluster,
        "/v2/lbaas/pools",
        json!({"pool": {"listener_id": listener["listener"]["id"],
            "loadbalancer_id": lb["loadbalancer"]["id"], "protocol": "TCP",
            "lb_algorithm": "ROUND_ROBIN"}}),
    );
    add_member(&cluster, pool["pool"]["id"].as_str().unwrap(), &server_ip);
    wait_until("the VIP to answer", Duration::from_secs(10), || {
        client.connect("10.96.0.10", 80, 1, false) == ["hi"]
    });
    let (_client, _) = client.python_ready(
        "import socket, time\n\
         s = socket.create_connection(('10.96.0.10', 80), timeout=5)\n\
         s.shutdown(socket.SHUT_WR)\n\
         print('ready', flush=True)\n\
         time.sleep(120)",
    );
    let mut entry = String::new();
    wait_until(
        "the connection to be CLOSE_WAIT in conntrack",
        Duration::from_secs(10),
        || {
            let table = cluster.hosts[0]
                .command("cat")
                .arg("/proc/net/nf_conntrack")
                .output()
                .unwrap();
            entry = String::from_utf8_lossy(&table.stdout)
                .lines()
                .find(|l| l.contains("CLOSE_WAIT") && l.contains("dst=10.96.0.10"))
                .unwrap_or_default()
                .to_string();
            !entry.is_empty()
        },
    );
    // "ipv4 2 tcp 6 TIMEOUT CLOSE_WAIT src=...": kube-proxy's hour, not the kernel's minute.
    let timeout: u64 = entry.split_whitespace().nth(4).unwrap().parse().unwrap();
    assert!(timeout > 3500, "{entry}");
    let established = cluster.hosts[0]
        .command("cat")
        .arg("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&established.stdout).trim(), "86400");
}
