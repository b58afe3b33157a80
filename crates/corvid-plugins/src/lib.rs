//! corvid's CNI plugins. Each is short: the spec lives in corvid-cni, addresses in
//! corvid-ipam, kernel work in corvid-net.

#![deny(missing_docs)]

mod attach;
pub mod attachments;
pub mod controller;
pub mod delegate;
pub mod errors;
pub mod install;
pub mod interfaces;
pub mod ipam;
pub mod kurma;
pub mod meta;

use corvid_cni::skel::Plugin;

/// The plugin names this binary answers to.
pub const PLUGIN_NAMES: [&str; 19] = [
    "bandwidth",
    "bridge",
    "corvid",
    "corvid-k8s",
    "dhcp",
    "dummy",
    "firewall",
    "host-device",
    "host-local",
    "ipvlan",
    "loopback",
    "macvlan",
    "portmap",
    "ptp",
    "sbr",
    "static",
    "tuning",
    "vlan",
    "vrf",
];

/// The plugin behind a name, if this binary has one.
pub fn plugin_for(name: &str) -> Option<&'static (dyn Plugin + Sync)> {
    match name {
        "bandwidth" => Some(&meta::bandwidth::Bandwidth),
        "bridge" => Some(&interfaces::bridge::Bridge),
        "corvid" => Some(&controller::corvid::Corvid),
        "corvid-k8s" => Some(&controller::corvid_k8s::CorvidK8s),
        "dhcp" => Some(&ipam::dhcp::Dhcp),
        "dummy" => Some(&interfaces::dummy::Dummy),
        "firewall" => Some(&meta::firewall::Firewall),
        "host-device" => Some(&interfaces::host_device::HostDevice),
        "host-local" => Some(&ipam::host_local::HostLocal),
        "ipvlan" => Some(&interfaces::ipvlan::Ipvlan),
        "loopback" => Some(&interfaces::loopback::Loopback),
        "macvlan" => Some(&interfaces::macvlan::Macvlan),
        "portmap" => Some(&meta::portmap::Portmap),
        "ptp" => Some(&interfaces::ptp::Ptp),
        "sbr" => Some(&meta::sbr::Sbr),
        "static" => Some(&ipam::static_ipam::Static),
        "tuning" => Some(&meta::tuning::Tuning),
        "vlan" => Some(&interfaces::vlan::Vlan),
        "vrf" => Some(&meta::vrf::Vrf),
        _ => None,
    }
}
