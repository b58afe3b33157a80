//! Routers on two simulated hosts, in one run:
//! - pod-to-pod across hosts through a router (red to green) against the same network
//!   (red to red), taking turns: iperf3 TCP throughput, and TCP connections per second;
//! - a router interface added until the first packet a pod on another host sends is
//!   routed and answered;
//! - the agent's work for one interface change while 10, 100 and 1,000 networks (up to
//!   `CORVID_BENCH_NETWORKS`) hang on the router, beside the floor: the same devices
//!   (bridge, vxlan, gateway) made and removed bare through corvid-net.
//!
//! Needs root and iperf3. `cargo bench -p corvid --bench routers` (CORVID_BENCH_ROUNDS
//! sets the throughput rounds, default 5; CORVID_BENCH_NETWORKS=0 skips the scale part).

#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::io::BufRead;
use std::process::Stdio;
use std::time::{Duration, Instant};

use cluster::ns::{median, wait_until, Ns, Proc};
use cluster::{agent_work, cni_result, epoch, prober, result_ip, Cluster};
use corvid_api::requests::RouterInterface;
use corvid_api::{Network, Router, Subnet};
use serde_json::json;

const SAMPLES: usize = 15;
const METRICS: &str = "127.0.0.1:9697";

fn on(subnet: &str) -> RouterInterface {
    RouterInterface {
        subnet_id: Some(subnet.to_string()),
        port_id: None,
    }
}

/// A network with a /24 subnet (no CNI configuration); its subnet.
fn network(cluster: &Cluster, name: &str, cidr: &str) -> Subnet {
    cluster.api(|c| {
        let n: Network = c.create(json!({"name": name})).unwrap();
        c.create(json!({"network_id": n.id, "cidr": cidr, "ip_version": 4}))
            .unwrap()
    })
}

