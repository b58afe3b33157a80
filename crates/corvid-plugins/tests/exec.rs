//! The runtime side (corvid-cni's exec) driving real plugins: corvid's and the reference's.

mod support;

use corvid_cni::exec::{Runtime, RuntimeConf};
use corvid_cni::NetConfList;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::*;

struct Setup {
    host: TestNs,
    plugins: PluginDir,
    extra: tempfile::TempDir,
    data: tempfile::TempDir,
    cache: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        Setup {
            host: TestNs::new(),
            plugins: PluginDir::new(),
            extra: tempfile::tempdir().unwrap(),
            data: tempfile::tempdir().unwrap(),
            cache: tempfile::tempdir().unwrap(),
        }
    }

    /// corvid's plugins first, then test scripts, then the reference plugins.
    fn runtime(&self) -> Runtime {
        let mut rt = Runtime::new(vec![
            self.plugins.path().to_path_buf(),
            self.extra.path().to_path_buf(),
            PathBuf::from(REFERENCE_DIR),
        ]);
        rt.cache_dir = self.cache.path().to_path_buf();
        rt
    }

    fn script(&self, name: &str, body: &str) {
        let p = self.extra.path().join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A script plugin `name` that appends "COMMAND name" to `log`, then runs `then`:
    /// the order of a list's calls, as they happened.
    fn logging_script(&self, name: &str, log: &Path, then: &str) {
        let log = log.display();
        self.script(
            name,
            &format!("echo \"$CNI_COMMAND {name}\" >> {log}\n{then}"),
        );
    }

    fn list(&self, version: &str, second: Value) -> (Vec<u8>, NetConfList) {
        let v = json!({"cniVersion": version, "name": "cvtexec", "plugins": [
            {"type": "bridge", "bridge": "cvtbre", "isGateway": true,
             "ipam": {"type": "host-local", "subnet": "10.95.0.0/24", "dataDir": self.data.path()}},
            second]});
        let bytes = v.to_string().into_bytes();
        let list = NetConfList::parse(&bytes).unwrap();
        (bytes, list)
    }

    fn assert_clean(&self) {
        assert!(self.host.veths().is_empty(), "veth left");
        assert!(leases(self.data.path(), "cvtexec").is_empty(), "lease left");
        assert!(
            std::fs::read_dir(self.cache.path())
                .unwrap()
                .next()
                .is_none(),
            "cache entry left"
        );
    }
}

fn attachment(c: &TestNs) -> RuntimeConf {
    RuntimeConf {
        container_id: "exec1".into(),
        netns: c.path_str(),
        ifname: "eth0".into(),
        ..RuntimeConf::default()
    }
}

fn cache_file(s: &Setup) -> PathBuf {
    s.cache.path().join("cvtexec-exec1-eth0")
}

#[test]
fn a_list_chains_prev_result_caches_checks_and_deletes_in_reverse() {
    let s = Setup::new();
    let c = TestNs::new();
    let log = s.extra.path().join("calls.log");
    // corvid's plugins, each behind a script that logs its call.
    for plugin in ["bridge", "tuning"] {
        let real = s.plugins.plugin(plugin);
        s.logging_script(
            &format!("cvt-{plugin}"),
            &log,
            &format!("exec {}", real.display()),
        );
    }
    let (bytes, _) = s.list(
        "1.0.0",
        json!({"type": "cvt-tuning", "sysctl": {"net.ipv4.conf.eth0.accept_local": "1"}}),
    );
    let mut v: Value = serde_json::from_slice(&bytes).unwrap();
    v["plugins"][0]["type"] = json!("cvt-bridge");
    let bytes = v.to_string().into_bytes();
    let list = NetConfList::parse(&bytes).unwrap();
    let rt = s.runtime();
    let conf = attachment(&c);
    let result = s.host.run(|| rt.add(&bytes, &list, &conf)).unwrap();
    assert_eq!(result["cniVersion"], "1.0.0");
    assert_eq!(
        result["interfaces"][2]["sandbox"],
        c.path_str(),
        "tuning passed bridge's result on"
    );
    let accept_local = c
        .command("cat")
        .arg("/proc/sys/net/ipv4/conf/eth0/accept_local")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&accept_local.stdout).trim(),
        "1",
        "tuning ran in the container"
    );
    let cached: Value = serde_json::from_slice(&std::fs::read(cache_file(&s)).unwrap()).unwrap();
    assert_eq!(cached["kind"], "cniCacheV1");
    assert_eq!(cached["result"], result);
    let mode = std::fs::metadata(cache_file(&s))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    s.host.run(|| rt.check(&list, &conf)).unwrap();
    s.host.run(|| rt.del(&list, &conf)).unwrap();
    s.host.run(|| rt.del(&list, &conf)).unwrap();
    s.assert_clean();
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        calls.lines().collect::<Vec<_>>(),
        [
            "ADD cvt-bridge",
            "ADD cvt-tuning",
            "CHECK cvt-bridge",
            "CHECK cvt-tuning",
            "DEL cvt-tuning",
            "DEL cvt-bridge",
            "DEL cvt-tuning",
            "DEL cvt-bridge"
        ],
        "ADD and CHECK in the list's order, DEL in reverse"
    );
}

