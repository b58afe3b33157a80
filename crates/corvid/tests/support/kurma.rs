//! Test support for the Kurma runtime: a host (`corvid kurma run-networks`) in a private
//! host namespace over a private directory, plugin images built by the test, and a guard
//! that stops the host and unmounts every namespace it bound.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::ns::{wait_until, Ns};

/// A runtime: its host namespace, its directory, and its running host.
pub struct Runtime {
    pub host_ns: Ns,
    pub dir: tempfile::TempDir,
    pub host: Option<Child>,
}

/// `corvid` in `ns` with the runtime's directory.
fn corvid_in(ns: &Ns, dir: &Path) -> Command {
    let mut cmd = ns.command(env!("CARGO_BIN_EXE_corvid"));
    cmd.arg("kurma").arg("--dir").arg(dir);
    cmd
}

impl Runtime {
    /// A host namespace and directory, no host yet.
    pub fn new(tag: &str) -> Runtime {
        Runtime::new_in(tag, &std::env::temp_dir())
    }

    /// As `new`, with the runtime's directory made in `base`.
    pub fn new_in(tag: &str, base: &Path) -> Runtime {
        let host_ns = Ns::new(tag, "host");
        host_ns.ip("link set lo up");
        let dir = tempfile::Builder::new()
            .prefix("cvt-kurma")
            .tempdir_in(base)
            .unwrap();
        Runtime {
            host_ns,
            dir,
            host: None,
        }
    }

    /// `corvid kurma --dir DIR ...` in the host namespace.
    pub fn corvid(&self) -> Command {
        corvid_in(&self.host_ns, self.dir.path())
    }

    /// Writes `config` and starts the host on it; waits until it publishes its plugins.
    pub fn start(&mut self, config: &Value) {
        self.start_with(config, &[]);
    }

    /// As `start`, with extra arguments to `run-networks`. The host's log goes to
    /// `host.log` in the directory (shown when a test fails).
    pub fn start_with(&mut self, config: &Value, extra: &[&str]) {
        let path = self.dir.path().join("kurma.json");
        std::fs::write(&path, serde_json::to_vec_pretty(config).unwrap()).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("host.log"))
            .unwrap();
        let child = self
            .corvid()
            .arg("run-networks")
            .arg("--config")
            .arg(&path)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.host = Some(child);
        let state = self.dir.path().join("host.json");
        wait_until("the host's state", Duration::from_secs(60), || {
            state.exists()
                || self
                    .host
                    .as_mut()
                    .is_some_and(|h| h.try_wait().unwrap().is_some())
        });
        assert!(
            state.exists(),
            "the host stopped before it published its state"
        );
    }

    /// What the host logged.
    pub fn host_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("host.log")).unwrap_or_default()
    }

    /// What `network`'s plugin log holds (the runtime's notes, then its main's output).
    pub fn plugin_log(&self, network: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("logs/{network}.log")))
            .unwrap_or_default()
    }

    /// `network`'s entry in the host's published state.
    pub fn plugin(&self, network: &str) -> Value {
        self.state()["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["network"] == network)
            .unwrap_or_else(|| panic!("{network} in {}", self.state()))
            .clone()
    }

    /// The host's published state.
    pub fn state(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.dir.path().join("host.json")).unwrap()).unwrap()
    }

    /// The main PID of `network`'s plugin, while it runs.
    pub fn plugin_pid(&self, network: &str) -> Option<u64> {
        self.state()["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["network"] == network && p["status"] == "running")
            .and_then(|p| p["pid"].as_u64())
    }

    /// `pod add UUID [--network N]...`: its output.
    pub fn pod_add(&self, uuid: &str, networks: &[&str]) -> Output {
        let mut cmd = self.corvid();
        cmd.args(["pod", "add", uuid]);
        for n in networks {
            cmd.args(["--network", n]);
        }
        cmd.output().unwrap()
    }

    /// `pod add`, which must succeed: the pod's record.
    pub fn add(&self, uuid: &str, networks: &[&str]) -> Value {
        let out = self.pod_add(uuid, networks);
        assert!(
            out.status.success(),
            "pod add {uuid}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `pod del UUID`: its output.
    pub fn pod_del(&self, uuid: &str) -> Output {
        self.corvid().args(["pod", "del", uuid]).output().unwrap()
    }

    /// The pod's namespace on the host.
    pub fn netns(&self, uuid: &str) -> PathBuf {
        self.dir.path().join("netns").join(uuid)
    }

    /// `cmd` run in pod `uuid`'s namespace.
    pub fn in_pod(&self, uuid: &str, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.netns(uuid).display()))
            .arg(program);
        cmd
    }

    /// Whether pod `uuid` reaches `addr`.
    pub fn ping(&self, uuid: &str, addr: &str) -> bool {
        self.in_pod(uuid, "ping")
            .args(["-c1", "-W2", addr])
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    /// Stops the host (SIGTERM) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut h) = self.host.take() {
            let _ = Command::new("kill").arg(h.id().to_string()).status();
            let _ = h.wait();
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("the Kurma host's log:\n{}", self.host_log());
        }
        let netns = self.dir.path().join("netns");
        if let Ok(entries) = std::fs::read_dir(&netns) {
            for e in entries.flatten() {
                let _ = corvid_net::Netns::delete_path(&e.path());
            }
        }
        while rustix::mount::unmount(&netns, rustix::mount::UnmountFlags::DETACH).is_ok() {}
    }
}

