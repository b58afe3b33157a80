//! Dual stack on two simulated hosts: a network with an IPv4 and an IPv6 subnet gives
//! each pod an address in both, both default routes, and both families reach the same
//! host, the other host across the overlay, the host itself and (masqueraded) the
//! underlay; the overlay runs over an IPv4 or an IPv6 underlay. Runs as root, in
//! namespaces only, as `overlay.rs` does.

#[path = "support/cluster.rs"]
mod cluster;

use std::process::Stdio;
use std::time::Duration;

use cluster::ns::{wait_until, Ns};
use cluster::{cni_result, result_ips, underlay_ip6, Cluster};
use corvid_api::{Host, Network, Port, Subnet};
use serde_json::{json, Value};

/// A network with subnets `v4` and `v6`, masqueraded, and its CNI configuration naming
/// the network (so each port gets an address in both).
fn dual_network(cluster: &Cluster, name: &str, v4: &str, v6: &str) -> Network {
    let net = cluster.api(|c| {
        let net: Network = c
            .create(json!({"name": name, "corvid:masquerade": true}))
            .unwrap();
        for (cidr, version) in [(v4, 4), (v6, 6)] {
            let _: Subnet = c
                .create(json!({"network_id": net.id, "cidr": cidr, "ip_version": version}))
                .unwrap();
        }
        net
    });
    cluster.conflist(name, &net.id);
    net
}

/// The result's address of the given family, without its prefix.
fn address(result: &Value, v6: bool) -> String {
    result_ips(result)
        .into_iter()
        .find(|a| a.contains(':') == v6)
        .unwrap_or_else(|| panic!("no {} address in {result}", if v6 { 6 } else { 4 }))
}

