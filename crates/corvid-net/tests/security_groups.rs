//! Security groups for real (as root): a private host namespace with two bridges and
//! br_netfilter on, four pods (three on one bridge, one routed from the other); the
//! tables filter what reaches and leaves each filtered port, statefully, and what a
//! port may send as.

#[path = "../../corvid/tests/support/ns.rs"]
mod ns;

use corvid_net::nftables::security_groups::Group;
use corvid_net::nftables::security_groups::{
    PortFilter, Remote, Report, Rule, SecurityGroups, Want,
};
use ns::Ns;
use std::net::IpAddr;

struct Site {
    host: Ns,
    pods: Vec<Ns>,
}

/// Pod `i`: 0 to 2 on bridge a (10.230.0.0/24), 3 on bridge b (10.231.0.0/24).
fn pod_ip(i: usize) -> String {
    if i < 3 {
        format!("10.230.0.1{i}")
    } else {
        "10.231.0.10".into()
    }
}

/// Pod `i`'s IPv6 address: fd00:230::/64 on bridge a, fd00:231::/64 on b.
fn pod_ip6(i: usize) -> String {
    if i < 3 {
        format!("fd00:230::1{i}")
    } else {
        "fd00:231::10".into()
    }
}

fn mac(i: usize) -> [u8; 6] {
    [2, 0, 0, 0, 0, 0x10 + i as u8]
}

fn bridge(i: usize) -> &'static str {
    if i < 3 {
        "cvbsga"
    } else {
        "cvbsgb"
    }
}

fn site(name: &str) -> Site {
    let tag = format!("cvt{}{name}", std::process::id());
    let host = Ns::new(&tag, "h");
    host.ip("link set lo up");
    host.open()
        .run(|| {
            corvid_net::sysctl::set("net/ipv4/ip_forward", "1").unwrap();
            corvid_net::sysctl::set("net/ipv6/conf/all/forwarding", "1").unwrap();
            corvid_net::sysctl::set("net/bridge/bridge-nf-call-iptables", "1").unwrap();
            corvid_net::sysctl::set("net/bridge/bridge-nf-call-ip6tables", "1").unwrap();
        })
        .unwrap();
    for (b, net, net6) in [
        ("cvbsga", "10.230.0.1/24", "fd00:230::1/64"),
        ("cvbsgb", "10.231.0.1/24", "fd00:231::1/64"),
    ] {
        host.ip(&format!("link add {b} type bridge"));
        host.ip(&format!("addr add {net} dev {b}"));
        host.ip(&format!("addr add {net6} dev {b} nodad"));
        host.ip(&format!("link set {b} up"));
    }
    let pods = (0..4)
        .map(|i| {
            let pod = Ns::new(&tag, &format!("p{i}"));
            host.ip(&format!(
                "link add cvtsg{i} type veth peer name eth0 netns {}",
                pod.name()
            ));
            host.ip(&format!("link set cvtsg{i} master {} up", bridge(i)));
            let m = mac(i).map(|b| format!("{b:02x}")).join(":");
            pod.ip(&format!("link set eth0 address {m}"));
            pod.ip(&format!("addr add {}/24 dev eth0", pod_ip(i)));
            pod.ip(&format!("addr add {}/64 dev eth0 nodad", pod_ip6(i)));
            pod.ip("link set eth0 up");
            pod.ip("link set lo up");
            let (gw, gw6) = if i < 3 {
                ("10.230.0.1", "fd00:230::1")
            } else {
                ("10.231.0.1", "fd00:231::1")
            };
            pod.ip(&format!("route add default via {gw}"));
            pod.ip(&format!("-6 route add default via {gw6}"));
            pod
        })
        .collect();
    Site { host, pods }
}

fn port(i: usize, groups: &[&str]) -> (String, PortFilter) {
    (
        format!("port{i}"),
        PortFilter {
            ifname: format!("cvtsg{i}"),
            bridge: bridge(i).into(),
            mac: mac(i),
            sources: vec![(mac(i), format!("{}/32", pod_ip(i)).parse().unwrap())],
            groups: groups.iter().map(|g| g.to_string()).collect(),
            stateful: true,
        },
    )
}

fn any(v6: bool, remote: Remote) -> Rule {
    Rule {
        v6,
        protocol: None,
        ports: None,
        icmp: None,
        remote,
    }
}

fn tcp(port: u16, remote: Remote) -> Rule {
    Rule {
        protocol: Some(6),
        ports: Some((port, port)),
        ..any(false, remote)
    }
}