/// One file of a test image's root filesystem.
pub enum Node {
    /// A copy of a host file, mode 0755.
    Copy(PathBuf),
    /// A script, mode 0755.
    Script(String),
    /// A symbolic link.
    Link(String),
}

/// Writes a gzip ACI of `name` running `exec`, with the `os/linux/privileged` isolator
/// Kurma's own images carried, and `files` (paths relative to the root filesystem).
pub fn write_aci(path: &Path, name: &str, exec: &[&str], files: &[(String, Node)]) {
    let manifest = serde_json::json!({
        "acKind": "ImageManifest", "acVersion": "0.8.11", "name": name,
        "labels": [{"name": "os", "value": "linux"}, {"name": "arch", "value": "amd64"}],
        "app": {"exec": exec, "user": "0", "group": "0",
            "isolators": [{"name": "os/linux/privileged", "value": true}]}
    });
    let gz = flate2::write::GzEncoder::new(
        std::fs::File::create(path).unwrap(),
        flate2::Compression::fast(),
    );
    let mut tar = tar::Builder::new(gz);
    let bytes = serde_json::to_vec(&manifest).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_size(bytes.len() as u64);
    h.set_mode(0o644);
    tar.append_data(&mut h, "manifest", bytes.as_slice())
        .unwrap();
    let mut dirs = std::collections::BTreeSet::new();
    dirs.insert("rootfs".to_string());
    for (p, _) in files.iter().filter(|(p, _)| !p.contains("..")) {
        let mut d = Path::new(p).parent();
        while let Some(dir) = d.filter(|d| !d.as_os_str().is_empty()) {
            dirs.insert(format!("rootfs/{}", dir.display()));
            d = dir.parent();
        }
    }
    for d in dirs {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        tar.append_data(&mut h, format!("{d}/"), std::io::empty())
            .unwrap();
    }
    for (p, node) in files {
        let path = format!("rootfs/{p}");
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o755);
        match node {
            Node::Copy(from) => {
                let bytes = std::fs::read(from).unwrap();
                h.set_size(bytes.len() as u64);
                tar.append_data(&mut h, &path, bytes.as_slice()).unwrap();
            }
            Node::Script(text) => {
                h.set_size(text.len() as u64);
                // Written raw: the tar crate refuses the unsafe paths the tests need.
                h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
                h.set_cksum();
                tar.append(&h, text.as_bytes()).unwrap();
            }
            Node::Link(target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                tar.append_link(&mut h, &path, target).unwrap();
            }
        }
    }
    tar.into_inner().unwrap().finish().unwrap().flush().unwrap();
}

