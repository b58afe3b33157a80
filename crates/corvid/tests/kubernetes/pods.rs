//! Namespaces to networks and pods to ports: the watcher's annotations, the `corvid-k8s`
//! plugin as the kubelet and containerd's CRI run it, and what a failure leaves (nothing).

use super::*;

#[test]
fn namespaces_get_networks_and_pods_get_ports_plugged_across_nodes() {
    let (cluster, kube) = setup("k8");
    // The deployment manifests are ones the API server takes.
    kube.apply_manifest(&manifest("kube-watch.yaml"));
    kube.apply_manifest(&manifest("node.yaml"));
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "4"]);
    // No --service-cidr: the API server names its range (the harness runs it with
    // 10.0.0.0/24), and the probe that asked for it left no service behind.
    wait_until("the service network", Duration::from_secs(20), || {
        service_range(&cluster).as_deref() == Some("10.0.0.0/24")
    });
    assert!(
        !service_names(&kube, "default")
            .iter()
            .any(|n| n.starts_with("corvid-")),
        "{:?}",
        service_names(&kube, "default")
    );
    for ns in ["a", "b"] {
        namespace(&kube, ns);
    }
    // Four pods per namespace, spread over both nodes.
    let mut pods = Vec::new();
    for ns in ["a", "b"] {
        for i in 0..4 {
            let name = format!("p{i}");
            let host = i % 2;
            let uid = pod(&kube, ns, &name, &format!("h{}", host + 1));
            pods.push((ns, name, host, uid));
        }
    }
    let nets: Vec<Network> = cluster
        .api(|c| c.list::<Network>(&[("tags", "corvid:k8s")]))
        .unwrap()
        .0;
    let subnets: Vec<Subnet> = cluster.api(|c| c.list::<Subnet>(&[])).unwrap().0;
    let mut sandboxes = Vec::new();
    for (ns, name, host, uid) in &pods {
        let a = wait_annotation(&kube, ns, name);
        // The annotation is the port.
        let p = port(&cluster, &a.port_id).expect("the annotated port exists");
        assert_eq!(p.id, corvid_k8s::ids::port(uid));
        assert_eq!(
            (p.device_id.as_str(), p.mac_address.as_str()),
            (uid.as_str(), a.mac.as_str())
        );
        assert_eq!(p.binding_host_id, format!("h{}", host + 1));
        assert_eq!(a.pod_uid, *uid);
        assert_eq!(a.addresses.len(), 1);
        assert_eq!(a.addresses[0].addr(), p.fixed_ips[0].ip_address);
        // From the namespace's own /16 of the pod pool.
        let net = nets
            .iter()
            .find(|n| n.id == a.network_id)
            .cloned()
            .unwrap_or_else(|| cluster.api(|c| c.get::<Network>(&a.network_id)).unwrap());
        assert!(
            net.tags.contains(&format!("namespace:{ns}")),
            "{:?}",
            net.tags
        );
        let subnet = subnets
            .iter()
            .find(|s| s.id == p.fixed_ips[0].subnet_id)
            .cloned()
            .unwrap_or_else(|| {
                cluster
                    .api(|c| c.get::<Subnet>(&p.fixed_ips[0].subnet_id))
                    .unwrap()
            });
        assert_eq!(subnet.cidr.prefix_len(), 16);
        assert!("10.64.0.0/10"
            .parse::<ipnet::IpNet>()
            .unwrap()
            .contains(&subnet.cidr));
        assert!(subnet.cidr.contains(&a.addresses[0].addr()));
        let netns = cluster.pod(&format!("{ns}{name}"));
        let out = run_plugin(
            &cluster,
            &K8sCall {
                host: *host,
                command: "ADD",
                ns,
                name,
                uid,
                netns: Some(&netns.path),
            },
        );
        let result = cni_result(&out);
        assert_eq!(result["ips"][0]["address"], a.addresses[0].to_string());
        assert_eq!(result["interfaces"][0]["mac"], a.mac);
        wait_until(
            "the agent to report the port ACTIVE",
            Duration::from_secs(10),
            || port(&cluster, &a.port_id).is_some_and(|p| p.status == Status::Active),
        );
        sandboxes.push((ns, name.clone(), *host, uid.clone(), netns, a, result));
    }
    // The two namespaces' networks differ.
    assert_ne!(sandboxes[0].5.network_id, sandboxes[4].5.network_id);
    // Pods of a namespace reach each other across nodes.
    for ns in ["a", "b"] {
        let mine: Vec<_> = sandboxes.iter().filter(|s| s.0 == &ns).collect();
        for from in &mine {
            for to in &mine {
                if from.1 != to.1 {
                    let addr = to.5.addresses[0].addr().to_string();
                    assert!(
                        from.4.ping(&addr),
                        "{ns}/{} (h{}) cannot reach {ns}/{} (h{}) at {addr}",
                        from.1,
                        from.2 + 1,
                        to.1,
                        to.2 + 1
                    );
                }
            }
        }
    }
    // CHECK agrees with the namespace; the kubelet's two DELs both succeed.
    let (ns, name, host, uid, netns, _, result) = &sandboxes[0];
    let check = run_plugin_with(
        &cluster,
        &K8sCall {
            host: *host,
            command: "CHECK",
            ns,
            name,
            uid,
            netns: Some(&netns.path),
        },
        json!({"prevResult": result}),
    );
    assert!(check.status.success(), "CHECK: {check:?}");
    unplugged(&cluster, *host, [ns, name, uid], &netns.path, "DEL");
    assert!(
        netns.links("eth0").is_empty(),
        "the pod's interface is gone"
    );
    let again = run_plugin(
        &cluster,
        &K8sCall {
            host: *host,
            command: "DEL",
            ns,
            name,
            uid,
            netns: None,
        },
    );
    assert!(again.status.success(), "second DEL: {again:?}");
    // STATUS (CNI 1.1.0) asks the controller and the API server.
    let status = run_plugin_with(
        &cluster,
        &K8sCall {
            host: 0,
            command: "STATUS",
            ns: "a",
            name: "p0",
            uid: "",
            netns: None,
        },
        json!({"cniVersion": "1.1.0"}),
    );
    assert!(status.status.success(), "STATUS: {status:?}");
    // GC: a pod namespace gone without a DEL (the runtime crashed) is unplugged.
    let (gone_ns, gone_name, host, _, _, a, _) = sandboxes.remove(2);
    let gc = run_plugin_with(
        &cluster,
        &K8sCall {
            host,
            command: "GC",
            ns: "",
            name: "",
            uid: "",
            netns: None,
        },
        json!({"cniVersion": "1.1.0"}),
    );
    assert!(gc.status.success(), "GC: {gc:?}");
    assert_eq!(
        port(&cluster, &a.port_id).unwrap().network_ns,
        None,
        "GC unbound the port"
    );
    assert!(
        !cluster.hosts[host]
            .links("cvp")
            .contains(&corvid_net::names::host_veth(&a.port_id)),
        "GC removed the pair"
    );
    // Deleting the pods deletes their ports; a DEL after that still succeeds.
    delete_pod(&kube, gone_ns, &gone_name);
    for (ns, name, ..) in &sandboxes {
        delete_pod(&kube, ns, name);
    }
    wait_until("the pods' ports to go", Duration::from_secs(30), || {
        !ports(&cluster)
            .iter()
            .any(|p| p.device_owner == corvid_k8s::ids::POD_OWNER)
    });
    let (ns, name, host, uid, netns, ..) = &sandboxes[1];
    unplugged(
        &cluster,
        *host,
        [ns, name, uid],
        &netns.path,
        "DEL after the pod is gone",
    );
    assert!(netns.links("eth0").is_empty());
}

