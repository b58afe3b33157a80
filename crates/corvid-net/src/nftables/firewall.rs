//! The firewall plugin's rules in corvid's table: containers' addresses in two sets that a
//! fixed forward chain accepts (outbound, and replies inbound, as the reference's
//! `CNI-FORWARD` does), and bridge isolation for the `same-bridge` and `isolated`
//! ingress policies (the reference's isolation stages) as sets of interface names.
//!
//! ```text
//! set fw4 { type ipv4_addr }   set fw6 { type ipv6_addr }
//! set isolated { type ifname }  set same { type ifname . ifname }  set hermetic { ... }
//! chain firewall-forward { type filter hook forward priority filter
//!     iifname @isolated oifname @isolated iifname . oifname != @same drop
//!     iifname . oifname @hermetic drop
//!     ct state established,related ip daddr @fw4 accept
//!     ip saddr @fw4 accept   (and IPv6) }
//! ```
//!
//! An accept here ends this chain only: a drop in another table's forward chain still
//! applies. So where iptables (iptables-nft) filters forwarding too (Docker's rules and
//! their DROP policy, the reference plugins', a host firewall's), the same accepts also go
//! into its `filter` table, as the reference's `CNI-FORWARD` does: a chain of corvid's
//! own, `CORVID-FORWARD`, jumped to from the top of `FORWARD`, with one rule per address
//! and direction written the way iptables writes them (an xtables `conntrack` match), so
//! that iptables still reads the table. Legacy iptables' tables are beyond netlink's
//! reach: where one filters, the same accepts go there through its commands
//! ([`crate::iptables::allow_addresses_legacy`]).

use super::expr::{self, reg32, Field, Reg, Verdict};
use super::{
    address_key, claim, collect_garbage, comments, lock, network_prefix, release_addresses,
    AttachmentTag, BaseChain, Batch, ChainType, DataType, HookPoint, Nftables, SetSpec, TableRef,
};
use crate::Result;
use std::net::IpAddr;

/// Who may open connections to a container, as the reference's `ingressPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngressPolicy {
    /// Anyone.
    Open,
    /// Containers on the same bridge, and not those of other isolated bridges.
    SameBridge,
    /// Not even containers of other isolated bridges, nor routed traffic within the
    /// bridge.
    Isolated,
}

const CHAIN: &str = "firewall-forward";
/// corvid's chain in iptables' filter table.
const COMPAT_CHAIN: &str = "CORVID-FORWARD";
/// The comment of the jump to it from `FORWARD`.
const JUMP_COMMENT: &str = "corvid firewall";
const ADDRS: [&str; 2] = ["fw4", "fw6"];
const ISOLATED: &str = "isolated";
const SAME: &str = "same";
const HERMETIC: &str = "hermetic";

fn addr_key(addr: IpAddr) -> (&'static str, Vec<u8>) {
    address_key(ADDRS, addr)
}

fn pair(bridge: &str) -> Vec<u8> {
    let mut k = expr::ifname_bytes(bridge).to_vec();
    k.extend(expr::ifname_bytes(bridge));
    k
}

