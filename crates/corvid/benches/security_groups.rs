//! Security groups on two simulated hosts whose agents filter, in one run: a pod on h1
//! joins a group (one port update through the API) that a rule of a pod on h2 names,
//! until its first UDP datagram is answered, p50 of 15; and h2's agent's work for that
//! change while the group holds 1,000 and 10,000 members (ports with no host, up to
//! `CORVID_BENCH_MEMBERS`), beside the floor: the same one-element change of a member
//! set of that size, bare through corvid-net (told which member changed, as the agent's
//! planner tells it).
//!
//! Needs root. `cargo bench -p corvid --bench security_groups`.

#[path = "../tests/support/cluster.rs"]
mod cluster;
#[path = "../tests/support/member_floor.rs"]
mod member_floor;

use std::io::BufRead;
use std::time::Duration;

use cluster::ns::{median, wait_until};
use cluster::{agent_work, epoch, prober, Cluster};
use corvid_api::Port;
use member_floor::bare_member_change;
use serde_json::{json, Value};

const SAMPLES: usize = 15;
const METRICS: &str = "127.0.0.1:9697";

fn set_groups(cluster: &Cluster, port: &str, groups: &[&str]) {
    cluster.call(
        "PUT",
        &format!("/v2.0/ports/{port}"),
        json!({"port": {"security_groups": groups}}),
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let max: usize = std::env::var("CORVID_BENCH_MEMBERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut cluster = Cluster::new("bs");
    cluster.filtering_agents(Some(METRICS));
    let (_, subnet) = cluster.network("sg", "10.70.0.0/16", false);
    let clients = cluster.security_group("clients");
    let srv = cluster.security_group("srv");
    cluster.call(
        "POST",
        "/v2.0/security-group-rules",
        json!({"security_group_rule": {"security_group_id": srv.id, "direction": "ingress",
            "ethertype": "IPv4", "protocol": "udp", "port_range_min": 5353,
            "port_range_max": 5353, "remote_group_id": clients.id}}),
    );
    let (a, b) = (cluster.pod("a"), cluster.pod("b"));
    let a_port = cluster.api_port(0, &subnet, &a, json!({}));
    let default = a_port.security_groups[0].clone();
    let b_port = cluster.api_port(
        1,
        &subnet,
        &b,
        // Not in the default group, whose members (a among them) would all get in.
        json!({"security_groups": [srv.id]}),
    );
    let ip_b = b_port.fixed_ips[0].ip_address.to_string();
    let _server = b.serve_name("s", 5353);
    assert_eq!(a.connect(&ip_b, 5353, 1, true), ["timeout"]);

    println!("a pod joins a group a rule on another host names (p50 of {SAMPLES})");
    println!(
        "{:>8} {:>22} {:>26} {:>24}",
        "members", "join -> answered ms", "h2 agent work/change ms", "bare element change ms"
    );
    let mut members = 0;
    for size in [1_000, 10_000].into_iter().filter(|s| *s <= max) {
        while members < size {
            let wave: Vec<Value> = (members..size.min(members + 500))
                .map(|_| {
                    json!({"network_id": subnet.network_id, "security_groups": [clients.id],
                        "name": "member"})
                })
                .collect();
            members += wave.len();
            cluster.api(|c| c.create_bulk::<Port>(wave)).unwrap();
        }
        // The members reach h2's filter through the watch: let them settle.
        std::thread::sleep(Duration::from_secs(3));
        let (mut latency, mut work) = (Vec::new(), Vec::new());
        for _ in 0..SAMPLES {
            let before = agent_work(METRICS, &cluster.hosts[1]);
            let (_probe, mut out) = prober(&a, &ip_b);
            let asked = epoch();
            set_groups(&cluster, &a_port.id, &[&default, &clients.id]);
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            latency.push((line.trim().parse::<f64>().unwrap() - asked) * 1e3);
            let after = agent_work(METRICS, &cluster.hosts[1]);
            let passes = after.1 - before.1;
            if passes > 0.0 {
                work.push((after.0 - before.0) / passes * 1e3);
            }
            set_groups(&cluster, &a_port.id, &[&default]);
            wait_until("a to be kept out again", Duration::from_secs(10), || {
                a.connect(&ip_b, 5353, 1, true) == ["timeout"]
            });
        }
        let bare = bare_member_change(&cluster.tag, size, SAMPLES);
        println!(
            "{size:>8} {:>22.1} {:>26.2} {:>24.2}",
            median(latency),
            median(work),
            bare
        );
    }
    println!("targets: join -> answered p50 <= 50 ms; agent work per change <= 1 ms, flat");
}
