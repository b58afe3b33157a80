//! The bridge plugin with host-local, for real, in namespaces the tests create.

mod support;

use corvid_cni::version::ALL;
use serde_json::{json, Value};
use support::*;

struct Net {
    host: TestNs,
    plugins: PluginDir,
    data: tempfile::TempDir,
    conf: String,
}

impl Net {
    fn new(version: &str, extra: &str) -> Net {
        let host = TestNs::new();
        let plugins = PluginDir::new();
        let data = tempfile::tempdir().unwrap();
        let conf = bridge_conf(
            version,
            "cvtnet",
            "cvtbr0",
            "10.77.0.0/24",
            data.path(),
            extra,
        );
        Net {
            host,
            plugins,
            data,
            conf,
        }
    }

    fn call(&self, command: &str, id: &str, ns: &TestNs) -> Call<'_> {
        self.call_with(command, id, &ns.path_str(), &self.conf)
    }

    fn call_with(&self, command: &str, id: &str, netns: &str, conf: &str) -> Call<'_> {
        Call::new(
            &self.host,
            self.plugins.plugin("bridge"),
            command,
            id,
            netns,
            &self.plugins.path().display().to_string(),
            conf,
        )
    }

    fn with_prev(&self, prev: &Value) -> String {
        let mut c: Value = serde_json::from_str(&self.conf).unwrap();
        c["prevResult"] = prev.clone();
        c.to_string()
    }

    fn leases(&self) -> Vec<String> {
        leases(self.data.path(), "cvtnet")
    }

    /// Nothing of any container is left: no veth, no lease, no masquerade rule.
    fn assert_clean(&self) {
        assert_eq!(
            self.host.veths(),
            Vec::<String>::new(),
            "veths left on the host"
        );
        assert_eq!(self.leases(), Vec::<String>::new(), "leases left");
        assert_eq!(
            self.host.masquerade_rules(),
            Vec::<String>::new(),
            "masquerade rules left"
        );
    }
}

#[test]
fn two_containers_talk_check_and_del_for_every_version() {
    for version in ALL {
        let v = version.as_str();
        let net = Net::new(v, "");
        let (c1, c2) = (TestNs::new(), TestNs::new());
        let r1 = net.call("ADD", "c1", &c1).ok();
        let r2 = net.call("ADD", "c2", &c2).ok();
        assert_eq!(r1["cniVersion"], v);
        let (a1, a2) = if version.is_legacy_result() {
            let ip = |r: &Value| address_part(&r["ip4"]["ip"]);
            (ip(&r1), ip(&r2))
        } else {
            assert_eq!(r1["interfaces"][2]["sandbox"], c1.path_str());
            assert_eq!(r1["ips"][0]["interface"], 2);
            let eth0 = c1.netlink().link_by_name("eth0").unwrap().unwrap();
            assert_eq!(r1["interfaces"][2]["mac"], eth0.mac.as_str(), "{v}");
            let host_end = net.host.netlink().link_by_index(eth0.peer_index.unwrap());
            let host_end = host_end.unwrap().unwrap();
            assert_eq!(r1["interfaces"][1]["name"], host_end.name.as_str(), "{v}");
            assert_eq!(r1["interfaces"][1]["mac"], host_end.mac.as_str(), "{v}");
            (result_ip(&r1, true), result_ip(&r2, true))
        };
        assert_ne!(a1, a2);
        assert!(c1.ping(&a2), "{v}: c1 cannot reach c2 at {a2}");
        assert!(c2.ping(&a1), "{v}: c2 cannot reach c1 at {a1}");
        assert!(c1.ping("10.77.0.1"), "{v}: c1 cannot reach the gateway");
        assert!(net.host.ping(&a1), "{v}: the host cannot reach c1");
        assert_eq!(net.host.masquerade_rules().len(), 2, "{v}");

        if version.allows_check() {
            let check = net.call_with("CHECK", "c1", &c1.path_str(), &net.with_prev(&r1));
            assert!(
                check.run().success,
                "{v}: CHECK of a healthy container failed"
            );
            // CHECK notices an address taken away.
            let mut nl = c1.netlink();
            let eth0 = nl.link_by_name("eth0").unwrap().unwrap();
            nl.delete_address(eth0.index, &format!("{a1}/24").parse().unwrap())
                .unwrap();
            let broken = check.run();
            assert!(!broken.success, "{v}: CHECK missed a missing address");
            assert_eq!(broken.code(), 104);
        }

        for (id, ns) in [("c1", &c1), ("c2", &c2)] {
            net.call("DEL", id, ns).ok();
            net.call("DEL", id, ns).ok();
        }
        net.assert_clean();
        let bridge = net.host.netlink().link_by_name("cvtbr0").unwrap();
        assert!(bridge.is_some(), "the bridge is shared and stays");
    }
}

