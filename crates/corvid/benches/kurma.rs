//! Pod network setup through the Kurma runtime and corvid's plugin image, against the
//! same bridge + host-local through `corvid cni add`: what the plugin container's setns
//! and the extra exec of `/opt/network/add` cost. 100 pods one at a time, then ten at a
//! time, both paths alternating; p50 and p99, and the floor of the extra hop (a process
//! that does nothing, entered into the plugin container alike). Needs root and the static
//! plugin binary (`CORVID_STATIC_PLUGINS=$(scripts/build-static-plugins.sh --release)`).
//!
//! `cargo bench -p corvid --bench kurma` (CORVID_BENCH_N sets the pods per phase, 100).

#[path = "../tests/support/static_plugins.rs"]
mod static_plugins;

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corvid_net::Netns;

struct Ns(PathBuf);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Netns::delete_path(&self.0);
    }
}

/// Stops the host and unmounts the runtime's namespaces, whatever happened.
struct Host {
    child: Child,
    netns_dir: PathBuf,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
        if let Ok(entries) = std::fs::read_dir(&self.netns_dir) {
            for e in entries.flatten() {
                let _ = Netns::delete_path(&e.path());
            }
        }
        while rustix::mount::unmount(&self.netns_dir, rustix::mount::UnmountFlags::DETACH).is_ok() {
        }
    }
}

fn quantiles(label: &str, mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    let (p50, p99) = (at(0.5), at(0.99));
    println!("  {label:<40} p50 {p50:7.2}  p99 {p99:7.2}");
    (p50, p99)
}