#[test]
fn a_failing_plugin_rolls_the_whole_list_back() {
    let s = Setup::new();
    let c = TestNs::new();
    let (bytes, list) = s.list(
        "1.0.0",
        json!({"type": "tuning", "sysctl": {"net.no.such.key": "1"}}),
    );
    let rt = s.runtime();
    let e = s
        .host
        .run(|| rt.add(&bytes, &list, &attachment(&c)))
        .unwrap_err();
    assert!(e.msg.starts_with("plugin tuning:"), "{e}");
    assert!(c.veths().is_empty());
    s.assert_clean();
}

#[test]
fn hanging_garbage_and_missing_plugins_are_clear_errors() {
    let s = Setup::new();
    let c = TestNs::new();
    s.script(
        "cvt-hang",
        "[ \"$CNI_COMMAND\" = ADD ] && exec sleep 30; exit 0",
    );
    s.script(
        "cvt-garbage",
        "[ \"$CNI_COMMAND\" = ADD ] && echo 'this is not json'; exit 0",
    );
    let mut rt = s.runtime();
    rt.timeout = Duration::from_millis(500);
    for (plugin, code) in [("cvt-hang", 11), ("cvt-garbage", 6), ("cvt-missing", 7)] {
        let (bytes, list) = s.list("1.0.0", json!({"type": plugin}));
        let e = s
            .host
            .run(|| rt.add(&bytes, &list, &attachment(&c)))
            .unwrap_err();
        assert_eq!(e.code, code, "{plugin}: {e}");
        assert!(e.msg.contains(plugin), "{plugin}: {e}");
        s.assert_clean();
    }
}

#[test]
fn version_gates_and_negotiation() {
    let s = Setup::new();
    let c = TestNs::new();
    let rt = s.runtime();
    // A plugin that stops at 1.0.0, as a third party's may (corvid's set speaks 1.1.0).
    s.script(
        "cvtold",
        r#"[ "$CNI_COMMAND" = VERSION ] || { echo '{"cniVersion":"1.0.0","code":1,"msg":"only VERSION"}'; exit 1; }
echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}'"#,
    );
    let (_, old) = s.list("0.3.1", json!({"type": "cvtold"}));
    assert_eq!(rt.check(&old, &attachment(&c)).unwrap_err().code, 1);
    let (_, new) = s.list("1.1.0", json!({"type": "cvtold"}));
    let e = rt.validate(&new).unwrap_err();
    assert_eq!(e.code, 1);
    assert!(e.msg.contains("cvtold") && e.msg.contains("1.1.0"), "{e}");
    let (_, ok) = s.list("1.0.0", json!({"type": "cvtold"}));
    rt.validate(&ok).unwrap();
    // ADD of a 1.1.0 list whose second plugin stops at 1.0.0: the error names both, and
    // the list is undone.
    let (bytes, new) = s.list("1.1.0", json!({"type": "cvtold"}));
    let e = s
        .host
        .run(|| rt.add(&bytes, &new, &attachment(&c)))
        .unwrap_err();
    assert_eq!(e.code, 1, "{e}");
    assert!(e.msg.contains("cvtold does not support CNI 1.1.0"), "{e}");
    s.assert_clean();
}

#[test]
fn gc_deletes_stale_cached_attachments() {
    let s = Setup::new();
    let (c1, c2) = (TestNs::new(), TestNs::new());
    let v = json!({"cniVersion": "1.1.0", "name": "cvtexec", "plugins": [
        {"type": "bridge", "bridge": "cvtbre",
         "ipam": {"type": "host-local", "subnet": "10.95.0.0/24", "dataDir": s.data.path()}}]});
    let bytes = v.to_string().into_bytes();
    let list = NetConfList::parse(&bytes).unwrap();
    let rt = s.runtime();
    let keep = RuntimeConf {
        container_id: "keep".into(),
        ..attachment(&c1)
    };
    let stale = RuntimeConf {
        container_id: "stale".into(),
        ..attachment(&c2)
    };
    s.host.run(|| rt.add(&bytes, &list, &keep)).unwrap();
    s.host.run(|| rt.add(&bytes, &list, &stale)).unwrap();
    let valid = [corvid_cni::config::Attachment {
        container_id: "keep".into(),
        ifname: "eth0".into(),
    }];
    s.host.run(|| rt.gc(&list, &valid)).unwrap();
    assert_eq!(leases(s.data.path(), "cvtexec").len(), 1);
    assert!(rt.cached(&list.name, &keep).is_some());
    assert!(rt.cached(&list.name, &stale).is_none());
    assert!(c2.veths().is_empty(), "the stale attachment's veth is gone");
    s.host.run(|| rt.status(&list)).unwrap();
}

