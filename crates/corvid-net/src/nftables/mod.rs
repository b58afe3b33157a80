//! corvid's own nftables table, `inet corvid`, written through netfilter's netlink socket
//! in process (no `nft` child, no listing of the ruleset). Every change is one batch,
//! which the kernel commits as one transaction: a process killed mid-way leaves the table
//! as it was before or as it was meant to be after, never in between.
//!
//! Messages come from netlink-packet-netfilter (the rust-netlink family corvid already
//! uses for rtnetlink); the expressions it has no type for (nat, masq, ct, fib, the
//! xtables match) are encoded in [`expr`].

pub mod expr;
pub mod firewall;
pub mod masquerade;
pub mod portmap;
pub mod services;

use crate::netlink::Channel;
use crate::{Error, Result};
use netlink_packet_core::{
    DefaultNla, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_APPEND,
    NLM_F_CREATE, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, Expressions, Hook, HookNumber, InetHookNumber,
    ListAttribute, NfTablesMessage, RuleAttribute, RuleMessage, SetAttribute, SetElementAttribute,
    SetElementList, SetElementMessage, SetFlags, SetMessage, TableAttribute, TableFlags,
    TableMessage,
};
use netlink_packet_netfilter::{
    none::ControlMessage, NetfilterHeader, NetfilterMessage, NetfilterMessageInner,
    NetfilterProtoFamily,
};
use netlink_sys::protocols::NETLINK_NETFILTER;
use std::io;

use crate::netns::Netns;

pub use expr::Verdict;

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
    /// An IPv4 address.
    pub const IPV4: DataType = DataType { id: 7, len: 4 };
    /// An IPv6 address.
    pub const IPV6: DataType = DataType { id: 8, len: 16 };
    /// An IP protocol number (one byte).
    pub const INET_PROTO: DataType = DataType { id: 12, len: 1 };
    /// A transport port (two bytes, network order).
    pub const INET_SERVICE: DataType = DataType { id: 13, len: 2 };
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

/// Names what one attachment (network, container, interface) put in corvid's table, as
/// the comment of its elements: `corvid:<network hash>:<attachment hash>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AttachmentTag(String);

impl AttachmentTag {
    /// The tag of (network, container ID, interface).
    pub fn new(network: &str, container_id: &str, ifname: &str) -> AttachmentTag {
        AttachmentTag(format!(
            "{}{:016x}",
            network_prefix(network),
            fnv1a(&[container_id, ifname])
        ))
    }

    /// The tag of a whole network's masquerade, programmed by the agent of a host.
    pub fn network(network: &str) -> AttachmentTag {
        AttachmentTag(format!("corvid-net:{:016x}", fnv1a(&[network])))
    }

    /// The comment text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `corvid:<network hash>` part, shared by the network's attachments.
    pub(crate) fn network_part(&self) -> &str {
        self.0.rsplit_once(':').map_or("", |(n, _)| n)
    }
}

pub(crate) fn network_prefix(network: &str) -> String {
    format!("corvid:{:016x}:", fnv1a(&[network]))
}

/// Serializes corvid's read-then-change steps on its table (an element looked up, then
/// replaced or removed) between processes; each change itself is one transaction.
const LOCK_PATH: &str = "/run/corvid/nftables.lock";

pub(crate) fn lock() -> Result<std::fs::File> {
    let dir = std::path::Path::new(LOCK_PATH)
        .parent()
        .expect("lock path has a parent");
    std::fs::create_dir_all(dir).map_err(crate::io_err(format!("create {}", dir.display())))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_PATH)
        .map_err(crate::io_err(format!("open {LOCK_PATH}")))?;
    loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive) {
            Ok(()) => return Ok(file),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(crate::io_err(format!("lock {LOCK_PATH}"))(e.into())),
        }
    }
}

/// nftables' comment TLV in user data (the type `nft` reads back as `comment`).
fn comment_udata(comment: &str) -> Vec<u8> {
    let text = &comment.as_bytes()[..comment.len().min(254)];
    let mut out = vec![0, text.len() as u8 + 1];
    out.extend_from_slice(text);
    out.push(0);
    out
}

