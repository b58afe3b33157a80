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