#[test]
fn load_dir_reads_lists_and_single_configs_first_name_wins() {
    let dir = tempfile::tempdir().unwrap();
    let write =
        |name: &str, v: Value| std::fs::write(dir.path().join(name), v.to_string()).unwrap();
    write(
        "10-a.conflist",
        json!({"cniVersion": "1.0.0", "name": "a", "plugins": [{"type": "bridge"}]}),
    );
    write(
        "20-b.conf",
        json!({"cniVersion": "0.4.0", "name": "b", "type": "bridge"}),
    );
    write(
        "30-a.json",
        json!({"cniVersion": "1.0.0", "name": "a", "plugins": [{"type": "loopback"}]}),
    );
    write("40-ignored.txt", json!({}));
    let loaded = corvid_cni::exec::load_dir(dir.path()).unwrap();
    let names: Vec<(&str, &str)> = loaded
        .networks
        .iter()
        .map(|(p, _, l)| (l.name.as_str(), p.file_name().unwrap().to_str().unwrap()))
        .collect();
    assert_eq!(names, [("a", "10-a.conflist"), ("b", "20-b.conf")]);
    assert_eq!(loaded.shadowed.len(), 1, "the second \"a\" is reported");
    assert!(
        loaded.shadowed[0].0.ends_with("30-a.json")
            && loaded.shadowed[0].1.ends_with("10-a.conflist")
    );
    write(
        "50-bad.conflist",
        json!({"cniVersion": "1.0.0", "plugins": []}),
    );
    let e = corvid_cni::exec::load_dir(dir.path()).unwrap_err();
    assert!(e.msg.contains("50-bad.conflist"), "{e}");
    assert!(Path::new(dir.path()).exists());
}

/// Drops what differs between two runs by nature: random MACs and the host veth's name.
fn normalized(mut v: Value) -> Value {
    for iface in v["interfaces"].as_array_mut().into_iter().flatten() {
        iface.as_object_mut().unwrap().remove("mac");
        if iface.get("sandbox").is_none()
            && iface["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("veth"))
        {
            iface["name"] = json!("veth");
        }
    }
    v
}

#[test]
fn the_executor_gives_what_the_reference_plugins_give_by_hand() {
    let s = Setup::new();
    let c = TestNs::new();
    let rt = Runtime {
        plugin_dirs: vec![PathBuf::from(REFERENCE_DIR)],
        ..s.runtime()
    };
    let conf = attachment(&c);
    let list_for = |data: &Path| {
        let v = json!({"cniVersion": "1.0.0", "name": "cvtexec", "plugins": [
            {"type": "bridge", "bridge": "cvtbro", "isGateway": true,
             "ipam": {"type": "host-local", "subnet": "10.94.0.0/24", "dataDir": data}},
            {"type": "tuning", "mtu": 1400}]});
        let bytes = v.to_string().into_bytes();
        let list = NetConfList::parse(&bytes).unwrap();
        (bytes, list)
    };

    let first = tempfile::tempdir().unwrap();
    let (bytes, list) = list_for(first.path());
    let through_executor = s.host.run(|| rt.add(&bytes, &list, &conf)).unwrap();
    s.host.run(|| rt.del(&list, &conf)).unwrap();

    // By hand, as cnitool does: each plugin with the list's name and version injected and
    // the previous result as prevResult.
    let second = tempfile::tempdir().unwrap();
    let (_, list) = list_for(second.path());
    let run = |i: usize, cmd: &str, prev: Option<&Value>| {
        let plugin = list.plugins[i]["type"].as_str().unwrap();
        Call::new(
            &s.host,
            Path::new(REFERENCE_DIR).join(plugin),
            cmd,
            "exec1",
            &c.path_str(),
            REFERENCE_DIR,
            &list.plugin_config(i, prev).to_string(),
        )
        .ok()
    };
    let bridge = run(0, "ADD", None);
    let by_hand = run(1, "ADD", Some(&bridge));
    assert_eq!(normalized(through_executor), normalized(by_hand.clone()));
    run(1, "DEL", Some(&by_hand));
    run(0, "DEL", Some(&by_hand));
    assert!(s.host.veths().is_empty());
}

#[test]
fn add_runs_in_order_and_del_in_reverse() {
    let s = Setup::new();
    let log = s.extra.path().join("calls.log");
    // Each logs "<command> <name>" and passes its prevResult on (or a minimal result).
    for name in ["cvt-first", "cvt-second"] {
        s.logging_script(
            name,
            &log,
            "[ \"$CNI_COMMAND\" = ADD ] && echo '{\"cniVersion\":\"1.0.0\",\"ips\":[{\"address\":\"10.93.0.2/24\"}]}'\n\
             exit 0",
        );
    }
    let v = json!({"cniVersion": "1.0.0", "name": "cvtorder", "plugins": [{"type": "cvt-first"}, {"type": "cvt-second"}]});
    let bytes = v.to_string().into_bytes();
    let list = NetConfList::parse(&bytes).unwrap();
    let rt = s.runtime();
    let conf = RuntimeConf {
        container_id: "o1".into(),
        ifname: "eth0".into(),
        ..RuntimeConf::default()
    };
    let result = rt.add(&bytes, &list, &conf).unwrap();
    assert_eq!(result["ips"][0]["address"], "10.93.0.2/24");
    rt.del(&list, &conf).unwrap();
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        calls,
        "ADD cvt-first\nADD cvt-second\nDEL cvt-second\nDEL cvt-first\n"
    );
}
