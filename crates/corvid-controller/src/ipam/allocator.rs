//! Picking addresses and MACs while requests are in flight: reservations that keep this
//! controller's concurrent requests from picking the same address or MAC (the store's
//! compare-and-swap still decides between controllers), and cursors that make consecutive
//! picks neighbours.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};

use compact_str::CompactString;
use corvid_api::Subnet;

use super::pools;
use crate::keys;
use crate::util::random_below;
use crate::view::Taken;

/// Addresses and MACs picked by requests in flight, and where the next picks start.
#[derive(Default)]
pub struct Allocator {
    pending: Mutex<HashSet<String>>,
    cursors: Mutex<Cursors>,
}

impl Allocator {
    /// A fresh set of in-flight reservations.
    pub fn pending(&self) -> Pending<'_> {
        Pending {
            allocator: self,
            keys: Vec::new(),
        }
    }

    /// Forgets where the last picks were, after another controller took a pick of this
    /// one's: the next searches start from random points, so the two move apart.
    pub fn scatter(&self) {
        *self.cursors() = Cursors::default();
    }

    fn cursors(&self) -> MutexGuard<'_, Cursors> {
        self.cursors.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The MAC numbered `n` (its low 24 bits) in Neutron's `fa:16:3e` range.
pub fn mac_at(n: u32) -> String {
    let b = n.to_be_bytes();
    format!("fa:16:3e:{:02x}:{:02x}:{:02x}", b[1], b[2], b[3])
}

/// The address picked last in each subnet and the MAC picked last. Picking on from them
/// puts consecutive ports' keys next to each other in the store, so a commit of many new
/// ports rewrites a few pages instead of one per key.
#[derive(Default)]
struct Cursors {
    ips: HashMap<String, IpAddr>,
    mac: Option<u32>,
}

/// Reservations of keys in flight, released when dropped.
pub struct Pending<'a> {
    allocator: &'a Allocator,
    keys: Vec<String>,
}

impl Pending<'_> {
    /// Reserves `key` unless another request of this controller holds it.
    pub fn reserve(&mut self, key: String) -> bool {
        let mut set = self
            .allocator
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if set.insert(key.clone()) {
            self.keys.push(key);
            true
        } else {
            false
        }
    }

    /// Picks and reserves an address of `subnet` that `free` allows, on from this
    /// controller's last pick there.
    pub fn pick_ip(&mut self, subnet: &Subnet, free: impl Fn(IpAddr) -> bool) -> Option<IpAddr> {
        let after = self.allocator.cursors().ips.get(&subnet.id).copied();
        let ip = pools::pick(&subnet.allocation_pools, after, |ip| {
            free(ip) && self.reserve(keys::ip(&subnet.id, ip))
        })?;
        self.allocator.cursors().ips.insert(subnet.id.clone(), ip);
        Some(ip)
    }

    /// Picks and reserves a MAC in Neutron's `fa:16:3e` range that no port has, on from
    /// this controller's last pick.
    pub fn pick_mac(&mut self, in_use: &Taken<CompactString>) -> String {
        let mut n = self
            .allocator
            .cursors()
            .mac
            .map_or_else(|| random_below(1 << 24) as u32, |m| m + 1);
        let mac = loop {
            let m = mac_at(n);
            if !in_use.contains(m.as_str()) && self.reserve(keys::mac(&m)) {
                break m;
            }
            n = n.wrapping_add(1);
        };
        self.allocator.cursors().mac = Some(n);
        mac
    }

    /// Whether a request of this controller holds `key`.
    pub fn held_elsewhere(&self, key: &str) -> bool {
        !self.keys.iter().any(|k| k == key)
            && self
                .allocator
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(key)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let mut set = self
            .allocator
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for k in &self.keys {
            set.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_are_numbered_in_neutrons_range() {
        assert_eq!(mac_at(0x0102_0a0b), "fa:16:3e:02:0a:0b");
    }
}
