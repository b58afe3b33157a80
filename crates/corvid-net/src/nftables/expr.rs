//! The expressions corvid's rules are made of, each a small builder over
//! netlink-packet-netfilter's types; the kinds that crate has no type for (masq, nat, ct,
//! fib, the xtables match) are written here from `nf_tables.h`, every number big-endian
//! as the kernel reads attributes.

use super::{addr_bytes, nla};
use ipnet::IpNet;
use netlink_packet_netfilter::nftables::{
    Bitwise, Cmp, DataAttribute, Expressions, Immediate, Lookup, Meta, MetaKey, Operator, Payload,
    Register, Verdict as NfVerdict, VerdictAttribute,
};

pub use netlink_packet_netfilter::nftables::Register as Reg;

/// What a rule does with a packet that matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Let it through this hook.
    Accept,
    /// Throw it away.
    Drop,
    /// Into a chain, coming back after it.
    Jump(&'a str),
}

impl Verdict<'_> {
    /// The netlink form of the verdict.
    pub(crate) fn attributes(self) -> Vec<VerdictAttribute> {
        let (code, chain) = match self {
            Verdict::Accept => (NfVerdict::Other(1), None),
            Verdict::Drop => (NfVerdict::Other(0), None),
            Verdict::Jump(c) => (NfVerdict::Jump, Some(c)),
        };
        let mut attrs = vec![VerdictAttribute::Code(code)];
        attrs.extend(chain.map(|c| VerdictAttribute::Chain(c.into())));
        attrs
    }
}

/// A header field a rule matches on or loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The IP source address.
    SrcAddr,
    /// The IP destination address.
    DstAddr,
    /// The TCP, UDP or SCTP source port.
    SrcPort,
    /// The TCP, UDP or SCTP destination port.
    DstPort,
}

const PAYLOAD_NETWORK: u32 = 1;
const PAYLOAD_TRANSPORT: u32 = 2;

/// Loads a field of an IPv4 (`v6` false) or IPv6 packet into `reg`.
pub fn load(field: Field, v6: bool, reg: Register) -> Expressions {
    let (base, offset, len) = match (field, v6) {
        (Field::SrcAddr, false) => (PAYLOAD_NETWORK, 12, 4),
        (Field::DstAddr, false) => (PAYLOAD_NETWORK, 16, 4),
        (Field::SrcAddr, true) => (PAYLOAD_NETWORK, 8, 16),
        (Field::DstAddr, true) => (PAYLOAD_NETWORK, 24, 16),
        (Field::SrcPort, _) => (PAYLOAD_TRANSPORT, 0, 2),
        (Field::DstPort, _) => (PAYLOAD_TRANSPORT, 2, 2),
    };
    Expressions::Payload(vec![
        Payload::DestinationRegister(reg),
        Payload::Base(base),
        Payload::Offset(offset),
        Payload::Len(len),
    ])
}

fn meta(key: MetaKey, reg: Register) -> Expressions {
    Expressions::Meta(vec![Meta::DestinationRegister(reg), Meta::Key(key)])
}

/// Compares `reg` with `bytes`.
pub fn cmp(reg: Register, equal: bool, bytes: &[u8]) -> Expressions {
    Expressions::Cmp(vec![
        Cmp::SourceRegister(reg),
        Cmp::Op(if equal {
            Operator::Equal
        } else {
            Operator::NotEqual
        }),
        Cmp::Data(DataAttribute::Value(bytes.to_vec())),
    ])
}

/// The packet is IPv4 (`v6` false) or IPv6: needed before loading an address in an inet
/// table.
pub fn nfproto(v6: bool) -> Vec<Expressions> {
    vec![
        meta(MetaKey::Nfproto, Register::Reg1),
        cmp(Register::Reg1, true, &[if v6 { 10 } else { 2 }]),
    ]
}

/// Loads the transport protocol number into `reg`.
pub fn load_l4proto(reg: Register) -> Expressions {
    meta(MetaKey::Other(16), reg)
}

