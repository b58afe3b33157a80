//! Kubernetes against a real kube-apiserver (v1.20) on a real etcd: `corvid kube-watch` as
//! the RBAC-bound user of deploy/kubernetes/rbac.yaml, two simulated nodes with agents, and
//! the `corvid-k8s` plugin run as the kubelet runs it (CNI_ARGS in varying order).

mod support {
    pub mod cluster;
    pub mod cri;
    pub mod kube;
}

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use corvid_api::{Network, Port, Status, Subnet};
use corvid_k8s::annotation::{PortAnnotation, KEY};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{json, Value};
use support::cluster::ns::{spawn_with_input, wait_until};
use support::cluster::{cni_result, Cluster};
use support::kube::{
    plugin_conf, start_in_cluster_watcher, start_watcher, KubeApi, NOBODY_TOKEN, NODE_TOKEN,
};

const API_ADDR: &str = "10.99.0.254";

fn manifest(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/kubernetes")
        .join(name)
}

/// The cluster, the API server beside the controller, and the RBAC objects applied.
fn setup(name: &str) -> (Cluster, KubeApi) {
    setup_with(name, &[])
}

/// As [`setup`], with more arguments for the API server.
fn setup_with(name: &str, extra: &[&str]) -> (Cluster, KubeApi) {
    let cluster = Cluster::new(name);
    let kube = KubeApi::start_with(&cluster.lan.path, API_ADDR, extra);
    kube.apply_manifest(&manifest("rbac.yaml"));
    (cluster, kube)
}

fn namespace(kube: &KubeApi, name: &str) {
    let name = name.to_string();
    kube.admin(|c| async move {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        Api::<Namespace>::all(c)
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    })
}

/// Creates a pod already scheduled to `node`; returns its UID.
fn pod(kube: &KubeApi, ns: &str, name: &str, node: &str) -> String {
    pod_with(kube, ns, name, node, json!({}))
}

/// A pod with these annotations.
fn pod_with(kube: &KubeApi, ns: &str, name: &str, node: &str, annotations: Value) -> String {
    let (ns, name, node) = (ns.to_string(), name.to_string(), node.to_string());
    kube.admin(|c| async move {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "cvt-pause"}]},
        }))
        .unwrap();
        Api::<Pod>::namespaced(c, &ns)
            .create(&PostParams::default(), &p)
            .await
            .unwrap()
            .metadata
            .uid
            .unwrap()
    })
}

fn delete_pod(kube: &KubeApi, ns: &str, name: &str) {
    let (ns, name) = (ns.to_string(), name.to_string());
    kube.admin(|c| async move {
        Api::<Pod>::namespaced(c, &ns)
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    });
}

/// Deletes a namespace and finishes it as the namespace controller would (there is none).
fn delete_namespace(kube: &KubeApi, name: &str) {
    let name = name.to_string();
    kube.admin(|c| async move {
        let api = Api::<Namespace>::all(c.clone());
        api.delete(&name, &DeleteParams::default()).await.unwrap();
        let mut ns = api.get(&name).await.unwrap();
        if let Some(spec) = &mut ns.spec {
            spec.finalizers = Some(Vec::new());
        }
        let body = serde_json::to_vec(&ns).unwrap();
        let req = http::Request::put(format!("/api/v1/namespaces/{name}/finalize"))
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
        c.request::<Value>(req).await.unwrap();
    });
}

fn annotation(kube: &KubeApi, ns: &str, name: &str) -> Option<PortAnnotation> {
    let (ns, name) = (ns.to_string(), name.to_string());
    kube.admin(|c| async move {
        let p = Api::<Pod>::namespaced(c, &ns)
            .get_opt(&name)
            .await
            .unwrap()?;
        let text = p.metadata.annotations?.get(KEY)?.clone();
        Some(PortAnnotation::parse(&text).unwrap())
    })
}

fn wait_annotation(kube: &KubeApi, ns: &str, name: &str) -> PortAnnotation {
    let mut found = None;
    wait_until(
        &format!("the annotation of {ns}/{name}"),
        Duration::from_secs(30),
        || {
            found = annotation(kube, ns, name);
            found.is_some()
        },
    );
    found.unwrap()
}

/// The CNI_ARGS the kubelet sends through containerd: its keys in a different order on
/// each call.
fn cni_args(ns: &str, name: &str, uid: &str, sandbox: &str, shuffle: usize) -> String {
    let mut pairs = [
        "IgnoreUnknown=1".to_string(),
        format!("K8S_POD_NAMESPACE={ns}"),
        format!("K8S_POD_NAME={name}"),
        format!("K8S_POD_INFRA_CONTAINER_ID={sandbox}"),
        format!("K8S_POD_UID={uid}"),
    ];
    let n = pairs.len();
    pairs.rotate_left(shuffle % n);
    pairs.join(";")
}

struct K8sCall<'a> {
    host: usize,
    command: &'a str,
    ns: &'a str,
    name: &'a str,
    uid: &'a str,
    netns: Option<&'a Path>,
}

