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
