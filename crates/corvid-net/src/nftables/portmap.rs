//! Port mappings (the portmap plugin) in corvid's table: one map element per mapping,
//! looked up by a fixed set of rules, so that a host with many published ports costs
//! what a host with one does.
//!
//! ```text
//! map hostports4 { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service }
//! map ports4     { type inet_proto . inet_service : ipv4_addr . inet_service }
//! set hairpin4   { type ipv4_addr . ipv4_addr }              (and the same three for IPv6)
//! chain portmap-prerouting, portmap-output { type nat hook ... priority dstnat
//!     dnat ip to ip daddr . meta l4proto . th dport map @hostports4
//!     fib daddr type local dnat ip to meta l4proto . th dport map @ports4 ... }
//! chain portmap-postrouting { type nat hook postrouting priority srcnat
//!     ip saddr . ip daddr @hairpin4 masquerade          (a container through its own port)
//!     ip saddr 127.0.0.0/8 ct status dnat masquerade     (the host's localhost) }
//! ```
//!
//! Each element carries the attachment's tag, so DEL, CHECK and GC find their own.

use super::expr::{self, reg32, Field};
use super::{
    addr_bytes, claim, collect_garbage, comments, lock, padded, release, sweep, target,
    AttachmentTag, BaseChain, Batch, ChainType, DataType, HookPoint, Nftables, SetSpec,
};
use crate::Result;
use ipnet::IpNet;
use std::net::IpAddr;

/// A transport protocol a port can be mapped for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }
}

/// One published port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortMapping {
    /// The protocol.
    pub protocol: Protocol,
    /// The port on the host.
    pub host_port: u16,
    /// The port in the container.
    pub container_port: u16,
    /// The host address it is published on; none means every local address.
    pub host_ip: Option<IpAddr>,
}

const PREROUTING: &str = "portmap-prerouting";
const OUTPUT: &str = "portmap-output";
const POSTROUTING: &str = "portmap-postrouting";

const ALL_MAPS: [&str; 6] = [
    "hostports4",
    "ports4",
    "hairpin4",
    "hostports6",
    "ports6",
    "hairpin6",
];

fn maps(v6: bool) -> [&'static str; 3] {
    if v6 {
        ["hostports6", "ports6", "hairpin6"]
    } else {
        ["hostports4", "ports4", "hairpin4"]
    }
}

/// The map and key a mapping is found by, for containers of one family.
fn key(m: &PortMapping, v6: bool) -> (&'static str, Vec<u8>) {
    let [host, any, _] = maps(v6);
    let mut k = Vec::new();
    if let Some(ip) = m.host_ip {
        k.extend(addr_bytes(ip));
    }
    k.extend(padded(&[m.protocol.number()]));
    k.extend(padded(&m.host_port.to_be_bytes()));
    (if m.host_ip.is_some() { host } else { any }, k)
}

fn hairpin_key(addr: IpAddr) -> (&'static str, Vec<u8>) {
    let v6 = addr.is_ipv6();
    let mut k = addr_bytes(addr);
    k.extend(addr_bytes(addr));
    (maps(v6)[2], k)
}

/// The DNAT rules of one family, the same in prerouting and output.
fn dnat_rules(batch: &mut Batch, chain: &str, v6: bool) {
    let [host, any, _] = maps(v6);
    // Registers: an IPv4 address takes one, an IPv6 address four.
    let width = if v6 { 4 } else { 1 };
    let mut by_host = expr::nfproto(v6);
    by_host.extend([
        expr::load(Field::DstAddr, v6, reg32(0)),
        expr::load_l4proto(reg32(width)),
        expr::load(Field::DstPort, v6, reg32(width + 1)),
        expr::map(host, reg32(0), reg32(0)),
        expr::dnat(v6, reg32(0), Some(reg32(width))),
    ]);
    batch.add_rule(chain, by_host, None);
    let mut by_port = expr::nfproto(v6);
    by_port.extend(expr::daddr_local());
    by_port.extend([
        expr::load_l4proto(reg32(0)),
        expr::load(Field::DstPort, v6, reg32(1)),
        expr::map(any, reg32(0), reg32(0)),
        expr::dnat(v6, reg32(0), Some(reg32(width))),
    ]);
    batch.add_rule(chain, by_port, None);
}

