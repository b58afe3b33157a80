//! Who put what in corvid's table: attachment tags carried as nftables comments, the
//! lock that serializes read-then-change steps between processes, and the claim, release
//! and sweep of elements by tag.

use crate::Result;

use super::*;

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
