//! The tuning plugin chained after bridge, in namespaces the test makes: sysctls and
//! interface settings applied, checked and restored, bad input refused with nothing
//! changed, every version, and mixed with the reference's plugins.

mod support;

use corvid_cni::version::ALL;
use serde_json::{json, Value};
use std::path::PathBuf;
use support::*;

struct Bed {
    site: Site,
    tuning_data: tempfile::TempDir,
}

impl Bed {
    fn new() -> Bed {
        Bed {
            site: Site::new(),
            tuning_data: tempfile::tempdir().unwrap(),
        }
    }

    fn bridge_conf(&self, version: &str) -> Value {
        json!({"cniVersion": version, "name": "cvttun", "type": "bridge", "bridge": "cvtbrt",
            "isGateway": true,
            "ipam": {"type": "host-local", "subnet": "10.76.0.0/24", "dataDir": self.site.data.path()}})
    }

    fn tuning_conf(&self, version: &str, prev: &Value, extra: Value) -> String {
        let mut conf = json!({"cniVersion": version, "name": "cvttun", "type": "tuning",
            "dataDir": self.tuning_data.path(), "prevResult": prev});
        for (k, v) in extra.as_object().unwrap() {
            conf[k] = v.clone();
        }
        conf.to_string()
    }

    fn plugin(&self, name: &str, reference: bool) -> (PathBuf, String) {
        self.site.plugin(name, reference)
    }

    fn run(&self, plugin: (PathBuf, String), command: &str, ns: &TestNs, conf: &str) -> Outcome {
        self.site
            .call_with(plugin.0, &plugin.1, command, "t", &ns.path_str(), conf)
            .run()
    }

    fn bridge_add(&self, ns: &TestNs, version: &str, reference: bool) -> Value {
        let out = self.run(
            self.plugin("bridge", reference),
            "ADD",
            ns,
            &self.bridge_conf(version).to_string(),
        );
        assert!(out.success, "{}", out.stdout);
        out.json
    }

    fn backups(&self) -> usize {
        std::fs::read_dir(self.tuning_data.path()).map_or(0, |d| d.count())
    }
}

fn everything() -> Value {
    json!({"sysctl": {"net.core.somaxconn": "500", "net.ipv4.conf.IFNAME.arp_filter": "1"},
        "mac": "02:11:22:33:44:55", "mtu": 1400, "promisc": true, "allmulti": true, "txQLen": 2000})
}

fn sysctl(ns: &TestNs, key: &str) -> String {
    ns.run(|| corvid_net::sysctl::get(key)).unwrap()
}

#[test]
fn applies_checks_and_restores_on_del() {
    let bed = Bed::new();
    let c = TestNs::new();
    let r = bed.bridge_add(&c, "1.1.0", false);
    let eth0 = c.netlink().link_by_name("eth0").unwrap().unwrap();
    let conf = bed.tuning_conf("1.1.0", &r, everything());
    let out = bed.run(bed.plugin("tuning", false), "ADD", &c, &conf);
    assert!(out.success, "{}", out.stdout);
    assert_eq!(
        out.json["interfaces"][2]["mac"], "02:11:22:33:44:55",
        "the result shows the new MAC"
    );
    let now = c.netlink().link_by_name("eth0").unwrap().unwrap();
    assert_eq!(
        (
            now.mac.as_str(),
            now.mtu,
            now.promisc,
            now.allmulti,
            now.txqlen
        ),
        ("02:11:22:33:44:55", 1400, true, true, 2000)
    );
    assert_eq!(sysctl(&c, "net/core/somaxconn"), "500");
    assert_eq!(sysctl(&c, "net/ipv4/conf/eth0/arp_filter"), "1");

    let check = bed.tuning_conf("1.1.0", &out.json, everything());
    assert!(
        bed.run(bed.plugin("tuning", false), "CHECK", &c, &check)
            .success
    );
    let mut nl = c.netlink();
    nl.set_mtu(&now, 1300).unwrap();
    assert_eq!(
        bed.run(bed.plugin("tuning", false), "CHECK", &c, &check)
            .code(),
        104
    );

    assert!(
        bed.run(bed.plugin("tuning", false), "DEL", &c, &conf)
            .success
    );
    let back = c.netlink().link_by_name("eth0").unwrap().unwrap();
    assert_eq!(
        (
            back.mac.as_str(),
            back.mtu,
            back.promisc,
            back.allmulti,
            back.txqlen
        ),
        (
            eth0.mac.as_str(),
            eth0.mtu,
            eth0.promisc,
            eth0.allmulti,
            eth0.txqlen
        ),
        "DEL restores the interface"
    );
    assert_eq!(bed.backups(), 0, "the backup is gone");
    assert!(
        bed.run(bed.plugin("tuning", false), "DEL", &c, &conf)
            .success,
        "DEL twice"
    );
}

#[test]
fn every_version() {
    let bed = Bed::new();
    for version in ALL {
        let v = version.as_str();
        let c = TestNs::new();
        let r = bed.bridge_add(&c, v, false);
        let conf = bed.tuning_conf(
            v,
            &r,
            json!({"mtu": 1450, "sysctl": {"net.ipv4.conf.eth0.arp_notify": "1"}}),
        );
        let out = bed.run(bed.plugin("tuning", false), "ADD", &c, &conf);
        assert!(out.success, "{v}: {}", out.stdout);
        assert_eq!(out.json["cniVersion"], v);
        if version.allows_check() {
            let check = bed.tuning_conf(v, &out.json, json!({"mtu": 1450}));
            assert!(
                bed.run(bed.plugin("tuning", false), "CHECK", &c, &check)
                    .success,
                "{v}"
            );
        }
        assert!(
            bed.run(bed.plugin("tuning", false), "DEL", &c, &conf)
                .success,
            "{v}"
        );
        assert_eq!(
            c.netlink().link_by_name("eth0").unwrap().unwrap().mtu,
            1500,
            "{v}"
        );
    }
}