fn spawn_plugin(cluster: &Cluster, call: &K8sCall, conf: &Value) -> Child {
    let sandbox = format!("sandbox-{}", call.uid);
    let shuffle = call.command.len() + call.name.len();
    let mut cmd = cluster.hosts[call.host].command(cluster.bin.path().join("corvid-k8s"));
    cmd.env("CNI_COMMAND", call.command)
        .env("CNI_CONTAINERID", &sandbox)
        .env(
            "CNI_NETNS",
            call.netns.map(|p| p.as_os_str()).unwrap_or_default(),
        )
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", cluster.bin.path())
        .env(
            "CNI_ARGS",
            cni_args(call.ns, call.name, call.uid, &sandbox, shuffle),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn_with_input(&mut cmd, &conf.to_string())
}

fn run_plugin(cluster: &Cluster, kube: &KubeApi, call: &K8sCall) -> Output {
    run_plugin_with(cluster, kube, call, json!({}))
}

/// The plugin with `extra` merged into its configuration (prevResult, a timeout...).
fn run_plugin_with(cluster: &Cluster, kube: &KubeApi, call: &K8sCall, extra: Value) -> Output {
    let mut conf = plugin_conf(kube, call.host, NODE_TOKEN, 30);
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    spawn_plugin(cluster, call, &conf)
        .wait_with_output()
        .unwrap()
}

fn ports(cluster: &Cluster) -> Vec<Port> {
    cluster.ports()
}

fn port(cluster: &Cluster, id: &str) -> Option<Port> {
    ports(cluster).into_iter().find(|p| p.id == id)
}

fn cni_error(out: &Output) -> Value {
    assert!(!out.status.success(), "expected a failure: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("a CNI error on stdout: {out:?}"))
}

/// The CIDR of the watcher's service network, once it is made.
fn service_range(cluster: &Cluster) -> Option<String> {
    let (_, subnet) = corvid_k8s::ids::service_network();
    cluster
        .api(|c| c.get::<corvid_api::Subnet>(&subnet))
        .ok()
        .map(|s| s.cidr.to_string())
}

fn service_names(kube: &KubeApi, ns: &str) -> Vec<String> {
    use k8s_openapi::api::core::v1::Service;
    let ns = ns.to_string();
    kube.admin(|c| async move {
        Api::<Service>::namespaced(c, &ns)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect()
    })
}

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
            &kube,
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
        &kube,
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
    unplugged(&cluster, &kube, *host, [ns, name, uid], &netns.path, "DEL");
    assert!(
        netns.links("eth0").is_empty(),
        "the pod's interface is gone"
    );
    let again = run_plugin(
        &cluster,
        &kube,
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
        &kube,
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
        &kube,
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
        &kube,
        *host,
        [ns, name, uid],
        &netns.path,
        "DEL after the pod is gone",
    );
    assert!(netns.links("eth0").is_empty());
}

/// A DEL of pod `[namespace, name, uid]` that succeeds and leaves the pod without its
/// interface.
fn unplugged(
    cluster: &Cluster,
    kube: &KubeApi,
    host: usize,
    pod: [&str; 3],
    netns: &Path,
    what: &str,
) {
    let [ns, name, uid] = pod;
    let call = K8sCall {
        host,
        command: "DEL",
        ns,
        name,
        uid,
        netns: Some(netns),
    };
    let out = run_plugin(cluster, kube, &call);
    assert!(out.status.success(), "{what}: {out:?}");
    let left = std::process::Command::new("ip")
        .args([
            "-n",
            &netns.file_name().unwrap().to_string_lossy(),
            "link",
            "show",
            "eth0",
        ])
        .output()
        .unwrap();
    assert!(!left.status.success(), "{what}: eth0 is still in the pod");
}

/// The `kubernetes` service's cluster IP.
fn kubernetes_cluster_ip(kube: &KubeApi) -> String {
    kube.admin(|c| async move {
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(c, "default")
            .get("kubernetes")
            .await
            .unwrap()
            .spec
            .unwrap()
            .cluster_ip
            .unwrap()
    })
}

fn lease_holder(kube: &KubeApi) -> Option<String> {
    kube.admin(|c| async move {
        let api: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(c, "kube-system");
        api.get_opt("corvid-kube-watch")
            .await
            .unwrap()?
            .spec?
            .holder_identity
    })
}

fn networks_of_namespace(cluster: &Cluster, name: &str) -> Vec<Network> {
    let tag = format!("namespace:{name}");
    cluster
        .api(|c| c.list::<Network>(&[("tags", tag.as_str())]))
        .unwrap()
        .0
}

/// Nothing of a failed ADD stays: no interface in the pod, no veth on the node, no port
/// bound to a namespace.
fn nothing_left(cluster: &Cluster, host: usize, netns: &support::cluster::ns::Ns) {
    assert!(
        netns.links("eth").is_empty(),
        "an interface was left in the pod"
    );
    assert!(
        cluster.hosts[host].links("cvp").is_empty(),
        "a veth was left on the node"
    );
    assert!(
        ports(cluster).iter().all(|p| p.network_ns.is_none()),
        "a port was left bound to a namespace"
    );
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
fn an_add_waits_for_the_annotation_and_fails_clearly_without_leaving_anything() {
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
    let out = run_plugin_with(&cluster, &kube, &call, json!({"timeout": 2}));
    let e = cni_error(&out);
    assert_eq!(e["code"], 11, "{e}");
    assert!(
        e["msg"].as_str().unwrap().contains("corvid kube-watch"),
        "{e}"
    );
    nothing_left(&cluster, 0, &netns);
    // Bad input, each a clear error of its own and nothing left behind.
    let bad_uid = pod_with(&kube, "e", "bad", "h1", json!({KEY: "{\"portId\": 5"}));
    let bad = K8sCall {
        name: "bad",
        uid: &bad_uid,
        ..call
    };
    let e = cni_error(&run_plugin(&cluster, &kube, &bad));
    assert_eq!(e["code"], 112, "malformed annotation: {e}");
    delete_pod(&kube, "e", "bad");
    let e = cni_error(&run_plugin_with(
        &cluster,
        &kube,
        &call,
        json!({"kubeconfig": "/nonexistent/kubeconfig"}),
    ));
    assert_eq!(e["code"], 7, "missing kubeconfig: {e}");
    let e = cni_error(&run_plugin_with(
        &cluster,
        &kube,
        &call,
        json!({"kubeconfig": kube.kubeconfig(NOBODY_TOKEN)}),
    ));
    assert_eq!(e["code"], 111, "no RBAC role: {e}");
    let unreachable = kube.kubeconfig(NODE_TOKEN);
    let text = std::fs::read_to_string(&unreachable)
        .unwrap()
        .replace(":6443", ":6444");
    let elsewhere = unreachable.with_extension("elsewhere");
    std::fs::write(&elsewhere, text).unwrap();
    let e = cni_error(&run_plugin_with(
        &cluster,
        &kube,
        &call,
        json!({"kubeconfig": elsewhere}),
    ));
    assert_eq!(e["code"], 110, "API server unreachable: {e}");
    nothing_left(&cluster, 0, &netns);
    // An ADD that starts before the watcher annotates the pod waits, then succeeds.
    let conf = plugin_conf(&kube, 0, NODE_TOKEN, 30);
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
    let e = cni_error(&run_plugin(&cluster, &kube, &full));
    assert_eq!(e["code"], 100, "exhausted namespace network: {e}");
    assert!(e["msg"].as_str().unwrap().contains("p1"), "{e}");
    assert!(full_ns.links("eth").is_empty());
    // The controller unreachable after the pod was plugged: 106, and the plug undone.
    namespace(&kube, "e2");
    let lone_uid = pod(&kube, "e2", "p0", "h2");
    let a = wait_annotation(&kube, "e2", "p0");
    let lone_ns = cluster.pod("e20");
    let lone = K8sCall {
        host: 1,
        ns: "e2",
        name: "p0",
        uid: &lone_uid,
        netns: Some(&lone_ns.path),
        ..call
    };
    let e = cni_error(&run_plugin_with(
        &cluster,
        &kube,
        &lone,
        json!({"controller": "http://10.99.0.254:1"}),
    ));
    assert_eq!(e["code"], 106, "controller unreachable: {e}");
    assert!(
        lone_ns.links("eth").is_empty(),
        "the pod's interface was removed"
    );
    assert!(
        !cluster.hosts[1]
            .links("cvp")
            .contains(&corvid_net::names::host_veth(&a.port_id)),
        "the pair was removed"
    );
    // DEL with the controller down succeeds wherever the host side can be undone (the
    // port is the controller side's): a plugged pod loses its pair, a pod never plugged
    // and a pod gone from the API have nothing local left to undo.
    let down = json!({"controller": "http://10.99.0.254:1"});
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
                ..lone
            },
        ),
    ] {
        let out = run_plugin_with(&cluster, &kube, &del, down.clone());
        assert!(out.status.success(), "DEL of {what}: {out:?}");
    }
    assert!(netns.links("eth").is_empty());
    assert!(!cluster.hosts[0].links("cvp").contains(&plugged));
    delete_pod(&kube, "e", "p1");
    let gone = K8sCall {
        command: "DEL",
        ..full
    };
    let out = run_plugin_with(&cluster, &kube, &gone, down);
    assert!(
        out.status.success(),
        "DEL of a pod gone from the API: {out:?}"
    );
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
fn a_pod_whose_first_sandbox_fails_gets_one_at_the_kubelets_next_attempt() {
    use support::cri::Containerd;
    let (cluster, kube) = setup("ky");
    namespace(&kube, "late");
    // A short plugin timeout: the first ADD gives up before the watcher runs.
    let conflist = json!({
        "cniVersion": "1.0.0", "name": "corvid",
        "plugins": [plugin_conf(&kube, 0, NODE_TOKEN, 2)],
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
    use support::cri::Containerd;
    let (cluster, kube) = setup("kc");
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "4"]);
    namespace(&kube, "web");
    let nodes: Vec<Containerd> = (0..2)
        .map(|h| {
            let conflist = json!({
                "cniVersion": "1.0.0", "name": "corvid",
                "plugins": [plugin_conf(&kube, h, NODE_TOKEN, 30)],
            });
            Containerd::start(&cluster.hosts[h], cluster.bin.path(), &conflist)
        })
        .collect();
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

/// A service's pods: made, annotated, plugged on their nodes, serving their name on 8080
/// (TCP) and 5353 (UDP), and Ready.
struct ServedPods {
    /// (name, node index, UID, namespace, address).
    pods: Vec<(String, usize, String, support::cluster::ns::Ns, String)>,
    _servers: Vec<support::cluster::ns::Proc>,
}

fn served_pods(
    cluster: &Cluster,
    kube: &KubeApi,
    ns: &str,
    pods: &[(&str, usize, &str)],
) -> ServedPods {
    let mut out = Vec::new();
    let mut servers = Vec::new();
    for (name, host, app) in pods {
        let (n, nsn, app2) = (name.to_string(), ns.to_string(), app.to_string());
        let node = format!("h{}", host + 1);
        let uid = kube.admin(|c| async move {
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": n, "labels": {"app": app2}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "cvt-pause",
                    "ports": [{"name": "http", "containerPort": 8080}]}]},
            }))
            .unwrap();
            Api::<Pod>::namespaced(c, &nsn)
                .create(&PostParams::default(), &p)
                .await
                .unwrap()
                .metadata
                .uid
                .unwrap()
        });
        let a = wait_annotation(kube, ns, name);
        let netns = cluster.pod(&format!("{ns}{name}"));
        let call = K8sCall {
            host: *host,
            command: "ADD",
            ns,
            name,
            uid: &uid,
            netns: Some(&netns.path),
        };
        cni_result(&run_plugin(cluster, kube, &call));
        servers.push(netns.serve_name(name, 8080));
        servers.push(netns.serve_name(name, 5353));
        set_ready(kube, ns, name, true);
        out.push((
            name.to_string(),
            *host,
            uid,
            netns,
            a.addresses[0].addr().to_string(),
        ));
    }
    ServedPods {
        pods: out,
        _servers: servers,
    }
}