fn udata_comment(udata: &[u8]) -> Option<String> {
    let mut rest = udata;
    while rest.len() >= 2 {
        let (kind, len) = (rest[0], rest[1] as usize);
        let value = rest.get(2..2 + len)?;
        if kind == 0 {
            let text = value.strip_suffix(&[0]).unwrap_or(value);
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        rest = &rest[2 + len..];
    }
    None
}

/// Changes, committed together by [`Nftables::commit`]; each goes to the table chosen
/// last with [`Batch::in_table`], corvid's own unless another was chosen.
#[derive(Debug)]
pub struct Batch {
    messages: Vec<(NfTablesMessage, u16, String, NetfilterProtoFamily)>,
    table: TableRef,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch {
            messages: Vec::new(),
            table: TableRef::CORVID,
        }
    }
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Sends what follows to `table`.
    pub fn in_table(&mut self, table: TableRef) {
        self.table = table;
    }

    /// True when nothing was asked.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    fn push(&mut self, message: NfTablesMessage, flags: u16, what: String) {
        self.messages
            .push((message, flags, what, self.table.family));
    }

    /// Creates corvid's table unless it exists.
    pub fn add_table(&mut self) {
        self.push(
            NfTablesMessage::NewTable(TableMessage {
                attributes: vec![
                    TableAttribute::Name(self.table.name.into()),
                    TableAttribute::Flags(TableFlags::empty()),
                ],
            }),
            NLM_F_CREATE,
            format!("create table {}", self.table.name),
        );
    }

    /// Creates a chain unless it exists; a base chain's policy is accept.
    pub fn add_chain(&mut self, name: &str, base: Option<BaseChain>) {
        let mut attributes = vec![
            ChainAttribute::Table(self.table.name.into()),
            ChainAttribute::Name(name.into()),
        ];
        if let Some(base) = base {
            let hook = match base.hook {
                HookPoint::Prerouting => InetHookNumber::PreRouting,
                HookPoint::Input => InetHookNumber::LocalIn,
                HookPoint::Forward => InetHookNumber::Forward,
                HookPoint::Output => InetHookNumber::LocalOut,
                HookPoint::Postrouting => InetHookNumber::PostRouting,
            };
            attributes.extend([
                ChainAttribute::Hook(vec![
                    Hook::Number(HookNumber::Inet(hook)),
                    Hook::Priority(base.priority as u32),
                ]),
                ChainAttribute::Policy(1),
                ChainAttribute::Type(
                    match base.kind {
                        ChainType::Filter => "filter",
                        ChainType::Nat => "nat",
                    }
                    .into(),
                ),
            ]);
        }
        self.push(
            NfTablesMessage::NewChain(ChainMessage { attributes }),
            NLM_F_CREATE,
            format!("create chain {name}"),
        );
    }

    /// Removes every rule of a chain (which must exist).
    pub fn flush_chain(&mut self, name: &str) {
        self.push(
            NfTablesMessage::DeleteRule(RuleMessage {
                attributes: vec![
                    RuleAttribute::Table(self.table.name.into()),
                    RuleAttribute::Chain(name.into()),
                ],
            }),
            0,
            format!("flush chain {name}"),
        );
    }

    /// Appends a rule to a chain.
    pub fn add_rule(&mut self, chain: &str, expressions: Vec<Expressions>, comment: Option<&str>) {
        let what = format!("add a rule to chain {chain}");
        self.rule(
            chain,
            expressions,
            comment,
            NLM_F_CREATE | NLM_F_APPEND,
            what,
        );
    }

    /// Puts a rule at the head of a chain.
    pub fn insert_rule(
        &mut self,
        chain: &str,
        expressions: Vec<Expressions>,
        comment: Option<&str>,
    ) {
        let what = format!("insert a rule in chain {chain}");
        self.rule(chain, expressions, comment, NLM_F_CREATE, what);
    }

    fn rule(
        &mut self,
        chain: &str,
        expressions: Vec<Expressions>,
        comment: Option<&str>,
        flags: u16,
        what: String,
    ) {
        let mut attributes = vec![
            RuleAttribute::Table(self.table.name.into()),
            RuleAttribute::Chain(chain.into()),
            RuleAttribute::Expressions(expressions.into_iter().map(Into::into).collect()),
        ];
        if let Some(c) = comment {
            attributes.push(RuleAttribute::UserData(comment_udata(c)));
        }
        self.push(
            NfTablesMessage::NewRule(RuleMessage { attributes }),
            flags,
            what,
        );
    }

    /// Removes one rule, by the handle the kernel gave it.
    pub fn delete_rule(&mut self, chain: &str, handle: u64) {
        self.push(
            NfTablesMessage::DeleteRule(RuleMessage {
                attributes: vec![
                    RuleAttribute::Table(self.table.name.into()),
                    RuleAttribute::Chain(chain.into()),
                    RuleAttribute::Handle(handle),
                ],
            }),
            0,
            format!("delete rule {handle} of chain {chain}"),
        );
    }

    /// Creates a set or map unless it exists.
    pub fn add_set(&mut self, set: &SetSpec) {
        let mut flags = SetFlags::empty();
        if set.interval {
            flags |= SetFlags::Interval;
        }
        let mut attributes = vec![
            SetAttribute::Table(self.table.name.into()),
            SetAttribute::Name(set.name.into()),
            SetAttribute::KeyType(set.key.id),
            SetAttribute::KeyLen(set.key.len),
            SetAttribute::Id(1),
        ];
        if let Some(data) = set.data {
            flags |= SetFlags::Map;
            attributes.push(SetAttribute::DataType(data.id));
            attributes.push(SetAttribute::DataLen(data.len));
        }
        if let Some(timeout) = set.timeout {
            flags |= SetFlags::Timeout | SetFlags::Eval;
            attributes.push(SetAttribute::Timeout(timeout.as_millis() as u64));
        }
        attributes.push(SetAttribute::Flags(flags));
        self.push(
            NfTablesMessage::NewSet(SetMessage { attributes }),
            NLM_F_CREATE,
            format!("create set {}", set.name),
        );
    }

    /// Adds an element (a key, and a value for a map) with a comment; an identical
    /// element already there is no error.
    pub fn add_element(&mut self, set: &str, key: &[u8], value: Option<Vec<u8>>, comment: &str) {
        let mut element = vec![
            SetElementAttribute::Key(DataAttribute::Value(key.to_vec())),
            SetElementAttribute::UserData(comment_udata(comment)),
        ];
        if let Some(value) = value {
            element.push(SetElementAttribute::Data(DataAttribute::Value(value)));
        }
        self.push(
            NfTablesMessage::NewSetElement(element_message(set, element)),
            NLM_F_CREATE,
            format!("add an element to {set}"),
        );
    }

    /// Adds an element of a verdict map that jumps to `chain`.
    pub fn add_jump_element(&mut self, set: &str, key: &[u8], chain: &str) {
        let element = vec![
            SetElementAttribute::Key(DataAttribute::Value(key.to_vec())),
            SetElementAttribute::Data(DataAttribute::Verdict(
                expr::Verdict::Jump(chain).attributes(),
            )),
        ];
        self.push(
            NfTablesMessage::NewSetElement(element_message(set, element)),
            NLM_F_CREATE,
            format!("add an element to {set}"),
        );
    }

    /// Removes every element of a set (which must exist).
    pub fn flush_set(&mut self, set: &str) {
        self.push(
            NfTablesMessage::DeleteSetElement(SetElementMessage {
                attributes: vec![
                    SetElementList::Table(TABLE.into()),
                    SetElementList::Set(set.into()),
                ],
            }),
            0,
            format!("flush set {set}"),
        );
    }

    /// Deletes a set (which must exist, and which no rule may use).
    pub fn delete_set(&mut self, set: &str) {
        self.push(
            NfTablesMessage::DeleteSet(SetMessage {
                attributes: vec![
                    SetAttribute::Table(self.table.name.into()),
                    SetAttribute::Name(set.into()),
                ],
            }),
            0,
            format!("delete set {set}"),
        );
    }

    /// Deletes a chain (which must exist, be empty, and be jumped to by nothing).
    pub fn delete_chain(&mut self, name: &str) {
        self.push(
            NfTablesMessage::DeleteChain(ChainMessage {
                attributes: vec![
                    ChainAttribute::Table(self.table.name.into()),
                    ChainAttribute::Name(name.into()),
                ],
            }),
            0,
            format!("delete chain {name}"),
        );
    }

    /// Deletes the table the batch is in (with whatever it still holds).
    pub fn delete_table(&mut self) {
        self.push(
            NfTablesMessage::DeleteTable(TableMessage {
                attributes: vec![TableAttribute::Name(self.table.name.into())],
            }),
            0,
            format!("delete table {}", self.table.name),
        );
    }

    /// Removes an element (which must exist).
    pub fn delete_element(&mut self, set: &str, key: &[u8]) {
        self.push(
            NfTablesMessage::DeleteSetElement(element_message(
                set,
                vec![SetElementAttribute::Key(DataAttribute::Value(key.to_vec()))],
            )),
            0,
            format!("remove an element from {set}"),
        );
    }
}

