//! Services, measured four ways. Needs root and what scripts/test.sh installs.
//!
//! 0. Through Kubernetes (a real kube-apiserver, `corvid kube-watch`, the agents): a
//!    Service created until a pod's connection to its cluster IP is answered, and a
//!    member pod deleted until ten connections in a row miss it (p50, p99).
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
#[path = "../tests/support/kube.rs"]
mod kube_api;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use cluster::ns::{Ns, Proc};
use cluster::{cni_result, result_ip, Cluster};
use corvid_agent::cache::{Cache, Changed};
use corvid_net::nftables::services::Services;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_api::{start_watcher, KubeApi};
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

/// How long a poll waits for one connection: a SYN sent before the rules were there is
/// lost, and the next one (another source port, another connection) is what counts.
const POLL: Duration = Duration::from_millis(10);

/// One connection from `pod` to `to`, given `wait` to connect: what it answered, if
/// anything.
fn ask_within(pod: &Ns, to: SocketAddr, wait: Duration) -> Option<String> {
    pod.open()
        .run(|| {
            let mut s = TcpStream::connect_timeout(&to, wait).ok()?;
            s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).ok()?;
            Some(String::from_utf8_lossy(&buf[..n]).into_owned())
        })
        .unwrap()
}

/// One connection from `pod` to `to`: what it answered, if anything.
fn ask(pod: &Ns, to: SocketAddr) -> Option<String> {
    ask_within(pod, to, Duration::from_millis(500))
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

/// A pod of the `bench` namespace on node `host`: annotated by the watcher, plugged by
/// the node's agent (the port given its namespace, as the `corvid-k8s` plugin does),
/// serving its name on 8080, and Ready.
fn k8s_pod(cluster: &Cluster, kube: &KubeApi, name: &str, host: usize, app: &str) -> (Ns, Proc) {
    let (n, app, node) = (name.to_string(), app.to_string(), format!("h{}", host + 1));
    let (port_id, ip) = kube.admin(|c| async move {
        let api = Api::<Pod>::namespaced(c, "bench");
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": n, "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "cvt-pause"}]},
        }))
        .unwrap();
        api.create(&PostParams::default(), &p).await.unwrap();
        loop {
            let p = api.get(&n).await.unwrap();
            let found = p
                .metadata
                .annotations
                .and_then(|a| a.get(corvid_k8s::annotation::KEY).cloned());
            if let Some(text) = found {
                let a = corvid_k8s::annotation::PortAnnotation::parse(&text).unwrap();
                return (a.port_id, a.addresses[0].addr().to_string());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let ns = cluster.pod(name);
    let path = ns.path.display().to_string();
    cluster
        .api(|c| {
            c.update::<corvid_api::Port>(&port_id, json!({"network_ns": path, "veth_name": "eth0"}))
        })
        .unwrap();
    cluster::ns::wait_until("the agent to plug the pod", Duration::from_secs(10), || {
        ns.netlink()
            .addresses(None)
            .unwrap()
            .iter()
            .any(|(_, a)| a.addr().is_ipv4() && !a.addr().is_loopback())
    });
    let server = ns.serve_name(name, 8080);
    let n = name.to_string();
    kube.admin(|c| async move {
        // As the kubelet writes it: the endpoint controllers take ready pods with an IP.
        let patch = json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}]}});
        Api::<Pod>::namespaced(c, "bench")
            .patch_status(&n, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    });
    (ns, server)
}