/// A ping of `size` bytes of payload that may not be fragmented.
fn df_ping(pod: &Ns, to: &str, size: usize) -> bool {
    pod.command("ping")
        .args([
            "-c",
            "1",
            "-W",
            "2",
            "-M",
            "do",
            "-s",
            &size.to_string(),
            to,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// The MTU of `ifname` in `pod`.
fn mtu(pod: &Ns, ifname: &str) -> usize {
    pod.netlink().link_by_name(ifname).unwrap().unwrap().mtu as usize
}

/// Both families between pods on one host, across hosts, to the gateway and the host,
/// and out to the underlay; a DF ping at the pod's MTU in both across the overlay.
fn both_families_reach(cluster: &Cluster, net: &str) {
    let a1 = cluster.pod("a1");
    let a2 = cluster.pod("a2");
    let b1 = cluster.pod("b1");
    let ra1 = cni_result(&cluster.add(0, net, &a1));
    let ra2 = cni_result(&cluster.add(0, net, &a2));
    let rb1 = cni_result(&cluster.add(1, net, &b1));
    assert_eq!(ra1["ips"].as_array().unwrap().len(), 2, "{ra1}");
    assert!(
        !ra1["ips"][0]["address"].as_str().unwrap().contains(':'),
        "IPv4 first: {ra1}"
    );
    let routes: Vec<&str> = ra1["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["dst"].as_str().unwrap())
        .collect();
    assert_eq!(routes, ["0.0.0.0/0", "::/0"], "{ra1}");
    let gw6 = ra1["ips"][1]["gateway"].as_str().unwrap().to_string();
    let pod_mtu = mtu(&a1, "eth0");
    for v6 in [false, true] {
        let (ip_a2, ip_b1) = (address(&ra2, v6), address(&rb1, v6));
        let family = if v6 { "IPv6" } else { "IPv4" };
        assert!(a1.ping(&ip_a2), "{family}, same host");
        assert!(
            a1.ping(&ip_b1),
            "{family}, across hosts\n{}",
            cluster.overlay_state()
        );
        assert!(b1.ping(&ip_a2), "{family}, across hosts, the other way");
        // The host's first packet to the pod may wait on neighbour discovery.
        wait_until(
            &format!("{family}: the host to reach its pod"),
            Duration::from_secs(5),
            || cluster.hosts[1].ping(&ip_b1),
        );
        // From its own address, not the bridge's, which b1's host holds too.
        wait_until(
            &format!("{family}: the other host to reach the pod"),
            Duration::from_secs(5),
            || cluster.hosts[0].ping(&ip_b1),
        );
        let header = if v6 { 48 } else { 28 };
        assert!(
            df_ping(&a1, &ip_b1, pod_mtu - header),
            "{family}: a full-sized packet that may not be fragmented crosses (MTU {pod_mtu})"
        );
    }
    assert!(a1.ping(&gw6), "the IPv6 gateway on the host's bridge");
    assert!(a1.ping("10.99.0.254"), "IPv4 egress is masqueraded");
    assert!(a1.ping("fd99::fe"), "IPv6 egress is masqueraded");
    // The overlay answered b1's IPv6 neighbour solicitation on a1's host: b1's own MAC.
    let ip6_b1 = address(&rb1, true);
    let mac_b1 = b1.netlink().link_by_name("eth0").unwrap().unwrap().mac;
    let out = a1
        .command("ip")
        .args(["-6", "neigh", "show", &ip6_b1])
        .output()
        .unwrap();
    let neigh = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(neigh.contains(&mac_b1.to_lowercase()), "{neigh}");

    for (pod, host) in [(&a1, 0), (&a2, 0), (&b1, 1)] {
        assert!(cluster.del(host, net, pod).status.success());
    }
    assert!(cluster.ports().is_empty());
    wait_until("the bridges to go", Duration::from_secs(10), || {
        cluster.hosts.iter().all(|h| {
            h.netlink()
                .links()
                .unwrap()
                .iter()
                .all(|l| !l.name.starts_with("cv"))
        })
    });
}

#[test]
fn pods_get_both_families_and_reach_each_other_over_both() {
    let cluster = Cluster::new("ds");
    dual_network(&cluster, "duo", "10.52.0.0/24", "fd52::/64");
    both_families_reach(&cluster, "duo");
}

#[test]
fn the_overlay_runs_over_an_ipv6_underlay() {
    let mut cluster = Cluster::new("d6");
    for i in 0..2 {
        cluster.agents[i].take();
        let underlay = underlay_ip6(i);
        cluster.start_agent_with(i, &["--underlay-ip", &underlay]);
    }
    wait_until(
        "the hosts to register over IPv6",
        Duration::from_secs(10),
        || {
            let hosts = cluster.api(|c| c.list::<Host>(&[]).unwrap().0);
            hosts.len() == 2 && hosts.iter().all(|h| h.underlay_ip.is_ipv6())
        },
    );
    dual_network(&cluster, "duo", "10.53.0.0/24", "fd53::/64");
    both_families_reach(&cluster, "duo");
}

#[test]
fn an_ipv6_address_given_to_a_new_port_is_reached_at_once_across_hosts() {
    let cluster = Cluster::new("dn");
    let net = dual_network(&cluster, "duo", "10.54.0.0/24", "fd54::/64");
    let v6 = cluster.api(|c| {
        c.list::<Subnet>(&[("network_id", net.id.as_str()), ("ip_version", "6")])
            .unwrap()
            .0
            .remove(0)
    });
    let a = cluster.pod("a");
    cni_result(&cluster.add(0, "duo", &a));
    let port_at = |pod: &Ns| {
        let extra = json!({"port_security_enabled": false,
            "fixed_ips": [{"subnet_id": v6.id, "ip_address": "fd54::50"}]});
        let port = cluster.api_port(1, &v6, pod, extra);
        (port.id, mac_of(pod))
    };
    let old = cluster.pod("old");
    let (old_port, old_mac) = port_at(&old);
    assert!(a.ping("fd54::50"));
    assert_eq!(a.neighbour_mac("fd54::50"), Some(old_mac.clone()));

    // The port goes and its address comes back at once with another port, MAC and pod
    // on the same host: a's neighbour entry, still fresh, names the old MAC.
    cluster.api(|c| c.delete::<Port>(&old_port)).unwrap();
    wait_until(
        "the old port to be unplugged",
        Duration::from_secs(10),
        || old.links("eth0").is_empty(),
    );
    let new = cluster.pod("new");
    let (_, new_mac) = port_at(&new);
    assert_ne!(new_mac, old_mac);
    // h1's agent advertised the new MAC to its local ports when it learned the port.
    wait_until("a to learn the new MAC", Duration::from_secs(5), || {
        a.neighbour_mac("fd54::50").as_deref() == Some(new_mac.as_str())
    });
    assert!(a.ping("fd54::50"), "{}", cluster.overlay_state());
}

/// The MAC of `pod`'s eth0.
fn mac_of(pod: &Ns) -> String {
    pod.netlink().link_by_name("eth0").unwrap().unwrap().mac
}

/// An IPv6 network with one subnet on `cidr` in router advertisement mode `mode` (also
/// its address mode), the subnet returned.
fn advertised_network(cluster: &Cluster, name: &str, cidr: &str, mode: Option<&str>) -> Subnet {
    cluster.api(|c| {
        let net: Network = c.create(json!({ "name": name })).unwrap();
        c.create(json!({"network_id": net.id, "cidr": cidr, "ip_version": 6,
            "ipv6_ra_mode": mode, "ipv6_address_mode": mode,
            "dns_nameservers": ["fd53::53"]}))
            .unwrap()
    })
}

/// An unbound port on `subnet`: the address the controller gives its MAC.
fn unbound(cluster: &Cluster, subnet: &Subnet) -> Port {
    cluster
        .api(|c| c.create(json!({ "network_id": subnet.network_id })))
        .unwrap()
}

/// A namespace plugged by hand into host `host`'s `bridge` as a VM is plugged: `eth0`
/// with `mac`, MTU 1500 and no address, configuring itself from what it hears; it
/// solicits a router when it comes up if `solicit`.
fn vm(cluster: &Cluster, host: usize, name: &str, bridge: &str, mac: &str, solicit: bool) -> Ns {
    let vm = cluster.pod(name);
    if !solicit {
        let out = vm
            .command("sysctl")
            .args(["-qw", "net.ipv6.conf.default.router_solicitations=0"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let host_end = format!("cvt{name}");
    cluster.hosts[host].ip(&format!(
        "link add {host_end} type veth peer name eth0 netns {}",
        vm.name()
    ));
    cluster.hosts[host].ip(&format!("link set {host_end} master {bridge} up"));
    vm.ip(&format!("link set eth0 address {mac} mtu 1500 up"));
    vm
}

/// `ns`'s IPv6 default routes, as `ip` prints them.
fn default_routes6(ns: &Ns) -> String {
    let out = ns
        .command("ip")
        .args(["-6", "route", "show", "default"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ns`'s global IPv6 addresses on eth0.
fn global_addresses6(ns: &Ns) -> Vec<String> {
    let mut nl = ns.netlink();
    let eth0 = nl.link_by_name("eth0").unwrap().unwrap();
    nl.addresses(Some(eth0.index))
        .unwrap()
        .into_iter()
        .map(|(_, a)| a.addr())
        .filter(|a| a.is_ipv6() && !a.to_string().starts_with("fe80"))
        .map(|a| a.to_string())
        .collect()
}

/// The link-local address of `bridge` on `host`.
fn link_local(host: &Ns, bridge: &str) -> String {
    let mut nl = host.netlink();
    let link = nl.link_by_name(bridge).unwrap().unwrap();
    nl.addresses(Some(link.index))
        .unwrap()
        .into_iter()
        .map(|(_, a)| a.addr().to_string())
        .find(|a| a.starts_with("fe80"))
        .unwrap_or_else(|| panic!("{bridge} has no link-local address"))
}

#[test]
fn bridges_advertise_the_router_on_subnets_with_an_advertisement_mode() {
    let mut cluster = Cluster::new("ra");
    // Full passes every second: the pods' own default routes and the advertised ones
    // must live side by side.
    for i in 0..2 {
        cluster.agents[i].take();
        cluster.start_agent_with(i, &["--resync", "1"]);
    }
    let slaac = advertised_network(&cluster, "slaac", "fd53::/64", Some("slaac"));
    let stateful = advertised_network(&cluster, "stateful", "fd54::/64", Some("dhcpv6-stateful"));
    let quiet = advertised_network(&cluster, "quiet", "fd55::/64", None);
    let bridge = |s: &Subnet| corvid_net::names::bridge(&s.network_id);
    // A pod each, plugged by the agents with static addresses, brings the bridges up.
    let pod = cluster.pod("pod");
    let pod_port = cluster.api_port(0, &slaac, &pod, json!({}));
    let far = cluster.pod("far");
    cluster.api_port(1, &slaac, &far, json!({}));
    let others: Vec<Ns> = [&stateful, &quiet]
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let p = cluster.pod(&format!("p{i}"));
            cluster.api_port(0, s, &p, json!({}));
            p
        })
        .collect();
    // Unbound ports: the addresses the controller gives their MACs.
    let (vm_port, stateful_port, quiet_port) = (
        unbound(&cluster, &slaac),
        unbound(&cluster, &stateful),
        unbound(&cluster, &quiet),
    );
    let vm1 = vm(
        &cluster,
        0,
        "vm1",
        &bridge(&slaac),
        &vm_port.mac_address,
        true,
    );
    let vm2 = vm(
        &cluster,
        0,
        "vm2",
        &bridge(&stateful),
        &stateful_port.mac_address,
        true,
    );
    let vm3 = vm(
        &cluster,
        0,
        "vm3",
        &bridge(&quiet),
        &quiet_port.mac_address,
        true,
    );

    // SLAAC: the address the controller computed, a default route via the bridge, the
    // network's MTU.
    let want = vm_port.fixed_ips[0].ip_address.to_string();
    wait_until(
        "vm1 to make its SLAAC address",
        Duration::from_secs(15),
        || global_addresses6(&vm1) == [want.clone()],
    );
    let router = link_local(&cluster.hosts[0], &bridge(&slaac));
    let routes = default_routes6(&vm1);
    assert!(
        routes.contains(&format!("via {router} dev eth0 proto ra")),
        "{routes}"
    );
    let mtu = vm1
        .command("cat")
        .arg("/proc/sys/net/ipv6/conf/eth0/mtu")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&mtu.stdout).trim(), "1450");
    assert!(vm1.ping("fd53::1"), "the gateway");
    let pod_ip = pod_port.fixed_ips[0].ip_address.to_string();
    assert!(vm1.ping(&pod_ip), "the pod beside it");

    // The agent's pod keeps its own default route beside the advertised one, over full
    // passes, with its one address.
    wait_until(
        "the pod to hear its router",
        Duration::from_secs(15),
        || default_routes6(&pod).contains("proto ra"),
    );
    std::thread::sleep(Duration::from_millis(2500));
    let routes = default_routes6(&pod);
    assert!(routes.contains("via fd53::1 dev eth0"), "{routes}");
    assert!(
        routes.contains(&format!("via {router} dev eth0 proto ra")),
        "{routes}"
    );
    assert_eq!(global_addresses6(&pod), [pod_ip]);
    // An advertisement stays on its host: the far pod's router is its own host's bridge.
    wait_until(
        "the far pod to hear its router",
        Duration::from_secs(15),
        || default_routes6(&far).contains("proto ra"),
    );
    let routes = default_routes6(&far);
    let far_router = link_local(&cluster.hosts[1], &bridge(&slaac));
    assert_ne!(far_router, router);
    assert!(
        routes.contains(&far_router) && !routes.contains(&router),
        "{routes}"
    );

    // DHCPv6-stateful: a router, but no address made from the prefix.
    wait_until("vm2 to hear its router", Duration::from_secs(15), || {
        default_routes6(&vm2).contains("proto ra")
    });
    assert!(
        global_addresses6(&vm2).is_empty(),
        "{:?}",
        global_addresses6(&vm2)
    );

    // No mode: nothing advertised, though vm3 has waited as long as the others.
    assert!(
        !default_routes6(&vm3).contains("proto ra"),
        "{}",
        default_routes6(&vm3)
    );
    assert!(global_addresses6(&vm3).is_empty());

    // A VM that never solicits, plugged while the agent is down, hears the advertisement
    // the restarted agent sends unasked.
    cluster.agents[0].take();
    let late_port = unbound(&cluster, &slaac);
    let vm4 = vm(
        &cluster,
        0,
        "vm4",
        &bridge(&slaac),
        &late_port.mac_address,
        false,
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(global_addresses6(&vm4).is_empty());
    cluster.start_agent_with(0, &["--resync", "1"]);
    let want = late_port.fixed_ips[0].ip_address.to_string();
    wait_until(
        "vm4 to make its SLAAC address",
        Duration::from_secs(15),
        || global_addresses6(&vm4) == [want.clone()],
    );
    drop(others);
}