/// Sets the pod's Ready condition and its IP (the first of its annotation's), as its
/// kubelet would.
fn set_ready(kube: &KubeApi, ns: &str, name: &str, ready: bool) {
    let ip = annotation(kube, ns, name).map(|a| a.addresses[0].addr().to_string());
    let (ns, name) = (ns.to_string(), name.to_string());
    kube.admin(|c| async move {
        let patch = json!({"status": {"podIP": ip, "podIPs": ip.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
        Api::<Pod>::namespaced(c, &ns)
            .patch_status(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
    });
}

/// Creates (or with `patch`, merge-patches) a service; returns it as the API server has it.
fn service(
    kube: &KubeApi,
    ns: &str,
    name: &str,
    body: Value,
    patch: bool,
) -> k8s_openapi::api::core::v1::Service {
    use k8s_openapi::api::core::v1::Service;
    let (ns, name) = (ns.to_string(), name.to_string());
    kube.admin(|c| async move {
        let api = Api::<Service>::namespaced(c, &ns);
        if patch {
            api.patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&body),
            )
            .await
            .unwrap()
        } else {
            let mut body = body;
            body["metadata"] = json!({"name": name});
            api.create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap()
        }
    })
}

fn answers_of(answers: &[String]) -> std::collections::BTreeSet<&str> {
    answers.iter().map(String::as_str).collect()
}

#[test]
fn a_restarted_watcher_keeps_every_service_member_while_it_loads() {
    let (cluster, kube) = setup("ko");
    let mut watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "4"]);
    namespace(&kube, "o");
    let _served = served_pods(&cluster, &kube, "o", &[("p0", 0, "web"), ("p1", 1, "web")]);
    service(
        &kube,
        "o",
        "web",
        json!({"spec": {"selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http"}]}}),
        false,
    );
    // The web pods' members (the `kubernetes` service has the API server's).
    let members = || {
        cluster
            .api(|c| c.list::<corvid_api::Member>(&[("protocol_port", "8080")]))
            .map(|l| l.0.len())
            .unwrap_or(0)
    };
    wait_until("both members", Duration::from_secs(20), || members() == 2);
    // Pods no node runs yet: the watcher leaves them alone, but they make its pod list
    // long, so a restarted watcher has its services well before its pods.
    kube.admin(|c| async move {
        let api = Api::<Pod>::namespaced(c, "o");
        for i in 0..300 {
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("pending{i}"), "labels": {"app": "other"}},
                "spec": {"containers": [{"name": "c", "image": "cvt-pause"}]},
            }))
            .unwrap();
            api.create(&PostParams::default(), &p).await.unwrap();
        }
    });
    // A restarted watcher lists services and pods in either order: the members stay
    // while it has not seen every pod (they once went for 20-30 ms).
    watcher.kill9();
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "1"]);
    let until = std::time::Instant::now() + Duration::from_secs(8);
    let mut least = usize::MAX;
    while std::time::Instant::now() < until {
        least = least.min(members());
    }
    assert_eq!(least, 2, "a member went while the watcher restarted");
}

