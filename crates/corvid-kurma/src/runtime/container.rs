//! A plugin container: the image's `app.exec` in a mount namespace of its own over the
//! image's root filesystem, sharing the host's network, IPC, UTS and PID namespaces.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::thread::UnshareFlags;

/// Where the pods' network namespaces appear inside a plugin container, as in Kurma.
pub const NETNS_IN_CONTAINER: &str = "/var/lib/kurma/netns";

/// Where a plugin's lasting state (host-local's leases among it) lives inside the
/// container: a host directory that outlives the container.
pub const STATE_IN_CONTAINER: &str = "/var/lib/cni";

/// A host directory mounted into the container.
#[derive(Debug, Clone)]
pub struct Volume {
    /// On the host.
    pub host: PathBuf,
    /// Inside the container (absolute).
    pub inside: &'static str,
}

/// What a plugin container runs on.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The unpacked image's root filesystem on the host.
    pub rootfs: PathBuf,
    /// The manifest's `app.exec`.
    pub exec: Vec<String>,
    /// The manifest's `app.environment`, then PATH when it sets none.
    pub env: Vec<(String, String)>,
    /// The volumes; their host directories must exist.
    pub volumes: Vec<Volume>,
    /// Where the main process's stdout and stderr go.
    pub log: PathBuf,
}

/// The directories every container gets.
const FILESYSTEMS: [&str; 5] = ["proc", "sys", "dev", "tmp", "run"];

/// The PATH a container gets when its manifest sets none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn c(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)
}

/// Starts the container's main process with `stdin_text` (the network's entry) on its
/// stdin, which is then closed.
pub fn start(spec: &Spec, stdin_text: &str) -> std::io::Result<Child> {
    let exec = spec
        .exec
        .first()
        .ok_or_else(|| std::io::Error::other("the image's app.exec is empty"))?;
    let root = spec.rootfs.canonicalize()?;
    let mut mounts: Vec<(CString, CString)> = Vec::new();
    for dir in FILESYSTEMS {
        std::fs::create_dir_all(root.join(dir))?;
    }
    for v in &spec.volumes {
        let inside = root.join(v.inside.trim_start_matches('/'));
        std::fs::create_dir_all(&inside)?;
        mounts.push((c(&v.host)?, c(&inside)?));
    }
    let root_c = c(&root)?;
    let at = |dir: &str| c(&root.join(dir));
    let (proc_, sys, dev, tmp, run) = (at("proc")?, at("sys")?, at("dev")?, at("tmp")?, at("run")?);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)?;
    let mut cmd = Command::new(exec);
    cmd.args(&spec.exec[1..])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    if !spec.env.iter().any(|(k, _)| k == "PATH") {
        cmd.env("PATH", DEFAULT_PATH);
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    let nodev = MountFlags::NOSUID | MountFlags::NODEV;
    // SAFETY: runs in the child between fork and exec. Every path was made a C string
    // before the fork; the closure only makes system calls and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            rustix::thread::unshare_unsafe(UnshareFlags::NEWNS)?;
            // Mounts made on the host later (the pods' namespaces) still reach us; ours
            // never reach the host.
            rustix::mount::mount_change(
                c"/",
                MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC,
            )?;
            rustix::mount::mount_bind_recursive(root_c.as_c_str(), root_c.as_c_str())?;
            rustix::mount::mount(
                c"proc",
                proc_.as_c_str(),
                c"proc",
                nodev | MountFlags::NOEXEC,
                None,
            )?;
            rustix::mount::mount(
                c"sysfs",
                sys.as_c_str(),
                c"sysfs",
                nodev | MountFlags::NOEXEC,
                None,
            )?;
            rustix::mount::mount_bind_recursive(c"/dev", dev.as_c_str())?;
            rustix::mount::mount(c"tmpfs", tmp.as_c_str(), c"tmpfs", nodev, None)?;
            rustix::mount::mount(c"tmpfs", run.as_c_str(), c"tmpfs", nodev, None)?;
            for (host, inside) in &mounts {
                rustix::mount::mount_bind_recursive(host.as_c_str(), inside.as_c_str())?;
            }
            rustix::process::chdir(root_c.as_c_str())?;
            rustix::process::pivot_root(c".", c".")?;
            rustix::mount::unmount(c".", UnmountFlags::DETACH)?;
            rustix::process::chdir(c"/")?;
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        // A main process that never reads its configuration is not an error.
        let _ = stdin.write_all(stdin_text.as_bytes());
    }
    Ok(child)
}
