//! `nft list ruleset` must work wherever corvid wrote rules: it is the first command
//! anyone debugging a host runs (nft 1.0.6 once aborted on a map corvid declared). Every
//! test namespace checks it, in text and in JSON, before it is removed; where nft is not
//! installed (the link kinds' VM) there is nothing to check.

use std::path::Path;
use std::process::Command;

/// What is wrong with listing the ruleset of the namespace at `netns`, both ways; none
/// when both work (or nft is not there). The caller removes the namespace first and
/// panics after, so that a failed check leaves no namespace behind.
pub fn ruleset_problem(netns: &Path) -> Option<String> {
    if std::thread::panicking() {
        return None;
    }
    let ns = corvid_net::Netns::open(netns).ok()?;
    for args in [&["list", "ruleset"][..], &["-j", "list", "ruleset"]] {
        let mut nft = Command::new("nft");
        nft.args(args);
        ns.apply_to(&mut nft).expect("enter the namespace");
        let out = match nft.output() {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => return Some(format!("nft: {e}")),
        };
        let what = format!("nft {} in {}", args.join(" "), netns.display());
        if !out.status.success() {
            return Some(format!("{what}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        if args[0] == "-j" {
            let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&out.stdout);
            if !parsed.is_ok_and(|v| v["nftables"].is_array()) {
                return Some(format!("{what}: {}", String::from_utf8_lossy(&out.stdout)));
            }
        }
    }
    None
}
