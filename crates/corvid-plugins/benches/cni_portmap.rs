//! ADD and DEL of portmap with two mappings (TCP and UDP) chained after bridge, for N
//! containers one at a time, corvid's (nftables map elements) against the reference's
//! (iptables chains) side by side in one run, taking turns in small chunks. Prints p50,
//! p99, the ratio, and two floors: starting the binary (a VERSION call), and the kernel's
//! part of a DEL done in process (remove the elements, close the socket: the kernel frees
//! removed elements after an RCU grace period, and a closing netfilter socket waits for
//! that).
//!
//! `cargo bench -p corvid-plugins --bench cni_portmap` (CORVID_BENCH_N sets N, default 64).

mod support;

use corvid_net::Netns;
use serde_json::{json, Value};
use std::time::Instant;
use support::{invoke, Impl, Ns, Phase};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = support::containers();
    let ours = tempfile::tempdir().unwrap();
    let impls = Impl::both(ours.path());
    let tag = format!("cvbp{}", std::process::id());
    // Per implementation: a host namespace, a lease directory, N containers on a bridge.
    let setups: Vec<_> = impls
        .iter()
        .map(|imp| {
            let host_ns = Ns::new(format!("{tag}-{}-h", imp.label));
            let host = Netns::open(&host_ns.0).unwrap();
            let data = tempfile::tempdir().unwrap();
            let bridge = json!({"cniVersion": "1.0.0", "name": "cvtpmb", "type": "bridge",
                "bridge": "cvtbrpb", "isGateway": true,
                "ipam": {"type": "host-local", "subnet": "10.201.0.0/16", "dataDir": data.path()}})
            .to_string();
            let containers: Vec<(Ns, String)> = (0..n)
                .map(|i| {
                    let ns = Ns::new(format!("{tag}-{}-{i}", imp.label));
                    let (_, _, out) = invoke(
                        &host,
                        imp,
                        "bridge",
                        "ADD",
                        &format!("pm{i}"),
                        &ns.0,
                        &bridge,
                    );
                    let prev: Value = serde_json::from_str(&out).unwrap();
                    let port = 20000 + 2 * i;
                    let conf = json!({"cniVersion": "1.0.0", "name": "cvtpmb", "type": "portmap",
                        "capabilities": {"portMappings": true}, "prevResult": prev,
                        "runtimeConfig": {"portMappings": [
                            {"hostPort": port, "containerPort": 80, "protocol": "tcp"},
                            {"hostPort": port + 1, "containerPort": 53, "protocol": "udp"}]}})
                    .to_string();
                    (ns, conf)
                })
                .collect();
            (host_ns, host, data, containers)
        })
        .collect();
    println!("portmap (two mappings) after bridge + host-local, {n} containers; times in ms\n");
    println!(
        "{:<10} {:<7} {:>8} {:>8} {:>9}",
        "impl", "op", "p50", "p99", "maxRSS"
    );
    let mut p50 = std::collections::HashMap::new();
    for op in ["ADD", "DEL"] {
        let mut phases: Vec<Phase> = impls.iter().map(|_| Phase::default()).collect();
        for (round, start) in (0..n).step_by(4).enumerate() {
            for k in 0..impls.len() {
                let which = (k + round) % impls.len();
                let (_, host, _, containers) = &setups[which];
                let began = Instant::now();
                for (i, (ns, conf)) in containers.iter().enumerate().skip(start).take(4) {
                    let (took, rss, _) = invoke(
                        host,
                        &impls[which],
                        "portmap",
                        op,
                        &format!("pm{i}"),
                        &ns.0,
                        conf,
                    );
                    phases[which].samples.push(took);
                    phases[which].max_rss_kib = phases[which].max_rss_kib.max(rss);
                }
                phases[which].wall += began.elapsed();
            }
        }
        for (imp, ph) in impls.iter().zip(&phases) {
            println!(
                "{:<10} {:<7} {:>8.2} {:>8.2} {:>6} KiB",
                imp.label,
                op,
                ph.pct(0.5),
                ph.pct(0.99),
                ph.max_rss_kib
            );
            p50.insert((imp.label, op), ph.pct(0.5));
        }
    }
    // The floor: starting corvid's binary and answering VERSION, nothing else.
    let mut floor = Phase::default();
    let (_, host, _, containers) = &setups[0];
    for (ns, conf) in containers.iter().take(n.min(32)) {
        let (took, _, _) = invoke(host, &impls[0], "portmap", "VERSION", "v", &ns.0, conf);
        floor.samples.push(took);
    }
    println!(
        "{:<10} {:<7} {:>8.2} {:>8.2}",
        "exec",
        "VERSION",
        floor.pct(0.5),
        floor.pct(0.99)
    );
    let kernel = kernel_floor(host, n.min(32));
    println!(
        "{:<10} {:<7} {:>8.2} {:>8.2}",
        "in-process",
        "DEL",
        kernel.pct(0.5),
        kernel.pct(0.99)
    );
    println!("\nratio corvid/reference (p50; lower is better)");
    for op in ["ADD", "DEL"] {
        println!(
            "  {op}: {:.3}",
            p50[&("corvid", op)] / p50[&("reference", op)]
        );
    }
    println!(
        "corvid above starting the binary: ADD {:.2} ms, DEL {:.2} ms; DEL above both floors: {:.2} ms",
        p50[&("corvid", "ADD")] - floor.pct(0.5),
        p50[&("corvid", "DEL")] - floor.pct(0.5),
        p50[&("corvid", "DEL")] - floor.pct(0.5) - kernel.pct(0.5)
    );
}

/// Removing two mappings in process and closing the socket, timed: the kernel's share
/// of a DEL, with no process started.
fn kernel_floor(host: &Netns, n: usize) -> Phase {
    use corvid_net::nftables::portmap::{self, PortMapping, Protocol};
    use corvid_net::nftables::{AttachmentTag, Nftables};
    let mut phase = Phase::default();
    for i in 0..n {
        let tag = AttachmentTag::new("cvtfloor", &format!("f{i}"), "eth0");
        let addrs = ["10.202.0.9".parse().unwrap()];
        let mappings = [Protocol::Tcp, Protocol::Udp].map(|protocol| PortMapping {
            protocol,
            host_port: 30000 + i as u16,
            container_port: 80,
            host_ip: None,
        });
        host.run(|| {
            let mut nft = Nftables::open().unwrap();
            portmap::add_port_mappings(&mut nft, &tag, &addrs, &mappings, false).unwrap();
            drop(nft);
            let began = Instant::now();
            let mut nft = Nftables::open().unwrap();
            portmap::delete_port_mappings(&mut nft, &tag, Some((&addrs, &mappings))).unwrap();
            drop(nft);
            phase.samples.push(began.elapsed());
        })
        .unwrap();
    }
    phase
}