/// The maps, the three chains and their rules, made together.
fn skeleton(batch: &mut Batch) {
    batch.add_table();
    for v6 in [false, true] {
        let [host, any, hairpin] = maps(v6);
        let addr = DataType::addr(v6);
        let to = Some(DataType::concat(&[addr, DataType::INET_SERVICE]));
        let port = [DataType::INET_PROTO, DataType::INET_SERVICE];
        for (name, key, data) in [
            (host, DataType::concat(&[addr, port[0], port[1]]), to),
            (any, DataType::concat(&port), to),
            (hairpin, DataType::concat(&[addr, addr]), None),
        ] {
            batch.add_set(&SetSpec::new(name, key, data));
        }
    }
    let dstnat = |hook| BaseChain {
        kind: ChainType::Nat,
        hook,
        priority: -100,
    };
    batch.add_chain(PREROUTING, Some(dstnat(HookPoint::Prerouting)));
    batch.add_chain(OUTPUT, Some(dstnat(HookPoint::Output)));
    batch.add_chain(
        POSTROUTING,
        Some(BaseChain {
            kind: ChainType::Nat,
            hook: HookPoint::Postrouting,
            priority: 100,
        }),
    );
    for v6 in [false, true] {
        dnat_rules(batch, PREROUTING, v6);
        dnat_rules(batch, OUTPUT, v6);
        let second = if v6 { 4 } else { 1 };
        let mut hairpin = expr::nfproto(v6);
        hairpin.extend([
            expr::load(Field::SrcAddr, v6, reg32(0)),
            expr::load(Field::DstAddr, v6, reg32(second)),
            expr::lookup(maps(v6)[2], reg32(0), true),
            expr::masquerade(),
        ]);
        batch.add_rule(POSTROUTING, hairpin, None);
    }
    let mut localhost = expr::nfproto(false);
    localhost.extend(expr::in_prefix(
        Field::SrcAddr,
        "127.0.0.0/8".parse::<IpNet>().expect("valid prefix"),
        true,
    ));
    localhost.extend(expr::ct_status(expr::ct_status::DNAT));
    localhost.push(expr::masquerade());
    batch.add_rule(POSTROUTING, localhost, None);
}

/// The container's first address of each family: where its mappings lead.
fn first_of_each(addrs: &[IpAddr]) -> Vec<IpAddr> {
    let v4 = addrs.iter().find(|a| a.is_ipv4());
    let v6 = addrs.iter().find(|a| a.is_ipv6());
    v4.into_iter().chain(v6).copied().collect()
}

