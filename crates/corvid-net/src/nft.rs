//! Masquerade rules in corvid's own nftables table (`inet corvid`), one rule per
//! attachment, each marked with a comment naming its network and attachment so that DEL
//! and GC remove exactly their own. Only typed values (addresses, networks, hex tags)
//! ever reach the nft command.

use crate::{Error, Result};
use ipnet::IpNet;
use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// The nftables table corvid owns; nothing outside it is touched.
pub const TABLE: &str = "corvid";
const CHAIN: &str = "postrouting";

/// FNV-1a over the parts, each ended by a zero byte so ("ab", "c") and ("a", "bc") differ.
fn fnv1a(parts: &[&str]) -> u64 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    for part in parts {
        h.write(part.as_bytes());
        h.write(&[0]);
    }
    h.finish()
}

/// Names the rules of one attachment: `corvid:<network hash>:<attachment hash>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MasqueradeTag(String);

impl MasqueradeTag {
    /// The tag of (network, container ID, interface).
    pub fn new(network: &str, container_id: &str, ifname: &str) -> MasqueradeTag {
        MasqueradeTag(format!(
            "{}{:016x}",
            network_prefix(network),
            fnv1a(&[container_id, ifname])
        ))
    }

    /// The tag of a whole network's masquerade, programmed by the agent of a host.
    pub fn network(network: &str) -> MasqueradeTag {
        MasqueradeTag(format!("{AGENT_PREFIX}{:016x}", fnv1a(&[network])))
    }

    /// The comment text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Comments of network-wide rules start with this.
const AGENT_PREFIX: &str = "corvid-net:";

fn network_prefix(network: &str) -> String {
    format!("corvid:{:016x}:", fnv1a(&[network]))
}

fn nft_binary() -> &'static str {
    ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("nft")
}

/// Serializes corvid's changes to its table. The nft child inherits the lock, so a plugin
/// killed while nft runs keeps it held until that orphaned nft has finished: a DEL that
/// comes next waits for it instead of listing the rules too early.
const LOCK_PATH: &str = "/run/corvid/nftables.lock";

