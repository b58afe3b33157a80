//! corvid's own nftables table, `inet corvid`, written through netfilter's netlink socket
//! in process (no `nft` child, no listing of the ruleset). Every change is one batch,
//! which the kernel commits as one transaction: a process killed mid-way leaves the table
//! as it was before or as it was meant to be after, never in between.
//!
//! Messages come from netlink-packet-netfilter (the rust-netlink family corvid already
//! uses for rtnetlink); the expressions it has no type for (nat, masq, ct, fib, the
//! xtables match) are encoded in [`expr`].
//!
//! The parts: `batch.rs` builds a transaction, `socket.rs` sends it and reads back,
//! `tags.rs` says whose each element and rule is; each feature's layout is a module of
//! its own (`masquerade`, `portmap`, `firewall`, `services`).

mod batch;
pub mod expr;
pub mod firewall;
pub mod masquerade;
pub mod portmap;
pub mod routing;
pub mod security_groups;
pub mod services;
mod socket;
mod tags;

use netlink_packet_core::DefaultNla;
use netlink_packet_netfilter::NetfilterProtoFamily;

pub use batch::Batch;
pub use expr::Verdict;
pub use socket::Nftables;
pub use tags::AttachmentTag;
pub(crate) use tags::{
    address_key, claim, collect_garbage, comments, lock, network_prefix, release,
    release_addresses, sweep,
};

/// nfnetlink's subsystem number of nf_tables, the batch messages' resource ID.
const NFNL_SUBSYS_NFTABLES: u16 = 10;

/// A chain's policy that drops (`NF_DROP`).
const NF_DROP: u32 = 0;
/// The forward hook's number (`NF_INET_FORWARD`, also the bridge family's).
const NF_INET_FORWARD: u32 = 2;

/// A forward base chain of another table whose policy is drop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardDrop {
    /// Its table's family, as nft names it (`inet`, `ip`, `ip6`, `bridge`).
    pub family: &'static str,
    /// Its table.
    pub table: String,
    /// The chain.
    pub chain: String,
}

impl std::fmt::Display for ForwardDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "table {} {} chain {}",
            self.family, self.table, self.chain
        )
    }
}

/// The nftables table corvid owns (family inet); nothing outside it is touched.
pub const TABLE: &str = "corvid";

/// A table corvid writes in: its own, or one iptables-nft manages (`ip filter`,
/// `ip6 filter`), where corvid only adds a chain of its own and a jump to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableRef {
    family: NetfilterProtoFamily,
    name: &'static str,
}

impl TableRef {
    /// corvid's own table, `inet corvid`.
    pub const CORVID: TableRef = TableRef {
        family: NetfilterProtoFamily::Inet,
        name: TABLE,
    };

    /// The security groups' bridge-family table, `bridge corvid-sg`: what enters a port
    /// and what a port may send as, by the port's own interface.
    pub const SG_BRIDGE: TableRef = TableRef {
        family: NetfilterProtoFamily::Bridge,
        name: security_groups::TABLE,
    };

    /// The security groups' inet table, `inet corvid-sg`: connection state, and what a
    /// port may start.
    pub const SG_INET: TableRef = TableRef {
        family: NetfilterProtoFamily::Inet,
        name: security_groups::TABLE,
    };

    /// iptables' `filter` table of one family, as iptables-nft keeps it in nftables.
    pub fn iptables_filter(v6: bool) -> TableRef {
        TableRef {
            family: if v6 {
                NetfilterProtoFamily::IPv6
            } else {
                NetfilterProtoFamily::IPv4
            },
            name: "filter",
        }
    }
}

/// What a base chain hooks into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookPoint {
    /// Before routing (DNAT).
    Prerouting,
    /// Addressed to this host.
    Input,
    /// Routed through this host.
    Forward,
    /// Sent by this host.
    Output,
    /// After routing (SNAT, masquerade).
    Postrouting,
}

/// The kind of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainType {
    /// Filtering (accept, drop, reject).
    Filter,
    /// Address translation, seen once per connection.
    Nat,
}

/// A chain the kernel calls from a hook, with nftables' priority (lower runs first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseChain {
    /// Filter or nat.
    pub kind: ChainType,
    /// Where.
    pub hook: HookPoint,
    /// When, among chains of the same hook (`dstnat` is -100, `srcnat` 100, `filter` 0).
    pub priority: i32,
}

/// An nftables data type: the kernel only checks lengths; the type ID lets `nft list`
/// print elements as addresses and ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataType {
    id: u32,
    len: u32,
}

impl DataType {
    /// An interface group (`ifgroup`).
    pub const DEVGROUP: DataType = DataType { id: 35, len: 4 };
    /// An IPv4 address.
    pub const IPV4: DataType = DataType { id: 7, len: 4 };
    /// An IPv6 address.
    pub const IPV6: DataType = DataType { id: 8, len: 16 };
    /// An IP protocol number (one byte).
    pub const INET_PROTO: DataType = DataType { id: 12, len: 1 };
    /// A transport port (two bytes, network order).
    pub const INET_SERVICE: DataType = DataType { id: 13, len: 2 };
    /// An Ethernet address.
    pub const ETHER: DataType = DataType { id: 9, len: 6 };
    /// An interface name (16 bytes, zero-padded).
    pub const IFNAME: DataType = DataType { id: 41, len: 16 };
    /// A 32-bit number (host order), as nft's `mark` type: nft cannot print its plain
    /// `integer` inside a concatenation (nft 1.0.6 aborts `list ruleset` on one).
    pub const NUMBER: DataType = DataType { id: 19, len: 4 };
    /// A verdict: the values of a verdict map (the kernel sizes them itself).
    pub const VERDICT: DataType = DataType {
        id: 0xffff_ff00,
        len: 0,
    };