#[test]
fn the_watcher_sweeps_what_it_missed_and_a_recreated_pod_gets_a_new_port() {
    let (cluster, kube) = setup("ks");
    let mut watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "4"]);
    namespace(&kube, "c");
    namespace(&kube, "d");
    let c0 = pod(&kube, "c", "p0", "h1");
    pod(&kube, "d", "p0", "h2");
    let old = wait_annotation(&kube, "c", "p0");
    wait_annotation(&kube, "d", "p0");
    assert_eq!(networks_of_namespace(&cluster, "d").len(), 1);
    // Meanwhile, with the watcher down: a pod and a whole namespace go, and a pod comes
    // back under an old name (as a StatefulSet's does).
    watcher.kill9();
    delete_pod(&kube, "c", "p0");
    delete_pod(&kube, "d", "p0");
    delete_namespace(&kube, "d");
    let c0_again = pod(&kube, "c", "p0", "h1");
    assert_ne!(c0, c0_again);
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "4"]);
    wait_until(
        "the missed pod's port to be swept",
        Duration::from_secs(30),
        || port(&cluster, &old.port_id).is_none(),
    );
    wait_until(
        "the missed namespace's network to be swept",
        Duration::from_secs(30),
        || networks_of_namespace(&cluster, "d").is_empty(),
    );
    let new = wait_annotation(&kube, "c", "p0");
    assert_eq!(new.pod_uid, c0_again);
    assert_ne!(
        new.port_id, old.port_id,
        "a recreated pod gets a port of its own"
    );
    assert!(port(&cluster, &new.port_id).is_some());
    assert!(
        !ports(&cluster).iter().any(|p| p.device_id == c0),
        "no port of the old pod remains"
    );
}

