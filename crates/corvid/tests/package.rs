//! The Debian package (scripts/build-deb.sh) installed into a clean Debian root (a chroot
//! made by debootstrap, which scripts/test.sh caches): its files are where they belong,
//! the plugins (the static binary that ships) answer at /opt/cni/bin without displacing a
//! plugin already there, systemd accepts its units, and removing and purging take back
//! what they should.

#[path = "support/static_plugins.rs"]
mod static_plugins;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The clean root scripts/test.sh makes once (debootstrap minbase with systemd).
const CLEAN_ROOT: &str = "/var/cache/corvid-debroot";

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn in_root(root: &Path, args: &[&str]) -> Output {
    run(Command::new("chroot")
        .arg(root)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"))
}

#[test]
fn the_package_installs_into_a_clean_root_and_is_removed_cleanly() {
    assert!(
        Path::new(CLEAN_ROOT).join("usr/bin/dpkg").exists(),
        "{CLEAN_ROOT} is missing: scripts/test.sh makes it with debootstrap"
    );
    let work = tempfile::Builder::new()
        .prefix("cvt-pkg")
        .tempdir()
        .unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_corvid")).parent().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = run(Command::new(repo.join("scripts/build-deb.sh"))
        .arg("--bin-dir")
        .arg(bin)
        .arg("--plugins")
        .arg(static_plugins::path())
        .arg("--out")
        .arg(work.path())
        .env("CORVID_DEB_COMPRESSION", "none"));
    let deb = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert!(deb.exists(), "{}", deb.display());

    let root = work.path().join("root");
    run(Command::new("cp").arg("-a").arg(CLEAN_ROOT).arg(&root));
    std::fs::copy(&deb, root.join("tmp/corvid.deb")).unwrap();
    // A portmap from elsewhere is there first: the package must leave it alone.
    std::fs::create_dir_all(root.join("opt/cni/bin")).unwrap();
    std::fs::write(root.join("opt/cni/bin/portmap"), "#!/bin/sh\necho theirs\n").unwrap();

    in_root(&root, &["dpkg", "-i", "/tmp/corvid.deb"]);
    let version = in_root(&root, &["/usr/bin/corvid", "--version"]);
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("corvid {}", env!("CARGO_PKG_VERSION"))
    );
    for plugin in [
        "bridge",
        "host-local",
        "loopback",
        "firewall",
        "tuning",
        "bandwidth",
        "corvid",
        "corvid-k8s",
    ] {
        let path = format!("/opt/cni/bin/{plugin}");
        let out = Command::new("chroot")
            .arg(&root)
            .arg(&path)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", "VERSION")
            .output()
            .unwrap();
        assert!(out.status.success(), "{path}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("supportedVersions"));
    }
    assert_eq!(
        std::fs::read_to_string(root.join("opt/cni/bin/portmap")).unwrap(),
        "#!/bin/sh\necho theirs\n",
        "the package replaced a plugin it does not own"
    );
    for file in [
        "lib/systemd/system/corvid-controller.service",
        "lib/systemd/system/corvid-agent.service",
        "lib/systemd/system/corvid-docker-plugin.service",
        "lib/systemd/system/corvid-docker-plugin.socket",
        "lib/systemd/system/corvid-dhcp.service",
        "lib/systemd/system/corvid-dhcp.socket",
        "etc/corvid/controller.env",
        "etc/corvid/agent.env",
        "etc/corvid/docker-plugin.env",
        "usr/share/man/man1/corvid.1.gz",
        "usr/share/man/man1/corvid-controller.1.gz",
        "usr/share/man/man1/corvid-agent.1.gz",
        "usr/share/man/man1/corvid-docker-plugin.1.gz",
        "usr/share/man/man1/corvid-cni-add.1.gz",
        "usr/share/bash-completion/completions/corvid",
        "usr/share/zsh/vendor-completions/_corvid",
        "usr/share/fish/vendor_completions.d/corvid.fish",
    ] {
        assert!(root.join(file).exists(), "{file} is not installed");
    }
    let conffiles = in_root(
        &root,
        &[
            "dpkg-query",
            "--showformat=${Conffiles}",
            "--show",
            "corvid",
        ],
    );
    assert!(String::from_utf8_lossy(&conffiles.stdout).contains("/etc/corvid/controller.env"));
    let controller =
        std::fs::read_to_string(root.join("lib/systemd/system/corvid-controller.service")).unwrap();
    assert!(controller.contains("DynamicUser=yes"));
    assert!(controller.lines().any(|l| l == "CapabilityBoundingSet="));

    // systemd's own check of the units, against the root's systemd.
    let units: Vec<PathBuf> = [
        "corvid-controller.service",
        "corvid-agent.service",
        "corvid-docker-plugin.service",
        "corvid-docker-plugin.socket",
        "corvid-dhcp.service",
        "corvid-dhcp.socket",
    ]
    .iter()
    .map(|u| root.join("lib/systemd/system").join(u))
    .collect();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(format!("--root={}", root.display()))
        .args(&units)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );

    // Removal takes the binaries and the alternatives and keeps the configuration;
    // purging takes the configuration too.
    in_root(&root, &["dpkg", "-r", "corvid"]);
    assert!(!root.join("usr/bin/corvid").exists());
    assert!(root.join("opt/cni/bin/bridge").symlink_metadata().is_err());
    assert!(root.join("opt/cni/bin/portmap").exists());
    assert!(root.join("etc/corvid/controller.env").exists());
    in_root(&root, &["dpkg", "-P", "corvid"]);
    assert!(!root.join("etc/corvid").exists());
}

