//! ptp in namespaces the tests make: every version's ADD, CHECK, DEL and DEL again;
//! pods reaching their gateway, the host and each other through host routes; the same
//! routes and host addresses as the reference's ptp (Debian's), side by side; mixed with
//! the reference's host-local; masquerade; and refusals that leave nothing behind.

mod support;

use corvid_cni::version::ALL;
use serde_json::{json, Value};
use support::*;

/// ptp with host-local, `extra` fields merged in.
fn conf(version: &str, data: &std::path::Path, subnet: &str, extra: Value) -> String {
    let mut c = json!({"cniVersion": version, "name": "cvtptp", "type": "ptp",
        "ipam": {"type": "host-local", "subnet": subnet, "dataDir": data,
                 "routes": [{"dst": "0.0.0.0/0"}]}});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c.to_string()
}

fn call<'a>(
    host: &'a TestNs,
    plugin: std::path::PathBuf,
    command: &str,
    id: &str,
    pod: &TestNs,
    path: &str,
    conf: &str,
) -> Call<'a> {
    Call::new(host, plugin, command, id, &pod.path_str(), path, conf)
}

/// The routes of `ns` as `ip -j route` shows them, without what differs between two
/// runs of the same configuration (interface indexes, flags).
fn routes(ns: &TestNs, v6: bool) -> Vec<Value> {
    let out = ns
        .command("ip")
        .args(if v6 {
            vec!["-6", "-j", "route"]
        } else {
            vec!["-j", "route"]
        })
        .output()
        .unwrap();
    let mut all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    for r in &mut all {
        let o = r.as_object_mut().unwrap();
        o.retain(|k, _| {
            ["dst", "gateway", "dev", "scope", "prefsrc", "protocol"].contains(&k.as_str())
        });
        o.remove("protocol");
    }
    all.retain(|r| r["dst"] != "fe80::/64");
    all
}

/// The addresses of the veth links of `ns` (the host ends), without the link names.
fn host_addresses(ns: &TestNs) -> Vec<String> {
    let out = ns
        .command("ip")
        .args(["-j", "addr", "show", "type", "veth"])
        .output()
        .unwrap();
    let links: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut addrs: Vec<String> = links
        .iter()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["scope"] != "link")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect();
    addrs.sort();
    addrs
}

#[test]
fn add_check_del_in_every_version_and_pods_reach_each_other() {
    for version in ALL {
        let host = TestNs::new();
        let plugins = PluginDir::new();
        let data = tempfile::tempdir().unwrap();
        let path = plugins.path().display().to_string();
        let c = conf(version.as_str(), data.path(), "10.86.0.0/24", json!({}));
        let (p1, p2) = (TestNs::new(), TestNs::new());
        let r1 = call(&host, plugins.plugin("ptp"), "ADD", "c1", &p1, &path, &c).ok();
        let r2 = call(&host, plugins.plugin("ptp"), "ADD", "c2", &p2, &path, &c).ok();
        assert_eq!(r1["cniVersion"], version.as_str());
        let ip = |r: &Value| {
            if version.is_legacy_result() {
                address_part(&r["ip4"]["ip"])
            } else {
                result_ip(r, true)
            }
        };
        let (a1, a2) = (ip(&r1), ip(&r2));
        assert_ne!(a1, a2);
        assert!(
            p1.ping("10.86.0.1"),
            "{version}: the gateway on the host end"
        );
        assert!(
            p1.ping(&a2),
            "{version}: p1 does not reach p2 through the host"
        );
        assert!(host.ping(&a1), "{version}: the host does not reach p1");
        if !version.is_legacy_result() {
            assert_eq!(r1["interfaces"].as_array().unwrap().len(), 2);
            assert_eq!(r1["interfaces"][1]["sandbox"], p1.path_str());
        }
        if version.allows_check() {
            let mut with_prev: Value = serde_json::from_str(&c).unwrap();
            with_prev["prevResult"] = r1.clone();
            let checked = with_prev.to_string();
            let check = || {
                call(
                    &host,
                    plugins.plugin("ptp"),
                    "CHECK",
                    "c1",
                    &p1,
                    &path,
                    &checked,
                )
            };
            check().ok();
            // A route the result names that is gone: CHECK fails.
            assert!(p1
                .command("ip")
                .args(["route", "del", "default"])
                .status()
                .unwrap()
                .success());
            let o = check().run();
            assert!(
                !o.success,
                "{version}: CHECK passed without the default route"
            );
        }
        for (id, pod) in [("c1", &p1), ("c2", &p2)] {
            call(&host, plugins.plugin("ptp"), "DEL", id, pod, &path, &c).ok();
            call(&host, plugins.plugin("ptp"), "DEL", id, pod, &path, &c).ok();
        }
        assert!(host.veths().is_empty(), "{version}: {:?}", host.veths());
        assert!(leases(data.path(), "cvtptp").is_empty(), "{version}");
        assert!(host_addresses(&host).is_empty(), "{version}");
    }
}