#[test]
fn dual_stack_in_one_call() {
    let host = TestNs::new();
    let plugins = PluginDir::new();
    let data = tempfile::tempdir().unwrap();
    let conf = format!(
        r#"{{"cniVersion":"1.1.0","name":"cvtdual","type":"bridge","bridge":"cvtbr6","isDefaultGateway":true,
            "ipam":{{"type":"host-local","dataDir":"{}","ranges":[[{{"subnet":"10.78.0.0/24"}}],[{{"subnet":"fd77::/64"}}]]}}}}"#,
        data.path().display()
    );
    let (c1, c2) = (TestNs::new(), TestNs::new());
    let call = |id: &str, ns: &TestNs| {
        Call::new(
            &host,
            plugins.plugin("bridge"),
            "ADD",
            id,
            &ns.path_str(),
            &plugins.path().display().to_string(),
            &conf,
        )
    };
    let r1 = call("c1", &c1).ok();
    let r2 = call("c2", &c2).ok();
    assert_eq!(r1["ips"].as_array().unwrap().len(), 2);
    let routes: Vec<&str> = r1["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["dst"].as_str().unwrap())
        .collect();
    assert_eq!(routes, ["0.0.0.0/0", "::/0"]);
    assert!(c1.ping(&result_ip(&r2, false)), "IPv6 between containers");
    assert!(c1.ping(&result_ip(&r2, true)), "IPv4 between containers");
    assert!(c1.ping("fd77::1"), "IPv6 gateway");
    assert_eq!(leases(data.path(), "cvtdual").len(), 4);
}

#[test]
fn del_succeeds_when_the_namespace_is_gone() {
    let net = Net::new("1.0.0", "");
    let c1 = TestNs::new();
    let added = net.call("ADD", "gone", &c1).ok();
    let path = c1.path_str();
    drop(c1);
    // As a 1.0 runtime sends it: the namespace path of a deleted namespace, prevResult.
    net.call_with("DEL", "gone", &path, &net.with_prev(&added))
        .ok();
    // As containerd sends the second one: no namespace, no prevResult.
    net.call_with("DEL", "gone", "", &net.conf).ok();
    net.assert_clean();
}

#[test]
fn an_add_killed_at_any_moment_is_cleaned_by_del() {
    let net = Net::new("1.0.0", "");
    for step in 0..16u64 {
        let c = TestNs::new();
        let id = format!("killed{step}");
        let mut child = net.call("ADD", &id, &c).spawn();
        std::thread::sleep(std::time::Duration::from_micros(step * 1000));
        let _ = child.kill();
        let _ = child.wait();
        net.call("DEL", &id, &c).ok();
        assert!(
            c.veths().is_empty(),
            "step {step}: veth left in the container"
        );
        net.assert_clean();
    }
    // A fresh ADD still works after all of that.
    let c = TestNs::new();
    let r = net.call("ADD", "after", &c).ok();
    assert!(net.host.ping(&result_ip(&r, true)));
}

