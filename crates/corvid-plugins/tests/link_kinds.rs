//! ipvlan, vlan, dummy and vrf: their link kinds need kernel modules this machine's
//! kernel lacks and cannot load, so `link_kinds_in_a_vm` boots Debian's kernel under
//! qemu with an initramfs holding this test binary, the plugins, `ip`, busybox and the
//! modules, and runs the other (ignored) tests of this file there. Each of those makes
//! its namespaces inside the VM as any plugin test does: every version's ADD, CHECK, DEL
//! and DEL again, traffic, the reference's plugins side by side, and refusals.

mod support;

use corvid_cni::version::ALL;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use support::*;

/// Where scripts/test.sh keeps the kernel: `vmlinuz` and the modules in `modules/`,
/// loaded in the order of `modules/order`.
fn kernel_dir() -> PathBuf {
    std::env::var_os("CORVID_VM_KERNEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/corvid-vmkernel"))
}

/// The shared libraries `bin` loads, with the loader, as ldd lists them.
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(bin).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// Copies `from` to `root` + `to`, with its directories.
fn put(root: &Path, from: &Path, to: &Path) {
    let dst = root.join(to.strip_prefix("/").unwrap_or(to));
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    std::fs::copy(from, &dst).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
}

/// Puts `bin` at `to` in the initramfs, with its libraries at their own paths.
fn put_program(root: &Path, bin: &Path, to: &Path) {
    put(root, bin, to);
    for lib in libraries(bin) {
        put(root, &lib, &lib);
    }
}

#[test]
fn link_kinds_in_a_vm() {
    let kernel = kernel_dir();
    assert!(
        kernel.join("vmlinuz").exists(),
        "no kernel in {} (scripts/test.sh makes it from Debian's linux-image package)",
        kernel.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    for d in ["bin", "proc", "sys", "dev", "tmp", "run", "mods"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    put(&root, Path::new("/bin/busybox"), Path::new("/bin/busybox"));
    let order = std::fs::read_to_string(kernel.join("modules/order")).unwrap();
    for m in order.split_whitespace() {
        put(
            &root,
            &kernel.join("modules").join(format!("{m}.ko")),
            &Path::new("/mods").join(format!("{m}.ko")),
        );
    }
    let me = std::env::current_exe().unwrap();
    put_program(&root, &me, Path::new("/t"));
    let plugins = support::plugin_binary();
    put_program(&root, &plugins, &plugins);
    put_program(&root, Path::new("/usr/sbin/ip"), Path::new("/usr/sbin/ip"));
    for p in ["host-local", "ipvlan", "vlan", "vrf", "macvlan"] {
        let reference = Path::new(REFERENCE_DIR).join(p);
        put(&root, &reference, &reference);
    }
    let init = format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/bin
mount -t devtmpfs dev /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
# /tmp stays the initramfs's own: the plugin binary may live under it, as in a clone
# in /tmp.
mount -t tmpfs run /run
mkdir -p /run/netns
for m in {order}; do insmod /mods/$m.ko; done
ip link set lo up
{binary_env}RUST_BACKTRACE=0 /t --ignored --test-threads=1 2>&1
echo "CVT-VM-EXIT $?"
poweroff -f
"#,
        order = order.split_whitespace().collect::<Vec<_>>().join(" "),
        // The tests inside run the same binary as the host's.
        binary_env = std::env::var("CORVID_STATIC_PLUGINS")
            .map(|p| format!("CORVID_STATIC_PLUGINS={p} "))
            .unwrap_or_default(),
    );
    std::fs::write(root.join("init"), init).unwrap();
    std::fs::set_permissions(
        root.join("init"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let cpio = dir.path().join("initramfs.cpio");
    let packed = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd {} && find . | cpio -o -H newc --quiet > {}",
            root.display(),
            cpio.display()
        ))
        .status()
        .unwrap();
    assert!(packed.success(), "cpio (package cpio)");
    // Software emulation: nested KVM is not to be relied on here.
    let out = Command::new("timeout")
        .args(["900", "qemu-system-x86_64", "-accel", "tcg", "-m", "2048"])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(kernel.join("vmlinuz"))
        .arg("-initrd")
        .arg(&cpio)
        .args(["-append", "console=ttyS0 quiet panic=-1"])
        .stdin(Stdio::null())
        .output()
        .expect("qemu-system-x86_64 (package qemu-system-x86)");
    let log = String::from_utf8_lossy(&out.stdout);
    let tail: String = log
        .lines()
        .rev()
        .take(120)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        log.contains("CVT-VM-EXIT 0"),
        "the tests in the VM failed:\n{tail}"
    );
    let want = format!("test result: ok. {} passed", INNER_TESTS);
    assert!(log.contains(&want), "expected {want}:\n{tail}");
    println!("{tail}");
}