fn lock() -> Result<File> {
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

fn run_nft(args: &[&str], stdin: Option<&str>, lock: &File) -> Result<String> {
    let inherited = lock
        .try_clone()
        .map_err(crate::io_err(format!("share {LOCK_PATH} with nft")))?;
    let mut command = Command::new(nft_binary());
    // SAFETY: fcntl is async-signal-safe; it only clears close-on-exec in the child.
    unsafe {
        command.pre_exec(move || {
            Ok(rustix::io::fcntl_setfd(
                &inherited,
                rustix::io::FdFlags::empty(),
            )?)
        });
    }
    let mut child = command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Nftables(format!("cannot run nft: {e}")))?;
    if let (Some(script), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(script.as_bytes())
            .map_err(|e| Error::Nftables(format!("cannot write to nft: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::Nftables(format!("nft did not finish: {e}")))?;
    if !out.status.success() {
        return Err(Error::Nftables(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Masquerades traffic from the addresses `sources` leaving their own subnet (and not
/// multicast).
pub fn add_masquerade(tag: &MasqueradeTag, sources: &[IpNet]) -> Result<()> {
    let sources: Vec<(String, IpNet)> =
        sources.iter().map(|s| (s.addr().to_string(), *s)).collect();
    masquerade(tag, &sources)
}

/// Masquerades traffic from anywhere in `subnets` leaving them; replaces the tag's rules.
pub fn set_subnet_masquerade(tag: &MasqueradeTag, subnets: &[IpNet]) -> Result<()> {
    delete_masquerade(tag)?;
    let sources: Vec<(String, IpNet)> = subnets
        .iter()
        .map(|s| (s.trunc().to_string(), *s))
        .collect();
    masquerade(tag, &sources)
}

/// Removes every network-wide rule whose tag is not in `keep`.
pub fn gc_network_masquerade(keep: &[MasqueradeTag]) -> Result<()> {
    let lock = lock()?;
    let handles: Vec<u64> = rules(&lock)?
        .into_iter()
        .filter(|(_, c)| c.starts_with(AGENT_PREFIX) && !keep.iter().any(|k| k.as_str() == c))
        .map(|(h, _)| h)
        .collect();
    delete_handles(&handles, &lock)
}

fn masquerade(tag: &MasqueradeTag, sources: &[(String, IpNet)]) -> Result<()> {
    let mut script = format!(
        "add table inet {TABLE}\n\
         add chain inet {TABLE} {CHAIN} {{ type nat hook postrouting priority srcnat; policy accept; }}\n"
    );
    for (saddr, src) in sources {
        let (proto, multicast) = match src {
            IpNet::V4(_) => ("ip", "224.0.0.0/4"),
            IpNet::V6(_) => ("ip6", "ff00::/8"),
        };
        script.push_str(&format!(
            "add rule inet {TABLE} {CHAIN} {proto} saddr {saddr} {proto} daddr != {} {proto} daddr != {multicast} masquerade comment \"{}\"\n",
            src.trunc(),
            tag.as_str()
        ));
    }
    run_nft(&["-f", "-"], Some(&script), &lock()?).map(drop)
}

/// The (handle, comment) of every corvid rule.
fn rules(lock: &File) -> Result<Vec<(u64, String)>> {
    let listing = match run_nft(&["-j", "list", "chain", "inet", TABLE, CHAIN], None, lock) {
        Ok(s) => s,
        Err(Error::Nftables(msg)) if msg.contains("No such file or directory") => {
            return Ok(Vec::new())
        }
        Err(e) => return Err(e),
    };
    let v: serde_json::Value = serde_json::from_str(&listing)
        .map_err(|e| Error::Nftables(format!("unreadable nft listing: {e}")))?;
    Ok(v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| {
            let rule = item.get("rule")?;
            Some((
                rule["handle"].as_u64()?,
                rule["comment"].as_str()?.to_string(),
            ))
        })
        .collect())
}

fn delete_handles(handles: &[u64], lock: &File) -> Result<()> {
    if handles.is_empty() {
        return Ok(());
    }
    let script: String = handles
        .iter()
        .map(|h| format!("delete rule inet {TABLE} {CHAIN} handle {h}\n"))
        .collect();
    run_nft(&["-f", "-"], Some(&script), lock).map(drop)
}

/// Removes the rules of one attachment; none left is fine.
pub fn delete_masquerade(tag: &MasqueradeTag) -> Result<()> {
    let lock = lock()?;
    let handles: Vec<u64> = rules(&lock)?
        .into_iter()
        .filter(|(_, c)| c == tag.as_str())
        .map(|(h, _)| h)
        .collect();
    delete_handles(&handles, &lock)
}

/// Removes the rules of `network` whose attachment is not in `keep`.
pub fn gc_masquerade(network: &str, keep: &[MasqueradeTag]) -> Result<()> {
    let lock = lock()?;
    let prefix = network_prefix(network);
    let handles: Vec<u64> = rules(&lock)?
        .into_iter()
        .filter(|(_, c)| c.starts_with(&prefix) && !keep.iter().any(|k| k.as_str() == c))
        .map(|(h, _)| h)
        .collect();
    delete_handles(&handles, &lock)
}

/// The comments of every corvid masquerade rule (for tests and diagnostics).
pub fn masquerade_tags() -> Result<Vec<String>> {
    Ok(rules(&lock()?)?.into_iter().map(|(_, c)| c).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_separate_networks_and_attachments() {
        let a = MasqueradeTag::new("net1", "c1", "eth0");
        assert_eq!(a, MasqueradeTag::new("net1", "c1", "eth0"));
        assert_ne!(a, MasqueradeTag::new("net1", "c1", "eth1"));
        assert_ne!(a, MasqueradeTag::new("net2", "c1", "eth0"));
        assert_ne!(
            MasqueradeTag::new("n", "ab", "c"),
            MasqueradeTag::new("n", "a", "bc")
        );
        assert!(a.as_str().starts_with(&network_prefix("net1")));
        assert!(a.as_str().len() < 128);
    }

    #[test]
    fn tags_are_those_earlier_versions_wrote() {
        // Rules written before an upgrade are found and removed by these tags.
        assert_eq!(
            MasqueradeTag::new("net", "ctr", "eth0").as_str(),
            "corvid:e53f18baa0319ec8:4f23bddf6d4f4663"
        );
        assert_eq!(
            MasqueradeTag::network("n1").as_str(),
            "corvid-net:21cece1925f18240"
        );
    }
}