#[test]
fn while_the_controller_is_down_the_watcher_retries_and_says_so_on_pods() {
    let (mut cluster, kube) = setup("kw");
    // Sweeps only every ten minutes: what follows must not wait for one.
    let _watcher = start_watcher(
        &cluster,
        &kube,
        &["--lease-seconds", "4", "--resync", "600"],
    );
    namespace(&kube, "r");
    pod(&kube, "r", "p0", "h1");
    let gone = wait_annotation(&kube, "r", "p0");
    cluster.controller.take().unwrap().kill9();
    // A pod deleted and a pod created while the controller is down.
    delete_pod(&kube, "r", "p0");
    pod(&kube, "r", "p1", "h1");
    wait_until("a warning event on r/p1", Duration::from_secs(20), || {
        events(&kube, "r").contains(&("ControllerUnreachable".into(), "p1".into()))
    });
    std::thread::sleep(Duration::from_secs(3));
    cluster.start_controller();
    wait_until(
        "the gone pod's port to be deleted",
        Duration::from_secs(40),
        || port(&cluster, &gone.port_id).is_none(),
    );
    wait_annotation(&kube, "r", "p1");
    // A namespace deleted (with its last pod) while the controller is down: its port and
    // network go once the controller is back, without waiting for a sweep.
    cluster.controller.take().unwrap().kill9();
    delete_pod(&kube, "r", "p1");
    delete_namespace(&kube, "r");
    std::thread::sleep(Duration::from_secs(2));
    cluster.start_controller();
    wait_until(
        "the gone namespace's network to be deleted",
        Duration::from_secs(40),
        || networks_of_namespace(&cluster, "r").is_empty(),
    );
    assert!(
        !ports(&cluster)
            .iter()
            .any(|p| p.device_owner == corvid_k8s::ids::POD_OWNER),
        "{:?}",
        ports(&cluster)
    );
}