fn element_message(set: &str, element: Vec<SetElementAttribute>) -> SetElementMessage {
    SetElementMessage {
        attributes: vec![
            SetElementList::Table(TABLE.into()),
            SetElementList::Set(set.into()),
            SetElementList::Elements(vec![ListAttribute::Element(element)]),
        ],
    }
}

/// Puts an element in `batch` for `tag`, taking the key over from whoever held it.
pub(crate) fn claim(
    nft: &mut Nftables,
    batch: &mut Batch,
    set: &str,
    key: &[u8],
    value: Option<Vec<u8>>,
    tag: &AttachmentTag,
) -> Result<()> {
    if nft.element(set, key)?.is_some() {
        batch.delete_element(set, key);
    }
    batch.add_element(set, key, value, tag.as_str());
    Ok(())
}

/// Removes an element in `batch` if `tag` holds it; a missing one is fine.
pub(crate) fn release(
    nft: &mut Nftables,
    batch: &mut Batch,
    set: &str,
    key: &[u8],
    tag: &AttachmentTag,
) -> Result<()> {
    let owner = nft.element(set, key)?.and_then(|e| e.comment);
    if owner.as_deref() == Some(tag.as_str()) {
        batch.delete_element(set, key);
    }
    Ok(())
}

/// Removes in `batch` every element of `sets` whose comment is `stale`.
pub(crate) fn sweep(
    nft: &mut Nftables,
    batch: &mut Batch,
    sets: &[&str],
    stale: impl Fn(&str) -> bool,
) -> Result<()> {
    for set in sets {
        for e in nft.elements(set)? {
            if e.comment.as_deref().is_some_and(&stale) {
                batch.delete_element(set, &e.key);
            }
        }
    }
    Ok(())
}

