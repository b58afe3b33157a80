//! ADD and DEL of a bridge + host-local configuration for N containers, one at a time and
//! 8 at a time, for corvid and for the reference plugins side by side in one run. The two
//! take turns in small chunks, so a noisy neighbour slows both alike.
//! Prints p50, p99, containers per second, corvid/reference ratios and the peak RSS of a
//! plugin process. Needs root and Debian's containernetworking-plugins.
//!
//! `cargo bench -p corvid-plugins --bench cni_bridge` (CORVID_BENCH_N sets N, default 64;
//! CORVID_BENCH_MASQ=1 adds ipMasq, which the reference does with iptables).

use corvid_net::Netns;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Ns(PathBuf);

impl Ns {
    fn new(name: String) -> Ns {
        Ns(Netns::create_named(&name).expect("create namespace (run as root)"))
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Netns::delete_path(&self.0);
    }
}

struct Impl {
    label: &'static str,
    bridge: PathBuf,
    cni_path: PathBuf,
}

/// One plugin run: wall time, and the peak RSS of the plugin and its IPAM child in KiB.
fn invoke(
    host: &Netns,
    imp: &Impl,
    cmd: &str,
    id: &str,
    netns: &Path,
    conf: &str,
) -> (Duration, i64) {
    let mut command = Command::new(&imp.bridge);
    command
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &imp.cni_path)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    host.apply_to(&mut command).unwrap();
    let start = Instant::now();
    // Reaped by wait4 below: std's wait cannot report the child's rusage.
    #[allow(clippy::zombie_processes)]
    let mut child = command.spawn().expect("spawn plugin");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.as_bytes())
        .unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 reaps exactly our child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let took = start.elapsed();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{} {cmd} {id} failed: {out}",
        imp.label
    );
    (took, usage.ru_maxrss)
}

#[derive(Default)]
struct Phase {
    samples: Vec<Duration>,
    wall: Duration,
    max_rss_kib: i64,
}

impl Phase {
    fn absorb(&mut self, other: Phase) {
        self.samples.extend(other.samples);
        self.wall += other.wall;
        self.max_rss_kib = self.max_rss_kib.max(other.max_rss_kib);
    }
    fn pct(&self, p: f64) -> f64 {
        let mut s = self.samples.clone();
        s.sort();
        let i = ((s.len() as f64 - 1.0) * p).round() as usize;
        s[i].as_secs_f64() * 1e3
    }
    fn rate(&self) -> f64 {
        self.samples.len() as f64 / self.wall.as_secs_f64()
    }
}

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
                        .map(|(i, ns)| invoke(host, imp, cmd, &format!("bench{i}"), &ns.0, conf))
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

/// Veth pairs plugged in-process on a bridge of a private host namespace, for timing what
/// any tool pays to take one away: `ip link del`, run in the container's namespace the
/// way the plugins are run.
struct Floor {
    _host: Ns,
    containers: Vec<(Ns, Netns)>,
    phase: Phase,
}

