//! Telling the neighbours that an address moved: a gratuitous ARP for each IPv4 address
//! and an unsolicited neighbour advertisement (with the override flag) for each IPv6
//! one, sent from the interface that now holds it. An address freed by a deleted
//! container and given to a new one (with another MAC) is otherwise unreachable from the
//! old peers until their neighbour entry ages out, 20 seconds and more; the reference
//! bridge plugin sends the same ARP on ADD.
//!
//! Best effort, as the reference's: a neighbour that misses it still finds the address
//! by itself later, so a failure is logged, never an error of the plug.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use ipnet::IpNet;

use crate::link::Link;
use crate::netns::Netns;

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IP: u16 = 0x0800;
/// ICMPv6 neighbour advertisement.
const ND_NEIGHBOR_ADVERT: u8 = 136;
/// The advertisement's override flag: replace what the neighbours cached.
const ND_NA_FLAG_OVERRIDE: u8 = 0x20;
/// The target link-layer address option.
const ND_OPT_TARGET_LINKADDR: u8 = 2;

/// Announces `addrs` from `link` (in `netns`, up, holding them).
pub fn announce(netns: &Netns, link: &Link, addrs: &[IpNet]) {
    let Some(mac) = crate::link::parse_mac(&link.mac).and_then(|m| <[u8; 6]>::try_from(m).ok())
    else {
        return;
    };
    let sent = netns.run(|| {
        for a in addrs {
            let sent = match a.addr() {
                IpAddr::V4(ip) => gratuitous_arp(link.index, mac, ip),
                IpAddr::V6(ip) => unsolicited_advert(link.index, mac, ip),
            };
            if let Err(e) = sent {
                tracing::debug!(link = %link.name, addr = %a.addr(), "announcing the address: {e}");
            }
        }
    });
    if let Err(e) = sent {
        tracing::debug!(link = %link.name, "announcing addresses: {e}");
    }
}

fn socket(domain: i32, kind: i32, protocol: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: socket(2) returns a new descriptor or -1; the descriptor is owned here.
    let fd = unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor no one else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn check(ret: isize) -> std::io::Result<()> {
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// An ARP request for `ip` from `ip` itself, broadcast: every neighbour that has `ip`
/// cached takes the new MAC.
fn gratuitous_arp(ifindex: u32, mac: [u8; 6], ip: Ipv4Addr) -> std::io::Result<()> {
    let fd = socket(
        libc::AF_PACKET,
        libc::SOCK_DGRAM,
        i32::from(ETH_P_ARP.to_be()),
    )?;
    let mut frame = Vec::with_capacity(28);
    frame.extend(1u16.to_be_bytes()); // Ethernet
    frame.extend(ETH_P_IP.to_be_bytes());
    frame.extend([6, 4]);
    frame.extend(1u16.to_be_bytes()); // request
    frame.extend(mac);
    frame.extend(ip.octets());
    frame.extend([0u8; 6]);
    frame.extend(ip.octets());
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    to.sll_family = libc::AF_PACKET as u16;
    to.sll_protocol = ETH_P_ARP.to_be();
    to.sll_ifindex = ifindex as i32;
    to.sll_halen = 6;
    to.sll_addr[..6].copy_from_slice(&[0xff; 6]);
    // SAFETY: the buffer and the address are valid for the lengths given.
    check(unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            (&to as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    })
}

/// A neighbour advertisement of `ip` at `mac` with the override flag, to all nodes,
/// from `ip` itself (the kernel fills in the checksum of a raw ICMPv6 socket). An
/// address still in duplicate-address detection cannot be sent from, and is not
/// announced (it is not usable yet either).
fn unsolicited_advert(ifindex: u32, mac: [u8; 6], ip: Ipv6Addr) -> std::io::Result<()> {
    let fd = socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_ICMPV6)?;
    let hops: libc::c_int = 255;
    // SAFETY: the option value is a valid c_int for the length given.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_MULTICAST_HOPS,
            (&hops as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as u32,
        )
    } as isize)?;
    let from = sockaddr_in6(ip, 0);
    // SAFETY: the address is a valid sockaddr_in6 for the length given.
    check(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&from as *const libc::sockaddr_in6).cast(),
            std::mem::size_of::<libc::sockaddr_in6>() as u32,
        )
    } as isize)?;
    let mut message = vec![ND_NEIGHBOR_ADVERT, 0, 0, 0, ND_NA_FLAG_OVERRIDE, 0, 0, 0];
    message.extend(ip.octets());
    message.extend([ND_OPT_TARGET_LINKADDR, 1]);
    message.extend(mac);
    let to = sockaddr_in6(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), ifindex);
    // SAFETY: the buffer and the address are valid for the lengths given.
    check(unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            message.as_ptr().cast(),
            message.len(),
            0,
            (&to as *const libc::sockaddr_in6).cast(),
            std::mem::size_of::<libc::sockaddr_in6>() as u32,
        )
    })
}

fn sockaddr_in6(ip: Ipv6Addr, scope: u32) -> libc::sockaddr_in6 {
    // SAFETY: all-zero is a valid sockaddr_in6.
    let mut a: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    a.sin6_family = libc::AF_INET6 as u16;
    a.sin6_addr.s6_addr = ip.octets();
    a.sin6_scope_id = scope;
    a
}
