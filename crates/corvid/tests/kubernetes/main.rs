//! Kubernetes against a real kube-apiserver (v1.20) on a real etcd: `corvid kube-watch` as
//! the RBAC-bound user of deploy/kubernetes/rbac.yaml, two simulated nodes with agents, and
//! the `corvid-k8s` plugin run as the kubelet runs it (CNI_ARGS in varying order). One file
//! per subject; what they share is here.

#[path = "../support"]
mod support {
    pub mod cluster;
    pub mod cri;
    pub mod kube;
}

mod cluster_dns;
mod dual_stack;
mod network_policy;
mod pods;
mod routing;
mod services;
mod watcher;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use corvid_api::{Network, Port, Status, Subnet};
use corvid_k8s::annotation::{PortAnnotation, KEY};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{json, Value};
use support::cluster::ns::{spawn_with_input, wait_until};
use support::cluster::{cni_result, Cluster};
use support::kube::{plugin_conf, start_in_cluster_watcher, start_watcher, KubeApi};

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
    pod_meta(kube, ns, name, node, json!({"annotations": annotations}))
}

/// A pod with these labels.
fn pod_labelled(kube: &KubeApi, ns: &str, name: &str, node: &str, labels: Value) -> String {
    pod_meta(kube, ns, name, node, json!({"labels": labels}))
}

/// A pod scheduled to `node` with `meta` merged into its metadata; returns its UID.
fn pod_meta(kube: &KubeApi, ns: &str, name: &str, node: &str, mut meta: Value) -> String {
    meta["name"] = json!(name);
    let (ns, node) = (ns.to_string(), node.to_string());
    kube.admin(|c| async move {
        let p: Pod = serde_json::from_value(json!({
            "metadata": meta,
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

fn run_plugin(cluster: &Cluster, call: &K8sCall) -> Output {
    run_plugin_with(cluster, call, json!({}))
}

/// The plugin with `extra` merged into its configuration (prevResult, a timeout...).
fn run_plugin_with(cluster: &Cluster, call: &K8sCall, extra: Value) -> Output {
    let mut conf = plugin_conf(call.host, 30);
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

/// A DEL of pod `[namespace, name, uid]` that succeeds and leaves the pod without its
/// interface.
fn unplugged(cluster: &Cluster, host: usize, pod: [&str; 3], netns: &Path, what: &str) {
    let [ns, name, uid] = pod;
    let call = K8sCall {
        host,
        command: "DEL",
        ns,
        name,
        uid,
        netns: Some(netns),
    };
    let out = run_plugin(cluster, &call);
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
        cni_result(&run_plugin(cluster, &call));
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

/// Sets the pod's Ready condition and its IPs (its annotation's, the first as `podIP`),
/// as its kubelet would.
fn set_ready(kube: &KubeApi, ns: &str, name: &str, ready: bool) {
    let ips: Vec<String> = annotation(kube, ns, name)
        .map(|a| a.addresses.iter().map(|a| a.addr().to_string()).collect())
        .unwrap_or_default();
    let (ns, name) = (ns.to_string(), name.to_string());
    kube.admin(|c| async move {
        let patch = json!({"status": {"podIP": ips.first(), "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
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

/// A command run in the network namespace at `path` (a sandbox containerd made).
fn in_netns(path: &str, program: &str) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net={path}")).arg(program);
    c
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

/// Creates NetworkPolicy `name` in `ns` with `spec`.
fn network_policy(kube: &KubeApi, ns: &str, name: &str, spec: Value) {
    let (ns, name) = (ns.to_string(), name.to_string());
    kube.admin(|c| async move {
        let np: NetworkPolicy =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
        Api::<NetworkPolicy>::namespaced(c, &ns)
            .create(&PostParams::default(), &np)
            .await
            .unwrap();
    });
}

/// Deletes NetworkPolicy `name` of `ns`.
fn delete_network_policy(kube: &KubeApi, ns: &str, name: &str) {
    let (ns, name) = (ns.to_string(), name.to_string());
    kube.admin(|c| async move {
        Api::<NetworkPolicy>::namespaced(c, &ns)
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    });
}

/// Each node's containerd, its CRI running the `corvid-k8s` plugin, and portmap for
/// hostPorts, as the kubelet's runtime would with `deploy/kubernetes/node.yaml`'s list.
fn cri_nodes(cluster: &Cluster) -> Vec<support::cri::Containerd> {
    (0..2)
        .map(|h| {
            let conflist = json!({
                "cniVersion": "1.0.0", "name": "corvid",
                "plugins": [plugin_conf(h, 30),
                    {"type": "portmap", "capabilities": {"portMappings": true}}],
            });
            support::cri::Containerd::start(&cluster.hosts[h], cluster.bin.path(), &conflist)
        })
        .collect()
}

/// The names of the servers that answered `n` TCP connections to `to`:`port` from the
/// network namespace at `netns` (`timeout` for each one dropped).
fn connect_from(netns: &str, to: &str, port: u16, n: usize) -> Vec<String> {
    let out = in_netns(netns, "python3")
        .arg(support::cluster::ns::testing_script("connect.py"))
        .args([to, &port.to_string(), &n.to_string()])
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}