/// One element an attachment's mappings make: the map, the key, the value (none in the
/// hairpin sets).
type Entry = (&'static str, Vec<u8>, Option<Vec<u8>>);

/// Every element an attachment's mappings make.
fn elements(addrs: &[IpAddr], mappings: &[PortMapping], hairpin: bool) -> Vec<Entry> {
    let mut out = Vec::new();
    for addr in first_of_each(addrs) {
        let v6 = addr.is_ipv6();
        for m in mappings {
            if m.host_ip.is_some_and(|ip| ip.is_ipv6() != v6) {
                continue;
            }
            let (map, k) = key(m, v6);
            out.push((map, k, Some(target(addr, m.container_port))));
        }
        if hairpin && !mappings.is_empty() {
            let (set, k) = hairpin_key(addr);
            out.push((set, k, None));
        }
    }
    out
}

/// Publishes `mappings` to the container at `addrs` (its first address of each family);
/// `snat` adds the masquerade that hairpin traffic needs. A host port another attachment
/// held is taken over. Adds elements only, once the chains exist.
pub fn add_port_mappings(
    nft: &mut Nftables,
    tag: &AttachmentTag,
    addrs: &[IpAddr],
    mappings: &[PortMapping],
    snat: bool,
) -> Result<()> {
    let _lock = lock()?;
    let mut batch = Batch::new();
    if !nft.has_chain(PREROUTING)? {
        skeleton(&mut batch);
    }
    for (map, k, value) in elements(addrs, mappings, snat) {
        claim(nft, &mut batch, map, &k, value, tag)?;
    }
    nft.commit(batch)
}

/// The mappings of an attachment that are not in place (for CHECK): each as its map
/// and host port.
pub fn missing_port_mappings(
    nft: &mut Nftables,
    tag: &AttachmentTag,
    addrs: &[IpAddr],
    mappings: &[PortMapping],
) -> Result<Vec<String>> {
    let mut missing = Vec::new();
    for (map, k, _) in elements(addrs, mappings, false) {
        let found = nft.element(map, &k)?;
        if found.and_then(|e| e.comment).as_deref() != Some(tag.as_str()) {
            let port = u16::from_be_bytes([k[k.len() - 4], k[k.len() - 3]]);
            missing.push(format!("{map} port {port}"));
        }
    }
    Ok(missing)
}

/// Removes an attachment's mappings; none left is fine. With its mappings and
/// addresses known this looks at those keys only; without, it reads every map.
/// See `masquerade::delete_masquerade` on when to close `nft`.
pub fn delete_port_mappings(
    nft: &mut Nftables,
    tag: &AttachmentTag,
    known: Option<(&[IpAddr], &[PortMapping])>,
) -> Result<()> {
    let _lock = lock()?;
    let mut batch = Batch::new();
    match known {
        Some((addrs, mappings)) => {
            for (map, k, _) in elements(addrs, mappings, true) {
                release(nft, &mut batch, map, &k, tag)?;
            }
        }
        None => {
            sweep(nft, &mut batch, &ALL_MAPS, |c| c == tag.as_str())?;
        }
    }
    nft.commit(batch)
}

/// Removes the mappings of `network` whose attachment is not in `keep`.
pub fn gc_port_mappings(nft: &mut Nftables, network: &str, keep: &[AttachmentTag]) -> Result<()> {
    let _lock = lock()?;
    let mut batch = Batch::new();
    collect_garbage(nft, &mut batch, &ALL_MAPS, network, keep)?;
    nft.commit(batch)
}

/// The tags of every mapping element (for tests and diagnostics).
pub fn port_mapping_tags(nft: &mut Nftables) -> Result<Vec<String>> {
    comments(nft, &ALL_MAPS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_pad_each_field_to_a_register() {
        let m = PortMapping {
            protocol: Protocol::Udp,
            host_port: 8080,
            container_port: 80,
            host_ip: None,
        };
        assert_eq!(
            key(&m, false),
            ("ports4", vec![17, 0, 0, 0, 0x1f, 0x90, 0, 0])
        );
        let on: IpAddr = "192.0.2.1".parse().unwrap();
        let (map, k) = key(
            &PortMapping {
                host_ip: Some(on),
                ..m
            },
            false,
        );
        assert_eq!((map, k.len()), ("hostports4", 12));
        assert_eq!(
            target("10.0.0.2".parse().unwrap(), 80),
            [10, 0, 0, 2, 0, 80, 0, 0]
        );
        assert_eq!(target("fd00::2".parse().unwrap(), 80).len(), 20);
    }

    #[test]
    fn a_mapping_on_one_family_skips_the_other() {
        let addrs: Vec<IpAddr> = vec!["10.0.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        let m = PortMapping {
            protocol: Protocol::Tcp,
            host_port: 80,
            container_port: 80,
            host_ip: Some("192.0.2.1".parse().unwrap()),
        };
        let maps: Vec<&str> = elements(&addrs, &[m], true)
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(maps, ["hostports4", "hairpin4", "hairpin6"]);
    }
}
