//! Interface addresses.

use crate::netlink::Netlink;
use crate::{netlink_err, Result};
use ipnet::IpNet;
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::net::IpAddr;

fn message(index: u32, addr: &IpNet) -> AddressMessage {
    let mut m = AddressMessage::default();
    m.header.index = index;
    m.header.prefix_len = addr.prefix_len();
    match addr {
        IpNet::V4(v4) => {
            m.header.family = AddressFamily::Inet;
            m.attributes
                .push(AddressAttribute::Local(IpAddr::V4(v4.addr())));
            m.attributes
                .push(AddressAttribute::Address(IpAddr::V4(v4.addr())));
            if v4.prefix_len() < 31 {
                m.attributes
                    .push(AddressAttribute::Broadcast(v4.broadcast()));
            }
        }
        IpNet::V6(v6) => {
            m.header.family = AddressFamily::Inet6;
            m.attributes
                .push(AddressAttribute::Address(IpAddr::V6(v6.addr())));
        }
    }
    m
}

impl Netlink {
    /// Adds an address; IPv6 addresses skip duplicate address detection, so they are
    /// usable at once and nobody has to poll for them to settle.
    pub fn add_address(&mut self, index: u32, addr: &IpNet) -> Result<()> {
        self.add_address_with(index, addr, false)
    }

    /// Adds an address without the route to its subnet the kernel would add with it (for
    /// point-to-point links, whose subnet is reached through the gateway).
    pub fn add_address_without_subnet_route(&mut self, index: u32, addr: &IpNet) -> Result<()> {
        self.add_address_with(index, addr, true)
    }

    fn add_address_with(&mut self, index: u32, addr: &IpNet, no_prefix_route: bool) -> Result<()> {
        let mut m = message(index, addr);
        let mut flags = AddressFlags::empty();
        if addr.addr().is_ipv6() {
            m.header.flags = AddressHeaderFlags::Nodad;
            flags |= AddressFlags::Nodad;
        }
        if no_prefix_route {
            flags |= AddressFlags::Noprefixroute;
        }
        if !flags.is_empty() {
            m.attributes.push(AddressAttribute::Flags(flags));
        }
        self.request(
            RouteNetlinkMessage::NewAddress(m),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(format!("add address {addr} to link #{index}")))
    }

    /// Removes an address; one that is already gone is fine.
    pub fn delete_address(&mut self, index: u32, addr: &IpNet) -> Result<()> {
        match self.request(
            RouteNetlinkMessage::DelAddress(message(index, addr)),
            NLM_F_ACK,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => Ok(()),
            r => r.map(drop).map_err(netlink_err(format!(
                "delete address {addr} from link #{index}"
            ))),
        }
    }

    /// The addresses of one link (or of every link with `None`), as (index, address).
    pub fn addresses(&mut self, index: Option<u32>) -> Result<Vec<(u32, IpNet)>> {
        let mut query = AddressMessage::default();
        query.header.index = index.unwrap_or(0);
        let replies = self
            .request(RouteNetlinkMessage::GetAddress(query), NLM_F_DUMP)
            .map_err(netlink_err("list addresses"))?;
        let mut out = Vec::new();
        for r in replies {
            let RouteNetlinkMessage::NewAddress(m) = r else {
                continue;
            };
            if index.is_some_and(|i| i != m.header.index) {
                continue;
            }
            let ip = m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let ip = ip.or_else(|| {
                m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                })
            });
            if let Some(ip) = ip {
                if let Ok(net) = IpNet::new(ip, m.header.prefix_len) {
                    out.push((m.header.index, net));
                }
            }
        }
        Ok(out)
    }
}
