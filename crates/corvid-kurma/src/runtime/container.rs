//! A plugin container: the image's `app.exec` in a mount namespace of its own over a root
//! filesystem of its own, sharing the host's network, IPC, UTS and PID namespaces.
//!
//! The root is an overlay, as Kurma gave every container: the store's unpacked image
//! below, read-only and shared by every container of that image, and the container's
//! writes in an upper directory under the container's own directory, which goes with it.
//! Where overlayfs cannot be mounted there, the root is a private copy of the image's.

use std::ffi::{CStr, CString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::thread::UnshareFlags;

use crate::runtime::caps;

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
    /// The unpacked image's root filesystem in the store: the overlay's lower layer, never
    /// written.
    pub rootfs: PathBuf,
    /// The container's own directory (its overlay's upper and work directories, or its
    /// copy), made anew at each start and removed with the container.
    pub dir: PathBuf,
    /// The image carries the `os/linux/privileged` isolator: all capabilities; otherwise
    /// Kurma's default set.
    pub privileged: bool,
    /// The manifest's `app.exec`.
    pub exec: Vec<String>,
    /// The manifest's `app.environment`, then PATH when it sets none.
    pub env: Vec<(String, String)>,
    /// The volumes; their host directories must exist.
    pub volumes: Vec<Volume>,
    /// Where the main process's stdout and stderr go.
    pub log: PathBuf,
}

/// How a container's root filesystem was made its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Root {
    /// An overlay: the store's rootfs below, the container's writes in `upper/`.
    Overlay,
    /// A copy of the store's rootfs in `root/`, because overlayfs could not be mounted.
    Copy {
        /// Why not.
        why: String,
    },
}

/// A step of starting a container that failed.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct ContainerError {
    /// What was being done.
    pub step: String,
    /// Why it failed.
    pub source: std::io::Error,
}

/// Names the step a failure (an I/O error, or an errno of a system call) happened in.
pub(crate) fn step<E: Into<std::io::Error>>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> ContainerError {
    let step = what.into();
    move |source| ContainerError {
        step,
        source: source.into(),
    }
}

/// Why overlayfs cannot give a container its root here; the root is then a copy.
#[derive(Debug, thiserror::Error)]
enum OverlayError {
    /// A layer's path would be split apart in the mount options.
    #[error("{} holds a ',', ':' or '\\', which overlay's options cannot carry", .0.display())]
    Unwritable(PathBuf),
    /// The options hold a NUL byte.
    #[error(transparent)]
    Nul(#[from] std::ffi::NulError),
    /// A step of the trial mount.
    #[error(transparent)]
    Trial(#[from] ContainerError),
    /// The trial's thread panicked.
    #[error("the overlay trial panicked")]
    Panicked,
}

/// The directories every container gets.
const FILESYSTEMS: [&str; 5] = ["proc", "sys", "dev", "tmp", "run"];

/// The PATH a container gets when its manifest sets none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn c(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)
}

/// The directories of the container's root where something is mounted.
fn mount_points(spec: &Spec) -> Vec<PathBuf> {
    FILESYSTEMS
        .iter()
        .copied()
        .chain(
            spec.volumes
                .iter()
                .map(|v| v.inside.trim_start_matches('/')),
        )
        .map(PathBuf::from)
        .collect()
}

/// The overlay's mount options, when its paths can be written in them.
fn overlay_options(lower: &Path, dir: &Path) -> Result<CString, OverlayError> {
    let (upper, work) = (dir.join("upper"), dir.join("work"));
    let paths = [lower, &upper, &work];
    if let Some(p) = paths
        .iter()
        .find(|p| p.as_os_str().as_bytes().iter().any(|b| b",:\\".contains(b)))
    {
        return Err(OverlayError::Unwritable(p.to_path_buf()));
    }
    Ok(CString::new(format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    ))?)
}

