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

#[test]
fn logs_go_to_stderr_filtered_by_level_and_as_json_on_request() {
    use std::io::{BufRead, BufReader};
    let state = tempfile::Builder::new()
        .prefix("cvt-log")
        .tempdir()
        .unwrap();
    let controller = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_corvid"))
            .args(args)
            .args(["controller", "--listen", "127.0.0.1:0", "--store"])
            .arg(format!("redb:{}", state.path().join("s.redb").display()))
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // JSON: one object per line, with the level and the message.
    let mut json = Proc(controller(&["--log-format", "json"]));
    let line = BufReader::new(json.0.stderr.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    let event: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(event["level"], "INFO", "{line}");
    assert_eq!(event["fields"]["message"], "controller listening", "{line}");
    json.kill9();
    // Above the level: nothing is written.
    let mut quiet = Proc(controller(&["--log-level", "warn"]));
    std::thread::sleep(Duration::from_millis(500));
    quiet.kill9();
    let mut written = String::new();
    std::io::Read::read_to_string(&mut quiet.0.stderr.take().unwrap(), &mut written).unwrap();
    std::io::Read::read_to_string(&mut quiet.0.stdout.take().unwrap(), &mut written).unwrap();
    assert!(written.is_empty(), "{written}");
    // A filter that does not parse is refused before anything starts.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_corvid"))
        .args(["--log-level", "info,[[", "cni", "list"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--log-level"));
}