/// How many tests run in the VM.
const INNER_TESTS: usize = 8;

/// A host namespace whose `cvtm0` is a veth to a "segment" namespace holding `srv0`, and a
/// lease directory.
struct Segment {
    host: TestNs,
    segment: TestNs,
    plugins: PluginDir,
    data: tempfile::TempDir,
}

impl Segment {
    fn new() -> Segment {
        let (host, segment) = (TestNs::new(), TestNs::new());
        host.ip(&format!(
            "link add cvtm0 type veth peer name srv0 netns {}",
            segment.name
        ));
        host.ip("link set cvtm0 up");
        segment.ip("link set srv0 up");
        Segment {
            host,
            segment,
            plugins: PluginDir::new(),
            data: tempfile::tempdir().unwrap(),
        }
    }

    fn conf(&self, version: &str, plugin: &str, subnet: &str, extra: Value) -> String {
        let mut c = json!({"cniVersion": version, "name": "cvtlk", "type": plugin,
            "ipam": {"type": "host-local", "subnet": subnet, "dataDir": self.data.path()}});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c.to_string()
    }

    fn call(&self, reference: bool, command: &str, id: &str, pod: &TestNs, conf: &str) -> Call<'_> {
        let plugin: Value = serde_json::from_str(conf).unwrap();
        let (path, dirs) = self
            .plugins
            .pick(plugin["type"].as_str().unwrap(), reference);
        Call::new(&self.host, path, command, id, &pod.path_str(), &dirs, conf)
    }
}

fn with_prev(conf: &str, prev: &Value) -> String {
    let mut c: Value = serde_json::from_str(conf).unwrap();
    c["prevResult"] = prev.clone();
    c.to_string()
}

/// `ip -d -j link show NAME` in `ns`: the kind and its data, the MTU and whether it is up.
fn link(ns: &TestNs, name: &str) -> Value {
    let out = ns
        .command("ip")
        .args(["-d", "-j", "link", "show", name])
        .output()
        .unwrap();
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let l = all.first().cloned().unwrap_or(Value::Null);
    json!({"kind": l["linkinfo"]["info_kind"], "data": l["linkinfo"]["info_data"],
           "mtu": l["mtu"], "up": l["flags"].as_array().is_some_and(|f| f.contains(&json!("UP")))})
}

/// Every version's ADD, CHECK, DEL and DEL again of `conf(version)` in a new pod.
fn every_version(seg: &Segment, conf: impl Fn(&str) -> String, kind: &str) {
    for version in ALL {
        let pod = TestNs::new();
        let c = conf(version.as_str());
        let r = seg.call(false, "ADD", "cvtv", &pod, &c).ok();
        assert_eq!(r["cniVersion"], version.as_str());
        assert_eq!(link(&pod, "eth0")["kind"], kind, "{version}");
        if version.allows_check() {
            seg.call(false, "CHECK", "cvtv", &pod, &with_prev(&c, &r))
                .ok();
        }
        seg.call(false, "DEL", "cvtv", &pod, &c).ok();
        assert!(pod.links().is_empty(), "{version}: eth0 is gone");
        seg.call(false, "DEL", "cvtv", &pod, &c).ok();
    }
}

/// ADD by corvid's `plugin` and by the reference's, each on a segment of its own: the same
/// result (but for the MAC and namespace) and the same link.
fn side_by_side(plugin: &str, subnet: &str, extra: Value) {
    let mut seen = Vec::new();
    for reference in [false, true] {
        let seg = Segment::new();
        let pod = TestNs::new();
        let c = seg.conf("1.0.0", plugin, subnet, extra.clone());
        let mut r = seg.call(reference, "ADD", "cvtref", &pod, &c).ok();
        r["interfaces"][0]["mac"] = json!("");
        r["interfaces"][0]["sandbox"] = json!("");
        seen.push((r, link(&pod, "eth0")));
        seg.call(reference, "DEL", "cvtref", &pod, &c).ok();
    }
    assert_eq!(seen[0], seen[1], "corvid's {plugin} and the reference's");
}