/// Mounts the overlay at `root` in a mount namespace of a thread of its own, which the
/// host's never sees, and makes the mount points in it (they land in the upper layer, so
/// the container's own mount of the same layers has them). An error means overlayfs
/// cannot be used here; the mount points are then not made.
fn try_overlay(options: &CStr, root: &Path, points: &[PathBuf]) -> Result<(), OverlayError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: only this thread's mount namespace (and the filesystem attributes
            // it implies) is unshared; the thread ends here and shares no descriptors or
            // memory differently after it.
            unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS) }
                .map_err(step("a mount namespace to try overlayfs in"))?;
            rustix::mount::mount_change(
                c"/",
                MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
            )
            .map_err(step("making the trial's mounts private"))?;
            rustix::mount::mount(c"overlay", root, c"overlay", MountFlags::empty(), options)
                .map_err(step(format!(
                    "mount -t overlay -o {}",
                    options.to_string_lossy()
                )))?;
            let made = points
                .iter()
                .try_for_each(|p| std::fs::create_dir_all(root.join(p)));
            // Unmounted now, not with the namespace: the container's own mount of the
            // same upper directory must not find it in use.
            let unmounted = rustix::mount::unmount(root, UnmountFlags::empty());
            made.map_err(step("mount points in the overlay"))?;
            unmounted.map_err(step("unmounting the trial overlay"))?;
            Ok(())
        })
        .join()
        .unwrap_or(Err(OverlayError::Panicked))
    })
}

/// Copies the tree `from` into the existing directory `to`: directories, files, links
/// and special files with their owners and modes (hard links become separate files).
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dest) = (entry.path(), to.join(entry.file_name()));
        let meta = std::fs::symlink_metadata(&src)?;
        let kind = meta.file_type();
        if kind.is_dir() {
            std::fs::create_dir(&dest)?;
            copy_tree(&src, &dest)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dest)?;
        } else if kind.is_file() {
            std::fs::copy(&src, &dest)?;
        } else {
            let mode = meta.mode();
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &dest,
                rustix::fs::FileType::from_raw_mode(mode),
                rustix::fs::Mode::from_raw_mode(mode),
                meta.rdev(),
            )?;
        }
        std::os::unix::fs::lchown(&dest, Some(meta.uid()), Some(meta.gid()))?;
        if !kind.is_symlink() {
            // After the owner: chown clears set-user-ID and set-group-ID bits.
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(meta.mode()))?;
        }
    }
    Ok(())
}

