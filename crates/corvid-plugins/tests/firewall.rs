//! The firewall plugin chained after bridge, in namespaces the test makes: the ingress
//! policies isolate bridges from each other and not from the outside, the container's
//! addresses are listed and removed, bad input is refused, and it chains with the
//! reference's plugins both ways.

mod support;

use corvid_cni::version::ALL;
use serde_json::{json, Value};
use std::path::PathBuf;
use support::*;

fn bridge_conf(site: &Site, version: &str, n: u8) -> String {
    json!({"cniVersion": version, "name": format!("cvtfw{n}"), "type": "bridge",
        "bridge": format!("cvtbrf{n}"), "isGateway": true, "ipMasq": true,
        "ipam": {"type": "host-local", "subnet": format!("10.7{n}.0.0/24"),
            "dataDir": site.data.path(), "routes": [{"dst": "0.0.0.0/0"}]}})
    .to_string()
}

fn firewall_conf(version: &str, n: u8, prev: &Value, policy: &str) -> String {
    json!({"cniVersion": version, "name": format!("cvtfw{n}"), "type": "firewall",
        "ingressPolicy": policy, "prevResult": prev})
    .to_string()
}

fn run(
    site: &Site,
    p: (PathBuf, String),
    command: &str,
    id: &str,
    ns: &TestNs,
    conf: &str,
) -> Outcome {
    site.call_with(p.0, &p.1, command, id, &ns.path_str(), conf)
        .run()
}

/// bridge then firewall on network `n`; the result.
fn attach(
    site: &Site,
    id: &str,
    ns: &TestNs,
    n: u8,
    policy: &str,
    reference: (bool, bool),
) -> Value {
    let bridge = bridge_conf(site, "1.0.0", n);
    attach_with(site, id, ns, &bridge, n, policy, reference)
}

/// [`attach`] with the bridge's configuration given.
fn attach_with(
    site: &Site,
    id: &str,
    ns: &TestNs,
    bridge: &str,
    n: u8,
    policy: &str,
    reference: (bool, bool),
) -> Value {
    let r = run(
        site,
        site.plugin("bridge", reference.0),
        "ADD",
        id,
        ns,
        bridge,
    );
    assert!(r.success, "{}", r.stdout);
    let f = run(
        site,
        site.plugin("firewall", reference.1),
        "ADD",
        id,
        ns,
        &firewall_conf("1.0.0", n, &r.json, policy),
    );
    assert!(f.success, "{}", f.stdout);
    assert_eq!(f.json, r.json, "the result passes through");
    r.json
}

fn tags(site: &Site) -> Vec<String> {
    site.host.run(|| {
        let mut nft = corvid_net::nftables::Nftables::open().unwrap();
        corvid_net::nftables::firewall::firewall_tags(&mut nft).unwrap()
    })
}

#[test]
fn same_bridge_isolates_bridges_not_the_outside() {
    let site = Site::new();
    let (a1, a2, b1) = (TestNs::new(), TestNs::new(), TestNs::new());
    let ra1 = attach(&site, "a1", &a1, 1, "same-bridge", (false, false));
    let ra2 = attach(&site, "a2", &a2, 1, "same-bridge", (false, false));
    let rb1 = attach(&site, "b1", &b1, 2, "same-bridge", (false, false));
    let ip = |r: &Value| result_ip(r, true);
    assert!(a1.ping(&ip(&ra2)), "same bridge");
    assert!(!a1.ping(&ip(&rb1)), "from an isolated bridge to another");
    assert!(!b1.ping(&ip(&ra1)), "and back");
    assert!(a1.ping("10.251.0.2"), "the outside");
    assert!(site.host.ping(&ip(&rb1)), "the host");
    assert_eq!(tags(&site).len(), 3);
    for (id, ns, n, r) in [
        ("a1", &a1, 1, &ra1),
        ("a2", &a2, 1, &ra2),
        ("b1", &b1, 2, &rb1),
    ] {
        let conf = firewall_conf("1.0.0", n, r, "same-bridge");
        assert!(
            run(
                &site,
                site.plugin("firewall", false),
                "CHECK",
                id,
                ns,
                &conf
            )
            .success
        );
        assert!(run(&site, site.plugin("firewall", false), "DEL", id, ns, &conf).success);
        assert!(
            run(&site, site.plugin("firewall", false), "DEL", id, ns, &conf).success,
            "twice"
        );
        assert_eq!(
            run(
                &site,
                site.plugin("firewall", false),
                "CHECK",
                id,
                ns,
                &conf
            )
            .code(),
            104,
            "CHECK after DEL"
        );
    }
    assert!(tags(&site).is_empty());
}

#[test]
fn open_lets_bridges_reach_each_other() {
    let site = Site::new();
    let (a, b) = (TestNs::new(), TestNs::new());
    attach(&site, "a", &a, 3, "open", (false, false));
    let rb = attach(&site, "b", &b, 4, "", (false, false));
    assert!(a.ping(&result_ip(&rb, true)));
}

