//! host-local on its own: allocation, requested addresses, rotation, CHECK, GC, bad input.

mod support;

use corvid_cni::version::ALL;
use serde_json::{json, Value};
use support::*;

struct Ipam {
    host: TestNs,
    plugins: PluginDir,
    data: tempfile::TempDir,
}

impl Ipam {
    fn new() -> Ipam {
        Ipam {
            host: TestNs::new(),
            plugins: PluginDir::new(),
            data: tempfile::tempdir().unwrap(),
        }
    }

    fn conf(&self, version: &str, ipam: Value) -> String {
        let mut ipam = ipam;
        ipam["type"] = json!("host-local");
        ipam["dataDir"] = json!(self.data.path());
        json!({"cniVersion": version, "name": "cvtipam", "type": "bridge", "ipam": ipam})
            .to_string()
    }

    fn call(&self, command: &str, id: &str, conf: &str) -> Call<'_> {
        Call::new(
            &self.host,
            self.plugins.plugin("host-local"),
            command,
            id,
            "/run/netns/unused",
            &self.plugins.path().display().to_string(),
            conf,
        )
    }

    fn leases(&self) -> Vec<String> {
        leases(self.data.path(), "cvtipam")
    }
}

#[test]
fn allocates_in_every_version_and_rotates() {
    for version in ALL {
        let ipam = Ipam::new();
        let conf = ipam.conf(
            version.as_str(),
            json!({"subnet": "10.80.0.0/24", "rangeStart": "10.80.0.10", "rangeEnd": "10.80.0.12",
                   "routes": [{"dst": "0.0.0.0/0"}]}),
        );
        let r = ipam.call("ADD", "a", &conf).ok();
        assert_eq!(r["cniVersion"], version.as_str());
        let first = if version.is_legacy_result() {
            assert_eq!(r["ip4"]["gateway"], "10.80.0.1");
            r["ip4"]["ip"].as_str().unwrap().to_string()
        } else {
            assert!(
                r.get("interfaces").is_none(),
                "IPAM results carry no interfaces"
            );
            assert_eq!(r["routes"][0]["dst"], "0.0.0.0/0");
            r["ips"][0]["address"].as_str().unwrap().to_string()
        };
        assert_eq!(first, "10.80.0.10/24");
        // The same attachment again gets the same address.
        assert_eq!(ipam.call("ADD", "a", &conf).ok(), r);
        ipam.call("ADD", "b", &conf).ok();
        ipam.call("DEL", "a", &conf).ok();
        // Rotation: after .11 comes .12, not the freed .10.
        let c = ipam.call("ADD", "c", &conf).ok();
        assert_eq!(
            ipam.leases(),
            ["10.80.0.11", "10.80.0.12"],
            "{version}: {c}"
        );
        let d = ipam.call("ADD", "d", &conf).ok();
        assert!(
            d.to_string().contains("10.80.0.10/24"),
            "{version}: wrapped around: {d}"
        );
        let full = ipam.call("ADD", "e", &conf).run();
        assert_eq!(full.code(), 100, "{}", full.stdout);
        for id in ["b", "c", "d", "e", "never-added"] {
            ipam.call("DEL", id, &conf).ok();
        }
        assert!(ipam.leases().is_empty());
    }
}

#[test]
fn requested_addresses_by_args_config_and_runtime_config() {
    let ipam = Ipam::new();
    let base = json!({"subnet": "10.81.0.0/24"});
    let conf = ipam.conf("1.0.0", base.clone());
    let by_env = ipam
        .call("ADD", "env", &conf)
        .set("CNI_ARGS", "IgnoreUnknown=1;IP=10.81.0.50")
        .ok();
    assert_eq!(by_env["ips"][0]["address"], "10.81.0.50/24");

    let mut c: Value = serde_json::from_str(&conf).unwrap();
    c["args"] = json!({"cni": {"ips": ["10.81.0.51"]}});
    let by_args = ipam.call("ADD", "args", &c.to_string()).ok();
    assert_eq!(by_args["ips"][0]["address"], "10.81.0.51/24");

    let mut c: Value = serde_json::from_str(&conf).unwrap();
    c["runtimeConfig"] = json!({"IPs": ["10.81.0.52/24"]});
    let by_rc = ipam.call("ADD", "rc", &c.to_string()).ok();
    assert_eq!(
        by_rc["ips"][0]["address"], "10.81.0.52/24",
        "PascalCase runtimeConfig key"
    );

    let taken = ipam
        .call("ADD", "other", &conf)
        .set("CNI_ARGS", "IP=10.81.0.50")
        .run();
    assert_eq!(taken.code(), 101, "{}", taken.stdout);
    let outside = ipam
        .call("ADD", "other", &conf)
        .set("CNI_ARGS", "IP=10.99.0.5")
        .run();
    assert_eq!(outside.code(), 101, "{}", outside.stdout);
    let garbage = ipam
        .call("ADD", "other", &conf)
        .set("CNI_ARGS", "IP=banana")
        .run();
    assert_eq!(garbage.code(), 7, "{}", garbage.stdout);
    assert_eq!(ipam.leases(), ["10.81.0.50", "10.81.0.51", "10.81.0.52"]);
}

