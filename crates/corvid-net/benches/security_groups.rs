//! The security groups' datapath cost, in one run, taking turns: two pods on one bridge
//! whose server is filtered by a policy of 100 ingress rules, the last one letting in
//! the members of a group of 1,000 (the client among them), against two pods on the same
//! bridge that no group filters (port security off: they still pass the tables' base
//! chains), and the floor, two pods of a namespace with no tables at all. iperf3 TCP
//! throughput and TCP connections per second, medians.
//!
//! Needs root and iperf3. `cargo bench -p corvid-net --bench security_groups`
//! (CORVID_BENCH_ROUNDS sets the rounds, default 5).

#[path = "../../corvid/tests/support/ns.rs"]
mod ns;

use std::net::{IpAddr, Ipv4Addr};

use corvid_net::nftables::security_groups::{
    Group, PortFilter, Remote, Rule, SecurityGroups, Want,
};
use ns::{median, Ns, Proc};

/// A host namespace with one bridge and pods on it, each serving iperf3 and port 8080.
struct Site {
    host: Ns,
    pods: Vec<Ns>,
    _servers: Vec<Proc>,
}

fn pod_ip(site: u8, i: usize) -> String {
    format!("10.24{site}.0.{}", 10 + i)
}

fn mac(i: usize) -> [u8; 6] {
    [2, 0, 0, 0, 0x24, 0x10 + i as u8]
}

fn site(tag: &str, n: u8, pods: usize) -> Site {
    let host = Ns::new(tag, &format!("h{n}"));
    host.ip("link set lo up");
    host.open()
        .run(|| corvid_net::sysctl::set("net/bridge/bridge-nf-call-iptables", "1").unwrap())
        .unwrap();
    host.ip("link add cvbsgbench type bridge");
    host.ip(&format!("addr add 10.24{n}.0.1/24 dev cvbsgbench"));
    host.ip("link set cvbsgbench up");
    let mut servers = Vec::new();
    let pods = (0..pods)
        .map(|i| {
            let pod = Ns::new(tag, &format!("s{n}p{i}"));
            host.ip(&format!(
                "link add cvtsgb{i} type veth peer name eth0 netns {}",
                pod.name()
            ));
            host.ip(&format!("link set cvtsgb{i} master cvbsgbench up"));
            let m = mac(i).map(|b| format!("{b:02x}")).join(":");
            pod.ip(&format!("link set eth0 address {m}"));
            pod.ip(&format!("addr add {}/24 dev eth0", pod_ip(n, i)));
            pod.ip("link set eth0 up");
            pod.ip("link set lo up");
            servers.push(pod.serve_name("s", 8080));
            servers.push(pod.serve_iperf());
            pod
        })
        .collect();
    Site {
        host,
        pods,
        _servers: servers,
    }
}

fn port(i: usize, groups: &[&str]) -> (String, PortFilter) {
    (
        format!("port{i}"),
        PortFilter {
            ifname: format!("cvtsgb{i}"),
            bridge: "cvbsgbench".into(),
            mac: mac(i),
            sources: vec![(mac(i), format!("{}/32", pod_ip(0, i)).parse().unwrap())],
            groups: groups.iter().map(|g| g.to_string()).collect(),
            stateful: true,
        },
    )
}

/// Pod 1 (server) behind 100 ingress rules; pod 0 (client) a member of the group the
/// last rule names, with 999 other members; pods 2 and 3 unfiltered.
fn policy() -> Want {
    let any = |v6| Rule {
        v6,
        protocol: None,
        ports: None,
        icmp: None,
        remote: Remote::Any,
    };
    let mut ingress: Vec<Rule> = (0..99u16)
        .map(|i| Rule {
            protocol: Some(6),
            ports: Some((10000 + i, 10000 + i)),
            remote: Remote::Prefix(format!("10.{}.0.0/16", 100 + i % 100).parse().unwrap()),
            ..any(false)
        })
        .collect();
    ingress.push(Rule {
        remote: Remote::Group("clients".into()),
        ..any(false)
    });
    let mut w = Want::default();
    w.ports
        .extend([port(0, &["clients"]), port(1, &["policy"])]);
    w.groups.insert(
        "policy".into(),
        Group {
            ingress,
            egress: vec![any(false)],
        },
    );
    w.groups.insert(
        "clients".into(),
        Group {
            ingress: vec![],
            egress: vec![any(false)],
        },
    );
    let mut members: std::collections::BTreeSet<IpAddr> = (0..999u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a63_0000 + i)))
        .collect();
    members.insert(pod_ip(0, 0).parse().unwrap());
    w.members.insert("clients".into(), members);
    w
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds: usize = std::env::var("CORVID_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let tag = format!("cvt{}sgb", std::process::id());
    let filtered = site(&tag, 0, 4);
    let bare = site(&tag, 1, 2);
    let mut sg = filtered
        .host
        .open()
        .run(SecurityGroups::open)
        .unwrap()
        .unwrap();
    let want = policy();
    filtered
        .host
        .open()
        .run(|| sg.sync(&want))
        .unwrap()
        .unwrap();
    // The policy holds: a pod outside the group is kept out.
    assert_eq!(
        filtered.pods[2].connect(&pod_ip(0, 1), 8080, 1, false),
        ["timeout"]
    );
    let (p, b) = (&filtered.pods, &bare.pods);
    let mut through = [Vec::new(), Vec::new(), Vec::new()];
    let mut rate = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..rounds {
        through[0].push(p[0].iperf(&pod_ip(0, 1)));
        through[1].push(p[3].iperf(&pod_ip(0, 2)));
        through[2].push(b[0].iperf(&pod_ip(1, 1)));
        rate[0].push(p[0].connection_rate(&pod_ip(0, 1)));
        rate[1].push(p[3].connection_rate(&pod_ip(0, 2)));
        rate[2].push(b[0].connection_rate(&pod_ip(1, 1)));
    }
    let through = through.map(median);
    let rate = rate.map(median);
    println!("security groups' datapath, one bridge, taking turns ({rounds} rounds, medians)");
    println!("{:<52} {:>12} {:>14}", "", "TCP Gbit/s", "connections/s");
    for (i, name) in [
        "policy: 100 rules, 1,000 remote-group members",
        "no policy (port security off, tables present)",
        "floor: no tables in the namespace",
    ]
    .iter()
    .enumerate()
    {
        println!("{name:<52} {:>12.2} {:>14.0}", through[i], rate[i]);
    }
    println!(
        "ratio policy/no policy: throughput {:.3}, connections {:.3} (target >= 0.95 each)",
        through[0] / through[1],
        rate[0] / rate[1]
    );
    println!(
        "ratio no policy/floor: throughput {:.3}, connections {:.3}",
        through[1] / through[2],
        rate[1] / rate[2]
    );
}
