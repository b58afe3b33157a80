//! `corvid cni` end to end, run inside a private host namespace (as root).

use serde_json::{json, Value};
use std::process::{Command, Output};

struct Ns(std::path::PathBuf);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = corvid_net::Netns::delete_path(&self.0);
    }
}

fn corvid_in(host: &Ns, args: &[&str]) -> Output {
    let ns = corvid_net::Netns::open(&host.0).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_corvid"));
    cmd.args(args);
    ns.apply_to(&mut cmd).unwrap();
    cmd.output().unwrap()
}

#[test]
fn add_list_check_del_and_errors() {
    let tag = format!("cvt{}-cli", std::process::id());
    let host = Ns(corvid_net::Netns::create_named(&format!("{tag}-h")).unwrap());
    let bin = tempfile::tempdir().unwrap();
    let conf = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let install = corvid_in(
        &host,
        &["cni", "install", "--dir", bin.path().to_str().unwrap()],
    );
    assert!(
        install.status.success(),
        "{}",
        String::from_utf8_lossy(&install.stderr)
    );
    std::fs::write(
        conf.path().join("10-cvtcli.conflist"),
        json!({"cniVersion": "1.0.0", "name": "cvtcli", "plugins": [
            {"type": "bridge", "bridge": "cvtbrc", "isGateway": true,
             "ipam": {"type": "host-local", "subnet": "10.96.0.0/24", "dataDir": data.path()}}]})
        .to_string(),
    )
    .unwrap();
    let flags = [
        "--conf-dir",
        conf.path().to_str().unwrap(),
        "--cni-path",
        bin.path().to_str().unwrap(),
        "--cache-dir",
        cache.path().to_str().unwrap(),
    ];
    let cli = |args: &[&str]| {
        let mut all: Vec<&str> = vec!["cni"];
        all.extend_from_slice(args);
        all.extend_from_slice(&flags);
        corvid_in(&host, &all)
    };
    let ns_name = format!("{tag}-c");
    assert!(cli(&["netns", "add", &ns_name]).status.success());
    let c = Ns(std::path::PathBuf::from(format!("/run/netns/{ns_name}")));
    let netns = c.0.to_str().unwrap();

    let add = cli(&["add", "cvtcli", netns, "--container-id", "cli1", "--json"]);
    assert!(
        add.status.success(),
        "{}",
        String::from_utf8_lossy(&add.stderr)
    );
    let result: Value = serde_json::from_slice(&add.stdout).unwrap();
    assert_eq!(result["ips"][0]["address"], "10.96.0.2/24");
    let list = cli(&["list", "--json"]);
    let listing: Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(listing[0]["name"], "cvtcli");
    assert_eq!(listing[0]["attachments"][0]["containerID"], "cli1");
    let text = cli(&["list"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("10.96.0.2/24"));
    assert!(cli(&["check", "cvtcli", netns, "--container-id", "cli1"])
        .status
        .success());
    assert!(cli(&["del", "cvtcli", netns, "--container-id", "cli1"])
        .status
        .success());
    let after: Value = serde_json::from_slice(&cli(&["list", "--json"]).stdout).unwrap();
    assert_eq!(after[0]["attachments"], json!([]));
    assert!(std::fs::read_dir(data.path().join("cvtcli"))
        .unwrap()
        .all(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .parse::<std::net::IpAddr>()
                .is_err()
        }));

    let missing = cli(&["add", "nonet", netns]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("network \"nonet\" is not configured")
    );
    let as_json = cli(&["add", "nonet", netns, "--json"]);
    let err: Value = serde_json::from_slice(&as_json.stdout).unwrap();
    assert_eq!(err["code"], 7);
    let bad_args = cli(&["add", "cvtcli", netns, "--args", "novalue"]);
    assert!(String::from_utf8_lossy(&bad_args.stderr).contains("CNI_ARGS"));
    // A second file defining the same network: the first wins, and the user is told.
    std::fs::write(
        conf.path().join("20-again.conflist"),
        json!({"cniVersion": "1.0.0", "name": "cvtcli", "plugins": [{"type": "loopback"}]})
            .to_string(),
    )
    .unwrap();
    let warned = cli(&["list"]);
    assert!(String::from_utf8_lossy(&warned.stderr).contains("20-again.conflist is ignored"));
    assert!(cli(&["netns", "del", &ns_name]).status.success());
}
