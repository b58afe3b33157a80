//! The CNI crash matrix: `corvid cni` and the plugins it runs, killed with SIGKILL (the
//! whole process group, as a runtime's cgroup dies) at points spread over each operation,
//! then recovered the way a runtime recovers: DEL, or GC after the sandbox is gone. The
//! host namespace must then equal, link for link, rule for rule and file for file, what it
//! was with only the live containers, and those still answer.

mod support {
    pub mod ns;
}

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::ns::Ns;

/// The tests of this file one at a time: each times operations, and the others' load
/// would move the kill points.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Kill points per operation, spread over the operation's median time.
const POINTS: u32 = 33;

/// The networks of the matrix: name, bridge, subnet, and what the list holds.
const NETWORKS: [(&str, &str, &str, &str); 3] = [
    ("cvtplain", "cvtbrp", "10.97.0.0/24", "plain"),
    ("cvtmasq", "cvtbrm", "10.97.1.0/24", "masq"),
    ("cvtfull", "cvtbrf", "10.97.2.0/24", "full"),
];

struct Site {
    tag: String,
    host: Ns,
    bin: tempfile::TempDir,
    conf: tempfile::TempDir,
    /// Everything a plugin or the runtime writes: cache, leases, tuning's saved values.
    state: tempfile::TempDir,
}

impl Site {
    fn new(suffix: &str) -> Site {
        let tag = format!("cvt{}-{suffix}", std::process::id());
        let host = Ns::new(&tag, "h");
        let (bin, conf, state) = (tmp(), tmp(), tmp());
        let site = Site {
            tag,
            host,
            bin,
            conf,
            state,
        };
        let install = site.corvid(&["cni", "install", "--dir", site.path(&site.bin)]);
        assert!(install.status.success(), "{install:?}");
        for (name, bridge, subnet, kind) in NETWORKS {
            let data = site.state.path().join("leases");
            let bridge_conf = json!({"type": "bridge", "bridge": bridge, "isGateway": true,
                "ipMasq": kind != "plain",
                "ipam": {"type": "host-local", "subnet": subnet, "dataDir": data}});
            let mut plugins = vec![bridge_conf];
            if kind == "full" {
                plugins.extend([
                    json!({"type": "portmap", "capabilities": {"portMappings": true}}),
                    json!({"type": "firewall"}),
                    json!({"type": "tuning", "dataDir": site.state.path().join("tuning"),
                        "sysctl": {"net.ipv4.conf.eth0.arp_notify": "1"}}),
                    json!({"type": "bandwidth", "ingressRate": 100_000_000,
                        "ingressBurst": 1_000_000, "egressRate": 100_000_000,
                        "egressBurst": 1_000_000}),
                ]);
            }
            let list = json!({"cniVersion": "1.1.0", "name": name, "plugins": plugins});
            std::fs::write(
                site.conf.path().join(format!("{name}.conflist")),
                list.to_string(),
            )
            .unwrap();
        }
        site
    }

