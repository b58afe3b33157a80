//! The bandwidth plugin chained after bridge, in namespaces the test makes: a measured
//! transfer into and out of the container runs at the configured rate, CHECK sees the
//! shaping, DEL removes the qdiscs and the ifb device, bad input changes nothing, every
//! version, and chains with the reference's plugins both ways.

mod support;

use corvid_cni::version::ALL;
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::PathBuf;
use std::process::Stdio;
use support::*;

/// 8 Mbit/s: a megabyte a second.
const RATE_BITS: u64 = 8_000_000;
const BURST_BITS: u64 = 400_000;

fn bridge_conf(site: &Site, version: &str) -> String {
    json!({"cniVersion": version, "name": "cvtbw", "type": "bridge", "bridge": "cvtbrw",
        "isGateway": true,
        "ipam": {"type": "host-local", "subnet": "10.75.0.0/24", "dataDir": site.data.path()}})
    .to_string()
}

fn bandwidth_conf(version: &str, prev: &Value, runtime: Value) -> String {
    json!({"cniVersion": version, "name": "cvtbw", "type": "bandwidth",
        "capabilities": {"bandwidth": true}, "runtimeConfig": {"bandwidth": runtime},
        "prevResult": prev})
    .to_string()
}

fn limits() -> Value {
    json!({"ingressRate": RATE_BITS, "ingressBurst": BURST_BITS,
        "egressRate": RATE_BITS, "egressBurst": BURST_BITS})
}

fn run(site: &Site, p: (PathBuf, String), command: &str, ns: &TestNs, conf: &str) -> Outcome {
    site.call_with(p.0, &p.1, command, "bw", &ns.path_str(), conf)
        .run()
}

/// Bytes per second of a 3 MB TCP transfer from `sender` to `receiver` at `addr`,
/// counted by the receiver from its first byte to its last.
fn transfer_rate(sender: &TestNs, receiver: &TestNs, addr: &str) -> f64 {
    let mut server = receiver
        .command("python3")
        .args([
            "-c",
            "import socket, time\n\
             s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             s.bind(('0.0.0.0', 5997)); s.listen(1); print('ready', flush=True)\n\
             c, _ = s.accept(); n = 0; t0 = None\n\
             while True:\n\
             \x20   d = c.recv(65536)\n\
             \x20   if not d: break\n\
             \x20   t0 = t0 or time.monotonic(); n += len(d)\n\
             print(n / (time.monotonic() - t0), flush=True)",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let sent = sender
        .command("python3")
        .args([
            "-c",
            &format!("import socket\ns = socket.create_connection(('{addr}', 5997))\ns.sendall(b'x' * 3_000_000); s.close()"),
        ])
        .status()
        .unwrap();
    assert!(sent.success());
    line.clear();
    out.read_line(&mut line).unwrap();
    server.wait().unwrap();
    line.trim().parse().unwrap()
}

fn ifbs(host: &TestNs) -> Vec<String> {
    host.netlink()
        .links()
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .filter(|n| n.starts_with(corvid_net::names::IFB_PREFIX))
        .collect()
}

#[test]
fn traffic_both_ways_runs_at_the_configured_rate() {
    let site = Site::new();
    let c = TestNs::new();
    let r = run(
        &site,
        site.plugin("bridge", false),
        "ADD",
        &c,
        &bridge_conf(&site, "1.1.0"),
    );
    assert!(r.success, "{}", r.stdout);
    let container = result_ip(&r.json, true);
    let unshaped = transfer_rate(&site.host, &c, &container);
    let conf = bandwidth_conf("1.1.0", &r.json, limits());
    let out = run(&site, site.plugin("bandwidth", false), "ADD", &c, &conf);
    assert!(out.success, "{}", out.stdout);
    assert_eq!(out.json, r.json, "the result passes through");
    let want = (RATE_BITS / 8) as f64;
    let into = transfer_rate(&site.host, &c, &container);
    let out_of = transfer_rate(&c, &site.host, "10.75.0.1");
    for (what, rate) in [("into the container", into), ("out of it", out_of)] {
        assert!(
            (rate - want).abs() <= 0.2 * want,
            "{what}: {rate:.0} B/s against {want:.0} configured (unshaped {unshaped:.0})"
        );
    }
    assert!(
        unshaped > 5.0 * want,
        "the link itself is faster: {unshaped:.0} B/s"
    );
    let check = run(&site, site.plugin("bandwidth", false), "CHECK", &c, &conf);
    assert!(check.success, "{}", check.stdout);
    let slower = bandwidth_conf(
        "1.1.0",
        &r.json,
        json!({"ingressRate": RATE_BITS / 2, "ingressBurst": BURST_BITS}),
    );
    assert_eq!(
        run(&site, site.plugin("bandwidth", false), "CHECK", &c, &slower).code(),
        104
    );
    assert_eq!(ifbs(&site.host).len(), 1);

    assert!(run(&site, site.plugin("bandwidth", false), "DEL", &c, &conf).success);
    assert!(ifbs(&site.host).is_empty(), "the ifb is gone");
    let mut nl = site.host.netlink();
    let eth0 = c.netlink().link_by_name("eth0").unwrap().unwrap();
    let veth = nl.link_by_index(eth0.peer_index.unwrap()).unwrap().unwrap();
    assert_eq!(
        nl.token_bucket(&veth).unwrap(),
        None,
        "the veth's qdisc is gone"
    );
    assert!(
        run(&site, site.plugin("bandwidth", false), "DEL", &c, &conf).success,
        "twice"
    );
    assert!(
        transfer_rate(&site.host, &c, &container) > 5.0 * want,
        "unshaped again"
    );
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
            &c,
            &bridge_conf(&site, v),
        );
        assert!(r.success, "{v}: {}", r.stdout);
        let conf = bandwidth_conf(v, &r.json, limits());
        let out = run(&site, site.plugin("bandwidth", false), "ADD", &c, &conf);
        assert!(out.success, "{v}: {}", out.stdout);
        if version.allows_check() {
            assert!(
                run(&site, site.plugin("bandwidth", false), "CHECK", &c, &conf).success,
                "{v}"
            );
        }
        assert!(
            run(&site, site.plugin("bandwidth", false), "DEL", &c, &conf).success,
            "{v}"
        );
        assert!(ifbs(&site.host).is_empty(), "{v}");
    }
    let c = TestNs::new();
    let r = run(
        &site,
        site.plugin("bridge", false),
        "ADD",
        &c,
        &bridge_conf(&site, "1.1.0"),
    )
    .json;
    for (limits, code) in [
        (json!({"ingressRate": 1000}), 7),
        (json!({"egressBurst": 1000}), 7),
        (
            json!({"IngressRate": 1000, "IngressBurst": 40_000_000_000u64}),
            7,
        ),
        (json!({"ingressRate": "fast"}), 7),
    ] {
        let out = run(
            &site,
            site.plugin("bandwidth", false),
            "ADD",
            &c,
            &bandwidth_conf("1.1.0", &r, limits.clone()),
        );
        assert_eq!(out.code(), code, "{limits}: {}", out.stdout);
    }
    let mut subnets: Value = serde_json::from_str(&bandwidth_conf("1.1.0", &r, limits())).unwrap();
    subnets["unshapedSubnets"] = json!(["10.0.0.0/8"]);
    assert_eq!(
        run(
            &site,
            site.plugin("bandwidth", false),
            "ADD",
            &c,
            &subnets.to_string()
        )
        .code(),
        2
    );
    assert!(ifbs(&site.host).is_empty(), "nothing was made");
}

