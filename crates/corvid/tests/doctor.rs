//! `corvid doctor` on a healthy host namespace and on one broken on purpose: a
//! configuration that does not parse, one naming a missing plugin, a lease and nftables
//! elements whose attachment the runtime forgot, a lease whose namespace is gone, and an
//! agent veth no port owns. Each is reported with the command that fixes it, and after
//! those commands the host is healthy again. Runs as root in `cvt*` namespaces
//! (support/cluster.rs).

#[path = "support/cluster.rs"]
mod cluster;

use std::process::Output;
use std::time::Duration;

use cluster::ns::wait_until;
use cluster::{url, Cluster};
use serde_json::{json, Value};

const METRICS: &str = "127.0.0.1:19697";

/// `corvid doctor --json` in host h1 against the cluster's paths.
fn doctor(c: &Cluster, ipam: &std::path::Path) -> (Output, Value) {
    let out = c.hosts[0]
        .command(env!("CARGO_BIN_EXE_corvid"))
        .args([
            "doctor",
            "--json",
            "--host-id",
            "h1",
            "--controller",
            &url(),
        ])
        .arg("--conf-dir")
        .arg(c.conf.path())
        .arg("--cni-path")
        .arg(c.bin.path())
        .arg("--cache-dir")
        .arg(c.cache.path())
        .arg("--ipam-dir")
        .arg(ipam)
        .args(["--agent-metrics", METRICS])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor's JSON: {e}: {out:?}"));
    (out, report)
}