#[test]
fn the_container_image_builds_from_the_binaries_and_runs() {
    assert!(
        Path::new(CLEAN_ROOT).join("usr/bin/dpkg").exists(),
        "{CLEAN_ROOT} is missing: scripts/test.sh makes it with debootstrap"
    );
    // Private image storage; the clean root stands in for the Debian base image, which
    // this machine cannot pull.
    let work = tempfile::Builder::new()
        .prefix("cvt-img")
        .tempdir()
        .unwrap();
    let podman = |args: &[&str]| {
        let mut cmd = Command::new("podman");
        cmd.arg("--root")
            .arg(work.path().join("root"))
            .arg("--runroot")
            .arg(work.path().join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args);
        cmd
    };
    let base = run(Command::new("sh").arg("-c").arg(format!(
        "tar -C {CLEAN_ROOT} -c . | podman --root {0}/root --runroot {0}/run --storage-driver vfs import - localhost/cvt-base:1",
        work.path().display()
    )));
    assert!(!base.stdout.is_empty());
    let context = work.path().join("context");
    std::fs::create_dir(&context).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_corvid"), context.join("corvid")).unwrap();
    // The plugin binary that ships, static, as the DaemonSet copies it onto hosts.
    std::fs::copy(static_plugins::path(), context.join("corvid-plugins")).unwrap();
    let containerfile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/Containerfile");
    run(podman(&[
        "build",
        "--quiet",
        "--build-arg",
        "BASE=localhost/cvt-base:1",
        "-t",
        "localhost/cvt-corvid:1",
        "-f",
    ])
    .arg(&containerfile)
    .arg(&context));
    // The sandbox refuses the runtime's default rlimits: small explicit ones are set.
    let limits = [
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1000:1000",
        "--network",
        "none",
    ];
    let version = run(podman(&["run", "--rm"])
        .args(limits)
        .arg("localhost/cvt-corvid:1")
        .arg("--version"));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("corvid {}", env!("CARGO_PKG_VERSION"))
    );
    // What the node DaemonSet's init container does: install the plugins with a shell.
    let installed = run(podman(&["run", "--rm", "--entrypoint", "sh"])
        .args(limits)
        .arg("localhost/cvt-corvid:1")
        .args(["-c", "corvid cni install --dir /tmp/bin >/dev/null && CNI_COMMAND=VERSION /tmp/bin/bridge </dev/null"]));
    assert!(String::from_utf8_lossy(&installed.stdout).contains("supportedVersions"));
}