#[test]
fn services_without_a_selector_and_the_kubernetes_service_are_served() {
    let (cluster, kube) = setup("kn");
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "4"]);
    namespace(&kube, "x");
    let served = served_pods(
        &cluster,
        &kube,
        "x",
        &[("m0", 0, "none"), ("client", 1, "client")],
    );
    let (member_ip, client) = (served.pods[0].4.clone(), &served.pods[1].3);
    // A service whose endpoints are written by hand.
    let svc = service(
        &kube,
        "x",
        "manual",
        json!({"spec": {"ports": [{"name": "http", "port": 80, "targetPort": 9999}]}}),
        false,
    );
    let endpoints = json!({
        "metadata": {"name": "manual"},
        "subsets": [{"addresses": [{"ip": member_ip}], "ports": [{"name": "http", "port": 8080}]}],
    });
    kube.admin(|c| async move {
        let ep: k8s_openapi::api::core::v1::Endpoints = serde_json::from_value(endpoints).unwrap();
        Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(c, "x")
            .create(&PostParams::default(), &ep)
            .await
            .unwrap();
    });
    let vip = svc.spec.unwrap().cluster_ip.unwrap();
    wait_until(
        "the hand-written endpoint to answer",
        Duration::from_secs(20),
        || client.connect(&vip, 80, 1, false) == ["m0"],
    );
    // A hand-written EndpointSlice and no Endpoints: the members are the slices', as
    // kube-proxy takes them.
    let svc = service(
        &kube,
        "x",
        "sliced",
        json!({"spec": {"ports": [{"name": "http", "port": 80, "targetPort": 9999}]}}),
        false,
    );
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice",
        "metadata": {"name": "sliced-1", "labels": {"kubernetes.io/service-name": "sliced"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [member_ip], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    });
    kube.admin(|c| async move {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "discovery.k8s.io",
            "v1beta1",
            "EndpointSlice",
        ));
        Api::<DynamicObject>::namespaced_with(c, "x", &ar)
            .create(
                &PostParams::default(),
                &serde_json::from_value(slice).unwrap(),
            )
            .await
            .unwrap();
    });
    let sliced = svc.spec.unwrap().cluster_ip.unwrap();
    wait_until(
        "the hand-written slice's endpoint to answer",
        Duration::from_secs(20),
        || client.connect(&sliced, 80, 1, false) == ["m0"],
    );
    // The `kubernetes` service, whose endpoints the API server writes: the API server's
    // own address, outside every corvid network, reached through the node.
    let kubernetes = kubernetes_cluster_ip(&kube);
    // With the API server's TLS: its certificate, checked against the CA, names the
    // cluster IP.
    let script = format!(
        "import socket, ssl\nc = ssl.create_default_context(cafile='{}')\n\
         s = c.wrap_socket(socket.create_connection(('{kubernetes}', 443), timeout=3), server_hostname='{kubernetes}')\n\
         s.sendall(b'GET /version HTTP/1.1\\r\\nHost: kubernetes\\r\\nConnection: close\\r\\n\\r\\n')\n\
         print(s.recv(100).decode().split()[0])",
        kube.ca().display()
    );
    let answered = || {
        client
            .command("python3")
            .args(["-c", &script])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "HTTP/1.1")
    };
    wait_until(
        "the API server through kubernetes.default",
        Duration::from_secs(20),
        answered,
    );
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

