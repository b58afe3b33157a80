//! End-to-end CNI ADD through the controller: the `corvid` plugin POSTs a port, the host's
//! agent plugs it and reports it UP, the plugin answers, for N pods over two simulated
//! hosts. Next to it, in the same run and taking turns pod by pod, the local path: the
//! bridge plugin with host-local IPAM on the same host namespaces. Prints p50, p99, pods
//! per second and the ratio of the two. Needs root.
//!
//! `cargo bench -p corvid --bench overlay` (CORVID_BENCH_PODS sets N, default 100).

#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::time::{Duration, Instant};

use cluster::ns::Ns;
use cluster::{Cluster, PluginCall};
use serde_json::{json, Value};

/// Runs one plugin and times it from spawn to exit; panics unless it succeeds.
fn invoke(cluster: &Cluster, c: PluginCall, pod: &Ns, conf: &Value) -> Duration {
    let start = Instant::now();
    let out = cluster
        .run_plugin(&c, pod, conf)
        .wait_with_output()
        .unwrap();
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "{} {}: {}",
        c.plugin,
        c.command,
        String::from_utf8_lossy(&out.stdout)
    );
    took
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n: usize = std::env::var("CORVID_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let cluster = Cluster::new("bn");
    let (_, subnet) = cluster.network("bench", "10.60.0.0/16", false);
    let data = tempfile::Builder::new()
        .prefix("cvt-bench")
        .tempdir()
        .unwrap();
    let controller_conf = |host: usize| {
        json!({"cniVersion": "1.1.0", "name": "bench", "type": "corvid",
               "mpurl": cluster::url(), "project": "corvid", "subnet": subnet.id,
               "hostId": format!("h{}", host + 1)})
    };
    let local_conf = json!({"cniVersion": "1.1.0", "name": "local", "type": "bridge",
        "bridge": "cvtlocal", "isGateway": true,
        "ipam": {"type": "host-local", "subnet": "10.61.0.0/16",
                 "dataDir": data.path().display().to_string()}});
    let mut pods = Vec::new();
    let (mut remote, mut local) = (Vec::new(), Vec::new());
    let mut remote_total = Duration::ZERO;
    let mut local_total = Duration::ZERO;
    for i in 0..n {
        let host = i % 2;
        let pod = cluster.pod(&format!("p{i}"));
        let id = format!("bench-{i}");
        let call = |plugin, ifname, container| PluginCall {
            host,
            plugin,
            command: "ADD",
            container,
            ifname,
        };
        let t = invoke(
            &cluster,
            call("corvid", "eth0", &id),
            &pod,
            &controller_conf(host),
        );
        remote_total += t;
        remote.push(t);
        let t = invoke(&cluster, call("bridge", "eth1", &id), &pod, &local_conf);
        local_total += t;
        local.push(t);
        pods.push((host, id, pod));
    }
    remote.sort();
    local.sort();
    let row = |label: &str, d: &[Duration], total: Duration| {
        println!(
            "{label:<34} {:>8.2} {:>8.2} {:>9.1}",
            pct(d, 0.5),
            pct(d, 0.99),
            d.len() as f64 / total.as_secs_f64()
        );
    };
    println!("CNI ADD, {n} pods over 2 hosts, one at a time");
    println!("{:<34} {:>8} {:>8} {:>9}", "", "p50 ms", "p99 ms", "pods/s");
    row("corvid via controller + agent", &remote, remote_total);
    row("bridge + host-local (local)", &local, local_total);
    println!(
        "ratio p50 controller/local: {:.2} (target: p50 < 20 ms and ratio < 3)",
        pct(&remote, 0.5) / pct(&local, 0.5)
    );
    for (host, id, pod) in &pods {
        let call = PluginCall {
            host: *host,
            plugin: "corvid",
            command: "DEL",
            container: id,
            ifname: "eth0",
        };
        invoke(&cluster, call, pod, &controller_conf(*host));
    }
}