fn skeleton(batch: &mut Batch) {
    batch.add_table();
    let name_pair = DataType::concat(&[DataType::IFNAME, DataType::IFNAME]);
    for (name, key) in [
        (ADDRS[0], DataType::IPV4),
        (ADDRS[1], DataType::IPV6),
        (ISOLATED, DataType::IFNAME),
        (SAME, name_pair),
        (HERMETIC, name_pair),
    ] {
        batch.add_set(&SetSpec {
            name,
            key,
            data: None,
            interval: false,
            timeout: None,
        });
    }
    batch.add_chain(
        CHAIN,
        Some(BaseChain {
            kind: ChainType::Filter,
            hook: HookPoint::Forward,
            priority: 0,
        }),
    );
    batch.add_rule(
        CHAIN,
        vec![
            expr::load_ifname(true, reg32(0)),
            expr::lookup(ISOLATED, reg32(0), true),
            expr::load_ifname(false, reg32(4)),
            expr::lookup(ISOLATED, reg32(4), true),
            expr::lookup(SAME, reg32(0), false),
            expr::verdict(Verdict::Drop),
        ],
        None,
    );
    batch.add_rule(
        CHAIN,
        vec![
            expr::load_ifname(true, reg32(0)),
            expr::load_ifname(false, reg32(4)),
            expr::lookup(HERMETIC, reg32(0), true),
            expr::verdict(Verdict::Drop),
        ],
        None,
    );
    for (v6, set) in [(false, ADDRS[0]), (true, ADDRS[1])] {
        let mut replies = expr::nfproto(v6);
        replies.extend(expr::ct_state(expr::ct::ESTABLISHED | expr::ct::RELATED));
        replies.extend([
            expr::load(Field::DstAddr, v6, reg32(0)),
            expr::lookup(set, reg32(0), true),
            expr::verdict(Verdict::Accept),
        ]);
        batch.add_rule(CHAIN, replies, None);
        let mut outbound = expr::nfproto(v6);
        outbound.extend([
            expr::load(Field::SrcAddr, v6, reg32(0)),
            expr::lookup(set, reg32(0), true),
            expr::verdict(Verdict::Accept),
        ]);
        batch.add_rule(CHAIN, outbound, None);
    }
}

/// Lets the container at `addrs` through, and applies `policy` to its bridge.
pub fn add_firewall(
    nft: &mut Nftables,
    tag: &AttachmentTag,
    addrs: &[IpAddr],
    bridge: Option<&str>,
    policy: IngressPolicy,
) -> Result<()> {
    {
        let _lock = lock()?;
        let mut batch = Batch::new();
        if !nft.has_chain(CHAIN)? {
            skeleton(&mut batch);
        }
        for addr in addrs {
            let (set, key) = addr_key(*addr);
            claim(nft, &mut batch, set, &key, None, tag)?;
        }
        for (table, v6) in iptables_filters(nft)? {
            let family: Vec<&IpAddr> = addrs.iter().filter(|a| a.is_ipv6() == v6).collect();
            if family.is_empty() {
                continue;
            }
            batch.in_table(table);
            if !nft.has_chain_in(table, COMPAT_CHAIN)? {
                batch.add_chain(COMPAT_CHAIN, None);
                let jump = vec![expr::verdict(Verdict::Jump(COMPAT_CHAIN))];
                batch.insert_rule("FORWARD", jump, Some(JUMP_COMMENT));
            }
            for addr in family {
                let bytes = addr_key(*addr).1;
                let replies = vec![
                    expr::load(Field::DstAddr, v6, Reg::Reg1),
                    expr::cmp(Reg::Reg1, true, &bytes),
                    expr::xt_established(),
                    expr::verdict(Verdict::Accept),
                ];
                batch.add_rule(COMPAT_CHAIN, replies, Some(tag.as_str()));
                let outbound = vec![
                    expr::load(Field::SrcAddr, v6, Reg::Reg1),
                    expr::cmp(Reg::Reg1, true, &bytes),
                    expr::verdict(Verdict::Accept),
                ];
                batch.add_rule(COMPAT_CHAIN, outbound, Some(tag.as_str()));
            }
            batch.in_table(TableRef::CORVID);
        }
        if let (Some(bridge), true) = (bridge, policy != IngressPolicy::Open) {
            // Bridges stay listed: a policy belongs to the network, not to one container.
            let comment = format!("corvid-bridge:{bridge}");
            let mut sets = vec![
                (ISOLATED, expr::ifname_bytes(bridge).to_vec()),
                (SAME, pair(bridge)),
            ];
            if policy == IngressPolicy::Isolated {
                sets.push((HERMETIC, pair(bridge)));
            }
            for (set, key) in sets {
                if nft.element(set, &key)?.is_none() {
                    batch.add_element(set, &key, None, &comment);
                }
            }
        }
        nft.commit(batch)?;
    }
    // After the lock is let go: the legacy commands take it themselves.
    crate::iptables::allow_addresses_legacy(tag.as_str(), addrs)
}

