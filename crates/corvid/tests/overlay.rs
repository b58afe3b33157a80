//! Two simulated hosts, one controller: pods attached with the `corvid` CNI plugin reach
//! each other on one host and across the VXLAN overlay; agents and the controller survive
//! restarts; a killed ADD leaves nothing after DEL or GC. Runs as root, in namespaces only:
//! a "lan" namespace holds the underlay bridge and the controller, each host namespace
//! runs its own agent, and each pod is a namespace of its own.

#[path = "support/cluster.rs"]
mod cluster;

use std::process::Stdio;
use std::time::Duration;

use cluster::ns::{wait_until, Ns};
use cluster::{cni_result, result_ip, url, Cluster};
use corvid_api::{Port, Status};
use corvid_plugins::controller::corvid::{legacy_port_id, port_id};
use serde_json::{json, Value};

fn mac_in(pod: &Ns, ifname: &str) -> Option<String> {
    pod.netlink().link_by_name(ifname).unwrap().map(|l| l.mac)
}

/// MACs the host's overlay devices forward to a remote host.
fn fdb_macs(host: &Ns) -> Vec<String> {
    let mut nl = host.netlink();
    let mut out = Vec::new();
    for l in nl.links().unwrap() {
        if l.kind == corvid_net::link::LinkKind::Vxlan {
            out.extend(nl.fdb(&l).unwrap().into_iter().map(|e| e.mac));
        }
    }
    out
}

#[test]
fn pods_reach_each_other_on_one_host_and_across_hosts() {
    let mut cluster = Cluster::new("ov");
    let (_net, subnet) = cluster.network("blue", "10.50.0.0/24", false);
    let a1 = cluster.pod("a1");
    let a2 = cluster.pod("a2");
    let b1 = cluster.pod("b1");
    let ra1 = cni_result(&cluster.add(0, "blue", &a1));
    let ra2 = cni_result(&cluster.add(0, "blue", &a2));
    let rb1 = cni_result(&cluster.add(1, "blue", &b1));
    let (ip_a1, ip_a2, ip_b1) = (result_ip(&ra1), result_ip(&ra2), result_ip(&rb1));
    assert_eq!(ra1["ips"][0]["gateway"], "10.50.0.1");
    assert_eq!(ra1["routes"][0]["dst"], "0.0.0.0/0");
    assert_eq!(
        ra1["interfaces"][0]["sandbox"],
        a1.path.display().to_string()
    );
    // The interface in the pod has the controller's MAC and address.
    let ports = cluster.ports();
    let port_a1 = ports
        .iter()
        .find(|p| {
            p.fixed_ips
                .iter()
                .any(|f| f.ip_address.to_string() == ip_a1)
        })
        .expect("a1's port");
    assert_eq!(port_a1.status, Status::Active);
    assert_eq!(port_a1.binding_host_id, "h1");
    assert_eq!(port_a1.fixed_ips[0].subnet_id, subnet.id);
    assert_eq!(mac_in(&a1, "eth0").unwrap(), port_a1.mac_address);
    assert_eq!(ra1["interfaces"][0]["mac"], port_a1.mac_address.as_str());

    assert!(a1.ping(&ip_a2), "same host");
    assert!(a1.ping(&ip_b1), "across hosts");
    assert!(b1.ping(&ip_a2), "across hosts, the other way");
    assert!(a1.ping("10.50.0.1"), "the gateway on the host's bridge");
    // No masquerade asked: the underlay has no route back to the pods.
    assert!(!a1.ping("10.99.0.254"));

    // Overlay entries taken away by hand come back at the next full pass, which reads
    // them from one dump of the host's tables.
    let mac_b1 = mac_in(&b1, "eth0").unwrap();
    cluster.agents[0].as_mut().unwrap().kill9();
    cluster.start_agent_with(0, &["--resync", "1"]);
    wait_until("h1's agent to settle", Duration::from_secs(10), || {
        fdb_macs(&cluster.hosts[0]).contains(&mac_b1)
    });
    let mut nl = cluster.hosts[0].netlink();
    let vxlan = nl
        .links()
        .unwrap()
        .into_iter()
        .find(|l| l.kind == corvid_net::link::LinkKind::Vxlan)
        .expect("h1's vxlan device");
    for e in nl.fdb(&vxlan).unwrap() {
        nl.delete_fdb(&vxlan, &e).unwrap();
    }
    for e in nl.neighbours(&vxlan).unwrap() {
        nl.delete_neighbour(&vxlan, &e).unwrap();
    }
    assert!(!fdb_macs(&cluster.hosts[0]).contains(&mac_b1));
    wait_until(
        "the full pass to restore them",
        Duration::from_secs(10),
        || {
            fdb_macs(&cluster.hosts[0]).contains(&mac_b1)
                && !nl.neighbours(&vxlan).unwrap().is_empty()
        },
    );
    assert!(a1.ping(&ip_b1), "across hosts, after the repair");

    // DEL of b1: its interface is gone, its address released, h1 forgets its MAC.
    assert!(
        fdb_macs(&cluster.hosts[0]).contains(&mac_b1),
        "{mac_b1} not in {:?}",
        fdb_macs(&cluster.hosts[0])
    );
    let out = cluster.del(1, "blue", &b1);
    assert!(out.status.success(), "DEL: {out:?}");
    wait_until("b1's interface to go", Duration::from_secs(10), || {
        mac_in(&b1, "eth0").is_none()
    });
    assert!(!cluster.ports().iter().any(|p| p
        .fixed_ips
        .iter()
        .any(|f| f.ip_address.to_string() == ip_b1)));
    wait_until(
        "h1 to drop b1 from its FDB",
        Duration::from_secs(10),
        || !fdb_macs(&cluster.hosts[0]).contains(&mac_b1),
    );
    assert!(!a1.ping(&ip_b1));
    // A second DEL of the same pod is fine.
    assert!(cluster.del(1, "blue", &b1).status.success());
    // h2 has no port left: its bridge and vxlan device are gone.
    wait_until(
        "h2's datapath to be removed",
        Duration::from_secs(10),
        || {
            cluster.hosts[1]
                .netlink()
                .links()
                .unwrap()
                .iter()
                .all(|l| !l.name.starts_with("cv"))
        },
    );

    // Masquerade on: pods reach the underlay through their host's address.
    let (_green, _) = cluster.network("green", "10.51.0.0/24", true);
    let g1 = cluster.pod("g1");
    cni_result(&cluster.add(0, "green", &g1));
    assert!(g1.ping("10.99.0.254"), "egress is masqueraded");
    for (pod, net, host) in [(&a1, "blue", 0), (&a2, "blue", 0), (&g1, "green", 0)] {
        assert!(cluster.del(host, net, pod).status.success());
    }
    assert!(cluster.ports().is_empty());
}

