//! Pod to pod across two simulated hosts over corvid's VXLAN overlay, against host to
//! host on the underlay it rides (a veth pair each way through the lan's bridge), taking
//! turns in each round: iperf3 TCP throughput. Beside them the floor of the overlay
//! itself: the same devices made bare (pods' veths, a bridge and a vxlan device per host,
//! static forwarding entries) in private namespaces with no nftables and no bridge
//! netfilter hooks. Prints the medians and their ratios.
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
    cluster.network("red", "10.90.0.0/24", false);
    let (a, b) = (cluster.pod("a"), cluster.pod("b"));
    cni_result(&cluster.add(0, "red", &a));
    let ip_b = result_ip(&cni_result(&cluster.add(1, "red", &b)));
    let _servers = [b.serve_iperf(), cluster.hosts[1].serve_iperf()];
    wait_until(
        "the pods to reach each other",
        Duration::from_secs(20),
        || a.ping(&ip_b),
    );
    let host_b = underlay_ip(1);
    let bare = BareOverlay::new(&cluster.tag);
    // iperf3 listens a moment after it starts.
    std::thread::sleep(Duration::from_millis(300));

    let (mut overlay, mut floor, mut underlay) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        overlay.push(a.iperf(&ip_b));
        floor.push(bare.pods[0].iperf(BareOverlay::SERVER));
        underlay.push(cluster.hosts[0].iperf(&host_b));
    }
    let (overlay, floor, underlay) = (median(overlay), median(floor), median(underlay));
    println!(
        "across two hosts, iperf3 TCP 2 s, taking turns ({rounds} rounds, medians, {} cores)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:<44} {overlay:>8.2} Gbit/s",
        "corvid: pod to pod over VXLAN"
    );
    println!(
        "{:<44} {floor:>8.2} Gbit/s",
        "bare kernel: pod to pod over VXLAN"
    );
    println!(
        "{:<44} {underlay:>8.2} Gbit/s",
        "host to host on the underlay"
    );
    println!(
        "ratios: corvid/underlay {:.3} (target >= 0.85), bare/underlay {:.3}, corvid/bare {:.3}",
        overlay / underlay,
        floor / underlay,
        overlay / floor
    );
}

/// Two hosts on a lan bridge, each with a bridge, a vxlan device (VNI 42, forwarding
/// everything to the other host) and a pod, all made by hand: the overlay's floor.
struct BareOverlay {
    // Dropped in this order: the server, the pods, the hosts, the lan.
    _server: Proc,
    pods: Vec<Ns>,
    _hosts: Vec<Ns>,
    _lan: Ns,
}

impl BareOverlay {
    const SERVER: &'static str = "10.93.0.2";

    fn new(tag: &str) -> BareOverlay {
        let lan = Ns::new(tag, "ol");
        lan.ip("link add cvtol type bridge");
        lan.ip("link set cvtol up");
        let (mut hosts, mut pods) = (Vec::new(), Vec::new());
        for i in 1..=2 {
            let host = Ns::new(tag, &format!("oh{i}"));
            lan.ip(&format!(
                "link add cvtolv{i} type veth peer name eth0 netns {}",
                host.name()
            ));
            lan.ip(&format!("link set cvtolv{i} master cvtol up"));
            host.ip(&format!("addr add 10.98.1.{i}/24 dev eth0"));
            host.ip("link set eth0 up");
            // What a host with br_netfilter loaded does by default, undone: the floor
            // has no hooks on bridged frames.
            let _ = host
                .command("sysctl")
                .args(["-qw", "net.bridge.bridge-nf-call-iptables=0"])
                .status();
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
            hosts.push(host);
            pods.push(pod);
        }
        let server = pods[1].serve_iperf();
        wait_until("the bare pods to answer", Duration::from_secs(10), || {
            pods[0].ping(Self::SERVER)
        });
        BareOverlay {
            _server: server,
            pods,
            _hosts: hosts,
            _lan: lan,
        }
    }
}
