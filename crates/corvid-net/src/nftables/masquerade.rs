//! Masquerade in corvid's table at a constant cost per container, whatever the number of
//! containers on the network:
//!
//! ```text
//! map masq4 { type ipv4_addr : verdict }        map masq6 { type ipv6_addr : verdict }
//! chain masquerade { type nat hook postrouting priority srcnat
//!     meta nfproto ipv4 ip saddr vmap @masq4
//!     meta nfproto ipv6 ip6 saddr vmap @masq6 }
//! chain masq-<network, subnet> { ip daddr <subnet> return; ip daddr 224.0.0.0/4 return; masquerade }
//! ```
//!
//! ADD adds one element (the container's address, jumping to its subnet's chain, with the
//! attachment's tag as comment); DEL removes the elements carrying its tag; GC removes the
//! elements of attachments not listed valid. The agent's network-wide masquerade is its
//! own base chain, `agent-masquerade`, rewritten whole when its networks change.

use super::expr::{self, Field, Reg, Verdict};
use super::{
    address_key, claim, collect_garbage, comments, fnv1a, lock, release_addresses, AttachmentTag,
    BaseChain, Batch, ChainType, DataType, HookPoint, Nftables, SetSpec, Value,
};
use crate::Result;
use ipnet::IpNet;
use std::net::IpAddr;

const CHAIN: &str = "masquerade";
const AGENT_CHAIN: &str = "agent-masquerade";
const SUBNET_CHAIN_PREFIX: &str = "masq-";
const SRCNAT: BaseChain = BaseChain {
    kind: ChainType::Nat,
    hook: HookPoint::Postrouting,
    priority: 100,
};

const MAPS: [&str; 2] = ["masq4", "masq6"];

fn map_name(v6: bool) -> &'static str {
    if v6 {
        "masq6"
    } else {
        "masq4"
    }
}

fn key(addr: IpAddr) -> (&'static str, Vec<u8>) {
    address_key(MAPS, addr)
}

fn multicast(v6: bool) -> IpNet {
    if v6 {
        "ff00::/8".parse().expect("valid prefix")
    } else {
        "224.0.0.0/4".parse().expect("valid prefix")
    }
}

/// The table, the two maps and the base chain that reads them, made together.
fn skeleton(batch: &mut Batch) {
    batch.add_table();
    batch.add_chain(CHAIN, Some(SRCNAT));
    for v6 in [false, true] {
        batch.add_set(&SetSpec {
            name: map_name(v6),
            key: DataType::addr(v6),
            data: Some(DataType::VERDICT),
            interval: false,
        });
    }
    for v6 in [false, true] {
        let mut rule = expr::nfproto(v6);
        rule.push(expr::load(Field::SrcAddr, v6, Reg::Reg1));
        rule.push(expr::map(map_name(v6), Reg::Reg1, Reg::Verdict));
        batch.add_rule(CHAIN, rule, None);
    }
}

/// The name of the chain of a network's subnet.
fn subnet_chain_name(tag: &AttachmentTag, subnet: IpNet) -> String {
    let network = tag.network_part();
    format!(
        "{SUBNET_CHAIN_PREFIX}{:016x}",
        fnv1a(&[network, &subnet.trunc().to_string()])
    )
}

/// The chain of a network's subnet, with its rules: traffic to the subnet itself and
/// multicast keep their source; the rest is masqueraded.
fn subnet_chain(batch: &mut Batch, name: &str, subnet: IpNet) {
    let subnet = subnet.trunc();
    let v6 = matches!(subnet, IpNet::V6(_));
    batch.add_chain(name, None);
    for dst in [subnet, multicast(v6)] {
        let mut rule = expr::nfproto(v6);
        rule.extend(expr::in_prefix(Field::DstAddr, dst, true));
        rule.push(expr::verdict(Verdict::Return));
        batch.add_rule(name, rule, None);
    }
    batch.add_rule(name, vec![expr::masquerade()], None);
}

