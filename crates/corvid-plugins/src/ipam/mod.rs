//! The IPAM plugins, as containernetworking/plugins' `ipam/`: addresses for an interface
//! plugin to configure.

pub mod dhcp;
pub mod host_local;
pub mod static_ipam;