/// The 32-bit register `n` (0 to 15), for keys made of several fields.
pub fn reg32(n: u32) -> Register {
    use Register::*;
    [
        Reg32_00, Reg32_01, Reg32_02, Reg32_03, Reg32_04, Reg32_05, Reg32_06, Reg32_07, Reg32_08,
        Reg32_09, Reg32_10, Reg32_11, Reg32_12, Reg32_13, Reg32_14, Reg32_15,
    ][n as usize]
}

/// An interface name as nftables compares it: 16 bytes, zero-padded.
pub fn ifname_bytes(name: &str) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    let n = name.len().min(15);
    bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
    bytes
}

/// Loads the input (`input` true) or output interface's name into `reg`.
pub fn load_ifname(input: bool, reg: Register) -> Expressions {
    meta(pick(input, MetaKey::Iifname, MetaKey::Oifname), reg)
}

/// The input side's key or the output side's.
fn pick(input: bool, inward: MetaKey, outward: MetaKey) -> MetaKey {
    if input {
        inward
    } else {
        outward
    }
}

/// Loads the input (`input` true) or output interface's group into `reg`.
pub fn load_ifgroup(input: bool, reg: Register) -> Expressions {
    meta(pick(input, MetaKey::Iifgroup, MetaKey::Oifgroup), reg)
}

/// The input (`input` true) or output interface's name starts (`equal` false: does not
/// start) with `prefix`, as nft's `iifname "cvb*"`.
pub fn ifname_prefix(input: bool, prefix: &str, equal: bool) -> Vec<Expressions> {
    vec![
        load_ifname(input, Register::Reg1),
        cmp(Register::Reg1, equal, prefix.as_bytes()),
    ]
}

/// `reg = (reg & mask) ^ xor` over the first `mask.len()` bytes.
fn bitwise(reg: Register, mask: Vec<u8>, xor: Vec<u8>) -> Expressions {
    Expressions::Bitwise(vec![
        Bitwise::SourceRegister(reg),
        Bitwise::DestinationRegister(reg),
        Bitwise::Length(mask.len() as u32),
        Bitwise::Mask(DataAttribute::Value(mask)),
        Bitwise::Xor(DataAttribute::Value(xor)),
    ])
}

/// The address `field` is (or with `equal` false, is not) inside `net`.
pub fn in_prefix(field: Field, net: IpNet, equal: bool) -> Vec<Expressions> {
    let v6 = matches!(net, IpNet::V6(_));
    let mut out = vec![load(field, v6, Register::Reg1)];
    let full = if v6 { 128 } else { 32 };
    if net.prefix_len() < full {
        let len = if v6 { 16 } else { 4 };
        out.push(bitwise(
            Register::Reg1,
            addr_bytes(net.netmask()),
            vec![0; len],
        ));
    }
    out.push(cmp(Register::Reg1, equal, &addr_bytes(net.network())));
    out
}

/// The contents of `reg` are (or, `found` false, are not) a key of `set`.
pub fn lookup(set: &str, reg: Register, found: bool) -> Expressions {
    let mut attrs = vec![Lookup::Set(set.into()), Lookup::SourceRegister(reg)];
    if !found {
        attrs.push(Lookup::Flags(1));
    }
    Expressions::Lookup(attrs)
}

/// Looks `sreg` up in the map `set` and puts the value in `dreg`; no match ends the
/// rule.
pub fn map(set: &str, sreg: Register, dreg: Register) -> Expressions {
    Expressions::Lookup(vec![
        Lookup::Set(set.into()),
        Lookup::SourceRegister(sreg),
        Lookup::DestinationRegister(dreg),
    ])
}

/// Looks `sreg` up in the verdict map `set` and does what the element says; no match
/// goes on to the next rule.
pub fn vmap(set: &str, sreg: Register) -> Expressions {
    map(set, sreg, Register::Verdict)
}

