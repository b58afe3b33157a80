//! macvlan in namespaces the tests make. The "host" has a veth (`cvtm0`) into a "lan"
//! namespace standing for the master's segment. Checked:
//! - every version's ADD and DEL;
//! - containers reaching each other (bridge mode) and the lan;
//! - private mode isolating siblings;
//! - the default-route master, `linkInContainer`, and layer 2 only;
//! - CHECK, and DEL twice;
//! - the same result and mode as the reference's macvlan;
//! - refusals that leave nothing behind.

mod support;

use corvid_cni::version::ALL;
use serde_json::{json, Value};
use support::*;

struct Segment {
    host: TestNs,
    lan: TestNs,
    plugins: PluginDir,
    data: tempfile::TempDir,
}

impl Segment {
    fn new() -> Segment {
        let (host, lan) = (TestNs::new(), TestNs::new());
        host.ip(&format!(
            "link add cvtm0 type veth peer name cvtlan0 netns {}",
            lan.name
        ));
        host.ip("link set cvtm0 up");
        host.ip("route add default dev cvtm0");
        lan.ip("addr add 10.90.1.254/24 dev cvtlan0");
        lan.ip("link set cvtlan0 up");
        Segment {
            host,
            lan,
            plugins: PluginDir::new(),
            data: tempfile::tempdir().unwrap(),
        }
    }

    fn conf(&self, version: &str, extra: Value) -> String {
        let mut c = json!({"cniVersion": version, "name": "cvtmv", "type": "macvlan",
            "master": "cvtm0",
            "ipam": {"type": "host-local", "subnet": "10.90.1.0/24", "rangeStart": "10.90.1.10",
                     "rangeEnd": "10.90.1.30", "dataDir": self.data.path()}});
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c.to_string()
    }

    fn call(&self, command: &str, id: &str, pod: &TestNs, conf: &str) -> Call<'_> {
        self.call_with(self.plugins.plugin("macvlan"), command, id, pod, conf)
    }

    fn call_with(
        &self,
        plugin: std::path::PathBuf,
        command: &str,
        id: &str,
        pod: &TestNs,
        conf: &str,
    ) -> Call<'_> {
        let path = format!("{}:{REFERENCE_DIR}", self.plugins.path().display());
        Call::new(
            &self.host,
            plugin,
            command,
            id,
            &pod.path_str(),
            &path,
            conf,
        )
    }
}

/// `ip -d -j link show DEV` in `ns`: the link's details.
fn link(ns: &TestNs, dev: &str) -> Value {
    let out = ns
        .command("ip")
        .args(["-d", "-j", "link", "show", dev])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v[0].clone()
}

#[test]
fn every_version_and_siblings_reach_each_other_and_the_segment() {
    for version in ALL {
        let s = Segment::new();
        let c = s.conf(version.as_str(), json!({}));
        let (p1, p2) = (TestNs::new(), TestNs::new());
        let r1 = s.call("ADD", "c1", &p1, &c).ok();
        s.call("ADD", "c2", &p2, &c).ok();
        assert_eq!(r1["cniVersion"], version.as_str());
        assert!(p1.ping("10.90.1.254"), "{version}: the segment");
        // host-local gives the second container the range's second address.
        assert!(p1.ping("10.90.1.11"), "{version}: the sibling");
        assert_eq!(link(&p1, "eth0")["linkinfo"]["info_data"]["mode"], "bridge");
        for (id, pod) in [("c1", &p1), ("c2", &p2)] {
            s.call("DEL", id, pod, &c).ok();
            s.call("DEL", id, pod, &c).ok();
            assert!(link(pod, "eth0").is_null(), "{version}");
        }
        assert!(leases(s.data.path(), "cvtmv").is_empty(), "{version}");
    }
}