/// busybox as /bin/busybox with the applets the test scripts use.
pub fn busybox() -> Vec<(String, Node)> {
    let mut files = vec![("bin/busybox".to_string(), Node::Copy("/bin/busybox".into()))];
    for applet in ["sh", "cat", "sed", "sleep", "echo", "mkdir", "tr", "mktemp"] {
        files.push((format!("bin/{applet}"), Node::Link("busybox".into())));
    }
    files
}

/// The main process of the shell images: reads its configuration and waits.
pub const WAIT_MAIN: &str = "#!/bin/sh\ncat > /tmp/config\nwhile :; do sleep 3600; done\n";

/// The image Kurma's own cni-netplugin was: Debian's reference CNI plugins behind shell
/// add/del wrappers (the plugin is the entry's top-level `type`, read past `ipam`'s).
pub fn write_reference_aci(path: &Path) {
    let wrapper = |command: &str| {
        format!(
            "#!/bin/sh\nset -e\npayload=$(cat)\n\
             plugin=$(echo \"$payload\" | tr -d '\\n' | sed -n -e 's/\"ipam\" *: *{{[^{{}}]*\\({{[^{{}}]*}}[^{{}}]*\\)*}}//' -e 's/.*\"type\" *: *\"\\([^\"]*\\)\".*/\\1/p')\n\
             [ -n \"$plugin\" ] || {{ echo 'No CNI plugin specified'; exit 1; }}\n\
             export CNI_PATH=/usr/lib/cni CNI_COMMAND={command} CNI_NETNS=$1 CNI_CONTAINERID=$2 CNI_IFNAME=${{3:-eth0}}\n\
             echo \"$payload\" | /usr/lib/cni/$plugin\n"
        )
    };
    let mut files = busybox();
    for p in ["bridge", "host-local", "loopback"] {
        files.push((
            format!("usr/lib/cni/{p}"),
            Node::Copy(format!("/usr/lib/cni/{p}").into()),
        ));
    }
    files.extend([
        (
            "lib/x86_64-linux-gnu/libc.so.6".to_string(),
            Node::Copy("/lib/x86_64-linux-gnu/libc.so.6".into()),
        ),
        (
            "lib64/ld-linux-x86-64.so.2".to_string(),
            Node::Copy("/lib64/ld-linux-x86-64.so.2".into()),
        ),
        ("opt/network/add".to_string(), Node::Script(wrapper("ADD"))),
        ("opt/network/del".to_string(), Node::Script(wrapper("DEL"))),
        (
            "opt/network/main".to_string(),
            Node::Script(WAIT_MAIN.into()),
        ),
    ]);
    write_aci(
        path,
        "example.com/kurma/cni-netplugin",
        &["/opt/network/main"],
        &files,
    );
}

/// corvid's plugin image, built by `corvid kurma build-image` into `out`: (ACI, OCI dir).
pub fn build_corvid_image(out: &Path) -> (PathBuf, PathBuf) {
    let built = Command::new(env!("CARGO_BIN_EXE_corvid"))
        .args([
            "kurma",
            "build-image",
            "--image-version",
            "0.1.0",
            "--plugins",
        ])
        .arg(crate::static_plugins::path())
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "build-image: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let text = String::from_utf8(built.stdout).unwrap();
    let mut lines = text.lines();
    (lines.next().unwrap().into(), lines.next().unwrap().into())
}