/// The rule's verdict.
pub fn verdict(v: Verdict) -> Expressions {
    Expressions::Immediate(vec![
        Immediate::DestinationRegister(Register::Verdict),
        Immediate::Data(DataAttribute::Verdict(v.attributes())),
    ])
}

fn be32(v: u32) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

fn reg_bytes(r: Register) -> Vec<u8> {
    be32(u32::from(r))
}

fn other(name: &str, attributes: Vec<netlink_packet_core::DefaultNla>) -> Expressions {
    Expressions::Other {
        expression_type: name.into(),
        attributes,
    }
}

/// Source NAT to the outgoing interface's address.
pub fn masquerade() -> Expressions {
    other("masq", Vec::new())
}

/// Rewrites the destination to the address in `addr` (and the port in `port`).
pub fn dnat(v6: bool, addr: Register, port: Option<Register>) -> Expressions {
    nat(1, v6, addr, port)
}

fn nat(kind: u32, v6: bool, addr: Register, port: Option<Register>) -> Expressions {
    let mut attrs = vec![
        nla(1, be32(kind)),
        nla(2, be32(if v6 { 10 } else { 2 })),
        nla(3, reg_bytes(addr)),
    ];
    if let Some(p) = port {
        attrs.push(nla(5, reg_bytes(p)));
    }
    other("nat", attrs)
}

/// Connection tracking states (`ct state`), as the kernel's bits.
pub mod ct {
    /// `established`
    pub const ESTABLISHED: u32 = 2;
    /// `related`
    pub const RELATED: u32 = 4;
    /// `new`
    pub const NEW: u32 = 8;
}

/// Connection tracking status bits (`ct status`).
pub mod ct_status {
    /// The connection's destination was translated (`dnat`).
    pub const DNAT: u32 = 0x20;
}

/// The connection's state is one of `states` (bits of [`ct`]).
pub fn ct_state(states: u32) -> Vec<Expressions> {
    ct_bits(0, states)
}

/// The connection's status has one of `bits` (of [`ct_status`]).
pub fn ct_status(bits: u32) -> Vec<Expressions> {
    ct_bits(2, bits)
}

fn ct_bits(key: u32, states: u32) -> Vec<Expressions> {
    vec![
        other(
            "ct",
            vec![nla(1, reg_bytes(Register::Reg1)), nla(2, be32(key))],
        ),
        bitwise(Register::Reg1, states.to_ne_bytes().to_vec(), vec![0; 4]),
        cmp(Register::Reg1, false, &[0; 4]),
    ]
}

/// The connection is established or related, as iptables' `-m conntrack --ctstate
/// RELATED,ESTABLISHED` writes it: an xtables match through nft_compat, so that a rule in
/// a table iptables-nft manages stays readable by iptables.
pub fn xt_established() -> Expressions {
    // struct xt_conntrack_mtinfo3, padded to 8 bytes: match_flags XT_CONNTRACK_STATE at
    // 146, state_mask (ESTABLISHED 1 << 1 | RELATED 1 << 2) at 150.
    let mut info = vec![0u8; 168];
    info[146..148].copy_from_slice(&1u16.to_ne_bytes());
    info[150..152].copy_from_slice(&6u16.to_ne_bytes());
    other(
        "match",
        vec![
            nla(1, b"conntrack\0".to_vec()),
            nla(2, be32(3)),
            nla(3, info),
        ],
    )
}

/// The destination address is one of this host's (`fib daddr type local`).
pub fn daddr_local() -> Vec<Expressions> {
    // flag daddr (2)
    addr_local(2)
}

/// The source address is one of this host's (`fib saddr type local`): the host sent it.
pub fn saddr_local() -> Vec<Expressions> {
    // flag saddr (1)
    addr_local(1)
}

