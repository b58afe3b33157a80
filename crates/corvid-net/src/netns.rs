//! Network namespace handles: open by path, enter with a guard that always returns the
//! thread to where it was, create and delete named namespaces under /run/netns.

use crate::{io_err, Error, Result};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
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
        // SAFETY: statfs is plain old data, zeroed is a valid value, and fstatfs fills it.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: the fd is open for the duration of the call.
        if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
            return Err(ns_err(path)(io::Error::last_os_error()));
        }
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
        setns(self.fd()).map_err(ns_err(&self.path))?;
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
            cmd.pre_exec(move || setns(file.as_raw_fd()));
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
            // SAFETY: unshare affects only this short-lived thread.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            mount_bind(Path::new("/proc/thread-self/ns/net"), &target)
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
        let c = cstr(path)?;
        // SAFETY: c is a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            let e = io::Error::last_os_error();
            if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) {
                return Err(ns_err(path)(e));
            }
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
        if let Err(e) = setns(self.original.fd()) {
            // A thread stuck in a container's namespace would act on the wrong host:
            // stopping is the only safe answer.
            eprintln!("corvid: cannot return to the original network namespace: {e}");
            std::process::abort();
        }
    }
}

fn setns(fd: RawFd) -> io::Result<()> {
    // SAFETY: fd is an open namespace file descriptor.
    if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn cstr(path: &Path) -> Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|e| {
        io_err(path.display().to_string())(io::Error::new(io::ErrorKind::InvalidInput, e))
    })
}

/// Makes `dir` a shared mount point of its own, as iproute2 and podman do with
/// /run/netns. A namespace mounted on a file of a plain directory is hidden, and can no
/// longer be deleted, once another tool bind-mounts the directory onto itself.
fn share_mount_point(dir: &Path) -> io::Result<()> {
    let d = cstr(dir).map_err(io::Error::other)?;
    let none = c"none";
    let mut bound = false;
    loop {
        // SAFETY: valid NUL-terminated strings; a propagation change takes no data.
        let shared = unsafe {
            libc::mount(
                none.as_ptr(),
                d.as_ptr(),
                none.as_ptr(),
                libc::MS_SHARED | libc::MS_REC,
                std::ptr::null(),
            )
        };
        if shared == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        // EINVAL: not a mount point yet.
        if bound || e.raw_os_error() != Some(libc::EINVAL) {
            return Err(e);
        }
        mount_bind(dir, dir)?;
        bound = true;
    }
}

fn mount_bind(src: &Path, dst: &Path) -> io::Result<()> {
    let (s, d) = (
        cstr(src).map_err(io::Error::other)?,
        cstr(dst).map_err(io::Error::other)?,
    );
    // SAFETY: both are valid NUL-terminated paths; no fs type or data for a bind mount.
    if unsafe {
        libc::mount(
            s.as_ptr(),
            d.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
