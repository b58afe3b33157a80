//! ADD and DEL of ptp + host-local and of macvlan + host-local, for N containers one at a
//! time, corvid's against the reference's (Debian's) side by side in one run, taking
//! turns in chunks of four. Prints p50 and p99, the ratios, and the floors:
//! - starting the binary (a VERSION call);
//! - the kernel's part of a DEL done in process: deleting the container's link (a veth
//!   pair, or a macvlan) from a socket in its namespace.
//!
//! `cargo bench -p corvid-plugins --bench cni_ptp_macvlan` (CORVID_BENCH_N sets N, default 64).

mod support;

use corvid_net::binding::{pair, VethSpec};
use corvid_net::link::{ChildKind, ChildSpec, MacvlanMode};
use corvid_net::{Netlink, Netns};
use serde_json::json;
use std::collections::HashMap;
use std::time::Instant;
use support::{invoke, Impl, Ns, Phase};

/// A plugin as benched: its name and the configuration of its network.
struct Case {
    plugin: &'static str,
    conf: fn(&std::path::Path) -> String,
}

fn ptp(data: &std::path::Path) -> String {
    json!({"cniVersion": "1.0.0", "name": "cvtbp", "type": "ptp",
        "ipam": {"type": "host-local", "subnet": "10.203.0.0/16", "dataDir": data}})
    .to_string()
}

fn macvlan(data: &std::path::Path) -> String {
    json!({"cniVersion": "1.0.0", "name": "cvtbm", "type": "macvlan", "master": "cvtbm0",
        "ipam": {"type": "host-local", "subnet": "10.204.0.0/16", "dataDir": data}})
    .to_string()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = support::containers();
    let ours = tempfile::tempdir().unwrap();
    let impls = Impl::both(ours.path());
    let tag = format!("cvbq{}", std::process::id());
    let cases = [
        Case {
            plugin: "ptp",
            conf: ptp,
        },
        Case {
            plugin: "macvlan",
            conf: macvlan,
        },
    ];
    println!("ADD and DEL with host-local, {n} containers each; times in ms\n");
    println!(
        "{:<9} {:<10} {:<4} {:>8} {:>8}",
        "plugin", "impl", "op", "p50", "p99"
    );
    let mut p50 = HashMap::new();
    for case in &cases {
        // Per implementation: a host namespace with a master device, a lease directory,
        // N container namespaces.
        let setups: Vec<_> = impls
            .iter()
            .map(|imp| {
                let host_ns = Ns::new(format!("{tag}-{}-{}-h", case.plugin, imp.label));
                let host = Netns::open(&host_ns.0).unwrap();
                master(&host);
                let data = tempfile::tempdir().unwrap();
                let conf = (case.conf)(data.path());
                let pods: Vec<Ns> = (0..n)
                    .map(|i| Ns::new(format!("{tag}-{}-{}-{i}", case.plugin, imp.label)))
                    .collect();
                (host_ns, host, data, conf, pods)
            })
            .collect();
        for op in ["ADD", "DEL"] {
            let mut phases: Vec<Phase> = impls.iter().map(|_| Phase::default()).collect();
            for (round, start) in (0..n).step_by(4).enumerate() {
                for k in 0..impls.len() {
                    let which = (k + round) % impls.len();
                    let (_, host, _, conf, pods) = &setups[which];
                    for (i, pod) in pods.iter().enumerate().skip(start).take(4) {
                        let (took, _, _) = invoke(
                            host,
                            &impls[which],
                            case.plugin,
                            op,
                            &format!("c{i}"),
                            &pod.0,
                            conf,
                        );
                        phases[which].samples.push(took);
                    }
                }
            }
            for (imp, ph) in impls.iter().zip(&phases) {
                println!(
                    "{:<9} {:<10} {:<4} {:>8.2} {:>8.2}",
                    case.plugin,
                    imp.label,
                    op,
                    ph.pct(0.5),
                    ph.pct(0.99)
                );
                p50.insert((case.plugin, imp.label, op), ph.pct(0.5));
            }
        }
    }
    // The floors: starting corvid's binary, and deleting the link (up, addressed) in
    // process.
    let floor_ns = Ns::new(format!("{tag}-floor"));
    let floor_host = Netns::open(&floor_ns.0).unwrap();
    master(&floor_host);
    let mut exec = Phase::default();
    let data = tempfile::tempdir().unwrap();
    for i in 0..n.min(32) {
        let conf = ptp(data.path());
        let (took, _, _) = invoke(
            &floor_host,
            &impls[0],
            "ptp",
            "VERSION",
            &format!("v{i}"),
            &floor_ns.0,
            &conf,
        );
        exec.samples.push(took);
    }
    let (veth_del, macvlan_del) = kernel_floors(&tag, &floor_host, n.min(32));
    println!(
        "{:<9} {:<10} {:<4} {:>8.2} {:>8.2}",
        "any",
        "exec",
        "VER",
        exec.pct(0.5),
        exec.pct(0.99)
    );
    println!(
        "{:<9} {:<10} {:<4} {:>8.2} {:>8.2}",
        "ptp",
        "in-process",
        "DEL",
        veth_del.pct(0.5),
        veth_del.pct(0.99)
    );
    println!(
        "{:<9} {:<10} {:<4} {:>8.2} {:>8.2}",
        "macvlan",
        "in-process",
        "DEL",
        macvlan_del.pct(0.5),
        macvlan_del.pct(0.99)
    );
    println!("\nratio corvid/reference (p50; lower is better; the issue's target for ADD is 0.3)");
    for case in &cases {
        for op in ["ADD", "DEL"] {
            println!(
                "  {} {op}: {:.3}",
                case.plugin,
                p50[&(case.plugin, "corvid", op)] / p50[&(case.plugin, "reference", op)]
            );
        }
    }
    println!(
        "corvid's DEL against deleting the link in process: ptp {:.3}, macvlan {:.3}",
        p50[&("ptp", "corvid", "DEL")] / veth_del.pct(0.5),
        p50[&("macvlan", "corvid", "DEL")] / macvlan_del.pct(0.5)
    );
}