fn addr_local(flag: u32) -> Vec<Expressions> {
    vec![
        // result addrtype (3)
        other(
            "fib",
            vec![
                nla(1, reg_bytes(Register::Reg1)),
                nla(2, be32(3)),
                nla(3, be32(flag)),
            ],
        ),
        cmp(Register::Reg1, true, &2u32.to_ne_bytes()),
    ]
}

/// Puts `bytes` in `reg`.
pub fn immediate(reg: Register, bytes: &[u8]) -> Expressions {
    Expressions::Immediate(vec![
        Immediate::DestinationRegister(reg),
        Immediate::Data(DataAttribute::Value(bytes.to_vec())),
    ])
}

/// A random number from 0 to `modulus - 1` in `reg` (`numgen random mod N`).
pub fn random(reg: Register, modulus: u32) -> Expressions {
    // NFTA_NG_DREG, NFTA_NG_MODULUS, NFTA_NG_TYPE (NFT_NG_RANDOM)
    other(
        "numgen",
        vec![
            nla(1, reg_bytes(reg)),
            nla(2, be32(modulus)),
            nla(3, be32(1)),
        ],
    )
}

/// Refuses the packet: a TCP reset for TCP (`tcp` true), else an ICMP or ICMPv6 port
/// unreachable, whichever the packet's family calls for.
pub fn reject(tcp: bool) -> Expressions {
    // NFTA_REJECT_TYPE: NFT_REJECT_TCP_RST 1, NFT_REJECT_ICMPX_UNREACH 2;
    // NFTA_REJECT_ICMP_CODE: NFT_REJECT_ICMPX_PORT_UNREACH 1.
    let attrs = if tcp {
        vec![nla(1, be32(1))]
    } else {
        vec![nla(1, be32(2)), nla(2, vec![1])]
    };
    other("reject", attrs)
}

/// The packet is TCP.
pub fn is_tcp() -> Vec<Expressions> {
    vec![
        load_l4proto(Register::Reg1),
        cmp(Register::Reg1, true, &[6]),
    ]
}

/// The packet's mark has `bit` set.
pub fn has_mark(bit: u32) -> Vec<Expressions> {
    mark_test(bit, true)
}

/// The packet's mark has `bit` set (`set`) or clear.
pub fn mark_test(bit: u32, set: bool) -> Vec<Expressions> {
    vec![
        meta(MetaKey::Mark, Register::Reg1),
        bitwise(Register::Reg1, bit.to_ne_bytes().to_vec(), vec![0; 4]),
        cmp(Register::Reg1, !set, &[0; 4]),
    ]
}

/// Sets `bit` in the packet's mark, keeping the others (`meta mark set mark | bit`).
pub fn set_mark(bit: u32) -> Vec<Expressions> {
    vec![
        meta(MetaKey::Mark, Register::Reg1),
        bitwise(
            Register::Reg1,
            (!bit).to_ne_bytes().to_vec(),
            bit.to_ne_bytes().to_vec(),
        ),
        Expressions::Meta(vec![
            Meta::Key(MetaKey::Mark),
            Meta::SourceRegister(Register::Reg1),
        ]),
    ]
}

/// Rewrites the source to the address in `addr`.
pub fn snat(v6: bool, addr: Register) -> Expressions {
    nat(0, v6, addr, None)
}

/// Adds or refreshes, in the set `set` with timeouts, the key in `key`
/// (`update @set { key }`).
pub fn update_set(set: &str, key: Register) -> Expressions {
    // NFTA_DYNSET_SET_NAME 1, _OP 3 (NFT_DYNSET_OP_UPDATE 1), _SREG_KEY 4
    other(
        "dynset",
        vec![
            nla(1, {
                let mut name = set.as_bytes().to_vec();
                name.push(0);
                name
            }),
            nla(3, be32(1)),
            nla(4, reg_bytes(key)),
        ],
    )
}

const PAYLOAD_LINK: u32 = 0;

