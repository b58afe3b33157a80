//! Kernel parameters under /proc/sys, for the calling thread's network namespace.

use crate::{io_err, Result};

fn path(key: &str) -> String {
    format!("/proc/sys/{}", key.trim_start_matches('/'))
}

/// Reads a parameter, e.g. `net/ipv4/ip_forward`.
pub fn get(key: &str) -> Result<String> {
    let p = path(key);
    std::fs::read_to_string(&p)
        .map(|s| s.trim().to_string())
        .map_err(io_err(format!("read {p}")))
}

/// Sets a parameter; nothing is written when it already has the value.
pub fn set(key: &str, value: &str) -> Result<()> {
    if get(key).is_ok_and(|v| v == value) {
        return Ok(());
    }
    let p = path(key);
    std::fs::write(&p, value).map_err(io_err(format!("write {p}")))
}

/// Turns the host's IPv6 on or off on device `name` of the calling thread's namespace.
/// Off, the device has no link-local address or multicast route, and its coming and
/// going skips the IPv6 FIB walks, which cost in proportion to every device's routes;
/// bridged IPv6 between its ports is unaffected. A kernel without IPv6 has nothing to
/// turn off.
pub fn set_ipv6(name: &str, on: bool) -> Result<()> {
    let key = format!("net/ipv6/conf/{name}/disable_ipv6");
    if !on && !std::path::Path::new("/proc/sys/net/ipv6").exists() {
        return Ok(());
    }
    set(&key, if on { "0" } else { "1" })
}

/// Turns the host's IPv6 on device `name` on for its neighbour table alone: the device
/// makes no address of its own, not even a link-local one, so it takes no part in
/// routing. The kernel refuses IPv6 neighbour entries on a device with IPv6 off, and a
/// vxlan device answers solicitations from them.
pub fn set_ipv6_neighbours_only(name: &str) -> Result<()> {
    // 1 is IN6_ADDR_GEN_MODE_NONE.
    set(&format!("net/ipv6/conf/{name}/addr_gen_mode"), "1")?;
    set_ipv6(name, true)
}

/// Turns IPv6 forwarding on for the namespace. Forwarding makes the kernel ignore router
/// advertisements on every interface whose `accept_ra` is 1, so a host that learnt its
/// default route by SLAAC would lose it (Docker's docker/for-linux#844); those
/// interfaces are first set to 2, accept them anyway, except those named with
/// `own_prefix`, which must never take routes from what a pod sends. Returns the
/// interfaces changed.
pub fn enable_ipv6_forwarding(own_prefix: &str) -> Result<Vec<String>> {
    if get("net/ipv6/conf/all/forwarding")? == "1" {
        return Ok(Vec::new());
    }
    let dir = "/proc/sys/net/ipv6/conf";
    let mut changed = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io_err(format!("read {dir}")))? {
        let name = e
            .map_err(io_err(format!("read {dir}")))?
            .file_name()
            .to_string_lossy()
            .into_owned();
        if ["all", "default", "lo"].contains(&name.as_str()) || name.starts_with(own_prefix) {
            continue;
        }
        let key = format!("net/ipv6/conf/{name}/accept_ra");
        // A device gone since the listing has nothing to keep.
        if get(&key).is_ok_and(|v| v == "1") && set(&key, "2").is_ok() {
            changed.push(name);
        }
    }
    set("net/ipv6/conf/all/forwarding", "1")?;
    Ok(changed)
}