/// `conf` refused with `code`, the pod left as it was.
fn refused(seg: &Segment, conf: &str, code: u64, why: &str) {
    let pod = TestNs::new();
    let o = seg.call(false, "ADD", "cvtbad", &pod, conf).run();
    assert!(!o.success, "{why}: {}", o.stdout);
    assert_eq!(o.code(), code, "{why}: {}", o.stdout);
    assert!(pod.links().is_empty(), "{why}: half-made interface");
    assert!(
        leases(seg.data.path(), "cvtlk").is_empty(),
        "{why}: an address was leaked"
    );
}

#[test]
#[ignore = "runs inside the VM of link_kinds_in_a_vm: this kernel has no ipvlan, vlan, dummy or vrf"]
fn ipvlan_every_version_siblings_and_the_segment() {
    let seg = Segment::new();
    seg.segment.ip("addr add 10.90.0.254/24 dev srv0");
    let conf = |v: &str| seg.conf(v, "ipvlan", "10.90.0.0/24", json!({"master": "cvtm0"}));
    every_version(&seg, conf, "ipvlan");
    for mode in ["l2", "l3", "l3s"] {
        let (p1, p2) = (TestNs::new(), TestNs::new());
        let c = seg.conf(
            "1.1.0",
            "ipvlan",
            "10.90.0.0/24",
            json!({"master": "cvtm0", "mode": mode}),
        );
        let r1 = seg.call(false, "ADD", "cvt1", &p1, &c).ok();
        seg.call(false, "ADD", "cvt2", &p2, &c).ok();
        assert_eq!(link(&p1, "eth0")["data"]["mode"], mode);
        let a1 = result_ip(&r1, true);
        assert!(p2.ping(&a1), "{mode}: siblings reach each other");
        if mode == "l2" {
            assert!(p1.ping("10.90.0.254"), "l2: the master's segment");
        }
        seg.call(false, "CHECK", "cvt1", &p1, &with_prev(&c, &r1))
            .ok();
        let other = seg.conf(
            "1.1.0",
            "ipvlan",
            "10.90.0.0/24",
            json!({"master": "cvtm0", "mode": if mode == "l2" {"l3"} else {"l2"}}),
        );
        let o = seg
            .call(false, "CHECK", "cvt1", &p1, &with_prev(&other, &r1))
            .run();
        assert!(!o.success, "{mode}: CHECK passed with another mode");
        seg.call(false, "DEL", "cvt1", &p1, &c).ok();
        seg.call(false, "DEL", "cvt2", &p2, &c).ok();
    }
}

#[test]
#[ignore = "runs inside the VM of link_kinds_in_a_vm: this kernel has no ipvlan, vlan, dummy or vrf"]
fn ipvlan_side_by_side_chained_and_refusals() {
    side_by_side(
        "ipvlan",
        "10.91.0.0/24",
        json!({"master": "cvtm0", "mode": "l3", "mtu": 1400}),
    );
    let seg = Segment::new();

    // Chained without IPAM: the previous result's addresses, on its single interface.
    let pod = TestNs::new();
    pod.ip("link add cvtup type veth peer name cvtpeer");
    pod.ip("link set cvtup up");
    let prev = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "cvtup"}],
        "ips": [{"address": "10.92.0.7/24"}]});
    let c = with_prev(
        &json!({"cniVersion": "1.0.0", "name": "cvtlk", "type": "ipvlan", "linkInContainer": true})
            .to_string(),
        &prev,
    );
    let r = seg.call(false, "ADD", "cvtchain", &pod, &c).ok();
    assert_eq!(r["ips"][0]["address"], "10.92.0.7/24");
    let out = pod
        .command("ip")
        .args(["-j", "addr", "show", "eth0"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("10.92.0.7"));
    seg.call(false, "DEL", "cvtchain", &pod, &c).ok();

    let bad = |extra: Value| seg.conf("1.0.0", "ipvlan", "10.91.0.0/24", extra);
    refused(
        &seg,
        &bad(json!({"master": "cvtm0", "mode": "cvt"})),
        7,
        "unknown mode",
    );
    refused(
        &seg,
        &bad(json!({"master": "cvtnope"})),
        7,
        "missing master",
    );
    refused(
        &seg,
        &bad(json!({"master": "cvtm0", "mtu": 9000})),
        7,
        "mtu above the master's",
    );
}

