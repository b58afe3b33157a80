//! Router advertisements from a network's bridge, as Neutron's radvd sends them on a
//! router's interface for the subnets that have an `ipv6_ra_mode`: the bridge holds
//! the gateway on every host, so it is the router its pods hear. A host that configures
//! itself (a VM-like namespace, a pod whose runtime leaves IPv6 to the network) gets its
//! default route, its MTU and, on SLAAC and stateless DHCPv6 subnets, the same EUI-64
//! address the controller gave its port.
//!
//! One raw ICMPv6 socket for every bridge, in the host's namespace: it answers router
//! solicitations at once (unicast, to the soliciting address) and sends unsolicited
//! advertisements to all nodes: three 16 seconds apart once a bridge starts, then every
//! 30 to 100 seconds (Neutron's default interval). Best effort: a failed send is logged
//! and tried again a second later.

use std::collections::HashMap;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ipnet::Ipv6Net;
use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

use crate::{io_err, Result};

/// What a bridge tells the hosts on its network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertisement {
    /// Addresses come from DHCPv6 (the M flag; `dhcpv6-stateful`).
    pub managed: bool,
    /// Other settings come from DHCPv6 (the O flag; `dhcpv6-stateless`).
    pub other: bool,
    /// The MTU hosts use on the link.
    pub mtu: Option<u32>,
    /// On-link prefixes, each with whether hosts make their own address in it.
    pub prefixes: Vec<(Ipv6Net, bool)>,
    /// Recursive DNS servers (RFC 8106), at most three.
    pub dns: Vec<Ipv6Addr>,
}

/// radvd's defaults for Neutron's 100-second maximum interval: a router is a default
/// router for three intervals, its DNS servers as long.
const ROUTER_LIFETIME: u16 = 300;
const DNS_LIFETIME: u32 = 300;
/// radvd's prefix lifetimes.
const VALID_LIFETIME: u32 = 86_400;
const PREFERRED_LIFETIME: u32 = 14_400;
/// Neutron's `min_rtr_adv_interval` and `max_rtr_adv_interval`.
const MIN_INTERVAL: Duration = Duration::from_secs(30);
const MAX_INTERVAL: Duration = Duration::from_secs(100);
/// RFC 4861's first advertisements: this many, this far apart at most.
const INITIAL_ADVERTS: u8 = 3;
const INITIAL_INTERVAL: Duration = Duration::from_secs(16);
/// How long a failed send waits (a bridge's link-local address is still tentative).
const RETRY: Duration = Duration::from_secs(1);

const ROUTER_SOLICITATION: u8 = 133;
const ROUTER_ADVERTISEMENT: u8 = 134;
/// Linux's `ICMP6_FILTER` socket option (not in the libc crate).
const ICMP6_FILTER: libc::c_int = 1;
/// Neighbour discovery is dropped by receivers unless it arrives with this hop limit,
/// proof it was not routed.
const ND_HOP_LIMIT: u8 = 255;

impl Advertisement {
    /// The ICMPv6 message, checksum left to the kernel, with `mac` as the source
    /// link-layer address.
    pub fn encode(&self, mac: [u8; 6]) -> Vec<u8> {
        let flags = (u8::from(self.managed) << 7) | (u8::from(self.other) << 6);
        let mut m = vec![ROUTER_ADVERTISEMENT, 0, 0, 0, 64, flags];
        m.extend(ROUTER_LIFETIME.to_be_bytes());
        // Reachable time and retransmission timer: the hosts' own.
        m.extend([0; 8]);
        m.extend([1, 1]);
        m.extend(mac);
        if let Some(mtu) = self.mtu {
            m.extend([5, 1, 0, 0]);
            m.extend(mtu.to_be_bytes());
        }
        for (prefix, autonomous) in &self.prefixes {
            let flags = 0x80 | (u8::from(*autonomous) << 6);
            m.extend([3, 4, prefix.prefix_len(), flags]);
            m.extend(VALID_LIFETIME.to_be_bytes());
            m.extend(PREFERRED_LIFETIME.to_be_bytes());
            m.extend([0; 4]);
            m.extend(prefix.trunc().addr().octets());
        }
        if !self.dns.is_empty() {
            let dns = &self.dns[..self.dns.len().min(3)];
            m.extend([25, 1 + 2 * dns.len() as u8, 0, 0]);
            m.extend(DNS_LIFETIME.to_be_bytes());
            for a in dns {
                m.extend(a.octets());
            }
        }
        m
    }
}

