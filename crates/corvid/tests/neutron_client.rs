//! The controller driven by python-neutronclient, the real client of kuryr-libnetwork and
//! of many Neutron scripts (`tests/data/neutron_client.py` holds what it checks).

// Shared with the other controller tests; this one needs only part of it.
#[allow(dead_code)]
#[path = "support/controller.rs"]
mod support;

use std::process::Command;

#[test]
fn python_neutronclient_works_against_the_controller_on_either_store() {
    let (_dir, spec) = support::redb_store();
    run_script(&support::Controller::start(&spec, Some("nc-token")));
    let etcd = support::Etcd::start();
    run_script(&support::Controller::start(
        &format!("etcd:{}", etcd.url),
        Some("nc-token"),
    ));
}

fn run_script(ctl: &support::Controller) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/neutron_client.py");
    let out = Command::new("python3")
        .args([script, &ctl.url, "nc-token"])
        .output()
        .expect("python3 runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{stdout}{stderr}\n(python-neutronclient comes from scripts/test.sh)"
    );
    assert!(stdout.contains("neutronclient: ok"), "{stdout}");
}
