//! Docker sets the FORWARD policy to DROP and turns on `bridge-nf-call-iptables` in the
//! namespace it runs in, so even traffic between two ports of one corvid bridge is
//! dropped unless allowed. Docker keeps the `DOCKER-USER` chain for rules like these and
//! never flushes it; the driver puts its two rules there, as Docker does for its own
//! bridges in FORWARD.

use std::process::Command;

/// Marks the rules as corvid's, for whoever reads `iptables -S`.
const COMMENT: &str = "corvid bridges";

/// The rules: anything leaving a corvid bridge, and replies coming back to one.
fn rules() -> [Vec<&'static str>; 2] {
    [
        vec!["-i", "cvb+"],
        vec![
            "-o",
            "cvb+",
            "-m",
            "conntrack",
            "--ctstate",
            "RELATED,ESTABLISHED",
        ],
    ]
}

fn iptables(op: &str, rule: &[&str]) -> std::io::Result<std::process::Output> {
    Command::new("iptables")
        .args(["-w", op, "DOCKER-USER"])
        .args(rule)
        .args(["-m", "comment", "--comment", COMMENT, "-j", "ACCEPT"])
        .output()
}

/// Lets corvid's bridges past Docker's FORWARD policy. Without `iptables` or without a
/// `DOCKER-USER` chain (dockerd run with `--iptables=false`) nothing filters the bridges
/// and nothing is needed; that is not an error.
pub fn allow_corvid_bridges() -> Result<(), String> {
    let chain = Command::new("iptables")
        .args(["-w", "-n", "-L", "DOCKER-USER"])
        .output();
    if !matches!(chain, Ok(o) if o.status.success()) {
        return Ok(());
    }
    for rule in rules() {
        let present = iptables("-C", &rule).map_err(|e| format!("iptables: {e}"))?;
        if present.status.success() {
            continue;
        }
        let out = iptables("-I", &rule).map_err(|e| format!("iptables: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "iptables -I DOCKER-USER {}: {}",
                rule.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    Ok(())
}
