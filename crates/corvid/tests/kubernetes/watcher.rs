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
    let (cluster, kube) = setup("kc");
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
