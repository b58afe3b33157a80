//! ADD and DEL of a bridge + host-local configuration for N containers, one at a time and
//! 8 at a time, for corvid and for the reference plugins side by side in one run. The two
//! take turns in small chunks, so a noisy neighbour slows both alike.
//! Prints p50, p99, containers per second, corvid/reference ratios and the peak RSS of a
//! plugin process. Needs root and Debian's containernetworking-plugins.
//!
//! Runs without and with `ipMasq` (corvid's nftables sets, the reference's iptables
//! chains) as four lanes that take turns, and reports how masquerade moves corvid's ADD
//! and DEL against its own ADD without it and against the kernel's floor, and whether a
//! long network stays flat (the first 50 operations against the last 50).
//!
//! Two more lanes give each container an IPv6 address beside its IPv4 one (dual stack,
//! no masquerade), to set the dual-stack ADD against the IPv4-only ADD.
//!
//! `cargo bench -p corvid-plugins --bench cni_bridge` (CORVID_BENCH_N sets N, default 64;
//! CORVID_BENCH_MASQ=0 or 1 runs only one of the two; CORVID_BENCH_DUAL=0 leaves the
//! dual-stack lanes out; CORVID_BENCH_PAR=1 skips the 8-way
//! phase; CORVID_BENCH_REFERENCE=0 leaves the reference's lanes out; CORVID_BENCH_IPV6=0
//! turns IPv6 off in every namespace of the run, which takes away the kernel's flood of
//! each new interface's IPv6 announcements to every port of the bridge).

mod support;

use corvid_net::Netns;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{invoke, Impl, Ns, Phase};

