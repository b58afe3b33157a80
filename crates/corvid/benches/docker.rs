//! A real dockerd on a corvid network against Docker's own bridge driver, in the same run
//! and taking turns: `docker run -d` of a busybox container, from the command to the
//! container running with its network (start-to-ready), on `--net bridge` and on a
//! network of `corvid docker-plugin`. Then the driver alone, on its socket: CreateEndpoint
//! + Join per endpoint. Prints medians and the ratio. Needs root and docker.io.
//!
//! `cargo build --release --workspace && cargo bench -p corvid --bench docker`
//! (CORVID_BENCH_CONTAINERS sets the number of containers per driver, default 20).

#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::path::Path;
use std::time::{Duration, Instant};

use cluster::docker::{post, DockerPlugin, Dockerd, IMAGE};
use cluster::{url, Cluster};
use serde_json::{json, Value};

fn median_ms(mut d: Vec<Duration>) -> f64 {
    d.sort();
    d[d.len() / 2].as_secs_f64() * 1000.0
}

/// Times `docker run -d` of a container on `net`, then removes it (not timed).
fn run_once(docker: &Dockerd, net: &str, name: &str) -> Duration {
    let start = Instant::now();
    docker.ok(&[
        "run", "-d", "--name", name, "--net", net, IMAGE, "sleep", "600",
    ]);
    let took = start.elapsed();
    docker.ok(&["rm", "-f", name]);
    took
}

/// One driver call; panics unless it answers 200.
fn call(socket: &Path, method: &str, body: &Value) -> Value {
    let (status, answer) = post(socket, method, &body.to_string());
    assert_eq!(status, 200, "{method}: {answer}");
    answer
}

/// CreateEndpoint + Join for `n` endpoints of network `net` (a Docker ID), timed together,
/// each undone afterwards as Docker would.
fn driver_latency(plugin: &DockerPlugin, net: &str, pool: &str, n: usize) -> Vec<Duration> {
    let mut took = Vec::new();
    for i in 0..n {
        let ep = format!("{:064x}", 0xbe00 + i);
        let addr = call(
            &plugin.socket,
            "IpamDriver.RequestAddress",
            &json!({"PoolID": pool, "Address": "", "Options": {}}),
        );
        let ids = json!({"NetworkID": net, "EndpointID": ep,
            "SandboxKey": "/var/run/docker/netns/bench", "Options": {}});
        let mut create = ids.clone();
        create["Interface"] =
            json!({"Address": addr["Address"], "AddressIPv6": "", "MacAddress": ""});
        let start = Instant::now();
        call(&plugin.socket, "NetworkDriver.CreateEndpoint", &create);
        call(&plugin.socket, "NetworkDriver.Join", &ids);
        took.push(start.elapsed());
        call(&plugin.socket, "NetworkDriver.Leave", &ids);
        call(&plugin.socket, "NetworkDriver.DeleteEndpoint", &ids);
        let release = json!({"PoolID": pool, "Address": addr["Address"]});
        call(&plugin.socket, "IpamDriver.ReleaseAddress", &release);
    }
    took
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n: usize = std::env::var("CORVID_BENCH_CONTAINERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let cluster = Cluster::new("bd");
    let host = &cluster.hosts[0];
    let driver = format!("{}bd", cluster.tag);
    let plugin = DockerPlugin::start(host, &driver, "h1", &url());
    let docker = Dockerd::start(host);
    let net = docker.create_network(&driver, "cvtbench", &["--subnet", "10.216.0.0/16"]);
    docker.ok(&[
        "network",
        "create",
        "-d",
        "bridge",
        "--subnet",
        "10.217.0.0/16",
        "cvtbr",
    ]);
    run_once(&docker, "bridge", "cvtwarm1");
    run_once(&docker, "cvtbr", "cvtwarm2");
    run_once(&docker, "cvtbench", "cvtwarm3");
    let (mut bridge, mut user_bridge, mut corvid) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        bridge.push(run_once(&docker, "bridge", &format!("cvtbr{i}")));
        user_bridge.push(run_once(&docker, "cvtbr", &format!("cvtub{i}")));
        corvid.push(run_once(&docker, "cvtbench", &format!("cvtcv{i}")));
    }
    // The pool Docker got for the network.
    let pool = cluster.api(|c| {
        c.list::<corvid_api::SubnetPool>(&[("tags", "docker-pool")])
            .unwrap()
            .0
            .into_iter()
            .find(|p| p.prefixes[0].to_string() == "10.216.0.0/16")
            .expect("the network's pool")
            .id
    });
    let endpoint = driver_latency(&plugin, &net, &pool, n * 5);
    let (b, u, c) = (median_ms(bridge), median_ms(user_bridge), median_ms(corvid));
    println!("docker run -d, {n} containers per network, taking turns (median ms)");
    println!(
        "{:<52} {:>8.1}",
        "--net bridge (Docker's default bridge)", b
    );
    println!(
        "{:<52} {:>8.1}",
        "--net <user-defined network of Docker's bridge>", u
    );
    println!("{:<52} {:>8.1}", "--net <corvid network>", c);
    println!("ratio corvid/bridge: {:.2} (target <= 1.2)", c / b);
    println!("ratio corvid/user-defined bridge: {:.2}", c / u);
    println!(
        "driver CreateEndpoint + Join, {} endpoints: p50 {:.2} ms",
        n * 5,
        median_ms(endpoint)
    );
}