    fn path<'a>(&self, dir: &'a tempfile::TempDir) -> &'a str {
        dir.path().to_str().unwrap()
    }

    /// `corvid ARGS` in the host namespace.
    fn corvid(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = self.host.command(env!("CARGO_BIN_EXE_corvid"));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// `corvid cni ARGS` with this site's directories.
    fn cni_command(&self, args: &[&str]) -> Command {
        let cache = self.state.path().join("cache");
        let mut all = vec!["cni"];
        all.extend_from_slice(args);
        all.extend([
            "--conf-dir",
            self.path(&self.conf),
            "--cni-path",
            self.path(&self.bin),
            "--cache-dir",
            cache.to_str().unwrap(),
        ]);
        self.command(&all)
    }

    /// `corvid cni COMMAND NETWORK NETNS --container-id ID --json`.
    fn cni(&self, command: &str, network: &str, netns: &str, id: &str) -> Command {
        let mut args = vec![command, network, netns, "--container-id", id, "--json"];
        let port;
        if network == "cvtfull" && command == "add" {
            port = json!({"portMappings": [{"hostPort": host_port(id), "containerPort": 80,
                "protocol": "tcp"}]})
            .to_string();
            args.extend(["--capability-args", &port]);
        }
        self.cni_command(&args)
    }

    fn cni_ok(&self, command: &str, network: &str, netns: &str, id: &str) -> Value {
        let out = self.cni(command, network, netns, id).output().unwrap();
        assert!(
            out.status.success(),
            "{command} {network} {id}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn gc(&self, network: &str, keep: &[&str]) {
        let mut args = vec!["gc", network];
        for k in keep {
            args.extend(["--keep", k]);
        }
        let out = self.cni_command(&args).output().unwrap();
        assert!(out.status.success(), "gc {network}: {out:?}");
    }

    fn container(&self, name: &str) -> Ns {
        Ns::new(&self.tag, name)
    }

    /// One ADD and DEL, so the network's shared parts (bridge, tables) exist; returns
    /// how long the ADD took.
    fn warm_up(&self, network: &str) -> Duration {
        let c = self.container("warm");
        let netns = c.path.to_str().unwrap();
        let start = Instant::now();
        self.cni_ok("add", network, netns, "warm");
        let took = start.elapsed();
        self.cni_ok("del", network, netns, "warm");
        took
    }

    /// What the host holds: links, nftables, qdiscs, and every file under the state
    /// directory (temporary files included).
    fn snapshot(&self) -> Snapshot {
        let host = self.host.name();
        let run = |args: &[&str]| {
            let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
            assert!(out.status.success(), "{args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        let links = run(&["ip", "-n", &host, "-o", "link", "show"])
            .lines()
            .map(|l| l.split(": ").nth(1).unwrap().to_string())
            .collect();
        let nft = run(&["ip", "netns", "exec", &host, "nft", "list", "ruleset"])
            .lines()
            .map(strip_counters)
            .collect::<Vec<_>>()
            .join("\n");
        let qdiscs = run(&["tc", "-n", &host, "qdisc", "show"])
            .lines()
            .map(str::to_string)
            .collect();
        let mut files = BTreeSet::new();
        walk(self.state.path(), self.state.path(), &mut files);
        Snapshot {
            links,
            nft,
            qdiscs,
            files,
        }
    }
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// A host port of its own for each container (a port another attachment maps is taken
/// over, and would be lost with that attachment's DEL).
fn host_port(id: &str) -> u16 {
    match id
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .parse::<u16>()
    {
        Ok(n) => 20000 + n,
        Err(_) => 19000 + id.bytes().map(u16::from).sum::<u16>(),
    }
}

fn strip_counters(line: &str) -> String {
    match line.find("counter packets") {
        Some(i) => {
            let rest = &line[i..];
            let after = rest
                .splitn(5, ' ')
                .nth(4)
                .map(|s| format!(" {s}"))
                .unwrap_or_default();
            format!("{}counter{after}", &line[..i])
        }
        None => line.to_string(),
    }
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        out.insert(path.strip_prefix(root).unwrap().display().to_string());
        if path.is_dir() {
            walk(root, &path, out);
        }
    }
}

#[derive(PartialEq, Debug)]
struct Snapshot {
    links: BTreeSet<String>,
    nft: String,
    qdiscs: BTreeSet<String>,
    files: BTreeSet<String>,
}

impl Snapshot {
    /// What differs from `want`, for a failure message; empty when equal.
    fn diff(&self, want: &Snapshot) -> String {
        let mut out = String::new();
        let sets = [
            ("link", &self.links, &want.links),
            ("qdisc", &self.qdiscs, &want.qdiscs),
            ("file", &self.files, &want.files),
        ];
        for (what, have, want) in sets {
            for extra in have.difference(want) {
                out += &format!("extra {what}: {extra}\n");
            }
            for missing in want.difference(have) {
                out += &format!("missing {what}: {missing}\n");
            }
        }
        if self.nft != want.nft {
            out += &format!(
                "nftables differ:\n{}\n---- wanted:\n{}\n",
                self.nft, want.nft
            );
        }
        out
    }
}

/// Spawns `cmd` as the leader of its own process group. The test becomes a subreaper
/// first: the plugins of a killed runtime are then its children to reap, not init's
/// (which, on some machines, reaps orphans only every second or two).
fn spawn_group(cmd: &mut Command) -> Child {
    use std::os::unix::process::CommandExt;
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) }, 0);
    cmd.process_group(0).spawn().unwrap()
}

/// SIGKILL to the group after `delay`: true when the command had not finished by then.
fn kill_group_after(mut child: Child, delay: Duration) -> bool {
    std::thread::sleep(delay);
    let running = child.try_wait().unwrap().is_none();
    let group = -(child.id() as i32);
    unsafe { libc::kill(group, libc::SIGKILL) };
    let _ = child.wait();
    // The plugins of the killed runtime are ours now: reap the whole group, so nothing
    // of it still holds a namespace or a lock.
    while unsafe { libc::waitpid(group, std::ptr::null_mut(), 0) } > 0 {}
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ECHILD)
    );
    running
}

