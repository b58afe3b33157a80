//! static IPAM beside the reference's (Debian's /usr/lib/cni/static): the same answers for
//! the same configurations, CNI_ARGS and runtime settings in every version, the same
//! refusals, and a mixed list (the reference bridge delegating to corvid's static).

mod support;

use corvid_cni::version::ALL;
use serde_json::{json, Value};
use support::*;

fn conf(version: &str, ipam: Value, extra: Value) -> String {
    let mut c = json!({"cniVersion": version, "name": "cvtstatic", "type": "bridge", "ipam": ipam});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c.to_string()
}

/// Runs `static` of both sets with the same input: (ours, the reference's).
fn both(
    host: &TestNs,
    plugins: &PluginDir,
    command: &str,
    conf: &str,
    cni_args: &str,
) -> (Outcome, Outcome) {
    let call = |plugin: std::path::PathBuf| {
        Call::new(
            host,
            plugin,
            command,
            "cvt-static",
            "/run/netns/unused",
            &plugins.path().display().to_string(),
            conf,
        )
        .set("CNI_ARGS", cni_args)
        .run()
    };
    (
        call(plugins.plugin("static")),
        call(std::path::Path::new(REFERENCE_DIR).join("static")),
    )
}

#[test]
fn answers_as_the_reference_in_every_version() {
    let host = TestNs::new();
    let plugins = PluginDir::new();
    let ipam = json!({"type": "static",
        "addresses": [{"address": "10.81.0.5/24", "gateway": "10.81.0.1"},
                      {"address": "fd81::5/64", "gateway": "fd81::1"}],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.81.0.254"}],
        "dns": {"nameservers": ["10.81.0.53"], "domain": "example", "search": ["a.example"]}});
    let one = json!({"type": "static", "addresses": [{"address": "10.81.0.5/24", "gateway": "10.81.0.1"}],
        "routes": [{"dst": "0.0.0.0/0"}]});
    for version in ALL {
        // 0.1.0 and 0.2.0 hold one address per family; both refuse two of one family.
        let ipam = if version.is_legacy_result() {
            &one
        } else {
            &ipam
        };
        let c = conf(version.as_str(), ipam.clone(), json!({}));
        let (ours, mut theirs) = both(&host, &plugins, "ADD", &c, "");
        assert!(ours.success, "{version}: {}", ours.stdout);
        if version.as_str() == "1.1.0" {
            // Debian's reference stops at 1.0.0; 1.1.0 adds nothing a static result holds.
            assert_eq!(theirs.code(), 1, "{}", theirs.stdout);
            let older = conf("1.0.0", ipam.clone(), json!({}));
            theirs = both(&host, &plugins, "ADD", &older, "").1;
            theirs.json["cniVersion"] = json!("1.1.0");
        }
        assert!(theirs.success, "{version}: reference: {}", theirs.stdout);
        assert_eq!(ours.json, theirs.json, "{version}");
        let (ours, theirs) = both(&host, &plugins, "DEL", &c, "");
        assert!(ours.success, "{version}: {}", ours.stdout);
        assert!(theirs.success || version.as_str() == "1.1.0", "{version}");
    }
}

#[test]
fn cni_args_args_and_runtime_config_as_the_reference() {
    let host = TestNs::new();
    let plugins = PluginDir::new();
    let base = json!({"type": "static", "addresses": [{"address": "10.82.0.5/24"}]});
    let cases = [
        // IP= adds (comma-separated); GATEWAY= fills in the address that holds it.
        (
            json!({}),
            "IP=10.82.1.7/24,fd82::7/64;GATEWAY=10.82.1.1,fd82::1",
        ),
        // args.cni.ips replaces the configuration's addresses, runtimeConfig.ips replaces both.
        (json!({"args": {"cni": {"ips": ["10.82.2.9/24"]}}}), ""),
        (
            json!({"args": {"cni": {"ips": ["10.82.2.9/24"]}},
                   "runtimeConfig": {"ips": ["10.82.3.3/24", "fd82::3/64"]}}),
            "IP=10.82.4.4/24",
        ),
        (json!({}), "IgnoreUnknown=1;K8S_POD_NAME=p"),
    ];
    for (extra, cni_args) in cases {
        let c = conf("1.0.0", base.clone(), extra.clone());
        let (ours, theirs) = both(&host, &plugins, "ADD", &c, cni_args);
        assert!(
            theirs.success,
            "{extra} {cni_args}: reference: {}",
            theirs.stdout
        );
        assert_eq!(ours.json, theirs.json, "{extra} {cni_args}");
    }
}