#[test]
fn every_version_and_bad_input() {
    let site = Site::new();
    for version in ALL {
        let v = version.as_str();
        let c = TestNs::new();
        let r = run(
            &site,
            site.plugin("bridge", false),
            "ADD",
            "v",
            &c,
            &bridge_conf(&site, v, 5),
        );
        assert!(r.success, "{v}: {}", r.stdout);
        let conf = firewall_conf(v, 5, &r.json, "open");
        let out = run(&site, site.plugin("firewall", false), "ADD", "v", &c, &conf);
        assert!(out.success, "{v}: {}", out.stdout);
        assert_eq!(out.json["cniVersion"], v);
        if version.allows_check() {
            assert!(
                run(
                    &site,
                    site.plugin("firewall", false),
                    "CHECK",
                    "v",
                    &c,
                    &conf
                )
                .success,
                "{v}"
            );
        }
        assert!(
            run(&site, site.plugin("firewall", false), "DEL", "v", &c, &conf).success,
            "{v}"
        );
        assert!(tags(&site).is_empty(), "{v}");
    }
    let c = TestNs::new();
    let r = run(
        &site,
        site.plugin("bridge", false),
        "ADD",
        "b",
        &c,
        &bridge_conf(&site, "1.1.0", 6),
    )
    .json;
    let mut bad: Vec<(Value, u64)> = Vec::new();
    let base: Value = serde_json::from_str(&firewall_conf("1.1.0", 6, &r, "open")).unwrap();
    for (field, value, code) in [
        ("ingressPolicy", json!("closed"), 7),
        ("backend", json!("firewalld"), 2),
        ("prevResult", Value::Null, 7),
    ] {
        let mut conf = base.clone();
        conf[field] = value;
        if field == "prevResult" {
            conf.as_object_mut().unwrap().remove("prevResult");
        }
        bad.push((conf, code));
    }
    for (conf, code) in bad {
        let out = run(
            &site,
            site.plugin("firewall", false),
            "ADD",
            "b",
            &c,
            &conf.to_string(),
        );
        assert_eq!(out.code(), code, "{conf}: {}", out.stdout);
    }
    assert!(tags(&site).is_empty(), "nothing was let through");
}

#[test]
fn mixed_with_the_reference_both_ways() {
    let site = Site::new();
    let (c1, c2) = (TestNs::new(), TestNs::new());
    let r1 = attach(&site, "m1", &c1, 7, "open", (true, false));
    assert!(c1.ping("10.251.0.2"), "reference bridge, corvid firewall");
    assert_eq!(tags(&site).len(), 1);
    let r2 = attach(&site, "m2", &c2, 8, "open", (false, true));
    assert!(c2.ping("10.251.0.2"), "corvid bridge, reference firewall");
    for (id, ns, n, r, reference) in [("m1", &c1, 7, &r1, false), ("m2", &c2, 8, &r2, true)] {
        let conf = firewall_conf("1.0.0", n, r, "open");
        assert!(
            run(
                &site,
                site.plugin("firewall", reference),
                "DEL",
                id,
                ns,
                &conf
            )
            .success
        );
    }
    assert!(tags(&site).is_empty());
}

fn iptables(site: &Site, args: &str) -> String {
    iptables_with(site, "iptables-nft", args)
}