    /// The address type of one family.
    pub fn addr(v6: bool) -> DataType {
        if v6 {
            DataType::IPV6
        } else {
            DataType::IPV4
        }
    }

    /// Several types one after the other (`a . b`), each part padded to 4 bytes.
    pub fn concat(parts: &[DataType]) -> DataType {
        DataType {
            id: parts.iter().fold(0, |id, p| (id << 6) | p.id),
            len: parts.iter().map(|p| p.len.div_ceil(4) * 4).sum(),
        }
    }
}

/// A named set or map in corvid's table.
#[derive(Debug, Clone, Copy)]
pub struct SetSpec<'a> {
    /// Its name.
    pub name: &'a str,
    /// The key.
    pub key: DataType,
    /// The value, for a map.
    pub data: Option<DataType>,
    /// Keys are ranges (prefixes).
    pub interval: bool,
    /// Elements expire this long after they were last added or refreshed by a rule (a
    /// set rules update as packets pass).
    pub timeout: Option<std::time::Duration>,
}

impl<'a> SetSpec<'a> {
    /// A set (`data` none) or map of single keys that never expire.
    pub fn new(name: &'a str, key: DataType, data: Option<DataType>) -> SetSpec<'a> {
        SetSpec {
            name,
            key,
            data,
            interval: false,
            timeout: None,
        }
    }
}

/// One element of a set, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    /// The key's bytes.
    pub key: Vec<u8>,
    /// The comment corvid stored with it.
    pub comment: Option<String>,
}

/// An address's bytes, as keys and values hold it.
pub(crate) fn addr_bytes(addr: std::net::IpAddr) -> Vec<u8> {
    match addr {
        std::net::IpAddr::V4(a) => a.octets().to_vec(),
        std::net::IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Each part of a concatenation takes whole 4-byte registers.
pub(crate) fn padded(bytes: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v.resize(bytes.len().div_ceil(4) * 4, 0);
    v
}

/// Where a connection is sent: address . port, as a map's value.
pub(crate) fn target(addr: std::net::IpAddr, port: u16) -> Vec<u8> {
    let mut v = addr_bytes(addr);
    v.extend(padded(&port.to_be_bytes()));
    v
}

/// FNV-1a over the parts, each ended by a zero byte so ("ab", "c") and ("a", "bc") differ.
pub(crate) fn fnv1a(parts: &[&str]) -> u64 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    for part in parts {
        h.write(part.as_bytes());
        h.write(&[0]);
    }
    h.finish()
}

/// One attribute of an expression the netfilter crate has no type for.
pub(crate) fn nla(kind: u16, value: impl Into<Vec<u8>>) -> DefaultNla {
    DefaultNla::new(kind, value.into())
}

#[cfg(test)]
mod tests {
    use super::batch::{comment_udata, udata_comment};
    use super::*;

    #[test]
    fn comments_round_trip_as_nft_writes_them() {
        let u = comment_udata("corvid:ab:cd");
        assert_eq!(&u[..2], &[0, 13]);
        assert_eq!(udata_comment(&u).as_deref(), Some("corvid:ab:cd"));
        assert_eq!(
            udata_comment(&[1, 1, 9, 0, 3, b'x', b'y', 0]).as_deref(),
            Some("xy")
        );
        assert_eq!(udata_comment(&[0, 9, 1]), None);
    }

    #[test]
    fn tags_separate_networks_and_attachments() {
        let a = AttachmentTag::new("net1", "c1", "eth0");
        assert_eq!(a, AttachmentTag::new("net1", "c1", "eth0"));
        assert_ne!(a, AttachmentTag::new("net1", "c1", "eth1"));
        assert_ne!(a, AttachmentTag::new("net2", "c1", "eth0"));
        assert_ne!(
            AttachmentTag::new("n", "ab", "c"),
            AttachmentTag::new("n", "a", "bc")
        );
        assert!(a.as_str().starts_with(&network_prefix("net1")));
        assert!(a.as_str().len() < 128);
    }

    #[test]
    fn tags_are_those_earlier_versions_wrote() {
        // Elements written before an upgrade are found and removed by these tags.
        assert_eq!(
            AttachmentTag::new("net", "ctr", "eth0").as_str(),
            "corvid:e53f18baa0319ec8:4f23bddf6d4f4663"
        );
        assert_eq!(
            AttachmentTag::network("n1").as_str(),
            "corvid-net:21cece1925f18240"
        );
    }

    #[test]
    fn concatenations_pad_each_part() {
        let t = DataType::concat(&[DataType::IPV4, DataType::INET_SERVICE]);
        assert_eq!(t.len, 8);
        assert_eq!(t.id, (7 << 6) | 13);
    }
}