/// The i-th scale network's /24, from 172.16.0.0/12.
fn scale_cidr(i: usize) -> String {
    format!("172.{}.{}.0/24", 16 + i / 256, i % 256)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let setting = |name: &str, default: usize| -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (max, rounds) = (
        setting("CORVID_BENCH_NETWORKS", 1000),
        setting("CORVID_BENCH_ROUNDS", 5),
    );
    let mut cluster = Cluster::new("br");
    cluster.agents[0].take();
    cluster.start_agent_with(0, &["--metrics-listen", METRICS]);
    let (_, red) = cluster.network("red", "10.90.0.0/24", false);
    let (_, green) = cluster.network("green", "10.91.0.0/24", false);
    let (_, blue) = cluster.network("blue", "10.92.0.0/24", false);
    let router: Router = cluster.api(|c| {
        let r: Router = c.create(json!({"name": "bench"})).unwrap();
        for s in [&red, &green] {
            c.add_router_interface(&r.id, &on(&s.id)).unwrap();
        }
        r
    });
    let (r1, r2, g2, b2) = (
        cluster.pod("r1"),
        cluster.pod("r2"),
        cluster.pod("g2"),
        cluster.pod("b2"),
    );
    cni_result(&cluster.add(0, "red", &r1));
    let ip_r2 = result_ip(&cni_result(&cluster.add(1, "red", &r2)));
    let ip_g2 = result_ip(&cni_result(&cluster.add(1, "green", &g2)));
    let ip_b2 = result_ip(&cni_result(&cluster.add(1, "blue", &b2)));
    let mut servers = Vec::new();
    for pod in [&r2, &g2, &b2] {
        servers.push(pod.serve_name("s", 8080));
        servers.push(pod.serve_name("s", 5353));
        servers.push(pod.serve_iperf());
    }
    wait_until("red to reach green", Duration::from_secs(20), || {
        r1.connect(&ip_g2, 8080, 1, false) == ["s"]
    });

    println!("pod to pod across two hosts, taking turns ({rounds} rounds, medians)");
    let floor = BareKernel::new(&cluster.tag);
    let (mut same, mut routed) = (Vec::new(), Vec::new());
    let (mut same_rate, mut routed_rate) = (Vec::new(), Vec::new());
    let (mut bridged, mut forwarded) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        same.push(r1.iperf(&ip_r2));
        routed.push(r1.iperf(&ip_g2));
        same_rate.push(r1.connection_rate(&ip_r2));
        routed_rate.push(r1.connection_rate(&ip_g2));
        bridged.push(floor.pods[0].iperf(BareKernel::SAME));
        forwarded.push(floor.pods[0].iperf(BareKernel::ROUTED));
    }
    let (bridged, forwarded) = (median(bridged), median(forwarded));
    let (same, routed) = (median(same), median(routed));
    let (same_rate, routed_rate) = (median(same_rate), median(routed_rate));
    println!("{:<34} {:>12} {:>14}", "", "TCP Gbit/s", "connections/s");
    println!(
        "{:<34} {same:>12.2} {same_rate:>14.0}",
        "same network (red to red)"
    );
    println!(
        "{:<34} {routed:>12.2} {routed_rate:>14.0}",
        "routed (red to green)"
    );
    println!(
        "ratio routed/same: throughput {:.3}, connections {:.3} (target >= 0.95 each)",
        routed / same,
        routed_rate / same_rate
    );
    println!(
        "the floor, one bare namespace, no nftables: bridged {bridged:.2} Gbit/s, routed \
         between two bridges {forwarded:.2} Gbit/s, ratio {:.3}",
        forwarded / bridged
    );
    drop(floor);

    let mut latency = Vec::new();
    for _ in 0..SAMPLES {
        let (_probe, mut out) = prober(&r1, &ip_b2);
        let asked = epoch();
        cluster.api(|c| c.add_router_interface(&router.id, &on(&blue.id)).unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        latency.push((line.trim().parse::<f64>().unwrap() - asked) * 1e3);
        cluster.api(|c| {
            c.remove_router_interface(&router.id, &on(&blue.id))
                .unwrap()
        });
        wait_until("blue to be cut", Duration::from_secs(10), || {
            r1.connect(&ip_b2, 5353, 1, true) != ["s"]
        });
    }
    latency.sort_by(f64::total_cmp);
    println!(
        "\nrouter interface added -> first packet routed and answered across hosts, {SAMPLES} samples: \
         p50 {:.1} ms, p90 {:.1} ms (target p50 <= 20 ms)",
        latency[SAMPLES / 2],
        latency[SAMPLES * 9 / 10]
    );

    println!("\none interface change on host 1 (host 2 paused) with N networks on the router (p50 of {SAMPLES})");
    println!(
        "{:>6} {:>14} {:>12} {:>17} {:>14} {:>12}",
        "N", "agent add ms", "bare add ms", "agent remove ms", "bare remove ms", "add/bare"
    );
    let mut made = 0;
    for n in [10, 100, 1000].into_iter().filter(|n| *n <= max) {
        let subnets: Vec<Subnet> = (made..n)
            .map(|i| network(&cluster, &format!("scale{i}"), &scale_cidr(i)))
            .collect();
        cluster.api(|c| {
            for s in &subnets {
                c.add_router_interface(&router.id, &on(&s.id)).unwrap();
            }
        });
        made = n;
        let bridges = |host: &Ns| host.links(corvid_net::names::BRIDGE_PREFIX).len();
        // red, green and the scale networks.
        wait_until(
            "host 1 to hold every network",
            Duration::from_secs(600),
            || bridges(&cluster.hosts[0]) == n + 2,
        );
        let probe = network(&cluster, &format!("probe{n}"), "172.31.255.0/24");
        // Host 2's agent waits while host 1's is measured: both would make the same
        // devices at the same moment under the one RTNL lock their shared kernel has,
        // which real hosts do not share.
        let other = cluster.agents[1]
            .as_ref()
            .expect("host 2's agent runs")
            .0
            .id() as i32;
        // SAFETY: a signal to a child this process started and still holds.
        unsafe { libc::kill(other, libc::SIGSTOP) };
        let (mut add, mut remove) = (Vec::new(), Vec::new());
        let (mut bare_add, mut bare_remove) = (Vec::new(), Vec::new());
        for _ in 0..SAMPLES {
            for adding in [true, false] {
                let before = agent_work(METRICS, &cluster.hosts[0]);
                cluster.api(|c| {
                    if adding {
                        c.add_router_interface(&router.id, &on(&probe.id)).map(drop)
                    } else {
                        c.remove_router_interface(&router.id, &on(&probe.id))
                            .map(drop)
                    }
                    .unwrap()
                });
                let want = n + 2 + usize::from(adding);
                wait_until("host 1 to follow", Duration::from_secs(10), || {
                    bridges(&cluster.hosts[0]) == want
                });
                // The passes of the change: the interface port, then the router's revision.
                std::thread::sleep(Duration::from_millis(300));
                let after = agent_work(METRICS, &cluster.hosts[0]);
                let ms = (after.0 - before.0) * 1e3;
                if adding {
                    add.push(ms);
                } else {
                    remove.push(ms);
                }
            }
            let (made, removed) = bare_devices(&cluster.hosts[0]);
            bare_add.push(made);
            bare_remove.push(removed);
        }
        // SAFETY: as above.
        unsafe { libc::kill(other, libc::SIGCONT) };
        let (add, remove) = (median(add), median(remove));
        let (bare_add, bare_remove) = (median(bare_add), median(bare_remove));
        println!(
            "{n:>6} {add:>14.2} {bare_add:>12.2} {remove:>17.2} {bare_remove:>14.2} {:>12.2}",
            add / bare_add
        );
        cluster.api(|c| c.delete::<Subnet>(&probe.id)).unwrap();
    }
    for (pod, net, host) in [
        (&r1, "red", 0),
        (&r2, "red", 1),
        (&g2, "green", 1),
        (&b2, "blue", 1),
    ] {
        cluster.del(host, net, pod);
    }
}

