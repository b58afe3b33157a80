//! `nft list ruleset` must work wherever corvid wrote rules: it is the first command
//! anyone debugging a host runs (nft 1.0.6 once aborted on a map corvid declared). Every
//! test namespace checks it, in text and in JSON, before it is removed; where nft is not
//! installed (the link kinds' VM) there is nothing to check.

use std::path::Path;
use std::process::Command;

/// Lists the ruleset of the namespace at `netns` both ways; panics naming what failed,
/// unless the thread is already panicking (a second panic would abort the test binary).
pub fn check_ruleset_lists(netns: &Path) {
    if std::thread::panicking() {
        return;
    }
    for args in [&["list", "ruleset"][..], &["-j", "list", "ruleset"]] {
        let mut nft = Command::new("nft");
        nft.args(args);
        let Ok(ns) = corvid_net::Netns::open(netns) else {
            return;
        };
        ns.apply_to(&mut nft).expect("enter the namespace");
        let out = match nft.output() {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => panic!("nft: {e}"),
        };
        assert!(
            out.status.success(),
            "nft {} in {}: {}",
            args.join(" "),
            netns.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        if args[0] == "-j" {
            let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&out.stdout);
            assert!(
                parsed.is_ok_and(|v| v["nftables"].is_array()),
                "nft -j list ruleset in {}: {}",
                netns.display(),
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
}
