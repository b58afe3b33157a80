//! containerd's CRI plugin (Debian's containerd 1.6) as a node's kubelet uses it: a private
//! root, state and socket, pod namespaces under the state directory, the CNI plugins and
//! configuration of the test, and an offline pause image. Driven over CRI v1 (gRPC on the
//! unix socket) with the calls the kubelet makes.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListPodSandboxRequest, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxFilter, PodSandboxMetadata,
    PodSandboxStatusRequest, PodSandboxStatusResponse, RemovePodSandboxRequest,
    RunPodSandboxRequest, StopPodSandboxRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

use super::cluster::ns::{wait_until, Ns, Proc};

/// The label the kubelet puts the pod's UID in, on its sandboxes.
const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

/// The sandbox image the CRI plugin is told to use.
pub const PAUSE_IMAGE: &str = "cvt.local/pause:1";

/// The path of a sandbox's network namespace, from its verbose status.
pub fn sandbox_netns(status: &PodSandboxStatusResponse) -> String {
    let info: serde_json::Value = serde_json::from_str(&status.info["info"]).unwrap();
    info["runtimeSpec"]["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["type"] == "network")
        .and_then(|n| n["path"].as_str())
        .unwrap()
        .to_string()
}

/// A sandbox's address, from its status.
pub fn sandbox_ip(status: &PodSandboxStatusResponse) -> String {
    let network = status.status.as_ref().and_then(|s| s.network.as_ref());
    network.expect("the sandbox's network status").ip.clone()
}

/// A private containerd with its CRI plugin.
pub struct Containerd {
    _proc: Proc,
    dir: tempfile::TempDir,
    /// Its gRPC socket.
    pub socket: PathBuf,
}

impl Drop for Containerd {
    /// A test that panics leaves its pods' shims running (they outlive containerd) and
    /// their mounts under the state directory, which then cannot be removed: the shims
    /// are ended by PID, found by this containerd's socket, and the mounts detached.
    fn drop(&mut self) {
        let address = self.socket.display().to_string();
        for pid in shims_of(&address) {
            // SAFETY: kill(2) on a process this test's containerd started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let dir = self.dir.path().display().to_string();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mounts")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .filter(|m| m.starts_with(&dir))
            .collect();
        // The deepest first.
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = rustix::mount::unmount(m.as_str(), rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// The PIDs of the shims serving the containerd at `address`.
fn shims_of(address: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let shim = args.first()?.ends_with(b"containerd-shim-runc-v2");
            let ours = args
                .windows(2)
                .any(|w| w[0] == b"-address" && w[1] == address.as_bytes());
            (shim && ours).then_some(pid)
        })
        .collect()
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Archives the contents of `dir` as `to`.
fn tar(dir: &Path, to: &Path) -> PathBuf {
    let ok = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .arg("-cf")
        .arg(to)
        .arg(".")
        .status()
        .unwrap();
    assert!(ok.success(), "tar of {}", dir.display());
    to.to_path_buf()
}

/// Writes a blob into an OCI layout and returns its descriptor's digest and size.
fn blob(layout: &Path, from: &Path) -> (String, u64) {
    let digest = sha256(from);
    let size = std::fs::metadata(from).unwrap().len();
    std::fs::copy(from, layout.join("blobs/sha256").join(&digest)).unwrap();
    (format!("sha256:{digest}"), size)
}

/// An OCI image-layout tar of one uncompressed layer holding busybox, whose command sleeps
/// forever: what the CRI plugin runs as each pod's sandbox.
fn pause_image(dir: &Path) -> PathBuf {
    let root = dir.join("pause-rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/usr/bin/busybox", root.join("bin/busybox"))
        .expect("busybox-static is installed");
    let layer = tar(&root, &dir.join("layer.tar"));
    let layout = dir.join("pause-layout");
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    let (layer_digest, layer_size) = blob(&layout, &layer);
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": ["/bin/busybox", "sleep", "2147483647"]},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        })
        .to_string(),
    )
    .unwrap();
    let (config_digest, config_size) = blob(&layout, &config);
    let manifest = dir.join("manifest.json");
    std::fs::write(
        &manifest,
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer_digest, "size": layer_size}],
        })
        .to_string(),
    )
    .unwrap();
    let (manifest_digest, manifest_size) = blob(&layout, &manifest);
    std::fs::write(
        layout.join("index.json"),
        serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": manifest_digest, "size": manifest_size,
                           "annotations": {"io.containerd.image.name": PAUSE_IMAGE}}],
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    tar(&layout, &dir.join("pause.tar"))
}