/// The floor of routing against bridging in the bare kernel: a private host namespace
/// with two bridges and their gateways, two pods on one and one on the other, iperf3
/// servers on the last two; no nftables, no overlay.
struct BareKernel {
    // Dropped in this order: the servers, then their namespaces, then the host's.
    _servers: Vec<Proc>,
    pods: Vec<Ns>,
    _host: Ns,
}

impl BareKernel {
    const SAME: &'static str = "10.94.0.6";
    const ROUTED: &'static str = "10.95.0.5";

    fn new(tag: &str) -> BareKernel {
        let host = Ns::new(tag, "fh");
        host.open()
            .run(|| corvid_net::sysctl::set("net/ipv4/ip_forward", "1").unwrap())
            .unwrap();
        for (bridge, gateway) in [("cvtfa", "10.94.0.1/24"), ("cvtfb", "10.95.0.1/24")] {
            host.ip(&format!("link add {bridge} type bridge"));
            host.ip(&format!("addr add {gateway} dev {bridge}"));
            host.ip(&format!("link set {bridge} up"));
        }
        let pods: Vec<Ns> = [
            ("fa1", "cvtfa", "10.94.0.5"),
            ("fa2", "cvtfa", "10.94.0.6"),
            ("fb1", "cvtfb", Self::ROUTED),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, (name, bridge, ip))| {
            let pod = Ns::new(tag, name);
            host.ip(&format!(
                "link add cvtfv{i} type veth peer name eth0 netns {}",
                pod.name()
            ));
            host.ip(&format!("link set cvtfv{i} master {bridge} up"));
            pod.ip(&format!("addr add {ip}/24 dev eth0"));
            pod.ip("link set eth0 up");
            let gateway = if bridge == "cvtfa" {
                "10.94.0.1"
            } else {
                "10.95.0.1"
            };
            pod.ip(&format!("route add default via {gateway}"));
            pod
        })
        .collect();
        let servers = pods[1..]
            .iter()
            .map(|p| {
                Proc(
                    p.command("iperf3")
                        .args(["-s"])
                        .stdout(Stdio::null())
                        .spawn()
                        .unwrap(),
                )
            })
            .collect();
        wait_until("the bare pods to answer", Duration::from_secs(10), || {
            pods[0].ping(Self::SAME) && pods[0].ping(Self::ROUTED)
        });
        // iperf3 listens a moment after it starts.
        std::thread::sleep(Duration::from_millis(500));
        BareKernel {
            pods,
            _servers: servers,
            _host: host,
        }
    }
}

/// The floor of bringing a network up and down on a host: the kernel work the agent's
/// change needs, done bare through corvid-net: a bridge with a gateway and a vxlan device
/// on it, both marked with their owner, the bridge put in its router's group (the first
/// corvid gives out); milliseconds to make, and to remove.
fn bare_devices(host: &Ns) -> (f64, f64) {
    use corvid_net::binding::{ensure_bridge, ensure_gateway, mark, BridgeSpec};
    use corvid_net::overlay::VxlanSpec;
    host.open()
        .run(|| {
            let mut nl = corvid_net::Netlink::open().unwrap();
            let start = Instant::now();
            let bridge = ensure_bridge(
                &mut nl,
                &BridgeSpec {
                    name: "cvtbare0",
                    mtu: Some(1450),
                    vlan_filtering: false,
                    promisc: false,
                    alias: Some("corvid:bench:floor"),
                    ipv6: Some(false),
                },
            )
            .unwrap();
            nl.add_vxlan(&VxlanSpec {
                name: "cvtbarex0",
                vni: 999_999,
                local: "10.99.0.1".parse().unwrap(),
                master: bridge.index,
                mtu: Some(1450),
            })
            .unwrap();
            let mut vxlan = nl.link_by_name("cvtbarex0").unwrap().unwrap();
            mark(&mut nl, &mut vxlan, Some("corvid:bench:floor")).unwrap();
            ensure_gateway(&mut nl, &bridge, "172.31.254.1/24".parse().unwrap(), true).unwrap();
            nl.set_group(&bridge, 0x6376_0001).unwrap();
            let made = start.elapsed().as_secs_f64() * 1e3;
            let start = Instant::now();
            nl.delete_link(&vxlan).unwrap();
            nl.delete_link(&bridge).unwrap();
            (made, start.elapsed().as_secs_f64() * 1e3)
        })
        .unwrap()
}
