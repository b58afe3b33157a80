//! Telling the neighbours that an address moved: a gratuitous ARP for the IPv4 addresses
//! and unsolicited neighbour advertisements for the IPv6 ones, from the interface that
//! now holds them. An address freed by a deleted container and given to a new one (with
//! another MAC) is otherwise unreachable from the old peers until their neighbour entry
//! ages out, 20 seconds and more; the reference bridge plugin sends the ARP on ADD.
//!
//! The kernel sends them itself: with `arp_notify` and `ndisc_notify` on the interface,
//! a change of its hardware address announces every address it holds, and setting the
//! MAC it already has counts as one. A packet socket of our own would cost more than the
//! rest of an ADD: closing one waits for an RCU grace period (`synchronize_net`).
//!
//! Best effort, as the reference's: a neighbour that misses it still finds the address
//! by itself later, so a failure is logged, never an error of the plug.

use ipnet::IpNet;

use crate::link::Link;
use crate::netlink::Netlink;
use crate::netns::Netns;
use crate::sysctl;

/// Announces `addrs` from `link`, which `container` (a netlink socket in `netns`) sees,
/// up and holding them.
pub fn announce(container: &mut Netlink, netns: &Netns, link: &Link, addrs: &[IpNet]) {
    if addrs.is_empty() || link.mac.is_empty() {
        return;
    }
    let name = &link.name;
    let notify = netns.run(|| {
        let mut set = Vec::new();
        if addrs.iter().any(|a| a.addr().is_ipv4()) {
            set.push(sysctl::set(
                &format!("net/ipv4/conf/{name}/arp_notify"),
                "1",
            ));
        }
        if addrs.iter().any(|a| a.addr().is_ipv6()) {
            set.push(sysctl::set(
                &format!("net/ipv6/conf/{name}/ndisc_notify"),
                "1",
            ));
        }
        set.into_iter().collect::<crate::Result<Vec<()>>>()
    });
    let announced = match notify {
        Ok(Ok(_)) => container.set_mac(link, &link.mac),
        Ok(Err(e)) | Err(e) => Err(e),
    };
    if let Err(e) = announced {
        tracing::debug!(link = %name, "announcing its addresses: {e}");
    }
}
