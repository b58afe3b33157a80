//! `corvid up` as the README tells a newcomer to use it, inside a private host namespace
//! (as root): it starts everything, writes the CNI configuration, and two namespaces
//! attached with `corvid cni add` ping each other.

#[path = "support/ns.rs"]
mod ns;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use ns::{wait_until, Ns, Proc};
use serde_json::Value;

#[test]
fn up_then_two_namespaces_ping_each_other() {
    let tag = format!("cvt{}up", std::process::id());
    let host = Ns::new(&tag, "host");
    host.ip("link set lo up");
    let state = tempfile::Builder::new().prefix("cvt-up").tempdir().unwrap();
    let conf = state.path().join("net.d");
    let bin = state.path().join("bin");
    let _up = Proc(
        host.command(env!("CARGO_BIN_EXE_corvid"))
            .args(["up", "--host-id", "demo", "--state-dir"])
            .arg(state.path().join("lib"))
            .arg("--conf-dir")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let conflist = conf.join("corvid.conflist");
    wait_until("corvid up", Duration::from_secs(30), || conflist.exists());
    let written: Value = serde_json::from_slice(&std::fs::read(&conflist).unwrap()).unwrap();
    assert_eq!(written["plugins"][0]["type"], "corvid");
    assert_eq!(written["plugins"][0]["hostId"], "demo");

    let plugins = Path::new(env!("CARGO_BIN_EXE_corvid")).with_file_name("corvid-plugins");
    let corvid = |args: &[&str]| {
        let out = host
            .command(env!("CARGO_BIN_EXE_corvid"))
            .args(["cni", "--json", "--conf-dir"])
            .arg(&conf)
            .arg("--cni-path")
            .arg(&bin)
            .arg("--cache-dir")
            .arg(state.path().join("cache"))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "corvid cni {args:?}: {out:?}");
        out.stdout
    };
    corvid(&[
        "install",
        "--dir",
        bin.to_str().unwrap(),
        "--from",
        plugins.to_str().unwrap(),
    ]);
    let a = Ns::new(&tag, "a");
    let b = Ns::new(&tag, "b");
    let ip = |pod: &Ns| -> String {
        let result: Value =
            serde_json::from_slice(&corvid(&["add", "corvid", pod.path.to_str().unwrap()]))
                .unwrap();
        let addr = result["ips"][0]["address"].as_str().unwrap().to_string();
        assert!(addr.starts_with("10.77."), "{addr}");
        addr.split('/').next().unwrap().to_string()
    };
    let (ip_a, ip_b) = (ip(&a), ip(&b));
    assert!(a.ping(&ip_b));
    assert!(b.ping(&ip_a));
    corvid(&["del", "corvid", a.path.to_str().unwrap()]);
    corvid(&["del", "corvid", b.path.to_str().unwrap()]);
    wait_until("the agent to unplug a", Duration::from_secs(10), || {
        a.netlink().link_by_name("eth0").unwrap().is_none()
    });
}
