//! The host-local store: `<dataDir>/<network>/<ip>` files holding `<containerID>\r\n<ifname>`,
//! `last_reserved_ip.<n>` per range set, and a `lock` file taken with flock, exactly as
//! the reference plugin lays them out. Unlike the reference, a lease is written as an
//! unnamed file (or a temporary name where the filesystem has no O_TMPFILE) before the lock
//! is taken, and linked into place under it, so a kill at any moment leaves either no lease
//! or the whole one. As in the reference, an ADD syncs nothing: see [`LeaseLock::reserve`].
//! `last_reserved_ip.<n>` is only a rotation hint and is overwritten in place; a torn hint
//! moves where the next search starts, nothing more.

use crate::Error;
use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags, CWD};
use rustix::io::Errno;
use rustix::process::Pid;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
/// Where corvid notes which addresses each attachment holds, so that ADD and DEL find
/// them without reading every lease (the reference's layout has no such index and reads
/// them all). Its files hold addresses, never `<id>\r\n<ifname>`, so the reference's
/// scans, which walk subdirectories too, pass over them.
const OWNERS_DIR: &str = ".corvid-owners";
const TEMP_PREFIX: &str = ".corvid-tmp.";
const LINE_BREAK: &str = "\r\n";

/// The reference plugin's default data directory.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// One network's lease directory.
#[derive(Debug)]
pub struct LeaseDir {
    dir: PathBuf,
    lock: File,
}

/// A lease found in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The leased address.
    pub ip: IpAddr,
    /// The owner's container ID; empty when the file is unreadable or empty.
    pub container_id: String,
    /// The owner's interface; empty for leases written by old reference versions.
    pub ifname: String,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

impl LeaseDir {
    /// Opens (creating if needed) the directory of `network` under `data_dir`.
    pub fn open(data_dir: &Path, network: &str) -> Result<LeaseDir, Error> {
        let dir = data_dir.join(network);
        fs::create_dir_all(&dir).map_err(io_err(format!("create {}", dir.display())))?;
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io_err(format!("open {}", lock_path.display())))?;
        Ok(LeaseDir { dir, lock })
    }

    /// The directory holding the leases.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the content of a lease for (id, ifname), not yet under any name:
    /// [`LeaseLock::reserve`] gives it one.
    pub fn prepare_lease(&self, id: &str, ifname: &str) -> Result<PreparedLease, Error> {
        let content = format!("{}{LINE_BREAK}{ifname}", id.trim());
        let unnamed = rustix::fs::open(
            &self.dir,
            OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map(File::from);
        match unnamed {
            Ok(mut f) => {
                f.write_all(content.as_bytes())
                    .map_err(io_err(format!("write a lease in {}", self.dir.display())))?;
                Ok(PreparedLease::Unnamed(f))
            }
            // Filesystems without O_TMPFILE answer with one of these.
            Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {
                let path = write_temp(&self.dir, &content)?;
                Ok(PreparedLease::Named { path, content })
            }
            Err(e) => Err(io_err(format!("write a lease in {}", self.dir.display()))(
                e.into(),
            )),
        }
    }

    /// Takes the exclusive lock the reference plugin also takes; released on drop.
    pub fn lock(&self) -> Result<LeaseLock<'_>, Error> {
        loop {
            match rustix::fs::flock(&self.lock, FlockOperation::LockExclusive) {
                Ok(()) => break,
                Err(Errno::INTR) => {}
                Err(e) => return Err(io_err("lock the lease directory")(e.into())),
            }
        }
        Ok(LeaseLock { store: self })
    }
}

/// A lease's content waiting for an address: an unnamed file, or a temporary name
/// that is removed on drop (the lease keeps its own link).
#[derive(Debug)]
pub enum PreparedLease {
    /// An O_TMPFILE file, linked into the directory by [`LeaseLock::reserve`].
    Unnamed(File),
    /// A temporary file, for filesystems without O_TMPFILE.
    Named {
        /// Where it is.
        path: PathBuf,
        /// What it holds, to write it again should it be removed meanwhile.
        content: String,
    },
}