/// Where an address goes among a pair of per-family sets `[IPv4, IPv6]`, and its key.
pub(crate) fn address_key(
    sets: [&'static str; 2],
    addr: std::net::IpAddr,
) -> (&'static str, Vec<u8>) {
    match addr {
        std::net::IpAddr::V4(a) => (sets[0], a.octets().to_vec()),
        std::net::IpAddr::V6(a) => (sets[1], a.octets().to_vec()),
    }
}

/// Removes, in one transaction, the elements `tag` holds for `addrs` in a pair of
/// per-family sets; without the addresses known it reads both sets.
pub(crate) fn release_addresses(
    nft: &mut Nftables,
    sets: [&'static str; 2],
    tag: &AttachmentTag,
    addrs: Option<&[std::net::IpAddr]>,
) -> Result<()> {
    let _lock = lock()?;
    let mut batch = Batch::new();
    match addrs {
        Some(addrs) => {
            for addr in addrs {
                let (set, key) = address_key(sets, *addr);
                release(nft, &mut batch, set, &key, tag)?;
            }
        }
        None => {
            sweep(nft, &mut batch, &sets, |c| c == tag.as_str())?;
        }
    }
    nft.commit(batch)
}

/// Removes in `batch` the elements of `sets` that belong to `network` and to none of
/// the attachments in `keep`.
pub(crate) fn collect_garbage(
    nft: &mut Nftables,
    batch: &mut Batch,
    sets: &[&str],
    network: &str,
    keep: &[AttachmentTag],
) -> Result<()> {
    let prefix = network_prefix(network);
    sweep(nft, batch, sets, |c| {
        c.starts_with(&prefix) && !keep.iter().any(|k| k.as_str() == c)
    })
}

/// The comments of every element of `sets` (for tests and diagnostics).
pub(crate) fn comments(nft: &mut Nftables, sets: &[&str]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for set in sets {
        out.extend(nft.elements(set)?.into_iter().filter_map(|e| e.comment));
    }
    Ok(out)
}

/// A netfilter netlink socket bound to the namespace it was opened in.
pub struct Nftables {
    channel: Channel,
    /// The receive and send buffers asked for so far, in bytes.
    buffers: (usize, usize),
}

/// What one acknowledgement takes of a socket's receive buffer: a small message in a
/// buffer of its own, as the kernel counts it (its true size).
const ACK_COST: usize = 1024;

/// The buffers a socket starts with (the kernel's usual default).
const SOCKET_BUFFER: usize = 212_992;

fn nft_err(op: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let op = op.into();
    move |source| Error::Nftables { op, source }
}

impl Nftables {
    /// Opens a socket in the calling thread's namespace.
    pub fn open() -> Result<Nftables> {
        let channel =
            Channel::open(NETLINK_NETFILTER).map_err(nft_err("open a netfilter netlink socket"))?;
        // Acknowledgements without a copy of the request: a batch gets one per message.
        channel
            .socket
            .set_cap_ack(true)
            .map_err(nft_err("ask for short acknowledgements"))?;
        Ok(Nftables {
            channel,
            buffers: (SOCKET_BUFFER, SOCKET_BUFFER),
        })
    }

    /// Makes room for a batch of `bytes` (sent in one message, which must fit the send
    /// buffer) and its `acks` acknowledgements (the kernel answers the whole batch inside
    /// the send, and what does not fit the receive buffer is lost, ENOBUFS).
    fn room_for(&mut self, bytes: usize, acks: usize) -> Result<()> {
        use rustix::net::sockopt;
        let fd = &self.channel.socket;
        // The FORCE options pass over net.core.[rw]mem_max (CAP_NET_ADMIN, which
        // nftables needs anyway).
        let receive = acks * ACK_COST + SOCKET_BUFFER;
        if receive > self.buffers.0 {
            sockopt::set_socket_recv_buffer_size_force(fd, receive)
                .or_else(|_| sockopt::set_socket_recv_buffer_size(fd, receive))
                .map_err(|e| nft_err("grow the receive buffer for a batch's answers")(e.into()))?;
            self.buffers.0 = receive;
        }
        let send = bytes + SOCKET_BUFFER;
        if send > self.buffers.1 {
            sockopt::set_socket_send_buffer_size_force(fd, send)
                .or_else(|_| sockopt::set_socket_send_buffer_size(fd, send))
                .map_err(|e| nft_err("grow the send buffer for a batch")(e.into()))?;
            self.buffers.1 = send;
        }
        Ok(())
    }

    /// Opens a socket inside `ns`; it keeps working there from any thread.
    pub fn open_in(ns: &Netns) -> Result<Nftables> {
        ns.run(Nftables::open)?
    }

    fn serialize(
        &mut self,
        inner: NetfilterMessageInner,
        flags: u16,
        family: NetfilterProtoFamily,
        out: &mut Vec<u8>,
    ) -> u32 {
        let seq = self.channel.next_seq();
        let res_id = match inner {
            NetfilterMessageInner::None(_) => NFNL_SUBSYS_NFTABLES,
            _ => 0,
        };
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(
            header,
            NetlinkPayload::InnerMessage(NetfilterMessage::new(
                NetfilterHeader::new(family, 0, res_id),
                inner,
            )),
        );
        packet.finalize();
        let start = out.len();
        out.resize(start + packet.buffer_len(), 0);
        packet.serialize(&mut out[start..]);
        seq
    }

    /// Commits a batch as one transaction; on failure nothing of it is applied and the
    /// error names the step the kernel refused.
    pub fn commit(&mut self, batch: Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut out = Vec::with_capacity(1024);
        let unspec = NetfilterProtoFamily::Unspec;
        let begin = self.serialize(ControlMessage::BatchBegin.into(), 0, unspec, &mut out);
        let mut steps = Vec::with_capacity(batch.messages.len());
        for (message, flags, what, family) in batch.messages {
            let seq = self.serialize(message.into(), flags | NLM_F_ACK, family, &mut out);
            steps.push((seq, what));
        }
        let end = self.serialize(ControlMessage::BatchEnd.into(), 0, unspec, &mut out);
        self.room_for(out.len(), steps.len() + 2)?;
        self.channel
            .socket
            .send(&out, 0)
            .map_err(nft_err("send an nftables batch"))?;
        // The kernel runs the batch inside sendmsg: every answer is queued by now.
        let mut acked = 0;
        let mut failure: Option<Error> = None;
        loop {
            self.channel.buf.clear();
            match self
                .channel
                .socket
                .recv(&mut self.channel.buf, libc::MSG_DONTWAIT)
            {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(nft_err("read the nftables answer")(e)),
            }
            for (seq, code) in parse_acks(&self.channel.buf) {
                if seq < begin || seq > end {
                    continue;
                }
                acked += 1;
                if let (Some(code), None) = (code, &failure) {
                    let what = steps
                        .iter()
                        .find(|(s, _)| *s == seq)
                        .map(|(_, w)| w.as_str())
                        .unwrap_or("begin the nftables transaction");
                    failure = Some(nft_err(what)(io::Error::from_raw_os_error(code)));
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None if acked < steps.len() => {
                Err(nft_err("commit an nftables batch")(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the kernel answered only in part",
                )))
            }
            None => Ok(()),
        }
    }

    fn request(
        &mut self,
        message: NfTablesMessage,
        flags: u16,
    ) -> io::Result<Vec<NfTablesMessage>> {
        self.request_in(NetfilterProtoFamily::Inet, message, flags)
    }

    fn request_in(
        &mut self,
        family: NetfilterProtoFamily,
        message: NfTablesMessage,
        flags: u16,
    ) -> io::Result<Vec<NfTablesMessage>> {
        let message = NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), message);
        Ok(self
            .channel
            .request(message, flags)?
            .into_iter()
            .filter_map(|m| match m.inner {
                NetfilterMessageInner::NfTables(m) => Some(m),
                _ => None,
            })
            .collect())
    }

    /// One element of a set by its key; none when the element, the set or the table is
    /// missing.
    pub fn element(&mut self, set: &str, key: &[u8]) -> Result<Option<Element>> {
        let message = NfTablesMessage::GetSetElement(element_message(
            set,
            vec![SetElementAttribute::Key(DataAttribute::Value(key.to_vec()))],
        ));
        match self.request(message, 0) {
            Ok(replies) => Ok(replies.iter().flat_map(elements_of).next()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(nft_err(format!("read an element of {set}"))(e)),
        }
    }

    /// Every element of a set; none when the set or the table is missing.
    pub fn elements(&mut self, set: &str) -> Result<Vec<Element>> {
        let message = NfTablesMessage::GetSetElement(SetElementMessage {
            attributes: vec![
                SetElementList::Table(TABLE.into()),
                SetElementList::Set(set.into()),
            ],
        });
        match self.request(message, NLM_F_DUMP) {
            Ok(replies) => Ok(replies.iter().flat_map(elements_of).collect()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Vec::new()),
            Err(e) => Err(nft_err(format!("list the elements of {set}"))(e)),
        }
    }

    /// True when corvid's table has the chain `name`.
    pub fn has_chain(&mut self, name: &str) -> Result<bool> {
        self.has_chain_in(TableRef::CORVID, name)
    }

    /// True when `table` exists and has the chain `name`.
    pub fn has_chain_in(&mut self, table: TableRef, name: &str) -> Result<bool> {
        let message = NfTablesMessage::GetChain(ChainMessage {
            attributes: vec![
                ChainAttribute::Table(table.name.into()),
                ChainAttribute::Name(name.into()),
            ],
        });
        match self.request_in(table.family, message, 0) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(nft_err(format!("look for chain {name}"))(e)),
        }
    }

    /// The (handle, comment) of every rule of `chain` in `table`; none when either is
    /// missing.
    pub fn rules(&mut self, table: TableRef, chain: &str) -> Result<Vec<(u64, Option<String>)>> {
        let message = NfTablesMessage::GetRule(RuleMessage {
            attributes: vec![
                RuleAttribute::Table(table.name.into()),
                RuleAttribute::Chain(chain.into()),
            ],
        });
        let replies = match self.request_in(table.family, message, NLM_F_DUMP) {
            Ok(r) => r,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Vec::new()),
            Err(e) => return Err(nft_err(format!("list the rules of {chain}"))(e)),
        };
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                NfTablesMessage::NewRule(r) => {
                    let in_chain = r
                        .attributes
                        .iter()
                        .any(|a| matches!(a, RuleAttribute::Chain(c) if c == chain));
                    let handle = r.attributes.iter().find_map(|a| match a {
                        RuleAttribute::Handle(h) => Some(*h),
                        _ => None,
                    })?;
                    let comment = r.attributes.iter().find_map(|a| match a {
                        RuleAttribute::UserData(u) => udata_comment(u),
                        _ => None,
                    });
                    in_chain.then_some((handle, comment))
                }
                _ => None,
            })
            .collect())
    }

    /// The names of the chains of corvid's table; none when the table is missing.
    pub fn chains(&mut self) -> Result<Vec<String>> {
        let message = NfTablesMessage::GetChain(ChainMessage {
            attributes: vec![ChainAttribute::Table(TABLE.into())],
        });
        self.names(message, "list chains", |m| match m {
            NfTablesMessage::NewChain(c) => {
                let ours = c
                    .attributes
                    .iter()
                    .any(|a| matches!(a, ChainAttribute::Table(t) if t == TABLE));
                c.attributes.into_iter().find_map(|a| match a {
                    ChainAttribute::Name(n) if ours => Some(n),
                    _ => None,
                })
            }
            _ => None,
        })
    }

    /// The forward base chains of other tables whose policy drops: iptables' rules can be
    /// given an accept for corvid's bridges, but a chain of another nftables table
    /// drops whatever corvid's own table accepts (an accept ends one chain only).
    /// iptables-nft's `filter` tables are left out: corvid writes its accepts there.
    pub fn forward_drops(&mut self) -> Result<Vec<ForwardDrop>> {
        let mut out = Vec::new();
        for (family, name) in [
            (NetfilterProtoFamily::Inet, "inet"),
            (NetfilterProtoFamily::IPv4, "ip"),
            (NetfilterProtoFamily::IPv6, "ip6"),
            (NetfilterProtoFamily::Bridge, "bridge"),
        ] {
            let message = NfTablesMessage::GetChain(ChainMessage { attributes: vec![] });
            let replies = match self.request_in(family, message, NLM_F_DUMP) {
                Ok(r) => r,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(nft_err("list chains")(e)),
            };
            for reply in replies {
                let NfTablesMessage::NewChain(c) = reply else {
                    continue;
                };
                let (mut table, mut chain, mut forward, mut drops) =
                    (String::new(), String::new(), false, false);
                for a in c.attributes {
                    match a {
                        ChainAttribute::Table(t) => table = t,
                        ChainAttribute::Name(n) => chain = n,
                        ChainAttribute::Policy(p) => drops = p == NF_DROP,
                        ChainAttribute::Hook(hooks) => forward = hooks.iter().any(
                            |h| matches!(h, Hook::Number(n) if u32::from(*n) == NF_INET_FORWARD),
                        ),
                        _ => {}
                    }
                }
                let ours = (name == "inet" && table == TABLE)
                    || (matches!(name, "ip" | "ip6") && table == "filter");
                if forward && drops && !ours {
                    out.push(ForwardDrop {
                        family: name,
                        table,
                        chain,
                    });
                }
            }
        }
        Ok(out)
    }

    /// What `pick` finds in each answer to a dump; none when the table is missing.
    fn names(
        &mut self,
        message: NfTablesMessage,
        what: &str,
        pick: impl Fn(NfTablesMessage) -> Option<String>,
    ) -> Result<Vec<String>> {
        match self.request(message, NLM_F_DUMP) {
            Ok(replies) => Ok(replies.into_iter().filter_map(pick).collect()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Vec::new()),
            Err(e) => Err(nft_err(what)(e)),
        }
    }

    /// True when corvid's table has the set `name`.
    pub fn has_set(&mut self, name: &str) -> Result<bool> {
        let message = NfTablesMessage::GetSet(SetMessage {
            attributes: vec![
                SetAttribute::Table(TABLE.into()),
                SetAttribute::Name(name.into()),
            ],
        });
        match self.request(message, 0) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(nft_err(format!("look for set {name}"))(e)),
        }
    }

    /// The names of the sets of corvid's table; none when the table is missing.
    pub fn sets(&mut self) -> Result<Vec<String>> {
        let message = NfTablesMessage::GetSet(SetMessage {
            attributes: vec![SetAttribute::Table(TABLE.into())],
        });
        self.names(message, "list sets", |m| match m {
            NfTablesMessage::NewSet(s) => {
                let ours = s
                    .attributes
                    .iter()
                    .any(|a| matches!(a, SetAttribute::Table(t) if t == TABLE));
                s.attributes.into_iter().find_map(|a| match a {
                    SetAttribute::Name(n) if ours => Some(n),
                    _ => None,
                })
            }
            _ => None,
        })
    }
}