/// The host's state once the kernel has finished destroying removed namespaces (their
/// veths go with them, asynchronously), or as it is after `timeout`.
fn settled(site: &Site, baseline: &Snapshot, timeout: Duration) -> Snapshot {
    let start = Instant::now();
    loop {
        let now = site.snapshot();
        if now == *baseline || start.elapsed() > timeout {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// The first IPv4 address of a result.
fn ip_of(result: &Value) -> String {
    let cidr = result["ips"][0]["address"].as_str().unwrap();
    cidr.split('/').next().unwrap().to_string()
}

/// How a killed operation is recovered.
#[derive(Clone, Copy, Debug)]
enum Scenario {
    /// ADD killed, then DEL as the runtime retries teardown.
    AddThenDel,
    /// ADD killed, the sandbox removed, then GC keeping only the live containers.
    AddThenGc,
    /// DEL killed, then DEL again.
    DelThenDel,
}

/// One row of the report: kill points run, and how many interrupted the operation.
struct Row {
    network: &'static str,
    scenario: Scenario,
    passed: u32,
    interrupted: u32,
    took: Duration,
}

#[test]
fn killed_adds_and_dels_are_recovered_exactly() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let site = Site::new("crash");
    let mut rows = Vec::new();
    for (network, _, _, _) in NETWORKS {
        let live = site.container(&format!("{network}-live"));
        let live_ip = ip_of(&site.cni_ok("add", network, live.path.to_str().unwrap(), "live"));
        let baseline = site.snapshot();
        let gateway = |net: &str| {
            let subnet = NETWORKS.iter().find(|n| n.0 == net).unwrap().2;
            subnet.replace(".0/24", ".1")
        };
        assert!(live.ping(&gateway(network)));

        let probe = site.container(&format!("{network}-probe"));
        let probe_path = probe.path.to_str().unwrap().to_string();
        let (mut adds, mut dels) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let t = Instant::now();
            site.cni_ok("add", network, &probe_path, "probe");
            adds.push(t.elapsed());
            let t = Instant::now();
            site.cni_ok("del", network, &probe_path, "probe");
            dels.push(t.elapsed());
        }
        let (add_time, del_time) = (median(adds), median(dels));
        drop(probe);
        assert_eq!(site.snapshot().diff(&baseline), "");

        for scenario in [
            Scenario::AddThenDel,
            Scenario::AddThenGc,
            Scenario::DelThenDel,
        ] {
            let mut row = Row {
                network,
                scenario,
                passed: 0,
                interrupted: 0,
                took: Duration::ZERO,
            };
            let started = Instant::now();
            let op_time = match scenario {
                Scenario::DelThenDel => del_time,
                _ => add_time,
            };
            for point in 0..POINTS {
                // Over nine tenths of the operation's median: the machine is shared and an
                // operation may run faster than it was measured.
                let delay = op_time * 9 / 10 * point / POINTS;
                let id = format!("k{point}");
                let c = site.container(&format!("{network}-{point}"));
                let netns = c.path.to_str().unwrap().to_string();
                let interrupted = match scenario {
                    Scenario::AddThenDel | Scenario::AddThenGc => {
                        let child = spawn_group(&mut site.cni("add", network, &netns, &id));
                        kill_group_after(child, delay)
                    }
                    Scenario::DelThenDel => {
                        site.cni_ok("add", network, &netns, &id);
                        let child = spawn_group(&mut site.cni("del", network, &netns, &id));
                        kill_group_after(child, delay)
                    }
                };
                match scenario {
                    Scenario::AddThenDel | Scenario::DelThenDel => {
                        site.cni_ok("del", network, &netns, &id);
                        let left: Vec<String> =
                            c.links("").into_iter().filter(|l| l != "lo").collect();
                        assert!(
                            left.is_empty(),
                            "{network} {scenario:?} point {point}: {left:?} left in the container"
                        );
                        drop(c);
                    }
                    Scenario::AddThenGc => {
                        drop(c);
                        site.gc(network, &["live/eth0"]);
                    }
                }
                let now = match scenario {
                    Scenario::AddThenGc => settled(&site, &baseline, Duration::from_secs(5)),
                    _ => site.snapshot(),
                };
                let diff = now.diff(&baseline);
                assert!(
                    diff.is_empty(),
                    "{network} {scenario:?} killed at {delay:?} (point {point}):\n{diff}"
                );
                assert!(
                    live.ping(&gateway(network)),
                    "{network} {scenario:?} point {point}: the live container lost the gateway"
                );
                row.passed += 1;
                row.interrupted += u32::from(interrupted);
            }
            row.took = started.elapsed();
            rows.push(row);
        }
        site.cni_ok("del", network, live.path.to_str().unwrap(), "live");
        assert!(!site.host.ping(&live_ip));
    }
    println!("network    scenario      points passed  interrupted mid-operation  took");
    for r in &rows {
        println!(
            "{:<10} {:<13} {:>13} {:>12} {:>17.1?}",
            r.network,
            format!("{:?}", r.scenario),
            r.passed,
            r.interrupted,
            r.took
        );
        assert!(
            r.interrupted >= POINTS / 3,
            "{} {:?}: only {} points landed inside the operation",
            r.network,
            r.scenario,
            r.interrupted
        );
    }
}

/// Files of an attachment's cache entry that a killed runtime can leave: empty, torn.
#[test]
fn torn_and_empty_cache_files_never_block_del_or_gc() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let site = Site::new("torn");
    site.warm_up("cvtmasq");
    let cache = site.state.path().join("cache");
    for (n, damage) in ["empty", "torn", "garbage"].into_iter().enumerate() {
        let c = site.container(&format!("t{n}"));
        let netns = c.path.to_str().unwrap().to_string();
        let id = format!("t{n}");
        let baseline_before = site.snapshot();
        site.cni_ok("add", "cvtmasq", &netns, &id);
        let entry = cache.join(format!("cvtmasq-{id}-eth0"));
        let bytes = std::fs::read(&entry).unwrap();
        let damaged: &[u8] = match damage {
            "empty" => b"",
            "torn" => &bytes[..bytes.len() / 2],
            _ => b"\x00\xffnot json",
        };
        std::fs::write(&entry, damaged).unwrap();
        if n == 2 {
            // GC with the sandbox gone: the damaged entry is unreadable, so the plugins'
            // own GC must release what it held.
            drop(c);
            site.gc("cvtmasq", &[]);
        } else {
            site.cni_ok("del", "cvtmasq", &netns, &id);
            drop(c);
        }
        // The sandbox's veth goes with its namespace, which the kernel destroys later.
        let diff = settled(&site, &baseline_before, Duration::from_secs(5)).diff(&baseline_before);
        assert!(diff.is_empty(), "{damage} cache entry:\n{diff}");
    }
}