fn run(cmd: &mut Command) {
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n: usize = std::env::var("CORVID_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let plugins = static_plugins::path();
    let corvid = PathBuf::from(env!("CARGO_BIN_EXE_corvid"));
    let tag = format!("cvb{}", std::process::id());
    let host_ns =
        Ns(Netns::create_named(&format!("{tag}-h")).expect("create namespace (run as root)"));
    let host = Netns::open(&host_ns.0).unwrap();
    let work = tempfile::Builder::new()
        .prefix("cvt-kbench")
        .tempdir()
        .unwrap();
    let dir = work.path().join("kurma");
    let in_host = |program: &Path| {
        let mut cmd = Command::new(program);
        host.apply_to(&mut cmd).unwrap();
        cmd
    };

    run(Command::new(&corvid)
        .args(["kurma", "build-image", "--plugins"])
        .arg(&plugins)
        .arg("--out")
        .arg(work.path()));
    let aci = std::fs::read_dir(work.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "aci"))
        .unwrap();
    let network = |name: &str, bridge: &str, subnet: &str, data: Option<&Path>| {
        let mut ipam = serde_json::json!({"type": "host-local", "subnet": subnet});
        if let Some(d) = data {
            ipam["dataDir"] = d.display().to_string().into();
        }
        serde_json::json!({"cniVersion": "1.0.0", "name": name, "type": "bridge",
            "bridge": bridge, "isGateway": true, "ipam": ipam})
    };
    let mut entry = network("kbench", &format!("{tag}k"), "10.96.0.0/16", None);
    entry["aci"] = format!("file://{}", aci.display()).into();
    entry["default"] = true.into();
    entry["containerInterface"] = "eth0".into();
    let config = work.path().join("kurma.json");
    std::fs::write(
        &config,
        serde_json::json!({"pod_networks": [entry]}).to_string(),
    )
    .unwrap();
    let child = in_host(&corvid)
        .args(["kurma", "--dir"])
        .arg(&dir)
        .args(["run-networks", "--config"])
        .arg(&config)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _host = Host {
        child,
        netns_dir: dir.join("netns"),
    };
    let state = dir.join("host.json");
    let start = Instant::now();
    while !state.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the Kurma host did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let (bin, conf_dir, cache) = (
        work.path().join("bin"),
        work.path().join("conf"),
        work.path().join("cache"),
    );
    run(Command::new(&corvid)
        .args(["cni", "install", "--from"])
        .arg(&plugins)
        .arg("--dir")
        .arg(&bin));
    std::fs::create_dir_all(&conf_dir).unwrap();
    let direct = network(
        "dbench",
        &format!("{tag}d"),
        "10.97.0.0/16",
        Some(&work.path().join("leases")),
    );
    std::fs::write(conf_dir.join("10-dbench.conf"), direct.to_string()).unwrap();
    let direct_netns = work.path().join("direct-netns");

    let kurma_add = |uuid: &str| {
        let start = Instant::now();
        run(in_host(&corvid)
            .args(["kurma", "--dir"])
            .arg(&dir)
            .args(["pod", "add", uuid]));
        start.elapsed()
    };
    let direct_add = |id: &str| {
        let start = Instant::now();
        let netns = Netns::create_in(&direct_netns, id).unwrap();
        run(in_host(&corvid)
            .args(["cni", "add", "dbench"])
            .arg(&netns)
            .args(["--container-id", id, "--conf-dir"])
            .arg(&conf_dir)
            .arg("--cni-path")
            .arg(&bin)
            .arg("--cache-dir")
            .arg(&cache));
        start.elapsed()
    };
    let uuid = |phase: &str, i: usize| format!("{phase}{i:04}-fbf6-41da-a2f8-eba218597f9c");

    let (mut k1, mut d1) = (Vec::new(), Vec::new());
    for i in 0..n {
        k1.push(kurma_add(&uuid("a", i)));
        d1.push(direct_add(&format!("d1-{i}")));
    }
    let (mut k10, mut d10) = (Vec::new(), Vec::new());
    for round in 0..n / 10 {
        k10.extend(std::thread::scope(|s| {
            let calls: Vec<_> = (0..10)
                .map(|j| s.spawn(move || kurma_add(&uuid("b", round * 10 + j))))
                .collect();
            calls
                .into_iter()
                .map(|c| c.join().unwrap())
                .collect::<Vec<_>>()
        }));
        d10.extend(std::thread::scope(|s| {
            let calls: Vec<_> = (0..10)
                .map(|j| s.spawn(move || direct_add(&format!("d10-{}", round * 10 + j))))
                .collect();
            calls
                .into_iter()
                .map(|c| c.join().unwrap())
                .collect::<Vec<_>>()
        }));
    }

    // The floor of the extra hop: a process doing nothing, spawned into the host namespace
    // and the plugin container's mount namespace as `/opt/network/add` is.
    let pid: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    let pid = pid["plugins"][0]["pid"].as_u64().unwrap();
    let mut floor = Vec::new();
    for _ in 0..n {
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).unwrap();
        let mut cmd = in_host(Path::new("/opt/cni/bin/corvid-plugins"));
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: one system call between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                Ok(rustix::thread::move_into_link_name_space(
                    ns.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Mount),
                )?)
            });
        }
        let start = Instant::now();
        let mut child = cmd.spawn().unwrap();
        drop(child.stdin.take().map(|mut s| s.write_all(b"{}")));
        child.wait().unwrap();
        floor.push(start.elapsed());
    }

    println!("Pod network setup, bridge + host-local, {n} pods per phase, ms");
    println!(" one at a time");
    let (kp50, kp99) = quantiles("Kurma: corvid kurma pod add", k1);
    let (dp50, dp99) = quantiles("direct: netns + corvid cni add", d1);
    println!(
        "  {:<40} p50 {:+7.2}  p99 {:+7.2}   [target p50 <= +2 ms]",
        "Kurma above direct",
        kp50 - dp50,
        kp99 - dp99
    );
    println!(" ten at a time");
    let (kp50, kp99) = quantiles("Kurma: corvid kurma pod add", k10);
    let (dp50, dp99) = quantiles("direct: netns + corvid cni add", d10);
    println!(
        "  {:<40} p50 {:+7.2}  p99 {:+7.2}   [target p50 <= +2 ms]",
        "Kurma above direct",
        kp50 - dp50,
        kp99 - dp99
    );
    quantiles("one exec of the static binary, entered", floor);
    println!(
        "  (both paths exec the static binary equally often: corvid's bridge runs inside add)"
    );

    for i in 0..n {
        run(in_host(&corvid).args(["kurma", "--dir"]).arg(&dir).args([
            "pod",
            "del",
            &uuid("a", i),
        ]));
        run(in_host(&corvid).args(["kurma", "--dir"]).arg(&dir).args([
            "pod",
            "del",
            &uuid("b", i),
        ]));
    }
    for id in (0..n)
        .map(|i| format!("d1-{i}"))
        .chain((0..n).map(|i| format!("d10-{i}")))
    {
        run(in_host(&corvid)
            .args(["cni", "del", "dbench"])
            .arg(direct_netns.join(&id))
            .args(["--container-id", &id, "--conf-dir"])
            .arg(&conf_dir)
            .arg("--cni-path")
            .arg(&bin)
            .arg("--cache-dir")
            .arg(&cache));
        let _ = Netns::delete_path(&direct_netns.join(&id));
    }
    while rustix::mount::unmount(&direct_netns, rustix::mount::UnmountFlags::DETACH).is_ok() {}
}
