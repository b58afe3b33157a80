//! Security groups on the hosts: two simulated hosts whose agents filter
//! (`--security-groups`), ports made through the API with groups, and what reaches
//! whom across the overlay: the default group lets its members talk and keeps everyone
//! else out, rules open ports to prefixes and to other groups' members, membership
//! follows port updates, spoofed sources go nowhere, port security off opens the port,
//! and a restarted agent filters as before while one that does not filter removes the
//! filter. Runs as root, in `cvt*` namespaces only.

#[path = "support/cluster.rs"]
mod cluster;

use std::time::Duration;

use cluster::ns::{wait_until, Ns};
use cluster::{cni_result, result_ip, Cluster};
use corvid_api::{Port, Subnet};
use serde_json::{json, Value};

const FLAG: &str = "--security-groups";

/// The cluster with both agents filtering, started afresh on hosts whose administrator
/// keeps bridged frames out of iptables (both settings 0; br_netfilter's default is 1):
/// the agents must hook their own bridges, and leave the settings alone.
fn filtering(tag: &str) -> Cluster {
    let mut cluster = Cluster::new(tag);
    for host in &cluster.hosts {
        host.set_bridge_nf_call("0");
    }
    cluster.filtering_agents(None);
    cluster
}

/// The namespace's own settings, as `filtering` left them.
fn assert_namespace_hooks_off(cluster: &Cluster) {
    for host in &cluster.hosts {
        assert_eq!(host.bridge_nf_call(), ["0", "0"]);
    }
}

fn address(p: &Port) -> String {
    p.fixed_ips[0].ip_address.to_string()
}

fn rule(cluster: &Cluster, group: &str, rule: Value) {
    let mut body = json!({"security_group_id": group, "direction": "ingress",
        "ethertype": "IPv4"});
    body.as_object_mut()
        .unwrap()
        .extend(rule.as_object().unwrap().clone());
    cluster.call(
        "POST",
        "/v2.0/security-group-rules",
        json!({ "security_group_rule": body }),
    );
}

fn update_port(cluster: &Cluster, id: &str, port: Value) {
    cluster.call("PUT", &format!("/v2.0/ports/{id}"), json!({ "port": port }));
}

/// Whether `pod` gets an answer from `addr` within a few tries (a change reaches the
/// hosts through the watch).
fn reaches(pod: &Ns, addr: &str) -> bool {
    (0..3).any(|_| pod.ping(addr))
}

/// What one TCP connection from `pod` to addr:port got.
fn connect(pod: &Ns, addr: &str, port: u16) -> String {
    pod.connect(addr, port, 1, false).remove(0)
}

struct Pods {
    a: Ns,
    b: Ns,
    c: Ns,
    a_port: Port,
    b_port: Port,
    c_ip: String,
    subnet: Subnet,
}

/// a on h1 and b on h2 in the project's default group; c on h1 unfiltered (a CNI pod,
/// whose ports have port security off).
fn pods(cluster: &Cluster) -> Pods {
    let (_net, subnet) = cluster.network("sg", "10.62.0.0/24", false);
    let (a, b, c) = (cluster.pod("a"), cluster.pod("b"), cluster.pod("c"));
    let a_port = cluster.api_port(0, &subnet, &a, json!({}));
    let b_port = cluster.api_port(1, &subnet, &b, json!({}));
    let c_ip = result_ip(&cni_result(&cluster.add(0, "sg", &c)));
    assert_eq!(a_port.security_groups.len(), 1, "{a_port:?}");
    assert_eq!(a_port.security_groups, b_port.security_groups);
    Pods {
        a,
        b,
        c,
        a_port,
        b_port,
        c_ip,
        subnet,
    }
}