/// Part 0: through Kubernetes (the API server, `corvid kube-watch`, the agents): a Service
/// created until a pod's connection to its cluster IP is answered, and a member pod
/// deleted until ten connections in a row miss it.
fn through_kubernetes(trials: usize) {
    let cluster = Cluster::new("bk");
    let kube = KubeApi::start(&cluster.lan.path, "10.99.0.254");
    kube.apply_manifest(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/rbac.yaml"),
    );
    let _watcher = start_watcher(&cluster, &kube, &[]);
    kube.admin(|c| async move {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "bench"}})).unwrap();
        Api::<Namespace>::all(c)
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    });
    let (client, _c) = k8s_pod(&cluster, &kube, "client", 0, "client");
    let _resident = k8s_pod(&cluster, &kube, "resident", 0, "web");
    let (mut reachable, mut left_out) = (Vec::new(), Vec::new());
    for t in 0..trials {
        let member = format!("m{t}");
        let _pod = k8s_pod(&cluster, &kube, &member, 1, "web");
        let name = format!("s{t}");
        let start = Instant::now();
        let vip = kube.admin(|c| async move {
            let svc: Service = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
            }))
            .unwrap();
            let made = Api::<Service>::namespaced(c, "bench")
                .create(&PostParams::default(), &svc)
                .await
                .unwrap();
            made.spec.unwrap().cluster_ip.unwrap()
        });
        let to: SocketAddr = format!("{vip}:80").parse().unwrap();
        while ask_within(&client, to, POLL).is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{vip} never answered"
            );
        }
        reachable.push(start.elapsed());
        let seen = Instant::now();
        while ask(&client, to).as_deref() != Some(member.as_str()) {
            assert!(
                seen.elapsed() < Duration::from_secs(10),
                "{member} never chosen"
            );
        }
        let m = member.clone();
        let start = Instant::now();
        kube.admin(|c| async move {
            Api::<Pod>::namespaced(c, "bench")
                .delete(&m, &DeleteParams::default().grace_period(0))
                .await
                .unwrap();
        });
        let mut clean = 0;
        while clean < 10 {
            clean = if ask(&client, to).as_deref() == Some("resident") {
                clean + 1
            } else {
                0
            };
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{member} is still chosen"
            );
        }
        left_out.push(start.elapsed());
    }
    println!("through Kubernetes, {trials} services (ms)     p50      p99");
    println!(
        "  Service created -> cluster IP answers {:>8.2} {:>8.2}",
        pct(&reachable, 0.5),
        pct(&reachable, 0.99)
    );
    println!(
        "  member pod deleted -> not chosen      {:>8.2} {:>8.2}   (includes 10 connections)\n",
        pct(&left_out, 0.5),
        pct(&left_out, 0.99)
    );
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
        while ask_within(&pods[2], to, POLL).is_none() {
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
        cache.reindex();
        let (full, singles, plans) = ns
            .open()
            .run(|| {
                let mut services = Services::open(None, Vec::new()).unwrap();
                let start = Instant::now();
                let plan = corvid_agent::services::plan(&cache);
                services.sync(&plan.services, &plan.floating).unwrap();
                let full = start.elapsed();
                let mut singles = Vec::new();
                let mut plans = Vec::new();
                let mut plan = plan;
                for k in 0..changes {
                    // What the agent does with a member's change from the watch feed.
                    let id = format!("m{}-0", (k * 7919) % n);
                    let mut member = serde_json::to_value(&cache.members[&id]).unwrap();
                    member["protocol_port"] = json!(8081 + (k % 2));
                    let start = Instant::now();
                    cache.apply(&[corvid_api::WatchEvent {
                        revision: k as i64,
                        kind: corvid_api::EventKind::Put,
                        resource: "members".into(),
                        id: id.clone(),
                        object: member,
                    }]);
                    let Changed::Listeners(ids) = cache.take_changed() else {
                        panic!("one listener changed")
                    };
                    for l in &ids {
                        let s = corvid_agent::services::plan_listener(&cache, l).unwrap();
                        plan.services.insert(l.clone(), s);
                    }
                    plans.push(start.elapsed());
                    let report = services
                        .sync_changed(&plan.services, &ids, &plan.floating)
                        .unwrap();
                    singles.push(start.elapsed());
                    assert_eq!(report.changed, 1);
                }
                (full, singles, plans)
            })
            .unwrap();
        println!(
            "  {n:>5} services: full sync {:>8.2}; one change {:>8.3} {:>8.3} (of which the cache and plan {:.3})",
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
    through_kubernetes(env("CORVID_BENCH_TRIALS", 20));
    end_to_end(env("CORVID_BENCH_TRIALS", 20));
    at_scale(env("CORVID_BENCH_TRIALS", 20) * 5);
    datapath(env("CORVID_BENCH_CONNECTIONS", 2000));
}
