//! Routing policy rules: which table a packet from a source looks up.

use crate::netlink::Netlink;
use crate::{netlink_err, Result};
use ipnet::IpNet;
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

/// A rule sending packets from `src` to `table`, or one found in the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    /// The source the rule matches; none for a rule that matches every source.
    pub src: Option<IpNet>,
    /// The table looked up.
    pub table: u32,
    /// The preference; the kernel picks one below the last added when none.
    pub priority: Option<u32>,
    /// Whether the rule is IPv6 (a rule without a source has only its family).
    pub ipv6: bool,
}

impl RuleSpec {
    /// A rule from `src` to `table`, preference left to the kernel.
    pub fn from_source(src: IpNet, table: u32) -> RuleSpec {
        RuleSpec {
            src: Some(src),
            table,
            priority: None,
            ipv6: src.addr().is_ipv6(),
        }
    }
}

fn message(r: &RuleSpec) -> RuleMessage {
    let mut m = RuleMessage::default();
    m.header.family = if r.ipv6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    m.header.action = RuleAction::ToTable;
    m.header.table = u8::try_from(r.table).unwrap_or(0);
    m.attributes.push(RuleAttribute::Table(r.table));
    if let Some(src) = r.src {
        m.header.src_len = src.prefix_len();
        m.attributes.push(RuleAttribute::Source(src.addr()));
    }
    if let Some(p) = r.priority {
        m.attributes.push(RuleAttribute::Priority(p));
    }
    m
}

fn describe(r: &RuleSpec) -> String {
    match r.src {
        Some(src) => format!("rule from {src} lookup {}", r.table),
        None => format!("rule lookup {}", r.table),
    }
}

impl Netlink {
    /// Adds a rule; fails with EEXIST when an equal one is there.
    pub fn add_rule(&mut self, r: &RuleSpec) -> Result<()> {
        self.request(
            RouteNetlinkMessage::NewRule(message(r)),
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
        )
        .map(drop)
        .map_err(netlink_err(format!("add {}", describe(r))))
    }

    /// Removes a rule; one that is already gone is fine.
    pub fn delete_rule(&mut self, r: &RuleSpec) -> Result<()> {
        match self.request(RouteNetlinkMessage::DelRule(message(r)), NLM_F_ACK) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r2 => r2
                .map(drop)
                .map_err(netlink_err(format!("delete {}", describe(r)))),
        }
    }

    /// The rules of both families that look up a table.
    pub fn rules(&mut self) -> Result<Vec<RuleSpec>> {
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut q = RuleMessage::default();
            q.header.family = family;
            let replies = self
                .request(RouteNetlinkMessage::GetRule(q), NLM_F_DUMP)
                .map_err(netlink_err("list rules"))?;
            for reply in replies {
                let RouteNetlinkMessage::NewRule(m) = reply else {
                    continue;
                };
                if m.header.action != RuleAction::ToTable {
                    continue;
                }
                let mut rule = RuleSpec {
                    src: None,
                    table: u32::from(m.header.table),
                    priority: None,
                    ipv6: family == AddressFamily::Inet6,
                };
                for a in &m.attributes {
                    match a {
                        RuleAttribute::Source(ip) => {
                            rule.src = IpNet::new(*ip, m.header.src_len).ok();
                        }
                        RuleAttribute::Table(t) => rule.table = *t,
                        RuleAttribute::Priority(p) => rule.priority = Some(*p),
                        _ => {}
                    }
                }
                out.push(rule);
            }
        }
        Ok(out)
    }
}
