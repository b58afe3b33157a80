//! DHCP messages on the wire of one interface: a packet socket in the container's
//! namespace, because the interface has no address to send from or receive on until the
//! lease is bound, and the server may answer the offered address at our MAC.

use dhcproto::v4::Message;
use dhcproto::{Decodable, Encodable};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

const CLIENT_PORT: u16 = 68;
const SERVER_PORT: u16 = 67;
const ETH_P_IP: u16 = 0x0800;
const IPV4_HEADER: usize = 20;
const UDP_HEADER: usize = 8;

/// A packet socket bound to one interface, carrying IPv4 without Ethernet headers.
pub(crate) struct Wire {
    fd: OwnedFd,
    ifindex: i32,
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

impl Wire {
    /// Opens the socket in the calling thread's namespace, bound to `ifindex`.
    pub(crate) fn open(ifindex: u32) -> io::Result<Wire> {
        // SAFETY: plain socket(2); the descriptor is owned at once.
        let fd = check(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                i32::from(ETH_P_IP.to_be()),
            )
        })?;
        // SAFETY: fd was just returned by socket(2) and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ifindex = i32::try_from(ifindex).map_err(|_| io::ErrorKind::InvalidInput)?;
        let addr = link_addr(ifindex, [0; 8]);
        // SAFETY: addr is a valid sockaddr_ll of the size given.
        check(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::from_ref(&addr).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        })?;
        Ok(Wire { fd, ifindex })
    }

    /// Sends `msg` from `src` to `dst` (the broadcast address or a server), at the
    /// Ethernet broadcast address: the server's MAC is not known, and needs not be.
    pub(crate) fn send(&self, msg: &Message, src: Ipv4Addr, dst: Ipv4Addr) -> io::Result<()> {
        let payload = msg
            .to_vec()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        let packet = frame(&payload, src, dst);
        let addr = link_addr(self.ifindex, [0xff; 8]);
        // SAFETY: packet and addr are valid for the lengths given.
        check(unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                packet.as_ptr().cast(),
                packet.len(),
                0,
                std::ptr::from_ref(&addr).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            ) as libc::c_int
        })?;
        Ok(())
    }

    /// The next DHCP reply `accept` takes, or `None` when `deadline` passes first.
    pub(crate) fn receive(
        &self,
        deadline: Instant,
        accept: impl Fn(&Message) -> bool,
    ) -> io::Result<Option<Message>> {
        let mut buf = vec![0u8; 65536];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
            if ready < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if ready == 0 {
                continue;
            }
            // SAFETY: buf is valid for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) {
                    continue;
                }
                return Err(e);
            }
            let Some(payload) = unframe(&buf[..n as usize]) else {
                continue;
            };
            if let Ok(msg) = Message::from_bytes(payload) {
                if accept(&msg) {
                    return Ok(Some(msg));
                }
            }
        }
    }
}

fn link_addr(ifindex: i32, addr: [u8; 8]) -> libc::sockaddr_ll {
    libc::sockaddr_ll {
        sll_family: libc::AF_PACKET as u16,
        sll_protocol: ETH_P_IP.to_be(),
        sll_ifindex: ifindex,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 6,
        sll_addr: addr,
    }
}

/// The one's-complement sum of IP and UDP checksums.
fn checksum(chunks: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in chunks {
        let mut words = chunk.chunks(2);
        for w in &mut words {
            let hi = u32::from(w[0]) << 8;
            sum += hi | w.get(1).map_or(0, |b| u32::from(*b));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 and UDP header around a DHCP payload, from the client port to the server's.
fn frame(payload: &[u8], src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    let udp_len = (UDP_HEADER + payload.len()) as u16;
    let total = IPV4_HEADER as u16 + udp_len;
    let mut ip = [0u8; IPV4_HEADER];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[8] = 64;
    ip[9] = libc::IPPROTO_UDP as u8;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let sum = checksum(&[&ip]);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let mut udp = [0u8; UDP_HEADER];
    udp[0..2].copy_from_slice(&CLIENT_PORT.to_be_bytes());
    udp[2..4].copy_from_slice(&SERVER_PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    let pseudo = [
        &src.octets()[..],
        &dst.octets()[..],
        &[0, libc::IPPROTO_UDP as u8],
        &udp_len.to_be_bytes()[..],
    ]
    .concat();
    let sum = match checksum(&[&pseudo, &udp, payload]) {
        0 => 0xffff,
        s => s,
    };
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    [&ip[..], &udp[..], payload].concat()
}

/// The DHCP payload of an IPv4 UDP packet to the client port, if it is one.
fn unframe(packet: &[u8]) -> Option<&[u8]> {
    let first = *packet.first()?;
    let ihl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || ihl < IPV4_HEADER || packet.len() < ihl + UDP_HEADER {
        return None;
    }
    if packet[9] != libc::IPPROTO_UDP as u8 {
        return None;
    }
    let udp = &packet[ihl..];
    if u16::from_be_bytes([udp[2], udp[3]]) != CLIENT_PORT {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    udp.get(UDP_HEADER..len.max(UDP_HEADER))
}

/// How long the reference waits before the `n`th resend: four fast tries two seconds
/// apart, then doubling from four seconds up to `max`, each with a second of jitter.
pub(crate) fn resend_delay(n: u32, max: Duration) -> Duration {
    let base = if n < 4 {
        Duration::from_secs(2)
    } else {
        let doubled = Duration::from_secs(4).saturating_mul(1 << (n - 4).min(16));
        doubled.min(max)
    };
    let jitter = Duration::from_millis(u64::from(fastrand::u32(0..2000)));
    (base + jitter).saturating_sub(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framed_packets_come_back_whole() {
        let payload = b"dhcp";
        let mut packet = frame(payload, Ipv4Addr::UNSPECIFIED, Ipv4Addr::BROADCAST);
        assert_eq!(checksum(&[&packet[..IPV4_HEADER]]), 0, "IP checksum");
        // A reply travels to the client port: swap the ports.
        packet.swap(20, 22);
        packet.swap(21, 23);
        assert_eq!(unframe(&packet), Some(&payload[..]));
        packet[9] = 6;
        assert_eq!(unframe(&packet), None, "not UDP");
        assert_eq!(unframe(&[0x45, 0]), None, "short");
    }

    #[test]
    fn resends_back_off_up_to_the_maximum() {
        let max = Duration::from_secs(62);
        assert!(resend_delay(0, max) <= Duration::from_secs(3));
        assert!(resend_delay(4, max) >= Duration::from_secs(3));
        assert!(resend_delay(30, max) <= Duration::from_secs(63));
    }
}
