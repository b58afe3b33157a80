//! The watcher as a process: its service range, its election, its RBAC role, its in-cluster
//! configuration, and kills at random.

use super::*;

#[test]
fn the_service_range_comes_from_kubeadms_configuration_when_it_has_one() {
    let (cluster, kube) = setup("ku");
    kube.admin(|c| async move {
        let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
            "data": {"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta2\nkind: ClusterConfiguration\nnetworking:\n  dnsDomain: cluster.local\n  serviceSubnet: 10.0.0.0/25\n"},
        }))
        .unwrap();
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c, "kube-system")
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();
    });
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "4"]);
    wait_until("the service network", Duration::from_secs(20), || {
        service_range(&cluster).as_deref() == Some("10.0.0.0/25")
    });
}

#[test]
fn two_watchers_one_acts_and_the_other_takes_over_when_it_is_killed() {
    let (cluster, kube) = setup("kh");
    // Each serves its metrics and probes on the lan namespace's loopback.
    let (m1, m2) = ("127.0.0.1:19701", "127.0.0.1:19702");
    let metrics = |addr: &str, path: &str| {
        let url = format!("http://{addr}{path}");
        cluster
            .lan
            .open()
            .run(|| match ureq::get(&url).call() {
                Ok(r) => (r.status(), r.into_string().unwrap()),
                Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
                Err(e) => (0, e.to_string()),
            })
            .unwrap()
    };
    let value = |text: &str, series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let mut first = start_watcher(
        &cluster,
        &kube,
        &["--identity", "w1", "--metrics-listen", m1],
    );
    wait_until("w1 to lead", Duration::from_secs(30), || {
        lease_holder(&kube).as_deref() == Some("w1")
    });
    let _second = start_watcher(
        &cluster,
        &kube,
        &["--identity", "w2", "--metrics-listen", m2],
    );
    namespace(&kube, "g");
    pod(&kube, "g", "p0", "h1");
    wait_annotation(&kube, "g", "p0");
    // The leader counts what it did; the standby is ready to take over and did nothing.
    wait_until("w2's endpoints", Duration::from_secs(20), || {
        metrics(m2, "/readyz").0 == 200
    });
    assert_eq!(metrics(m1, "/readyz").0, 200);
    let (_, leading) = metrics(m1, "/metrics");
    assert_eq!(value(&leading, "corvid_kube_leader "), 1.0, "{leading}");
    assert!(value(&leading, "corvid_kube_events_total{kind=\"pod\"}") >= 1.0);
    assert!(value(&leading, "corvid_kube_annotation_duration_seconds_count ") >= 1.0);
    let (_, standing_by) = metrics(m2, "/metrics");
    assert_eq!(value(&standing_by, "corvid_kube_leader "), 0.0);
    assert_eq!(
        value(&standing_by, "corvid_kube_events_total{kind=\"pod\"}"),
        0.0
    );
    assert_eq!(
        lease_holder(&kube).as_deref(),
        Some("w1"),
        "the standby did not take the lease"
    );
    first.kill9();
    let killed = std::time::Instant::now();
    pod(&kube, "g", "p1", "h2");
    wait_annotation(&kube, "g", "p1");
    let took = killed.elapsed();
    assert_eq!(lease_holder(&kube).as_deref(), Some("w2"));
    let (_, leading) = metrics(m2, "/metrics");
    assert_eq!(value(&leading, "corvid_kube_leader "), 1.0);
    assert!(value(&leading, "corvid_kube_annotation_duration_seconds_count ") >= 1.0);
    assert!(
        took < Duration::from_secs(15),
        "the standby took {took:?} to act"
    );
    eprintln!("takeover after kill -9 of the holder: {took:?}");
}

#[test]
fn the_watchers_role_lists_services_and_patches_their_status_on_this_api_server() {
    use k8s_openapi::api::core::v1::Service;
    let (_cluster, kube) = setup("kv");
    kube.admin(|c| async move {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {"type": "LoadBalancer", "selector": {"app": "web"},
                     "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]},
        }))
        .unwrap();
        Api::<Service>::namespaced(c, "default")
            .create(&PostParams::default(), &svc)
            .await
            .unwrap();
    });
    // What the service part of the watcher will do, as the watcher's user, with the
    // kube/k8s-openapi pair against this 1.20 server: list, watch, and a status patch.
    let status = kube.run(
        &kube.kubeconfig(support::kube::WATCHER_TOKEN),
        |c| async move {
            let api = Api::<Service>::namespaced(c, "default");
            let listed = api.list(&Default::default()).await.unwrap();
            assert_eq!(listed.items.len(), 2, "the kubernetes service and web");
            let patch = json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}});
            let patched = api
                .patch_status(
                    "web",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await
                .unwrap();
            let denied = api
                .patch(
                    "web",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&json!({"metadata": {"labels": {"x": "y"}}})),
                )
                .await;
            assert!(
                matches!(denied, Err(kube::Error::Api(ref s)) if s.code == 403),
                "the role may not change services: {denied:?}"
            );
            patched
                .status
                .unwrap()
                .load_balancer
                .unwrap()
                .ingress
                .unwrap()[0]
                .ip
                .clone()
        },
    );
    assert_eq!(status.as_deref(), Some("203.0.113.7"));
}