#[test]
fn where_endpoint_slices_are_not_served_members_come_from_endpoints() {
    let (cluster, kube) = setup_with("ke", &["--runtime-config=discovery.k8s.io/v1beta1=false"]);
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "4"]);
    namespace(&kube, "old");
    let served = served_pods(
        &cluster,
        &kube,
        "old",
        &[("p0", 0, "web"), ("p1", 1, "web"), ("client", 1, "client")],
    );
    let client = &served.pods[2].3;
    let svc = service(
        &kube,
        "old",
        "web",
        json!({"spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
        false,
    );
    let vip = svc.spec.unwrap().cluster_ip.unwrap();
    let web = std::collections::BTreeSet::from(["p0", "p1"]);
    wait_until("both members to answer", Duration::from_secs(20), || {
        answers_of(&client.connect(&vip, 80, 20, false)) == web
    });
    set_ready(&kube, "old", "p1", false);
    wait_until("p1 left out", Duration::from_secs(20), || {
        answers_of(&client.connect(&vip, 80, 10, false)) == std::collections::BTreeSet::from(["p0"])
    });
}

#[test]
fn services_spread_over_ready_pods_and_follow_them() {
    let (cluster, kube) = setup("kp");
    let _watcher = start_watcher(&cluster, &kube, &[]);
    namespace(&kube, "shop");
    let served = served_pods(
        &cluster,
        &kube,
        "shop",
        &[
            ("p0", 0, "web"),
            ("p1", 1, "web"),
            ("p2", 0, "web"),
            ("client", 0, "client"),
        ],
    );
    let client = &served.pods[3].3;
    let svc = service(
        &kube,
        "shop",
        "web",
        json!({"spec": {"selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http"},
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}}),
        false,
    );
    let vip = svc.spec.unwrap().cluster_ip.unwrap();
    let web = std::collections::BTreeSet::from(["p0", "p1", "p2"]);
    wait_until(
        "every member to answer on the VIP",
        Duration::from_secs(20),
        || answers_of(&client.connect(&vip, 80, 20, false)) == web,
    );
    // 60 connections from a client pod reach all three, across both nodes; UDP too.
    let answers = client.connect(&vip, 80, 60, false);
    assert_eq!(answers_of(&answers), web, "{answers:?}");
    let answers = client.connect(&vip, 53, 30, true);
    assert_eq!(answers_of(&answers), web, "{answers:?}");
    // A pod through the VIP to itself and the others.
    let answers = served.pods[0].3.connect(&vip, 80, 30, false);
    assert_eq!(answers_of(&answers), web, "hairpin: {answers:?}");

    // ClientIP affinity: one member.
    service(
        &kube,
        "shop",
        "web",
        json!({"spec": {"sessionAffinity": "ClientIP"}}),
        true,
    );
    wait_until("affinity", Duration::from_secs(20), || {
        answers_of(&client.connect(&vip, 80, 10, false)).len() == 1
    });
    service(
        &kube,
        "shop",
        "web",
        json!({"spec": {"sessionAffinity": "None"}}),
        true,
    );

    // A deleted pod stops receiving connections at once.
    delete_pod(&kube, "shop", "p1");
    let deleted = std::time::Instant::now();
    wait_until("p1 to be left out", Duration::from_secs(20), || {
        !client
            .connect(&vip, 80, 10, false)
            .contains(&"p1".to_string())
    });
    let left_out = deleted.elapsed();
    let answers = client.connect(&vip, 80, 30, false);
    assert_eq!(
        answers_of(&answers),
        std::collections::BTreeSet::from(["p0", "p2"]),
        "{answers:?}"
    );
    eprintln!("a deleted member left out after {left_out:?}");

    // No ready pod: refused at once, not a timeout.
    set_ready(&kube, "shop", "p0", false);
    set_ready(&kube, "shop", "p2", false);
    wait_until("refusal", Duration::from_secs(20), || {
        client.connect(&vip, 80, 1, false) == ["refused"]
    });
    let start = std::time::Instant::now();
    assert_eq!(client.connect(&vip, 80, 5, false), ["refused"; 5]);
    assert!(start.elapsed() < Duration::from_secs(2));
    wait_until("the event", Duration::from_secs(10), || {
        events(&kube, "shop").contains(&("NoReadyPods".into(), "web".into()))
    });
    assert_eq!(
        serving_condition(&kube, "shop", "web"),
        Some(("False".into(), "NoReadyPods".into()))
    );
    // publishNotReadyAddresses: the endpoint controllers publish pods that are not ready,
    // and so they serve.
    let publish = |on: bool| {
        service(
            &kube,
            "shop",
            "web",
            json!({"spec": {"publishNotReadyAddresses": on}}),
            true,
        )
    };
    publish(true);
    let not_ready = std::collections::BTreeSet::from(["p0", "p2"]);
    wait_until(
        "the pods that are not ready to serve",
        Duration::from_secs(20),
        || answers_of(&client.connect(&vip, 80, 20, false)) == not_ready,
    );
    publish(false);
    wait_until("refusal again", Duration::from_secs(20), || {
        client.connect(&vip, 80, 1, false) == ["refused"]
    });
    set_ready(&kube, "shop", "p0", true);
    wait_until("the service served again", Duration::from_secs(10), || {
        serving_condition(&kube, "shop", "web") == Some(("True".into(), "Serving".into()))
    });
    assert_eq!(client.connect(&vip, 80, 5, false), ["p0"; 5]);

    // A selector that matches nothing is said so; a cluster IP the controller already
    // gave away gets no load balancer, and says so.
    service(
        &kube,
        "shop",
        "nobody",
        json!({"spec": {"selector": {"app": "nobody"}, "ports": [{"port": 80}]}}),
        false,
    );
    // An address the API server has not handed out at random to an earlier service.
    let taken: Vec<String> = kube.admin(|c| async move {
        Api::<k8s_openapi::api::core::v1::Service>::all(c)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|s| s.spec?.cluster_ip)
            .collect()
    });
    let clash_ip = (200..255)
        .map(|i| format!("10.0.0.{i}"))
        .find(|ip| !taken.contains(ip))
        .unwrap();
    cluster
        .api(|c| {
            c.request(
                "POST",
                "/v2/lbaas/loadbalancers",
                Some(&json!({"loadbalancer": {"name": "squatter",
                "vip_subnet_id": corvid_k8s::ids::service_network().1, "vip_address": clash_ip}})),
            )
        })
        .unwrap();
    service(
        &kube,
        "shop",
        "clash",
        json!({"spec": {"clusterIP": clash_ip, "selector": {"app": "web"}, "ports": [{"port": 80}]}}),
        false,
    );
    wait_until("the events", Duration::from_secs(10), || {
        let e = events(&kube, "shop");
        e.contains(&("NoReadyPods".into(), "nobody".into()))
            && e.contains(&("ClusterIPUnavailable".into(), "clash".into()))
    });
    let lbs: Vec<corvid_api::LoadBalancer> = cluster.api(|c| c.list(&[])).unwrap().0;
    assert_eq!(
        lbs.iter()
            .filter(|l| l.vip_address.map(|a| a.to_string()) == Some(clash_ip.clone()))
            .count(),
        1,
        "only the squatter holds {clash_ip}"
    );
}