/// The findings of `status` about `check`, as (message, fix).
fn findings(report: &Value, check: &str, status: &str) -> Vec<(String, String)> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == check && f["status"] == status)
        .map(|f| {
            (
                f["message"].as_str().unwrap().to_string(),
                f["fix"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn doctor_finds_a_healthy_host_healthy_and_names_what_is_broken() {
    let mut c = Cluster::new("doc");
    c.start_agent_with(0, &["--metrics-listen", METRICS]);
    let ipam = tempfile::Builder::new()
        .prefix("cvt-ipam")
        .tempdir()
        .unwrap();
    c.network("docnet", "10.89.0.0/24", false);
    let conf = json!({
        "cniVersion": "1.1.0", "name": "brk",
        "plugins": [{"type": "bridge", "bridge": "cvtdocbr", "isGateway": true, "ipMasq": true,
            "ipam": {"type": "host-local", "subnet": "10.90.0.0/24", "dataDir": ipam.path()}}]
    });
    std::fs::write(c.conf.path().join("brk.conflist"), conf.to_string()).unwrap();
    let p1 = c.pod("p1");
    cluster::cni_result(&c.add(0, "docnet", &p1));
    let p2 = c.pod("p2");
    let netns = p2.path.display().to_string();
    cluster::cni_result(&c.cni(0, &["add", "brk", &netns]).output().unwrap());
    wait_until("the agent's readiness", Duration::from_secs(20), || {
        doctor(&c, ipam.path()).1["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["check"] == "agent" && f["message"].as_str().unwrap().ends_with("synced"))
    });

    let (out, report) = doctor(&c, ipam.path());
    assert!(out.status.success(), "{report:#}");
    assert_eq!(report["healthy"], true);
    for check in ["conflists", "plugins", "controller", "agent", "leftovers"] {
        assert!(
            !findings(&report, check, "ok").is_empty(),
            "no ok {check}: {report:#}"
        );
        assert!(findings(&report, check, "fail").is_empty(), "{report:#}");
    }
    let plugins = &findings(&report, "plugins", "ok")[0].0;
    assert!(plugins.contains("bridge (corvid,"), "{plugins}");
    assert!(findings(&report, "controller", "ok")[0]
        .0
        .contains(env!("CARGO_PKG_VERSION")));
    assert_eq!(findings(&report, "conflists", "ok").len(), 3, "{report:#}");

    // Broken on purpose: the runtime forgets p2's attachment, ...
    for entry in std::fs::read_dir(c.cache.path()).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with("brk-") {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
    // ... a container's namespace goes without a DEL, so its lease stays behind, ...
    let p3 = c.pod("p3");
    let gone = p3.path.display().to_string();
    cluster::cni_result(&c.cni(0, &["add", "brk", &gone]).output().unwrap());
    drop(p3);
    // ... a configuration does not parse, another names a plugin that is not there, ...
    std::fs::write(c.conf.path().join("zz-bad.conflist"), "{not json").unwrap();
    let missing = json!({"cniVersion": "1.1.0", "name": "missing",
        "plugins": [{"type": "cvt-nosuch"}]});
    std::fs::write(
        c.conf.path().join("zz-missing.conflist"),
        missing.to_string(),
    )
    .unwrap();
    // ... an agent veth is left without its port, ...
    c.hosts[0].ip("link add cvp0ddba11 type veth peer name cvtdocpeer");
    // ... and a masquerade set is left empty (by a corvid from before sets went with
    // their last element).
    let nft = |args: &str| {
        let out = c.hosts[0]
            .command("nft")
            .args(args.split_whitespace())
            .output()
            .unwrap();
        assert!(out.status.success(), "nft {args}: {out:?}");
    };
    nft("add set inet corvid masq-00000000deadbeef { type ipv4_addr ; }");

    let (out, report) = doctor(&c, ipam.path());
    assert!(!out.status.success());
    assert_eq!(report["healthy"], false);
    let confs = findings(&report, "conflists", "fail");
    assert!(
        confs
            .iter()
            .any(|(m, f)| m.contains("zz-bad.conflist") && f.contains("zz-bad.conflist")),
        "{confs:?}"
    );
    assert!(
        confs.iter().any(|(m, _)| m.contains("cvt-nosuch")),
        "{confs:?}"
    );
    let left = findings(&report, "leftovers", "fail");
    let lease = left
        .iter()
        .find(|(m, _)| m.contains("network brk") && m.contains("no runtime has attached"))
        .unwrap_or_else(|| panic!("no lease finding: {left:?}"));
    assert_eq!(lease.1, "corvid cni gc brk");
    let orphaned = left
        .iter()
        .find(|(m, _)| m.contains(&format!("whose namespace {gone} is gone")))
        .unwrap_or_else(|| panic!("no finding of the gone namespace: {left:?}"));
    assert!(orphaned
        .1
        .starts_with(&format!("corvid cni del brk {gone} --container-id ")));
    let elements = left
        .iter()
        .find(|(m, _)| m.contains("nftables elements of network brk"))
        .unwrap_or_else(|| panic!("no nftables finding: {left:?}"));
    assert_eq!(elements.1, "corvid cni gc brk");
    let veth = left
        .iter()
        .find(|(m, _)| m.contains("cvp0ddba11"))
        .unwrap_or_else(|| panic!("no veth finding: {left:?}"));
    assert_eq!(veth.1, "ip link del cvp0ddba11");
    let empty = left
        .iter()
        .find(|(m, _)| m.contains("set masq-00000000deadbeef in inet corvid is empty"))
        .unwrap_or_else(|| panic!("no finding of the empty set: {left:?}"));
    assert!(empty
        .1
        .ends_with("nft delete set inet corvid masq-00000000deadbeef"));
    assert!(
        !left.iter().any(|(m, _)| m.contains("network docnet")),
        "the healthy attachment was reported: {left:?}"
    );

    // The fixes it named, run as named, leave a healthy host.
    std::fs::remove_file(c.conf.path().join("zz-bad.conflist")).unwrap();
    std::fs::remove_file(c.conf.path().join("zz-missing.conflist")).unwrap();
    let del: Vec<&str> = orphaned.1.split(' ').skip(2).collect();
    let del = c.cni(0, &del).output().unwrap();
    assert!(del.status.success(), "{del:?}");
    let gc = c.cni(0, &["gc", "brk"]).output().unwrap();
    assert!(gc.status.success(), "{gc:?}");
    c.hosts[0].ip("link del cvp0ddba11");
    nft("delete set inet corvid masq-00000000deadbeef");
    let (out, report) = doctor(&c, ipam.path());
    assert!(out.status.success(), "{report:#}");
    assert!(findings(&report, "leftovers", "fail").is_empty());
}
