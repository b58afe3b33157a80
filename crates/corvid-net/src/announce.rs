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

/// Announces, into a bridge, the address of a port on another host: a gratuitous ARP as
/// if that port had sent it. The overlay floods nothing between hosts (ARP is answered
/// locally), so the port's own announcement never leaves its host; without this, a
/// local peer that knew the address under the MAC of a deleted port keeps sending there
/// until its neighbour entry goes stale, half a minute and more.
///
/// One packet socket, opened once in the host's namespace and kept (closing one waits
/// for an RCU grace period); it only sends.
pub struct Announcer {
    fd: std::os::fd::OwnedFd,
}

const ETH_P_ARP: u16 = 0x0806;

impl Announcer {
    /// Opens the packet socket in the calling thread's namespace.
    pub fn open() -> crate::Result<Announcer> {
        use std::os::fd::FromRawFd;
        // Protocol 0: the socket receives nothing.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(crate::io_err(
                "open a packet socket to announce remote ports",
            )(std::io::Error::last_os_error()));
        }
        Ok(Announcer {
            fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Sends "`ip` is at `mac`" out of the interface `ifindex` (a bridge: to each of
    /// its ports) as a broadcast gratuitous ARP request.
    pub fn gratuitous_arp(
        &self,
        ifindex: u32,
        mac: &str,
        ip: std::net::Ipv4Addr,
    ) -> crate::Result<()> {
        use std::os::fd::AsRawFd;
        let mac: [u8; 6] = crate::link::parse_mac(mac)
            .and_then(|m| m.try_into().ok())
            .ok_or_else(|| {
                crate::io_err(format!("announce {ip}"))(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("not a MAC address: {mac}"),
                ))
            })?;
        let broadcast = [0xffu8; 6];
        let mut frame = Vec::with_capacity(42);
        frame.extend(broadcast);
        frame.extend(mac);
        frame.extend(ETH_P_ARP.to_be_bytes());
        // Ethernet, IPv4, 6- and 4-byte addresses, a request.
        frame.extend([0, 1, 8, 0, 6, 4, 0, 1]);
        frame.extend(mac);
        frame.extend(ip.octets());
        frame.extend([0u8; 6]);
        frame.extend(ip.octets());
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_protocol = ETH_P_ARP.to_be();
        to.sll_ifindex = ifindex as i32;
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&broadcast);
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&to as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if sent < 0 {
            let what = format!("announce {ip} at {}", crate::link::format_mac(&mac));
            return Err(crate::io_err(what)(std::io::Error::last_os_error()));
        }
        Ok(())
    }
}