fn service_status_ip(kube: &KubeApi, ns: &str, name: &str) -> Option<String> {
    use k8s_openapi::api::core::v1::Service;
    let (ns, name) = (ns.to_string(), name.to_string());
    kube.admin(|c| async move {
        let s = Api::<Service>::namespaced(c, &ns).get(&name).await.unwrap();
        s.status?.load_balancer?.ingress?.first()?.ip.clone()
    })
}

/// The status and reason of the service's `corvid.io/Serving` condition.
fn serving_condition(kube: &KubeApi, ns: &str, name: &str) -> Option<(String, String)> {
    use k8s_openapi::api::core::v1::Service;
    let (ns, name) = (ns.to_string(), name.to_string());
    kube.admin(|c| async move {
        let s = Api::<Service>::namespaced(c, &ns).get(&name).await.unwrap();
        let c = s
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "corvid.io/Serving")?;
        Some((c.status, c.reason))
    })
}

fn events(kube: &KubeApi, ns: &str) -> Vec<(String, String)> {
    use k8s_openapi::api::core::v1::Event;
    let ns = ns.to_string();
    kube.admin(|c| async move {
        Api::<Event>::namespaced(c, &ns)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|e| {
                (
                    e.reason.unwrap_or_default(),
                    e.involved_object.name.unwrap_or_default(),
                )
            })
            .collect()
    })
}

