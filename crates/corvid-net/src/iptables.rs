//! corvid's bridges through iptables' FORWARD chain. dockerd sets FORWARD's policy to
//! DROP and turns on `bridge-nf-call-iptables`, so even two ports of one corvid bridge
//! cannot reach each other; ufw's policy is DROP too. One chain of corvid's own,
//! `CORVID-BRIDGES`, accepts what leaves a corvid bridge and the replies coming back,
//! jumped to from `DOCKER-USER` where dockerd runs (the chain dockerd keeps first and
//! never flushes) and from the top of `FORWARD` elsewhere. The `iptables` command is
//! used, not netlink, so legacy iptables and iptables-nft are served alike: whichever
//! one dockerd or ufw uses is the one the command runs.
//!
//! A drop in a forward chain of another nftables table (firewalld, an nftables.conf) is
//! beyond what corvid may rewrite: [`crate::nftables::Nftables::forward_drops`] names it.

use std::process::{Command, Output};

use crate::names::BRIDGE_PREFIX;
use crate::{io_err, Error, Result};

/// corvid's chain in the `filter` table of iptables and ip6tables.
pub const CHAIN: &str = "CORVID-BRIDGES";
/// The chain dockerd leaves to users, jumped to first from FORWARD.
const DOCKER_USER: &str = "DOCKER-USER";

/// The accepts: anything leaving a corvid bridge, replies coming back to one, and what a
/// port reached by direct routing sends into one (the routing filter marks it).
fn accepts() -> [Vec<String>; 3] {
    let bridges = format!("{BRIDGE_PREFIX}+");
    let direct = crate::nftables::routing::DIRECT_MARK;
    [
        vec!["-i".into(), bridges.clone()],
        vec![
            "-o".into(),
            bridges.clone(),
            "-m".into(),
            "mark".into(),
            "--mark".into(),
            format!("{direct:#x}/{direct:#x}"),
        ],
        vec![
            "-o".into(),
            bridges,
            "-m".into(),
            "conntrack".into(),
            "--ctstate".into(),
            "RELATED,ESTABLISHED".into(),
        ],
    ]
}

