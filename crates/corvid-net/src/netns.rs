//! Network namespace handles: open by path, enter with a guard that always returns the
//! thread to where it was, create and delete named namespaces under /run/netns.

use crate::{io_err, Error, Result};
use rustix::io::Errno;
use rustix::mount::{MountPropagationFlags, UnmountFlags};
use rustix::thread::{LinkNameSpaceType, UnshareFlags};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};

const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Where named namespaces live, as with `ip netns`.
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// An open network namespace.
#[derive(Debug)]
pub struct Netns {
    file: File,
    path: PathBuf,
}

fn ns_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Netns {
        path: path.to_path_buf(),
        source,
    }
}

impl Netns {
    /// Opens the namespace at `path` (a /proc/PID/ns/net file or a bind mount of one);
    /// any other file is refused.
    pub fn open(path: impl AsRef<Path>) -> Result<Netns> {
        let path = path.as_ref();
        let file = File::open(path).map_err(ns_err(path))?;
        let st = rustix::fs::fstatfs(&file).map_err(|e| ns_err(path)(e.into()))?;
        if st.f_type as i64 != NSFS_MAGIC {
            return Err(ns_err(path)(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a network namespace",
            )));
        }
        Ok(Netns {
            file,
            path: path.to_path_buf(),
        })
    }

    /// The namespace the calling thread is in now.
    pub fn current() -> Result<Netns> {
        Netns::open("/proc/thread-self/ns/net")
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file descriptor, e.g. for IFLA_NET_NS_FD.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Moves the calling thread into this namespace until the guard is dropped.
    pub fn enter(&self) -> Result<NetnsGuard> {
        let original = Netns::current()?;
        setns(self.file.as_fd()).map_err(ns_err(&self.path))?;
        Ok(NetnsGuard { original })
    }

    /// Makes `cmd` run inside this namespace: the child enters it before exec, the caller's
    /// thread stays where it is. The command holds its own copy of the handle.
    pub fn apply_to(&self, cmd: &mut std::process::Command) -> Result<()> {
        use std::os::unix::process::CommandExt;
        let file = self.file.try_clone().map_err(ns_err(&self.path))?;
        // SAFETY: the closure runs between fork and exec and only calls setns, which is
        // async-signal-safe.
        unsafe {
            cmd.pre_exec(move || setns(file.as_fd()));
        }
        Ok(())
    }

    /// Runs `f` on the calling thread inside this namespace; the thread is back in its own
    /// namespace when this returns or unwinds.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        let _guard = self.enter()?;
        Ok(f())
    }

    /// Creates a named namespace at /run/netns/NAME, as `ip netns add` does.
    pub fn create_named(name: &str) -> Result<PathBuf> {
        Netns::create_in(Path::new(NETNS_RUN_DIR), name)
    }

    /// Creates a namespace bind-mounted at DIR/NAME; DIR becomes a shared mount point.
    pub fn create_in(dir: &Path, name: &str) -> Result<PathBuf> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(io_err(format!("namespace name \"{name}\""))(
                io::Error::new(io::ErrorKind::InvalidInput, "invalid name"),
            ));
        }
        std::fs::create_dir_all(dir).map_err(io_err(dir.display().to_string()))?;
        share_mount_point(dir).map_err(io_err(format!(
            "make {} a shared mount point",
            dir.display()
        )))?;
        let path = dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_err(path.display().to_string()))?;
        // unshare on a thread of its own: the new namespace must never become the
        // caller's, and the thread ends right after the bind mount keeps it alive.
        let target = path.clone();
        let made = std::thread::spawn(move || -> io::Result<()> {
            // SAFETY: a new network namespace leaves the file descriptor table shared,
            // and only this short-lived thread enters it.
            unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNET) }?;
            Ok(rustix::mount::mount_bind(
                "/proc/thread-self/ns/net",
                &target,
            )?)
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("namespace thread panicked")));
        if let Err(e) = made {
            let _ = std::fs::remove_file(&path);
            return Err(ns_err(&path)(e));
        }
        Ok(path)
    }

    /// Deletes a namespace made by `create_in`/`create_named`; a missing one is fine.
    pub fn delete_path(path: &Path) -> Result<()> {
        match rustix::mount::unmount(path, UnmountFlags::DETACH) {
            Ok(()) | Err(Errno::INVAL | Errno::NOENT) => {}
            Err(e) => return Err(ns_err(path)(e.into())),
        }
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(ns_err(path)(e)),
            _ => Ok(()),
        }
    }
}

/// Returns the thread to its original namespace when dropped, on every path.
#[derive(Debug)]
pub struct NetnsGuard {
    original: Netns,
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Err(e) = setns(self.original.file.as_fd()) {
            // A thread stuck in a container's namespace would act on the wrong host:
            // stopping is the only safe answer.
            tracing::error!("cannot return to the original network namespace: {e}");
            std::process::abort();
        }
    }
}

fn setns(fd: BorrowedFd) -> io::Result<()> {
    Ok(rustix::thread::move_into_link_name_space(
        fd,
        Some(LinkNameSpaceType::Network),
    )?)
}

/// Makes `dir` a shared mount point of its own, as iproute2 and podman do with
/// /run/netns. A namespace mounted on a file of a plain directory is hidden, and can no
/// longer be deleted, once another tool bind-mounts the directory onto itself.
pub fn share_mount_point(dir: &Path) -> io::Result<()> {
    let shared = MountPropagationFlags::SHARED | MountPropagationFlags::REC;
    match rustix::mount::mount_change(dir, shared) {
        // Not a mount point yet.
        Err(Errno::INVAL) => {
            rustix::mount::mount_bind(dir, dir)?;
            Ok(rustix::mount::mount_change(dir, shared)?)
        }
        r => Ok(r?),
    }
}
