//! Pod to pod across two simulated hosts over corvid's VXLAN overlay, against host to
//! host on the underlay it rides (a veth pair each way through the lan's bridge), taking
//! turns in each round: iperf3 TCP throughput. Beside them the floor of the overlay
//! itself: the same devices made bare (pods' veths, a bridge and a vxlan device per host,
//! static forwarding entries) in private namespaces with no nftables and no bridge
//! netfilter hooks; and, the floor of a routed mode, the same hosts routing two more pods
//! to each other without encapsulation (each pod a /32 behind its host's veth, the
//! remote one via the other host's underlay address); and corvid's direct routing (a
//! second cluster whose agents run `--direct-routing`) against its own hosts' underlay,
//! then both clusters' pods again on hosts whose administrator keeps bridged frames out
//! of iptables (`bridge-nf-call-iptables` 0; br_netfilter's default is 1), where the
//! agents, serving no service or filter, hook none of their bridges. Prints the medians
//! and ratios.
//!
//! Needs root and iperf3. `cargo bench -p corvid --bench underlay`
//! (`CORVID_BENCH_ROUNDS`, default 7).

#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::time::Duration;

use cluster::ns::{median, wait_until, Ns, Proc};
use cluster::{cni_result, result_ip, underlay_ip, Cluster};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds: usize = std::env::var("CORVID_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let cluster = Cluster::new("bu");
    let (a, ip_b, _servers) = pods_across(&cluster);
    let host_b = underlay_ip(1);
    let mut direct = Cluster::new("bd");
    for i in 0..2 {
        direct.agents[i].take();
        direct.start_agent_with(i, &["--direct-routing"]);
    }
    let (c, ip_d, _direct_servers) = pods_across(&direct);
    let bare = BareOverlay::new(&cluster.tag);
    // iperf3 listens a moment after it starts.
    std::thread::sleep(Duration::from_millis(300));

    let [mut overlay, mut floor, mut routed, mut underlay, mut direct_pods, mut direct_underlay] =
        [(); 6].map(|_| Vec::new());
    for _ in 0..rounds {
        overlay.push(a.iperf(&ip_b));
        floor.push(bare.pods[0].iperf(BareOverlay::SERVER));
        routed.push(bare.routed[0].iperf(BareOverlay::ROUTED_SERVER));
        underlay.push(cluster.hosts[0].iperf(&host_b));
        direct_pods.push(c.iperf(&ip_d));
        direct_underlay.push(direct.hosts[0].iperf(&host_b));
    }
    let (overlay, floor) = (median(overlay), median(floor));
    let (routed, underlay) = (median(routed), median(underlay));
    let (direct_pods, direct_underlay) = (median(direct_pods), median(direct_underlay));
    // Hosts whose administrator turned the namespace's hooks off: the agents, serving no
    // service or filter here, leave their bridges unhooked.
    let hooks = |on: &str| {
        for h in cluster.hosts.iter().chain(&direct.hosts) {
            h.open()
                .run(|| corvid_net::sysctl::set("net/bridge/bridge-nf-call-iptables", on))
                .unwrap()
                .unwrap();
        }
    };
    hooks("0");
    let [mut unhooked_overlay, mut unhooked_overlay_underlay, mut unhooked, mut unhooked_underlay] =
        [(); 4].map(|_| Vec::new());
    for _ in 0..rounds {
        unhooked_overlay.push(a.iperf(&ip_b));
        unhooked_overlay_underlay.push(cluster.hosts[0].iperf(&host_b));
        unhooked.push(c.iperf(&ip_d));
        unhooked_underlay.push(direct.hosts[0].iperf(&host_b));
    }
    hooks("1");
    let (unhooked_overlay, unhooked_overlay_underlay) =
        (median(unhooked_overlay), median(unhooked_overlay_underlay));
    let (unhooked, unhooked_underlay) = (median(unhooked), median(unhooked_underlay));
    println!(
        "across two hosts, iperf3 TCP 2 s, taking turns ({rounds} rounds, medians, {} cores)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for (what, gbits) in [
        ("corvid: pod to pod over VXLAN", overlay),
        ("bare kernel: pod to pod over VXLAN", floor),
        ("bare kernel: pod to pod routed, no VXLAN", routed),
        ("host to host on the underlay", underlay),
        ("corvid: pod to pod, direct routing", direct_pods),
        ("host to host on its underlay", direct_underlay),
        ("hooks off: corvid, pod to pod over VXLAN", unhooked_overlay),
        ("its underlay then", unhooked_overlay_underlay),
        ("hooks off: corvid, direct routing", unhooked),
        ("its underlay then", unhooked_underlay),
    ] {
        println!("{what:<44} {gbits:>8.2} Gbit/s");
    }
    println!(
        "VXLAN: corvid/underlay {:.3} (target >= 0.85), {:.3} on hosts whose bridge-nf-call-iptables is 0; bare/underlay {:.3}, corvid/bare {:.3}",
        overlay / underlay,
        unhooked_overlay / unhooked_overlay_underlay,
        floor / underlay,
        overlay / floor
    );
    println!(
        "direct routing: corvid/its underlay {:.3} (target >= 0.97), {:.3} on hosts whose bridge-nf-call-iptables is 0; the routed floor: bare routed/underlay {:.3}",
        direct_pods / direct_underlay,
        unhooked / unhooked_underlay,
        routed / underlay
    );
}

