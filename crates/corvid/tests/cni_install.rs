//! `corvid cni install` puts working plugins into a directory.

use std::process::Command;

#[path = "support/plugins.rs"]
mod plugins;

#[test]
fn installs_runnable_plugins() {
    let dir = tempfile::tempdir().unwrap();
    // What `corvid cni install` copies by default: checked to be there and fresh.
    plugins::binary();
    for _ in 0..2 {
        let out = Command::new(env!("CARGO_BIN_EXE_corvid"))
            .args(["cni", "install", "--dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for name in ["bridge", "host-local", "loopback"] {
        let out = Command::new(dir.path().join(name))
            .env("CNI_COMMAND", "VERSION")
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["supportedVersions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x == "1.1.0"));
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_corvid"))
        .args(["cni", "frob"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
}