#[test]
fn the_watcher_runs_on_its_in_cluster_configuration_through_the_kubernetes_service() {
    let (cluster, kube) = setup("ki");
    // First start, as the Deployment's ConfigMap points it at the API server itself:
    // nothing serves the `kubernetes` service before the watcher has made it.
    let (mut first, _sa) = start_in_cluster_watcher(
        &cluster.lan,
        &kube,
        (API_ADDR, 6443),
        &["--lease-seconds", "4"],
    );
    namespace(&kube, "ic1");
    wait_until("ic1's network", Duration::from_secs(20), || {
        networks_of_namespace(&cluster, "ic1").len() == 1
    });
    let kubernetes = kubernetes_cluster_ip(&kube);
    // Then on a node's host network, as kubelet's environment gives it: through the
    // service's cluster IP, which the node's agent serves, with the API server's TLS.
    // A node routes a cluster IP by its default route before the agent's DNAT picks the
    // API server, as with kube-proxy.
    cluster.hosts[0].ip("route add default via 10.99.0.254");
    // Once the first watcher has made the service and the node's agent serves it: killed
    // before, nothing would serve it (the bootstrap the ConfigMap's api-server keys are for).
    let connect =
        format!("import socket; socket.create_connection(('{kubernetes}', 443), timeout=2)");
    wait_until(
        "the kubernetes service served on the node",
        Duration::from_secs(20),
        || {
            cluster.hosts[0]
                .command("python3")
                .args(["-c", &connect])
                .status()
                .is_ok_and(|s| s.success())
        },
    );
    let (_second, _sa2) = start_in_cluster_watcher(
        &cluster.hosts[0],
        &kube,
        (&kubernetes, 443),
        &["--lease-seconds", "4", "--metrics-listen", "127.0.0.1:9698"],
    );
    first.kill9();
    namespace(&kube, "ic2");
    wait_until(
        "ic2's network, made by the watcher on the node",
        Duration::from_secs(30),
        || networks_of_namespace(&cluster, "ic2").len() == 1,
    );
}

/// The watcher killed at random moments while namespaces and pods come and go: after
/// each restart (same identity, so it takes its lease back at once) the controller
/// converges to the objects, and nothing leaks.
#[test]
fn a_watcher_killed_at_random_converges_and_leaks_nothing() {
    let (cluster, kube) = setup("kq");
    let args = ["--identity", "cvt-crash", "--lease-seconds", "4"];
    let mut watcher = start_watcher(&cluster, &kube, &args);
    let mut live: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut gone = Vec::new();
    let mut rng = u64::from(std::process::id()) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    const KILLS: usize = 32;
    let mut waited = Vec::new();
    let mut cut = 0;
    for round in 0..KILLS {
        let pick = next();
        match round % 4 {
            0 | 1 if round % 8 < 2 || live.is_empty() => {
                let ns = format!("n{round}");
                namespace(&kube, &ns);
                pod(&kube, &ns, "p0", "h1");
                live.insert(ns, vec!["p0".into()]);
            }
            0 | 1 => {
                let ns = live.keys().nth(pick as usize % live.len()).unwrap().clone();
                let name = format!("p{round}");
                pod(&kube, &ns, &name, if pick % 2 == 0 { "h1" } else { "h2" });
                live.get_mut(&ns).unwrap().push(name);
            }
            2 => {
                let ns = live.keys().nth(pick as usize % live.len()).unwrap().clone();
                let pods = live.get_mut(&ns).unwrap();
                if !pods.is_empty() {
                    let name = pods.remove(pick as usize % pods.len());
                    delete_pod(&kube, &ns, &name);
                }
            }
            _ => {
                if live.len() > 1 {
                    let ns = live.keys().nth(pick as usize % live.len()).unwrap().clone();
                    for p in live.remove(&ns).unwrap() {
                        delete_pod(&kube, &ns, &p);
                    }
                    delete_namespace(&kube, &ns);
                    gone.push(ns);
                }
            }
        }
        // The watcher acts within milliseconds of a change.
        std::thread::sleep(Duration::from_micros(next() % 40_000));
        watcher.kill9();
        // With the watcher dead the state holds still: a gap now is work the kill cut.
        cut += usize::from(watcher_gap(&cluster, &kube, &live, &gone).is_some());
        watcher = start_watcher(&cluster, &kube, &args);
        let start = std::time::Instant::now();
        while let Some(gap) = watcher_gap(&cluster, &kube, &live, &gone) {
            assert!(
                start.elapsed() < Duration::from_secs(40),
                "kill {round}: the controller never matched the objects: {gap}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        waited.push(start.elapsed());
    }
    waited.sort();
    eprintln!(
        "{KILLS} kills, {cut} with work left undone; converged after each, median {:?}, longest {:?}",
        waited[KILLS / 2],
        waited[KILLS - 1]
    );
    assert!(cut >= KILLS / 4, "only {cut} kills cut the watcher's work");
}

/// A scheduled pod with labels and a named container port.
fn labelled_pod(kube: &KubeApi, ns: &str, name: &str, labels: Value) {
    let (ns, name) = (ns.to_string(), name.to_string());
    kube.admin(|c| async move {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": "h1", "containers": [{"name": "c", "image": "cvt-pause",
                "ports": [{"name": "http", "containerPort": 8080}]}]},
        }))
        .unwrap();
        Api::<Pod>::namespaced(c, &ns)
            .create(&PostParams::default(), &p)
            .await
            .unwrap();
    });
}