/// Copies the gzip ACI `from` to `to` with its manifest changed by `edit`.
pub fn rewrite_manifest(from: &Path, to: &Path, edit: impl FnOnce(&mut Value)) {
    let mut input = tar::Archive::new(flate2::read::GzDecoder::new(
        std::fs::File::open(from).unwrap(),
    ));
    let mut output = tar::Builder::new(flate2::write::GzEncoder::new(
        std::fs::File::create(to).unwrap(),
        flate2::Compression::fast(),
    ));
    let mut edit = Some(edit);
    for entry in input.entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut header = entry.header().clone();
        let mut body = Vec::new();
        entry.read_to_end(&mut body).unwrap();
        if entry.path().unwrap() == Path::new("manifest") {
            let mut manifest: Value = serde_json::from_slice(&body).unwrap();
            (edit.take().unwrap())(&mut manifest);
            body = serde_json::to_vec_pretty(&manifest).unwrap();
            header.set_size(body.len() as u64);
            header.set_cksum();
        }
        output.append(&header, body.as_slice()).unwrap();
    }
    assert!(edit.is_none(), "{}: no manifest", from.display());
    output
        .into_inner()
        .unwrap()
        .finish()
        .unwrap()
        .flush()
        .unwrap();
}

/// The ACI `aci` without its `os/linux/privileged` isolator, at `to`.
pub fn without_privileged_isolator(aci: &Path, to: &Path) {
    rewrite_manifest(aci, to, |m| {
        let isolators = m["app"]["isolators"].as_array_mut().unwrap();
        let before = isolators.len();
        isolators.retain(|i| i["name"] != "os/linux/privileged");
        assert_eq!(isolators.len(), before - 1, "no privileged isolator in {m}");
    });
}

/// Unpacks the gzip ACI `aci` into `dest`, as it is: what the store's copy must stay.
pub fn unpack_aci(aci: &Path, dest: &Path) {
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(
        std::fs::File::open(aci).unwrap(),
    ));
    tar.set_preserve_permissions(true);
    tar.unpack(dest).unwrap();
}

/// Every entry under `root` by path: its kind, mode, owner, and the sha256 of its
/// contents or its link target.
pub fn tree_digest(root: &Path) -> BTreeMap<String, String> {
    use sha2::Digest;
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let path = rel.join(e.file_name());
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let body = if m.is_file() {
                std::fs::read(e.path()).unwrap()
            } else if m.file_type().is_symlink() {
                std::fs::read_link(e.path())
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                Vec::new()
            };
            if m.is_dir() {
                stack.push(path.clone());
            }
            out.insert(
                path.display().to_string(),
                format!(
                    "{:o} {}:{} {:x}",
                    m.mode(),
                    m.uid(),
                    m.gid(),
                    sha2::Sha256::digest(&body)
                ),
            );
        }
    }
    out
}

/// Asserts two `tree_digest`s are equal, naming only the paths that differ.
pub fn assert_same_tree(
    got: &BTreeMap<String, String>,
    want: &BTreeMap<String, String>,
    what: &str,
) {
    let differ: Vec<_> = got
        .keys()
        .chain(want.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| got.get(*k) != want.get(*k))
        .map(|k| format!("{k}: {:?} (want {:?})", got.get(k), want.get(k)))
        .collect();
    assert!(differ.is_empty(), "{what} differs: {differ:#?}");
}

/// A directory on an overlayfs mount, unmounted on drop: overlayfs takes no upper
/// directory there, so a runtime in it must fall back to copies.
pub struct OnOverlay {
    base: tempfile::TempDir,
}

impl OnOverlay {
    /// Mounts a fresh overlay in a temporary directory.
    pub fn new() -> OnOverlay {
        let base = tempfile::Builder::new()
            .prefix("cvt-overlay")
            .tempdir()
            .unwrap();
        for d in ["lower", "upper", "work", "merged"] {
            std::fs::create_dir(base.path().join(d)).unwrap();
        }
        let b = base.path().display();
        let options = format!("lowerdir={b}/lower,upperdir={b}/upper,workdir={b}/work");
        rustix::mount::mount(
            "overlay",
            base.path().join("merged"),
            "overlay",
            rustix::mount::MountFlags::empty(),
            Some(std::ffi::CString::new(options).unwrap().as_c_str()),
        )
        .unwrap();
        OnOverlay { base }
    }

    /// The directory on the overlay.
    pub fn path(&self) -> PathBuf {
        self.base.path().join("merged")
    }
}

impl Drop for OnOverlay {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(self.path(), rustix::mount::UnmountFlags::DETACH);
    }
}
