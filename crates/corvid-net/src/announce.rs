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

/// Announces, into a bridge, the address of a port on another host: a gratuitous ARP or
/// an unsolicited neighbour advertisement as if that port had sent it. The overlay floods nothing between hosts (ARP is answered
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
        let mac = mac_bytes(mac, &ip.to_string())?;
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
        self.send(ifindex, ETH_P_ARP, broadcast, &frame, &ip.to_string(), &mac)
    }

    /// Sends "`ip` is at `mac`" out of the interface `ifindex` as an unsolicited
    /// neighbour advertisement to all nodes, with the override flag: a neighbour that
    /// holds `ip` under another MAC takes this one (RFC 4861, 7.2.6).
    pub fn unsolicited_na(
        &self,
        ifindex: u32,
        mac: &str,
        ip: std::net::Ipv6Addr,
    ) -> crate::Result<()> {
        let mac = mac_bytes(mac, &ip.to_string())?;
        let all_nodes = std::net::Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
        let dst_mac = [0x33, 0x33, 0, 0, 0, 1];
        // ICMPv6 type 136 with the override flag, the target, and its link-layer
        // address option (type 2, one 8-byte unit).
        let mut icmp = vec![136u8, 0, 0, 0, 0x20, 0, 0, 0];
        icmp.extend(ip.octets());
        icmp.extend([2, 1]);
        icmp.extend(mac);
        let sum = icmpv6_checksum(ip, all_nodes, &icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        let mut frame = Vec::with_capacity(14 + 40 + icmp.len());
        frame.extend(dst_mac);
        frame.extend(mac);
        frame.extend(ETH_P_IPV6.to_be_bytes());
        // Version 6, no traffic class or flow label; hop limit 255, as neighbour
        // discovery demands of what it accepts.
        frame.extend([0x60, 0, 0, 0]);
        frame.extend((icmp.len() as u16).to_be_bytes());
        frame.extend([IPPROTO_ICMPV6, 255]);
        frame.extend(ip.octets());
        frame.extend(all_nodes.octets());
        frame.extend(&icmp);
        self.send(ifindex, ETH_P_IPV6, dst_mac, &frame, &ip.to_string(), &mac)
    }

    /// Sends one whole Ethernet frame out of `ifindex`.
    fn send(
        &self,
        ifindex: u32,
        protocol: u16,
        dst: [u8; 6],
        frame: &[u8],
        ip: &str,
        mac: &[u8; 6],
    ) -> crate::Result<()> {
        use std::os::fd::AsRawFd;
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_protocol = protocol.to_be();
        to.sll_ifindex = ifindex as i32;
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&dst);
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
            let what = format!("announce {ip} at {}", crate::link::format_mac(mac));
            return Err(crate::io_err(what)(std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_ICMPV6: u8 = 58;

/// A MAC's six bytes; an error naming the address it was to announce otherwise.
fn mac_bytes(mac: &str, ip: &str) -> crate::Result<[u8; 6]> {
    crate::link::parse_mac(mac)
        .and_then(|m| m.try_into().ok())
        .ok_or_else(|| {
            crate::io_err(format!("announce {ip}"))(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("not a MAC address: {mac}"),
            ))
        })
}

/// The ICMPv6 checksum of `icmp` (its checksum field zero) from `src` to `dst`: the
/// one's complement sum over the IPv6 pseudo-header and the message (RFC 4443, 2.3).
fn icmpv6_checksum(src: std::net::Ipv6Addr, dst: std::net::Ipv6Addr, icmp: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(40 + icmp.len() + 1);
    pseudo.extend(src.octets());
    pseudo.extend(dst.octets());
    pseudo.extend((icmp.len() as u32).to_be_bytes());
    pseudo.extend([0, 0, 0, IPPROTO_ICMPV6]);
    pseudo.extend(icmp);
    if pseudo.len() % 2 == 1 {
        pseudo.push(0);
    }
    let mut sum: u32 = pseudo
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_icmpv6_checksum_of_a_known_advertisement() {
        // A neighbour advertisement from fe80::1 to ff02::1 for fe80::1 at
        // 02:00:00:00:00:01, override flag, whose checksum 0x579b was computed apart (with Python).
        let src: std::net::Ipv6Addr = "fe80::1".parse().unwrap();
        let dst: std::net::Ipv6Addr = "ff02::1".parse().unwrap();
        let mut icmp = vec![136u8, 0, 0, 0, 0x20, 0, 0, 0];
        icmp.extend(src.octets());
        icmp.extend([2, 1, 2, 0, 0, 0, 0, 1]);
        let sum = icmpv6_checksum(src, dst, &icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        // The sum over the pseudo-header and a message holding its own checksum is
        // all ones, which complements to zero.
        assert_eq!(icmpv6_checksum(src, dst, &icmp), 0);
        assert_eq!(sum, 0x579b);
    }
}