#[test]
fn routes_and_host_addresses_are_the_references() {
    let plugins = PluginDir::new();
    let mut seen = Vec::new();
    for reference in [false, true] {
        let host = TestNs::new();
        let pod = TestNs::new();
        let data = tempfile::tempdir().unwrap();
        let ptp = if reference {
            std::path::Path::new(REFERENCE_DIR).join("ptp")
        } else {
            plugins.plugin("ptp")
        };
        let mut c: Value =
            serde_json::from_str(&conf("1.0.0", data.path(), "10.87.0.0/24", json!({}))).unwrap();
        c["ipam"]["ranges"] = json!([[{"subnet": "10.87.0.0/24"}], [{"subnet": "fd87::/64"}]]);
        c["ipam"]["routes"] = json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]);
        c["ipam"].as_object_mut().unwrap().remove("subnet");
        let c = c.to_string();
        let r = call(&host, ptp, "ADD", "c1", &pod, REFERENCE_DIR, &c).ok();
        seen.push((
            routes(&pod, false),
            routes(&pod, true),
            host_addresses(&host),
            r["ips"].clone(),
        ));
        assert!(pod.ping("10.87.0.1"));
    }
    let (ours, theirs) = (&seen[0], &seen[1]);
    assert_eq!(ours.0, theirs.0, "IPv4 routes in the container");
    assert_eq!(ours.1, theirs.1, "IPv6 routes in the container");
    assert_eq!(ours.2, theirs.2, "addresses on the host end");
    assert_eq!(ours.3, theirs.3, "the result's addresses");
}

#[test]
fn masquerade_and_mixed_lists_with_the_reference() {
    let host = TestNs::new();
    let plugins = PluginDir::new();
    let data = tempfile::tempdir().unwrap();
    // corvid's ptp with the reference's host-local (its directory first on CNI_PATH).
    let path = format!("{REFERENCE_DIR}:{}", plugins.path().display());
    let c = conf(
        "1.0.0",
        data.path(),
        "10.88.0.0/24",
        json!({"ipMasq": true}),
    );
    let pod = TestNs::new();
    let r = call(&host, plugins.plugin("ptp"), "ADD", "c1", &pod, &path, &c).ok();
    assert_eq!(leases(data.path(), "cvtptp"), vec![result_ip(&r, true)]);
    assert_eq!(
        host.masquerade_rules().len(),
        1,
        "{:?}",
        host.masquerade_rules()
    );
    call(&host, plugins.plugin("ptp"), "DEL", "c1", &pod, &path, &c).ok();
    assert!(host.masquerade_rules().is_empty());
    assert!(leases(data.path(), "cvtptp").is_empty());
    // The reference's ptp with corvid's host-local.
    let path = format!("{}:{REFERENCE_DIR}", plugins.path().display());
    let reference = std::path::Path::new(REFERENCE_DIR).join("ptp");
    let c = conf("1.0.0", data.path(), "10.88.0.0/24", json!({}));
    call(&host, reference.clone(), "ADD", "c2", &pod, &path, &c).ok();
    assert!(pod.ping("10.88.0.1"));
    call(&host, reference, "DEL", "c2", &pod, &path, &c).ok();
    assert!(leases(data.path(), "cvtptp").is_empty());
}

#[test]
fn refusals_change_nothing() {
    let host = TestNs::new();
    let plugins = PluginDir::new();
    let data = tempfile::tempdir().unwrap();
    let path = plugins.path().display().to_string();
    let pod = TestNs::new();
    let run = |c: &str| call(&host, plugins.plugin("ptp"), "ADD", "c1", &pod, &path, c).run();
    let no_ipam = json!({"cniVersion": "1.0.0", "name": "cvtptp", "type": "ptp"}).to_string();
    assert_eq!(run(&no_ipam).code(), 7);
    let backend = conf(
        "1.0.0",
        data.path(),
        "10.89.0.0/24",
        json!({"ipMasq": true, "ipMasqBackend": "iptables"}),
    );
    assert_eq!(run(&backend).code(), 2);
    let mtu = conf("1.0.0", data.path(), "10.89.0.0/24", json!({"mtu": 20}));
    assert_eq!(run(&mtu).code(), 7);
    // The interface name is taken in the pod: refused, and the address is not kept.
    assert!(pod
        .command("ip")
        .args(["link", "add", "eth0", "type", "veth", "peer", "name", "cvtx"])
        .status()
        .unwrap()
        .success());
    let good = conf("1.0.0", data.path(), "10.89.0.0/24", json!({}));
    let o = run(&good);
    assert!(!o.success, "{}", o.stdout);
    assert!(leases(data.path(), "cvtptp").is_empty());
    assert!(host.veths().is_empty());
    // A namespace that does not exist.
    let o = Call::new(
        &host,
        plugins.plugin("ptp"),
        "ADD",
        "c2",
        "/run/netns/cvt-none",
        &path,
        &good,
    )
    .run();
    assert!(!o.success);
    assert!(leases(data.path(), "cvtptp").is_empty());
    assert!(host.veths().is_empty());
}
