//! corvid's plugins under a real runtime: rootful podman with its CNI backend, all state
//! private to the test, run with a private host network namespace.

mod support;

use serde_json::json;
use std::path::Path;
use std::process::Command;
use support::*;

struct Podman<'a> {
    host: &'a TestNs,
    dir: &'a Path,
}

impl Podman<'_> {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = self.host.command("podman");
        c.env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("runroot"))
            .args(args);
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args).output().expect("run podman");
        assert!(
            out.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Podman<'_> {
    /// Whatever happened, no container of the test keeps running.
    fn drop(&mut self) {
        let _ = self.cmd(&["rm", "-a", "-f", "-t", "0"]).output();
    }
}

/// A private podman state directory `dir`: a busybox image to import, a containers.conf
/// using the CNI backend with corvid's plugins, and `conflist` as its only network.
fn prepare(dir: &Path, plugins: &PluginDir, conflist: &serde_json::Value) {
    assert!(
        Path::new("/usr/bin/podman").exists(),
        "install podman, runc and busybox-static"
    );
    for d in ["conf", "root", "runroot", "rootfs/bin"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::copy("/usr/bin/busybox", dir.join("rootfs/bin/busybox")).unwrap();
    for applet in ["sh", "ip", "ping", "sleep", "cat", "httpd"] {
        std::os::unix::fs::symlink("busybox", dir.join("rootfs/bin").join(applet)).unwrap();
    }
    let tar = Command::new("tar")
        .arg("-C")
        .arg(dir.join("rootfs"))
        .arg("-cf")
        .arg(dir.join("rootfs.tar"))
        .arg(".")
        .status()
        .unwrap();
    assert!(tar.success());
    std::fs::write(
        dir.join("containers.conf"),
        format!(
            "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\
             [engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n\
             [network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [\"{}\"]\nnetwork_config_dir = \"{}\"\n",
            plugins.path().display(),
            dir.join("conf").display()
        ),
    )
    .unwrap();
    let name = conflist["name"].as_str().unwrap();
    std::fs::write(
        dir.join(format!("conf/{name}.conflist")),
        conflist.to_string(),
    )
    .unwrap();
}

#[test]
fn podman_containers_get_addresses_talk_and_leave_nothing() {
    let host = TestNs::new();
    let plugins = PluginDir::new();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let data = dir.join("leases");
    prepare(
        dir,
        &plugins,
        &json!({"cniVersion": "1.0.0", "name": "cvtpod", "plugins": [
            {"type": "bridge", "bridge": "cvtbrp", "isGateway": true, "ipMasq": true,
             // podman learns a network's subnets (to check --ip) from `ranges` only.
             "ipam": {"type": "host-local", "dataDir": data,
                      "ranges": [[{"subnet": "10.97.0.0/24", "gateway": "10.97.0.1"}]]}}]}),
    );
    let podman = Podman { host: &host, dir };
    podman.ok(&[
        "import",
        dir.join("rootfs.tar").to_str().unwrap(),
        "cvt-busybox",
    ]);

    // A server with a static address (podman passes it as CNI_ARGS IP=).
    podman.ok(&[
        "run",
        "-d",
        "--name",
        "cvtsrv",
        "--network",
        "cvtpod",
        "--ip",
        "10.97.0.50",
        "cvt-busybox",
        "sleep",
        "120",
    ]);
    let lease = std::fs::read_to_string(data.join("cvtpod/10.97.0.50")).unwrap();
    assert!(lease.ends_with("\r\neth0"), "{lease:?}");
    assert!(host.ping("10.97.0.50"), "the host reaches the container");
    assert_eq!(host.masquerade_rules().len(), 1);

    // A client that pings it, and shows its own address.
    let out = podman.ok(&[
        "run",
        "--rm",
        "--network",
        "cvtpod",
        "--cap-add",
        "NET_RAW",
        "cvt-busybox",
        "sh",
        "-c",
        "ip -4 addr show eth0 && ping -c 1 -W 2 10.97.0.50",
    ]);
    assert!(out.contains("inet 10.97.0."), "{out}");
    assert!(out.contains("1 packets received"), "{out}");

    podman.ok(&["rm", "-f", "-t", "0", "cvtsrv"]);
    assert!(
        leases(&data, "cvtpod").is_empty(),
        "leases left: {:?}",
        leases(&data, "cvtpod")
    );
    assert!(host.veths().is_empty(), "veths left: {:?}", host.veths());
    assert!(host.masquerade_rules().is_empty());
    podman.ok(&["rmi", "-a", "-f"]);
}

/// Elements corvid's chained plugins left in the host's table.
fn table_tags(host: &TestNs) -> Vec<String> {
    host.run(|| {
        let mut nft = corvid_net::nftables::Nftables::open().unwrap();
        let mut tags = corvid_net::nftables::portmap::port_mapping_tags(&mut nft).unwrap();
        tags.extend(corvid_net::nftables::firewall::firewall_tags(&mut nft).unwrap());
        tags.extend(corvid_net::nftables::masquerade::masquerade_tags().unwrap());
        tags
    })
}

#[test]
fn podman_default_network_publishes_ports_with_corvid_plugins_only() {
    let (host, outside) = uplink();
    let plugins = PluginDir::new();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let data = dir.join("leases");
    let tuning = dir.join("tuning");
    // podman's default network, as its CNI backend writes it, every plugin corvid's.
    prepare(
        dir,
        &plugins,
        &json!({"cniVersion": "1.0.0", "name": "cvtpodd", "plugins": [
            {"type": "bridge", "bridge": "cvtbrd", "isGateway": true, "ipMasq": true,
             "hairpinMode": true,
             "ipam": {"type": "host-local", "dataDir": data, "routes": [{"dst": "0.0.0.0/0"}],
                      "ranges": [[{"subnet": "10.98.0.0/24", "gateway": "10.98.0.1"}]]}},
            {"type": "portmap", "capabilities": {"portMappings": true}},
            {"type": "firewall", "backend": ""},
            {"type": "tuning", "dataDir": tuning}]}),
    );
    let podman = Podman { host: &host, dir };
    podman.ok(&[
        "import",
        dir.join("rootfs.tar").to_str().unwrap(),
        "cvt-busybox",
    ]);
    std::fs::create_dir_all(dir.join("www")).unwrap();
    std::fs::write(dir.join("www/index.html"), "served by a podman container\n").unwrap();
    podman.ok(&[
        "run",
        "-d",
        "--name",
        "cvtweb",
        "--network",
        "cvtpodd",
        "-p",
        "18080:80",
        "-v",
        &format!("{}:/www", dir.join("www").display()),
        "cvt-busybox",
        "httpd",
        "-f",
        "-p",
        "80",
        "-h",
        "/www",
    ]);
    let get = |from: &TestNs, addr: &str| {
        let script = format!(
            "import urllib.request\nprint(urllib.request.urlopen('http://{addr}:18080/', timeout=3).read().decode())"
        );
        let out = from
            .command("python3")
            .args(["-c", &script])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let mut served = String::new();
    for _ in 0..50 {
        served = get(&outside, "10.251.0.1");
        if !served.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(
        served, "served by a podman container",
        "from another namespace"
    );
    assert_eq!(
        get(&host, "127.0.0.1"),
        "served by a podman container",
        "from the host"
    );
    assert!(!table_tags(&host).is_empty());

    podman.ok(&["rm", "-f", "-t", "0", "cvtweb"]);
    assert!(
        get(&outside, "10.251.0.1").is_empty(),
        "unpublished after rm"
    );
    assert_eq!(
        table_tags(&host),
        Vec::<String>::new(),
        "nothing left in corvid's table"
    );
    assert!(leases(&data, "cvtpodd").is_empty(), "leases left");
    assert!(
        host.veths().iter().all(|v| v == "cvtup"),
        "veths left: {:?}",
        host.veths()
    );
    assert!(
        std::fs::read_dir(&tuning).map_or(true, |mut d| d.next().is_none()),
        "tuning backups left"
    );
    podman.ok(&["rmi", "-a", "-f"]);
}