/// Removes a container's directory (its overlay's layers or its copy).
pub fn remove(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Makes the container's directory anew and its root filesystem in it: an overlay when
/// overlayfs mounts there, else a copy of the image's root.
pub fn prepare(spec: &Spec) -> Result<Root, ContainerError> {
    let dir = &spec.dir;
    remove(dir).map_err(step(format!(
        "removing {}, left by an earlier container",
        dir.display()
    )))?;
    for sub in ["upper", "work", "root"] {
        std::fs::create_dir_all(dir.join(sub))
            .map_err(step(format!("making {}", dir.join(sub).display())))?;
    }
    let dir = dir
        .canonicalize()
        .map_err(step(format!("resolving {}", dir.display())))?;
    let lower = spec.rootfs.canonicalize().map_err(step(format!(
        "resolving the image's root {}",
        spec.rootfs.display()
    )))?;
    let root = dir.join("root");
    let points = mount_points(spec);
    let why = match overlay_options(&lower, &dir)
        .and_then(|options| try_overlay(&options, &root, &points))
    {
        Ok(()) => return Ok(Root::Overlay),
        Err(why) => why.to_string(),
    };
    for sub in ["upper", "work"] {
        remove(&dir.join(sub)).map_err(step(format!("removing {}", dir.join(sub).display())))?;
    }
    copy_tree(&lower, &root).map_err(step(format!(
        "copying {} to {} (overlayfs could not be mounted: {why})",
        lower.display(),
        root.display()
    )))?;
    for p in &points {
        std::fs::create_dir_all(root.join(p))
            .map_err(step(format!("making {} in the copy", p.display())))?;
    }
    Ok(Root::Copy { why })
}

/// Starts the container's main process on the root `prepare` made, with `stdin_text`
/// (the network's entry) on its stdin, which is then closed.
pub fn start(spec: &Spec, root_kind: &Root, stdin_text: &str) -> Result<Child, ContainerError> {
    let exec = spec.exec.first().ok_or_else(|| ContainerError {
        step: "reading the image's app.exec".into(),
        source: std::io::Error::other("it is empty"),
    })?;
    let dir = spec
        .dir
        .canonicalize()
        .map_err(step(format!("resolving {}", spec.dir.display())))?;
    let root = dir.join("root");
    let overlay = match root_kind {
        Root::Overlay => {
            let lower = spec
                .rootfs
                .canonicalize()
                .map_err(step(format!("resolving {}", spec.rootfs.display())))?;
            Some(overlay_options(&lower, &dir).map_err(|e| ContainerError {
                step: "the overlay's options".into(),
                source: std::io::Error::other(e),
            })?)
        }
        Root::Copy { .. } => None,
    };
    let paths = step("the container's paths");
    let built = (|| -> std::io::Result<_> {
        let mut mounts: Vec<(CString, CString)> = Vec::new();
        for v in &spec.volumes {
            mounts.push((
                c(&v.host)?,
                c(&root.join(v.inside.trim_start_matches('/')))?,
            ));
        }
        let at = |dir: &str| c(&root.join(dir));
        Ok((
            mounts,
            c(&root)?,
            [at("proc")?, at("sys")?, at("dev")?, at("tmp")?, at("run")?],
        ))
    })();
    let (mounts, root_c, [proc_, sys, dev, tmp, run]) = built.map_err(paths)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)
        .map_err(step(format!("opening the log {}", spec.log.display())))?;
    let err_log = log
        .try_clone()
        .map_err(step(format!("opening the log {}", spec.log.display())))?;
    let mut cmd = Command::new(exec);
    cmd.args(&spec.exec[1..])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(log)
        .stderr(err_log)
        .process_group(0);
    if !spec.env.iter().any(|(k, _)| k == "PATH") {
        cmd.env("PATH", DEFAULT_PATH);
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    let nodev = MountFlags::NOSUID | MountFlags::NODEV;
    let privileged = spec.privileged;
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
            match &overlay {
                Some(options) => rustix::mount::mount(
                    c"overlay",
                    root_c.as_c_str(),
                    c"overlay",
                    MountFlags::empty(),
                    options.as_c_str(),
                )?,
                None => rustix::mount::mount_bind_recursive(root_c.as_c_str(), root_c.as_c_str())?,
            }
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
            // Last: the mounts above need CAP_SYS_ADMIN.
            if !privileged {
                caps::restrict_to_kurma_default()?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(step(format!(
        "running {exec} in the container (its mounts, pivot_root{}, exec)",
        if privileged { "" } else { ", capabilities" }
    )))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A main process that never reads its configuration is not an error.
        let _ = stdin.write_all(stdin_text.as_bytes());
    }
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// (path, kind, mode, owner, contents or target) of every entry under `root`.
    fn listing(root: &Path) -> Vec<(PathBuf, String, u32, u32, Vec<u8>)> {
        let mut out = Vec::new();
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
                        .as_os_str()
                        .as_bytes()
                        .to_vec()
                } else {
                    Vec::new()
                };
                if m.is_dir() {
                    stack.push(path.clone());
                }
                let kind = format!("{:?}", m.file_type());
                out.push((path, kind, m.mode(), m.uid(), body));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_copy_keeps_kinds_modes_owners_and_contents() {
        // Owners and device nodes take root: the root lane runs this.
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let from = tempfile::tempdir().unwrap();
        let f = from.path();
        std::fs::create_dir_all(f.join("bin/sub")).unwrap();
        std::fs::write(f.join("bin/tool"), b"#!/bin/sh\n").unwrap();
        std::os::unix::fs::lchown(f.join("bin/tool"), Some(7), Some(8)).unwrap();
        std::fs::set_permissions(f.join("bin/tool"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        std::fs::set_permissions(f.join("bin/sub"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        symlink("tool", f.join("bin/sh")).unwrap();
        symlink("/nowhere", f.join("dangling")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            f.join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o640),
            0,
        )
        .unwrap();
        let to = tempfile::tempdir().unwrap();
        copy_tree(f, to.path()).unwrap();
        assert_eq!(listing(to.path()), listing(f));
        assert_eq!(
            std::fs::metadata(to.path().join("bin/tool"))
                .unwrap()
                .mode()
                & 0o7777,
            0o4755
        );
    }
}