/// Runs `cmd` for every container, `parallel` at a time.
fn phase(
    host: &Netns,
    imp: &Impl,
    cmd: &str,
    containers: &[(usize, Ns)],
    conf: &str,
    parallel: usize,
) -> Phase {
    let start = Instant::now();
    let chunks: Vec<Vec<&(usize, Ns)>> = (0..parallel)
        .map(|w| containers.iter().skip(w).step_by(parallel).collect())
        .collect();
    let results: Vec<(Duration, i64)> = std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|(i, ns)| {
                            let (took, rss, _) =
                                invoke(host, imp, "bridge", cmd, &format!("bench{i}"), &ns.0, conf);
                            (took, rss)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    Phase {
        wall: start.elapsed(),
        max_rss_kib: results.iter().map(|r| r.1).max().unwrap_or(0),
        samples: results.into_iter().map(|r| r.0).collect(),
    }
}

/// Veth pairs on a bridge of a private host namespace, for timing what the kernel alone
/// costs: putting a pair in place (corvid-net's `plug`, in process: the kernel's part of
/// an ADD with no process, no IPAM, no address) as the lanes ADD, and taking one away
/// (`ip link del`, run in the container's namespace the way the plugins are run) as they
/// DEL.
struct Floor {
    _host: Ns,
    host: corvid_net::Netlink,
    bridge: corvid_net::link::Link,
    containers: Vec<(Ns, Netns)>,
    added: Phase,
    phase: Phase,
}

impl Floor {
    fn new(tag: &str, n: usize) -> Floor {
        use corvid_net::binding::{ensure_bridge, BridgeSpec};
        use corvid_net::Netlink;
        let host_ns = Ns::new(format!("{tag}-k-h"));
        let mut host = Netlink::open_in(&Netns::open(&host_ns.0).unwrap()).unwrap();
        let bridge_spec = BridgeSpec {
            name: "cvtbrk",
            mtu: None,
            vlan_filtering: false,
            promisc: false,
            alias: None,
            ipv6: None,
        };
        let bridge = ensure_bridge(&mut host, &bridge_spec).unwrap();
        let containers = (0..n)
            .map(|i| {
                let ns = Ns::new(format!("{tag}-k-{i}"));
                let netns = Netns::open(&ns.0).unwrap();
                (ns, netns)
            })
            .collect();
        Floor {
            _host: host_ns,
            host,
            bridge,
            containers,
            added: Phase::default(),
            phase: Phase::default(),
        }
    }

    /// The kernel's part of an ADD: the pair plugged, its address, and the neighbours
    /// told (one broadcast the bridge floods to every port), with corvid's own calls.
    fn add(&mut self, range: std::ops::Range<usize>) {
        use corvid_net::binding::{configure, enable_ipv6_for, plug, VethSpec};
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
        let start = Instant::now();
        for i in range {
            let netns = &self.containers[i].1;
            let addr = std::net::Ipv4Addr::from(
                u32::from(std::net::Ipv4Addr::new(10, 77, 0, 2)) + i as u32,
            );
            let addrs = [ipnet::IpNet::new(addr.into(), 16).unwrap()];
            let mut container = corvid_net::Netlink::open_in(netns).unwrap();
            let one = Instant::now();
            let port = plug(&mut self.host, &mut container, netns, &self.bridge, &spec).unwrap();
            enable_ipv6_for(netns, &port.container, &addrs).unwrap();
            configure(&mut container, &port.container, &addrs, &[]).unwrap();
            corvid_net::announce::announce(&mut container, netns, &port.container, &addrs);
            self.added.samples.push(one.elapsed());
        }
        self.added.wall += start.elapsed();
    }

    fn delete(&mut self, range: std::ops::Range<usize>) {
        let start = Instant::now();
        for (_, netns) in &self.containers[range] {
            let mut command = Command::new("ip");
            command.args(["link", "del", "eth0"]);
            netns.apply_to(&mut command).unwrap();
            let one = Instant::now();
            let status = command.status().expect("run ip");
            self.phase.samples.push(one.elapsed());
            assert!(status.success(), "ip link del failed");
        }
        self.phase.wall += start.elapsed();
    }
}

/// p50, p50 of the first and of the last `window` operations, keyed by (lane, operation,
/// parallelism); ("ip link", "DEL", 1) is the floor.
type Figures = std::collections::HashMap<(&'static str, &'static str, usize), (f64, f64, f64)>;

/// One implementation with or without ipMasq, on a host namespace of its own.
struct Lane<'a> {
    label: &'static str,
    imp: &'a Impl,
    masq: bool,
    /// An IPv6 range beside the IPv4 one: each container gets an address in both.
    dual: bool,
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = support::containers();
    let masqs: Vec<bool> = match std::env::var("CORVID_BENCH_MASQ").as_deref() {
        Ok("0") => vec![false],
        Ok("1") => vec![true],
        _ => vec![false, true],
    };
    let parallels: Vec<usize> = match std::env::var("CORVID_BENCH_PAR").as_deref() {
        Ok("1") => vec![1],
        _ => vec![1, 8],
    };
    let ours = tempfile::tempdir().unwrap();
    let mut impls: Vec<Impl> = Impl::both(ours.path()).into();
    // CORVID_BENCH_REFERENCE=0 leaves the reference out: corvid's lanes and the floor alone.
    let with_reference = std::env::var("CORVID_BENCH_REFERENCE").map_or(true, |v| v != "0");
    if !with_reference {
        impls.truncate(1);
    }
    let dual = std::env::var("CORVID_BENCH_DUAL").map_or(true, |v| v != "0");
    // Every lane takes its turn in each round, so what the kernel is busy with (the
    // teardown of namespaces, a neighbour's load) falls on all of them alike.
    let lanes: Vec<Lane> = masqs
        .iter()
        .flat_map(|&masq| {
            impls.iter().map(move |imp| Lane {
                label: match (imp.label, masq) {
                    ("corvid", false) => "corvid",
                    ("corvid", true) => "corvid+masq",
                    (_, false) => "reference",
                    (_, true) => "ref+masq",
                },
                imp,
                masq,
                dual: false,
            })
        })
        .chain(
            impls
                .iter()
                .filter(|_| dual && masqs.contains(&false))
                .map(|imp| Lane {
                    label: if imp.label == "corvid" {
                        "corvid dual"
                    } else {
                        "ref dual"
                    },
                    imp,
                    masq: false,
                    dual: true,
                }),
        )
        .collect();
    let window = 50.min(n);
    println!("bridge + host-local, {n} containers per lane; times in ms");
    println!("(first/last: p50 of the first and last {window} operations)\n");
    let figures = run(&lanes, n, &parallels, window);
    if with_reference {
        println!("\nratio corvid/reference (p50; lower is better)");
    }
    for &masq in masqs.iter().filter(|_| with_reference) {
        for &parallel in &parallels {
            for op in ["ADD", "DEL"] {
                let (ours, theirs) = if masq {
                    ("corvid+masq", "ref+masq")
                } else {
                    ("corvid", "reference")
                };
                let r = figures[&(ours, op, parallel)].0 / figures[&(theirs, op, parallel)].0;
                println!("  {op} x{parallel}, ipMasq {masq}: {r:.3}");
            }
        }
    }
    let floor = figures[&("ip link", "DEL", 1)];
    for lane in &lanes {
        println!(
            "DEL x1 above `ip link del` of the same pair, {}: {:.2} ms",
            lane.label,
            figures[&(lane.label, "DEL", 1)].0 - floor.0
        );
    }
    let plug = figures[&("plug", "ADD", 1)];
    println!("\nADD as the bridge fills up, one at a time: p50 of the last {window} / first {window}, and the growth in ms");
    println!(
        "  the kernel's floor (plug, address, announce): {:.3}, {:.2} ms",
        plug.2 / plug.1,
        plug.2 - plug.1
    );
    for lane in &lanes {
        let add = figures[&(lane.label, "ADD", 1)];
        println!(
            "  {}: {:.3}, {:.2} ms, {:.2} ms above the floor's growth",
            lane.label,
            add.2 / add.1,
            add.2 - add.1,
            (add.2 - add.1) - (plug.2 - plug.1)
        );
    }
    if let Some(dual) = figures.get(&("corvid dual", "ADD", 1)) {
        let single = figures[&("corvid", "ADD", 1)];
        println!("\ndual stack, one at a time (target in brackets)");
        println!(
            "  corvid: dual-stack ADD / IPv4-only ADD: {:.3} [<= 1.2]",
            dual.0 / single.0
        );
        if let Some(r) = figures.get(&("ref dual", "ADD", 1)) {
            println!(
                "  reference: dual-stack ADD / IPv4-only ADD: {:.3}",
                r.0 / figures[&("reference", "ADD", 1)].0
            );
            println!("  dual-stack ADD, corvid / reference: {:.3}", dual.0 / r.0);
        }
    }
    if masqs.len() == 2 {
        let add = figures[&("corvid+masq", "ADD", 1)];
        let add_plain = figures[&("corvid", "ADD", 1)];
        let del = figures[&("corvid+masq", "DEL", 1)];
        let del_plain = figures[&("corvid", "DEL", 1)];
        println!("\ncorvid's masquerade, one at a time (targets in brackets)");
        println!(
            "  ADD with ipMasq / ADD without: {:.3} [<= 1.15]",
            add.0 / add_plain.0
        );
        println!(
            "  DEL with ipMasq / `ip link del`: {:.3} [<= 1.05]",
            del.0 / floor.0
        );
        println!(
            "  ADD last {window} / first {window} (the network fills up): {:.3} [<= 1.1]; without ipMasq {:.3}",
            add.2 / add.1,
            add_plain.2 / add_plain.1
        );
        println!(
            "  DEL first {window} / last {window} (the network is full, then empties): {:.3} [<= 1.1]; without ipMasq {:.3}",
            del.1 / del.2,
            del_plain.1 / del_plain.2
        );
        println!(
            "  the kernel's floor itself: plugging a pair, last {window} / first {window}: {:.3}; `ip link del`, first / last: {:.3}",
            plug.2 / plug.1,
            floor.1 / floor.2
        );
        println!(
            "  ADD above plugging a pair, first {window} and last {window}: {:.2} ms, {:.2} ms (without ipMasq {:.2}, {:.2})",
            add.1 - plug.1,
            add.2 - plug.2,
            add_plain.1 - plug.1,
            add_plain.2 - plug.2
        );
    }
}

