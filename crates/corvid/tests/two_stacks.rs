//! Two corvid stacks on one host, as when `corvid up` runs beside a second stack for the
//! Docker driver: two controllers, each with an agent for the same host ID. Either agent
//! killed with SIGKILL and restarted, again and again, leaves the other stack's devices
//! alone (each device carries its cluster's mark), while a device from before the marks
//! is still cleaned up. Runs as root, in `cvt*` namespaces only.

#[path = "support/cluster.rs"]
mod cluster;

use std::process::Stdio;
use std::time::Duration;

use cluster::ns::{wait_until, Proc};
use cluster::{cni_result, result_ip, Cluster};
use corvid_api::{Client, Network, Subnet};
use serde_json::json;

const B_URL: &str = "http://10.99.0.254:9797";

/// Stack A's agent on host 1 serves its probes here, stack B's on the next port.
const METRICS: [&str; 2] = ["127.0.0.1:9701", "127.0.0.1:9702"];

fn agent(cluster: &Cluster, controller: &str, metrics: &str) -> Proc {
    Proc(
        cluster.hosts[0]
            .command(env!("CARGO_BIN_EXE_corvid"))
            .args(["agent", "--host-id", "h1", "--controller", controller])
            .args([
                "--underlay-ip",
                &cluster::underlay_ip(0),
                "--metrics-listen",
                metrics,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    )
}

fn ready(cluster: &Cluster, metrics: &str) -> bool {
    let url = format!("http://{metrics}/readyz");
    cluster.hosts[0]
        .open()
        .run(|| {
            ureq::get(&url)
                .timeout(Duration::from_secs(2))
                .call()
                .is_ok()
        })
        .unwrap()
}

#[test]
fn two_stacks_on_one_host_leave_each_others_devices_alone() {
    let mut cluster = Cluster::new("two");
    cluster.agents[0].take();
    let mut agent_a = agent(&cluster, &cluster::url(), METRICS[0]);
    // Stack B: its own controller and store, beside A's in the lan namespace.
    let state_b = tempfile::Builder::new().prefix("cvt-b").tempdir().unwrap();
    let _controller_b = Proc(
        cluster
            .lan
            .command(env!("CARGO_BIN_EXE_corvid"))
            .args(["controller", "--listen", "10.99.0.254:9797", "--store"])
            .arg(format!("redb:{}", state_b.path().join("b.redb").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let b = Client::new(B_URL);
    wait_until("controller B", Duration::from_secs(20), || {
        cluster.lan.open().run(|| b.version().is_ok()).unwrap()
    });
    let mut agent_b = agent(&cluster, B_URL, METRICS[1]);
    let subnet_b = cluster
        .lan
        .open()
        .run(|| {
            let n: Network = b.create(json!({"name": "green"})).unwrap();
            let s: Subnet = b
                .create(json!({"network_id": n.id, "cidr": "10.72.0.0/24", "ip_version": 4}))
                .unwrap();
            s.id
        })
        .unwrap();
    let conf = json!({
        "cniVersion": "1.1.0", "name": "green-h1",
        "plugins": [{"type": "corvid", "mpurl": B_URL, "project": "corvid",
            "subnet": subnet_b, "hostId": "h1", "timeout": 20}]
    });
    std::fs::write(
        cluster.conf.path().join("green-h1.conflist"),
        conf.to_string(),
    )
    .unwrap();
    cluster.network("blue", "10.71.0.0/24", false);

    // A's pods on both hosts, B's two on host 1.
    let a1 = cluster.pod("a1");
    let a2 = cluster.pod("a2");
    cni_result(&cluster.add(0, "blue", &a1));
    let ip_a2 = result_ip(&cni_result(&cluster.add(1, "blue", &a2)));
    let b1 = cluster.pod("b1");
    let b2 = cluster.pod("b2");
    cni_result(&cluster.add(0, "green", &b1));
    let ip_b2 = result_ip(&cni_result(&cluster.add(0, "green", &b2)));
    assert!(a1.ping(&ip_a2));
    assert!(b1.ping(&ip_b2));
    let devices = || cluster.hosts[0].links("cv").len();
    // Two bridges, a vxlan device each, three veths.
    assert_eq!(devices(), 7, "{:?}", cluster.hosts[0].links("cv"));

    // A device from before the marks: counted as anyone's, so an agent cleans it up.
    cluster.hosts[0].ip("link add cvb000000000000 type bridge");

    for round in 0..3 {
        agent_a.kill9();
        agent_a = agent(&cluster, &cluster::url(), METRICS[0]);
        wait_until("agent A to be ready again", Duration::from_secs(20), || {
            ready(&cluster, METRICS[0])
        });
        assert!(
            b1.ping(&ip_b2),
            "round {round}: B's pods after A's agent restarted"
        );
        assert!(a1.ping(&ip_a2), "round {round}");
        agent_b.kill9();
        agent_b = agent(&cluster, B_URL, METRICS[1]);
        wait_until("agent B to be ready again", Duration::from_secs(20), || {
            ready(&cluster, METRICS[1])
        });
        assert!(
            a1.ping(&ip_a2),
            "round {round}: A's pods after B's agent restarted"
        );
        assert!(b1.ping(&ip_b2), "round {round}");
        assert_eq!(
            devices(),
            7,
            "round {round}: {:?}",
            cluster.hosts[0].links("cv")
        );
    }
    // Every device is marked with its own stack's cluster.
    let clusters: std::collections::BTreeSet<String> = cluster.hosts[0]
        .netlink()
        .links()
        .unwrap()
        .into_iter()
        .filter(|l| l.name.starts_with("cv"))
        .map(|l| {
            corvid_net::names::marked_cluster(&l.alias)
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(clusters.len(), 2, "{clusters:?}");
}