#[test]
fn an_add_waits_for_the_pods_port_and_fails_clearly_without_leaving_anything() {
    let (cluster, kube) = setup("ka");
    namespace(&kube, "e");
    let uid = pod(&kube, "e", "p0", "h1");
    let netns = cluster.pod("e0");
    let call = K8sCall {
        host: 0,
        command: "ADD",
        ns: "e",
        name: "p0",
        uid: &uid,
        netns: Some(&netns.path),
    };
    // No watcher: past the timeout, "try again later" and nothing left.
    let out = run_plugin_with(&cluster, &call, json!({"timeout": 2}));
    let e = cni_error(&out);
    assert_eq!(e["code"], 11, "{e}");
    assert!(
        e["msg"].as_str().unwrap().contains("corvid kube-watch"),
        "{e}"
    );
    nothing_left(&cluster, 0, &netns);
    // Bad input, each a clear error of its own and nothing left behind: no pod UID to
    // name the port, a controller that is not a URL, a controller that does not answer.
    let nameless = K8sCall { uid: "", ..call };
    assert_eq!(cni_error(&run_plugin(&cluster, &nameless))["code"], 4);
    let e = cni_error(&run_plugin_with(
        &cluster,
        &call,
        json!({"controller": "nowhere"}),
    ));
    assert_eq!(e["code"], 7, "{e}");
    let down = json!({"controller": "http://10.99.0.254:1"});
    let e = cni_error(&run_plugin_with(&cluster, &call, down.clone()));
    assert_eq!(e["code"], 106, "controller unreachable: {e}");
    nothing_left(&cluster, 0, &netns);
    // An ADD that starts before the watcher made the pod's port waits, then succeeds.
    let conf = plugin_conf(0, 30);
    let add = spawn_plugin(&cluster, &call, &conf);
    std::thread::sleep(Duration::from_millis(500));
    // A network of one address: the second pod finds it full.
    let _watcher = start_watcher(
        &cluster,
        &kube,
        &["--lease-seconds", "4", "--namespace-prefix", "30"],
    );
    let result = cni_result(&add.wait_with_output().unwrap());
    assert_eq!(
        result["ips"][0]["address"]
            .as_str()
            .unwrap()
            .split('/')
            .nth(1),
        Some("30")
    );
    let full_uid = pod(&kube, "e", "p1", "h1");
    let full_ns = cluster.pod("e1");
    let full = K8sCall {
        name: "p1",
        uid: &full_uid,
        netns: Some(&full_ns.path),
        ..call
    };
    // The plugin waits out its timeout (it reads no pod), and points at the pod's events,
    // where the watcher says why.
    let e = cni_error(&run_plugin_with(&cluster, &full, json!({"timeout": 2})));
    assert_eq!(e["code"], 11, "exhausted namespace network: {e}");
    assert!(e["msg"].as_str().unwrap().contains("p1"), "{e}");
    assert!(full_ns.links("eth").is_empty());
    wait_until(
        "the refusal as an event on the pod",
        Duration::from_secs(10),
        || events(&kube, "e").contains(&("IpAddressGenerationFailure".into(), "p1".into())),
    );
    // DEL with the controller down succeeds wherever the host side can be undone (the
    // port is the controller side's): a plugged pod loses its pair, a pod never plugged
    // and a pod gone from the API have nothing local left to undo.
    let plugged = corvid_net::names::host_veth(&wait_annotation(&kube, "e", "p0").port_id);
    assert!(cluster.hosts[0].links("cvp").contains(&plugged));
    for (what, del) in [
        (
            "a plugged pod",
            K8sCall {
                command: "DEL",
                ..call
            },
        ),
        (
            "a pod never plugged",
            K8sCall {
                command: "DEL",
                ..full
            },
        ),
    ] {
        let out = run_plugin_with(&cluster, &del, down.clone());
        assert!(out.status.success(), "DEL of {what}: {out:?}");
    }
    assert!(netns.links("eth").is_empty());
    assert!(!cluster.hosts[0].links("cvp").contains(&plugged));
    delete_pod(&kube, "e", "p1");
    let gone = K8sCall {
        command: "DEL",
        ..full
    };
    let out = run_plugin_with(&cluster, &gone, down);
    assert!(
        out.status.success(),
        "DEL of a pod gone from the API: {out:?}"
    );
}