impl Drop for PreparedLease {
    fn drop(&mut self) {
        if let PreparedLease::Named { path, .. } = self {
            let _ = fs::remove_file(path);
        }
    }
}

fn write_temp(dir: &Path, content: &str) -> Result<PathBuf, Error> {
    let mut n = 0u32;
    loop {
        let tmp = dir.join(format!("{TEMP_PREFIX}{}.{n}", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(mut f) => {
                if let Err(e) = f.write_all(content.as_bytes()) {
                    let _ = fs::remove_file(&tmp);
                    return Err(io_err(format!("write {}", tmp.display()))(e));
                }
                return Ok(tmp);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 16 => n += 1,
            Err(e) => return Err(io_err(format!("create {}", tmp.display()))(e)),
        }
    }
}

/// Gives an O_TMPFILE file the name `to`, through /proc so that no capability is needed.
fn link_unnamed(f: &File, to: &Path) -> io::Result<()> {
    let from = format!("/proc/self/fd/{}", f.as_raw_fd());
    rustix::fs::linkat(CWD, from.as_str(), CWD, to, AtFlags::SYMLINK_FOLLOW)?;
    Ok(())
}

/// True for a temporary file whose writer is gone: prepared leases are written outside
/// the lock, so only the writer's death makes one garbage. A writer in another PID
/// namespace may look dead; it then finds its file gone and writes it again.
fn is_stale_temp(name: &str) -> bool {
    let Some(pid) = name
        .strip_prefix(TEMP_PREFIX)
        .and_then(|rest| rest.split('.').next())
        .and_then(|pid| pid.parse::<i32>().ok())
    else {
        return true;
    };
    let Some(pid) = Pid::from_raw(pid) else {
        return true;
    };
    rustix::process::test_kill_process(pid) == Err(Errno::SRCH)
}

/// The store while its lock is held: the only way to read or change leases.
#[derive(Debug)]
pub struct LeaseLock<'a> {
    store: &'a LeaseDir,
}

impl Drop for LeaseLock<'_> {
    fn drop(&mut self) {
        // Closing the store unlocks too; an unlock that fails leaves nothing to undo.
        let _ = rustix::fs::flock(&self.store.lock, FlockOperation::Unlock);
    }
}

/// The leases of `network` under `data_dir`, read without the lock and without touching
/// anything (for inspection: `corvid doctor`); none when the directory does not exist.
pub fn inspect(data_dir: &Path, network: &str) -> Result<Vec<Lease>, Error> {
    let dir = data_dir.join(network);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(format!("read {}", dir.display()))(e)),
    };
    let mut out: Vec<Lease> = entries
        .flatten()
        .filter_map(|e| {
            let ip = e.file_name().to_string_lossy().parse::<IpAddr>().ok()?;
            let (container_id, ifname) = fs::read_to_string(e.path())
                .map(|c| parse_owner(&c))
                .unwrap_or_default();
            Some(Lease {
                ip,
                container_id,
                ifname,
            })
        })
        .collect();
    out.sort_by_key(|l| crate::range::to_u128(l.ip));
    Ok(out)
}

fn parse_owner(content: &str) -> (String, String) {
    let trimmed = content.trim();
    match trimmed
        .split_once(LINE_BREAK)
        .or_else(|| trimmed.split_once('\n'))
    {
        Some((id, ifname)) => (id.trim().to_string(), ifname.trim().to_string()),
        None => (trimmed.to_string(), String::new()),
    }
}