#[test]
fn agents_and_the_controller_restart_without_losing_pods() {
    let mut cluster = Cluster::new("rs");
    cluster.network("red", "10.52.0.0/24", false);
    let a1 = cluster.pod("a1");
    let a2 = cluster.pod("a2");
    let b1 = cluster.pod("b1");
    let ip_a1 = result_ip(&cni_result(&cluster.add(0, "red", &a1)));
    cni_result(&cluster.add(0, "red", &a2));
    let ip_b1 = result_ip(&cni_result(&cluster.add(1, "red", &b1)));

    // h1's agent is down while a pod is created and another deleted.
    cluster.agents[0].take().unwrap().kill9();
    let a3 = cluster.pod("a3");
    let pending = cluster
        .cni(0, &["add", "red-h1", &a3.path.display().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(cluster.del(0, "red", &a2).status.success());
    assert!(
        mac_in(&a2, "eth0").is_some(),
        "nobody unplugs while the agent is down"
    );
    cluster.start_agent(0);
    let ip_a3 = result_ip(&cni_result(&pending.wait_with_output().unwrap()));
    wait_until("a2 to be unplugged", Duration::from_secs(10), || {
        mac_in(&a2, "eth0").is_none()
    });
    assert!(a3.ping(&ip_b1), "a3, plugged after the restart, reaches h2");
    assert!(a1.ping(&ip_b1), "a1 kept its network through the restart");

    // The controller restarts: agents resume and serve new pods.
    cluster.controller.take().unwrap().kill9();
    cluster.start_controller();
    let b2 = cluster.pod("b2");
    let ip_b2 = result_ip(&cni_result(&cluster.add(1, "red", &b2)));
    assert!(b2.ping(&ip_a1));
    assert!(a3.ping(&ip_b2), "h1 learned b2 through the resumed watch");

    // A plugin killed between POST and UP: DEL (or GC) removes its port.
    cluster.agents[1].take().unwrap().kill9();
    let b3 = cluster.pod("b3");
    let conf: Value = serde_json::from_slice(
        &std::fs::read(cluster.conf.path().join("red-h2.conflist")).unwrap(),
    )
    .unwrap();
    let mut plugin_conf = conf["plugins"][0].clone();
    plugin_conf["cniVersion"] = conf["cniVersion"].clone();
    plugin_conf["name"] = conf["name"].clone();
    let mut plugin = cluster.plugin(1, "ADD", "killed-add", &b3, &plugin_conf);
    let before = cluster.ports().len();
    wait_until("the killed ADD's port", Duration::from_secs(10), || {
        cluster.ports().len() == before + 1
    });
    let _ = plugin.kill();
    let _ = plugin.wait();
    let mut del = cluster.plugin(1, "DEL", "killed-add", &b3, &plugin_conf);
    assert!(del.wait().unwrap().success());
    assert_eq!(
        cluster.ports().len(),
        before,
        "DEL removed the half-made port"
    );

    // The same through GC: a killed ADD, then GC keeping only the cached attachments.
    let b4 = cluster.pod("b4");
    let mut pending = cluster
        .cni(1, &["add", "red-h2", &b4.path.display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(
        "the second killed ADD's port",
        Duration::from_secs(10),
        || cluster.ports().len() == before + 1,
    );
    let _ = pending.kill();
    let _ = pending.wait();
    cluster.start_agent(1);
    let out = cluster.cni(1, &["gc", "red-h2"]).output().unwrap();
    assert!(out.status.success(), "GC: {out:?}");
    wait_until("GC to remove the orphan", Duration::from_secs(10), || {
        cluster.ports().len() == before
    });
    assert!(b2.ping(&ip_a3), "GC kept the cached attachment b2");

    // A host that leaves (its agent gone, its record deleted) leaves every FDB.
    let mac_b2 = mac_in(&b2, "eth0").unwrap();
    assert!(fdb_macs(&cluster.hosts[0]).contains(&mac_b2));
    cluster.agents[1].take().unwrap().kill9();
    let (status, _, _) = cluster
        .api(|c| c.request("DELETE", "/v2.0/hosts/h2", None))
        .unwrap();
    assert_eq!(status, 204);
    wait_until("h1 to forget h2's ports", Duration::from_secs(10), || {
        !fdb_macs(&cluster.hosts[0]).contains(&mac_b2)
    });
    assert!(!a3.ping(&ip_b2));
}

/// A port with address `ip` and no filter, plugged into `pod` on host `host`.
fn api_port(
    cluster: &Cluster,
    host: usize,
    subnet: &corvid_api::Subnet,
    ip: &str,
    pod: &Ns,
) -> String {
    let extra = json!({"port_security_enabled": false,
        "fixed_ips": [{"subnet_id": subnet.id, "ip_address": ip}]});
    cluster.api_port(host, subnet, pod, extra).id
}

#[test]
fn an_address_given_to_a_new_port_is_reached_at_once_across_hosts() {
    let cluster = Cluster::new("ra");
    let (_net, subnet) = cluster.network("gold", "10.53.0.0/24", false);
    let a = cluster.pod("a");
    cni_result(&cluster.add(0, "gold", &a));
    let old = cluster.pod("old");
    let old_port = api_port(&cluster, 1, &subnet, "10.53.0.50", &old);
    assert!(a.ping("10.53.0.50"));
    let old_mac = mac_in(&old, "eth0").unwrap();
    assert_eq!(a.neighbour_mac("10.53.0.50"), Some(old_mac.clone()));

    // The port goes and its address comes back at once with another port, MAC and pod
    // on the same host: a's neighbour entry, still fresh, names the old MAC.
    cluster.api(|c| c.delete::<Port>(&old_port)).unwrap();
    wait_until(
        "the old port to be unplugged",
        Duration::from_secs(10),
        || mac_in(&old, "eth0").is_none(),
    );
    let new = cluster.pod("new");
    api_port(&cluster, 1, &subnet, "10.53.0.50", &new);
    let new_mac = mac_in(&new, "eth0").unwrap();
    assert_ne!(new_mac, old_mac);
    // h1's agent announced the new MAC to its local ports when it learned the port.
    wait_until("a to learn the new MAC", Duration::from_secs(5), || {
        a.neighbour_mac("10.53.0.50").as_deref() == Some(new_mac.as_str())
    });
    assert!(a.ping("10.53.0.50"), "{}", cluster.overlay_state());
}

#[test]
fn bad_configurations_and_a_missing_agent_are_clear_cni_errors() {
    let cluster = Cluster::new("er");
    let (_, subnet) = cluster.network("gray", "10.53.0.0/30", false);
    let pod = cluster.pod("p");
    let run = |conf: Value, host: usize| -> Value {
        let child = cluster.plugin(host, "ADD", "c-err", &pod, &conf);
        let out = child.wait_with_output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if out.status.success() {
            return json!({"ok": v});
        }
        v
    };
    let base = json!({"cniVersion": "1.0.0", "name": "gray", "type": "corvid",
        "mpurl": url(), "project": "corvid", "subnet": subnet.id, "hostId": "h1", "timeout": 2});
    let with = |k: &str, v: Value| {
        let mut c = base.clone();
        c[k] = v;
        c
    };
    assert_eq!(run(with("mpurl", json!("ftp://x")), 0)["code"], 7);
    assert_eq!(run(with("subnet", json!("")), 0)["code"], 7);
    let unreachable = run(with("mpurl", json!("http://10.99.0.254:1")), 0);
    assert_eq!(unreachable["code"], 106, "{unreachable}");
    assert!(unreachable["msg"].as_str().unwrap().contains("unreachable"));
    let unknown = run(with("subnet", json!("no-such-subnet")), 0);
    assert_eq!(unknown["code"], 108, "{unknown}");
    // No agent for host h9: the ADD times out, says why, and leaves no port behind.
    let timeout = run(with("hostId", json!("h9")), 0);
    assert_eq!(timeout["code"], 107, "{timeout}");
    assert!(timeout["msg"].as_str().unwrap().contains("corvid agent"));
    assert!(cluster.ports().is_empty());
    assert!(mac_in(&pod, "eth0").is_none());
    // A /30 has two addresses after the gateway... one: the second pod is refused.
    let ok = run(base.clone(), 0);
    assert!(ok.get("ok").is_some(), "{ok}");
    let other = cluster.pod("q");
    let out = cluster.add(0, "gray", &other);
    assert!(!out.status.success());
    let err: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(err["code"], 100, "{err}");
    assert_eq!(cluster.ports().len(), 1);
}

#[test]
fn ports_made_under_the_old_port_id_derivation_are_found_by_del_check_and_gc() {
    let cluster = Cluster::new("up");
    let (_, subnet) = cluster.network("upg", "10.54.0.0/24", false);
    let conf = json!({"cniVersion": "1.1.0", "name": "upg", "type": "corvid",
        "mpurl": url(), "project": "corvid", "subnet": subnet.id, "hostId": "h1", "timeout": 20});
    let call = |command: &str, container: &str, pod: &Ns, conf: &Value| {
        let out = cluster
            .plugin(0, command, container, pod, conf)
            .wait_with_output()
            .unwrap();
        assert!(out.status.success(), "{command} {container}: {out:?}");
        serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null)
    };
    // Today's ADD names the port by the version 5 derivation.
    let new_pod = cluster.pod("n");
    call("ADD", "c-new", &new_pod, &conf);
    let ids: Vec<String> = cluster.ports().into_iter().map(|p| p.id).collect();
    assert_eq!(ids, [port_id("upg", "c-new", "eth0")]);
    // Ports as an older corvid made them: same attributes, the FNV-derived ID.
    let old_port = |container: &str, pod: &Ns| -> String {
        let id = legacy_port_id("upg", container, "eth0");
        cluster.api(|c| {
            c.project("corvid")
                .create::<Port>(json!({
                    "project_id": "corvid", "id": id, "name": format!("k8s_{id}"),
                    "admin_state_up": true, "network_id": subnet.id,
                    "description": format!("cni {container}, ns:{}, host:h1", pod.path.display()),
                    "veth_name": "eth0", "network_ns": pod.path.display().to_string(),
                    "port_security_enabled": false, "binding:host_id": "h1",
                    "binding:vnic_type": "normal", "fast_path": true,
                }))
                .unwrap()
        });
        wait_until(
            "the agent plugs the old port",
            Duration::from_secs(20),
            || mac_in(pod, "eth0").is_some(),
        );
        id
    };
    let (kept_pod, stale_pod, deleted_pod) = (cluster.pod("k"), cluster.pod("s"), cluster.pod("d"));
    let kept = old_port("c-kept", &kept_pod);
    let stale = old_port("c-stale", &stale_pod);
    let deleted = old_port("c-del", &deleted_pod);
    wait_until("the old ports ACTIVE", Duration::from_secs(20), || {
        cluster
            .ports()
            .iter()
            .filter(|p| p.status == Status::Active)
            .count()
            == 4
    });
    let has = |id: &str| cluster.ports().iter().any(|p| p.id == id);
    // CHECK finds an old port and compares it with the pod.
    let mut check = conf.clone();
    check["prevResult"] = json!({"cniVersion": "1.1.0", "interfaces": [], "ips": []});
    call("CHECK", "c-kept", &kept_pod, &check);
    // GC keeps the valid attachments, old and new, and releases the old one not listed.
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": "c-new", "ifname": "eth0"},
        {"containerID": "c-kept", "ifname": "eth0"},
        {"containerID": "c-del", "ifname": "eth0"},
    ]);
    call("GC", "", &new_pod, &gc);
    assert!(!has(&stale), "GC released the stale old port");
    assert!(has(&kept) && has(&deleted) && has(&port_id("upg", "c-new", "eth0")));
    // DEL finds the old port by its old ID.
    call("DEL", "c-del", &deleted_pod, &conf);
    assert!(!has(&deleted), "DEL deleted the old port");
    assert!(has(&kept));
}