/// 64 ADDs at once on one network, 10 of them killed at random moments: the survivors
/// have distinct, reachable addresses, and after DEL of all 64 nothing is left.
#[test]
fn sixty_four_adds_with_ten_killed() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let site = Site::new("c64");
    let network = "cvtmasq";
    let add_time = site.warm_up(network);
    let baseline = site.snapshot();
    let containers: Vec<Ns> = (0..64).map(|i| site.container(&format!("c{i}"))).collect();
    let paths: Vec<String> = containers
        .iter()
        .map(|c| c.path.to_str().unwrap().to_string())
        .collect();
    let mut seed = u64::from(std::process::id()) | 1;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut victims = BTreeSet::new();
    while victims.len() < 10 {
        victims.insert((next() % 64) as usize);
    }
    let mut killers = Vec::new();
    let mut survivors = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let child = spawn_group(&mut site.cni("add", network, path, &format!("c{i}")));
        if victims.contains(&i) {
            // Within twice a lone ADD's time: 64 at once each take longer than that.
            let at = add_time * 2 * (next() % 100) as u32 / 100;
            killers.push(std::thread::spawn(move || kill_group_after(child, at)));
        } else {
            survivors.push((i, child));
        }
    }
    let mut addresses = Vec::new();
    for (i, child) in survivors {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "c{i}: {out:?}");
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        addresses.push((i, ip_of(&result)));
    }
    let interrupted = killers
        .into_iter()
        .map(|k| k.join().unwrap())
        .filter(|&running| running)
        .count();
    let distinct: BTreeSet<&String> = addresses.iter().map(|(_, a)| a).collect();
    assert_eq!(distinct.len(), 54, "duplicate addresses: {addresses:?}");
    for (i, a) in &addresses {
        assert!(site.host.ping(a), "c{i} at {a} unreachable");
    }
    println!("64 ADDs, 10 killed ({interrupted} mid-operation), 54 distinct addresses");
    assert!(
        interrupted >= 3,
        "only {interrupted} kills landed inside an ADD"
    );
    let dels: Vec<Child> = (0..64)
        .map(|i| {
            site.cni("del", network, &paths[i], &format!("c{i}"))
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, d) in dels.into_iter().enumerate() {
        let out = d.wait_with_output().unwrap();
        assert!(out.status.success(), "DEL c{i}: {out:?}");
    }
    drop(containers);
    let diff = site.snapshot().diff(&baseline);
    assert!(diff.is_empty(), "after DEL of all 64:\n{diff}");
}
