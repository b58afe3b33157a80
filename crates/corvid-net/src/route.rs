//! Routes in the main table (or another one).

use crate::netlink::Netlink;
use crate::{netlink_err, Result};
use ipnet::IpNet;
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteMetric, RouteProtocol,
    RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::net::IpAddr;

/// The main routing table, where routes go when no table is named.
pub const MAIN_TABLE: u32 = RouteHeader::RT_TABLE_MAIN as u32;
/// The scope of a route through a gateway (`RouteSpec.scope`).
pub const SCOPE_UNIVERSE: u8 = 0;
/// The scope of an on-link route (`RouteSpec.scope`).
pub const SCOPE_LINK: u8 = 253;

/// A route to install or one found in the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    /// Destination network.
    pub dst: IpNet,
    /// Next hop; none for an on-link route.
    pub gw: Option<IpAddr>,
    /// Outgoing interface index.
    pub oif: u32,
    /// Metric.
    pub priority: Option<u32>,
    /// Table; the main table when none.
    pub table: Option<u32>,
    /// Route MTU.
    pub mtu: Option<u32>,
    /// Advertised MSS.
    pub advmss: Option<u32>,
    /// Scope; universe with a gateway, link without, when none.
    pub scope: Option<u8>,
    /// The source address packets on this route get, when set.
    pub src: Option<IpAddr>,
    /// Who made the route (an `RTPROT_*` value); `boot` when none.
    pub protocol: Option<u8>,
}

impl RouteSpec {
    /// A route to `dst` via `gw` out of `oif`, everything else default.
    pub fn new(dst: IpNet, gw: Option<IpAddr>, oif: u32) -> RouteSpec {
        RouteSpec {
            dst: dst.trunc(),
            gw,
            oif,
            priority: None,
            table: None,
            mtu: None,
            advmss: None,
            scope: None,
            src: None,
            protocol: None,
        }
    }
}

fn route_address(ip: IpAddr) -> RouteAddress {
    match ip {
        IpAddr::V4(v) => RouteAddress::Inet(v),
        IpAddr::V6(v) => RouteAddress::Inet6(v),
    }
}

fn from_route_address(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

fn message(r: &RouteSpec) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = if r.dst.addr().is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    m.header.destination_prefix_length = r.dst.prefix_len();
    m.header.protocol = r.protocol.map_or(RouteProtocol::Boot, RouteProtocol::from);
    m.header.kind = RouteType::Unicast;
    m.header.scope = match r.scope {
        Some(s) => RouteScope::from(s),
        None if r.gw.is_some() => RouteScope::Universe,
        None => RouteScope::Link,
    };
    let table = r.table.unwrap_or(MAIN_TABLE);
    if table < 256 {
        m.header.table = table as u8;
    } else {
        m.header.table = 0;
        m.attributes.push(RouteAttribute::Table(table));
    }
    if r.dst.prefix_len() > 0 {
        m.attributes
            .push(RouteAttribute::Destination(route_address(r.dst.addr())));
    }
    if let Some(gw) = r.gw {
        m.attributes
            .push(RouteAttribute::Gateway(route_address(gw)));
    }
    m.attributes.push(RouteAttribute::Oif(r.oif));
    if let Some(src) = r.src {
        m.attributes
            .push(RouteAttribute::PrefSource(route_address(src)));
    }
    if let Some(p) = r.priority {
        m.attributes.push(RouteAttribute::Priority(p));
    }
    let mut metrics = Vec::new();
    if let Some(mtu) = r.mtu {
        metrics.push(RouteMetric::Mtu(mtu));
    }
    if let Some(mss) = r.advmss {
        metrics.push(RouteMetric::Advmss(mss));
    }
    if !metrics.is_empty() {
        m.attributes.push(RouteAttribute::Metrics(metrics));
    }
    m
}

fn describe(r: &RouteSpec) -> String {
    format!(
        "route to {}{}",
        r.dst,
        r.gw.map(|g| format!(" via {g}")).unwrap_or_default()
    )
}

impl Netlink {
    /// Installs a route; fails with EEXIST when an equal one is there.
    pub fn add_route(&mut self, r: &RouteSpec) -> Result<()> {
        self.request(
            RouteNetlinkMessage::NewRoute(message(r)),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(format!("add {}", describe(r))))
    }

    /// Installs a route, replacing one to the same destination and metric in its table.
    pub fn replace_route(&mut self, r: &RouteSpec) -> Result<()> {
        self.request(
            RouteNetlinkMessage::NewRoute(message(r)),
            NLM_F_CREATE | NLM_F_REPLACE | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(format!("replace {}", describe(r))))
    }

    /// Removes a route; one that is already gone is fine.
    pub fn delete_route(&mut self, r: &RouteSpec) -> Result<()> {
        let mut m = message(r);
        // Any protocol and scope: the kernel matches on what is given.
        m.header.protocol = RouteProtocol::Unspec;
        m.header.scope = RouteScope::NoWhere;
        match self.request(RouteNetlinkMessage::DelRoute(m), NLM_F_ACK) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            r2 => r2
                .map(drop)
                .map_err(netlink_err(format!("delete {}", describe(r)))),
        }
    }

    /// The unicast routes of every table, with what `replace_route` needs to copy them.
    pub fn routes(&mut self) -> Result<Vec<RouteSpec>> {
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut q = RouteMessage::default();
            q.header.address_family = family;
            let replies = self
                .request(RouteNetlinkMessage::GetRoute(q), NLM_F_DUMP)
                .map_err(netlink_err("list routes"))?;
            for r in replies {
                let RouteNetlinkMessage::NewRoute(m) = r else {
                    continue;
                };
                if m.header.kind != RouteType::Unicast {
                    continue;
                }
                let mut dst = None;
                let mut spec = RouteSpec::new(IpNet::default(), None, 0);
                spec.table = Some(m.header.table as u32);
                spec.scope = Some(u8::from(m.header.scope));
                spec.protocol = Some(u8::from(m.header.protocol));
                for a in &m.attributes {
                    match a {
                        RouteAttribute::Destination(d) => dst = from_route_address(d),
                        RouteAttribute::Gateway(g) => spec.gw = from_route_address(g),
                        RouteAttribute::Oif(o) => spec.oif = *o,
                        RouteAttribute::Priority(p) => spec.priority = Some(*p),
                        RouteAttribute::Table(t) => spec.table = Some(*t),
                        RouteAttribute::PrefSource(s) => spec.src = from_route_address(s),
                        RouteAttribute::Metrics(ms) => {
                            for metric in ms {
                                match metric {
                                    RouteMetric::Mtu(v) => spec.mtu = Some(*v),
                                    RouteMetric::Advmss(v) => spec.advmss = Some(*v),
                                    _ => {}
                                }
                            }
                        }
                        _ => {}
                    }
                }
                let dst = dst.unwrap_or(if family == AddressFamily::Inet {
                    IpAddr::from([0u8; 4])
                } else {
                    IpAddr::from([0u16; 8])
                });
                if let Ok(net) = IpNet::new(dst, m.header.destination_prefix_length) {
                    spec.dst = net;
                    out.push(spec);
                }
            }
        }
        Ok(out)
    }
}
