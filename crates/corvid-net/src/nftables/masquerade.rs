//! Masquerade in corvid's table at a constant cost per container, whatever the number of
//! containers on the network: per network subnet, a set of the containers' addresses and
//! one rule that reads it.
//!
//! ```text
//! set masq-<network, subnet> { type ipv4_addr }     (or ipv6_addr)
//! chain masquerade { type nat hook postrouting priority srcnat
//!     ip saddr @masq-<network, subnet> ip daddr != <subnet> ip daddr != 224.0.0.0/4 masquerade
//!     ... one rule per subnet, made with its set }
//! ```
//!
//! ADD adds an element (the container's address, with the attachment's tag as comment);
//! DEL removes the elements carrying its tag; GC removes the elements of attachments not
//! listed valid. Plain sets, not a verdict map: an element that jumps to a chain makes the
//! kernel validate every element of the map at each commit, which grows with the
//! network. The agent's network-wide masquerade (and the SNAT of what the host itself
//! sends into a bridge to the host's own address) is its own base chain,
//! `network-masquerade` (after the services' SNAT), rewritten whole when its networks
//! change.

use super::expr::{self, reg32, Field, Reg};
use super::{
    addr_bytes, claim, collect_garbage, comments, fnv1a, lock, release, sweep, AttachmentTag,
    BaseChain, Batch, ChainType, DataType, HookPoint, Nftables, SetSpec, TableRef,
};
use crate::names::BRIDGE_PREFIX;
use crate::Result;
use ipnet::IpNet;
use std::net::IpAddr;

const CHAIN: &str = "masquerade";
const AGENT_CHAIN: &str = "network-masquerade";
/// The chain of that name before it ran after the services' SNAT.
const OLD_AGENT_CHAIN: &str = "agent-masquerade";
const SET_PREFIX: &str = "masq-";
const SRCNAT: BaseChain = BaseChain {
    kind: ChainType::Nat,
    hook: HookPoint::Postrouting,
    priority: 100,
};
/// After the services' SNAT (srcnat), so that a floating IP or a router's gateway
/// address, when one applies, is what a connection leaves from: the first SNAT made
/// wins.
const AGENT_SRCNAT: BaseChain = BaseChain {
    priority: 110,
    ..SRCNAT
};

fn multicast(v6: bool) -> IpNet {
    if v6 {
        "ff00::/8".parse().expect("valid prefix")
    } else {
        "224.0.0.0/4".parse().expect("valid prefix")
    }
}

/// The set of a network's subnet: the address's own subnet, named for the network.
fn set_name(tag: &AttachmentTag, source: IpNet) -> String {
    format!(
        "{SET_PREFIX}{:016x}",
        fnv1a(&[tag.network_part(), &source.trunc().to_string()])
    )
}

/// The set of a subnet and the rule that masquerades what its addresses send outside it
/// (and not to multicast).
fn subnet_set(batch: &mut Batch, name: &str, subnet: IpNet) {
    let subnet = subnet.trunc();
    let v6 = matches!(subnet, IpNet::V6(_));
    batch.add_set(&SetSpec {
        name,
        key: DataType::addr(v6),
        data: None,
        interval: false,
        timeout: None,
    });
    let mut rule = expr::nfproto(v6);
    rule.extend([
        expr::load(Field::SrcAddr, v6, Reg::Reg1),
        expr::lookup(name, Reg::Reg1, true),
    ]);
    rule.extend(expr::in_prefix(Field::DstAddr, subnet, false));
    rule.extend(expr::in_prefix(Field::DstAddr, multicast(v6), false));
    rule.push(expr::masquerade());
    // The rule names its set, so that it can go with the set's last element.
    batch.add_rule(CHAIN, rule, Some(name));
}

/// Masquerades traffic from the addresses `sources` leaving their own subnet (and not
/// multicast); an address another attachment held is taken over.
///
/// Once a subnet's set exists, the transaction only adds an element: a transaction that
/// replaces or deletes anything leaves the kernel work to free after an RCU grace period,
/// and closing a netfilter socket waits for that work (milliseconds, not microseconds).
/// A set is made with its rule in one transaction, so a set that exists has its rule.
pub fn add_masquerade(nft: &mut Nftables, tag: &AttachmentTag, sources: &[IpNet]) -> Result<()> {
    let _lock = lock()?;
    let mut batch = Batch::new();
    if !nft.has_chain(CHAIN)? {
        batch.add_table();
        batch.add_chain(CHAIN, Some(SRCNAT));
    }
    let mut made = Vec::new();
    for src in sources {
        let set = set_name(tag, *src);
        if !made.contains(&set) && !nft.has_set(&set)? {
            subnet_set(&mut batch, &set, *src);
            made.push(set.clone());
        }
        claim(nft, &mut batch, &set, &addr_bytes(src.addr()), None, tag)?;
    }
    nft.commit(batch)
}

/// Removes the elements of one attachment; none left is fine. With the attachment's
/// addresses (and prefixes) known this looks at those only; without, it reads the
/// network's sets.
///
/// Keep `nft` open through the slow part of the caller's work and close it after: the
/// kernel frees removed elements after an RCU grace period, and a netfilter socket
/// closed before that waits for it holding the table's commit lock, which the deletion
/// of a veth in the same namespace needs too.
pub fn delete_masquerade(
    nft: &mut Nftables,
    tag: &AttachmentTag,
    sources: Option<&[IpNet]>,
) -> Result<()> {
    let _lock = lock()?;
    let mut batch = Batch::new();
    let sets = match sources {
        Some(sources) => {
            let mut sets = Vec::new();
            for src in sources {
                let set = set_name(tag, *src);
                release(nft, &mut batch, &set, &addr_bytes(src.addr()), tag)?;
                sets.push(set);
            }
            sets
        }
        None => {
            let sets = masquerade_sets(nft)?;
            let names: Vec<&str> = sets.iter().map(String::as_str).collect();
            sweep(nft, &mut batch, &names, |c| c == tag.as_str())?;
            sets
        }
    };
    if batch.is_empty() {
        return Ok(());
    }
    nft.commit(batch)?;
    remove_emptied(nft, &sets)
}

