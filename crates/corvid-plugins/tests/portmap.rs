//! The portmap plugin chained after bridge, for real: published ports are reached from
//! another namespace, from the host (its own address and 127.0.0.1) and from containers
//! (hairpin), over TCP and UDP, IPv4 and IPv6; CHECK, DEL, GC and bad input; and mixed
//! with the reference's plugins both ways.

mod support;

use corvid_cni::version::ALL;
use serde_json::{json, Value};
use std::path::PathBuf;
use support::*;

const MAPPINGS: &str = r#"[{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
    {"HostPort": 8053, "ContainerPort": 53, "Protocol": "UDP", "HostIP": ""}]"#;

impl Site {
    fn bridge_conf(&self, version: &str) -> Value {
        json!({"cniVersion": version, "name": "cvtpm", "type": "bridge", "bridge": "cvtbrp",
            "isGateway": true, "ipMasq": true, "hairpinMode": true,
            "ipam": {"type": "host-local", "dataDir": self.data.path(),
                "ranges": [[{"subnet": "10.79.0.0/24"}], [{"subnet": "fd79::/64"}]],
                "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}})
    }

    fn portmap_conf(&self, version: &str, prev: &Value, mappings: &str) -> String {
        json!({"cniVersion": version, "name": "cvtpm", "type": "portmap",
            "capabilities": {"portMappings": true}, "snat": true,
            "runtimeConfig": {"portMappings": serde_json::from_str::<Value>(mappings).unwrap()},
            "prevResult": prev})
        .to_string()
    }

    fn call<'a>(
        &'a self,
        plugin: PathBuf,
        cni_path: &str,
        command: &str,
        id: &str,
        ns: &TestNs,
        conf: &str,
    ) -> Call<'a> {
        self.call_with(plugin, cni_path, command, id, &ns.path_str(), conf)
    }

    fn mine(&self, name: &str) -> (PathBuf, String) {
        (
            self.plugins.plugin(name),
            self.plugins.path().display().to_string(),
        )
    }

    /// bridge then portmap, ours unless said otherwise; the portmap's result.
    fn add(
        &self,
        id: &str,
        ns: &TestNs,
        version: &str,
        bridge: (PathBuf, String),
        portmap: (PathBuf, String),
    ) -> Value {
        let r = self
            .call(
                bridge.0,
                &bridge.1,
                "ADD",
                id,
                ns,
                &self.bridge_conf(version).to_string(),
            )
            .ok();
        let out = self
            .call(
                portmap.0,
                &portmap.1,
                "ADD",
                id,
                ns,
                &self.portmap_conf(version, &r, MAPPINGS),
            )
            .ok();
        assert_eq!(out, r, "portmap passes the result through");
        r
    }

    fn del(
        &self,
        id: &str,
        ns: &TestNs,
        version: &str,
        prev: &Value,
        bridge: (PathBuf, String),
        portmap: (PathBuf, String),
    ) {
        self.call(
            portmap.0,
            &portmap.1,
            "DEL",
            id,
            ns,
            &self.portmap_conf(version, prev, MAPPINGS),
        )
        .ok();
        let mut conf = self.bridge_conf(version);
        conf["prevResult"] = prev.clone();
        self.call(bridge.0, &bridge.1, "DEL", id, ns, &conf.to_string())
            .ok();
    }

    fn tags(&self) -> Vec<String> {
        self.host.run(|| {
            let mut nft = corvid_net::nftables::Nftables::open().unwrap();
            corvid_net::nftables::portmap::port_mapping_tags(&mut nft).unwrap()
        })
    }
}

fn reference(name: &str) -> (PathBuf, String) {
    (
        PathBuf::from(REFERENCE_DIR).join(name),
        REFERENCE_DIR.to_string(),
    )
}

#[test]
fn published_ports_are_reached_from_everywhere_and_gone_after_del() {
    let site = Site::new();
    let (c1, c2) = (TestNs::new(), TestNs::new());
    let r1 = site.add(
        "c1",
        &c1,
        "1.1.0",
        site.mine("bridge"),
        site.mine("portmap"),
    );
    site.ours(
        "bridge",
        "ADD",
        "c2",
        &c2.path_str(),
        &site.bridge_conf("1.1.0").to_string(),
    )
    .ok();
    let (tcp, udp) = (
        EchoServer::start(&c1, 80, false),
        EchoServer::start(&c1, 53, true),
    );
    for (host_addr, v6) in [("10.251.0.1", false), ("fd51::1", true)] {
        let outside = if v6 { "fd51::2" } else { "10.251.0.2" };
        // A new bridge finds IPv6 neighbours only once its own link-local address has
        // passed duplicate-address detection (a second or two): wait for the first answer.
        let started = std::time::Instant::now();
        while echo(&site.outside, host_addr, 8080, false).is_none()
            && started.elapsed() < std::time::Duration::from_secs(5)
        {}
        assert_eq!(
            echo(&site.outside, host_addr, 8080, false).as_deref(),
            Some(outside),
            "TCP from outside to {host_addr}:8080"
        );
        assert_eq!(
            echo(&site.outside, host_addr, 8053, true).as_deref(),
            Some(outside),
            "UDP from outside to {host_addr}:8053"
        );
        assert!(
            echo(&site.host, host_addr, 8080, false).is_some(),
            "from the host to {host_addr}"
        );
        assert!(
            echo(&c2, host_addr, 8080, false).is_some(),
            "from another container to {host_addr}"
        );
        assert!(
            echo(&c1, host_addr, 8080, false).is_some(),
            "hairpin to {host_addr}"
        );
    }
    assert!(
        echo(&site.host, "127.0.0.1", 8080, false).is_some(),
        "the host's localhost"
    );
    assert!(
        echo(&site.outside, "10.251.0.1", 8081, false).is_none(),
        "an unpublished port"
    );

    let check = site.ours(
        "portmap",
        "CHECK",
        "c1",
        &c1.path_str(),
        &site.portmap_conf("1.1.0", &r1, MAPPINGS),
    );
    assert!(check.run().success, "{}", check.run().stdout);
    let more = r#"[{"hostPort": 9090, "containerPort": 90}]"#;
    let broken = site
        .ours(
            "portmap",
            "CHECK",
            "c1",
            &c1.path_str(),
            &site.portmap_conf("1.1.0", &r1, more),
        )
        .run();
    assert_eq!(broken.code(), 104, "{}", broken.stdout);

    assert_eq!(
        site.tags().len(),
        6,
        "two mappings and a hairpin, each family"
    );
    site.del(
        "c1",
        &c1,
        "1.1.0",
        &r1,
        site.mine("bridge"),
        site.mine("portmap"),
    );
    assert!(site.tags().is_empty(), "{:?}", site.tags());
    assert!(
        echo(&site.outside, "10.251.0.1", 8080, false).is_none(),
        "unpublished after DEL"
    );
    // DEL again, and without prevResult or mappings: nothing to do, no error.
    site.ours(
        "portmap",
        "DEL",
        "c1",
        &c1.path_str(),
        &json!({"cniVersion": "1.1.0", "name": "cvtpm", "type": "portmap"}).to_string(),
    )
    .ok();
    drop((tcp, udp));
}

/// A DEL sent again after the address and the host ports went to another container
/// takes nothing of the new holder's: its mappings stay as its own (CHECK passes), and
/// its published port still reaches it.
#[test]
fn a_stale_del_leaves_the_next_holder_of_the_ports_alone() {
    let site = Site::new();
    let mut bridge = site.bridge_conf("1.1.0");
    bridge["ipam"]["ranges"] =
        single_address_ranges(&[("10.79.0.0/24", "10.79.0.9"), ("fd79::/64", "fd79::9")]);
    let bridge = bridge.to_string();
    let portmap = |prev: Option<&Value>| {
        with_prev_result(&site.portmap_conf("1.1.0", &Value::Null, MAPPINGS), prev)
    };
    let (b, rb) = repeat_a_stale_del(
        |id, ns| {
            let (plugin, cni_path) = site.mine("bridge");
            let r = site.call(plugin, &cni_path, "ADD", id, ns, &bridge).ok();
            let (plugin, cni_path) = site.mine("portmap");
            site.call(plugin, &cni_path, "ADD", id, ns, &portmap(Some(&r)))
                .ok();
            r
        },
        |id, netns, prev| {
            site.ours("portmap", "DEL", id, netns, &portmap(prev)).ok();
            site.ours("bridge", "DEL", id, netns, &with_prev_result(&bridge, prev))
                .ok();
        },
    );
    let tag = corvid_net::nftables::AttachmentTag::new("cvtpm", "b", "eth0");
    assert_eq!(
        site.tags(),
        [tag.as_str(); 6],
        "two mappings and a hairpin, each family"
    );
    let check = site
        .ours("portmap", "CHECK", "b", &b.path_str(), &portmap(Some(&rb)))
        .run();
    assert!(check.success, "b's mappings are whole: {}", check.stdout);
    let _server = EchoServer::start(&b, 80, false);
    assert_eq!(
        echo(&site.outside, "10.251.0.1", 8080, false).as_deref(),
        Some("10.251.0.2"),
        "b's published port reaches b"
    );
}

#[test]
fn every_version_adds_checks_and_deletes() {
    let site = Site::new();
    for version in ALL {
        let v = version.as_str();
        let c = TestNs::new();
        let r = site.add("v", &c, v, site.mine("bridge"), site.mine("portmap"));
        assert!(!site.tags().is_empty(), "{v}");
        if version.allows_check() {
            let check = site.ours(
                "portmap",
                "CHECK",
                "v",
                &c.path_str(),
                &site.portmap_conf(v, &r, MAPPINGS),
            );
            assert!(check.run().success, "{v}: {}", check.run().stdout);
        }
        site.del("v", &c, v, &r, site.mine("bridge"), site.mine("portmap"));
        assert!(site.tags().is_empty(), "{v}");
    }
}

#[test]
fn gc_keeps_only_valid_attachments() {
    let site = Site::new();
    let (c1, c2) = (TestNs::new(), TestNs::new());
    site.add(
        "keep",
        &c1,
        "1.1.0",
        site.mine("bridge"),
        site.mine("portmap"),
    );
    let other = r#"[{"hostPort": 7070, "containerPort": 70}]"#;
    let r2 = site
        .ours(
            "bridge",
            "ADD",
            "drop",
            &c2.path_str(),
            &site.bridge_conf("1.1.0").to_string(),
        )
        .ok();
    site.ours(
        "portmap",
        "ADD",
        "drop",
        &c2.path_str(),
        &site.portmap_conf("1.1.0", &r2, other),
    )
    .ok();
    let before = site.tags().len();
    let gc = json!({"cniVersion": "1.1.0", "name": "cvtpm", "type": "portmap",
        "cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"}]});
    site.ours("portmap", "GC", "", &c1.path_str(), &gc.to_string())
        .unset("CNI_CONTAINERID")
        .unset("CNI_IFNAME")
        .ok();
    assert_eq!(
        site.tags().len(),
        before - 4,
        "the dropped container's mapping and hairpin"
    );
    let _server = EchoServer::start(&c1, 80, false);
    assert!(
        echo(&site.outside, "10.251.0.1", 8080, false).is_some(),
        "the kept one still works"
    );
}

