//! The controller driven by the real OpenStack clients: python-neutronclient (kuryr-
//! libnetwork's, and many scripts') and openstacksdk (kuryr-kubernetes' and most current
//! tools'). What each checks is in `tests/data/neutron_client.py` and
//! `tests/data/openstacksdk_client.py`.

#[path = "support/controller.rs"]
mod support;

use std::process::Command;

#[test]
fn python_neutronclient_works_against_the_controller_on_either_store() {
    let (_dir, spec) = support::redb_store();
    let token = Some("nc-token");
    run_script(
        "neutron_client.py",
        &support::ControllerProcess::start(&spec, token),
    );
    let etcd = support::Etcd::start();
    let on_etcd = support::ControllerProcess::start(&format!("etcd:{}", etcd.url), token);
    run_script("neutron_client.py", &on_etcd);
}

#[test]
fn openstacksdk_discovers_and_drives_networks_routers_security_groups_and_load_balancers() {
    let (_dir, spec) = support::redb_store();
    run_script(
        "openstacksdk_client.py",
        &support::ControllerProcess::start(&spec, None),
    );
}

/// Runs a script of `tests/data` against `ctl` and expects it to end with `<name>: ok`.
fn run_script(script: &str, ctl: &support::ControllerProcess) {
    let path = format!("{}/tests/data/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .args([path.as_str(), &ctl.url, "nc-token"])
        .output()
        .expect("python3 runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{stdout}{stderr}\n(the clients come from scripts/test.sh)"
    );
    assert!(stdout.trim_end().ends_with(": ok"), "{stdout}");
}
