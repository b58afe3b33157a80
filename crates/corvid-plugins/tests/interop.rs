//! Interop with the reference plugins (Debian's containernetworking-plugins): our bridge
//! with their host-local, their bridge with our host-local, one lease directory for both.

mod support;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use support::*;

fn reference(name: &str) -> PathBuf {
    let p = Path::new(REFERENCE_DIR).join(name);
    assert!(
        p.exists(),
        "{} missing: install Debian's containernetworking-plugins",
        p.display()
    );
    p
}

fn conf(network: &str, bridge: &str, subnet: &str, data: &Path, masq: bool) -> String {
    json!({"cniVersion": "1.0.0", "name": network, "type": "bridge", "bridge": bridge,
           "isGateway": true, "ipMasq": masq,
           "ipam": {"type": "host-local", "subnet": subnet, "dataDir": data}})
    .to_string()
}

fn attach_two_and_detach(bridge_plugin: PathBuf, cni_path: &str, masq: bool) {
    let host = TestNs::new();
    let data = tempfile::tempdir().unwrap();
    let conf = conf("cvtinterop", "cvtbri", "10.90.0.0/24", data.path(), masq);
    let (c1, c2) = (TestNs::new(), TestNs::new());
    let call = |cmd: &str, id: &str, ns: &TestNs, conf: &str| {
        Call::new(
            &host,
            bridge_plugin.clone(),
            cmd,
            id,
            &ns.path_str(),
            cni_path,
            conf,
        )
    };
    let r1 = call("ADD", "i1", &c1, &conf).ok();
    let r2 = call("ADD", "i2", &c2, &conf).ok();
    assert!(c1.ping(&result_ip(&r2, true)));
    assert!(c2.ping("10.90.0.1"));
    let mut with_prev: Value = serde_json::from_str(&conf).unwrap();
    with_prev["prevResult"] = r1;
    let check = call("CHECK", "i1", &c1, &with_prev.to_string()).run();
    assert!(check.success, "{}", check.stdout);
    assert_eq!(leases(data.path(), "cvtinterop").len(), 2);
    call("DEL", "i1", &c1, &with_prev.to_string()).ok();
    call("DEL", "i2", &c2, &conf).ok();
    assert!(leases(data.path(), "cvtinterop").is_empty());
    assert!(host.veths().is_empty());
    assert!(host.masquerade_rules().is_empty());
}

#[test]
fn our_bridge_with_their_host_local() {
    reference("host-local");
    let plugins = PluginDir::new();
    attach_two_and_detach(plugins.plugin("bridge"), REFERENCE_DIR, true);
}

#[test]
fn their_bridge_with_our_host_local() {
    let plugins = PluginDir::new();
    attach_two_and_detach(
        reference("bridge"),
        &plugins.path().display().to_string(),
        false,
    );
}

#[test]
fn one_lease_directory_for_both() {
    let host = TestNs::new();
    let plugins = PluginDir::new();
    let data = tempfile::tempdir().unwrap();
    let conf = conf("cvtshared", "cvtbrs", "10.91.0.0/24", data.path(), false);
    let ipam = |plugin: PathBuf, cmd: &str, id: &str| {
        Call::new(
            &host,
            plugin,
            cmd,
            id,
            "/run/netns/unused",
            "/nonexistent",
            &conf,
        )
    };
    let (theirs, ours) = (reference("host-local"), plugins.plugin("host-local"));
    let addr = |v: Value| v["ips"][0]["address"].as_str().unwrap().to_string();
    assert_eq!(addr(ipam(theirs.clone(), "ADD", "a").ok()), "10.91.0.2/24");
    assert_eq!(
        addr(ipam(ours.clone(), "ADD", "b").ok()),
        "10.91.0.3/24",
        "we continue their rotation"
    );
    assert_eq!(
        addr(ipam(theirs.clone(), "ADD", "c").ok()),
        "10.91.0.4/24",
        "they continue ours"
    );
    ipam(ours.clone(), "DEL", "a").ok();
    ipam(theirs.clone(), "DEL", "b").ok();
    assert_eq!(leases(data.path(), "cvtshared"), ["10.91.0.4"]);

    // Both at once on one directory: the shared lock keeps every address distinct.
    let children: Vec<_> = (0..24)
        .map(|i| {
            let plugin = if i % 2 == 0 {
                theirs.clone()
            } else {
                ours.clone()
            };
            ipam(plugin, "ADD", &format!("m{i}")).spawn()
        })
        .collect();
    let mut got: Vec<String> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
            addr(serde_json::from_slice(&out.stdout).unwrap())
        })
        .collect();
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 24);
    assert_eq!(leases(data.path(), "cvtshared").len(), 25);
    for i in 0..24 {
        let plugin = if i % 2 == 0 {
            ours.clone()
        } else {
            theirs.clone()
        };
        ipam(plugin, "DEL", &format!("m{i}")).ok();
    }
    ipam(ours, "DEL", "c").ok();
    assert!(leases(data.path(), "cvtshared").is_empty());
}
