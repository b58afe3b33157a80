//! Executor overhead: ADD of a 2-plugin list (corvid's bridge + the reference tuning)
//! through `corvid cni add`, and through the exec library in-process, against the same
//! two plugins driven by hand, container by container in turn. Prints p50s and the
//! overhead per list, and the cost of spawning a process that does nothing, which any
//! command-line executor pays. Needs root and Debian's containernetworking-plugins.
//!
//! `cargo bench -p corvid --bench cni_exec` (CORVID_BENCH_N sets N, default 48).

use corvid_cni::exec::{Runtime, RuntimeConf};
use corvid_cni::NetConfList;
use corvid_net::Netns;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Ns(PathBuf);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Netns::delete_path(&self.0);
    }
}

fn plugin(host: &Netns, exe: &Path, cni_path: &str, id: &str, netns: &Path, conf: &str) -> String {
    let mut cmd = Command::new(exe);
    cmd.env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    host.apply_to(&mut cmd).unwrap();
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn p50(v: &mut [Duration]) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n: usize = std::env::var("CORVID_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    let tag = format!("cvb{}", std::process::id());
    let host_ns =
        Ns(Netns::create_named(&format!("{tag}-h")).expect("create namespace (run as root)"));
    let host = Netns::open(&host_ns.0).unwrap();
    let work = tempfile::tempdir().unwrap();
    let (bin, conf_dir, cache) = (
        work.path().join("bin"),
        work.path().join("conf"),
        work.path().join("cache"),
    );
    let corvid = PathBuf::from(env!("CARGO_BIN_EXE_corvid"));
    let mut install = Command::new(&corvid);
    install
        .args(["cni", "install", "--dir"])
        .arg(&bin)
        .stdout(Stdio::null());
    assert!(
        install.status().unwrap().success(),
        "build corvid-plugins first"
    );
    // corvid has a tuning of its own now; the list's second plugin stays the reference's.
    std::fs::remove_file(bin.join("tuning")).unwrap();
    std::fs::copy("/usr/lib/cni/tuning", bin.join("tuning"))
        .expect("install containernetworking-plugins");
    std::fs::create_dir_all(&conf_dir).unwrap();
    let list_json = serde_json::json!({"cniVersion": "1.0.0", "name": "cvtbench", "plugins": [
        {"type": "bridge", "bridge": "cvtbrx", "isGateway": true,
         "ipam": {"type": "host-local", "subnet": "10.201.0.0/16", "dataDir": work.path().join("leases")}},
        {"type": "tuning", "mtu": 1400}]})
    .to_string();
    std::fs::write(conf_dir.join("10-bench.conflist"), &list_json).unwrap();
    let list = NetConfList::parse(list_json.as_bytes()).unwrap();
    let cni_path = bin.display().to_string();
    let mut rt = Runtime::new(vec![bin.clone()]);
    rt.cache_dir = cache.clone();

    let (mut cli, mut lib, mut hand, mut bare) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut keep = Vec::new();
    for i in 0..n {
        let nss: Vec<Ns> = (0..3)
            .map(|k| Ns(Netns::create_named(&format!("{tag}-{i}-{k}")).unwrap()))
            .collect();
        let start = Instant::now();
        let mut cmd = Command::new(&corvid);
        cmd.args(["cni", "add", "cvtbench"])
            .arg(&nss[0].0)
            .args(["--container-id", &format!("cli{i}"), "--conf-dir"])
            .arg(&conf_dir)
            .args(["--cni-path", &cni_path, "--cache-dir"])
            .arg(&cache)
            .stdout(Stdio::null());
        host.apply_to(&mut cmd).unwrap();
        assert!(cmd.status().unwrap().success());
        cli.push(start.elapsed());

        let conf = RuntimeConf {
            container_id: format!("lib{i}"),
            netns: nss[1].0.display().to_string(),
            ifname: "eth0".into(),
            ..RuntimeConf::default()
        };
        let start = Instant::now();
        host.run(|| rt.add(list_json.as_bytes(), &list, &conf))
            .unwrap()
            .unwrap();
        lib.push(start.elapsed());

        let start = Instant::now();
        let first = plugin(
            &host,
            &bin.join("bridge"),
            &cni_path,
            &format!("hand{i}"),
            &nss[2].0,
            &list.plugin_config(0, None).to_string(),
        );
        let prev: serde_json::Value = serde_json::from_str(&first).unwrap();
        plugin(
            &host,
            &bin.join("tuning"),
            &cni_path,
            &format!("hand{i}"),
            &nss[2].0,
            &list.plugin_config(1, Some(&prev)).to_string(),
        );
        hand.push(start.elapsed());

        // What any command-line tool pays before doing anything: one process, spawned
        // into the host namespace as `corvid cni add` is.
        let mut cmd = Command::new("/bin/true");
        host.apply_to(&mut cmd).unwrap();
        let start = Instant::now();
        assert!(cmd.status().unwrap().success());
        bare.push(start.elapsed());
        keep.extend(nss);
    }
    let (c, l, h, b) = (p50(&mut cli), p50(&mut lib), p50(&mut hand), p50(&mut bare));
    println!("ADD of bridge + tuning, {n} containers each, p50 in ms");
    println!("  by hand (two plugin runs)   {h:8.2}");
    println!(
        "  exec library, in-process    {l:8.2}   overhead {:+.2} ms, ratio {:.3}",
        l - h,
        l / h
    );
    println!(
        "  corvid cni add              {c:8.2}   overhead {:+.2} ms, ratio {:.3}",
        c - h,
        c / h
    );
    println!(
        "  /bin/true, spawned alike    {b:8.2}   so `corvid cni add` costs {:+.2} ms above one process",
        c - h - b
    );
}
