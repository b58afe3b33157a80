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

#[test]
fn podman_containers_get_addresses_talk_and_leave_nothing() {
    assert!(
        Path::new("/usr/bin/podman").exists(),
        "install podman, runc and busybox-static"
    );
    let host = TestNs::new();
    let plugins = PluginDir::new();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let data = dir.join("leases");
    for d in ["conf", "root", "runroot", "rootfs/bin"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::copy("/usr/bin/busybox", dir.join("rootfs/bin/busybox")).unwrap();
    for applet in ["sh", "ip", "ping", "sleep", "cat"] {
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
    std::fs::write(
        dir.join("conf/cvtpod.conflist"),
        json!({"cniVersion": "1.0.0", "name": "cvtpod", "plugins": [
            {"type": "bridge", "bridge": "cvtbrp", "isGateway": true, "ipMasq": true,
             // podman learns a network's subnets (to check --ip) from `ranges` only.
             "ipam": {"type": "host-local", "dataDir": data,
                      "ranges": [[{"subnet": "10.97.0.0/24", "gateway": "10.97.0.1"}]]}}]})
        .to_string(),
    )
    .unwrap();
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
