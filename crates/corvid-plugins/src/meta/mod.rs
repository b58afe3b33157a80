//! The chained plugins, as containernetworking/plugins' `meta/`: each changes what an
//! interface plugin made (ports, filtering, sysctls, shaping, routing).

pub mod bandwidth;
pub mod firewall;
pub mod portmap;
pub mod sbr;
pub mod tuning;
pub mod vrf;
