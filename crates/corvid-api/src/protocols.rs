//! IP protocols as Neutron's security group rules name them: names and numbers, and
//! which protocols take ports, ICMP types or IPv6 only. The controller validates rules
//! with them and the agent turns rules into filters with them.

/// Neutron's IP protocol names and numbers, in its order (`IP_PROTOCOL_MAP`), which its
/// error message lists.
pub const PROTOCOLS: [(&str, u8); 25] = [
    ("ah", 51),
    ("dccp", 33),
    ("egp", 8),
    ("esp", 50),
    ("gre", 47),
    ("hopopt", 0),
    ("icmp", 1),
    ("igmp", 2),
    ("ip", 0),
    ("ipip", 4),
    ("ipv6-encap", 41),
    ("ipv6-frag", 44),
    ("ipv6-icmp", 58),
    ("icmpv6", 58),
    ("ipv6-nonxt", 59),
    ("ipv6-opts", 60),
    ("ipv6-route", 43),
    ("ospf", 89),
    ("pgm", 113),
    ("rsvp", 46),
    ("sctp", 132),
    ("tcp", 6),
    ("udp", 17),
    ("udplite", 136),
    ("vrrp", 112),
];

/// The protocols whose rules take a port range: DCCP, SCTP, TCP, UDP, UDP-Lite.
pub const PORT_PROTOCOLS: [u8; 5] = [33, 132, 6, 17, 136];

/// ICMP and IPv6-ICMP, whose rules take a type and a code in the port range.
pub const ICMP_PROTOCOLS: [u8; 2] = [1, 58];

/// Protocols of IPv6 only, which an IPv4 rule cannot name.
pub const IPV6_PROTOCOLS: [u8; 6] = [41, 44, 58, 59, 60, 43];

/// The number of a protocol name or number, as a rule stores it.
pub fn number(p: &str) -> Option<u8> {
    PROTOCOLS
        .iter()
        .find(|(name, _)| *name == p)
        .map(|(_, n)| *n)
        .or_else(|| p.parse().ok())
}