#[test]
#[ignore = "runs inside the VM of link_kinds_in_a_vm: this kernel has no ipvlan, vlan, dummy or vrf"]
fn vlan_every_version_and_isolation() {
    let seg = Segment::new();
    seg.segment
        .ip("link add link srv0 name srv0.42 type vlan id 42");
    seg.segment.ip("link set srv0.42 up");
    seg.segment.ip("addr add 10.93.0.254/24 dev srv0.42");
    let conf = |v: &str| {
        seg.conf(
            v,
            "vlan",
            "10.93.0.0/24",
            json!({"master": "cvtm0", "vlanId": 42}),
        )
    };
    every_version(&seg, conf, "vlan");
    let (p42, p43) = (TestNs::new(), TestNs::new());
    let c42 = conf("1.1.0");
    let r = seg.call(false, "ADD", "cvt42", &p42, &c42).ok();
    assert_eq!(link(&p42, "eth0")["data"]["id"], 42);
    assert!(
        p42.ping("10.93.0.254"),
        "VLAN 42 reaches the segment's VLAN 42"
    );
    let c43 = seg.conf(
        "1.1.0",
        "vlan",
        "10.93.0.0/24",
        json!({"master": "cvtm0", "vlanId": 43}),
    );
    seg.call(false, "ADD", "cvt43", &p43, &c43).ok();
    assert!(!p43.ping("10.93.0.254"), "VLAN 43 does not reach VLAN 42");
    let o = seg
        .call(false, "CHECK", "cvt42", &p42, &with_prev(&c43, &r))
        .run();
    assert!(!o.success, "CHECK passed with another VLAN ID");
    seg.call(false, "DEL", "cvt42", &p42, &c42).ok();
    seg.call(false, "DEL", "cvt43", &p43, &c43).ok();
}

#[test]
#[ignore = "runs inside the VM of link_kinds_in_a_vm: this kernel has no ipvlan, vlan, dummy or vrf"]
fn vlan_side_by_side_and_refusals() {
    side_by_side(
        "vlan",
        "10.94.0.0/24",
        json!({"master": "cvtm0", "vlanId": 7, "mtu": 1300}),
    );
    let seg = Segment::new();
    let bad = |extra: Value| seg.conf("1.0.0", "vlan", "10.94.0.0/24", extra);
    refused(
        &seg,
        &bad(json!({"master": "cvtm0", "vlanId": 5000})),
        7,
        "vlanId out of range",
    );
    refused(
        &seg,
        &bad(json!({"master": "cvtm0", "vlanId": -1})),
        7,
        "negative vlanId",
    );
    refused(&seg, &bad(json!({"vlanId": 7})), 7, "no master");
    refused(
        &seg,
        &bad(json!({"master": "cvtnope", "vlanId": 7})),
        7,
        "missing master",
    );
    refused(
        &seg,
        &bad(json!({"master": "cvtm0", "vlanId": 7, "mtu": 9000})),
        7,
        "mtu above the master's",
    );
}

#[test]
#[ignore = "runs inside the VM of link_kinds_in_a_vm: this kernel has no ipvlan, vlan, dummy or vrf"]
fn dummy_every_version_and_refusals() {
    let seg = Segment::new();
    let conf = |v: &str| seg.conf(v, "dummy", "10.95.0.0/24", json!({}));
    every_version(&seg, conf, "dummy");
    let pod = TestNs::new();
    pod.ip("link set lo up");
    let r = seg.call(false, "ADD", "cvtd", &pod, &conf("1.0.0")).ok();
    let ip = result_ip(&r, true);
    assert!(pod.ping(&ip), "the dummy's address answers in the pod");
    assert_eq!(link(&pod, "eth0")["up"], true);
    seg.call(false, "DEL", "cvtd", &pod, &conf("1.0.0")).ok();
    let no_ipam = json!({"cniVersion": "1.0.0", "name": "cvtlk", "type": "dummy"}).to_string();
    refused(&seg, &no_ipam, 7, "no IPAM");
}