/// Prints one row of the table; returns the p50 of all, of the first and of the last
/// `window` operations.
fn row(
    label: &str,
    op: &str,
    parallel: usize,
    ph: &Phase,
    window: usize,
    rss: &str,
) -> (f64, f64, f64) {
    let last = ph.samples.len() - window;
    let figures = (
        ph.pct(0.5),
        ph.window_p50(0, window),
        ph.window_p50(last, window),
    );
    println!(
        "{:<12} {:<4} {:>3} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>10.1} {rss}",
        label,
        op,
        parallel,
        figures.0,
        figures.1,
        figures.2,
        ph.pct(0.99),
        ph.rate(),
    );
    figures
}

/// Every lane, one at a time and `parallel` at a time.
fn run(lanes: &[Lane], n: usize, parallels: &[usize], window: usize) -> Figures {
    println!(
        "{:<12} {:<4} {:>3} {:>8} {:>8} {:>8} {:>8} {:>10} {:>9}",
        "lane", "op", "par", "p50", "first", "last", "p99", "ctr/s", "maxRSS"
    );
    let mut p50 = Figures::new();
    let tag = format!("cvb{}", std::process::id());
    for &parallel in parallels {
        // Per lane: a private host namespace, a lease directory, N containers.
        let setups: Vec<_> = lanes
            .iter()
            .enumerate()
            .map(|(l, lane)| {
                let host_ns = Ns::new(format!("{tag}-{l}-{parallel}-h"));
                let host = Netns::open(&host_ns.0).unwrap();
                let data = tempfile::tempdir().unwrap();
                let ranges = if lane.dual {
                    r#"[[{"subnet":"10.200.0.0/16"}],[{"subnet":"fd00:200::/64"}]]"#
                } else {
                    r#"[[{"subnet":"10.200.0.0/16"}]]"#
                };
                let conf = format!(
                    r#"{{"cniVersion":"1.0.0","name":"cvtbench","type":"bridge","bridge":"cvtbrb","isGateway":true,"ipMasq":{},
                        "ipam":{{"type":"host-local","ranges":{ranges},"dataDir":"{}"}}}}"#,
                    lane.masq,
                    data.path().display()
                );
                let containers: Vec<(usize, Ns)> = (0..n)
                    .map(|i| (i, Ns::new(format!("{tag}-{l}-{parallel}-{i}"))))
                    .collect();
                // Warm up: the first ADD creates the bridge; it is not what is measured.
                let warm = Ns::new(format!("{tag}-{l}-{parallel}-w"));
                invoke(&host, lane.imp, "bridge", "ADD", "warm", &warm.0, &conf);
                (host_ns, host, data, conf, containers, warm)
            })
            .collect();
        let chunk = (2 * parallel).max(4);
        // One at a time, the kernel's floor takes its turn too: plugging a pair, deleting one.
        let mut floor = (parallel == 1).then(|| Floor::new(&tag, n));
        for op in ["ADD", "DEL"] {
            let mut phases: Vec<Phase> = lanes.iter().map(|_| Phase::default()).collect();
            for (round, start) in (0..n).step_by(chunk).enumerate() {
                let end = (start + chunk).min(n);
                if let Some(f) = floor.as_mut() {
                    match op {
                        "ADD" => f.add(start..end),
                        _ => f.delete(start..end),
                    }
                }
                for k in 0..lanes.len() {
                    let which = (k + round) % lanes.len();
                    let (_, host, _, conf, containers, _) = &setups[which];
                    phases[which].absorb(phase(
                        host,
                        lanes[which].imp,
                        op,
                        &containers[start..end],
                        conf,
                        parallel,
                    ));
                }
            }
            for (lane, ph) in lanes.iter().zip(phases) {
                let rss = format!("{:>6} KiB", ph.max_rss_kib);
                let figures = row(lane.label, op, parallel, &ph, window, &rss);
                p50.insert((lane.label, op, parallel), figures);
            }
        }
        if let Some(f) = floor {
            for (label, op, ph) in [("plug", "ADD", &f.added), ("ip link", "DEL", &f.phase)] {
                let figures = row(label, &op.to_lowercase(), 1, ph, window, "");
                p50.insert((label, op, 1), figures);
            }
        }
    }
    p50
}
