//! The loopback plugin.

mod support;

use corvid_cni::version::ALL;
use serde_json::json;
use support::*;

#[test]
fn brings_lo_up_in_every_version() {
    let host = TestNs::new();
    let plugins = PluginDir::new();
    for version in ALL {
        let c = TestNs::new();
        let conf =
            json!({"cniVersion": version.as_str(), "name": "lo", "type": "loopback"}).to_string();
        let call = |cmd: &str, conf: &str| {
            Call::new(
                &host,
                plugins.plugin("loopback"),
                cmd,
                "c",
                &c.path_str(),
                "/nonexistent",
                conf,
            )
            .set("CNI_IFNAME", "lo")
        };
        assert!(!c.netlink().link_by_name("lo").unwrap().unwrap().up);
        let r = call("ADD", &conf).ok();
        assert!(
            c.netlink().link_by_name("lo").unwrap().unwrap().up,
            "{version}"
        );
        assert!(c.ping("127.0.0.1"), "{version}");
        if version.is_legacy_result() {
            assert_eq!(r["ip4"]["ip"], "127.0.0.1/8");
        } else {
            assert_eq!(r["interfaces"][0]["name"], "lo");
            assert_eq!(r["ips"][0]["address"], "127.0.0.1/8");
        }
        if version.allows_check() {
            let mut with_prev: serde_json::Value = serde_json::from_str(&conf).unwrap();
            with_prev["prevResult"] = r.clone();
            assert!(call("CHECK", &with_prev.to_string()).run().success);
        }
        assert!(call("DEL", &conf).run().success);
        assert!(call("DEL", &conf).set("CNI_NETNS", "").run().success);
    }
}

#[test]
fn passes_prev_result_through() {
    let host = TestNs::new();
    let plugins = PluginDir::new();
    let c = TestNs::new();
    let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.3/24"}]});
    let conf = json!({"cniVersion": "1.0.0", "name": "lo", "type": "loopback", "prevResult": prev})
        .to_string();
    let r = Call::new(
        &host,
        plugins.plugin("loopback"),
        "ADD",
        "c",
        &c.path_str(),
        "/x",
        &conf,
    )
    .ok();
    assert_eq!(r["ips"], json!([{"address": "10.1.2.3/24"}]));
}

#[test]
fn missing_namespace_is_code_3() {
    let host = TestNs::new();
    let plugins = PluginDir::new();
    let conf = json!({"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}).to_string();
    let out = Call::new(
        &host,
        plugins.plugin("loopback"),
        "ADD",
        "c",
        "/run/netns/cvt-nope",
        "/x",
        &conf,
    )
    .run();
    assert_eq!(out.code(), 3, "{}", out.stdout);
    let not_ns = Call::new(
        &host,
        plugins.plugin("loopback"),
        "ADD",
        "c",
        "/etc/hostname",
        "/x",
        &conf,
    )
    .run();
    assert_eq!(not_ns.code(), 4, "{}", not_ns.stdout);
}
