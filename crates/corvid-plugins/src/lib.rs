//! corvid's CNI plugins. Each is short: the spec lives in corvid-cni, addresses in
//! corvid-ipam, kernel work in corvid-net.

#![deny(missing_docs)]

mod attach;
pub mod attachments;
pub mod bandwidth;
pub mod bridge;
mod child;
pub mod corvid;
pub mod corvid_k8s;
pub mod credentials;
pub mod delegate;
pub mod dhcp;
pub mod dummy;
pub mod errors;
pub mod firewall;
pub mod host_device;
pub mod host_local;
pub mod install;
pub mod ipvlan;
pub mod kurma;
pub mod loopback;
pub mod macvlan;
pub mod portmap;
pub mod ptp;
pub mod sbr;
pub mod static_ipam;
pub mod tuning;
pub mod vlan;
pub mod vrf;
pub mod wait;

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
        "bandwidth" => Some(&bandwidth::Bandwidth),
        "bridge" => Some(&bridge::Bridge),
        "corvid" => Some(&corvid::Corvid),
        "corvid-k8s" => Some(&corvid_k8s::CorvidK8s),
        "dhcp" => Some(&dhcp::Dhcp),
        "dummy" => Some(&dummy::Dummy),
        "firewall" => Some(&firewall::Firewall),
        "host-device" => Some(&host_device::HostDevice),
        "host-local" => Some(&host_local::HostLocal),
        "ipvlan" => Some(&ipvlan::Ipvlan),
        "loopback" => Some(&loopback::Loopback),
        "macvlan" => Some(&macvlan::Macvlan),
        "portmap" => Some(&portmap::Portmap),
        "ptp" => Some(&ptp::Ptp),
        "sbr" => Some(&sbr::Sbr),
        "static" => Some(&static_ipam::Static),
        "tuning" => Some(&tuning::Tuning),
        "vlan" => Some(&vlan::Vlan),
        "vrf" => Some(&vrf::Vrf),
        _ => None,
    }
}
