//! host-device in namespaces the tests make. The "host" has a veth end (`cvthd0`) whose peer
//! sits in a "lan" namespace. Checked:
//! - the device, found by name or MAC, moves into the container, where it
//!   reaches the lan;
//! - it comes back under its own name on DEL, and DEL again is fine;
//! - CHECK, in every version;
//! - it moves between corvid's and the reference's plugins, so either one's DEL returns
//!   what the other's ADD took;
//! - refusals leave the device where it was.

mod support;

use corvid_cni::version::ALL;
use serde_json::{json, Value};
use support::*;

/// The names of the links of `ns`.
fn links(ns: &TestNs) -> Vec<String> {
    ns.netlink()
        .links()
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .collect()
}

struct Site {
    host: TestNs,
    /// The device's segment; kept alive with the site.
    _lan: TestNs,
    plugins: PluginDir,
}

impl Site {
    fn new() -> Site {
        let (host, lan) = (TestNs::new(), TestNs::new());
        host.ip(&format!(
            "link add cvthd0 type veth peer name cvthdlan netns {}",
            lan.name
        ));
        host.ip("link set cvthd0 address 02:00:00:00:91:01");
        lan.ip("addr add 10.91.0.254/24 dev cvthdlan");
        lan.ip("link set cvthdlan up");
        Site {
            host,
            _lan: lan,
            plugins: PluginDir::new(),
        }
    }

    fn conf(version: &str, find: Value) -> String {
        let mut c = json!({"cniVersion": version, "name": "cvthd", "type": "host-device",
            "ipam": {"type": "static", "addresses": [{"address": "10.91.0.5/24"}]}});
        for (k, v) in find.as_object().unwrap() {
            c[k] = v.clone();
        }
        c.to_string()
    }

    fn call(
        &self,
        plugin: std::path::PathBuf,
        command: &str,
        pod: &TestNs,
        conf: &str,
    ) -> Call<'_> {
        let path = format!("{}:{REFERENCE_DIR}", self.plugins.path().display());
        Call::new(
            &self.host,
            plugin,
            command,
            "c1",
            &pod.path_str(),
            &path,
            conf,
        )
    }

    fn ours(&self, command: &str, pod: &TestNs, conf: &str) -> Call<'_> {
        self.call(self.plugins.plugin("host-device"), command, pod, conf)
    }
}

#[test]
fn moves_in_and_back_in_every_version() {
    for version in ALL {
        let s = Site::new();
        let pod = TestNs::new();
        let c = Site::conf(version.as_str(), json!({"device": "cvthd0"}));
        let r = s.ours("ADD", &pod, &c).ok();
        assert_eq!(r["cniVersion"], version.as_str());
        assert!(!links(&s.host).contains(&"cvthd0".to_string()), "{version}");
        assert!(
            pod.ping("10.91.0.254"),
            "{version}: the lan through the moved device"
        );
        if version.allows_check() {
            let mut with_prev: Value = serde_json::from_str(&c).unwrap();
            with_prev["prevResult"] = r.clone();
            s.ours("CHECK", &pod, &with_prev.to_string()).ok();
        }
        s.ours("DEL", &pod, &c).ok();
        s.ours("DEL", &pod, &c).ok();
        assert!(
            links(&s.host).contains(&"cvthd0".to_string()),
            "{version}: not back"
        );
        assert!(!links(&pod).contains(&"eth0".to_string()));
        let back = s.host.netlink().link_by_name("cvthd0").unwrap().unwrap();
        assert!(back.alias.is_empty(), "{version}: alias {}", back.alias);
    }
}

#[test]
fn found_by_mac() {
    let s = Site::new();
    let pod = TestNs::new();
    let c = Site::conf("1.0.0", json!({"hwaddr": "02:00:00:00:91:01"}));
    let r = s.ours("ADD", &pod, &c).ok();
    assert_eq!(r["interfaces"][0]["mac"], "02:00:00:00:91:01");
    s.ours("DEL", &pod, &c).ok();
    assert!(links(&s.host).contains(&"cvthd0".to_string()));
}

#[test]
fn the_reference_and_corvid_return_each_others_devices() {
    let s = Site::new();
    let pod = TestNs::new();
    let c = Site::conf("1.0.0", json!({"device": "cvthd0"}));
    let reference = std::path::Path::new(REFERENCE_DIR).join("host-device");
    let theirs = s.call(reference.clone(), "ADD", &pod, &c).ok();
    s.ours("DEL", &pod, &c).ok();
    assert!(
        links(&s.host).contains(&"cvthd0".to_string()),
        "corvid's DEL after the reference's ADD"
    );
    let ours = s.ours("ADD", &pod, &c).ok();
    assert_eq!(ours["interfaces"], theirs["interfaces"]);
    assert_eq!(ours["ips"], theirs["ips"]);
    s.call(reference, "DEL", &pod, &c).ok();
    assert!(
        links(&s.host).contains(&"cvthd0".to_string()),
        "the reference's DEL after corvid's ADD"
    );
}

#[test]
fn refusals_leave_the_device_where_it_was() {
    let s = Site::new();
    let pod = TestNs::new();
    for (find, code) in [
        (json!({"device": "cvtnosuch"}), 7),
        (json!({"hwaddr": "02:00:00:00:91:99"}), 7),
        (json!({"hwaddr": "nonsense"}), 7),
        (json!({"kernelpath": "relative/path"}), 7),
        (json!({}), 7),
        (json!({"pciBusID": "0000:00:1f.6"}), 2),
    ] {
        let c = Site::conf("1.0.0", find.clone());
        let o = s.ours("ADD", &pod, &c).run();
        assert!(!o.success, "took {find}");
        assert_eq!(o.code(), code, "{find}: {}", o.stdout);
        assert!(
            links(&s.host).contains(&"cvthd0".to_string()),
            "{find} moved the device"
        );
        assert!(!links(&pod).contains(&"eth0".to_string()));
    }
    // The name is taken in the container: refused, the device stays on the host.
    pod.ip("link add eth0 type veth peer name cvtx");
    let c = Site::conf("1.0.0", json!({"device": "cvthd0"}));
    assert!(!s.ours("ADD", &pod, &c).run().success);
    assert!(links(&s.host).contains(&"cvthd0".to_string()));
}