/// Sends each bridge's advertisement, from a thread of its own.
pub struct Advertiser {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    socket: OwnedFd,
    /// Written to wake the thread when the bridges change.
    wake: OwnedFd,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// What each bridge (by index) advertises, and when it next does.
    links: HashMap<u32, Link>,
    stop: bool,
}

struct Link {
    message: Vec<u8>,
    next: Instant,
    initial: u8,
}

impl Advertiser {
    /// Opens the socket in the calling thread's namespace and starts the thread.
    pub fn open() -> Result<Advertiser> {
        let err = |e: std::io::Error| io_err("open an ICMPv6 socket for router advertisements")(e);
        let socket = rustix::net::socket_with(
            AddressFamily::INET6,
            SocketType::RAW,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            Some(rustix::net::ipproto::ICMPV6),
        )
        .map_err(|e| err(e.into()))?;
        rustix::net::sockopt::set_ipv6_multicast_hops(&socket, ND_HOP_LIMIT.into())
            .and_then(|()| rustix::net::sockopt::set_ipv6_unicast_hops(&socket, Some(ND_HOP_LIMIT)))
            .and_then(|()| rustix::net::sockopt::set_ipv6_multicast_loop(&socket, false))
            .map_err(|e| err(e.into()))?;
        only_solicitations(&socket).map_err(err)?;
        let wake = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| err(e.into()))?;
        let shared = Arc::new(Shared {
            socket,
            wake,
            state: Mutex::new(State::default()),
        });
        let run = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("router-adverts".into())
            .spawn(move || run.run())
            .map_err(err)?;
        Ok(Advertiser {
            shared,
            thread: Some(thread),
        })
    }

    /// Makes bridge `index` (with MAC `mac`) advertise `ad`, or nothing. A new or
    /// changed advertisement goes out at once and starts the initial ones again.
    pub fn set(&self, index: u32, mac: [u8; 6], ad: Option<&Advertisement>) {
        let mut state = self.shared.lock();
        let Some(ad) = ad else {
            state.links.remove(&index);
            return;
        };
        let message = ad.encode(mac);
        if state
            .links
            .get(&index)
            .is_some_and(|l| l.message == message)
        {
            return;
        }
        state.links.insert(
            index,
            Link {
                message,
                next: Instant::now(),
                initial: INITIAL_ADVERTS,
            },
        );
        drop(state);
        self.shared.wake();
    }
}

