//! Kubernetes against a real kube-apiserver (v1.20) on a real etcd: `corvid kube-watch` as
//! the RBAC-bound user of deploy/kubernetes/rbac.yaml, two simulated nodes with agents, and
//! the `corvid-k8s` plugin run as the kubelet runs it (CNI_ARGS in varying order).

mod support {
    pub mod cluster;
    pub mod kube;
}

use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use corvid_api::{Network, Port, Status, Subnet};
use corvid_k8s::annotation::{PortAnnotation, KEY};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{json, Value};
use support::cluster::ns::{wait_until, Proc};
use support::cluster::{cni_result, url, Cluster};
use support::kube::{KubeApi, NODE_TOKEN, WATCHER_TOKEN};

const API_ADDR: &str = "10.99.0.254";

fn rbac() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/kubernetes/rbac.yaml"
    ))
}

/// The cluster, the API server beside the controller, and the RBAC objects applied.
fn setup(name: &str) -> (Cluster, KubeApi) {
    let cluster = Cluster::new(name);
    let kube = KubeApi::start(&cluster.lan.path, API_ADDR);
    kube.apply_manifest(rbac());
    (cluster, kube)
}

/// `corvid kube-watch` in the lan namespace, as the watcher's RBAC-bound user.
fn start_watcher(cluster: &Cluster, kube: &KubeApi, extra: &[&str]) -> Proc {
    let child = cluster
        .lan
        .command(env!("CARGO_BIN_EXE_corvid"))
        .arg("kube-watch")
        .arg("--kubeconfig")
        .arg(kube.kubeconfig(WATCHER_TOKEN))
        .args(["--controller", &url(), "--lease-seconds", "4"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    Proc(child)
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
    let (ns, name, node) = (ns.to_string(), name.to_string(), node.to_string());
    kube.admin(|c| async move {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
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
    let mut pairs = vec![
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

fn plugin_conf(kube: &KubeApi, host: usize, token: &str, timeout: u64) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "corvid-k8s",
        "kubeconfig": kube.kubeconfig(token), "controller": url(),
        "hostId": format!("h{}", host + 1), "timeout": timeout,
    })
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
    let mut child = cmd.spawn().unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    child
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

#[test]
fn namespaces_get_networks_and_pods_get_ports_plugged_across_nodes() {
    let (cluster, kube) = setup("k8");
    let _watcher = start_watcher(&cluster, &kube, &[]);
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
            .or_else(|| None)
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
        let p = port(&cluster, &a.port_id).unwrap();
        assert_eq!(p.status, Status::Active, "the agent took the port");
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
    let del = run_plugin(
        &cluster,
        &kube,
        &K8sCall {
            host: *host,
            command: "DEL",
            ns,
            name,
            uid,
            netns: Some(&netns.path),
        },
    );
    assert!(del.status.success(), "DEL: {del:?}");
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
    // Deleting the pods deletes their ports.
    for (ns, name, ..) in &sandboxes {
        delete_pod(&kube, ns, name);
    }
    wait_until("the pods' ports to go", Duration::from_secs(30), || {
        !ports(&cluster)
            .iter()
            .any(|p| p.device_owner == corvid_k8s::ids::POD_OWNER)
    });
}