/// Removes the sets among `sets` that are left empty, each with its rule, then the chain
/// and corvid's table when nothing else is in them: a network's last DEL leaves the
/// ruleset as it was before its first ADD. Called with the lock held, which every ADD
/// takes too, so no ADD can fill a set between the look and the removal. A set whose
/// rule has no comment (made before rules named their sets) is left: the kernel refuses
/// to delete a set a rule reads.
fn remove_emptied(nft: &mut Nftables, sets: &[String]) -> Result<()> {
    let rules = nft.rules(TableRef::CORVID, CHAIN)?;
    let mut batch = Batch::new();
    let mut left = rules.len();
    for set in sets {
        let handles: Vec<u64> = rules
            .iter()
            .filter(|(_, c)| c.as_deref() == Some(set.as_str()))
            .map(|(h, _)| *h)
            .collect();
        if handles.is_empty() || !nft.has_set(set)? || !nft.elements(set)?.is_empty() {
            continue;
        }
        for h in &handles {
            batch.delete_rule(CHAIN, *h);
        }
        left -= handles.len();
        batch.delete_set(set);
    }
    if batch.is_empty() {
        return Ok(());
    }
    if left == 0 {
        batch.delete_chain(CHAIN);
        let others = nft.chains()?.iter().any(|c| c != CHAIN)
            || nft.sets()?.iter().any(|s| !sets.contains(s));
        if !others {
            batch.delete_table();
        }
    }
    nft.commit(batch)
}

fn masquerade_sets(nft: &mut Nftables) -> Result<Vec<String>> {
    Ok(nft
        .sets()?
        .into_iter()
        .filter(|s| s.starts_with(SET_PREFIX))
        .collect())
}

/// Removes the elements of `network` whose attachment is not in `keep`.
pub fn gc_masquerade(network: &str, keep: &[AttachmentTag]) -> Result<()> {
    let _lock = lock()?;
    let mut nft = Nftables::open()?;
    let sets = masquerade_sets(&mut nft)?;
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let mut batch = Batch::new();
    collect_garbage(&mut nft, &mut batch, &sets, network, keep)?;
    nft.commit(batch)?;
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    remove_emptied(&mut nft, &sets)
}

/// The tags of every masqueraded address (for tests and diagnostics).
pub fn masquerade_tags() -> Result<Vec<String>> {
    let mut nft = Nftables::open()?;
    let sets = masquerade_sets(&mut nft)?;
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    comments(&mut nft, &sets)
}
/// Sets the agent's masquerade: for each network, traffic from its subnets leaving them
/// (and not multicast). Replaces what was there in one transaction.
///
/// What the host itself sends into a corvid bridge leaves from the address of `hosts`
/// (addresses of this host only, one per family) of its family: the bridges' own
/// addresses are gateways every host holds, so a pod on another host would answer its
/// own host, not this one.
pub fn set_network_masquerade(networks: &[(&str, &[IpNet])], hosts: &[IpAddr]) -> Result<()> {
    let mut batch = Batch::new();
    batch.add_table();
    // The old chain made (or found) and removed in one transaction: no listing first.
    batch.add_chain(OLD_AGENT_CHAIN, Some(SRCNAT));
    batch.flush_chain(OLD_AGENT_CHAIN);
    batch.delete_chain(OLD_AGENT_CHAIN);
    batch.add_chain(AGENT_CHAIN, Some(AGENT_SRCNAT));
    batch.flush_chain(AGENT_CHAIN);
    for host in hosts {
        let v6 = host.is_ipv6();
        let mut rule = expr::nfproto(v6);
        rule.extend(expr::ifname_prefix(false, BRIDGE_PREFIX, true));
        rule.extend(expr::saddr_local());
        rule.extend([
            expr::immediate(reg32(0), &addr_bytes(*host)),
            expr::snat(v6, reg32(0)),
        ]);
        batch.add_rule(AGENT_CHAIN, rule, None);
    }
    for (id, subnets) in networks {
        let tag = AttachmentTag::network(id);
        for subnet in subnets.iter() {
            let s = subnet.trunc();
            let v6 = matches!(s, IpNet::V6(_));
            let mut rule = expr::nfproto(v6);
            // Routed to another corvid network: pods see each other's own addresses.
            rule.extend(expr::ifname_prefix(false, BRIDGE_PREFIX, false));
            rule.extend(expr::in_prefix(Field::SrcAddr, s, true));
            rule.extend(expr::in_prefix(Field::DstAddr, s, false));
            rule.extend(expr::in_prefix(Field::DstAddr, multicast(v6), false));
            // Routed to a port of another network straight over the underlay (direct
            // routing): as between bridges, pods see each other's own addresses.
            rule.extend(expr::mark_test(super::routing::DIRECT_MARK, false));
            rule.push(expr::masquerade());
            batch.add_rule(AGENT_CHAIN, rule, Some(tag.as_str()));
        }
    }
    let _lock = lock()?;
    Nftables::open()?.commit(batch)
}
