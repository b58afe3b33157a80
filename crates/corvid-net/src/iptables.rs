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

/// corvid's chain in the `filter` table of iptables and ip6tables.
pub const CHAIN: &str = "CORVID-BRIDGES";
/// The chain dockerd leaves to users, jumped to first from FORWARD.
const DOCKER_USER: &str = "DOCKER-USER";

/// The accepts: anything leaving a corvid bridge, and replies coming back to one.
fn accepts() -> [Vec<String>; 2] {
    let bridges = format!("{BRIDGE_PREFIX}+");
    [
        vec!["-i".into(), bridges.clone()],
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
    fn run(&self, args: &[&str]) -> Result<Option<Output>, String> {
        match Command::new(self.0).arg("-w").args(args).output() {
            Ok(o) => Ok(Some(o)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", self.0)),
        }
    }

    /// Runs the tool; it must succeed.
    fn must(&self, args: &[&str]) -> Result<(), String> {
        match self.run(args)? {
            Some(o) if !o.status.success() => Err(format!(
                "{} {}: {}",
                self.0,
                args.join(" "),
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            _ => Ok(()),
        }
    }

    /// True when the command ran and succeeded (a `-C` that found its rule).
    fn holds(&self, args: &[&str]) -> Result<bool, String> {
        Ok(self.run(args)?.is_some_and(|o| o.status.success()))
    }

    fn has_chain(&self, chain: &str) -> Result<bool, String> {
        self.holds(&["-n", "-L", chain])
    }

    /// FORWARD's policy drops (dockerd's, ufw's).
    fn forward_drops(&self) -> Result<bool, String> {
        let Some(o) = self.run(&["-S", "FORWARD"])? else {
            return Ok(false);
        };
        Ok(String::from_utf8_lossy(&o.stdout)
            .lines()
            .any(|l| l == "-P FORWARD DROP"))
    }

    /// Where corvid's chain is jumped from: DOCKER-USER where dockerd runs, else FORWARD.
    fn parent(&self) -> Result<&'static str, String> {
        Ok(if self.has_chain(DOCKER_USER)? {
            DOCKER_USER
        } else {
            "FORWARD"
        })
    }

    /// FORWARD drops (its policy, or dockerd's chains) and corvid's accepts are missing.
    fn blocks(&self) -> Result<bool, String> {
        if !self.has_chain(DOCKER_USER)? && !self.forward_drops()? {
            return Ok(false);
        }
        let ok = self.has_chain(CHAIN)? && self.holds(&["-C", self.parent()?, "-j", CHAIN])?;
        Ok(!ok)
    }

    /// Adds what is missing of corvid's chain, its accepts and its jump; true when
    /// something was added.
    fn allow(&self) -> Result<bool, String> {
        let ours = self.has_chain(CHAIN)?;
        if !ours && !self.has_chain(DOCKER_USER)? && !self.forward_drops()? {
            return Ok(false);
        }
        let mut added = false;
        if !ours {
            self.must(&["-N", CHAIN])?;
            added = true;
        }
        for rule in accepts() {
            let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
            let tail = [&rule[..], &["-j", "ACCEPT"]].concat();
            if !self.holds(&[&["-C", CHAIN][..], &tail].concat())? {
                self.must(&[&["-A", CHAIN][..], &tail].concat())?;
                added = true;
            }
        }
        let parent = self.parent()?;
        if !self.holds(&["-C", parent, "-j", CHAIN])? {
            self.must(&["-I", parent, "1", "-j", CHAIN])?;
            added = true;
        }
        Ok(added)
    }

    /// Removes every jump to corvid's chain, then the chain; true when it was there.
    fn remove(&self) -> Result<bool, String> {
        if !self.has_chain(CHAIN)? {
            return Ok(false);
        }
        for parent in ["FORWARD", DOCKER_USER] {
            while self.holds(&["-C", parent, "-j", CHAIN])? {
                self.must(&["-D", parent, "-j", CHAIN])?;
            }
        }
        self.must(&["-F", CHAIN])?;
        self.must(&["-X", CHAIN])?;
        Ok(true)
    }
}

const TOOLS: [Tool; 2] = [Tool("iptables"), Tool("ip6tables")];

/// Held while the chain is looked at and changed: `iptables -w` serializes single
/// commands, not the look-then-change of two processes (two Docker DeleteNetwork calls
/// at once both saw the chain, and the second's flush failed).
fn serialized() -> Result<std::fs::File, String> {
    crate::nftables::lock().map_err(|e| e.to_string())
}

/// Lets corvid's bridges through wherever iptables filters forwarding (FORWARD's policy
/// drops, or dockerd's `DOCKER-USER` is there), adding only what is missing, so it can
/// run on every pass: a dockerd or firewall restart that removed a rule gets it back.
/// True when something was added. Nothing is done where nothing filters.
pub fn allow_bridges() -> Result<bool, String> {
    let _lock = serialized()?;
    let mut added = false;
    for tool in &TOOLS {
        added |= tool.allow()?;
    }
    Ok(added)
}

/// Removes corvid's chain and its jumps (the last corvid bridge is gone); true when
/// there was something to remove. Every tool is tried; the first failure is returned.
pub fn remove_bridges_allowance() -> Result<bool, String> {
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
pub fn blocked() -> Result<Vec<&'static str>, String> {
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
pub fn sync_bridges_allowance(nl: &mut crate::Netlink) -> Result<Change, String> {
    let bridges = nl
        .links()
        .map_err(|e| e.to_string())?
        .iter()
        .any(|l| l.name.starts_with(BRIDGE_PREFIX) && l.kind == crate::link::LinkKind::Bridge);
    Ok(match bridges {
        true if allow_bridges()? => Change::Added,
        false if remove_bridges_allowance()? => Change::Removed,
        _ => Change::None,
    })
}