#[test]
fn private_mode_default_master_link_in_container_and_layer_2() {
    let s = Segment::new();
    // Private: siblings do not reach each other; the segment is still reached.
    let c = s.conf("1.0.0", json!({"mode": "private"}));
    let (p1, p2) = (TestNs::new(), TestNs::new());
    s.call("ADD", "c1", &p1, &c).ok();
    s.call("ADD", "c2", &p2, &c).ok();
    assert!(p1.ping("10.90.1.254"));
    assert!(
        !p1.ping("10.90.1.11"),
        "private siblings reached each other"
    );
    assert_eq!(
        link(&p1, "eth0")["linkinfo"]["info_data"]["mode"],
        "private"
    );
    s.call("DEL", "c1", &p1, &c).ok();
    s.call("DEL", "c2", &p2, &c).ok();

    // No master: the default route's device.
    let c = s.conf("1.0.0", json!({"master": null}));
    let p3 = TestNs::new();
    s.call("ADD", "c3", &p3, &c).ok();
    assert!(p3.ping("10.90.1.254"));
    s.call("DEL", "c3", &p3, &c).ok();

    // linkInContainer: the master is a device of the container.
    let p4 = TestNs::new();
    s.lan.ip(&format!(
        "link add cvtlan1 type veth peer name cvtin0 netns {}",
        p4.name
    ));
    s.lan.ip("link set cvtlan1 up");
    s.lan.ip("addr add 10.90.2.254/24 dev cvtlan1");
    p4.ip("link set cvtin0 up");
    let mut c: Value = serde_json::from_str(&s.conf(
        "1.0.0",
        json!({"master": "cvtin0", "linkInContainer": true}),
    ))
    .unwrap();
    c["ipam"]["subnet"] = json!("10.90.2.0/24");
    c["ipam"]["rangeStart"] = json!("10.90.2.10");
    c["ipam"]["rangeEnd"] = json!("10.90.2.30");
    let c = c.to_string();
    s.call("ADD", "c4", &p4, &c).ok();
    assert!(p4.ping("10.90.2.254"));
    s.call("DEL", "c4", &p4, &c).ok();
    assert!(link(&p4, "eth0").is_null());
    assert!(
        !link(&p4, "cvtin0").is_null(),
        "the master in the container must stay"
    );

    // No IPAM: layer 2 only, up, no address.
    let c = s.conf("1.0.0", json!({"ipam": null}));
    let p5 = TestNs::new();
    let r = s.call("ADD", "c5", &p5, &c).ok();
    assert!(
        r.get("ips")
            .is_none_or(|ips| ips.as_array().is_some_and(|a| a.is_empty())),
        "{r}"
    );
    let l = link(&p5, "eth0");
    assert!(l["flags"].as_array().unwrap().contains(&json!("UP")), "{l}");
    s.call("DEL", "c5", &p5, &c).ok();
}

#[test]
fn check_del_twice_and_the_reference_side_by_side() {
    let s = Segment::new();
    let c = s.conf("1.0.0", json!({"mac": "02:00:00:00:90:01"}));
    let p1 = TestNs::new();
    let ours = s.call("ADD", "c1", &p1, &c).ok();
    assert_eq!(ours["interfaces"][0]["mac"], "02:00:00:00:90:01");
    let mut with_prev: Value = serde_json::from_str(&c).unwrap();
    with_prev["prevResult"] = ours.clone();
    s.call("CHECK", "c1", &p1, &with_prev.to_string()).ok();
    // A different MAC in the result than on the interface: CHECK fails.
    with_prev["prevResult"]["interfaces"][0]["mac"] = json!("02:00:00:00:90:99");
    assert!(
        !s.call("CHECK", "c1", &p1, &with_prev.to_string())
            .run()
            .success
    );
    s.call("DEL", "c1", &p1, &c).ok();
    s.call("DEL", "c1", &p1, &c).ok();

    // The reference's macvlan on the same configuration: the same result and link.
    let p2 = TestNs::new();
    let reference = std::path::Path::new(REFERENCE_DIR).join("macvlan");
    let theirs = s.call_with(reference.clone(), "ADD", "c2", &p2, &c).ok();
    let p3 = TestNs::new();
    let ours = s
        .call(
            "ADD",
            "c3",
            &p3,
            &c.replace("02:00:00:00:90:01", "02:00:00:00:90:02"),
        )
        .ok();
    assert_eq!(
        theirs["interfaces"][0]["name"],
        ours["interfaces"][0]["name"]
    );
    assert_eq!(theirs["ips"][0]["gateway"], ours["ips"][0]["gateway"]);
    assert_eq!(theirs["ips"][0]["interface"], ours["ips"][0]["interface"]);
    for key in ["mode", "flags"] {
        assert_eq!(
            link(&p2, "eth0")["linkinfo"]["info_data"][key],
            link(&p3, "eth0")["linkinfo"]["info_data"][key],
            "{key}"
        );
    }
    assert_eq!(link(&p2, "eth0")["mtu"], link(&p3, "eth0")["mtu"]);
    s.call_with(reference, "DEL", "c2", &p2, &c).ok();
    s.call("DEL", "c3", &p3, &c).ok();
    assert!(leases(s.data.path(), "cvtmv").is_empty());
}

#[test]
fn refusals_change_nothing() {
    let s = Segment::new();
    let pod = TestNs::new();
    for (extra, code) in [
        (json!({"master": "cvtnosuch"}), 7),
        (json!({"mode": "sideways"}), 7),
        (json!({"mtu": 9999}), 7),
        (json!({"mac": "not-a-mac"}), 7),
    ] {
        let c = s.conf("1.0.0", extra.clone());
        let o = s.call("ADD", "c1", &pod, &c).run();
        assert!(!o.success, "took {extra}");
        assert_eq!(o.code(), code, "{extra}: {}", o.stdout);
        assert!(link(&pod, "eth0").is_null(), "{extra} left an interface");
        assert!(
            leases(s.data.path(), "cvtmv").is_empty(),
            "{extra} left a lease"
        );
    }
    // An unknown CNI_ARGS key without IgnoreUnknown.
    let c = s.conf("1.0.0", json!({}));
    let o = s
        .call("ADD", "c1", &pod, &c)
        .set("CNI_ARGS", "FOO=bar")
        .run();
    assert_eq!(o.code(), 4, "{}", o.stdout);
    assert!(link(&pod, "eth0").is_null());
}