/// `tool` (`iptables-nft`, `iptables-legacy`) on the host with `args`: its output.
fn iptables_with(site: &Site, tool: &str, args: &str) -> String {
    let out = site
        .host
        .command(tool)
        .args(args.split_whitespace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{tool} {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Docker's filtering as iptables-nft writes it: FORWARD drops by default and jumps to
/// DOCKER-USER first. Returns iptables' listing of it.
fn docker_forward_drop(site: &Site) -> String {
    for rule in [
        "-N DOCKER-USER",
        "-A FORWARD -j DOCKER-USER",
        "-P FORWARD DROP",
    ] {
        iptables(site, rule);
    }
    iptables(site, "-S")
}

/// bridge on network `n`, which the host's DROP policy keeps in, then firewall, which
/// lets it out: bridge's result and firewall's configuration.
fn through_a_drop_policy(site: &Site, id: &str, c: &TestNs, n: u8) -> (Value, String) {
    let r = run(
        site,
        site.plugin("bridge", false),
        "ADD",
        id,
        c,
        &bridge_conf(site, "1.0.0", n),
    );
    assert!(r.success, "{}", r.stdout);
    assert!(
        !c.ping("10.251.0.2"),
        "the DROP policy stops the container without the firewall"
    );
    let conf = firewall_conf("1.0.0", n, &r.json, "open");
    let out = run(site, site.plugin("firewall", false), "ADD", id, c, &conf);
    assert!(out.success, "{}", out.stdout);
    assert!(c.ping("10.251.0.2"), "through the DROP policy");
    (r.json, conf)
}

#[test]
fn containers_go_out_through_an_iptables_forward_drop_policy() {
    let site = Site::new();
    let docker = docker_forward_drop(&site);
    let c = TestNs::new();
    let (r, conf) = through_a_drop_policy(&site, "d", &c, 9);
    let with = iptables(&site, "-S");
    // iptables reads corvid's rules as its own: the jump first, then per address.
    let ip = result_ip(&r, true);
    let lines: Vec<&str> = with.lines().collect();
    assert!(
        lines.contains(&r#"-A FORWARD -m comment --comment "corvid firewall" -j CORVID-FORWARD"#),
        "{with}"
    );
    let replies =
        format!("-A CORVID-FORWARD -d {ip}/32 -m conntrack --ctstate RELATED,ESTABLISHED");
    assert!(lines.iter().any(|l| l.starts_with(&replies)), "{with}");
    let outbound = format!("-A CORVID-FORWARD -s {ip}/32");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&outbound) && l.ends_with("-j ACCEPT")),
        "{with}"
    );
    for line in docker.lines() {
        assert!(with.contains(line), "Docker's {line} is kept");
    }

    assert!(run(&site, site.plugin("firewall", false), "DEL", "d", &c, &conf).success);
    assert_eq!(
        iptables(&site, "-S"),
        docker,
        "the container's rules, corvid's chain and its jump are gone"
    );
    assert!(!c.ping("10.251.0.2"), "and with them the way out");
    assert!(
        run(&site, site.plugin("firewall", false), "DEL", "d", &c, &conf).success,
        "twice"
    );
}

#[test]
fn containers_go_out_through_a_legacy_iptables_forward_drop_policy() {
    let site = Site::new();
    let legacy = |args: &str| iptables_with(&site, "iptables-legacy", args);
    // ufw's filtering as legacy iptables writes it, out of nftables' reach.
    legacy("-P FORWARD DROP");
    let before = legacy("-S");
    let c = TestNs::new();
    let (r, conf) = through_a_drop_policy(&site, "l", &c, 8);
    let with = legacy("-S");
    let ip = result_ip(&r, true);
    assert!(with.contains("-A FORWARD -j CORVID-FORWARD"), "{with}");
    assert!(
        with.contains(&format!(
            "-A CORVID-FORWARD -s {ip}/32 -m comment --comment"
        )),
        "{with}"
    );

    assert!(run(&site, site.plugin("firewall", false), "DEL", "l", &c, &conf).success);
    assert_eq!(legacy("-S"), before, "DEL leaves legacy iptables as it was");
    assert!(!c.ping("10.251.0.2"), "and with its rules the way out");
    assert!(
        run(&site, site.plugin("firewall", false), "DEL", "l", &c, &conf).success,
        "twice"
    );
}

/// A DEL sent again after the address went to another container takes nothing of the
/// new holder's: its addresses stay listed as its own (CHECK passes), and it still goes
/// out through Docker's DROP policy, which only corvid's rules for it let it pass.
#[test]
fn a_stale_del_leaves_the_next_holder_of_the_address_alone() {
    let site = Site::new();
    docker_forward_drop(&site);
    let mut bridge: Value = serde_json::from_str(&bridge_conf(&site, "1.0.0", 0)).unwrap();
    let ipam = bridge["ipam"].as_object_mut().unwrap();
    ipam.remove("subnet");
    ipam.insert(
        "ranges".into(),
        single_address_ranges(&[("10.70.0.0/24", "10.70.0.9")]),
    );
    let bridge = bridge.to_string();
    let firewall = |prev: &Value| firewall_conf("1.0.0", 0, prev, "open");
    let call = |plugin: &str, command: &str, id: &str, netns: &str, conf: &str| {
        let (path, cni_path) = site.plugin(plugin, false);
        site.call_with(path, &cni_path, command, id, netns, conf)
            .run()
    };
    let (b, rb) = repeat_a_stale_del(
        |id, ns| attach_with(&site, id, ns, &bridge, 0, "open", (false, false)),
        |id, netns, prev| {
            let conf = with_prev_result(&firewall(&Value::Null), prev);
            assert!(call("firewall", "DEL", id, netns, &conf).success);
            let conf = with_prev_result(&bridge, prev);
            assert!(call("bridge", "DEL", id, netns, &conf).success);
        },
    );
    let tag = corvid_net::nftables::AttachmentTag::new("cvtfw0", "b", "eth0");
    assert_eq!(tags(&site), [tag.as_str()], "b's address, as b's");
    let check = call("firewall", "CHECK", "b", &b.path_str(), &firewall(&rb));
    assert!(check.success, "b's rules are whole: {}", check.stdout);
    assert!(b.ping("10.251.0.2"), "b still goes out");
}