/// Reads a lease file relative to the open directory: every ADD reads all of them, and
/// openat plus one read is two syscalls fewer per lease than `fs::read_to_string`.
fn read_lease(dir: &File, name: &std::ffi::OsStr) -> Option<String> {
    let file = File::from(
        rustix::fs::openat(dir, name, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?,
    );
    let mut buf = [0u8; 512];
    let n = std::io::Read::read(&mut &file, &mut buf).ok()?;
    if n < buf.len() {
        return Some(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    let mut rest = String::from_utf8_lossy(&buf).into_owned();
    std::io::Read::read_to_string(&mut &file, &mut rest).ok()?;
    Some(rest)
}

impl LeaseLock<'_> {
    fn path(&self, name: &str) -> PathBuf {
        self.store.dir.join(name)
    }

    fn sync_dir(&self) -> Result<(), Error> {
        File::open(&self.store.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(format!("sync {}", self.store.dir.display())))
    }

    /// True when a file for `ip` exists, whoever wrote it and whatever it holds.
    pub fn is_reserved(&self, ip: IpAddr) -> bool {
        fs::symlink_metadata(self.path(&ip.to_string())).is_ok()
    }

    /// Gives `lease` the address `ip` and records it as the last reservation of range
    /// set `range_set`; hands the lease back when the address is already taken.
    pub fn reserve(
        &self,
        lease: PreparedLease,
        ip: IpAddr,
        range_set: usize,
    ) -> Result<Result<(), PreparedLease>, Error> {
        let final_path = self.path(&ip.to_string());
        // A link never replaces: it is the atomic form of the reference's O_EXCL create.
        let linked = match &lease {
            PreparedLease::Unnamed(f) => link_unnamed(f, &final_path),
            PreparedLease::Named { path, content } => match fs::hard_link(path, &final_path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let again = write_temp(&self.store.dir, content)?;
                    let linked = fs::hard_link(&again, &final_path);
                    let _ = fs::remove_file(&again);
                    linked
                }
                r => r,
            },
        };
        match linked {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(Err(lease)),
            r => r.map_err(io_err(format!("create {}", final_path.display())))?,
        }
        self.write_last_reserved(range_set, ip)?;
        // Nothing synced, as in the reference: a power cut that loses this lease, or its
        // content, also ended the container, and an fsync here would make every ADD wait
        // for the disk's journal (a fraction of a millisecond on this machine's disk, tens
        // on a busy node's). A lease left empty is named by the attachment's index entry,
        // which DEL after the reboot follows (see `owned_by`), or else goes at the next
        // GC. Releases do sync, since a lease that comes back after its DEL is never
        // released again.
        Ok(Ok(()))
    }

    /// Records `ip` as the last reservation of `range_set`. The record is only a rotation
    /// hint, so it is overwritten in place: a kill between the write and the truncate
    /// leaves at worst an unreadable or different address, which moves where the next
    /// search starts and nothing else. Replacing the file instead would free the old
    /// one's block, a synchronous discard on filesystems mounted with `discard`.
    fn write_last_reserved(&self, range_set: usize, ip: IpAddr) -> Result<(), Error> {
        use std::os::unix::fs::FileExt;
        let path = self.path(&format!("{LAST_RESERVED_PREFIX}{range_set}"));
        let text = ip.to_string();
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .and_then(|f| {
                f.write_all_at(text.as_bytes(), 0)?;
                f.set_len(text.len() as u64)
            })
            .map_err(io_err(format!("write {}", path.display())))
    }

    /// The last address reserved in range set `range_set`; a missing or unreadable
    /// record means none.
    pub fn last_reserved(&self, range_set: usize) -> Option<IpAddr> {
        fs::read_to_string(self.path(&format!("{LAST_RESERVED_PREFIX}{range_set}")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Every lease in the directory. The same pass removes temporary files whose writer
    /// has died.
    pub fn leases(&self) -> Result<Vec<Lease>, Error> {
        let what = || format!("read {}", self.store.dir.display());
        let dir = File::open(&self.store.dir).map_err(io_err(what()))?;
        let entries = fs::read_dir(&self.store.dir).map_err(io_err(what()))?;
        let mut out = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name();
            let text = name.to_string_lossy();
            if text.starts_with(TEMP_PREFIX) {
                if is_stale_temp(&text) {
                    let _ = fs::remove_file(e.path());
                }
                continue;
            }
            let Ok(ip) = text.parse::<IpAddr>() else {
                continue;
            };
            let (container_id, ifname) = read_lease(&dir, &name)
                .map(|c| parse_owner(&c))
                .unwrap_or_default();
            out.push(Lease {
                ip,
                container_id,
                ifname,
            });
        }
        out.sort_by_key(|l| crate::range::to_u128(l.ip));
        Ok(out)
    }

    /// The addresses held by (id, ifname); leases written without an interface name by old
    /// reference versions match on the ID alone.
    pub fn get_by_id(&self, id: &str, ifname: &str) -> Result<Vec<IpAddr>, Error> {
        Ok(self
            .leases()?
            .into_iter()
            .filter(|l| l.container_id == id.trim() && (l.ifname == ifname || l.ifname.is_empty()))
            .map(|l| l.ip)
            .collect())
    }

    /// Releases one address.
    pub fn release(&self, ip: IpAddr) -> Result<(), Error> {
        let p = self.path(&ip.to_string());
        match fs::remove_file(&p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(io_err(format!("remove {}", p.display()))(e))
            }
            _ => Ok(()),
        }
    }

    /// Releases everything (id, ifname) holds and returns what was released: the
    /// addresses its index entry names, or, without one (leases of the reference or of
    /// a corvid before the index), those a read of every lease finds.
    pub fn release_by_id(&self, id: &str, ifname: &str) -> Result<Vec<IpAddr>, Error> {
        let ips = match self.held(id, ifname)? {
            Some(ips) => ips,
            None => self.get_by_id(id, ifname)?,
        };
        for ip in &ips {
            self.release(*ip)?;
        }
        if !ips.is_empty() {
            self.sync_dir()?;
        }
        self.forget(id, ifname)?;
        Ok(ips)
    }

    fn owner_path(&self, id: &str, ifname: &str) -> PathBuf {
        use std::hash::Hasher;
        let mut h = fnv::FnvHasher::default();
        h.write(id.trim().as_bytes());
        h.write(&[0]);
        h.write(ifname.as_bytes());
        self.store
            .dir
            .join(OWNERS_DIR)
            .join(format!("{:016x}", h.finish()))
    }

    /// Whether the lease of `ip` is (id, ifname)'s, as its index entry says. An empty
    /// lease counts: leases are linked only once written, so one is empty only when a power
    /// cut lost an unsynced ADD's content (or a reference plugin died between creating
    /// and writing one), and then the entry is the only word on whose it was.
    fn owned_by(&self, ip: IpAddr, id: &str, ifname: &str) -> bool {
        fs::read_to_string(self.path(&ip.to_string())).is_ok_and(|c| {
            let (owner, iface) = parse_owner(&c);
            owner.is_empty() || (owner == id.trim() && (iface == ifname || iface.is_empty()))
        })
    }

    /// The addresses (id, ifname) holds according to its index entry, each checked
    /// against its lease; none when it has no entry.
    pub fn held(&self, id: &str, ifname: &str) -> Result<Option<Vec<IpAddr>>, Error> {
        let path = self.owner_path(id, ifname);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(format!("read {}", path.display()))(e)),
        };
        Ok(Some(
            text.lines()
                .filter_map(|l| l.trim().parse().ok())
                .filter(|ip| self.owned_by(*ip, id, ifname))
                .collect(),
        ))
    }

    /// Notes that (id, ifname) holds `ips`. Not synced: a lost note sends DEL back to
    /// reading every lease, nothing worse.
    pub fn note_held(&self, id: &str, ifname: &str, ips: &[IpAddr]) -> Result<(), Error> {
        let path = self.owner_path(id, ifname);
        let dir = path.parent().expect("an entry is in the owners directory");
        fs::create_dir_all(dir).map_err(io_err(format!("create {}", dir.display())))?;
        let text: String = ips.iter().map(|ip| format!("{ip}\n")).collect();
        let tmp = Self::index_temp(&path);
        let written = fs::write(&tmp, text).and_then(|()| fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written.map_err(io_err(format!("write {}", path.display())))
    }

    /// Where an index entry is written before its rename: named after the entry (the
    /// lock keeps a second writer out), so the entry's DEL also removes what a writer
    /// killed between the two left.
    fn index_temp(entry: &Path) -> PathBuf {
        let name = entry.file_name().unwrap_or_default().to_string_lossy();
        entry.with_file_name(format!("{TEMP_PREFIX}{name}"))
    }

    fn forget(&self, id: &str, ifname: &str) -> Result<(), Error> {
        let path = self.owner_path(id, ifname);
        for file in [Self::index_temp(&path), path] {
            match fs::remove_file(&file) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(io_err(format!("remove {}", file.display()))(e))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Removes the index entries none of whose addresses is leased any more (for GC).
    pub fn prune_index(&self) -> Result<(), Error> {
        let dir = self.store.dir.join(OWNERS_DIR);
        let Ok(entries) = fs::read_dir(&dir) else {
            return Ok(());
        };
        for e in entries.flatten() {
            // Under the lock no entry is being written: any temporary file is a dead
            // writer's.
            let temp = e.file_name().to_string_lossy().starts_with(TEMP_PREFIX);
            let stale = temp
                || fs::read_to_string(e.path()).map_or(true, |t| {
                    !t.lines()
                        .filter_map(|l| l.trim().parse::<IpAddr>().ok())
                        .any(|ip| self.is_reserved(ip))
                });
            if stale {
                let _ = fs::remove_file(e.path());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn assert_no_temp_files(dir: &Path) {
        let names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with(TEMP_PREFIX)),
            "{names:?}"
        );
    }

    fn reserve(l: &LeaseLock, id: &str, ifname: &str, addr: &str, set: usize) -> bool {
        let lease = l.store.prepare_lease(id, ifname).unwrap();
        l.reserve(lease, ip(addr), set).unwrap().is_ok()
    }

    #[test]
    fn writes_the_reference_layout() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LeaseDir::open(tmp.path(), "net1").unwrap();
        let l = store.lock().unwrap();
        assert!(reserve(&l, "c1", "eth0", "10.1.0.2", 0));
        assert!(!reserve(&l, "c2", "eth0", "10.1.0.2", 0));
        let dir = tmp.path().join("net1");
        assert_eq!(
            fs::read_to_string(dir.join("10.1.0.2")).unwrap(),
            "c1\r\neth0"
        );
        assert_eq!(
            fs::read_to_string(dir.join("last_reserved_ip.0")).unwrap(),
            "10.1.0.2"
        );
        assert!(reserve(&l, "c2", "eth0", "10.1.0.10", 0));
        assert!(reserve(&l, "c3", "eth0", "10.1.0.9", 0));
        assert_eq!(
            fs::read_to_string(dir.join("last_reserved_ip.0")).unwrap(),
            "10.1.0.9",
            "a shorter address must not keep the longer one's tail"
        );
        assert!(dir.join("lock").exists());
        assert_no_temp_files(&dir);
    }

    #[test]
    fn releases_by_id_and_interface() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LeaseDir::open(tmp.path(), "n").unwrap();
        let l = store.lock().unwrap();
        reserve(&l, "c1", "eth0", "10.1.0.2", 0);
        reserve(&l, "c1", "eth1", "10.1.0.3", 0);
        reserve(&l, "c1", "eth0", "fd00::2", 1);
        let mut got = l.release_by_id("c1", "eth0").unwrap();
        got.sort();
        assert_eq!(got, vec![ip("10.1.0.2"), ip("fd00::2")]);
        assert!(l.is_reserved(ip("10.1.0.3")));
        assert!(l.release_by_id("c1", "eth0").unwrap().is_empty());
    }

    #[test]
    fn the_index_finds_an_attachment_without_reading_every_lease() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LeaseDir::open(tmp.path(), "n").unwrap();
        let l = store.lock().unwrap();
        assert_eq!(l.held("c1", "eth0").unwrap(), None, "no entry yet");
        reserve(&l, "c1", "eth0", "10.1.0.2", 0);
        reserve(&l, "c1", "eth0", "fd00::2", 1);
        l.note_held("c1", "eth0", &[ip("10.1.0.2"), ip("fd00::2")])
            .unwrap();
        assert_eq!(
            l.held("c1", "eth0").unwrap(),
            Some(vec![ip("10.1.0.2"), ip("fd00::2")])
        );
        // A lease the reference released (or gave to another) is not believed.
        l.release(ip("fd00::2")).unwrap();
        reserve(&l, "other", "eth0", "fd00::2", 1);
        assert_eq!(l.held("c1", "eth0").unwrap(), Some(vec![ip("10.1.0.2")]));
        assert_eq!(l.release_by_id("c1", "eth0").unwrap(), vec![ip("10.1.0.2")]);
        assert!(l.is_reserved(ip("fd00::2")), "the other's lease stays");
        assert_eq!(
            l.held("c1", "eth0").unwrap(),
            None,
            "the entry goes with the leases"
        );
        // A lease without an entry (the reference's) is still found by DEL.
        reserve(&l, "ref", "eth0", "10.1.0.9", 0);
        assert_eq!(
            l.release_by_id("ref", "eth0").unwrap(),
            vec![ip("10.1.0.9")]
        );
        // GC drops entries whose addresses are all gone.
        l.note_held("gone", "eth0", &[ip("10.1.0.50")]).unwrap();
        l.note_held("other", "eth0", &[ip("fd00::2")]).unwrap();
        l.prune_index().unwrap();
        assert_eq!(l.held("gone", "eth0").unwrap(), None);
        assert!(l.held("other", "eth0").unwrap().is_some());
        // The reference's scan of the directory reads the entries and passes over them.
        assert!(l.leases().unwrap().iter().all(|x| x.container_id != "gone"));
    }

    #[test]
    fn survives_what_a_crash_leaves_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LeaseDir::open(tmp.path(), "n").unwrap();
        let dir = tmp.path().join("n");
        fs::write(dir.join("last_reserved_ip.0"), "").unwrap();
        fs::write(dir.join("10.1.0.7"), "").unwrap();
        // Above the largest pid_max, so no such writer can be alive.
        fs::write(dir.join(format!("{TEMP_PREFIX}4194305.0")), "c9\r\neth0").unwrap();
        let live = dir.join(format!("{TEMP_PREFIX}{}.7", std::process::id()));
        fs::write(&live, "c8\r\neth0").unwrap();
        fs::write(dir.join("10.1.0.8"), "legacy-id").unwrap();
        let l = store.lock().unwrap();
        assert_eq!(l.last_reserved(0), None);
        let leases = l.leases().unwrap();
        assert!(!dir.join(format!("{TEMP_PREFIX}4194305.0")).exists());
        assert!(live.exists(), "a live writer's file was removed");
        assert_eq!(leases.len(), 2);
        assert_eq!(leases[0].container_id, "");
        assert_eq!(
            l.get_by_id("legacy-id", "eth3").unwrap(),
            vec![ip("10.1.0.8")]
        );
        // An unsynced lease whose content a power cut lost goes with the DEL its index
        // entry names it to; only by the entry, not by a scan for another's DEL.
        assert!(l.release_by_id("c7", "eth0").unwrap().is_empty());
        assert!(l.is_reserved(ip("10.1.0.7")));
        l.note_held("c7", "eth0", &[ip("10.1.0.7")]).unwrap();
        assert_eq!(l.release_by_id("c7", "eth0").unwrap(), vec![ip("10.1.0.7")]);
        assert!(!l.is_reserved(ip("10.1.0.7")));
    }

    #[test]
    fn a_named_lease_is_written_again_when_its_file_was_taken_away() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LeaseDir::open(tmp.path(), "n").unwrap();
        let dir = tmp.path().join("n");
        let content = "c1\r\neth0".to_string();
        let path = write_temp(&dir, &content).unwrap();
        fs::remove_file(&path).unwrap();
        let lease = PreparedLease::Named { path, content };
        let l = store.lock().unwrap();
        assert!(l.reserve(lease, ip("10.1.0.4"), 0).unwrap().is_ok());
        assert_eq!(
            fs::read_to_string(dir.join("10.1.0.4")).unwrap(),
            "c1\r\neth0"
        );
        assert_no_temp_files(&dir);
    }
}