/// Masquerades traffic from the addresses `sources` leaving their own subnet (and not
/// multicast); an address another attachment held is taken over.
///
/// Once a network's chains exist, the transaction only adds elements: a transaction that
/// replaces or deletes anything leaves the kernel work to free after an RCU grace period,
/// and closing a netfilter socket waits for that work (milliseconds, not microseconds).
/// A chain is made with its rules in one transaction, so a chain that exists is whole.
pub fn add_masquerade(nft: &mut Nftables, tag: &AttachmentTag, sources: &[IpNet]) -> Result<()> {
    let _lock = lock()?;
    let mut batch = Batch::new();
    if !nft.has_chain(CHAIN)? {
        skeleton(&mut batch);
    }
    let mut made = Vec::new();
    for src in sources {
        let chain = subnet_chain_name(tag, *src);
        if !made.contains(&chain) && !nft.has_chain(&chain)? {
            subnet_chain(&mut batch, &chain, *src);
            made.push(chain.clone());
        }
        let (map, key) = key(src.addr());
        let jump = Value::Verdict(Verdict::Jump(&chain));
        claim(nft, &mut batch, map, &key, Some(jump), tag)?;
    }
    nft.commit(batch)
}

/// Removes the elements of one attachment; none left is fine. With the attachment's
/// addresses known this looks at those only; without, it reads both maps.
///
/// Keep `nft` open through the slow part of the caller's work and close it after: the
/// kernel frees removed elements after an RCU grace period, and a netfilter socket
/// closed before that waits for it holding the table's commit lock, which the deletion
/// of a veth in the same namespace needs too.
pub fn delete_masquerade(
    nft: &mut Nftables,
    tag: &AttachmentTag,
    addrs: Option<&[IpAddr]>,
) -> Result<()> {
    release_addresses(nft, MAPS, tag, addrs)
}

/// Removes the elements of `network` whose attachment is not in `keep`, and the subnet
/// chains no element jumps to any more.
pub fn gc_masquerade(network: &str, keep: &[AttachmentTag]) -> Result<()> {
    let _lock = lock()?;
    let mut nft = Nftables::open()?;
    let mut batch = Batch::new();
    let used = collect_garbage(&mut nft, &mut batch, &MAPS, network, keep)?;
    for chain in nft.chains()? {
        if chain.starts_with(SUBNET_CHAIN_PREFIX) && !used.contains(&chain) {
            batch.flush_chain(&chain);
            batch.delete_chain(&chain);
        }
    }
    nft.commit(batch)
}

/// The tags of every masqueraded address (for tests and diagnostics).
pub fn masquerade_tags() -> Result<Vec<String>> {
    comments(&mut Nftables::open()?, &MAPS)
}

/// Sets the agent's masquerade: for each network, traffic from its subnets leaving them
/// (and not multicast). Replaces what was there in one transaction.
pub fn set_network_masquerade(networks: &[(&str, &[IpNet])]) -> Result<()> {
    let mut batch = Batch::new();
    batch.add_table();
    batch.add_chain(AGENT_CHAIN, Some(SRCNAT));
    batch.flush_chain(AGENT_CHAIN);
    for (id, subnets) in networks {
        let tag = AttachmentTag::network(id);
        for subnet in subnets.iter() {
            let s = subnet.trunc();
            let v6 = matches!(s, IpNet::V6(_));
            let mut rule = expr::nfproto(v6);
            rule.extend(expr::in_prefix(Field::SrcAddr, s, true));
            rule.extend(expr::in_prefix(Field::DstAddr, s, false));
            rule.extend(expr::in_prefix(Field::DstAddr, multicast(v6), false));
            rule.push(expr::masquerade());
            batch.add_rule(AGENT_CHAIN, rule, Some(tag.as_str()));
        }
    }
    Nftables::open()?.commit(batch)
}