/// One of `iptables` and `ip6tables`.
struct Tool(&'static str);

impl Tool {
    /// Runs the tool; `None` when it is not installed (then nothing filters with it).
    fn run(&self, args: &[&str]) -> Result<Option<Output>> {
        match Command::new(self.0).arg("-w").args(args).output() {
            Ok(o) => Ok(Some(o)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(self.0)(e)),
        }
    }

    /// Runs the tool; it must succeed.
    fn must(&self, args: &[&str]) -> Result<()> {
        match self.run(args)? {
            Some(o) if !o.status.success() => Err(Error::Command {
                command: format!("{} {}", self.0, args.join(" ")),
                message: String::from_utf8_lossy(&o.stderr).trim().to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// True when the command ran and succeeded (a `-C` that found its rule).
    fn holds(&self, args: &[&str]) -> Result<bool> {
        Ok(self.run(args)?.is_some_and(|o| o.status.success()))
    }

    fn has_chain(&self, chain: &str) -> Result<bool> {
        self.holds(&["-n", "-L", chain])
    }

    /// FORWARD's policy drops (dockerd's, ufw's).
    fn forward_drops(&self) -> Result<bool> {
        let Some(o) = self.run(&["-S", "FORWARD"])? else {
            return Ok(false);
        };
        Ok(String::from_utf8_lossy(&o.stdout)
            .lines()
            .any(|l| l == "-P FORWARD DROP"))
    }

    /// Where corvid's chain is jumped from: DOCKER-USER where dockerd runs, else FORWARD.
    fn parent(&self) -> Result<&'static str> {
        Ok(if self.has_chain(DOCKER_USER)? {
            DOCKER_USER
        } else {
            "FORWARD"
        })
    }

    /// FORWARD drops (its policy, or dockerd's chains) and corvid's accepts are missing.
    fn blocks(&self) -> Result<bool> {
        if !self.has_chain(DOCKER_USER)? && !self.forward_drops()? {
            return Ok(false);
        }
        let ok = self.has_chain(CHAIN)? && self.holds(&["-C", self.parent()?, "-j", CHAIN])?;
        Ok(!ok)
    }

    /// Adds what is missing of corvid's chain, its accepts and its jump; true when
    /// something was added.
    fn allow(&self) -> Result<bool> {
        let ours = self.has_chain(CHAIN)?;
        if !ours && !self.has_chain(DOCKER_USER)? && !self.forward_drops()? {
            return Ok(false);
        }
        let mut added = self.ensure_chain(CHAIN, ours, self.parent()?)?;
        for rule in accepts() {
            let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
            added |= self.ensure_rule(CHAIN, &[&rule[..], &["-j", "ACCEPT"]].concat())?;
        }
        Ok(added)
    }

    /// Makes `chain` (unless it `exists`), jumped to from the top of `parent`, where
    /// either is missing; true when something was added.
    fn ensure_chain(&self, chain: &str, exists: bool, parent: &str) -> Result<bool> {
        let mut added = false;
        if !exists {
            self.must(&["-N", chain])?;
            added = true;
        }
        if !self.holds(&["-C", parent, "-j", chain])? {
            self.must(&["-I", parent, "1", "-j", chain])?;
            added = true;
        }
        Ok(added)
    }

    /// Appends `rule` to `chain` unless it is there; true when it was added.
    fn ensure_rule(&self, chain: &str, rule: &[&str]) -> Result<bool> {
        if self.holds(&[&["-C", chain][..], rule].concat())? {
            return Ok(false);
        }
        self.must(&[&["-A", chain][..], rule].concat())?;
        Ok(true)
    }

    /// Removes every jump from `parents` to `chain`, then the chain and what it holds.
    fn drop_chain(&self, chain: &str, parents: &[&str]) -> Result<()> {
        for parent in parents {
            while self.holds(&["-C", parent, "-j", chain])? {
                self.must(&["-D", parent, "-j", chain])?;
            }
        }
        self.must(&["-F", chain])?;
        self.must(&["-X", chain])
    }

    /// Removes every jump to corvid's chain, then the chain; true when it was there.
    fn remove(&self) -> Result<bool> {
        if !self.has_chain(CHAIN)? {
            return Ok(false);
        }
        self.drop_chain(CHAIN, &["FORWARD", DOCKER_USER])?;
        Ok(true)
    }
}

const TOOLS: [Tool; 2] = [Tool("iptables"), Tool("ip6tables")];

/// Held while the chain is looked at and changed: `iptables -w` serializes single
/// commands, not the look-then-change of two processes (two Docker DeleteNetwork calls
/// at once both saw the chain, and the second's flush failed).
fn serialized() -> Result<std::fs::File> {
    crate::nftables::lock()
}

/// Lets corvid's bridges through wherever iptables filters forwarding (FORWARD's policy
/// drops, or dockerd's `DOCKER-USER` is there), adding only what is missing, so it can
/// run on every pass: a dockerd or firewall restart that removed a rule gets it back.
/// True when something was added. Nothing is done where nothing filters.
pub fn allow_bridges() -> Result<bool> {
    let _lock = serialized()?;
    let mut added = false;
    for tool in &TOOLS {
        added |= tool.allow()?;
    }
    Ok(added)
}

/// Removes corvid's chain and its jumps (the last corvid bridge is gone); true when
/// there was something to remove. Every tool is tried; the first failure is returned.
pub fn remove_bridges_allowance() -> Result<bool> {
    let _lock = serialized()?;
    let mut removed = false;
    let mut first_error = None;
    for tool in &TOOLS {
        match tool.remove() {
            Ok(r) => removed |= r,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(removed), Err)
}

/// The tools (`iptables`, `ip6tables`) whose FORWARD drops without corvid's accepts.
pub fn blocked() -> Result<Vec<&'static str>> {
    let mut out = Vec::new();
    for tool in &TOOLS {
        if tool.blocks()? {
            out.push(tool.0);
        }
    }
    Ok(out)
}

/// What [`sync_bridges_allowance`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing: the rules were as wanted.
    None,
    /// Rules were added (the first bridge, or a firewall restart removed them).
    Added,
    /// The rules went with the last bridge.
    Removed,
}

/// Keeps the allowance while any corvid bridge is on this host (another stack's
/// included) and removes it with the last one.
pub fn sync_bridges_allowance(nl: &mut crate::Netlink) -> Result<Change> {
    let bridges = nl
        .links()?
        .iter()
        .any(|l| l.name.starts_with(BRIDGE_PREFIX) && l.kind == crate::link::LinkKind::Bridge);
    Ok(match bridges {
        true if allow_bridges()? => Change::Added,
        false if remove_bridges_allowance()? => Change::Removed,
        _ => Change::None,
    })
}

/// The firewall plugin's chain, as in iptables-nft's tables (where the plugin writes it
/// through netlink, `nftables::firewall`).
const FIREWALL_CHAIN: &str = "CORVID-FORWARD";

/// The legacy tools whose `filter` table is loaded in this namespace, for each family
/// (true: IPv6). Legacy tables are out of nftables' reach: only their commands change them.
fn legacy_filters() -> Vec<(Tool, bool)> {
    [
        ("/proc/net/ip_tables_names", Tool("iptables-legacy"), false),
        ("/proc/net/ip6_tables_names", Tool("ip6tables-legacy"), true),
    ]
    .into_iter()
    .filter(|(names, _, _)| {
        std::fs::read_to_string(names).is_ok_and(|t| t.lines().any(|l| l == "filter"))
    })
    .map(|(_, tool, v6)| (tool, v6))
    .collect()
}

impl Tool {
    /// The comments of the rules of `chain`, in order (empty for a rule without one).
    fn comments(&self, chain: &str) -> Result<Vec<String>> {
        let Some(o) = self.run(&["-S", chain])? else {
            return Ok(Vec::new());
        };
        Ok(String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with("-A "))
            .map(|l| {
                l.split_once("--comment ")
                    .and_then(|(_, c)| c.split_whitespace().next())
                    .unwrap_or("")
                    .trim_matches('"')
                    .to_string()
            })
            .collect())
    }

    /// Removes the rules `stale` picks from the firewall chain, and the chain and its
    /// jump once it is empty.
    fn remove_tagged(&self, stale: &dyn Fn(&str) -> bool) -> Result<()> {
        if !self.has_chain(FIREWALL_CHAIN)? {
            return Ok(());
        }
        let comments = self.comments(FIREWALL_CHAIN)?;
        // From the last: a deletion renumbers the rules after it.
        for (i, _) in comments.iter().enumerate().rev().filter(|(_, c)| stale(c)) {
            self.must(&["-D", FIREWALL_CHAIN, &(i + 1).to_string()])?;
        }
        if comments.iter().all(|c| stale(c)) {
            self.drop_chain(FIREWALL_CHAIN, &["FORWARD"])?;
        }
        Ok(())
    }
}

/// Lets a container's addresses through legacy iptables' FORWARD where its filter table
/// is loaded, as the reference's `CNI-FORWARD` does: out from them, and replies back to
/// them, in corvid's chain jumped to from the top of FORWARD; each rule carries `tag`.
pub fn allow_addresses_legacy(tag: &str, addrs: &[std::net::IpAddr]) -> Result<()> {
    let filters = legacy_filters();
    if filters.is_empty() {
        return Ok(());
    }
    let _lock = serialized()?;
    for (tool, v6) in filters {
        let family: Vec<String> = addrs
            .iter()
            .filter(|a| a.is_ipv6() == v6)
            .map(|a| a.to_string())
            .collect();
        if family.is_empty() {
            continue;
        }
        tool.ensure_chain(FIREWALL_CHAIN, tool.has_chain(FIREWALL_CHAIN)?, "FORWARD")?;
        let comment = ["-m", "comment", "--comment", tag, "-j", "ACCEPT"];
        for addr in &family {
            let established = ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"];
            for rule in [
                [&["-d", addr.as_str()][..], &established, &comment].concat(),
                [&["-s", addr.as_str()][..], &comment].concat(),
            ] {
                tool.ensure_rule(FIREWALL_CHAIN, &rule)?;
            }
        }
    }
    Ok(())
}

/// Removes the legacy iptables rules whose tag `stale` picks (a DEL's, a GC's), and the
/// chain and its jump with the last rule. Every family is tried; the first failure is
/// returned.
pub fn remove_addresses_legacy(stale: &dyn Fn(&str) -> bool) -> Result<()> {
    let filters = legacy_filters();
    if filters.is_empty() {
        return Ok(());
    }
    let _lock = serialized()?;
    let mut first_error = None;
    for (tool, _) in filters {
        if let Err(e) = tool.remove_tagged(stale) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}