#[test]
fn load_balancer_services_get_floating_ips_node_ports_and_leave_nothing() {
    let (mut cluster, kube) = setup("kl");
    cluster.public_network(102);
    // Node 1 is on the public side (its underlay interface, here).
    cluster.agents[0].take();
    cluster.start_agent_with(0, &["--public-interface", "eth0"]);
    let mut watcher = start_watcher(&cluster, &kube, &["--public-network", "public"]);
    namespace(&kube, "shop");
    let served = served_pods(
        &cluster,
        &kube,
        "shop",
        &[("p0", 0, "web"), ("p1", 1, "web")],
    );
    let web = std::collections::BTreeSet::from(["p0", "p1"]);
    let svc = service(
        &kube,
        "shop",
        "web",
        json!({"spec": {"type": "LoadBalancer", "loadBalancerIP": "10.99.0.101",
            "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
        false,
    );
    let spec = svc.spec.unwrap();
    let node_port = spec.ports.unwrap()[0].node_port.unwrap() as u16;
    wait_until(
        "the ingress IP in the status",
        Duration::from_secs(20),
        || service_status_ip(&kube, "shop", "web").as_deref() == Some("10.99.0.101"),
    );
    // From the public side, outside the overlay: the floating IP, and the node port on
    // each node's address.
    wait_until("the floating IP to answer", Duration::from_secs(20), || {
        answers_of(&cluster.lan.connect("10.99.0.101", 80, 20, false)) == web
    });
    for node in ["10.99.0.1", "10.99.0.2"] {
        let answers = cluster.lan.connect(node, node_port, 20, false);
        assert_eq!(
            answers_of(&answers),
            web,
            "node port on {node}: {answers:?}"
        );
    }

    // An agent restarted keeps an open connection working and repairs a deleted rule.
    let vip = spec.cluster_ip.unwrap();
    let client = &served.pods[0].3;
    let mut held = client
        .command("python3")
        .arg(support::cluster::ns::testing_script("hold.py"))
        .args([vip.as_str(), "80"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut held_out = std::io::BufReader::new(held.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::{BufRead, Write};
    held_out.read_line(&mut line).unwrap();
    assert!(web.contains(line.trim()), "{line}");
    cluster.agents[0].take();
    let mut nft = cluster.hosts[0]
        .open()
        .run(corvid_net::nftables::Nftables::open)
        .unwrap()
        .unwrap();
    let mut batch = corvid_net::nftables::Batch::new();
    batch.flush_chain("services");
    nft.commit(batch).unwrap();
    let answers = client.connect(&vip, 80, 3, false);
    assert!(
        !answers.iter().any(|a| a.starts_with('p')),
        "the rule is gone: {answers:?}"
    );
    cluster.start_agent_with(0, &["--public-interface", "eth0"]);
    wait_until(
        "the agent to repair the rule",
        Duration::from_secs(20),
        || answers_of(&client.connect(&vip, 80, 10, false)) == web,
    );
    writeln!(held.stdin.as_mut().unwrap(), "again").unwrap();
    line.clear();
    held_out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "again", "the open connection survived");
    let _ = held.kill();
    let _ = held.wait();

    // Bad input: a loadBalancerIP that another service holds; an exhausted public
    // network. Both are reported as events, and neither leaves a floating IP.
    service(
        &kube,
        "shop",
        "taken",
        json!({"spec": {"type": "LoadBalancer", "loadBalancerIP": "10.99.0.101",
            "selector": {"app": "web"}, "ports": [{"port": 81, "targetPort": 8080}]}}),
        false,
    );
    for name in ["more1", "more2", "more3"] {
        service(
            &kube,
            "shop",
            name,
            json!({"spec": {"type": "LoadBalancer", "selector": {"app": "web"},
                "ports": [{"port": 82, "targetPort": 8080}]}}),
            false,
        );
    }
    wait_until("the events", Duration::from_secs(20), || {
        let e = events(&kube, "shop");
        e.contains(&("LoadBalancerIPTaken".into(), "taken".into()))
            && e.iter().any(|(r, _)| r == "NoPublicAddress")
    });
    assert_eq!(service_status_ip(&kube, "shop", "taken"), None);
    assert_eq!(
        serving_condition(&kube, "shop", "taken"),
        Some(("False".into(), "LoadBalancerIPTaken".into()))
    );
    let fips: Vec<corvid_api::FloatingIp> = cluster.api(|c| c.list(&[])).unwrap().0;
    assert_eq!(
        fips.len(),
        3,
        "two free addresses taken by two of more1..3, and web's"
    );

    // The watcher down while services are deleted: its restart sweeps them.
    watcher.kill9();
    for name in ["web", "taken", "more1", "more2", "more3"] {
        let name = name.to_string();
        kube.admin(|c| async move {
            Api::<k8s_openapi::api::core::v1::Service>::namespaced(c, "shop")
                .delete(&name, &DeleteParams::default())
                .await
                .unwrap();
        });
    }
    let _watcher = start_watcher(&cluster, &kube, &["--public-network", "public"]);
    // The API server's own `kubernetes` service keeps its load balancer; no other is left.
    let names = || {
        let lbs: Vec<corvid_api::LoadBalancer> = cluster.api(|c| c.list(&[])).unwrap().0;
        lbs.into_iter().map(|l| l.name).collect::<Vec<_>>()
    };
    let started = std::time::Instant::now();
    while names() != ["default/kubernetes"] {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the sweep left {:?}",
            names()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let fips: Vec<corvid_api::FloatingIp> = cluster.api(|c| c.list(&[])).unwrap().0;
    assert_eq!(fips, []);
    let vip_ports = cluster
        .ports()
        .into_iter()
        .filter(|p| p.device_owner == "Octavia")
        .count();
    assert_eq!(vip_ports, 1);
    for (i, host) in cluster.hosts.iter().enumerate() {
        wait_until(
            "the hosts' service chains to go",
            Duration::from_secs(10),
            || {
                let chains = host
                    .open()
                    .run(|| corvid_net::nftables::Nftables::open()?.chains())
                    .unwrap()
                    .unwrap();
                chains.iter().filter(|c| c.starts_with("svc-")).count() == 1
            },
        );
        let addrs = host.netlink().addresses(None).unwrap();
        assert!(
            !addrs
                .iter()
                .any(|(_, a)| a.addr().to_string().starts_with("10.99.0.10")),
            "host {i}: {addrs:?}"
        );
    }
}

/// A command run in the network namespace at `path` (a sandbox containerd made).
fn in_netns(path: &str, program: &str) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net={path}")).arg(program);
    c
}

#[test]
fn a_service_of_pods_run_through_containerds_cri_reaches_them_on_both_nodes() {
    use support::cluster::ns::{serve_name_with, testing_script};
    use support::cri::Containerd;
    let (cluster, kube) = setup("kr");
    let _watcher = start_watcher(&cluster, &kube, &[]);
    namespace(&kube, "web");
    let nodes: Vec<Containerd> = (0..2)
        .map(|h| {
            let conflist = json!({
                "cniVersion": "1.0.0", "name": "corvid",
                "plugins": [plugin_conf(&kube, h, NODE_TOKEN, 30)],
            });
            Containerd::start(&cluster.hosts[h], cluster.bin.path(), &conflist)
        })
        .collect();
    let mut netns = Vec::new();
    let mut sandboxes = Vec::new();
    let mut servers = Vec::new();
    for (name, h, app) in [("p0", 0, "web"), ("p1", 1, "web"), ("client", 0, "client")] {
        let (n, nsn) = (name.to_string(), "web".to_string());
        let node_name = format!("h{}", h + 1);
        let uid = kube.admin(|c| async move {
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": n, "labels": {"app": app}},
                "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "cvt-pause"}]},
            }))
            .unwrap();
            Api::<Pod>::namespaced(c, &nsn)
                .create(&PostParams::default(), &p)
                .await
                .unwrap()
                .metadata
                .uid
                .unwrap()
        });
        let (id, status) = nodes[h]
            .sync_pod("web", name, &uid, 3)
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}"));
        sandboxes.push((h, id));
        let path = support::cri::sandbox_netns(&status);
        if app == "web" {
            servers.push(serve_name_with(in_netns(&path, "python3"), name, 8080));
            set_ready(&kube, "web", name, true);
        }
        netns.push(path);
    }
    let svc = service(
        &kube,
        "web",
        "web",
        json!({"spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}),
        false,
    );
    let vip = svc.spec.unwrap().cluster_ip.unwrap();
    let connect = |n: usize| -> Vec<String> {
        let out = in_netns(&netns[2], "python3")
            .arg(testing_script("connect.py"))
            .args([vip.as_str(), "80", &n.to_string()])
            .output()
            .unwrap();
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let both = std::collections::BTreeSet::from(["p0", "p1"]);
    wait_until(
        "both sandboxes to answer on the VIP",
        Duration::from_secs(20),
        || answers_of(&connect(20)) == both,
    );
    drop(servers);
    // As the kubelet ends pods: nothing of containerd's is left.
    for (h, id) in sandboxes {
        nodes[h].remove_sandbox(id);
    }
}

/// What differs between the Kubernetes objects and the controller: a live namespace
/// without its one network, a gone one with any, a live pod without an annotation naming
/// a port of its own, or a pod's port no pod names. None when they agree.
fn watcher_gap(
    cluster: &Cluster,
    kube: &KubeApi,
    live: &std::collections::BTreeMap<String, Vec<String>>,
    gone: &[String],
) -> Option<String> {
    let mut gap = String::new();
    let mut named = std::collections::BTreeSet::new();
    for (ns, pods) in live {
        let n = networks_of_namespace(cluster, ns).len();
        if n != 1 {
            gap += &format!("namespace {ns} has {n} networks; ");
        }
        for p in pods {
            match annotation(kube, ns, p) {
                None => gap += &format!("pod {ns}/{p} has no annotation; "),
                Some(a) => match port(cluster, &a.port_id) {
                    Some(port) if port.device_id == a.pod_uid => {
                        named.insert(a.port_id);
                    }
                    _ => gap += &format!("pod {ns}/{p}'s port {} is not its own; ", a.port_id),
                },
            }
        }
    }
    for ns in gone {
        if !networks_of_namespace(cluster, ns).is_empty() {
            gap += &format!("gone namespace {ns} keeps its network; ");
        }
    }
    for p in ports(cluster) {
        if p.device_owner == corvid_k8s::ids::POD_OWNER && !named.contains(&p.id) {
            gap += &format!("port {} ({}) belongs to no pod; ", p.id, p.device_id);
        }
    }
    (!gap.is_empty()).then_some(gap)
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