impl Containerd {
    /// Starts containerd inside `node` (so the CNI plugins it runs see the node's network
    /// namespace as the host's), with `bin_dir` as CNI_PATH and `conflist` as the only
    /// network configuration.
    pub fn start(node: &Ns, bin_dir: &Path, conflist: &serde_json::Value) -> Containerd {
        let dir = tempfile::Builder::new()
            .prefix("cvt-containerd")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let conf_dir = d.join("net.d");
        std::fs::create_dir_all(&conf_dir).unwrap();
        std::fs::write(conf_dir.join("10-corvid.conflist"), conflist.to_string()).unwrap();
        let socket = d.join("containerd.sock");
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
"#,
            root = d.join("root").display(),
            state = d.join("state").display(),
            socket = socket.display(),
            bin = bin_dir.display(),
            conf = conf_dir.display(),
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(d.join("containerd.log")).unwrap();
        let child = node
            .command("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("containerd is installed");
        let c = Containerd {
            _proc: Proc(child),
            socket,
            dir,
        };
        wait_until("containerd", Duration::from_secs(30), || c.socket.exists());
        let tar = pause_image(c.dir.path());
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&c.socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(&tar)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ctr images import: {out:?}\n{}",
            c.log()
        );
        c
    }

    /// containerd's log, for assertion messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// The sandbox configuration the kubelet sends for pod `namespace/name`.
    pub fn sandbox_config(&self, namespace: &str, name: &str, uid: &str) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            labels: [(POD_UID_LABEL.to_string(), uid.to_string())].into(),
            hostname: name.into(),
            log_directory: self.dir.path().join("pods").join(uid).display().to_string(),
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Pod as i32,
                        pid: NamespaceMode::Pod as i32,
                        ipc: NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A CRI runtime client on the socket, in the calling runtime.
    pub async fn client(&self) -> RuntimeServiceClient<Channel> {
        let socket = self.socket.clone();
        let channel = Endpoint::try_from("http://[::]")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(socket).await?,
                    ))
                }
            }))
            .await
            .unwrap();
        RuntimeServiceClient::new(channel)
    }

    /// RunPodSandbox, then PodSandboxStatus (verbose) of the sandbox it made.
    pub fn run_sandbox(&self, config: PodSandboxConfig) -> (String, PodSandboxStatusResponse) {
        self.try_run_sandbox(config)
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}"))
    }

    /// The pod's sandbox as the kubelet's SyncPod makes it: after a RunPodSandbox that
    /// failed (a CNI ADD that failed), the sandboxes containerd kept for the pod are
    /// stopped (their DEL tried again) and the next RunPodSandbox carries the next
    /// attempt number; up to `tries` RunPodSandbox calls, a second apart (the kubelet's
    /// next sync). The errors of the failed attempts, when none worked.
    pub fn sync_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        tries: u32,
    ) -> Result<(String, PodSandboxStatusResponse), Vec<String>> {
        let mut errors = Vec::new();
        for attempt in 0..tries {
            let mut config = self.sandbox_config(namespace, name, uid);
            if let Some(m) = &mut config.metadata {
                m.attempt = attempt;
            }
            let (uid, made) = (uid.to_string(), self.try_run_sandbox(config));
            match made {
                Ok(done) => return Ok(done),
                Err(e) => errors.push(e),
            }
            self.run(|mut c| async move {
                let filter = PodSandboxFilter {
                    label_selector: [(POD_UID_LABEL.to_string(), uid)].into(),
                    ..Default::default()
                };
                let kept = c
                    .list_pod_sandbox(ListPodSandboxRequest {
                        filter: Some(filter),
                    })
                    .await
                    .map(|r| r.into_inner().items)
                    .unwrap_or_default();
                for s in kept {
                    let _ = c
                        .stop_pod_sandbox(StopPodSandboxRequest {
                            pod_sandbox_id: s.id,
                        })
                        .await;
                }
            });
            std::thread::sleep(Duration::from_secs(1));
        }
        Err(errors)
    }

    /// RunPodSandbox and PodSandboxStatus, or RunPodSandbox's error.
    fn try_run_sandbox(
        &self,
        config: PodSandboxConfig,
    ) -> Result<(String, PodSandboxStatusResponse), String> {
        self.run(|mut c| async move {
            let id = c
                .run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                })
                .await
                .map_err(|e| e.to_string())?
                .into_inner()
                .pod_sandbox_id;
            let status = c
                .pod_sandbox_status(PodSandboxStatusRequest {
                    pod_sandbox_id: id.clone(),
                    verbose: true,
                })
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            Ok((id, status))
        })
    }

    /// StopPodSandbox (DEL with the namespace) then RemovePodSandbox (DEL without it), as
    /// the kubelet ends a pod.
    pub fn remove_sandbox(&self, id: String) {
        self.run(|mut c| async move {
            c.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("StopPodSandbox: {e}"));
            c.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id })
                .await
                .unwrap_or_else(|e| panic!("RemovePodSandbox: {e}"));
        })
    }

    /// Runs `f` with a CRI runtime client, on a runtime of its own.
    pub fn run<F, T>(&self, f: impl FnOnce(RuntimeServiceClient<Channel>) -> F) -> T
    where
        F: Future<Output = T>,
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async { f(self.client().await).await })
    }
}
