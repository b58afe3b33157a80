//! The interface plugins, containernetworking/plugins' `main/` (a module named `main`
//! is the binary's in Rust): each gives the container an interface, and the host its
//! side where there is one.

pub mod bridge;
mod child;
pub mod dummy;
pub mod host_device;
pub mod ipvlan;
pub mod loopback;
pub mod macvlan;
pub mod ptp;
pub mod vlan;