#[test]
fn mixed_with_the_reference_both_ways() {
    for (bridge_ref, bandwidth_ref) in [(true, false), (false, true)] {
        let site = Site::new();
        let c = TestNs::new();
        let r = run(
            &site,
            site.plugin("bridge", bridge_ref),
            "ADD",
            &c,
            &bridge_conf(&site, "1.0.0"),
        );
        assert!(r.success, "{}", r.stdout);
        let conf = bandwidth_conf("1.0.0", &r.json, limits());
        let out = run(
            &site,
            site.plugin("bandwidth", bandwidth_ref),
            "ADD",
            &c,
            &conf,
        );
        assert!(out.success, "{}", out.stdout);
        let want = (RATE_BITS / 8) as f64;
        let rate = transfer_rate(&site.host, &c, &result_ip(&r.json, true));
        assert!((rate - want).abs() <= 0.2 * want, "{rate:.0} B/s");
        assert!(
            run(
                &site,
                site.plugin("bandwidth", bandwidth_ref),
                "DEL",
                &c,
                &conf
            )
            .success
        );
    }
}

/// A DEL sent again after the address went to another container takes nothing of the
/// new holder's: its shaping stays (CHECK passes: its qdisc and its ifb), and it still
/// goes out, masqueraded by its bridge.
#[test]
fn a_stale_del_leaves_the_next_holder_of_the_address_alone() {
    let site = Site::new();
    let mut bridge: Value = serde_json::from_str(&bridge_conf(&site, "1.1.0")).unwrap();
    bridge["ipMasq"] = json!(true);
    let ipam = bridge["ipam"].as_object_mut().unwrap();
    ipam.remove("subnet");
    ipam.insert(
        "ranges".into(),
        single_address_ranges(&[("10.75.0.0/24", "10.75.0.9")]),
    );
    ipam.insert("routes".into(), json!([{"dst": "0.0.0.0/0"}]));
    let bridge = bridge.to_string();
    let bandwidth = |prev: Option<&Value>| {
        with_prev_result(&bandwidth_conf("1.1.0", &Value::Null, limits()), prev)
    };
    let call = |plugin: &str, command: &str, id: &str, netns: &str, conf: &str| {
        let (path, cni_path) = site.plugin(plugin, false);
        site.call_with(path, &cni_path, command, id, netns, conf)
            .run()
    };
    let (b, rb) = repeat_a_stale_del(
        |id, ns| {
            let r = call("bridge", "ADD", id, &ns.path_str(), &bridge);
            assert!(r.success, "{}", r.stdout);
            let out = call(
                "bandwidth",
                "ADD",
                id,
                &ns.path_str(),
                &bandwidth(Some(&r.json)),
            );
            assert!(out.success, "{}", out.stdout);
            r.json
        },
        |id, netns, prev| {
            assert!(call("bandwidth", "DEL", id, netns, &bandwidth(prev)).success);
            let conf = with_prev_result(&bridge, prev);
            assert!(call("bridge", "DEL", id, netns, &conf).success);
        },
    );
    let check = call(
        "bandwidth",
        "CHECK",
        "b",
        &b.path_str(),
        &bandwidth(Some(&rb)),
    );
    assert!(check.success, "b's shaping is whole: {}", check.stdout);
    assert_eq!(ifbs(&site.host).len(), 1, "b's ifb");
    assert!(b.ping("10.251.0.2"), "b still goes out");
}
