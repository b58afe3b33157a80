//! Device names derived from controller IDs, so a restarted agent (or the Docker driver,
//! or any other adapter that binds ports) finds what it made without keeping any state of
//! its own. Each is at most 15 bytes, and a name never changes between versions: the
//! devices of a running host are found by it after an upgrade.

use std::hash::Hasher;

fn name(prefix: &str, id: &str) -> String {
    let mut h = fnv::FnvHasher::default();
    h.write(id.as_bytes());
    format!("{prefix}{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// What the names of every device the agent owns start with.
pub const PREFIX: &str = "cv";
/// Prefix of the bridges the agent owns.
pub const BRIDGE_PREFIX: &str = "cvb";
/// Prefix of the vxlan devices the agent owns.
pub const VXLAN_PREFIX: &str = "cvx";
/// Prefix of the host ends of plugged ports.
pub const VETH_PREFIX: &str = "cvp";

/// The `protocol` of the routes the agent makes (routers' extra routes): how a restarted
/// agent finds them, as routing daemons mark theirs (`ip route show proto 118`).
pub const ROUTE_PROTOCOL: u8 = 118;

/// The `protocol` of the agent's direct routes (a remote port's address via its host's
/// underlay address), apart from the extra routes so that neither sync takes the other's.
pub const DIRECT_ROUTE_PROTOCOL: u8 = 119;

/// Prefix of the ifb devices the bandwidth plugin shapes a container's egress on (the
/// reference's prefix).
pub const IFB_PREFIX: &str = "bwp";

/// The ifb device of a container's attachment to a network: the network's own prefix
/// (`ifb_prefix`) and eight hex digits of the attachment, so GC can tell a network's
/// devices from the name alone (the kernel ignores an alias given at creation).
pub fn ifb(network: &str, container_id: &str, ifname: &str) -> String {
    let mut h = fnv::FnvHasher::default();
    h.write(format!("{network}\0{container_id}\0{ifname}").as_bytes());
    format!("{}{:08x}", ifb_prefix(network), h.finish() & 0xffff_ffff)
}

/// The start of the names of a network's ifb devices.
pub fn ifb_prefix(network: &str) -> String {
    let mut h = fnv::FnvHasher::default();
    h.write(network.as_bytes());
    format!("{IFB_PREFIX}{:04x}", h.finish() & 0xffff)
}

/// The name `ifb` gave before it carried the network: DEL and CHECK still find the
/// devices of containers added then.
pub fn ifb_before_gc(network: &str, container_id: &str, ifname: &str) -> String {
    name(IFB_PREFIX, &format!("{network}\0{container_id}\0{ifname}"))
}

/// The bridge of a network on every host.
pub fn bridge(network: &str) -> String {
    name(BRIDGE_PREFIX, network)
}

/// The vxlan device of a network.
pub fn vxlan(network: &str) -> String {
    name(VXLAN_PREFIX, network)
}

/// The host end of a port's veth pair.
pub fn host_veth(port: &str) -> String {
    name(VETH_PREFIX, port)
}

/// The alias that marks a device as one cluster's: `corvid:<cluster>:<object>`, the
/// object being the port or network the device serves. An agent removes only devices of
/// its own cluster, so two stacks on one host leave each other's devices alone.
pub fn owner_mark(cluster: &str, object: &str) -> String {
    format!("corvid:{cluster}:{object}")
}

/// The cluster an alias marks its device as owned by; `None` for a device without a
/// mark (one made by a corvid from before the marks, counted as anyone's).
pub fn marked_cluster(alias: &str) -> Option<&str> {
    alias.strip_prefix("corvid:")?.split(':').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_and_differ() {
        let id = "3dda2801-d675-4688-a63f-dcda8d327f50";
        for n in [bridge(id), vxlan(id), host_veth(id)] {
            assert_eq!(n.len(), 15);
        }
        assert_eq!(bridge(id), bridge(id));
        assert_ne!(bridge(id), bridge("3dda2801-d675-4688-a63f-dcda8d327f51"));
    }

    #[test]
    fn names_are_those_earlier_versions_gave() {
        let id = "3dda2801-d675-4688-a63f-dcda8d327f50";
        assert_eq!(bridge(id), "cvb60b95b215aa9");
        assert_eq!(vxlan(id), "cvx60b95b215aa9");
        assert_eq!(host_veth(id), "cvp60b95b215aa9");
    }

    #[test]
    fn ifb_names_fit_and_start_with_their_network() {
        let n = ifb("net", "3dda2801", "eth0");
        assert_eq!(n.len(), 15);
        assert!(n.starts_with(&ifb_prefix("net")));
        assert!(!ifb("other", "3dda2801", "eth0").starts_with(&ifb_prefix("net")));
        assert_ne!(n, ifb("net", "3dda2801", "eth1"));
    }
}
