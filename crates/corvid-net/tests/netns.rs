//! Namespace handles and the guard, for real (as root).

use corvid_net::{Netlink, Netns};
use std::os::unix::fs::MetadataExt;

fn current_inode() -> u64 {
    std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
}

struct Named(std::path::PathBuf);

impl Named {
    fn new(tag: &str) -> Named {
        Named(Netns::create_named(&format!("cvt{}-{tag}", std::process::id())).unwrap())
    }
}

impl Drop for Named {
    fn drop(&mut self) {
        let _ = Netns::delete_path(&self.0);
    }
}

#[test]
fn the_thread_comes_back_even_when_the_work_panics() {
    let ns = Named::new("guard");
    let target = Netns::open(&ns.0).unwrap();
    let home = current_inode();
    let inside = target.run(current_inode).unwrap();
    assert_ne!(inside, home, "run did not enter the namespace");
    assert_eq!(current_inode(), home);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        target.run(|| panic!("boom")).unwrap();
    }));
    assert!(panicked.is_err());
    assert_eq!(
        current_inode(),
        home,
        "a panic left the thread in the namespace"
    );
}

#[test]
fn a_socket_opened_inside_keeps_working_from_outside() {
    let ns = Named::new("sock");
    let mut nl = Netlink::open_in(&Netns::open(&ns.0).unwrap()).unwrap();
    let names: Vec<String> = nl.links().unwrap().into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["lo"], "a fresh namespace holds only lo");
    nl.add_bridge("cvtbrtest", Some(1400), false, None, true)
        .unwrap();
    let br = nl.link_by_name("cvtbrtest").unwrap().unwrap();
    assert_eq!(br.mtu, 1400);
    assert!(br.up);
    let mut host = Netlink::open().unwrap();
    assert!(
        host.link_by_name("cvtbrtest").unwrap().is_none(),
        "the bridge leaked out of the namespace"
    );
}

#[test]
fn only_namespaces_open() {
    let e = Netns::open("/etc/hostname").unwrap_err();
    assert!(e.to_string().contains("not a network namespace"), "{e}");
    assert_eq!(
        Netns::open("/run/netns/cvt-none").unwrap_err().errno(),
        Some(libc::ENOENT)
    );
    assert!(Netns::create_named("a/b").is_err());
}

#[test]
fn a_namespace_dir_becomes_a_shared_mount_point_so_no_tool_can_hide_a_namespace_under_it() {
    let dir = std::env::temp_dir().join(format!("cvt{}-nsdir", std::process::id()));
    std::fs::create_dir(&dir).unwrap();
    let path = Netns::create_in(&dir, "ns").unwrap();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount = info
        .lines()
        .find(|l| l.split(' ').nth(4) == dir.to_str())
        .map(str::to_string);
    // Podman and `ip netns` bind-mount a namespace directory onto itself unless it is a
    // mount point already; over a plain one that would hide the namespace's own mount.
    Netns::delete_path(&path).unwrap();
    let gone = !path.exists();
    let c = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    std::fs::remove_dir(&dir).unwrap();
    let mount = mount.expect("the directory is a mount point");
    assert!(mount.contains("shared:"), "{mount}");
    assert!(gone, "the namespace file is gone");
}
