//! The routing filter for real (as root): a private host namespace holding three bridges
//! with their gateways, one pod namespace on each; the host routes between the bridges
//! only as the filter's routers say, and the masquerade of the agent's networks leaves
//! routed traffic alone.

#[path = "../../corvid/tests/support/ns.rs"]
mod ns;

use corvid_net::nftables::masquerade::set_network_masquerade;
use corvid_net::nftables::routing::Routing;
use ns::Ns;
use std::collections::BTreeMap;

struct Site {
    host: Ns,
    pods: Vec<Ns>,
}

const BRIDGES: [&str; 3] = ["cvbtesta", "cvbtestb", "cvbtestc"];

fn pod_ip(i: usize) -> String {
    format!("10.21{i}.0.5")
}

fn site(name: &str) -> Site {
    let tag = format!("cvt{}{name}", std::process::id());
    let host = Ns::new(&tag, "h");
    host.open()
        .run(|| corvid_net::sysctl::set("net/ipv4/ip_forward", "1").unwrap())
        .unwrap();
    let pods = BRIDGES
        .iter()
        .enumerate()
        .map(|(i, bridge)| {
            host.ip(&format!("link add {bridge} type bridge"));
            host.ip(&format!("addr add 10.21{i}.0.1/24 dev {bridge}"));
            host.ip(&format!("link set {bridge} up"));
            let pod = Ns::new(&tag, &format!("p{i}"));
            host.ip(&format!(
                "link add cvtrv{i} type veth peer name eth0 netns {}",
                pod.name()
            ));
            host.ip(&format!("link set cvtrv{i} master {bridge} up"));
            pod.ip(&format!("addr add {}/24 dev eth0", pod_ip(i)));
            pod.ip("link set eth0 up");
            pod.ip(&format!("route add default via 10.21{i}.0.1"));
            pod
        })
        .collect();
    Site { host, pods }
}

/// Who reaches whom, as a 3x3 table of pings (the diagonal left out).
fn reach(s: &Site) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (i, pod) in s.pods.iter().enumerate() {
        for j in 0..s.pods.len() {
            if i != j && pod.ping(&pod_ip(j)) {
                out.push((i, j));
            }
        }
    }
    out
}

fn want(routers: [Option<&str>; 3]) -> BTreeMap<String, Option<String>> {
    BRIDGES
        .iter()
        .zip(routers)
        .map(|(b, r)| (b.to_string(), r.map(str::to_string)))
        .collect()
}

#[test]
fn only_bridges_on_one_router_reach_each_other() {
    let s = site("ro");
    // No filter yet: the host routes between every pair.
    assert_eq!(reach(&s).len(), 6);
    let mut routing = s.host.open().run(Routing::open).unwrap().unwrap();
    let mut nl = s.host.netlink();
    let mut sync =
        |routing: &mut Routing, w| s.host.open().run(|| routing.sync(&mut nl, &w)).unwrap();
    sync(&mut routing, want([Some("r1"), Some("r1"), None])).unwrap();
    assert_eq!(reach(&s), vec![(0, 1), (1, 0)]);
    // b moves to its own router: nobody reaches anybody; c joins a's router.
    sync(&mut routing, want([Some("r1"), Some("r2"), Some("r1")])).unwrap();
    assert_eq!(reach(&s), vec![(0, 2), (2, 0)]);
    // A bridge the filter does not name is left alone: it reaches and is reached.
    let mut two = want([Some("r1"), Some("r2"), None]);
    two.remove(BRIDGES[2]);
    sync(&mut routing, two).unwrap();
    assert_eq!(reach(&s), vec![(0, 2), (1, 2), (2, 0), (2, 1)]);
    // A new owner (an agent restarted) starts from what it wants, not what was there.
    let mut fresh = s.host.open().run(Routing::open).unwrap().unwrap();
    sync(&mut fresh, want([None, None, None])).unwrap();
    assert!(reach(&s).is_empty());
}

#[test]
fn routed_traffic_keeps_its_source_where_networks_masquerade() {
    let s = site("rm");
    let mut routing = s.host.open().run(Routing::open).unwrap().unwrap();
    let mut nl = s.host.netlink();
    s.host
        .open()
        .run(|| {
            routing.sync(&mut nl, &want([Some("r1"), Some("r1"), None]))?;
            let subnet = "10.210.0.0/24".parse().unwrap();
            set_network_masquerade(&[("net-a", &[subnet])], &[])
        })
        .unwrap()
        .unwrap();
    let _server = s.pods[1].serve_name("@peer", 8080);
    assert_eq!(s.pods[0].connect(&pod_ip(1), 8080, 1, false), [pod_ip(0)]);
}