#[test]
fn the_default_group_and_rules_decide_who_reaches_a_port_across_hosts() {
    let cluster = filtering("sd");
    let p = pods(&cluster);
    let (ip_a, ip_b) = (address(&p.a_port), address(&p.b_port));
    // Members reach each other across the overlay.
    assert!(reaches(&p.a, &ip_b), "{}", cluster.overlay_state());
    assert!(p.b.ping(&ip_a));
    // Nobody else gets in: not a pod outside the group, not the host.
    assert!(!p.c.ping(&ip_a));
    assert!(!p.c.ping(&ip_b));
    assert!(!cluster.hosts[0].ping(&ip_a));
    // What a member starts goes anywhere and its replies come back.
    assert!(p.a.ping(&p.c_ip));

    // A group with TCP 80 from the subnet, added to b: c reaches b on 80, and only there.
    let web = cluster.security_group("web");
    rule(
        &cluster,
        &web.id,
        json!({"protocol": "tcp", "port_range_min": 80, "port_range_max": 80,
            "remote_ip_prefix": "10.62.0.0/24"}),
    );
    let mut groups = p.b_port.security_groups.clone();
    groups.push(web.id.clone());
    update_port(&cluster, &p.b_port.id, json!({"security_groups": groups}));
    let _web = p.b.serve_name("web", 80);
    let _other = p.b.serve_name("other", 81);
    wait_until("c to reach b on 80", Duration::from_secs(5), || {
        connect(&p.c, &ip_b, 80) == "web"
    });
    assert_eq!(connect(&p.c, &ip_b, 81), "timeout");
    assert!(!p.c.ping(&ip_b));

    // A rule that names another group: its members get in, and stop when they leave.
    let clients = cluster.security_group("clients");
    let servers = cluster.security_group("servers");
    rule(
        &cluster,
        &servers.id,
        json!({"protocol": "tcp", "port_range_min": 81, "port_range_max": 81,
            "remote_group_id": clients.id}),
    );
    let mut groups = p.b_port.security_groups.clone();
    groups.push(servers.id.clone());
    update_port(&cluster, &p.b_port.id, json!({"security_groups": groups}));
    let d = cluster.pod("d");
    let d_port = cluster.api_port(0, &p.subnet, &d, json!({"security_groups": [clients.id]}));
    wait_until(
        "d, a client, to reach b on 81",
        Duration::from_secs(5),
        || connect(&d, &ip_b, 81) == "other",
    );
    // A connection d holds open while it leaves the group.
    let (first, mut held) = d.hold(&ip_b, 81);
    assert_eq!(first, "other");
    update_port(
        &cluster,
        &d_port.id,
        json!({"security_groups": [servers.id]}),
    );
    wait_until(
        "d, no longer a client, to be kept out",
        Duration::from_secs(5),
        || connect(&d, &ip_b, 81) == "timeout",
    );
    // New connections follow at once; the established one goes on.
    assert_eq!(held.echo("again"), "again", "the open connection survived");

    // Port security off (and no groups): b is open to all.
    update_port(
        &cluster,
        &p.b_port.id,
        json!({"security_groups": [], "port_security_enabled": false}),
    );
    wait_until("c to reach b", Duration::from_secs(5), || p.c.ping(&ip_b));
    assert_namespace_hooks_off(&cluster);
}

#[test]
fn a_port_sends_only_from_its_own_addresses() {
    let cluster = filtering("ss");
    let p = pods(&cluster);
    // c, unfiltered, on a's bridge: it answers whatever reaches it.
    assert!(p.a.ping(&p.c_ip));
    // An address no port of the subnet has (the IPAM picks at random).
    let taken = [address(&p.a_port), address(&p.b_port), p.c_ip.clone()];
    let spoofed = (240..254)
        .map(|i| format!("10.62.0.{i}"))
        .find(|a| !taken.contains(a))
        .unwrap();
    p.a.ip(&format!("addr add {spoofed}/24 dev eth0"));
    assert!(!p.a.ping_from(&spoofed, &p.c_ip));
    // An allowed address pair makes it the port's own, and the agent's check of the
    // port leaves the address in the pod.
    update_port(
        &cluster,
        &p.a_port.id,
        json!({"allowed_address_pairs": [{"ip_address": spoofed}]}),
    );
    wait_until("the pair to be let through", Duration::from_secs(5), || {
        p.a.ping_from(&spoofed, &p.c_ip)
    });
}

