//! The agent's reconcile per change against the number of ports it holds: ports bound to
//! one host (each in a namespace of its own, spread over four networks: a Linux bridge
//! takes at most 1,024 ports) are added in waves up to `CORVID_BENCH_PORTS` (2000); after
//! each wave, single ports are created and deleted and timed from the API call to ACTIVE
//! (plug) and to the host end's removal (unplug). Flat means the last wave's medians are
//! near the first's. Beside them, the floor: the kernel deleting a bare veth pair on the
//! same bridge (the bridge forgets the port's FDB entries by walking them all). Needs root.
//!
//! `cargo bench -p corvid --bench agent_scale`

#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::time::{Duration, Instant};

use cluster::ns::Ns;
use cluster::Cluster;
use corvid_api::{Port, Status};
use serde_json::json;

/// Single changes timed after each wave.
const SAMPLES: usize = 15;
/// Networks the ports are spread over.
const NETWORKS: usize = 4;

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn port_attrs(net: &str, pod: &Ns) -> serde_json::Value {
    json!({"network_id": net, "binding:host_id": "h1", "veth_name": "eth0",
        "network_ns": pod.path.display().to_string()})
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let max: usize = std::env::var("CORVID_BENCH_PORTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let cluster = Cluster::new("as");
    let nets: Vec<String> = (0..NETWORKS)
        .map(|i| {
            let cidr = format!("10.{}.0.0/21", 64 + i);
            cluster.network(&format!("scale{i}"), &cidr, false).0.id
        })
        .collect();
    let mut pods: Vec<Ns> = Vec::new();
    let mut first: Option<(f64, f64)> = None;
    println!(
        "ports held   plug p50 ms   unplug p50 ms   (ratio to the first wave)   bare veth delete p50 ms"
    );
    let mut size = 250.min(max);
    loop {
        while pods.len() < size {
            let wave: Vec<Ns> = (pods.len()..size.min(pods.len() + 100))
                .map(|i| cluster.pod(&format!("s{i}")))
                .collect();
            let first = pods.len();
            let attrs = wave
                .iter()
                .enumerate()
                .map(|(i, p)| port_attrs(&nets[(first + i) % NETWORKS], p))
                .collect();
            cluster.api(|c| c.create_bulk::<Port>(attrs)).unwrap();
            pods.extend(wave);
        }
        let all_active = || {
            cluster
                .ports()
                .iter()
                .filter(|p| p.status == Status::Active)
                .count()
                >= size
        };
        let start = Instant::now();
        while !all_active() {
            assert!(
                start.elapsed() < Duration::from_secs(600),
                "wave never plugged"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let (mut plug, mut unplug) = (Vec::new(), Vec::new());
        for i in 0..SAMPLES {
            let pod = cluster.pod(&format!("x{size}-{i}"));
            let t = Instant::now();
            let port: Port = cluster
                .api(|c| c.create(port_attrs(&nets[i % NETWORKS], &pod)))
                .unwrap();
            while cluster.api(|c| c.get::<Port>(&port.id)).unwrap().status != Status::Active {
                std::thread::sleep(Duration::from_millis(2));
            }
            plug.push(t.elapsed());
            let host_end = corvid_net::names::host_veth(&port.id);
            let t = Instant::now();
            cluster.api(|c| c.delete::<Port>(&port.id)).unwrap();
            while cluster.hosts[0]
                .netlink()
                .link_by_name(&host_end)
                .unwrap()
                .is_some()
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            unplug.push(t.elapsed());
        }
        let bridge = corvid_net::names::bridge(&nets[0]);
        let mut floor = Vec::new();
        let mut nl = cluster.hosts[0].netlink();
        for i in 0..SAMPLES {
            let name = format!("cvtfl{i}");
            cluster.hosts[0].ip(&format!(
                "link add {name} master {bridge} type veth peer name cvtfp{i}"
            ));
            cluster.hosts[0].ip(&format!("link set {name} up"));
            let link = nl.link_by_name(&name).unwrap().unwrap();
            // Timed as the unplug is: from the request until the name is gone.
            let mut deleter = cluster.hosts[0].netlink();
            let t = Instant::now();
            let deleting = std::thread::spawn(move || deleter.delete_link(&link).unwrap());
            while nl.link_by_name(&name).unwrap().is_some() {
                std::thread::sleep(Duration::from_micros(200));
            }
            floor.push(t.elapsed());
            deleting.join().unwrap();
        }
        let (p, u, f) = (median(plug), median(unplug), median(floor));
        let (p0, u0) = *first.get_or_insert((p, u));
        println!(
            "{size:>10}   {p:>11.1}   {u:>13.1}   (x{:.2}, x{:.2})   {f:>23.1}",
            p / p0,
            u / u0
        );
        if size >= max {
            break;
        }
        size = (size * 2).min(max);
    }
}