/// Neutron's default group: members reach each other, everything may leave.
fn default_group() -> Group {
    Group {
        ingress: vec![any(false, Remote::Group("default".into()))],
        egress: vec![any(false, Remote::Any), any(true, Remote::Any)],
    }
}

fn addr(i: usize) -> IpAddr {
    pod_ip(i).parse().unwrap()
}

/// Pods 0 and 1 in the default group; 1 also open to TCP 80 from bridge b's subnet.
fn two_members() -> Want {
    let mut w = Want::default();
    w.ports
        .extend([port(0, &["default"]), port(1, &["default", "web"])]);
    w.groups.insert("default".into(), default_group());
    w.groups.insert(
        "web".into(),
        Group {
            ingress: vec![tcp(80, Remote::Prefix("10.231.0.0/24".parse().unwrap()))],
            egress: vec![],
        },
    );
    w.members
        .insert("default".into(), [addr(0), addr(1)].into_iter().collect());
    w
}

fn sync(s: &Site, sg: &mut SecurityGroups, w: &Want) -> Report {
    s.host.open().run(|| sg.sync(w)).unwrap().unwrap()
}

fn ping(s: &Site, from: usize, to: usize) -> bool {
    s.pods[from].ping(&pod_ip(to))
}

#[test]
fn groups_let_members_and_their_rules_through_and_nothing_else() {
    let s = site("sm");
    let mut sg = s.host.open().run(SecurityGroups::open).unwrap().unwrap();
    let report = sync(&s, &mut sg, &two_members());
    assert_eq!(report.ports, 2);
    // Listed as anyone debugging the host reads it: names, not empty strings.
    let out = s
        .host
        .command("nft")
        .args(["list", "ruleset"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains(r#""cvtsg1" : jump sg-i-port1"#), "{listed}");
    assert!(
        listed.contains("iifname . ether saddr vmap @sg-from"),
        "{listed}"
    );
    // Members reach each other, on one bridge.
    assert!(ping(&s, 0, 1));
    assert!(ping(&s, 1, 0));
    // An unfiltered pod is not let in, but a member reaching it hears the replies.
    assert!(!ping(&s, 2, 1));
    assert!(ping(&s, 1, 2));
    // The host is no member either; what a member sends it passes.
    assert!(!s.host.ping(&pod_ip(0)));
    assert!(s.pods[0].ping("10.230.0.1"));
    // TCP 80 from the routed subnet reaches pod 1 alone, and no other port of it.
    let _web = s.pods[1].serve_name("web", 80);
    let _other = s.pods[1].serve_name("other", 81);
    let _web0 = s.pods[0].serve_name("web0", 80);
    assert_eq!(s.pods[3].connect(&pod_ip(1), 80, 1, false), ["web"]);
    assert_eq!(s.pods[3].connect(&pod_ip(1), 81, 1, false), ["timeout"]);
    assert_eq!(s.pods[3].connect(&pod_ip(0), 80, 1, false), ["timeout"]);
    assert!(!ping(&s, 3, 1));

    // Pod 2 joins the default group's members: one element, no port rewritten.
    let mut w = two_members();
    w.members.get_mut("default").unwrap().insert(addr(2));
    let report = sync(&s, &mut sg, &w);
    assert_eq!(
        report,
        Report {
            ports: 0,
            groups: 0,
            members: 1
        }
    );
    assert!(ping(&s, 2, 1));
    // And leaves: new connections follow at once.
    let report = sync(&s, &mut sg, &two_members());
    assert_eq!(report.members, 1);
    assert!(!ping(&s, 2, 1));

    // Port security off (the port out of the filter): anyone reaches it.
    let mut w = two_members();
    w.ports.remove("port1");
    assert_eq!(sync(&s, &mut sg, &w).ports, 1);
    assert!(ping(&s, 2, 1));
    assert!(s.host.ping(&pod_ip(1)));
    // A group dropped from a port takes its rules with it.
    let mut w = two_members();
    w.ports.get_mut("port1").unwrap().groups = vec!["default".into()];
    w.groups.remove("web");
    let report = sync(&s, &mut sg, &w);
    assert_eq!((report.ports, report.groups), (1, 1));
    assert_eq!(s.pods[3].connect(&pod_ip(1), 80, 1, false), ["timeout"]);
    assert!(ping(&s, 0, 1));
}

#[test]
fn ipv6_is_filtered_as_ipv4_is() {
    let s = site("s6");
    let mut sg = s.host.open().run(SecurityGroups::open).unwrap().unwrap();
    let mut w = Want::default();
    for i in [0, 1] {
        let (id, mut p) = port(i, &["default"]);
        p.sources
            .push((mac(i), format!("{}/128", pod_ip6(i)).parse().unwrap()));
        w.ports.insert(id, p);
    }
    w.groups.insert(
        "default".into(),
        Group {
            ingress: vec![any(true, Remote::Group("default".into()))],
            egress: vec![any(true, Remote::Any)],
        },
    );
    let v6 = |i: usize| pod_ip6(i).parse::<IpAddr>().unwrap();
    w.members
        .insert("default".into(), [v6(0), v6(1)].into_iter().collect());
    sync(&s, &mut sg, &w);
    let ping6 = |from: usize, to: usize| s.pods[from].ping(&pod_ip6(to));
    // Neighbour discovery passes both ways; members reach each other, bridged.
    assert!(ping6(0, 1));
    assert!(ping6(1, 0));
    // Outsiders, bridged and routed, do not get in; what a member starts comes back.
    assert!(!ping6(2, 1));
    assert!(!ping6(3, 1));
    assert!(ping6(1, 2));
    assert!(ping6(1, 3));
    // IPv4 has no rule in this group: nothing of it gets in.
    assert!(!ping(&s, 0, 1));
}

#[test]
fn a_port_sends_only_as_itself() {
    let s = site("ss");
    let mut sg = s.host.open().run(SecurityGroups::open).unwrap().unwrap();
    let mut w = two_members();
    w.groups
        .get_mut("default")
        .unwrap()
        .ingress
        .push(any(false, Remote::Any));
    sync(&s, &mut sg, &w);
    assert!(ping(&s, 0, 2));
    // Another address on the same interface: what it sends from there goes nowhere.
    s.pods[0].ip("addr add 10.230.0.99/24 dev eth0");
    assert!(!s.pods[0].ping_from("10.230.0.99", &pod_ip(2)));
    // Unless it is an allowed address pair.
    w.ports
        .get_mut("port0")
        .unwrap()
        .sources
        .push((mac(0), "10.230.0.96/29".parse().unwrap()));
    sync(&s, &mut sg, &w);
    assert!(s.pods[0].ping_from("10.230.0.99", &pod_ip(2)));
    // Another MAC: nothing at all.
    s.pods[0].ip("link set eth0 address 02:00:00:00:00:99");
    s.pods[0].ip("neigh flush dev eth0");
    assert!(!ping(&s, 0, 2));
    // An unfiltered port sends as it likes.
    s.pods[2].ip("addr add 10.230.0.98/24 dev eth0");
    assert!(s.pods[2].ping_from("10.230.0.98", &pod_ip(3)));
}

#[test]
fn a_pairs_mac_is_held_to_the_ports_egress_rules() {
    let s = site("sp");
    let mut sg = s.host.open().run(SecurityGroups::open).unwrap().unwrap();
    let mut w = Want::default();
    let (id, mut p) = port(0, &["narrow"]);
    let pair_mac = [2, 0, 0, 0, 0, 0x97];
    p.sources
        .push((pair_mac, "10.230.0.97/32".parse().unwrap()));
    w.ports.insert(id, p);
    // Egress to TCP 443 alone.
    w.groups.insert(
        "narrow".into(),
        Group {
            ingress: vec![],
            egress: vec![tcp(443, Remote::Any)],
        },
    );
    sync(&s, &mut sg, &w);
    assert!(!ping(&s, 0, 2));
    // Sent from the pair's MAC and address: the same rules, not none.
    s.pods[0].ip("link set eth0 address 02:00:00:00:00:97");
    s.pods[0].ip("addr add 10.230.0.97/24 dev eth0");
    assert!(!s.pods[0].ping_from("10.230.0.97", &pod_ip(2)));
    // And when the rules allow it, it passes: the pair is the port's own.
    w.groups
        .get_mut("narrow")
        .unwrap()
        .egress
        .push(any(false, Remote::Any));
    sync(&s, &mut sg, &w);
    assert!(s.pods[0].ping_from("10.230.0.97", &pod_ip(2)));
}

/// Sends a router advertisement from `pod` to all nodes on its link.
fn advertise(pod: &Ns) {
    let script = "import socket\n\
        s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)\n\
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)\n\
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, socket.if_nametoindex('eth0'))\n\
        ra = bytes([134, 0, 0, 0, 64, 0, 0, 0]) + bytes(8)\n\
        for _ in range(3):\n\
        \x20   s.sendto(ra, ('ff02::1', 0, 0, socket.if_nametoindex('eth0')))\n";
    let out = pod
        .command("python3")
        .args(["-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// Whether `pod` hears a router advertisement while `during` runs.
fn hears_an_advertisement(pod: &Ns, during: impl FnOnce()) -> bool {
    let script = "import socket\n\
        s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)\n\
        s.settimeout(2)\n\
        print('ready', flush=True)\n\
        try:\n\
        \x20   while s.recv(1500)[0] != 134:\n\
        \x20       pass\n\
        \x20   print('heard')\n\
        except OSError:\n\
        \x20   print('nothing')\n";
    let (_listener, mut out) = pod.python_ready(script);
    during();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    line.trim() == "heard"
}

#[test]
fn a_port_sends_no_router_advertisements() {
    let s = site("sr");
    let mut sg = s.host.open().run(SecurityGroups::open).unwrap().unwrap();
    let mut w = Want::default();
    let (id, mut p) = port(0, &["open"]);
    p.sources
        .push((mac(0), format!("{}/128", pod_ip6(0)).parse().unwrap()));
    w.ports.insert(id, p);
    w.groups.insert(
        "open".into(),
        Group {
            ingress: vec![],
            egress: vec![any(true, Remote::Any)],
        },
    );
    sync(&s, &mut sg, &w);
    // An unfiltered pod's advertisement is heard: the listener works.
    assert!(hears_an_advertisement(&s.pods[2], || advertise(&s.pods[1])));
    // A filtered port's is not, though its egress lets any IPv6 out.
    assert!(!hears_an_advertisement(&s.pods[2], || advertise(
        &s.pods[0]
    )));
    assert!(s.pods[0].ping(&pod_ip6(2)));
}

#[test]
fn stateless_groups_need_both_directions() {
    let s = site("sl");
    let mut sg = s.host.open().run(SecurityGroups::open).unwrap().unwrap();
    let icmp = |v6| Rule {
        protocol: Some(1),
        ..any(v6, Remote::Any)
    };
    let mut w = Want::default();
    let (id, mut p) = port(1, &["sl"]);
    p.stateful = false;
    w.ports.insert(id, p);
    w.groups.insert(
        "sl".into(),
        Group {
            ingress: vec![icmp(false)],
            egress: vec![icmp(false)],
        },
    );
    sync(&s, &mut sg, &w);
    assert!(ping(&s, 0, 1));
    // Without its egress rule, the reply finds no connection to belong to.
    w.groups.get_mut("sl").unwrap().egress.clear();
    sync(&s, &mut sg, &w);
    assert!(!ping(&s, 0, 1));
    // The same rules stateful: the reply passes.
    w.ports.get_mut("port1").unwrap().stateful = true;
    sync(&s, &mut sg, &w);
    assert!(ping(&s, 0, 1));
}

#[test]
fn a_new_owner_starts_over_and_a_failed_sync_changes_nothing() {
    let s = site("so");
    let mut sg = s.host.open().run(SecurityGroups::open).unwrap().unwrap();
    sync(&s, &mut sg, &two_members());
    assert!(!ping(&s, 2, 1));
    // A rule naming a group whose members are not given: refused whole.
    let mut bad = two_members();
    bad.groups
        .get_mut("web")
        .unwrap()
        .ingress
        .push(any(false, Remote::Group("nobody".into())));
    bad.ports.remove("port0");
    assert!(s.host.open().run(|| sg.sync(&bad)).unwrap().is_err());
    assert!(!ping(&s, 2, 0));
    assert!(ping(&s, 0, 1));
    // The next sync starts again from nothing and holds what it is given.
    sync(&s, &mut sg, &two_members());
    assert!(ping(&s, 0, 1));
    // Tables flushed by someone else (`nft flush ruleset`): the check sees it and the
    // same sync makes them again.
    let out = s
        .host
        .command("nft")
        .args(["delete", "table", "bridge", "corvid-sg"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(ping(&s, 2, 1));
    s.host.open().run(|| sg.check()).unwrap().unwrap();
    sync(&s, &mut sg, &two_members());
    assert!(!ping(&s, 2, 1));
    // A restarted agent's first sync replaces what the last one left.
    let mut fresh = s.host.open().run(SecurityGroups::open).unwrap().unwrap();
    sync(&s, &mut fresh, &Want::default());
    assert!(ping(&s, 2, 1));
    s.host.open().run(|| fresh.remove()).unwrap().unwrap();
    let out = s
        .host
        .command("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("corvid-sg"));
}