#[test]
fn bad_input_is_refused_as_the_reference_refuses_it() {
    let host = TestNs::new();
    let plugins = PluginDir::new();
    let cases = [
        (
            json!({"type": "static", "addresses": [{"address": "10.83.0.5"}]}),
            "1.0.0",
            "",
        ),
        (
            json!({"type": "static", "addresses": [{"address": "nonsense/24"}]}),
            "1.0.0",
            "",
        ),
        (json!({"type": "static"}), "1.0.0", "IP=10.83.0.9"),
        (
            json!({"type": "static"}),
            "1.0.0",
            "GATEWAY=not-an-ip;IP=10.83.0.9/24",
        ),
        (json!({"type": "static"}), "1.0.0", "FOO=bar"),
        (
            json!({"type": "static", "addresses": [{"address": "10.83.0.5/24"}, {"address": "10.83.1.5/24"}]}),
            "0.2.0",
            "",
        ),
    ];
    for (ipam, version, cni_args) in cases {
        let c = conf(version, ipam.clone(), json!({}));
        let (ours, theirs) = both(&host, &plugins, "ADD", &c, cni_args);
        assert!(!theirs.success, "the reference took {ipam} {cni_args}");
        assert!(!ours.success, "took {ipam} {cni_args}: {}", ours.stdout);
        assert!(
            ours.code() != 0 && ours.json["msg"].is_string(),
            "{}",
            ours.stdout
        );
    }
    // No ipam section at all.
    let c = json!({"cniVersion": "1.0.0", "name": "cvtstatic", "type": "bridge"}).to_string();
    let (ours, theirs) = both(&host, &plugins, "ADD", &c, "");
    assert!(!ours.success && !theirs.success);
    assert!(
        ours.json["msg"].as_str().unwrap().contains("ipam"),
        "{}",
        ours.stdout
    );
}

#[test]
fn check_wants_each_configured_address_in_prev_result() {
    let host = TestNs::new();
    let plugins = PluginDir::new();
    let ipam = json!({"type": "static", "addresses": [{"address": "10.84.0.5/24", "gateway": "10.84.0.1"}]});
    let add = conf("1.0.0", ipam.clone(), json!({}));
    let (ours, _) = both(&host, &plugins, "ADD", &add, "");
    let good = conf("1.0.0", ipam.clone(), json!({"prevResult": ours.json}));
    let (ours, theirs) = both(&host, &plugins, "CHECK", &good, "");
    assert!(ours.success && theirs.success, "{}", ours.stdout);
    let mut wrong = ours_prev(&ipam);
    wrong["ips"][0]["gateway"] = json!("10.84.0.254");
    let bad = conf("1.0.0", ipam.clone(), json!({"prevResult": wrong}));
    // Refused for the address it could not match, with the reference's code and words
    // (a configuration it could not read would be another code).
    let (ours, theirs) = both(&host, &plugins, "CHECK", &bad, "");
    assert_eq!((ours.code(), theirs.code()), (999, 999), "{}", ours.stdout);
    assert_eq!(ours.json["msg"], theirs.json["msg"]);
    assert!(
        ours.json["msg"].as_str().unwrap().contains("10.84.0.5"),
        "{}",
        ours.stdout
    );
    // No prevResult: the configuration is incomplete (the spec's code 7; the reference
    // says 999).
    let missing = conf("1.0.0", ipam, json!({}));
    let (ours, theirs) = both(&host, &plugins, "CHECK", &missing, "");
    assert!(!theirs.success);
    assert_eq!(ours.code(), 7, "{}", ours.stdout);
    assert!(
        ours.json["msg"].as_str().unwrap().contains("prevResult"),
        "{}",
        ours.stdout
    );
}

fn ours_prev(ipam: &Value) -> Value {
    json!({"cniVersion": "1.0.0",
        "ips": [{"address": ipam["addresses"][0]["address"], "gateway": ipam["addresses"][0]["gateway"]}]})
}

#[test]
fn the_reference_bridge_delegates_to_corvids_static() {
    let host = TestNs::new();
    let pod = TestNs::new();
    let plugins = PluginDir::new();
    // The reference bridge finds IPAM plugins on CNI_PATH: corvid's directory first.
    let path = format!("{}:{REFERENCE_DIR}", plugins.path().display());
    let c = json!({"cniVersion": "1.0.0", "name": "cvtstatic", "type": "bridge",
        "bridge": "cvtstbr0", "isGateway": true,
        "ipam": {"type": "static", "addresses": [{"address": "10.85.0.5/24", "gateway": "10.85.0.1"}],
                 "routes": [{"dst": "0.0.0.0/0"}]}})
    .to_string();
    let call = |command: &str| {
        Call::new(
            &host,
            std::path::Path::new(REFERENCE_DIR).join("bridge"),
            command,
            "cvt-mixed",
            &pod.path_str(),
            &path,
            &c,
        )
    };
    let r = call("ADD").ok();
    assert_eq!(address_part(&r["ips"][0]["address"]), "10.85.0.5");
    assert!(pod.ping("10.85.0.1"), "the pod does not reach its gateway");
    // DEL takes the pod's interface and the host's end of it; again, it finds nothing.
    for _ in 0..2 {
        call("DEL").ok();
        assert_eq!(pod.links(), Vec::<String>::new(), "the pod's eth0 is gone");
        assert_eq!(host.veths(), Vec::<String>::new(), "the host end is gone");
        assert!(!pod.ping("10.85.0.1"), "the pod still reaches its gateway");
    }
}