#[test]
fn a_pod_whose_first_sandbox_fails_gets_one_at_the_kubelets_next_attempt() {
    use support::cri::Containerd;
    let (cluster, kube) = setup("ky");
    namespace(&kube, "late");
    // A short plugin timeout: the first ADD gives up before the watcher runs.
    let conflist = json!({
        "cniVersion": "1.0.0", "name": "corvid",
        "plugins": [plugin_conf(0, 2)],
    });
    let node = Containerd::start(&cluster.hosts[0], cluster.bin.path(), &conflist);
    let uid = pod(&kube, "late", "p0", "h1");
    let watcher = std::thread::scope(|s| {
        let starter = s.spawn(|| {
            std::thread::sleep(Duration::from_secs(3));
            start_watcher(&cluster, &kube, &["--lease-seconds", "4"])
        });
        let made = node.sync_pod("late", "p0", &uid, 6);
        let (id, status) = made.unwrap_or_else(|e| panic!("no attempt worked: {e:?}"));
        let attempt = status
            .status
            .as_ref()
            .unwrap()
            .metadata
            .as_ref()
            .unwrap()
            .attempt;
        assert!(attempt > 0, "the first attempt cannot have worked");
        let a = annotation(&kube, "late", "p0").expect("annotated");
        assert_eq!(
            support::cri::sandbox_ip(&status),
            a.addresses[0].addr().to_string()
        );
        node.remove_sandbox(id);
        starter.join().unwrap()
    });
    drop(watcher);
    // The failed attempts left nothing: no veth on the node.
    assert!(cluster.hosts[0].links("cvp").is_empty());
}

/// The network namespace of a CRI sandbox, from its verbose status.
#[test]
fn pods_run_through_containerds_cri_as_the_kubelet_runs_them() {
    let (cluster, kube) = setup("kc");
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "4"]);
    namespace(&kube, "web");
    let nodes = cri_nodes(&cluster);
    let mut sandboxes = Vec::new();
    for (h, node) in nodes.iter().enumerate() {
        let name = format!("p{h}");
        let uid = pod(&kube, "web", &name, &format!("h{}", h + 1));
        let (id, status) = node
            .sync_pod("web", &name, &uid, 3)
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}"));
        let a = annotation(&kube, "web", &name).expect("annotated");
        let ip = support::cri::sandbox_ip(&status);
        assert_eq!(
            ip,
            a.addresses[0].addr().to_string(),
            "the sandbox has the port's address"
        );
        wait_until(
            "the agent to report the port ACTIVE",
            Duration::from_secs(10),
            || port(&cluster, &a.port_id).is_some_and(|p| p.status == Status::Active),
        );
        sandboxes.push((id, support::cri::sandbox_netns(&status), a));
    }
    // The two sandboxes, on two nodes, reach each other.
    let to = sandboxes[1].2.addresses[0].addr().to_string();
    let ping = Command::new("nsenter")
        .arg(format!("--net={}", sandboxes[0].1))
        .args(["ping", "-c", "1", "-W", "2", &to])
        .output()
        .unwrap();
    assert!(
        ping.status.success(),
        "sandbox on h1 cannot reach {to} on h2: {ping:?}"
    );
    // StopPodSandbox (DEL with the namespace) and RemovePodSandbox (DEL without it) both
    // succeed and unplug.
    for (h, (id, _, a)) in sandboxes.iter().enumerate() {
        nodes[h].remove_sandbox(id.clone());
        assert!(
            cluster.hosts[h].links("cvp").is_empty(),
            "the pod's veth is gone from h{}",
            h + 1
        );
        assert_eq!(port(&cluster, &a.port_id).unwrap().network_ns, None);
    }
}
