//! The plugin binary these tests install: `corvid-plugins`, beside the corvid binary.
//! `cargo test -p corvid` builds corvid but not that binary, so after a change to the
//! plugins or to a crate they are built from, the tests would run the old plugins: the
//! binary is checked against those crates' sources first.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

use serde_json::Value;

/// `corvid-plugins` beside the corvid binary, checked (once per test process) to exist and
/// to be newer than every source file of the workspace crates it is built from; the
/// test fails saying how to build it otherwise.
pub fn binary() -> PathBuf {
    static CHECKED: OnceLock<PathBuf> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let bin = Path::new(env!("CARGO_BIN_EXE_corvid")).with_file_name("corvid-plugins");
            let built = modified(&bin).unwrap_or_else(|| {
                panic!(
                    "{} is missing: build it (cargo build --workspace, or cargo test --workspace)",
                    bin.display()
                )
            });
            let mut sources = Vec::new();
            for dir in crates_built_into("corvid-plugins") {
                rust_files(&dir.join("src"), &mut sources);
                sources.push(dir.join("build.rs"));
            }
            let newer: Vec<String> = sources
                .iter()
                .filter(|s| modified(s).is_some_and(|t| t > built))
                .map(|s| s.display().to_string())
                .collect();
            assert!(
                newer.is_empty(),
                "{} is stale, older than {newer:?}: the tests would run old plugins. Build \
                 it (cargo build --workspace, or cargo test --workspace)",
                bin.display()
            );
            bin
        })
        .clone()
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The directories of `package` and of every workspace crate it depends on (normal and
/// build dependencies, transitively), as `cargo metadata` reads the manifests.
fn crates_built_into(package: &str) -> Vec<PathBuf> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {out:?}");
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let dir = |p: &Value| {
        Path::new(p["manifest_path"].as_str().unwrap())
            .parent()
            .unwrap()
            .to_path_buf()
    };
    let mut found = vec![dir(packages
        .iter()
        .find(|p| p["name"] == package)
        .expect("the package is in the workspace"))];
    let mut i = 0;
    while i < found.len() {
        let p = packages.iter().find(|p| dir(p) == found[i]).unwrap();
        for d in p["dependencies"].as_array().unwrap() {
            let path = d["path"].as_str().map(PathBuf::from);
            if let (Some(path), false) = (path, d["kind"] == "dev") {
                if !found.contains(&path) {
                    found.push(path);
                }
            }
        }
        i += 1;
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