/// The watcher's groups (name, revision, rule IDs) and its pods' ports (name, revision,
/// groups), by ID.
type PolicyState = (
    std::collections::BTreeMap<String, (String, u64, Vec<String>)>,
    std::collections::BTreeMap<String, (String, u64, Vec<String>)>,
);

fn policy_state(cluster: &Cluster) -> PolicyState {
    use corvid_api::SecurityGroup;
    cluster.api(|c| {
        let (groups, _) = c
            .list::<SecurityGroup>(&[("tags", "corvid:k8s-policy")])
            .unwrap();
        let (ports, _) = c
            .list::<Port>(&[("device_owner", corvid_k8s::ids::POD_OWNER)])
            .unwrap();
        let groups = groups
            .into_iter()
            .map(|g| {
                let mut rules: Vec<String> =
                    g.security_group_rules.into_iter().map(|r| r.id).collect();
                rules.sort();
                (g.id, (g.name, g.revision_number, rules))
            })
            .collect();
        let ports = ports
            .into_iter()
            .map(|p| {
                let mut groups = p.security_groups;
                groups.sort();
                (p.id, (p.name, p.revision_number, groups))
            })
            .collect();
        (groups, ports)
    })
}

/// The names of the groups of the port of pod `ns/name`.
fn group_names(state: &PolicyState, ns: &str, name: &str) -> Vec<String> {
    let port = format!("{ns}/{name}");
    let Some((_, _, groups)) = state.1.values().find(|p| p.0 == port) else {
        return Vec::new();
    };
    let mut names: Vec<String> = groups
        .iter()
        .filter_map(|g| state.0.get(g).map(|(n, _, _)| n.clone()))
        .collect();
    names.sort();
    names
}

/// NetworkPolicies become groups on the pods' ports; a watcher restarted with everything
/// in place changes no group, rule or port (so no host rewrites its rules), and mends
/// what changed while it was down: a policy deleted meanwhile takes its groups with it.
#[test]
fn a_restarted_watcher_rewrites_no_policy_group_and_mends_what_changed_meanwhile() {
    let (cluster, kube) = setup("kz");
    let args = ["--identity", "cvt-np", "--lease-seconds", "2"];
    let mut watcher = start_watcher(&cluster, &kube, &args);
    namespace(&kube, "np");
    labelled_pod(&kube, "np", "web", json!({"app": "web"}));
    labelled_pod(&kube, "np", "client", json!({"role": "client"}));
    network_policy(
        &kube,
        "np",
        "web",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                "ports": [{"port": "http"}]}]}),
    );
    let open = ["k8s-node-h1", "k8s-open-egress", "k8s-open-ingress"];
    let mut state = policy_state(&cluster);
    wait_until(
        "the policy's groups on the ports",
        Duration::from_secs(30),
        || {
            state = policy_state(&cluster);
            group_names(&state, "np", "web") == ["k8s-node-h1", "k8s-np-np-web", "k8s-open-egress"]
                && group_names(&state, "np", "client")
                    == [
                        "k8s-node-h1",
                        "k8s-open-egress",
                        "k8s-open-ingress",
                        "k8s-peer",
                    ]
        },
    );
    // The policy's group: the clients' group in, on the pod's own port 8080, both families.
    let (_, (_, _, rules)) = state
        .0
        .iter()
        .find(|(_, g)| g.0 == "k8s-np-np-web")
        .unwrap();
    assert_eq!(rules.len(), 2, "{state:?}");

    watcher.kill9();
    watcher = start_watcher(&cluster, &kube, &args);
    // A change after the restart shows it has listed and synced: a pod with no labels.
    labelled_pod(&kube, "np", "late", json!({}));
    wait_until("the late pod's groups", Duration::from_secs(30), || {
        group_names(&policy_state(&cluster), "np", "late") == open
    });
    let mut after = policy_state(&cluster);
    let late = after
        .1
        .iter()
        .find(|(_, p)| p.0 == "np/late")
        .unwrap()
        .0
        .clone();
    after.1.remove(&late);
    assert_eq!(
        after, state,
        "the restarted watcher changed what was in place"
    );

    // Deleted while the watcher is down: its groups go, and the pods are open again.
    watcher.kill9();
    delete_network_policy(&kube, "np", "web");
    let _watcher = start_watcher(&cluster, &kube, &args);
    wait_until("the policy's groups to go", Duration::from_secs(30), || {
        let s = policy_state(&cluster);
        group_names(&s, "np", "web") == open
            && group_names(&s, "np", "client") == open
            && s.0
                .values()
                .all(|g| g.0 != "k8s-np-np-web" && g.0 != "k8s-peer")
    });
}