/// The macvlan master every host namespace has: one end of a veth pair, up.
fn master(host: &Netns) {
    let mut nl = Netlink::open_in(host).unwrap();
    let status = std::process::Command::new("ip")
        .args(["-n"])
        .arg(host.path().file_name().unwrap())
        .args([
            "link", "add", "cvtbm0", "type", "veth", "peer", "name", "cvtbm1",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    for name in ["cvtbm0", "cvtbm1"] {
        let l = nl.link_by_name(name).unwrap().unwrap();
        nl.set_up(&l).unwrap();
    }
}

/// Deleting the container's link from a socket in its namespace, timed: a veth pair
/// (ptp's), and a macvlan, each up with an address. All links are made first and deleted in a second pass, as the
/// plugins' DELs come long after their ADDs (a link deleted at once after its creation
/// waits on the kernel's work for the new link as well).
fn kernel_floors(tag: &str, host: &Netns, n: usize) -> (Phase, Phase) {
    let (mut veth, mut mv) = (Phase::default(), Phase::default());
    let mut host_nl = Netlink::open_in(host).unwrap();
    let parent = host_nl.link_by_name("cvtbm0").unwrap().unwrap();
    let pods: Vec<(Ns, Netns)> = (0..2 * n)
        .map(|i| {
            let pod = Ns::new(format!("{tag}-kf{i}"));
            let ns = Netns::open(&pod.0).unwrap();
            (pod, ns)
        })
        .collect();
    let (veth_pods, macvlan_pods) = pods.split_at(n);
    let mut made = Vec::new();
    for (_, ns) in veth_pods {
        let mut container = Netlink::open_in(ns).unwrap();
        let spec = VethSpec {
            ifname: "eth0",
            mtu: None,
            hairpin: false,
            vlan: None,
            keep_default_vlan: true,
            mac: None,
            host_name: None,
            alias: None,
            kept: &[],
        };
        let p = pair(&mut host_nl, &mut container, ns, &spec).unwrap();
        made.push((container, p.container));
    }
    for (_, ns) in macvlan_pods {
        let spec = ChildSpec {
            name: "eth0",
            parent: parent.index,
            kind: ChildKind::Macvlan(MacvlanMode::Bridge),
            mtu: None,
            mac: None,
            bcqueuelen: None,
        };
        host_nl.add_child(&spec, Some(ns)).unwrap();
        let mut container = Netlink::open_in(ns).unwrap();
        let l = container.link_by_name("eth0").unwrap().unwrap();
        made.push((container, l));
    }
    // Up and addressed, as the plugins leave them: deleting a link with addresses, routes
    // and IPv6 link-local state costs the kernel more than deleting a bare one.
    for (i, (container, link)) in made.iter_mut().enumerate() {
        container.set_up(link).unwrap();
        let addr: ipnet::IpNet = format!("10.205.{}.{}/16", i / 250, i % 250 + 2)
            .parse()
            .unwrap();
        container.add_address(link.index, &addr).unwrap();
    }
    // As long as the plugins' ADD phase took, roughly: the new links' timers settle.
    std::thread::sleep(std::time::Duration::from_secs(2));
    for (i, (container, link)) in made.iter_mut().enumerate() {
        let began = Instant::now();
        container.delete_link(link).unwrap();
        let phase = if i < n { &mut veth } else { &mut mv };
        phase.samples.push(began.elapsed());
    }
    (veth, mv)
}