/// (sequence, errno) of each acknowledgement or error in a buffer of answers.
fn parse_acks(buf: &[u8]) -> Vec<(u32, Option<i32>)> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset + 16 <= buf.len() {
        let header = &buf[offset..];
        let len = u32::from_ne_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(header[4..6].try_into().expect("2 bytes"));
        let seq = u32::from_ne_bytes(header[8..12].try_into().expect("4 bytes"));
        if len < 16 || offset + len > buf.len() {
            break;
        }
        // NLMSG_ERROR carries the errno (0 for an acknowledgement) after the header.
        if kind == 2 && len >= 20 {
            let code = i32::from_ne_bytes(header[16..20].try_into().expect("4 bytes"));
            out.push((seq, (code != 0).then_some(-code)));
        }
        offset += (len + 3) & !3;
    }
    out
}

fn elements_of(message: &NfTablesMessage) -> Vec<Element> {
    let NfTablesMessage::NewSetElement(m) = message else {
        return Vec::new();
    };
    m.attributes
        .iter()
        .filter_map(|a| match a {
            SetElementList::Elements(list) => Some(list),
            _ => None,
        })
        .flatten()
        .filter_map(|e| match e {
            ListAttribute::Element(attrs) => {
                let key = attrs.iter().find_map(|a| match a {
                    SetElementAttribute::Key(DataAttribute::Value(k)) => Some(k.clone()),
                    _ => None,
                })?;
                let comment = attrs.iter().find_map(|a| match a {
                    SetElementAttribute::UserData(u) => udata_comment(u),
                    _ => None,
                });
                Some(Element { key, comment })
            }
            _ => None,
        })
        .collect()
}

/// One attribute of an expression the netfilter crate has no type for.
pub(crate) fn nla(kind: u16, value: impl Into<Vec<u8>>) -> DefaultNla {
    DefaultNla::new(kind, value.into())
}

#[cfg(test)]
mod tests {
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
