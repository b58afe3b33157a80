//! Services, measured three ways. Needs root.
//!
//! 1. End to end, controller and agents on two simulated hosts: a load balancer created
//!    through the Octavia API until a pod's connection to its VIP is answered, and a
//!    member deleted until ten connections in a row miss it (p50, p99).
//! 2. The agent alone, at scale: the service plan and the nftables sync for 1,000
//!    services of 3 members against 100 (the full sync of a fresh table, then one member
//!    changed at a time), in a private namespace.
//! 3. The datapath: connections per second from a pod to a VIP against the same
//!    connections straight to the member (the floor), taking turns in one run.
//!
//! `cargo bench -p corvid --bench services` (CORVID_BENCH_TRIALS, default 20;
//! CORVID_BENCH_CONNECTIONS, default 2000).

#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use cluster::ns::Ns;
use cluster::{cni_result, result_ip, Cluster};
use corvid_agent::cache::Cache;
use corvid_net::nftables::services::Services;
use serde_json::{json, Value};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(samples: &[Duration], p: f64) -> f64 {
    let mut s = samples.to_vec();
    s.sort();
    let i = ((s.len() as f64 - 1.0) * p).round() as usize;
    s[i].as_secs_f64() * 1e3
}

/// One connection from `pod` to `to`: what it answered, if anything.
fn ask(pod: &Ns, to: SocketAddr) -> Option<String> {
    pod.open()
        .run(|| {
            let mut s = TcpStream::connect_timeout(&to, Duration::from_millis(500)).ok()?;
            s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).ok()?;
            Some(String::from_utf8_lossy(&buf[..n]).into_owned())
        })
        .unwrap()
}

fn post(cluster: &Cluster, path: &str, body: Value) -> Value {
    let (status, v, _) = cluster
        .api(|c| c.request("POST", path, Some(&body)))
        .unwrap();
    assert_eq!(status, 201, "{path}: {v}");
    v
}

/// A service network with a subnet for VIPs.
fn service_subnet(cluster: &Cluster) -> String {
    cluster.api(|c| {
        let n: corvid_api::Network = c.create(json!({"name": "services"})).unwrap();
        let s: corvid_api::Subnet = c
            .create(json!({"network_id": n.id, "cidr": "10.98.0.0/24", "ip_version": 4, "gateway_ip": null}))
            .unwrap();
        s.id
    })
}

/// A load balancer on `vip`:80 with `members` on 8080, through the API; the members' IDs.
fn load_balancer(cluster: &Cluster, subnet: &str, vip: &str, members: &[String]) -> Vec<String> {
    let lb = post(
        cluster,
        "/v2/lbaas/loadbalancers",
        json!({"loadbalancer": {"vip_subnet_id": subnet, "vip_address": vip}}),
    );
    let lb_id = lb["loadbalancer"]["id"].clone();
    let l = post(
        cluster,
        "/v2/lbaas/listeners",
        json!({"listener": {"loadbalancer_id": lb_id, "protocol": "TCP", "protocol_port": 80}}),
    );
    let pool = post(
        cluster,
        "/v2/lbaas/pools",
        json!({"pool": {"listener_id": l["listener"]["id"], "loadbalancer_id": lb_id,
            "protocol": "TCP", "lb_algorithm": "ROUND_ROBIN"}}),
    );
    members
        .iter()
        .map(|ip| {
            let m = post(
                cluster,
                "/v2/lbaas/members",
                json!({"member": {"pool_id": pool["pool"]["id"], "address": ip, "protocol_port": 8080}}),
            );
            m["member"]["id"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Part 1: the controller's API to the VIP, and back out.
fn end_to_end(trials: usize) {
    let cluster = Cluster::new("bs");
    cluster.network("blue", "10.52.0.0/24", false);
    let pods: Vec<Ns> = ["a", "b", "client"]
        .iter()
        .map(|n| cluster.pod(n))
        .collect();
    let ips: Vec<String> = pods
        .iter()
        .zip([0, 1, 0])
        .map(|(p, h)| result_ip(&cni_result(&cluster.add(h, "blue", p))))
        .collect();
    let _servers: Vec<_> = pods[..2]
        .iter()
        .zip(["a", "b"])
        .map(|(p, n)| p.serve_name(n, 8080))
        .collect();
    let subnet = service_subnet(&cluster);
    let (mut reachable, mut left_out) = (Vec::new(), Vec::new());
    for t in 0..trials {
        let vip = format!("10.98.0.{}", 10 + t);
        let to: SocketAddr = format!("{vip}:80").parse().unwrap();
        let start = Instant::now();
        let members = load_balancer(&cluster, &subnet, &vip, &ips[..2]);
        while ask(&pods[2], to).is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "VIP {vip} never answered"
            );
        }
        reachable.push(start.elapsed());
        let gone = &members[1];
        let start = Instant::now();
        let path = format!("/v2/lbaas/members/{gone}");
        assert_eq!(
            cluster.api(|c| c.request("DELETE", &path, None)).unwrap().0,
            204
        );
        let mut clean = 0;
        while clean < 10 {
            clean = if ask(&pods[2], to).as_deref() == Some("a") {
                clean + 1
            } else {
                0
            };
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "b is still chosen"
            );
        }
        left_out.push(start.elapsed());
    }
    println!("end to end, {trials} load balancers (ms)      p50      p99");
    println!(
        "  created -> VIP answers             {:>8.2} {:>8.2}",
        pct(&reachable, 0.5),
        pct(&reachable, 0.99)
    );
    println!(
        "  member deleted -> not chosen       {:>8.2} {:>8.2}   (includes 10 connections)",
        pct(&left_out, 0.5),
        pct(&left_out, 0.99)
    );
}

/// A cache holding `n` load balancers of one listener and 3 members each.
fn obj<T: corvid_api::Resource>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn cache_of(n: usize) -> Cache {
    let mut c = Cache::default();
    for i in 0..n {
        let (lb, l, p) = (format!("lb{i}"), format!("l{i}"), format!("p{i}"));
        let vip = format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256);
        c.loadbalancers.insert(
            lb.clone(),
            obj(json!({"id": lb, "vip_address": vip, "vip_port_id": format!("v{i}")})),
        );
        c.listeners.insert(
            l.clone(),
            obj(json!({"id": l, "loadbalancer_id": lb, "protocol": "TCP", "protocol_port": 80, "default_pool_id": p})),
        );
        c.pools.insert(
            p.clone(),
            obj(json!({"id": p, "listener_id": l, "lb_algorithm": "ROUND_ROBIN", "session_persistence": null})),
        );
        for m in 0..3 {
            let id = format!("m{i}-{m}");
            c.members.insert(
                id.clone(),
                obj(json!({"id": id, "pool_id": p, "address": format!("10.200.{}.{}", i % 250, m + 1), "protocol_port": 8080})),
            );
        }
    }
    c
}