impl Floor {
    fn new(tag: &str, n: usize) -> Floor {
        use corvid_net::binding::{ensure_bridge, plug, BridgeSpec, VethSpec};
        use corvid_net::Netlink;
        let host_ns = Ns::new(format!("{tag}-k-h"));
        let mut host = Netlink::open_in(&Netns::open(&host_ns.0).unwrap()).unwrap();
        let bridge_spec = BridgeSpec {
            name: "cvtbrk",
            mtu: None,
            vlan_filtering: false,
            promisc: false,
        };
        let bridge = ensure_bridge(&mut host, &bridge_spec).unwrap();
        let spec = VethSpec {
            ifname: "eth0",
            mtu: None,
            hairpin: false,
            vlan: None,
            keep_default_vlan: true,
            mac: None,
            host_name: None,
        };
        let containers = (0..n)
            .map(|i| {
                let ns = Ns::new(format!("{tag}-k-{i}"));
                let netns = Netns::open(&ns.0).unwrap();
                let mut container = Netlink::open_in(&netns).unwrap();
                plug(&mut host, &mut container, &netns, &bridge, &spec).unwrap();
                (ns, netns)
            })
            .collect();
        Floor {
            _host: host_ns,
            containers,
            phase: Phase::default(),
        }
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

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n: usize = std::env::var("CORVID_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let masq = std::env::var("CORVID_BENCH_MASQ").is_ok_and(|v| v == "1");
    let reference = Path::new("/usr/lib/cni");
    assert!(
        reference.join("bridge").exists(),
        "install Debian's containernetworking-plugins"
    );
    let ours = tempfile::tempdir().unwrap();
    for name in corvid_plugins::PLUGIN_NAMES {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_corvid-plugins"), ours.path().join(name))
            .unwrap();
    }
    let impls = [
        Impl {
            label: "corvid",
            bridge: ours.path().join("bridge"),
            cni_path: ours.path().to_path_buf(),
        },
        Impl {
            label: "reference",
            bridge: reference.join("bridge"),
            cni_path: reference.to_path_buf(),
        },
    ];
    println!("bridge + host-local, {n} containers, ipMasq {masq}; times in ms\n");
    println!(
        "{:<10} {:<4} {:>3} {:>8} {:>8} {:>10} {:>9}",
        "impl", "op", "par", "p50", "p99", "ctr/s", "maxRSS"
    );
    let mut p50 = std::collections::HashMap::new();
    let tag = format!("cvb{}", std::process::id());
    for parallel in [1, 8] {
        // Per implementation: a private host namespace, a lease directory, N containers.
        let setups: Vec<_> = impls
            .iter()
            .map(|imp| {
                let host_ns = Ns::new(format!("{tag}-{}-{parallel}-h", imp.label));
                let host = Netns::open(&host_ns.0).unwrap();
                let data = tempfile::tempdir().unwrap();
                let conf = format!(
                    r#"{{"cniVersion":"1.0.0","name":"cvtbench","type":"bridge","bridge":"cvtbrb","isGateway":true,"ipMasq":{masq},
                        "ipam":{{"type":"host-local","subnet":"10.200.0.0/16","dataDir":"{}"}}}}"#,
                    data.path().display()
                );
                let containers: Vec<(usize, Ns)> =
                    (0..n).map(|i| (i, Ns::new(format!("{tag}-{}-{parallel}-{i}", imp.label)))).collect();
                // Warm up: the first ADD creates the bridge; it is not what is measured.
                let warm = Ns::new(format!("{tag}-{}-{parallel}-w", imp.label));
                invoke(&host, imp, "ADD", "warm", &warm.0, &conf);
                (host_ns, host, data, conf, containers, warm)
            })
            .collect();
        let chunk = (2 * parallel).max(4);
        // One at a time, DEL also takes turns with `ip link del` of the same kind of pair.
        let mut floor = (parallel == 1).then(|| Floor::new(&tag, n));
        for op in ["ADD", "DEL"] {
            let mut phases: Vec<Phase> = impls.iter().map(|_| Phase::default()).collect();
            for (round, start) in (0..n).step_by(chunk).enumerate() {
                let end = (start + chunk).min(n);
                if let Some(f) = floor.as_mut().filter(|_| op == "DEL") {
                    f.delete(start..end);
                }
                for k in 0..impls.len() {
                    let which = (k + round) % impls.len();
                    let (_, host, _, conf, containers, _) = &setups[which];
                    phases[which].absorb(phase(
                        host,
                        &impls[which],
                        op,
                        &containers[start..end],
                        conf,
                        parallel,
                    ));
                }
            }
            for (imp, ph) in impls.iter().zip(phases) {
                println!(
                    "{:<10} {:<4} {:>3} {:>8.2} {:>8.2} {:>10.1} {:>6} KiB",
                    imp.label,
                    op,
                    parallel,
                    ph.pct(0.5),
                    ph.pct(0.99),
                    ph.rate(),
                    ph.max_rss_kib
                );
                p50.insert((imp.label, op, parallel), ph.pct(0.5));
            }
        }
        if let Some(f) = floor {
            let p = f.phase.pct(0.5);
            println!(
                "{:<10} {:<4} {:>3} {:>8.2} {:>8.2} {:>10.1}",
                "ip link",
                "del",
                1,
                p,
                f.phase.pct(0.99),
                f.phase.rate()
            );
            p50.insert(("ip link", "DEL", 1), p);
        }
    }
    println!("\nratio corvid/reference (p50; lower is better)");
    for parallel in [1, 8] {
        for op in ["ADD", "DEL"] {
            let r = p50[&("corvid", op, parallel)] / p50[&("reference", op, parallel)];
            println!("  {op} x{parallel}: {r:.3}");
        }
    }
    let floor = p50[&("ip link", "DEL", 1)];
    println!(
        "\nDEL x1 above `ip link del` of the same pair: corvid {:.2} ms, reference {:.2} ms",
        p50[&("corvid", "DEL", 1)] - floor,
        p50[&("reference", "DEL", 1)] - floor,
    );
}