/// `ifname` in `pod` by macvlan on the segment (corvid's or the reference's), with
/// `routes` from IPAM, chained with vrf configured by `vrf`: the vrf configuration and
/// its result.
fn vrf_pod(
    seg: &Segment,
    reference: bool,
    pod: &TestNs,
    ifname: &str,
    subnet: &str,
    routes: Value,
    vrf: Value,
) -> (String, Value) {
    let mut mv: Value =
        serde_json::from_str(&seg.conf("1.0.0", "macvlan", subnet, json!({"master": "cvtm0"})))
            .unwrap();
    mv["ipam"]["routes"] = routes;
    let r = seg
        .call(reference, "ADD", "cvtvrf", pod, &mv.to_string())
        .set("CNI_IFNAME", ifname)
        .ok();
    let mut c = json!({"cniVersion": "1.0.0", "name": "cvtlk", "type": "vrf", "prevResult": r});
    for (k, v) in vrf.as_object().unwrap() {
        c[k] = v.clone();
    }
    let c = c.to_string();
    let out = seg
        .call(reference, "ADD", "cvtvrf", pod, &c)
        .set("CNI_IFNAME", ifname)
        .ok();
    (c, out)
}

fn routing(ns: &TestNs) -> Vec<Value> {
    let out = ns
        .command("ip")
        .args(["-j", "route", "show", "table", "all"])
        .output()
        .unwrap();
    let mut all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    all.retain(|r| r["table"] != "local");
    for r in &mut all {
        r.as_object_mut().unwrap().remove("flags");
    }
    all
}

#[test]
#[ignore = "runs inside the VM of link_kinds_in_a_vm: this kernel has no ipvlan, vlan, dummy or vrf"]
fn vrf_isolates_and_matches_the_reference() {
    let mut seen = Vec::new();
    for reference in [false, true] {
        let seg = Segment::new();
        seg.segment.ip("addr add 10.96.0.1/24 dev srv0");
        let pod = TestNs::new();
        let (c, out) = vrf_pod(
            &seg,
            reference,
            &pod,
            "eth0",
            "10.96.0.0/24",
            json!([{"dst": "0.0.0.0/0"}]),
            json!({"vrfname": "cvtred"}),
        );
        assert_eq!(
            out["ips"][0]["address"], "10.96.0.2/24",
            "the previous result passes"
        );
        let vrf = link(&pod, "cvtred");
        assert_eq!(vrf["kind"], "vrf");
        assert_eq!(vrf["data"]["table"], 1, "the first free table");
        if !reference {
            // The gateway is only reachable from inside the VRF.
            assert!(
                !pod.ping("10.96.0.1"),
                "the main table reaches into the VRF"
            );
            let bound = pod
                .command("ping")
                .args(["-c", "1", "-W", "2", "-I", "cvtred", "10.96.0.1"])
                .stdout(Stdio::null())
                .status()
                .unwrap()
                .success();
            assert!(bound, "the VRF reaches its gateway");
            seg.call(false, "CHECK", "cvtvrf", &pod, &c).ok();
        }
        let mut routes = routing(&pod);
        // Moving the interface's gateway routes into the VRF's table came after Debian's
        // reference (1.1.1); corvid does it, as the reference does now.
        let default =
            json!({"dev": "eth0", "dst": "default", "gateway": "10.96.0.1", "table": "1"});
        assert_eq!(routes.contains(&default), !reference, "{routes:?}");
        routes.retain(|r| *r != default);
        seen.push((vrf, routes));
        seg.call(reference, "DEL", "cvtvrf", &pod, &c).ok();
        assert!(
            link(&pod, "cvtred")["kind"].is_null(),
            "the VRF goes with its last interface"
        );
        let mv = seg.conf(
            "1.0.0",
            "macvlan",
            "10.96.0.0/24",
            json!({"master": "cvtm0"}),
        );
        seg.call(reference, "DEL", "cvtvrf", &pod, &mv).ok();
    }
    assert_eq!(seen[0], seen[1], "corvid's vrf and the reference's");
}