/// A pod on each of the cluster's hosts on one network: the first, the second's address,
/// and iperf3 servers on the second pod and its host, once the pods reach each other.
fn pods_across(cluster: &Cluster) -> (Ns, String, [Proc; 2]) {
    cluster.network("red", "10.90.0.0/24", false);
    let (a, b) = (cluster.pod("a"), cluster.pod("b"));
    cni_result(&cluster.add(0, "red", &a));
    let ip_b = result_ip(&cni_result(&cluster.add(1, "red", &b)));
    let servers = [b.serve_iperf(), cluster.hosts[1].serve_iperf()];
    wait_until(
        "the pods to reach each other",
        Duration::from_secs(20),
        || a.ping(&ip_b),
    );
    (a, ip_b, servers)
}

/// Two hosts on a lan bridge, each with a bridge, a vxlan device (VNI 42, forwarding
/// everything to the other host) and a pod, all made by hand: the overlay's floor; and
/// a routed pod each, reached without encapsulation.
struct BareOverlay {
    // Dropped in this order: the servers, the pods, the hosts, the lan.
    _servers: [Proc; 2],
    pods: Vec<Ns>,
    routed: Vec<Ns>,
    _hosts: Vec<Ns>,
    _lan: Ns,
}

impl BareOverlay {
    const SERVER: &'static str = "10.93.0.2";
    const ROUTED_SERVER: &'static str = "10.93.9.2";

    fn new(tag: &str) -> BareOverlay {
        let lan = Ns::new(tag, "ol");
        lan.ip("link add cvtol type bridge");
        lan.ip("link set cvtol up");
        let (mut hosts, mut pods, mut routed) = (Vec::new(), Vec::new(), Vec::new());
        for i in 1..=2 {
            let host = Ns::new(tag, &format!("oh{i}"));
            lan.ip(&format!(
                "link add cvtolv{i} type veth peer name eth0 netns {}",
                host.name()
            ));
            lan.ip(&format!("link set cvtolv{i} master cvtol up"));
            host.ip(&format!("addr add 10.98.1.{i}/24 dev eth0"));
            host.ip("link set eth0 up");
            host.open()
                .run(|| {
                    corvid_net::sysctl::set("net/ipv4/ip_forward", "1").unwrap();
                    // What a host with br_netfilter loaded does by default, undone: the
                    // floor has no hooks on bridged frames (none to undo without it).
                    let _ = corvid_net::sysctl::set("net/bridge/bridge-nf-call-iptables", "0");
                })
                .unwrap();
            host.ip("link add cvtob type bridge");
            host.ip(&format!(
                "link add cvtox type vxlan id 42 local 10.98.1.{i} dstport 4789 nolearning dev eth0"
            ));
            host.ip("link set cvtox master cvtob up");
            host.ip("link set cvtox type bridge_slave learning off");
            let other = 3 - i;
            let fdb = host
                .command("bridge")
                .args(["fdb", "append", "00:00:00:00:00:00", "dev", "cvtox", "dst"])
                .arg(format!("10.98.1.{other}"))
                .status()
                .unwrap();
            assert!(fdb.success());
            host.ip("link set cvtob up");
            let pod = Ns::new(tag, &format!("op{i}"));
            host.ip(&format!(
                "link add cvtop type veth peer name eth0 netns {}",
                pod.name()
            ));
            host.ip("link set cvtop mtu 1450 master cvtob up");
            pod.ip("link set eth0 mtu 1450");
            pod.ip(&format!("addr add 10.93.0.{i}/24 dev eth0"));
            pod.ip("link set eth0 up");
            // The routed pod: its /32 behind the host's veth, its gateway the veth's
            // address-less end; the other's /32 via the other host.
            let r = Ns::new(tag, &format!("or{i}"));
            host.ip(&format!(
                "link add cvtor type veth peer name eth0 netns {}",
                r.name()
            ));
            host.ip("link set cvtor up");
            host.ip(&format!("route add 10.93.9.{i}/32 dev cvtor"));
            host.ip(&format!("route add 10.93.9.{other}/32 via 10.98.1.{other}"));
            r.ip(&format!("addr add 10.93.9.{i}/32 dev eth0"));
            r.ip("link set eth0 up");
            r.ip("route add 169.254.1.1 dev eth0");
            // No ARP for the gateway: its neighbour entry is given.
            let mac = host.netlink().link_by_name("cvtor").unwrap().unwrap().mac;
            r.ip(&format!("neigh add 169.254.1.1 lladdr {mac} dev eth0"));
            r.ip("route add default via 169.254.1.1 dev eth0");
            hosts.push(host);
            pods.push(pod);
            routed.push(r);
        }
        let servers = [pods[1].serve_iperf(), routed[1].serve_iperf()];
        wait_until("the bare pods to answer", Duration::from_secs(10), || {
            pods[0].ping(Self::SERVER) && routed[0].ping(Self::ROUTED_SERVER)
        });
        BareOverlay {
            _servers: servers,
            pods,
            routed,
            _hosts: hosts,
            _lan: lan,
        }
    }
}