#[test]
fn sixty_four_parallel_adds_get_distinct_reachable_addresses() {
    let net = Net::new("1.0.0", "");
    let containers: Vec<TestNs> = (0..64).map(|_| TestNs::new()).collect();
    let children: Vec<_> = containers
        .iter()
        .enumerate()
        .map(|(i, c)| net.call("ADD", &format!("p{i}"), c).spawn())
        .collect();
    let mut addrs = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        addrs.push(result_ip(&v, true));
    }
    let mut distinct = addrs.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 64);
    for a in &addrs {
        assert!(net.host.ping(a), "{a} unreachable");
    }
    assert_eq!(net.leases().len(), 64);
    let children: Vec<_> = containers
        .iter()
        .enumerate()
        .map(|(i, c)| net.call("DEL", &format!("p{i}"), c).spawn())
        .collect();
    for child in children {
        assert!(child.wait_with_output().unwrap().status.success());
    }
    net.assert_clean();
}

#[test]
fn bad_input_is_refused_with_the_right_code_and_changes_nothing() {
    let net = Net::new("1.0.0", "");
    let c = TestNs::new();
    let good: Value = serde_json::from_str(&net.conf).unwrap();
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v);
        v.to_string()
    };
    let cases: Vec<(&str, Call, u64)> = vec![
        (
            "malformed JSON",
            net.call_with("ADD", "b", &c.path_str(), "{\"cniVersion\":"),
            6,
        ),
        (
            "no name",
            net.call_with(
                "ADD",
                "b",
                &c.path_str(),
                &edit(&|v| {
                    v.as_object_mut().unwrap().remove("name");
                }),
            ),
            7,
        ),
        (
            "no type",
            net.call_with(
                "ADD",
                "b",
                &c.path_str(),
                &edit(&|v| {
                    v.as_object_mut().unwrap().remove("type");
                }),
            ),
            7,
        ),
        (
            // No cniVersion at all is 0.1.0, as libcni reads it (tests/no_version.rs).
            "a cniVersion that is no string",
            net.call_with(
                "ADD",
                "b",
                &c.path_str(),
                &edit(&|v| v["cniVersion"] = json!(1)),
            ),
            7,
        ),
        (
            "unsupported version",
            net.call_with(
                "ADD",
                "b",
                &c.path_str(),
                &edit(&|v| v["cniVersion"] = json!("0.9.9")),
            ),
            1,
        ),
        ("unknown command", net.call("FROB", "b", &c), 4),
        (
            "macspoofchk asked for",
            net.call_with(
                "ADD",
                "b",
                &c.path_str(),
                &edit(&|v| v["macspoofchk"] = json!(true)),
            ),
            2,
        ),
        (
            "a VLAN trunk asked for",
            net.call_with(
                "ADD",
                "b",
                &c.path_str(),
                &edit(&|v| v["vlanTrunk"] = json!([{"id": 101}])),
            ),
            2,
        ),
        (
            "enabledad asked for",
            net.call_with(
                "ADD",
                "b",
                &c.path_str(),
                &edit(&|v| v["enabledad"] = json!(true)),
            ),
            2,
        ),
        (
            "the iptables masquerade backend asked for",
            net.call_with(
                "ADD",
                "b",
                &c.path_str(),
                &edit(&|v| v["ipMasqBackend"] = json!("iptables")),
            ),
            2,
        ),
        (
            "ADD without CNI_NETNS",
            net.call("ADD", "b", &c).unset("CNI_NETNS"),
            4,
        ),
        (
            "namespace that does not exist",
            net.call_with("ADD", "b", "/run/netns/cvt-no-such-ns", &net.conf),
            3,
        ),
        (
            "interface name with a slash",
            net.call("ADD", "b", &c).set("CNI_IFNAME", "et/h0"),
            4,
        ),
        (
            "interface name too long",
            net.call("ADD", "b", &c)
                .set("CNI_IFNAME", "abcdefghijklmnop"),
            4,
        ),
        (
            "rangeStart outside the subnet",
            net.call_with(
                "ADD",
                "b",
                &c.path_str(),
                &edit(&|v| v["ipam"]["rangeStart"] = json!("10.1.2.3")),
            ),
            7,
        ),
        (
            "prevResult of the wrong shape",
            net.call_with(
                "ADD",
                "b",
                &c.path_str(),
                &edit(&|v| v["prevResult"] = json!({"ips": [{"address": 5}]})),
            ),
            6,
        ),
        (
            "bridge name too long",
            net.call_with(
                "ADD",
                "b",
                &c.path_str(),
                &edit(&|v| v["bridge"] = json!("a-very-long-bridge-name")),
            ),
            7,
        ),
        (
            "IPAM plugin missing",
            net.call_with(
                "ADD",
                "b",
                &c.path_str(),
                &edit(&|v| v["ipam"]["type"] = json!("no-such-ipam")),
            ),
            105,
        ),
    ];
    for (what, call, code) in cases {
        let out = call.run();
        assert!(!out.success, "{what}: succeeded");
        assert_eq!(out.code(), code, "{what}: {}", out.stdout);
        assert!(
            out.json["msg"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: no message"
        );
        assert!(c.veths().is_empty(), "{what}: veth left in the container");
        net.assert_clean();
    }

    // An interface name already taken in the namespace.
    let first = net.call("ADD", "taken", &c).ok();
    let again = net.call("ADD", "other", &c).run();
    assert_eq!(again.code(), 102, "{}", again.stdout);
    assert_eq!(net.leases().len(), 1, "the refused ADD left a lease");
    assert_eq!(net.host.veths().len(), 1);
    net.call("DEL", "taken", &c).ok();
    assert!(first["ips"].is_array());

    // An exhausted subnet: a /30 has one address besides the gateway.
    let small = edit(&|v| v["ipam"]["subnet"] = json!("10.79.0.0/30"));
    let (c1, c2) = (TestNs::new(), TestNs::new());
    net.call_with("ADD", "s1", &c1.path_str(), &small).ok();
    let full = net.call_with("ADD", "s2", &c2.path_str(), &small).run();
    assert_eq!(full.code(), 100, "{}", full.stdout);
    assert!(c2.veths().is_empty(), "exhausted ADD left its veth");
    assert_eq!(net.host.veths().len(), 1);
    net.call_with("DEL", "s1", &c1.path_str(), &small).ok();
    net.assert_clean();
}