#[test]
fn restarted_agents_filter_as_before_and_one_that_does_not_filter_cleans_up() {
    let mut cluster = filtering("sr");
    let p = pods(&cluster);
    let (ip_a, ip_b) = (address(&p.a_port), address(&p.b_port));
    assert!(reaches(&p.a, &ip_b));
    assert!(!p.c.ping(&ip_a));
    let c = &p.c;
    let flush = |host: &Ns| {
        let out = host
            .command("nft")
            .args(["delete", "table", "bridge", "corvid-sg"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    // Killed, its filter flushed meanwhile, and started again: the filter is made anew
    // from the controller's state.
    cluster.agents[0].take().unwrap().kill9();
    flush(&cluster.hosts[0]);
    assert!(c.ping(&ip_a), "the filter is gone");
    cluster.start_agent_with(0, &[FLAG, "--resync", "1"]);
    wait_until(
        "the restarted agent to filter",
        Duration::from_secs(10),
        || !c.ping(&ip_a),
    );
    assert!(p.a.ping(&ip_b));
    assert!(p.b.ping(&ip_a));
    // Flushed under a running agent: its next full pass sees it and makes it again.
    flush(&cluster.hosts[0]);
    wait_until("the agent to filter again", Duration::from_secs(10), || {
        !c.ping(&ip_a)
    });
    assert!(p.b.ping(&ip_a));
    // An agent that does not filter removes the filter: everyone reaches a.
    cluster.agents[0].take().unwrap().kill9();
    cluster.start_agent(0);
    wait_until("the filter to go", Duration::from_secs(10), || {
        c.ping(&ip_a)
    });
    let out = cluster.hosts[0]
        .command("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("corvid-sg"));
}

/// The address of `p` of the given family.
fn address_of(p: &Port, v6: bool) -> String {
    p.fixed_ips
        .iter()
        .map(|f| f.ip_address)
        .find(|a| a.is_ipv6() == v6)
        .unwrap_or_else(|| panic!("no address of that family: {p:?}"))
        .to_string()
}

#[test]
fn groups_filter_ipv6_as_they_filter_ipv4() {
    let cluster = filtering("s6");
    // A dual-stack network: ports get an address of each family.
    let (net, v6) = cluster.api(|c| {
        let net: corvid_api::Network = c.create(json!({"name": "sg6"})).unwrap();
        let _: Subnet = c
            .create(json!({"network_id": net.id, "cidr": "10.63.0.0/24", "ip_version": 4}))
            .unwrap();
        let v6: Subnet = c
            .create(json!({"network_id": net.id, "cidr": "fd63::/64", "ip_version": 6}))
            .unwrap();
        (net, v6)
    });
    cluster.conflist("sg6", &net.id);
    let (a, b, c) = (cluster.pod("a"), cluster.pod("b"), cluster.pod("c"));
    let a_port = cluster.api_port(0, &v6, &a, json!({}));
    let b_port = cluster.api_port(1, &v6, &b, json!({}));
    cni_result(&cluster.add(0, "sg6", &c));
    let (ip_a, ip_b) = (address_of(&a_port, true), address_of(&b_port, true));
    // Members of the default group reach each other over IPv6 across hosts; nobody else
    // gets in, not a pod outside the group, not the host.
    assert!(reaches(&a, &ip_b), "{}", cluster.overlay_state());
    assert!(b.ping(&ip_a));
    assert!(!c.ping(&ip_a));
    assert!(!c.ping(&ip_b));
    assert!(!cluster.hosts[0].ping(&ip_a));

    // An IPv6 rule opens TCP 80 from the IPv6 subnet, and only that.
    let web = cluster.security_group("web6");
    cluster.call(
        "POST",
        "/v2.0/security-group-rules",
        json!({"security_group_rule": {"security_group_id": web.id, "direction": "ingress",
            "ethertype": "IPv6", "protocol": "tcp", "port_range_min": 80, "port_range_max": 80,
            "remote_ip_prefix": "fd63::/64"}}),
    );
    let mut groups = b_port.security_groups.clone();
    groups.push(web.id.clone());
    update_port(&cluster, &b_port.id, json!({"security_groups": groups}));
    let _web = b.serve_name("web", 80);
    let _other = b.serve_name("other", 81);
    wait_until(
        "c to reach b on 80 over IPv6",
        Duration::from_secs(5),
        || connect(&c, &ip_b, 80) == "web",
    );
    assert_eq!(connect(&c, &ip_b, 81), "timeout");
    // The IPv4 address is not opened by an IPv6 rule.
    assert_eq!(connect(&c, &address_of(&b_port, false), 80), "timeout");

    // A port sends from its own IPv6 addresses only.
    let spoofed = "fd63::dead";
    a.ip(&format!("addr add {spoofed}/64 dev eth0 nodad"));
    assert!(a.ping_from(&ip_a, &ip_b), "from its own address");
    assert!(!a.ping_from(spoofed, &ip_b), "from an address not its own");
}
