//! The controller under a schema-driven HTTP fuzzer: schemathesis reads `/openapi.json`
//! and sends generated requests, valid and not, to every operation. No answer may be a
//! server error, and none may hang (an empty bulk once did).

#[path = "support/controller.rs"]
mod support;

use std::process::Command;

/// Fuzzes the operations whose path matches `paths` with `examples` requests each.
fn fuzz(ctl: &support::ControllerProcess, dir: &std::path::Path, paths: &str, examples: u32) {
    let out = Command::new("schemathesis")
        .current_dir(dir)
        .args(["run", &format!("{}/openapi.json", ctl.url)])
        .args(["--checks", "not_a_server_error"])
        .args(["--max-examples", &examples.to_string()])
        .args(["--workers", "2", "--seed", "1", "--request-timeout", "5"])
        .args(["--generation-database", "none", "--no-color"])
        .args(["--include-path-regex", paths])
        // A watch long-polls by design; tests/controller.rs covers it.
        .args(["--exclude-path", "/v2.0/watch"])
        .output()
        .expect("schemathesis is installed (scripts/test.sh installs it with pip)");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("passed"), "{report}");
}

#[test]
fn generated_requests_never_get_a_server_error_or_hang_on_either_store() {
    let (dir, spec) = support::redb_store();
    fuzz(
        &support::ControllerProcess::start(&spec, None),
        dir.path(),
        ".",
        10,
    );
    let etcd = support::Etcd::start();
    let ctl = support::ControllerProcess::start(&format!("etcd:{}", etcd.url), None);
    fuzz(&ctl, dir.path(), ".", 10);
}

/// Security groups and rules take the most validated bodies of the API (protocols by
/// name or number, port ranges, prefixes of a version): they get more requests.
#[test]
fn generated_security_group_requests_never_get_a_server_error() {
    let (dir, spec) = support::redb_store();
    let ctl = support::ControllerProcess::start(&spec, None);
    fuzz(&ctl, dir.path(), "^/v2.0/security-group", 60);
}