impl Drop for Advertiser {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Makes `socket` receive router solicitations alone (the filter's set bits block).
fn only_solicitations(socket: &OwnedFd) -> std::io::Result<()> {
    let mut filter = [u32::MAX; 8];
    let t = usize::from(ROUTER_SOLICITATION);
    filter[t >> 5] &= !(1 << (t & 31));
    // SAFETY: the option's value is the kernel's `struct icmp6_filter`, 32 bytes.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_ICMPV6,
            ICMP6_FILTER,
            filter.as_ptr().cast(),
            std::mem::size_of_val(&filter) as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Somewhere in `[from, to)`, so hosts' advertisements do not fall into step.
fn jitter(from: Duration, to: Duration) -> Duration {
    let mut b = [0u8; 4];
    // Without entropy every bridge keeps the same phase, which is harmless.
    let _ = getrandom::fill(&mut b);
    from + (to - from).mul_f64(f64::from(u32::from_ne_bytes(b)) / (f64::from(u32::MAX) + 1.0))
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        // Fails only when the counter is full, which wakes the thread anyway.
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    fn run(&self) {
        let mut buf = [0u8; 1500];
        loop {
            let due = match self.send_due() {
                Some(due) => due,
                None => return,
            };
            let timeout = due.map(|d| {
                let d = d.saturating_duration_since(Instant::now());
                rustix::event::Timespec {
                    tv_sec: d.as_secs() as i64,
                    tv_nsec: d.subsec_nanos().into(),
                }
            });
            let mut fds = [
                PollFd::new(&self.socket, PollFlags::IN),
                PollFd::new(&self.wake, PollFlags::IN),
            ];
            if let Err(e) = rustix::event::poll(&mut fds, timeout.as_ref()) {
                if e != rustix::io::Errno::INTR {
                    tracing::error!("router advertisements stop: poll: {e}");
                    return;
                }
            }
            let mut counter = [0u8; 8];
            let _ = rustix::io::read(&self.wake, &mut counter);
            self.answer_solicitations(&mut buf);
        }
    }

    /// Sends what is due; returns when the next one is (none without bridges), or
    /// none at all once stopped.
    fn send_due(&self) -> Option<Option<Instant>> {
        let mut state = self.lock();
        if state.stop {
            return None;
        }
        let now = Instant::now();
        for (index, link) in state.links.iter_mut().filter(|(_, l)| l.next <= now) {
            let to = SocketAddrV6::new(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), 0, 0, *index);
            match rustix::net::sendto(&self.socket, &link.message, SendFlags::empty(), &to) {
                Ok(_) => {
                    link.next = now
                        + if link.initial > 1 {
                            link.initial -= 1;
                            INITIAL_INTERVAL
                        } else {
                            link.initial = 0;
                            jitter(MIN_INTERVAL, MAX_INTERVAL)
                        };
                }
                Err(e) => {
                    tracing::debug!(bridge = index, "router advertisement: {e}");
                    link.next = now + RETRY;
                }
            }
        }
        Some(state.links.values().map(|l| l.next).min())
    }

    /// Answers each solicitation waiting on the socket, from a bridge that advertises,
    /// with its advertisement sent to the soliciting address.
    fn answer_solicitations(&self, buf: &mut [u8]) {
        loop {
            let from = match rustix::net::recvfrom(&self.socket, &mut *buf, RecvFlags::DONTWAIT) {
                Ok((n, _, Some(from)))
                    if n >= 8 && buf[0] == ROUTER_SOLICITATION && buf[1] == 0 =>
                {
                    from
                }
                Ok(_) => continue,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return,
                Err(e) => {
                    tracing::debug!("router solicitation: {e}");
                    return;
                }
            };
            // A solicitation from the unspecified address (a host before its link-local
            // address; Linux solicits from that address once it has one) carries no
            // interface here: the host gets the next unsolicited advertisement.
            let Ok(from) = SocketAddrV6::try_from(from) else {
                continue;
            };
            if from.ip().is_unspecified() {
                continue;
            }
            let state = self.lock();
            if let Some(link) = state.links.get(&from.scope_id()) {
                if let Err(e) = rustix::net::sendto(
                    self.socket.as_fd(),
                    &link.message,
                    SendFlags::empty(),
                    &from,
                ) {
                    tracing::debug!(bridge = from.scope_id(), to = %from.ip(), "router advertisement: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advertisement_carries_flags_mtu_prefixes_and_dns_servers() {
        let ad = Advertisement {
            managed: false,
            other: true,
            mtu: Some(1450),
            prefixes: vec![("fd53::/64".parse().unwrap(), true)],
            dns: vec!["fd53::53".parse().unwrap()],
        };
        let m = ad.encode([2, 0, 0, 0, 0, 1]);
        let mut want = vec![134, 0, 0, 0, 64, 0x40, 1, 44, 0, 0, 0, 0, 0, 0, 0, 0];
        want.extend([1, 1, 2, 0, 0, 0, 0, 1]);
        want.extend([5, 1, 0, 0, 0, 0, 5, 170]);
        want.extend([3, 4, 64, 0xc0, 0, 1, 81, 128, 0, 0, 56, 64, 0, 0, 0, 0]);
        want.extend([0xfd, 0x53, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        want.extend([25, 3, 0, 0, 0, 0, 1, 44]);
        want.extend([0xfd, 0x53, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x53]);
        assert_eq!(m, want);
    }

    #[test]
    fn a_stateful_prefix_is_on_link_but_not_autonomous() {
        let ad = Advertisement {
            managed: true,
            other: false,
            mtu: None,
            prefixes: vec![("fd54::1/64".parse().unwrap(), false)],
            dns: vec![],
        };
        let m = ad.encode([2, 0, 0, 0, 0, 1]);
        assert_eq!(m[5], 0x80, "M alone");
        assert_eq!(m.len(), 16 + 8 + 32, "no MTU or DNS option");
        assert_eq!(&m[24..28], [3, 4, 64, 0x80]);
        assert_eq!(m[40..56], "fd54::".parse::<Ipv6Addr>().unwrap().octets());
    }
}