/// The container's addresses the firewall does not let through (for CHECK).
pub fn missing_firewall(
    nft: &mut Nftables,
    tag: &AttachmentTag,
    addrs: &[IpAddr],
) -> Result<Vec<IpAddr>> {
    let mut missing = Vec::new();
    for addr in addrs {
        let (set, key) = addr_key(*addr);
        if nft.element(set, &key)?.and_then(|e| e.comment).as_deref() != Some(tag.as_str()) {
            missing.push(*addr);
        }
    }
    Ok(missing)
}

/// Removes the container's addresses; none left is fine. Without the addresses known
/// this reads both sets. See `masquerade::delete_masquerade` on when to close `nft`.
pub fn delete_firewall(
    nft: &mut Nftables,
    tag: &AttachmentTag,
    addrs: Option<&[IpAddr]>,
) -> Result<()> {
    release_addresses(nft, ADDRS, tag, addrs)?;
    remove_iptables_rules(nft, |c| c == tag.as_str())?;
    crate::iptables::remove_addresses_legacy(&|c| c == tag.as_str())
}

/// iptables' filter tables that filter forwarding here, with their family.
fn iptables_filters(nft: &mut Nftables) -> Result<Vec<(TableRef, bool)>> {
    let mut out = Vec::new();
    for v6 in [false, true] {
        let table = TableRef::iptables_filter(v6);
        if nft.has_chain_in(table, "FORWARD")? {
            out.push((table, v6));
        }
    }
    Ok(out)
}

/// Removes corvid's rules in iptables' filter tables whose comment is `stale` (reading
/// its chain, which only hosts with iptables rules have), and the chain and its jump with
/// the last of them: iptables is left as corvid found it.
fn remove_iptables_rules(nft: &mut Nftables, stale: impl Fn(&str) -> bool) -> Result<()> {
    let _lock = lock()?;
    let mut batch = Batch::new();
    for v6 in [false, true] {
        let table = TableRef::iptables_filter(v6);
        if !nft.has_chain_in(table, COMPAT_CHAIN)? {
            continue;
        }
        batch.in_table(table);
        let rules = nft.rules(table, COMPAT_CHAIN)?;
        for (handle, comment) in &rules {
            if comment.as_deref().is_some_and(&stale) {
                batch.delete_rule(COMPAT_CHAIN, *handle);
            }
        }
        if rules.iter().all(|(_, c)| c.as_deref().is_some_and(&stale)) {
            for (handle, comment) in nft.rules(table, "FORWARD")? {
                if comment.as_deref() == Some(JUMP_COMMENT) {
                    batch.delete_rule("FORWARD", handle);
                }
            }
            batch.delete_chain(COMPAT_CHAIN);
        }
    }
    nft.commit(batch)
}

/// Removes the addresses of `network` whose attachment is not in `keep`.
pub fn gc_firewall(nft: &mut Nftables, network: &str, keep: &[AttachmentTag]) -> Result<()> {
    {
        let _lock = lock()?;
        let mut batch = Batch::new();
        collect_garbage(nft, &mut batch, &ADDRS, network, keep)?;
        nft.commit(batch)?;
    }
    let prefix = network_prefix(network);
    let stale = |c: &str| c.starts_with(&prefix) && !keep.iter().any(|k| k.as_str() == c);
    remove_iptables_rules(nft, stale)?;
    crate::iptables::remove_addresses_legacy(&stale)
}

/// The tags of every address let through (for tests and diagnostics).
pub fn firewall_tags(nft: &mut Nftables) -> Result<Vec<String>> {
    comments(nft, &ADDRS)
}