#[test]
fn options_hairpin_promisc_mtu_vlan_and_prev_result() {
    let net = Net::new(
        "1.0.0",
        r#","hairpinMode":true,"promiscMode":true,"mtu":1400,"isDefaultGateway":true,"dns":{"nameservers":["10.77.0.53"]}"#,
    );
    let c = TestNs::new();
    let prev = json!({"cniVersion":"1.0.0","interfaces":[{"name":"dummy"}],
        "ips":[{"address":"192.0.2.9/24","interface":0}]});
    let r = net
        .call_with("ADD", "opt", &c.path_str(), &net.with_prev(&prev))
        .ok();
    assert_eq!(r["interfaces"][0]["name"], "dummy", "prevResult kept");
    assert_eq!(r["dns"]["nameservers"], json!(["10.77.0.53"]));
    assert_eq!(r["interfaces"].as_array().unwrap().len(), 4);
    assert_eq!(
        r["ips"][1]["interface"], 3,
        "our address points at our interface"
    );
    let mut nl = net.host.netlink();
    let br = nl.link_by_name("cvtbr0").unwrap().unwrap();
    assert!(br.promisc);
    let host_veth = nl
        .link_by_name(r["interfaces"][2]["name"].as_str().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(host_veth.mtu, 1400);
    assert_eq!(host_veth.master, Some(br.index));
    let eth0 = c.netlink().link_by_name("eth0").unwrap().unwrap();
    assert_eq!(eth0.mtu, 1400);
    let detail = String::from_utf8(
        net.host
            .command("ip")
            .args(["-d", "link", "show", &host_veth.name])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(detail.contains("hairpin on"), "{detail}");
    // CHECK with routes (the default route) and a foreign plugin's interface in the result.
    let check = net.call_with("CHECK", "opt", &c.path_str(), &net.with_prev(&r));
    assert!(check.run().success, "{}", check.run().stdout);
    let mut nl = c.netlink();
    let eth0 = nl.link_by_name("eth0").unwrap().unwrap();
    nl.delete_address(
        eth0.index,
        &r["ips"][1]["address"].as_str().unwrap().parse().unwrap(),
    )
    .unwrap();
    assert_eq!(
        check.run().code(),
        104,
        "the default route went with the address"
    );
    net.call("DEL", "opt", &c).ok();
    net.assert_clean();
}

#[test]
fn vlan_tags_the_port() {
    let probe = TestNs::new();
    let mut nl = probe.netlink();
    if let Err(e) = nl.add_bridge("cvtprobe", None, true, None, true) {
        assert_eq!(e.errno(), Some(libc::EOPNOTSUPP), "{e}");
        eprintln!(
            "skipped: this kernel has no bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING)"
        );
        let net = Net::new("1.0.0", r#","vlan":42"#);
        let c = TestNs::new();
        let out = net.call("ADD", "v", &c).run();
        assert!(
            out.json["msg"]
                .as_str()
                .unwrap()
                .contains("CONFIG_BRIDGE_VLAN_FILTERING"),
            "{}",
            out.stdout
        );
        assert!(c.veths().is_empty());
        net.assert_clean();
        return;
    }
    let net = Net::new("1.0.0", r#","vlan":42"#);
    let c = TestNs::new();
    let r = net.call("ADD", "v", &c).ok();
    let port = r["interfaces"][1]["name"].as_str().unwrap().to_string();
    let vlans = String::from_utf8(
        net.host
            .command("bridge")
            .args(["-j", "vlan", "show", "dev", &port])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        vlans.contains("\"vlan\":42"),
        "vlan 42 on the port: {vlans}"
    );
    net.call("DEL", "v", &c).ok();
    net.assert_clean();
}

#[test]
fn gc_releases_what_is_not_valid() {
    let net = Net::new("1.1.0", "");
    let (c1, c2) = (TestNs::new(), TestNs::new());
    net.call("ADD", "keep", &c1).ok();
    net.call("ADD", "drop", &c2).ok();
    let mut conf: Value = serde_json::from_str(&net.conf).unwrap();
    conf["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "eth0"}]);
    net.call_with("GC", "", "", &conf.to_string())
        .unset("CNI_CONTAINERID")
        .unset("CNI_IFNAME")
        .ok();
    assert_eq!(net.leases().len(), 1);
    assert_eq!(net.host.masquerade_rules().len(), 1);
    let status = net
        .call_with("STATUS", "", "", &net.conf)
        .unset("CNI_NETNS")
        .run();
    assert!(status.success, "{}", status.stdout);
}

#[test]
fn force_address_replaces_a_foreign_gateway() {
    let net = Net::new("1.0.0", "");
    let mut nl = net.host.netlink();
    nl.add_bridge("cvtbr0", None, false, None, true).unwrap();
    let br = nl.link_by_name("cvtbr0").unwrap().unwrap();
    let foreign: ipnet::IpNet = "10.77.0.250/24".parse().unwrap();
    nl.add_address(br.index, &foreign).unwrap();
    let c = TestNs::new();
    let refused = net.call("ADD", "f", &c).run();
    assert_eq!(refused.code(), 103, "{}", refused.stdout);
    assert!(refused.json["msg"]
        .as_str()
        .unwrap()
        .contains("forceAddress"));
    assert!(c.veths().is_empty());
    net.assert_clean();

    let mut forced: Value = serde_json::from_str(&net.conf).unwrap();
    forced["forceAddress"] = json!(true);
    net.call_with("ADD", "f", &c.path_str(), &forced.to_string())
        .ok();
    let addrs: Vec<String> = nl
        .addresses(Some(br.index))
        .unwrap()
        .into_iter()
        .filter(|(_, a)| a.addr().is_ipv4())
        .map(|(_, a)| a.to_string())
        .collect();
    assert_eq!(addrs, ["10.77.0.1/24"]);
    assert!(c.ping("10.77.0.1"));
}

/// The bridge's MAC as the kernel shows it.
fn bridge_mac(host: &TestNs, name: &str) -> String {
    host.netlink().link_by_name(name).unwrap().unwrap().mac
}

/// Host ends on the bridge, lowest MAC first: a bridge whose MAC follows its ports would
/// take the first one's.
fn ports_by_mac(host: &TestNs, bridge: &str) -> Vec<(String, u32)> {
    let mut nl = host.netlink();
    let br = nl.link_by_name(bridge).unwrap().unwrap();
    let mut ports: Vec<_> = nl
        .bridge_ports(&br)
        .unwrap()
        .into_iter()
        .map(|l| (l.mac, l.index))
        .collect();
    ports.sort();
    ports
}

#[test]
fn the_gateway_mac_stays_while_containers_come_and_go() {
    for masq in [false, true] {
        let mut net = Net::new("1.0.0", "");
        let mut conf: Value = serde_json::from_str(&net.conf).unwrap();
        conf["ipMasq"] = json!(masq);
        net.conf = conf.to_string();
        let mut live: Vec<(String, TestNs)> = Vec::new();
        let mut gateway_mac = None;
        let all_reach_the_gateway = |live: &[(String, TestNs)], step: &str| {
            for (id, ns) in live {
                assert!(
                    ns.ping("10.77.0.1"),
                    "masq {masq}, {step}: {id} lost the gateway"
                );
            }
        };
        for i in 0..6 {
            let id = format!("churn{i}");
            let ns = TestNs::new();
            let r = net.call("ADD", &id, &ns).ok();
            let mac = bridge_mac(&net.host, "cvtbr0");
            assert_eq!(
                r["interfaces"][0]["mac"],
                mac.as_str(),
                "the result's bridge MAC"
            );
            assert_eq!(
                *gateway_mac.get_or_insert(mac.clone()),
                mac,
                "after ADD {id}"
            );
            live.push((id, ns));
            all_reach_the_gateway(&live, &format!("after ADD churn{i}"));
        }
        // Leave in the order that moves an unfixed bridge's MAC every time: the container
        // behind the lowest port MAC first.
        while !live.is_empty() {
            let (_, lowest) = ports_by_mac(&net.host, "cvtbr0")[0].clone();
            let pos = live
                .iter()
                .position(|(_, ns)| {
                    let eth0 = ns.netlink().link_by_name("eth0").unwrap().unwrap();
                    eth0.peer_index == Some(lowest)
                })
                .expect("a container behind the lowest port");
            let (id, ns) = live.remove(pos);
            net.call("DEL", &id, &ns).ok();
            let mac = bridge_mac(&net.host, "cvtbr0");
            assert_eq!(gateway_mac.as_deref(), Some(mac.as_str()), "after DEL {id}");
            all_reach_the_gateway(&live, &format!("after DEL {id}"));
        }
        net.assert_clean();
    }
}

#[test]
fn a_bridge_made_by_hand_keeps_the_mac_it_had() {
    // Whether corvid learns from sysfs (a plugin run under `ip netns exec`, which mounts
    // the namespace's sysfs) or from the bridge's ports (a plugin that only entered the
    // namespace), an unfixed bridge is fixed to its MAC of the moment.
    for sysfs in [false, true] {
        let net = Net::new("1.0.0", "");
        let mut nl = net.host.netlink();
        nl.add_bridge("cvtbr0", None, false, None, true).unwrap();
        let here = net.host.open();
        nl.add_veth("cvtlow", None, "cvtlowpeer", &here, None, None)
            .unwrap();
        let low = nl.link_by_name("cvtlow").unwrap().unwrap();
        nl.set_mac(&low, "02:00:00:00:00:01").unwrap();
        let br = nl.link_by_name("cvtbr0").unwrap().unwrap();
        let mut enslave = std::process::Command::new("ip");
        enslave.args([
            "-n",
            &net.host.name,
            "link",
            "set",
            "cvtlow",
            "master",
            "cvtbr0",
        ]);
        assert!(enslave.status().unwrap().success());
        assert_eq!(bridge_mac(&net.host, "cvtbr0"), "02:00:00:00:00:01");

        let c = TestNs::new();
        let add = net.call("ADD", "hand", &c);
        let r = if sysfs {
            let mut cmd = std::process::Command::new("ip");
            cmd.args(["netns", "exec", &net.host.name])
                .arg(&add.plugin)
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .envs(add.env.iter().map(|(k, v)| (k, v)))
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped());
            let mut child = cmd.spawn().unwrap();
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(add.stdin.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{out:?}");
            serde_json::from_slice::<Value>(&out.stdout).unwrap()
        } else {
            add.ok()
        };
        assert_eq!(
            r["interfaces"][0]["mac"], "02:00:00:00:00:01",
            "sysfs {sysfs}"
        );
        // The port whose MAC the bridge had leaves: the bridge keeps it.
        nl.delete_link(&low).unwrap();
        assert_eq!(
            bridge_mac(&net.host, "cvtbr0"),
            "02:00:00:00:00:01",
            "sysfs {sysfs}"
        );
        assert!(c.ping("10.77.0.1"), "sysfs {sysfs}");
        let fixed = std::process::Command::new("ip")
            .args(["netns", "exec", &net.host.name, "cat"])
            .arg("/sys/class/net/cvtbr0/addr_assign_type")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&fixed.stdout).trim(), "3");
        assert_eq!(br.index, nl.link_by_name("cvtbr0").unwrap().unwrap().index);
        net.call("DEL", "hand", &c).ok();
        net.assert_clean();
    }
}

#[test]
fn an_old_peer_reaches_the_new_holder_of_a_reused_address_at_once() {
    let net = Net::new("1.1.0", "");
    // host-local hands out the addresses asked for in runtimeConfig.
    let with_ip = |n: u8| {
        let mut c: Value = serde_json::from_str(&net.conf).unwrap();
        c["capabilities"] = json!({"ips": true});
        c["runtimeConfig"] = json!({"ips": [format!("10.77.0.{n}/24"), format!("fd77::{n}/64")]});
        c["ipam"]["ranges"] = json!([[{"subnet": "10.77.0.0/24"}], [{"subnet": "fd77::/64"}]]);
        c["ipam"].as_object_mut().unwrap().remove("subnet");
        c.to_string()
    };
    let (peer, old, new) = (TestNs::new(), TestNs::new(), TestNs::new());
    net.call_with("ADD", "peer", &peer.path_str(), &with_ip(10))
        .ok();
    net.call_with("ADD", "old", &old.path_str(), &with_ip(20))
        .ok();
    for addr in ["10.77.0.20", "fd77::20"] {
        assert!(peer.ping(addr), "{addr}");
    }
    net.call_with("DEL", "old", &old.path_str(), &with_ip(20))
        .ok();
    // Another container (another MAC) gets the addresses while the peer still has the
    // old MAC cached: the ADD's gratuitous ARP and neighbour advertisement move them.
    net.call_with("ADD", "new", &new.path_str(), &with_ip(20))
        .ok();
    for addr in ["10.77.0.20", "fd77::20"] {
        assert!(
            peer.ping(addr),
            "the peer still sends {addr} to the old MAC"
        );
    }
}