#[test]
fn bad_mappings_are_refused_and_change_nothing() {
    let site = Site::new();
    let c = TestNs::new();
    let r = site
        .ours(
            "bridge",
            "ADD",
            "b",
            &c.path_str(),
            &site.bridge_conf("1.1.0").to_string(),
        )
        .ok();
    for (bad, code) in [
        (r#"[{"hostPort": 0, "containerPort": 80}]"#, 7),
        (r#"[{"hostPort": 80, "containerPort": 65536}]"#, 7),
        (
            r#"[{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}]"#,
            7,
        ),
        (
            r#"[{"hostPort": 80, "containerPort": 80, "hostIP": "not-an-ip"}]"#,
            7,
        ),
        (r#"{"hostPort": 80}"#, 7),
    ] {
        let out = site
            .ours(
                "portmap",
                "ADD",
                "b",
                &c.path_str(),
                &site.portmap_conf("1.1.0", &r, bad),
            )
            .run();
        assert_eq!(out.code(), code, "{bad}: {}", out.stdout);
        assert!(out.json["msg"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let mut iptables: Value =
        serde_json::from_str(&site.portmap_conf("1.1.0", &r, MAPPINGS)).unwrap();
    iptables["backend"] = json!("ebpf");
    let out = site
        .ours("portmap", "ADD", "b", &c.path_str(), &iptables.to_string())
        .run();
    assert_eq!(out.code(), 2, "{}", out.stdout);
    let alone = json!({"cniVersion": "1.1.0", "name": "cvtpm", "type": "portmap",
        "runtimeConfig": {"portMappings": serde_json::from_str::<Value>(MAPPINGS).unwrap()}});
    let out = site
        .ours("portmap", "ADD", "b", &c.path_str(), &alone.to_string())
        .run();
    assert_eq!(out.code(), 7, "not chained: {}", out.stdout);
    assert!(site.tags().is_empty(), "nothing was published");
}

#[test]
fn mixed_with_the_reference_both_ways() {
    let site = Site::new();
    // The reference's bridge, then corvid's portmap.
    let c1 = TestNs::new();
    let r1 = site.add(
        "m1",
        &c1,
        "1.0.0",
        reference("bridge"),
        site.mine("portmap"),
    );
    let server = EchoServer::start(&c1, 80, false);
    assert!(
        echo(&site.outside, "10.251.0.1", 8080, false).is_some(),
        "reference bridge, corvid portmap"
    );
    drop(server);
    site.del(
        "m1",
        &c1,
        "1.0.0",
        &r1,
        reference("bridge"),
        site.mine("portmap"),
    );
    assert!(site.tags().is_empty());
    // corvid's bridge, then the reference's portmap.
    let c2 = TestNs::new();
    let r2 = site.add(
        "m2",
        &c2,
        "1.0.0",
        site.mine("bridge"),
        reference("portmap"),
    );
    let server = EchoServer::start(&c2, 80, false);
    assert!(
        echo(&site.outside, "10.251.0.1", 8080, false).is_some(),
        "corvid bridge, reference portmap"
    );
    drop(server);
    site.del(
        "m2",
        &c2,
        "1.0.0",
        &r2,
        site.mine("bridge"),
        reference("portmap"),
    );
    assert!(echo(&site.outside, "10.251.0.1", 8080, false).is_none());
}
