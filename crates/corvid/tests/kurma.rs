//! The Kurma runtime (`corvid kurma`) with real plugin containers, as root: corvid's own
//! plugin image and one of Debian's reference plugins behind shell wrappers, two networks,
//! 20 pods set up at once; hung, failing and malformed plugins; bad input.

#[path = "support/kurma.rs"]
mod kurma;
#[path = "support/ns.rs"]
mod ns;
#[path = "support/registry.rs"]
mod registry;
#[path = "support/static_plugins.rs"]
mod static_plugins;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use kurma::{
    build_corvid_image, busybox, write_aci, write_reference_aci, Node, Runtime, WAIT_MAIN,
};
use ns::wait_until;
use serde_json::{json, Value};

fn uuid(i: usize) -> String {
    format!("{:08x}-fbf6-41da-a2f8-eba218597f9c", 0x146d_7c00 + i)
}

/// The links of the host namespace other than loopback and `keep`.
fn host_links(rt: &Runtime, keep: &[&str]) -> Vec<String> {
    rt.host_ns
        .links("")
        .into_iter()
        .filter(|l| l != "lo" && !keep.contains(&l.as_str()))
        .collect()
}

/// The files host-local keeps for `network` under the plugin's volume, other than its
/// lock and last-reserved marker: one per leased address.
fn leases(rt: &Runtime, volume: &str, network: &str) -> Vec<String> {
    let dir = rt
        .dir
        .path()
        .join("volumes")
        .join(volume)
        .join("networks")
        .join(network);
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The address (without prefix) a pod's record gives on `network`.
fn address(record: &Value, network: &str) -> String {
    let a = record["networks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["network"] == network)
        .unwrap_or_else(|| panic!("{network} in {record}"));
    assert_eq!(a["status"], "added", "{a}");
    let ip = a["result"]["ip4"]["ip"].as_str().unwrap();
    ip.split('/').next().unwrap().to_string()
}

#[test]
fn twenty_pods_on_two_networks_from_two_images_ping_and_leave_nothing() {
    let tag = format!("cvt{}kp", std::process::id());
    let mut rt = Runtime::new(&tag);
    let images = rt.dir.path().join("images-in");
    std::fs::create_dir_all(&images).unwrap();
    let (corvid_aci, _) = build_corvid_image(&images);
    let reference_aci = images.join("reference.aci");
    write_reference_aci(&reference_aci);
    let (bridge_a, bridge_b) = (format!("{tag}a"), format!("{tag}b"));
    rt.start(&json!({
        "pod_networks": [
            {"name": "corvidnet", "aci": format!("file://{}", corvid_aci.display()),
             "default": true, "containerInterface": "eth0",
             "cniVersion": "1.0.0", "type": "bridge", "bridge": bridge_a,
             "isGateway": true, "ipMasq": true,
             "ipam": {"type": "host-local", "subnet": "10.91.0.0/24",
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"name": "refnet", "aci": format!("file://{}", reference_aci.display()),
             "default": true, "containerInterface": "eth{{num}}",
             "cniVersion": "0.3.1", "type": "bridge", "bridge": bridge_b,
             "isGateway": true,
             "ipam": {"type": "host-local", "subnet": "10.92.0.0/24"}}
        ]
    }));
    assert!(rt.plugin_pid("corvidnet").is_some() && rt.plugin_pid("refnet").is_some());

    let pods: Vec<String> = (0..20).map(uuid).collect();
    let records: Vec<Value> = std::thread::scope(|s| {
        let calls: Vec<_> = pods.iter().map(|p| s.spawn(|| rt.add(p, &[]))).collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let mut seen = BTreeSet::new();
    for record in &records {
        let a = address(record, "corvidnet");
        let b = address(record, "refnet");
        assert!(
            a.starts_with("10.91.0.") && b.starts_with("10.92.0."),
            "{record}"
        );
        assert!(
            seen.insert(a) && seen.insert(b),
            "an address given twice: {record}"
        );
        // The fixed name and the template's next free one.
        let ifaces: Vec<&str> = record["networks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["interface"].as_str().unwrap())
            .collect();
        assert_eq!(ifaces, ["eth0", "eth1"], "{record}");
    }
    assert_eq!(leases(&rt, "corvidnet", "corvidnet").len(), 20);
    assert_eq!(leases(&rt, "refnet", "refnet").len(), 20);
    let listed: Value =
        serde_json::from_slice(&rt.corvid().arg("pods").output().unwrap().stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 20);

    for (i, record) in records.iter().enumerate() {
        let uuid = record["uuid"].as_str().unwrap();
        let next = &records[(i + 1) % records.len()];
        for target in [
            "10.91.0.1".to_string(),
            "10.92.0.1".to_string(),
            address(next, "corvidnet"),
            address(next, "refnet"),
        ] {
            assert!(rt.ping(uuid, &target), "{uuid} cannot reach {target}");
        }
    }
    let masq_before = nft_ruleset(&rt);
    assert!(
        masq_before.contains("10.91.0."),
        "no masquerade for the pods: {masq_before}"
    );

    std::thread::scope(|s| {
        for p in &pods {
            let rt = &rt;
            s.spawn(move || {
                let out = rt.pod_del(p);
                assert!(
                    out.status.success(),
                    "del {p}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            });
        }
    });
    assert_eq!(
        host_links(&rt, &[&bridge_a, &bridge_b]),
        Vec::<String>::new()
    );
    assert!(leases(&rt, "corvidnet", "corvidnet").is_empty());
    assert!(leases(&rt, "refnet", "refnet").is_empty());
    let after = nft_ruleset(&rt);
    assert!(!after.contains("elements"), "masquerade left: {after}");
    assert!(std::fs::read_dir(rt.dir.path().join("netns"))
        .unwrap()
        .next()
        .is_none());
    let listed: Value =
        serde_json::from_slice(&rt.corvid().arg("pods").output().unwrap().stdout).unwrap();
    assert_eq!(listed, json!([]));
    // Deleting again has nothing to do.
    assert!(rt.pod_del(&pods[0]).status.success());
}

/// The host namespace's nftables ruleset, as text.
fn nft_ruleset(rt: &Runtime) -> String {
    let out = rt
        .host_ns
        .command("nft")
        .args(["list", "ruleset"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A busybox image whose add and del are `add` and `del`, main `main`.
fn shell_image(path: &Path, add: &str, del: &str, main: &str) {
    let mut files = busybox();
    files.extend([
        ("opt/network/add".to_string(), Node::Script(add.into())),
        ("opt/network/del".to_string(), Node::Script(del.into())),
        ("opt/network/main".to_string(), Node::Script(main.into())),
    ]);
    write_aci(
        path,
        "example.com/test/shell",
        &["/opt/network/main"],
        &files,
    );
}

const OK_ADD: &str = "#!/bin/sh\ncat > /dev/null\necho '{\"ip4\": {\"ip\": \"10.93.0.2/24\"}}'\n";
const OK_DEL: &str = "#!/bin/sh\ncat > /dev/null\n";

#[test]
fn hung_failing_and_exiting_plugins_are_reported_and_the_runtime_goes_on() {
    let tag = format!("cvt{}kh", std::process::id());
    let mut rt = Runtime::new(&tag);
    let images = rt.dir.path().join("images-in");
    std::fs::create_dir_all(&images).unwrap();
    // add starts a child in its process group and both hang; each notes its PID on the
    // plugin's volume, which the host sees.
    let hang = "#!/bin/sh\ncat > /dev/null\nsleep 1000 &\necho $! > /var/lib/cni/child\necho $$ > /var/lib/cni/add\nsleep 1000\n";
    shell_image(&images.join("hang.aci"), hang, OK_DEL, WAIT_MAIN);
    shell_image(&images.join("ok.aci"), OK_ADD, OK_DEL, WAIT_MAIN);
    shell_image(
        &images.join("text.aci"),
        "#!/bin/sh\ncat >/dev/null\necho hello\n",
        OK_DEL,
        WAIT_MAIN,
    );
    shell_image(
        &images.join("fails.aci"),
        "#!/bin/sh\ncat >/dev/null\necho 'no addresses left' >&2\nexit 7\n",
        OK_DEL,
        WAIT_MAIN,
    );
    shell_image(
        &images.join("exits.aci"),
        OK_ADD,
        OK_DEL,
        "#!/bin/sh\nexit 3\n",
    );
    let file = |n: &str| format!("file://{}", images.join(n).display());
    let metrics = "127.0.0.1:19711";
    rt.start_with(&json!({
        "pluginTimeout": 1,
        "podNetworks": [
            {"name": "hang", "aci": file("hang.aci"), "type": "x"},
            {"name": "ok", "aci": file("ok.aci"), "default": true, "containerInterface": "eth{{num}}", "type": "x"},
            {"name": "ok2", "aci": file("ok.aci"), "default": true, "containerInterface": "eth{{num}}", "type": "x"},
            {"name": "text", "aci": file("text.aci"), "type": "x"},
            {"name": "fails", "aci": file("fails.aci"), "type": "x"},
            {"name": "exits", "aci": file("exits.aci"), "type": "x"}
        ]
    }), &["--metrics-listen", metrics]);
    let hang_pid = rt.plugin_pid("hang").unwrap();

    // No network named: the defaults, with names that do not collide.
    let record = rt.add(&uuid(1), &[]);
    let names: Vec<_> = record["networks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["network"].as_str().unwrap(),
                a["interface"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(names, [("ok", "eth0"), ("ok2", "eth1")]);

    // The hung add is killed at the limit with its child; the plugin stays.
    let record = rt.add(&uuid(2), &["hang", "text", "fails", "ok"]);
    let outcome = |n: &str| {
        record["networks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["network"] == n)
            .unwrap()
            .clone()
    };
    assert_eq!(outcome("hang")["status"], "failed");
    assert!(
        outcome("hang")["error"]
            .as_str()
            .unwrap()
            .contains("did not return within 1s"),
        "{record}"
    );
    let volume = rt.dir.path().join("volumes/hang");
    for who in ["add", "child"] {
        let pid: u32 = std::fs::read_to_string(volume.join(who))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        wait_until(
            &format!("the hung {who} ({pid}) gone"),
            Duration::from_secs(5),
            || !Path::new(&format!("/proc/{pid}")).exists(),
        );
    }
    assert_eq!(
        rt.plugin_pid("hang"),
        Some(hang_pid),
        "the plugin container was not kept"
    );
    assert!(
        outcome("text")["error"]
            .as_str()
            .unwrap()
            .contains("not JSON"),
        "{record}"
    );
    let fails = outcome("fails")["error"].as_str().unwrap().to_string();
    assert!(
        fails.contains("exit status: 7") && fails.contains("no addresses left"),
        "{fails}"
    );
    assert_eq!(outcome("ok")["status"], "added");

    // A main that exits is reported; its network fails the pods that ask for it.
    wait_until(
        "the exited plugin reported",
        Duration::from_secs(10),
        || {
            rt.state()["plugins"].as_array().unwrap().iter().any(|p| {
                p["network"] == "exits"
                    && p["status"] == "failed"
                    && p["reason"]
                        .as_str()
                        .unwrap_or("")
                        .contains("exit status: 3")
            })
        },
    );
    // The host is alive but not ready, and says which plugin is down and why.
    let fetch = |path: &str| {
        let url = format!("http://{metrics}{path}");
        rt.host_ns
            .open()
            .run(|| match ureq::get(&url).call() {
                Ok(r) => (r.status(), r.into_string().unwrap()),
                Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
                Err(e) => panic!("{url}: {e}"),
            })
            .unwrap()
    };
    assert_eq!(fetch("/healthz").0, 200);
    let (status, why) = fetch("/readyz");
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("exits: its main process exited"), "{why}");
    let (_, text) = fetch("/metrics");
    assert!(
        text.contains("corvid_kurma_plugin_exits_total{network=\"exits\"} 1"),
        "{text}"
    );
    assert!(text.contains("corvid_kurma_plugin_running{network=\"ok\"} 1"));
    assert!(text.contains("corvid_kurma_plugin_running{network=\"exits\"} 0"));
    let record = rt.add(&uuid(3), &["exits"]);
    assert!(
        record["networks"][0]["error"]
            .as_str()
            .unwrap()
            .contains("exits's plugin failed"),
        "{record}"
    );

    // Unknown network: a clear error, no namespace, no record.
    let out = rt.pod_add(&uuid(4), &["nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"nope\", which is not among"));
    assert!(!rt.netns(&uuid(4)).exists());
    // Bad UUID.
    let out = rt.pod_add("../etc", &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("letters, digits and dashes"));

    for i in 1..=3 {
        let out = rt.pod_del(&uuid(i));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(std::fs::read_dir(rt.dir.path().join("netns"))
        .unwrap()
        .next()
        .is_none());
}

#[test]
fn under_the_fail_policy_a_failed_network_takes_the_pod_down_whole() {
    let tag = format!("cvt{}kf", std::process::id());
    let mut rt = Runtime::new(&tag);
    let images = rt.dir.path().join("images-in");
    std::fs::create_dir_all(&images).unwrap();
    let (corvid_aci, _) = build_corvid_image(&images);
    shell_image(
        &images.join("fails.aci"),
        "#!/bin/sh\ncat >/dev/null\nexit 1\n",
        OK_DEL,
        WAIT_MAIN,
    );
    let bridge = format!("{tag}a");
    rt.start(&json!({
        "failurePolicy": "fail",
        "pod_networks": [
            {"name": "good", "aci": format!("file://{}", corvid_aci.display()), "default": true,
             "containerInterface": "eth0", "cniVersion": "1.0.0", "type": "bridge", "bridge": bridge,
             "ipam": {"type": "host-local", "subnet": "10.94.0.0/24"}},
            {"name": "fails", "aci": format!("file://{}", images.join("fails.aci").display()),
             "default": true, "type": "x"}
        ]
    }));
    let out = rt.pod_add(&uuid(1), &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("fails: /opt/network/add exited with exit status: 1"),
        "{err}"
    );
    assert!(!rt.netns(&uuid(1)).exists());
    assert!(leases(&rt, "good", "good").is_empty());
    assert_eq!(host_links(&rt, &[&bridge]), Vec::<String>::new());
    // The good network alone still works.
    let record = rt.add(&uuid(2), &["good"]);
    assert!(address(&record, "good").starts_with("10.94.0."), "{record}");
    assert!(rt.pod_del(&uuid(2)).status.success());
}

#[test]
fn bad_configurations_are_refused_and_leave_nothing() {
    let tag = format!("cvt{}kb", std::process::id());
    let rt = Runtime::new(&tag);
    let config_path = rt.dir.path().join("bad.json");
    for (config, says) in [
        ("{\"pod_networks\": [".to_string(), "not a JSON object"),
        (
            json!({"failurePolicy": "sometimes", "pod_networks": []}).to_string(),
            "continue or fail",
        ),
        (
            json!({"pod_networks": [{"name": "a", "aci": "x",
                "containerInterface": "averyverylongifname"}]})
            .to_string(),
            "containerInterface \"averyverylongifname\": gives no interface name of 1 to 15 bytes",
        ),
    ] {
        std::fs::write(&config_path, &config).unwrap();
        let out = rt
            .corvid()
            .arg("run-networks")
            .arg("--config")
            .arg(&config_path)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{config}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{config}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!rt.dir.path().join("host.json").exists());
        assert!(!rt.dir.path().join("images").exists(), "{config}");
    }
    // Without a host, pod add says so.
    let out = rt.pod_add(&uuid(1), &[]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("start `corvid kurma run-networks` first")
    );
}

/// Kurma logged a network whose image it could not load and set up the others: so does
/// the host, and `host.json` says why each is missing.
#[test]
fn networks_whose_images_cannot_be_had_are_reported_and_the_others_run() {
    let tag = format!("cvt{}ki", std::process::id());
    let mut rt = Runtime::new(&tag);
    let images = rt.dir.path().join("images-in");
    std::fs::create_dir_all(&images).unwrap();
    let (corvid_aci, _) = build_corvid_image(&images);
    std::fs::write(images.join("corrupt.aci"), b"\x1f\x8bnot really gzip").unwrap();
    let mut climbing = busybox();
    climbing.push(("../../escape".to_string(), Node::Script("x".into())));
    write_aci(
        &images.join("climbing.aci"),
        "example.com/x",
        &["/bin/sh"],
        &climbing,
    );
    let file = |n: &str| format!("file://{}", images.join(n).display());
    let bridge = format!("{tag}a");
    // (network, aci, what its reason must say)
    let bad = [
        ("ftp", "ftp://x/y.aci".to_string(), "unknown scheme ftp://"),
        ("missing", file("missing.aci"), "missing.aci"),
        ("refused", "http://127.0.0.1:1/x.aci".into(), "127.0.0.1:1"),
        ("corrupt", file("corrupt.aci"), "corrupt.aci"),
        ("climbing", file("climbing.aci"), "escape"),
    ];
    let mut networks = vec![
        json!({"name": "good", "aci": file(corvid_aci.file_name().unwrap().to_str().unwrap()),
        "default": true, "containerInterface": "eth0", "cniVersion": "1.0.0", "type": "bridge",
        "bridge": bridge, "isGateway": true,
        "ipam": {"type": "host-local", "subnet": "10.97.0.0/24"}}),
    ];
    for (name, aci, _) in &bad {
        networks.push(
            json!({"name": name, "aci": aci, "default": *name == "missing",
            "containerInterface": "eth{{num}}", "type": "bridge"}),
        );
    }
    rt.start(&json!({"pod_networks": networks}));
    assert!(rt.plugin_pid("good").is_some(), "{}", rt.state());
    let log = rt.host_log();
    for (name, _, says) in &bad {
        let plugin = rt.plugin(name);
        assert_eq!(plugin["status"], "failed", "{plugin}");
        assert_eq!(plugin["image"], Value::Null, "{plugin}");
        let reason = plugin["reason"].as_str().unwrap();
        assert!(
            reason.starts_with("its image: ") && reason.contains(says),
            "{plugin}"
        );
        assert!(
            log.lines()
                .any(|l| l.contains("network left out") && l.contains(says)),
            "{name} not in the log: {log}"
        );
    }
    // Nothing of a refused image stays in the store: only the good one.
    let stored: Vec<_> = std::fs::read_dir(rt.dir.path().join("images"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        stored,
        [rt.plugin("good")["image"].as_str().unwrap()],
        "{stored:?}"
    );
    // A pod on the defaults gets the good network; the missing one fails, saying why.
    let record = rt.add(&uuid(1), &[]);
    assert!(address(&record, "good").starts_with("10.97.0."), "{record}");
    let missing = &record["networks"][1];
    assert_eq!(missing["network"], "missing", "{record}");
    assert!(
        missing["error"]
            .as_str()
            .unwrap()
            .contains("missing's plugin failed: its image: "),
        "{record}"
    );
    assert!(rt.ping(&uuid(1), "10.97.0.1"));
    let out = rt.pod_del(&uuid(1));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(leases(&rt, "good", "good").is_empty());
}

/// Kurma rendered `{{uuid}}` as the whole UUID and never cut a name: one over Linux's 15
/// bytes refuses the pod, naming the template, before anything is made.
#[test]
fn an_interface_template_rendering_over_15_bytes_is_refused_naming_it() {
    let tag = format!("cvt{}kn", std::process::id());
    let mut rt = Runtime::new(&tag);
    let images = rt.dir.path().join("images-in");
    std::fs::create_dir_all(&images).unwrap();
    shell_image(&images.join("ok.aci"), OK_ADD, OK_DEL, WAIT_MAIN);
    let file = format!("file://{}", images.join("ok.aci").display());
    rt.start(&json!({"pod_networks": [
        {"name": "long", "aci": file, "containerInterface": "veth{{uuid}}", "type": "x"},
        {"name": "short", "aci": file, "containerInterface": "v{{shortuuid}}", "type": "x"}
    ]}));
    let out = rt.pod_add(&uuid(1), &["long"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "containerInterface \"veth{{{{uuid}}}}\": renders to \"veth{}\" for pod {}, 40 bytes; an interface name has at most 15",
            uuid(1),
            uuid(1)
        )),
        "{err}"
    );
    assert!(!rt.netns(&uuid(1)).exists());
    assert!(!rt
        .dir
        .path()
        .join(format!("pods/{}.json", uuid(1)))
        .exists());
    // What fits is used as rendered.
    let record = rt.add(&uuid(2), &["short"]);
    assert_eq!(
        record["networks"][0]["interface"],
        format!("v{}", &uuid(2)[..8])
    );
    assert!(rt.pod_del(&uuid(2)).status.success());
}

/// The capability sets of process `pid` (`CapEff`, ...), as bits.
fn capabilities(pid: u64, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("{field} in {status}"));
    u64::from_str_radix(hex.trim(), 16).unwrap()
}

/// Kurma's 14 capabilities of an app without `os/linux/privileged`
/// (stager/container/core/util.go), by number.
const KURMA_DEFAULT_CAPABILITIES: [u32; 14] = [0, 1, 4, 3, 27, 13, 6, 7, 31, 8, 10, 18, 5, 29];

/// Kurma gave a plugin all capabilities only for the `os/linux/privileged` isolator; without
/// it, 14 that cannot enter a pod's namespace. corvid's image carries it; the same image
/// without it runs with those 14 and fails, and every report of it names the isolator.
#[test]
fn without_the_privileged_isolator_a_plugin_has_kurmas_capabilities_and_says_so() {
    let tag = format!("cvt{}kc", std::process::id());
    let mut rt = Runtime::new(&tag);
    let images = rt.dir.path().join("images-in");
    std::fs::create_dir_all(&images).unwrap();
    let (corvid_aci, _) = build_corvid_image(&images);
    let unprivileged_aci = images.join("unprivileged.aci");
    kurma::without_privileged_isolator(&corvid_aci, &unprivileged_aci);
    let (bridge_a, bridge_b) = (format!("{tag}a"), format!("{tag}b"));
    rt.start(&json!({
        "failurePolicy": "fail",
        "pod_networks": [
            {"name": "priv", "aci": format!("file://{}", corvid_aci.display()),
             "containerInterface": "eth0", "cniVersion": "1.0.0", "type": "bridge",
             "bridge": bridge_a, "isGateway": true,
             "ipam": {"type": "host-local", "subnet": "10.95.0.0/24"}},
            {"name": "unpriv", "aci": format!("file://{}", unprivileged_aci.display()),
             "containerInterface": "eth0", "cniVersion": "1.0.0", "type": "bridge",
             "bridge": bridge_b, "isGateway": true,
             "ipam": {"type": "host-local", "subnet": "10.96.0.0/24"}}
        ]
    }));
    let (priv_pid, unpriv_pid) = (
        rt.plugin_pid("priv").unwrap(),
        rt.plugin_pid("unpriv").unwrap(),
    );
    let mine = capabilities(std::process::id().into(), "CapPrm");
    let kurma = KURMA_DEFAULT_CAPABILITIES
        .iter()
        .fold(0u64, |acc, n| acc | 1 << n)
        & mine;
    for field in ["CapEff", "CapPrm", "CapInh", "CapBnd"] {
        assert_eq!(capabilities(unpriv_pid, field), kurma, "unpriv {field}");
    }
    assert_eq!(capabilities(unpriv_pid, "CapAmb"), 0);
    assert_eq!(capabilities(priv_pid, "CapEff"), mine, "priv CapEff");

    // host.json, the host's log and the plugin's own log name the isolator.
    let (p, u) = (rt.plugin("priv"), rt.plugin("unpriv"));
    assert_eq!(
        (&p["privileged"], &p["warning"]),
        (&json!(true), &Value::Null),
        "{p}"
    );
    assert_eq!(u["privileged"], false, "{u}");
    let warning = u["warning"].as_str().unwrap();
    assert!(
        warning.contains("the image has no os/linux/privileged isolator")
            && warning.contains("without CAP_NET_ADMIN and CAP_SYS_ADMIN"),
        "{u}"
    );
    assert!(
        rt.host_log().lines().any(|l| l.contains("WARN")
            && l.contains("unpriv")
            && l.contains("no os/linux/privileged isolator")),
        "{}",
        rt.host_log()
    );
    assert!(
        rt.plugin_log("unpriv").contains(
            "corvid kurma: unpriv: capabilities: the image has no os/linux/privileged isolator"
        ),
        "{}",
        rt.plugin_log("unpriv")
    );
    assert!(rt
        .plugin_log("priv")
        .contains("capabilities: all (os/linux/privileged)"));

    // The unprivileged add cannot enter the pod's namespace; the failure says why.
    let out = rt.pod_add(&uuid(1), &["unpriv"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unpriv: /opt/network/add exited with exit status: 1")
            && err.contains("the image has no os/linux/privileged isolator"),
        "{err}"
    );
    assert!(!rt.netns(&uuid(1)).exists());
    assert!(leases(&rt, "unpriv", "unpriv").is_empty());

    // The same image with the isolator works.
    let record = rt.add(&uuid(2), &["priv"]);
    assert!(address(&record, "priv").starts_with("10.95.0."), "{record}");
    assert!(rt.ping(&uuid(2), "10.95.0.1"));
    assert!(rt.pod_del(&uuid(2)).status.success());
    assert_eq!(host_links(&rt, &[&bridge_a]), Vec::<String>::new());
}

/// The main process keeps its stdin at /config and add, as Kurma's add.sh did, writes its
/// stdin to a `mktemp` file in $TMPDIR (unset: the root).
const WRITING_MAIN: &str = "#!/bin/sh\ncat > /config\nwhile :; do sleep 3600; done\n";
const WRITING_ADD: &str = "#!/bin/sh\nset -e\npayload=$(mktemp $TMPDIR/cni-command.XXXXXX)\ncat > $payload\necho '{\"ip4\": {\"ip\": \"10.93.0.2/24\"}}'\n";

/// Two networks' plugins of one image on `rt` (the host started here): each sees its own
/// writes in its root and not the other's, and the store's copy of the image is as the
/// archive unpacks, before and after; the containers' directories go with the host.
fn plugins_keep_their_writes_apart(rt: &mut Runtime) {
    let images = rt.dir.path().join("images-in");
    std::fs::create_dir_all(&images).unwrap();
    let aci = images.join("writer.aci");
    shell_image(&aci, WRITING_ADD, OK_DEL, WRITING_MAIN);
    let unpacked = tempfile::tempdir().unwrap();
    kurma::unpack_aci(&aci, unpacked.path());
    let as_archived = kurma::tree_digest(&unpacked.path().join("rootfs"));
    let file = format!("file://{}", aci.display());
    rt.start(&json!({"pod_networks": [
        {"name": "alpha", "aci": file, "default": true, "type": "x"},
        {"name": "bravo", "aci": file, "default": true, "type": "x"}
    ]}));
    let image = rt.plugin("alpha")["image"].as_str().unwrap().to_string();
    assert_eq!(rt.plugin("bravo")["image"], image.as_str());
    let store = rt.dir.path().join("images").join(&image).join("rootfs");
    kurma::assert_same_tree(
        &kurma::tree_digest(&store),
        &as_archived,
        "the store's rootfs after start",
    );

    rt.add(&uuid(1), &[]);
    rt.add(&uuid(2), &["bravo"]);
    for (me, other, calls) in [("alpha", "bravo", 1), ("bravo", "alpha", 2)] {
        let root = format!("/proc/{}/root", rt.plugin_pid(me).unwrap());
        let config = std::fs::read_to_string(format!("{root}/config")).unwrap();
        assert!(
            config.contains(&format!("\"{me}\"")) && !config.contains(other),
            "{me} sees {config}"
        );
        let payloads: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("cni-command."))
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .collect();
        assert_eq!(payloads.len(), calls, "{me}'s root: {payloads:?}");
        assert!(
            payloads
                .iter()
                .all(|p| p.contains(&format!("\"{me}\"")) && !p.contains(other)),
            "{me} sees {payloads:?}"
        );
    }
    kurma::assert_same_tree(
        &kurma::tree_digest(&store),
        &as_archived,
        "the store's rootfs after adds",
    );
    for i in 1..=2 {
        assert!(rt.pod_del(&uuid(i)).status.success());
    }
    rt.stop();
    kurma::assert_same_tree(
        &kurma::tree_digest(&store),
        &as_archived,
        "the store's rootfs after the host",
    );
    assert!(
        std::fs::read_dir(rt.dir.path().join("containers"))
            .unwrap()
            .next()
            .is_none(),
        "containers' directories left"
    );
}

#[test]
fn plugins_of_one_image_write_to_overlays_of_their_own() {
    let tag = format!("cvt{}kw", std::process::id());
    let mut rt = Runtime::new(&tag);
    plugins_keep_their_writes_apart(&mut rt);
    for network in ["alpha", "bravo"] {
        assert!(
            rt.plugin_log(network)
                .contains(&format!("corvid kurma: {network}: root: an overlay over ")),
            "{}",
            rt.plugin_log(network)
        );
    }
    assert!(
        rt.host_log().contains("root=\"overlay\""),
        "{}",
        rt.host_log()
    );
}

#[test]
fn where_overlayfs_cannot_be_mounted_plugins_get_copies_and_the_log_says_so() {
    let tag = format!("cvt{}kv", std::process::id());
    // overlayfs takes no upper directory on overlayfs.
    let base = kurma::OnOverlay::new();
    let mut rt = Runtime::new_in(&tag, &base.path());
    plugins_keep_their_writes_apart(&mut rt);
    for network in ["alpha", "bravo"] {
        let log = rt.plugin_log(network);
        assert!(
            log.contains(&format!(
                "corvid kurma: {network}: root: a private copy of "
            )) && log.contains("overlayfs unavailable: mount -t overlay"),
            "{log}"
        );
    }
    assert!(
        rt.host_log()
            .contains("overlayfs unavailable: the plugin's root is a private copy"),
        "{}",
        rt.host_log()
    );
}

/// appc's actool, as scripts/test.sh unpacks it.
fn actool() -> std::path::PathBuf {
    let path = std::env::var_os("CORVID_ACTOOL")
        .map(Into::into)
        .unwrap_or_else(|| "/var/cache/corvid-appc/usr/bin/actool".into());
    assert!(
        Path::new(&path).is_file(),
        "{path:?}: unpack Debian's appc-spec there (scripts/test.sh does)"
    );
    path
}

#[test]
fn corvids_image_is_a_valid_aci_and_a_complete_oci_layout() {
    let out = tempfile::tempdir().unwrap();
    let (aci, oci) = build_corvid_image(out.path());
    let validate = |aci: &Path| {
        let check = std::process::Command::new(actool())
            .args(["--debug", "validate"])
            .arg(aci)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&check.stdout).into_owned()
            + &String::from_utf8_lossy(&check.stderr);
        (check.status.success(), said)
    };
    // The image carries Kurma's privileged isolator, the one thing actool refuses...
    let (valid, said) = validate(&aci);
    assert!(!valid && said.contains("invalid isolator"), "{said}");
    let manifest: Value = {
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(
            std::fs::File::open(&aci).unwrap(),
        ));
        let entry = tar
            .entries()
            .unwrap()
            .map(|e| e.unwrap())
            .find(|e| e.path().unwrap() == Path::new("manifest"))
            .unwrap();
        serde_json::from_reader(entry).unwrap()
    };
    assert_eq!(
        manifest["app"]["isolators"],
        json!([{"name": "os/linux/privileged", "value": true}])
    );
    // ...and all else of it is valid.
    let copy = out.path().join("without-isolator.aci");
    kurma::without_privileged_isolator(&aci, &copy);
    let (valid, said) = validate(&copy);
    assert!(
        valid && said.contains("valid app container image"),
        "{said}"
    );

    let blob = |digest: &str| -> Vec<u8> {
        let hex = digest.strip_prefix("sha256:").unwrap();
        let bytes = std::fs::read(oci.join("blobs/sha256").join(hex)).unwrap();
        let sum = <sha2::Sha256 as sha2::Digest>::digest(&bytes);
        assert_eq!(
            format!("{sum:x}"),
            hex,
            "blob {digest} does not match its digest"
        );
        bytes
    };
    let index: Value =
        serde_json::from_slice(&std::fs::read(oci.join("index.json")).unwrap()).unwrap();
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        "0.1.0"
    );
    let manifest: Value =
        serde_json::from_slice(&blob(index["manifests"][0]["digest"].as_str().unwrap())).unwrap();
    let config: Value =
        serde_json::from_slice(&blob(manifest["config"]["digest"].as_str().unwrap())).unwrap();
    assert_eq!(
        config["config"]["Entrypoint"],
        json!(["/opt/network/netplugin"])
    );
    // The isolator's stand-in for docker:// pulls.
    assert_eq!(config["config"]["Labels"]["os/linux/privileged"], "true");
    let layer = blob(manifest["layers"][0]["digest"].as_str().unwrap());
    let mut names = BTreeSet::new();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(layer.as_slice()));
    for e in tar.entries().unwrap() {
        names.insert(e.unwrap().path().unwrap().display().to_string());
    }
    for want in [
        "opt/network/add",
        "opt/network/del",
        "opt/network/netplugin",
        "opt/cni/bin/bridge",
        "opt/cni/bin/host-local",
    ] {
        assert!(names.contains(want), "{want} not in the layer: {names:?}");
    }
}

#[test]
fn plugins_restart_with_backoff_and_pods_outlive_the_host() {
    let tag = format!("cvt{}kr", std::process::id());
    let mut rt = Runtime::new(&tag);
    let images = rt.dir.path().join("images-in");
    std::fs::create_dir_all(&images).unwrap();
    let (corvid_aci, _) = build_corvid_image(&images);
    shell_image(
        &images.join("flaky.aci"),
        OK_ADD,
        OK_DEL,
        "#!/bin/sh\ncat >/dev/null\nsleep 0.2\nexit 1\n",
    );
    let bridge = format!("{tag}a");
    let config = json!({
        "restartPlugins": true,
        "pod_networks": [
            {"name": "good", "aci": format!("file://{}", corvid_aci.display()), "default": true,
             "containerInterface": "eth0", "cniVersion": "1.0.0", "type": "bridge", "bridge": bridge,
             "isGateway": true, "ipam": {"type": "host-local", "subnet": "10.98.0.0/24"}},
            {"name": "flaky", "aci": format!("file://{}", images.join("flaky.aci").display()), "type": "x"}
        ]
    });
    rt.start(&config);
    // The flaky main exits again and again; each time it is started anew.
    let mut pids = BTreeSet::new();
    wait_until(
        "three starts of the flaky plugin",
        Duration::from_secs(15),
        || {
            pids.extend(rt.plugin_pid("flaky"));
            pids.len() >= 3
        },
    );
    let record = rt.add(&uuid(1), &[]);
    let addr = address(&record, "good");
    // The host goes; the pod keeps its network, and a new host takes it down.
    rt.stop();
    assert!(rt.ping(&uuid(1), "10.98.0.1"));
    rt.start(&config);
    let out = rt.pod_del(&uuid(1));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        leases(&rt, "good", "good").is_empty(),
        "the lease of {addr} stayed"
    );
    assert_eq!(host_links(&rt, &[&bridge]), Vec::<String>::new());
}

#[test]
fn corvids_oci_image_runs_pods_from_a_registry() {
    let tag = format!("cvt{}ko", std::process::id());
    let mut rt = Runtime::new(&tag);
    let images = rt.dir.path().join("images-in");
    std::fs::create_dir_all(&images).unwrap();
    let (_, oci) = build_corvid_image(&images);
    // The registry serves the host's loopback, where the runtime pulls.
    let registry = rt
        .host_ns
        .open()
        .run(|| {
            let registry = registry::Registry::start();
            registry.push_layout("corvid/cni-netplugin", "0.1.0", &oci);
            registry
        })
        .unwrap();
    let bridge = format!("{tag}a");
    rt.start(&json!({
        "insecureRegistries": [registry.addr],
        "pod_networks": [
            {"name": "fromreg", "aci": format!("docker://{}/corvid/cni-netplugin:0.1.0", registry.addr),
             "default": true, "containerInterface": "eth0", "cniVersion": "1.0.0", "type": "bridge",
             "bridge": bridge, "isGateway": true,
             "ipam": {"type": "host-local", "subnet": "10.99.0.0/24"}}
        ]
    }));
    // The image's label stands for the isolator an OCI image cannot carry.
    assert_eq!(rt.plugin("fromreg")["privileged"], true);
    let record = rt.add(&uuid(1), &[]);
    assert!(
        address(&record, "fromreg").starts_with("10.99.0."),
        "{record}"
    );
    assert!(rt.ping(&uuid(1), "10.99.0.1"));
    assert!(rt.pod_del(&uuid(1)).status.success());
    assert!(leases(&rt, "fromreg", "fromreg").is_empty());
    assert_eq!(host_links(&rt, &[&bridge]), Vec::<String>::new());
}

/// `pod add` and `pod del` killed with SIGKILL at 33 points each, spread over the
/// operation's median time, then `pod del` as a runtime would send it: no namespace, no
/// lease, no masquerade element, no link but the bridge, no record; a live pod still
/// answers throughout.
#[test]
fn killed_pod_adds_and_dels_are_recovered_by_del() {
    use std::os::unix::process::CommandExt;
    use std::time::Instant;
    let tag = format!("cvt{}kk", std::process::id());
    let mut rt = Runtime::new(&tag);
    let images = rt.dir.path().join("images-in");
    std::fs::create_dir_all(&images).unwrap();
    let (corvid_aci, _) = build_corvid_image(&images);
    let bridge = format!("{tag}a");
    rt.start(&json!({
        "pod_networks": [
            {"name": "crash", "aci": format!("file://{}", corvid_aci.display()), "default": true,
             "containerInterface": "eth0", "cniVersion": "1.0.0", "type": "bridge",
             "bridge": bridge, "isGateway": true, "ipMasq": true,
             "ipam": {"type": "host-local", "subnet": "10.93.0.0/24"}}
        ]
    }));
    let live = uuid(0);
    rt.add(&live, &[]);
    let clean_but_live = |what: &str| {
        assert_eq!(host_links(&rt, &[&bridge]).len(), 1, "{what}: links");
        assert_eq!(leases(&rt, "crash", "crash").len(), 1, "{what}: leases");
        assert_eq!(
            // Elements only: the masquerade rule carries its set's name as a comment too.
            nft_ruleset(&rt).matches("comment \"corvid:").count(),
            1,
            "{what}: masquerade"
        );
        let netns: Vec<_> = std::fs::read_dir(rt.dir.path().join("netns"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            netns,
            [std::ffi::OsString::from(&live)],
            "{what}: namespaces"
        );
        let out = rt.corvid().args(["pods"]).output().unwrap();
        let pods: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(pods.as_array().map(Vec::len), Some(1), "{what}: {pods}");
        assert!(
            rt.ping(&live, "10.93.0.1"),
            "{what}: the live pod lost its gateway"
        );
    };
    clean_but_live("at the start");
    let timed = |del: bool, id: &str| {
        let t = Instant::now();
        let out = if del {
            rt.pod_del(id)
        } else {
            rt.pod_add(id, &[])
        };
        assert!(out.status.success(), "{out:?}");
        t.elapsed()
    };
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for i in 0..5 {
        adds.push(timed(false, &uuid(900 + i)));
        dels.push(timed(true, &uuid(900 + i)));
    }
    adds.sort();
    dels.sort();
    let (add_time, del_time) = (adds[2], dels[2]);
    const POINTS: u32 = 33;
    let mut interrupted = [0; 2];
    for (k, del) in [false, true].into_iter().enumerate() {
        let op_time = if del { del_time } else { add_time };
        for point in 0..POINTS {
            let id = uuid(1 + point as usize + k * 100);
            if del {
                rt.add(&id, &[]);
            }
            let mut child = rt
                .corvid()
                .args(["pod", if del { "del" } else { "add" }, &id])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap();
            std::thread::sleep(op_time * 9 / 10 * point / POINTS);
            interrupted[k] += u32::from(child.try_wait().unwrap().is_none());
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            // A plugin call runs in a process group of its own, as under a runtime that
            // died: it finishes (bounded by pluginTimeout) before the runtime's DEL.
            std::thread::sleep(Duration::from_millis(100));
            let out = rt.pod_del(&id);
            assert!(
                out.status.success(),
                "DEL after a kill in {} at point {point}: {}",
                if del { "del" } else { "add" },
                String::from_utf8_lossy(&out.stderr)
            );
            clean_but_live(&format!(
                "{} killed at point {point}",
                if del { "del" } else { "add" }
            ));
        }
    }
    println!(
        "kurma: pod add killed at {POINTS} points ({} mid-operation), pod del at {POINTS} ({} mid-operation), all recovered by DEL",
        interrupted[0], interrupted[1]
    );
    assert!(
        interrupted.iter().all(|&n| n >= POINTS / 2),
        "{interrupted:?}"
    );
}