#[test]
#[ignore = "runs inside the VM of link_kinds_in_a_vm: this kernel has no ipvlan, vlan, dummy or vrf"]
fn vrf_shared_tables_and_refusals() {
    let seg = Segment::new();
    let pod = TestNs::new();
    let none = json!([]);
    let (c0, _) = vrf_pod(
        &seg,
        false,
        &pod,
        "eth0",
        "10.97.0.0/24",
        none.clone(),
        json!({"vrfname": "cvtblue", "table": 42}),
    );
    let (c1, _) = vrf_pod(
        &seg,
        false,
        &pod,
        "net1",
        "10.98.0.0/24",
        none,
        json!({"vrfname": "cvtblue"}),
    );
    assert_eq!(link(&pod, "cvtblue")["data"]["table"], 42);
    let table = pod
        .command("ip")
        .args(["-j", "route", "show", "table", "42"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("10.97.0.0/24") && table.contains("10.98.0.0/24"),
        "{table}"
    );
    // Another table for the same VRF is refused, and nothing changes.
    let pod2 = TestNs::new();
    let mv = seg.conf(
        "1.0.0",
        "macvlan",
        "10.99.0.0/24",
        json!({"master": "cvtm0"}),
    );
    let r = seg
        .call(false, "ADD", "cvtx", &pod, &mv)
        .set("CNI_IFNAME", "net2")
        .ok();
    let clash = json!({"cniVersion": "1.0.0", "name": "cvtlk", "type": "vrf", "vrfname": "cvtblue", "table": 7, "prevResult": r}).to_string();
    let o = seg
        .call(false, "ADD", "cvtx", &pod, &clash)
        .set("CNI_IFNAME", "net2")
        .run();
    assert!(
        !o.success && o.stdout.contains("different routing table"),
        "{}",
        o.stdout
    );
    let no_name =
        json!({"cniVersion": "1.0.0", "name": "cvtlk", "type": "vrf", "prevResult": r}).to_string();
    let o = seg.call(false, "ADD", "cvtx", &pod2, &no_name).run();
    assert_eq!(o.code(), 7, "{}", o.stdout);
    let no_prev =
        json!({"cniVersion": "1.0.0", "name": "cvtlk", "type": "vrf", "vrfname": "cvtgreen"})
            .to_string();
    let o = seg.call(false, "ADD", "cvtx", &pod2, &no_prev).run();
    assert_eq!(o.code(), 7, "{}", o.stdout);
    assert!(link(&pod2, "cvtgreen")["kind"].is_null());
    let net2 = pod
        .command("ip")
        .args(["-j", "link", "show", "net2"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&net2.stdout).contains("master"),
        "net2 joined no VRF"
    );
    seg.call(false, "DEL", "cvtx", &pod, &mv)
        .set("CNI_IFNAME", "net2")
        .ok();
    // One interface left: the VRF stays; then none: it goes.
    seg.call(false, "DEL", "cvtvrf", &pod, &c0).ok();
    assert_eq!(link(&pod, "cvtblue")["kind"], "vrf");
    seg.call(false, "DEL", "cvtvrf", &pod, &c1)
        .set("CNI_IFNAME", "net1")
        .ok();
    assert!(link(&pod, "cvtblue")["kind"].is_null());
    seg.call(false, "DEL", "cvtvrf", &pod, &c1)
        .set("CNI_IFNAME", "net1")
        .ok();
}

#[test]
#[ignore = "runs inside the VM of link_kinds_in_a_vm: this kernel has no ipvlan, vlan, dummy or vrf"]
fn mixed_lists_with_the_reference_host_local() {
    // corvid's ipvlan and vlan delegating to the reference's host-local.
    for (plugin, extra) in [
        ("ipvlan", json!({"master": "cvtm0"})),
        ("vlan", json!({"master": "cvtm0", "vlanId": 9})),
    ] {
        let seg = Segment::new();
        let pod = TestNs::new();
        let c = seg.conf("1.0.0", plugin, "10.100.0.0/24", extra);
        let ours = seg.plugins.plugin(plugin);
        let path = format!("{REFERENCE_DIR}:{}", seg.plugins.path().display());
        let r = Call::new(
            &seg.host,
            ours.clone(),
            "ADD",
            "cvtmix",
            &pod.path_str(),
            &path,
            &c,
        )
        .ok();
        assert_eq!(result_ip(&r, true), "10.100.0.2", "{plugin}");
        Call::new(&seg.host, ours, "DEL", "cvtmix", &pod.path_str(), &path, &c).ok();
        assert!(pod.links().is_empty());
    }
}