#[test]
fn dual_stack_range_sets_and_resolv_conf() {
    let ipam = Ipam::new();
    let resolv = ipam.data.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 10.0.0.53\nsearch a.example b.example\noptions ndots:2\n",
    )
    .unwrap();
    let conf = ipam.conf(
        "1.1.0",
        json!({"ranges": [[{"subnet": "10.82.0.0/24"}, {"subnet": "10.82.1.0/24"}], [{"subnet": "fd82::/64"}]],
               "resolvConf": resolv}),
    );
    let r = ipam.call("ADD", "ds", &conf).ok();
    let ips: Vec<&str> = r["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["address"].as_str().unwrap())
        .collect();
    assert_eq!(ips, ["10.82.0.2/24", "fd82::2/64"]);
    assert_eq!(r["dns"]["nameservers"], json!(["10.0.0.53"]));
    assert_eq!(r["dns"]["search"], json!(["a.example", "b.example"]));
    assert_eq!(r["dns"]["options"], json!(["ndots:2"]));
    let legacy = ipam.conf(
        "0.2.0",
        json!({"ranges": [[{"subnet": "10.83.0.0/24"}], [{"subnet": "fd83::/64"}]]}),
    );
    let l = ipam.call("ADD", "legacy", &legacy).ok();
    assert_eq!(l["ip4"]["ip"], "10.83.0.2/24");
    assert_eq!(l["ip6"]["ip"], "fd83::2/64");
}

#[test]
fn check_and_gc() {
    let ipam = Ipam::new();
    let conf = ipam.conf("1.1.0", json!({"subnet": "10.84.0.0/24"}));
    let r = ipam.call("ADD", "keep", &conf).ok();
    ipam.call("ADD", "stale", &conf).ok();
    let mut with_prev: Value = serde_json::from_str(&conf).unwrap();
    with_prev["prevResult"] = r.clone();
    assert!(
        ipam.call("CHECK", "keep", &with_prev.to_string())
            .run()
            .success
    );
    let wrong = ipam.call("CHECK", "nobody", &with_prev.to_string()).run();
    assert_eq!(wrong.code(), 104);

    // A lease a crashed writer left empty is released by GC too.
    std::fs::write(ipam.data.path().join("cvtipam").join("10.84.0.200"), "").unwrap();
    let mut gc: Value = serde_json::from_str(&conf).unwrap();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "eth0"}]);
    ipam.call("GC", "", &gc.to_string()).ok();
    assert_eq!(ipam.leases(), ["10.84.0.2"]);
}

#[test]
fn crash_leftovers_do_not_block_add_or_del() {
    let ipam = Ipam::new();
    let conf = ipam.conf("1.0.0", json!({"subnet": "10.85.0.0/24"}));
    let dir = ipam.data.path().join("cvtipam");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("last_reserved_ip.0"), "10.85.").unwrap();
    std::fs::write(dir.join("10.85.0.2"), "").unwrap();
    // A writer above the largest pid_max: certainly dead.
    std::fs::write(dir.join(".corvid-tmp.4194305.0"), "half").unwrap();
    let r = ipam.call("ADD", "x", &conf).ok();
    assert_eq!(r["ips"][0]["address"], "10.85.0.3/24");
    ipam.call("DEL", "x", &conf).ok();
    assert_eq!(ipam.leases(), ["10.85.0.2"]);
    // ADD and DEL no longer read the whole directory; GC's read clears the leftover.
    let mut gc: Value = serde_json::from_str(&conf).unwrap();
    gc["cni.dev/valid-attachments"] = json!([]);
    gc["cniVersion"] = json!("1.1.0");
    ipam.call("GC", "", &gc.to_string()).ok();
    assert!(!dir.join(".corvid-tmp.4194305.0").exists());
}

#[test]
fn bad_ipam_configs() {
    let ipam = Ipam::new();
    for (what, cfg, code) in [
        ("no ranges", json!({}), 7),
        ("subnet too small", json!({"subnet": "10.86.0.0/31"}), 7),
        ("host bits", json!({"subnet": "10.86.0.1/24"}), 7),
        (
            "rangeEnd outside",
            json!({"subnet": "10.86.0.0/24", "rangeEnd": "10.87.0.9"}),
            7,
        ),
        (
            "overlapping sets",
            json!({"ranges": [[{"subnet": "10.86.0.0/24"}], [{"subnet": "10.86.0.0/25"}]]}),
            7,
        ),
        ("ranges wrong shape", json!({"ranges": "10.86.0.0/24"}), 7),
        (
            "missing resolvConf",
            json!({"subnet": "10.86.0.0/24", "resolvConf": "/nonexistent/resolv.conf"}),
            5,
        ),
    ] {
        let out = ipam.call("ADD", "bad", &ipam.conf("1.0.0", cfg)).run();
        assert!(!out.success, "{what}");
        assert_eq!(out.code(), code, "{what}: {}", out.stdout);
        assert!(ipam.leases().is_empty(), "{what}: a lease was written");
    }
}
