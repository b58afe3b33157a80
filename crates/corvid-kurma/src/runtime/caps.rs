//! The capabilities of a plugin's processes, as Kurma gave them: every one when the image
//! carries the `os/linux/privileged` isolator, otherwise only the 14 of Kurma's app
//! containers (stager/container/core/util.go), which hold neither CAP_NET_ADMIN nor
//! CAP_SYS_ADMIN and so cannot configure a network or enter a pod's namespace.

use rustix::io::Errno;
use rustix::thread::{CapabilitySet, CapabilitySets};

/// Kurma's capabilities for an app without the privileged isolator, in its order.
pub const KURMA_DEFAULT_NAMES: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// [`KURMA_DEFAULT_NAMES`] as a set.
pub const KURMA_DEFAULT: CapabilitySet = CapabilitySet::CHOWN
    .union(CapabilitySet::DAC_OVERRIDE)
    .union(CapabilitySet::FSETID)
    .union(CapabilitySet::FOWNER)
    .union(CapabilitySet::MKNOD)
    .union(CapabilitySet::NET_RAW)
    .union(CapabilitySet::SETGID)
    .union(CapabilitySet::SETUID)
    .union(CapabilitySet::SETFCAP)
    .union(CapabilitySet::SETPCAP)
    .union(CapabilitySet::NET_BIND_SERVICE)
    .union(CapabilitySet::SYS_CHROOT)
    .union(CapabilitySet::KILL)
    .union(CapabilitySet::AUDIT_WRITE);

/// What a plugin without the isolator is told, wherever its failure is reported.
pub fn unprivileged_note() -> String {
    format!(
        "the image has no {} isolator, so its processes get only Kurma's default capabilities \
         ({}), without CAP_NET_ADMIN and CAP_SYS_ADMIN",
        crate::aci::PRIVILEGED,
        KURMA_DEFAULT_NAMES.join(" ")
    )
}

/// Leaves the calling process [`KURMA_DEFAULT`] (or what of it it has) in its bounding,
/// effective, permitted and inheritable sets, and nothing else in its ambient set.
///
/// Meant for a child between fork and exec: it makes system calls only. The bounding set
/// goes first, while CAP_SETPCAP is still effective; the exec that follows then gives
/// root no more than inheritable and bounding allow.
pub fn restrict_to_kurma_default() -> rustix::io::Result<()> {
    // Higher numbers than the kernel knows answer EINVAL: past its last capability.
    for bit in 0..64u32 {
        let cap = CapabilitySet::from_bits_retain(1 << bit);
        if KURMA_DEFAULT.contains(cap) {
            continue;
        }
        match rustix::thread::remove_capability_from_bounding_set(cap) {
            Ok(()) | Err(Errno::INVAL) => {}
            Err(e) => return Err(e),
        }
        match rustix::thread::configure_capability_in_ambient_set(cap, false) {
            Ok(()) | Err(Errno::INVAL) => {}
            Err(e) => return Err(e),
        }
    }
    let have = rustix::thread::capabilities(None)?.permitted;
    let keep = KURMA_DEFAULT.intersection(have);
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: keep,
            permitted: keep,
            inheritable: keep,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_set_is_kurmas_fourteen_without_net_or_sys_admin() {
        assert_eq!(KURMA_DEFAULT.bits().count_ones(), 14);
        assert!(!KURMA_DEFAULT.contains(CapabilitySet::NET_ADMIN));
        assert!(!KURMA_DEFAULT.contains(CapabilitySet::SYS_ADMIN));
        // The names and the set agree, bit by bit (CAP_CHOWN is 0 ... CAP_AUDIT_WRITE 29).
        let numbers = [0, 1, 4, 3, 27, 13, 6, 7, 31, 8, 10, 18, 5, 29];
        let from_numbers = numbers.iter().fold(0u64, |acc, n| acc | 1 << n);
        assert_eq!(KURMA_DEFAULT.bits(), from_numbers);
    }

    /// One capability set of `/proc/self/status` (`CapEff`, ...), as its bits.
    fn set(status: &str, field: &str) -> u64 {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:\t")))
            .unwrap_or_else(|| panic!("{field} in {status}"));
        u64::from_str_radix(line.trim(), 16).unwrap()
    }

    #[test]
    fn a_restricted_program_has_kurmas_set_in_every_set_and_none_ambient() {
        use std::os::unix::process::CommandExt;
        let mine = std::fs::read_to_string("/proc/self/status").unwrap();
        // Dropping from the bounding set takes CAP_SETPCAP (bit 8): the root lane runs this,
        // the unprivileged one cannot.
        if set(&mine, "CapEff") & (1 << 8) == 0 {
            eprintln!("skipped: needs CAP_SETPCAP (run as root)");
            return;
        }
        let mut cmd = std::process::Command::new("cat");
        cmd.arg("/proc/self/status");
        // SAFETY: the closure only makes system calls.
        unsafe { cmd.pre_exec(|| Ok(restrict_to_kurma_default()?)) };
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let theirs = String::from_utf8(out.stdout).unwrap();
        let want = KURMA_DEFAULT.bits() & set(&mine, "CapPrm");
        for field in ["CapEff", "CapPrm", "CapInh", "CapBnd"] {
            assert_eq!(set(&theirs, field), want, "{field}: {theirs}");
        }
        assert_eq!(set(&theirs, "CapAmb"), 0);
    }
}