/// Part 2: plan and sync at 100 and 1,000 services.
fn at_scale(changes: usize) {
    println!("\nthe agent: plan + nftables sync (ms)          p50      p99");
    let mut figures = BTreeMap::new();
    for n in [100, 1000] {
        let ns = Ns::new(&format!("cvt{}bsa", std::process::id()), &n.to_string());
        let mut cache = cache_of(n);
        let (full, singles, plans) = ns
            .open()
            .run(|| {
                let mut services = Services::open(None, None).unwrap();
                let start = Instant::now();
                let plan = corvid_agent::services::plan(&cache);
                services.sync(&plan.services, &plan.floating).unwrap();
                let full = start.elapsed();
                let mut singles = Vec::new();
                let mut plans = Vec::new();
                for k in 0..changes {
                    let id = format!("m{}-0", (k * 7919) % n);
                    let m = cache.members.get_mut(&id).unwrap();
                    m.protocol_port = 8081 + (k % 2) as u16;
                    let start = Instant::now();
                    let plan = corvid_agent::services::plan(&cache);
                    plans.push(start.elapsed());
                    let report = services.sync(&plan.services, &plan.floating).unwrap();
                    singles.push(start.elapsed());
                    assert_eq!(report.changed, 1);
                }
                (full, singles, plans)
            })
            .unwrap();
        println!(
            "  {n:>5} services: full sync {:>8.2}; one change {:>8.2} {:>8.2} (of which the plan {:.2})",
            full.as_secs_f64() * 1e3,
            pct(&singles, 0.5),
            pct(&singles, 0.99),
            pct(&plans, 0.5)
        );
        figures.insert(n, pct(&singles, 0.5));
    }
    println!(
        "  one change at 1,000 / at 100: {:.2} (targets: one change < 20 ms, full sync of 1,000 < 2,000 ms)",
        figures[&1000] / figures[&100]
    );
}

/// Part 3: connections per second through a VIP against straight to the member.
fn datapath(connections: usize) {
    let cluster = Cluster::new("bd");
    cluster.network("blue", "10.53.0.0/24", false);
    let (member, client) = (cluster.pod("m"), cluster.pod("c"));
    let ip = result_ip(&cni_result(&cluster.add(0, "blue", &member)));
    cni_result(&cluster.add(0, "blue", &client));
    let _server = member.serve_name("m", 8080);
    let subnet = service_subnet(&cluster);
    load_balancer(&cluster, &subnet, "10.98.0.5", std::slice::from_ref(&ip));
    let vip: SocketAddr = "10.98.0.5:80".parse().unwrap();
    let direct: SocketAddr = format!("{ip}:8080").parse().unwrap();
    let start = Instant::now();
    while ask(&client, vip).is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the VIP never answered"
        );
    }
    let (mut through, mut straight) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..connections / 100 {
        for (to, total) in [(vip, &mut through), (direct, &mut straight)] {
            let start = Instant::now();
            for _ in 0..100 {
                assert_eq!(ask(&client, to).as_deref(), Some("m"));
            }
            *total += start.elapsed();
        }
    }
    let rate = |d: Duration| connections as f64 / d.as_secs_f64();
    println!("\nconnections from a pod, one at a time, taking turns ({connections} each)");
    println!(
        "  straight to the member (floor): {:>8.0} per second",
        rate(straight)
    );
    println!(
        "  through the VIP:                {:>8.0} per second",
        rate(through)
    );
    println!(
        "  VIP / direct (time per connection): {:.3}",
        through.as_secs_f64() / straight.as_secs_f64()
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    end_to_end(env("CORVID_BENCH_TRIALS", 20));
    at_scale(env("CORVID_BENCH_TRIALS", 20) * 5);
    datapath(env("CORVID_BENCH_CONNECTIONS", 2000));
}