/// The input interface is Ethernet (`meta iiftype ether`): the dependency nft wants
/// before it prints a link-layer load in an inet table as `ether saddr`.
pub fn iif_ethernet() -> Vec<Expressions> {
    // NFT_META_IIFTYPE, ARPHRD_ETHER
    vec![
        meta(MetaKey::Other(8), Register::Reg1),
        cmp(Register::Reg1, true, &1u16.to_ne_bytes()),
    ]
}

/// Loads the Ethernet source (`src` true) or destination address into `reg`.
pub fn load_ether(src: bool, reg: Register) -> Expressions {
    payload(PAYLOAD_LINK, if src { 6 } else { 0 }, 6, reg)
}

fn payload(base: u32, offset: u32, len: u32, reg: Register) -> Expressions {
    Expressions::Payload(vec![
        Payload::DestinationRegister(reg),
        Payload::Base(base),
        Payload::Offset(offset),
        Payload::Len(len),
    ])
}

/// The frame carries `ethertype` (`meta protocol`, as the bridge family reads it).
pub fn ethertype(ethertype: u16) -> Vec<Expressions> {
    vec![
        meta(MetaKey::EtherTypeProtocol, Register::Reg1),
        cmp(Register::Reg1, true, &ethertype.to_be_bytes()),
    ]
}

/// IPv4's, IPv6's and ARP's Ethernet types.
pub mod ethertypes {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// ARP.
    pub const ARP: u16 = 0x0806;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
}

/// The frame's Ethernet source is `mac` (or with `equal` false, is not).
pub fn ether_source(mac: [u8; 6], equal: bool) -> Vec<Expressions> {
    vec![
        load_ether(true, Register::Reg1),
        cmp(Register::Reg1, equal, &mac),
    ]
}

/// An ARP packet's sender address (Ethernet over IPv4) is inside `net`.
pub fn arp_sender_in(net: IpNet) -> Vec<Expressions> {
    let mut out = vec![payload(PAYLOAD_NETWORK, 14, 4, Register::Reg1)];
    if net.prefix_len() < 32 {
        out.push(bitwise(
            Register::Reg1,
            addr_bytes(net.netmask()),
            vec![0; 4],
        ));
    }
    out.push(cmp(Register::Reg1, true, &addr_bytes(net.network())));
    out
}

/// The transport protocol is `proto`.
pub fn l4proto(proto: u8) -> Vec<Expressions> {
    vec![
        load_l4proto(Register::Reg1),
        cmp(Register::Reg1, true, &[proto]),
    ]
}

/// The destination port (TCP, UDP, SCTP) is from `min` to `max`.
pub fn dport_range(min: u16, max: u16) -> Vec<Expressions> {
    let mut out = vec![load(Field::DstPort, false, Register::Reg1)];
    if min == max {
        out.push(cmp(Register::Reg1, true, &min.to_be_bytes()));
    } else {
        out.push(cmp_op(
            Register::Reg1,
            Operator::GreatherThanEqual,
            &min.to_be_bytes(),
        ));
        out.push(cmp_op(
            Register::Reg1,
            Operator::LessThanEqual,
            &max.to_be_bytes(),
        ));
    }
    out
}

/// An ICMP or ICMPv6 message of `kind`, and of `code` when given.
pub fn icmp(kind: u8, code: Option<u8>) -> Vec<Expressions> {
    let mut out = vec![
        payload(PAYLOAD_TRANSPORT, 0, 1, Register::Reg1),
        cmp(Register::Reg1, true, &[kind]),
    ];
    if let Some(code) = code {
        out.push(payload(PAYLOAD_TRANSPORT, 1, 1, Register::Reg1));
        out.push(cmp(Register::Reg1, true, &[code]));
    }
    out
}

fn cmp_op(reg: Register, op: Operator, bytes: &[u8]) -> Expressions {
    Expressions::Cmp(vec![
        Cmp::SourceRegister(reg),
        Cmp::Op(op),
        Cmp::Data(DataAttribute::Value(bytes.to_vec())),
    ])
}
