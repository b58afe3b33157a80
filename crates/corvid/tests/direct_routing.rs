//! Direct routing (`corvid agent --direct-routing`) on two simulated hosts of one
//! underlay subnet: pods reach pods of the other host through routes via its underlay
//! address, with nothing sent into the VXLAN device; networks on one router see each
//! other's own addresses; a network on no router reaches neither, although the host
//! holds routes to them; and the routes follow ports and restarts, both ways. Runs as
//! root, in namespaces only (see `overlay.rs`).

#[path = "support/cluster.rs"]
mod cluster;

use std::time::Duration;

use cluster::ns::{wait_until, Ns};
use cluster::{cni_result, result_ip, underlay_ip, Cluster};
use corvid_api::{requests::RouterInterface, Router};
use corvid_net::names;
use serde_json::{json, Value};

const DIRECT: &[&str] = &["--direct-routing", "--resync", "1"];

/// The host's direct routes (`proto 119`), as `ip route` prints them.
fn direct_routes(host: &Ns) -> String {
    let out = host
        .command("ip")
        .args(["route", "show", "proto", "119"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// How many packets `link` of `host` has sent.
fn sent(host: &Ns, link: &str) -> u64 {
    let out = host
        .command("ip")
        .args(["-j", "-s", "link", "show", "dev", link])
        .output()
        .unwrap();
    let links: Value = serde_json::from_slice(&out.stdout).unwrap();
    links[0]["stats64"]["tx"]["packets"].as_u64().unwrap()
}

/// What a server on `to` port 8080 sees as the client's address, over TCP and UDP.
fn seen_by(from: &Ns, to: &str) -> [Vec<String>; 2] {
    [false, true].map(|udp| from.connect(to, 8080, 1, udp))
}

fn restart_agents(cluster: &mut Cluster, extra: &[&str]) {
    for i in 0..2 {
        cluster.agents[i].take().unwrap().kill9();
        cluster.start_agent_with(i, extra);
    }
}

#[test]
fn pods_on_hosts_of_one_subnet_are_routed_to_without_encapsulation() {
    let mut cluster = Cluster::new("dr");
    // h1 as dockerd leaves a host: FORWARD drops what nothing accepts, so what h2's
    // pods open to h1's passes by corvid's accept alone. (h2 accepts everything, so
    // that only h1's routing filter keeps blue out below.)
    assert!(cluster.hosts[0]
        .command("iptables")
        .args(["-P", "FORWARD", "DROP"])
        .status()
        .unwrap()
        .success());
    restart_agents(&mut cluster, DIRECT);
    // Red and blue masquerade what leaves them: red's traffic to green must not be.
    let (red, red_subnet) = cluster.network("red", "10.66.0.0/24", true);
    let (_, green_subnet) = cluster.network("green", "10.67.0.0/24", false);
    cluster.network("blue", "10.68.0.0/24", true);
    cluster.api(|c| {
        let router: Router = c.create(json!({"name": "r1"})).unwrap();
        for s in [&red_subnet, &green_subnet] {
            let interface = RouterInterface {
                subnet_id: Some(s.id.clone()),
                port_id: None,
            };
            c.add_router_interface(&router.id, &interface).unwrap();
        }
    });
    let (r1, r2, g2, b1) = (
        cluster.pod("r1"),
        cluster.pod("r2"),
        cluster.pod("g2"),
        cluster.pod("b1"),
    );
    let ip_r1 = result_ip(&cni_result(&cluster.add(0, "red", &r1)));
    let ip_r2 = result_ip(&cni_result(&cluster.add(1, "red", &r2)));
    let ip_g2 = result_ip(&cni_result(&cluster.add(1, "green", &g2)));
    cni_result(&cluster.add(0, "blue", &b1));
    let _servers: Vec<_> = [&r1, &r2, &g2]
        .iter()
        .map(|p| p.serve_name("@peer", 8080))
        .collect();
    let (h1, h2) = (&cluster.hosts[0], &cluster.hosts[1]);
    wait_until(
        "red to reach red across hosts",
        Duration::from_secs(10),
        || r1.ping(&ip_r2),
    );

    // h1 routes r2 and g2 (green is on red's router) via h2's underlay address; h2 routes
    // r1 back the same way.
    let via = |ip: &str, host: usize| format!("{ip} via {} dev eth0", underlay_ip(host));
    let routes = direct_routes(h1);
    for ip in [&ip_r2, &ip_g2] {
        assert!(
            routes.contains(&via(ip, 1)),
            "h1's direct routes:\n{routes}"
        );
    }
    assert!(direct_routes(h2).contains(&via(&ip_r1, 0)));

    // r1 sends r2's frames to its own host, which routes them: nothing goes into red's
    // VXLAN device, and there is no FDB entry for r2 to encapsulate them with.
    let bridge_mac = h1
        .netlink()
        .link_by_name(&names::bridge(&red.id))
        .unwrap()
        .unwrap()
        .mac;
    assert_eq!(r1.neighbour_mac(&ip_r2), Some(bridge_mac));
    let vxlan = names::vxlan(&red.id);
    let before = sent(h1, &vxlan);
    for _ in 0..10 {
        assert!(r1.ping(&ip_r2));
    }
    assert_eq!(
        seen_by(&r1, &ip_r2),
        [vec![ip_r1.clone()], vec![ip_r1.clone()]]
    );
    assert_eq!(sent(h1, &vxlan), before, "{}", cluster.overlay_state());
    // A full-size frame crosses with DF set.
    assert!(r1
        .command("ping")
        .args(["-c", "1", "-W", "2", "-M", "do", "-s", "1422", &ip_r2])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap()
        .success());

    // Across the router, both ways, with the pods' own addresses.
    let own = |ip: &str| [vec![ip.to_string()], vec![ip.to_string()]];
    assert_eq!(seen_by(&r1, &ip_g2), own(&ip_r1), "red to green");
    assert_eq!(seen_by(&g2, &ip_r1), own(&ip_g2), "green to red");
    // Blue is on no router: h1's routes to r2 and g2 are not its to use, masqueraded or
    // not. The underlay routes blue's subnet to h1, and h2 routes by it, so that only
    // h1's filter stands between blue and the others.
    cluster.lan.ip("route add 10.68.0.0/24 via 10.99.0.1");
    cluster.lan.ip("route add 10.66.0.0/24 via 10.99.0.2");
    assert!(cluster
        .lan
        .command("sysctl")
        .args(["-qw", "net.ipv4.ip_forward=1"])
        .status()
        .unwrap()
        .success());
    h2.ip("route add default via 10.99.0.254");
    for ip in [&ip_r2, &ip_g2] {
        let got = seen_by(&b1, ip);
        assert!(
            got.iter().all(|a| a == &["timeout"] || a == &["error"]),
            "blue reached {ip}: {got:?}"
        );
    }

    // r2 goes while h1's agent is down: the restarted agent takes its route away.
    cluster.agents[0].take().unwrap().kill9();
    assert!(cluster.del(1, "red", &r2).status.success());
    cluster.start_agent_with(0, DIRECT);
    wait_until("h1 to drop r2's route", Duration::from_secs(10), || {
        !direct_routes(&cluster.hosts[0]).contains(&format!("{ip_r2} "))
    });
    assert_eq!(seen_by(&r1, &ip_g2), own(&ip_r1));

    // Direct routing turned off: the routes go, and the overlay carries instead.
    restart_agents(&mut cluster, &["--resync", "1"]);
    wait_until("the direct routes to go", Duration::from_secs(10), || {
        cluster.hosts.iter().all(|h| direct_routes(h).is_empty())
    });
    wait_until(
        "red to reach green over the overlay",
        Duration::from_secs(10),
        || r1.connect(&ip_g2, 8080, 1, false) == [ip_r1.clone()],
    );

    // Back on (a full pass a minute, so that changes alone must clean up), then every
    // pod deleted: no route is left behind.
    restart_agents(&mut cluster, &["--direct-routing"]);
    wait_until(
        "h1's direct route to g2 again",
        Duration::from_secs(10),
        || direct_routes(&cluster.hosts[0]).contains(&format!("{ip_g2} ")),
    );
    for (pod, net, host) in [(&r1, "red", 0), (&g2, "green", 1), (&b1, "blue", 0)] {
        assert!(cluster.del(host, net, pod).status.success());
    }
    wait_until("every direct route to go", Duration::from_secs(10), || {
        cluster.hosts.iter().all(|h| direct_routes(h).is_empty())
    });
}