#[test]
fn bad_input_is_refused_and_a_failure_half_way_is_undone() {
    let bed = Bed::new();
    let c = TestNs::new();
    let r = bed.bridge_add(&c, "1.1.0", false);
    let before = c.netlink().link_by_name("eth0").unwrap().unwrap();
    let somaxconn = sysctl(&c, "net/core/somaxconn");
    for (extra, code) in [
        (json!({"sysctl": {"kernel.panic": "1"}}), 7),
        (json!({"sysctl": {"net/../kernel/panic": "1"}}), 7),
        (json!({"mac": "not-a-mac"}), 7),
        (json!({"mtu": 20}), 7),
        // Applied in order, then refused by the kernel: all of it is taken back.
        (
            json!({"sysctl": {"net.core.somaxconn": "777"}, "mac": "02:00:00:00:00:09", "mtu": 70000}),
            103,
        ),
    ] {
        let out = bed.run(
            bed.plugin("tuning", false),
            "ADD",
            &c,
            &bed.tuning_conf("1.1.0", &r, extra.clone()),
        );
        assert_eq!(out.code(), code, "{extra}: {}", out.stdout);
        let now = c.netlink().link_by_name("eth0").unwrap().unwrap();
        assert_eq!(
            (now.mac.as_str(), now.mtu),
            (before.mac.as_str(), before.mtu),
            "{extra}"
        );
        assert_eq!(sysctl(&c, "net/core/somaxconn"), somaxconn, "{extra}");
        assert_eq!(bed.backups(), 0, "{extra}");
    }
    // The allowlist file, as the reference reads it.
    let allow = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(allow.path(), "^net\\.core\\.\n").unwrap();
    let conf = bed.tuning_conf(
        "1.1.0",
        &r,
        json!({"sysctl": {"net.ipv4.conf.eth0.arp_filter": "1"}}),
    );
    let out = bed
        .site
        .call_with(
            bed.plugin("tuning", false).0,
            &bed.plugin("tuning", false).1,
            "ADD",
            "t",
            &c.path_str(),
            &conf,
        )
        .set(
            "CORVID_TUNING_ALLOWLIST",
            &allow.path().display().to_string(),
        )
        .run();
    assert_eq!(out.code(), 7, "{}", out.stdout);
    assert_eq!(sysctl(&c, "net/ipv4/conf/eth0/arp_filter"), "0");
}

#[test]
fn mixed_with_the_reference_both_ways() {
    for (bridge_ref, tuning_ref) in [(true, false), (false, true)] {
        let bed = Bed::new();
        let c = TestNs::new();
        let r = bed.bridge_add(&c, "1.0.0", bridge_ref);
        let conf = bed.tuning_conf(
            "1.0.0",
            &r,
            json!({"mtu": 1420, "mac": "02:aa:bb:cc:dd:ee"}),
        );
        let out = bed.run(bed.plugin("tuning", tuning_ref), "ADD", &c, &conf);
        assert!(out.success, "{}", out.stdout);
        let now = c.netlink().link_by_name("eth0").unwrap().unwrap();
        assert_eq!((now.mtu, now.mac.as_str()), (1420, "02:aa:bb:cc:dd:ee"));
        // The other side's DEL restores from the backup this side wrote.
        assert!(
            bed.run(bed.plugin("tuning", !tuning_ref), "DEL", &c, &conf)
                .success
        );
        assert_eq!(c.netlink().link_by_name("eth0").unwrap().unwrap().mtu, 1500);
    }
}

/// corvid's bridge leaves an IPv4-only container's interface with IPv6 off; tuning's
/// per-interface sysctl turns it back on, and its link-local address comes with it.
#[test]
fn ipv6_off_on_an_ipv4_only_port_comes_back_on_through_tuning() {
    let bed = Bed::new();
    let c = TestNs::new();
    let r = bed.bridge_add(&c, "1.0.0", false);
    assert_eq!(sysctl(&c, "net/ipv6/conf/eth0/disable_ipv6"), "1");
    let link_local = || {
        c.netlink().addresses(None).unwrap().iter().any(
            |(_, a)| matches!(a.addr(), std::net::IpAddr::V6(v6) if v6.segments()[0] == 0xfe80),
        )
    };
    assert!(!link_local(), "an IPv4-only port has no link-local address");
    let conf = bed.tuning_conf(
        "1.0.0",
        &r,
        json!({"sysctl": {"net.ipv6.conf.eth0.disable_ipv6": "0"}}),
    );
    let out = bed.run(bed.plugin("tuning", false), "ADD", &c, &conf);
    assert!(out.success, "{}", out.stdout);
    assert_eq!(sysctl(&c, "net/ipv6/conf/eth0/disable_ipv6"), "0");
    assert!(link_local(), "turned on, eth0 makes its link-local address");
    assert!(
        bed.run(bed.plugin("tuning", false), "DEL", &c, &conf)
            .success
    );
}
