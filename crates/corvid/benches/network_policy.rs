//! NetworkPolicy end to end on a real kube-apiserver 1.20 and `corvid kube-watch`, two
//! simulated nodes whose agents filter: a client pod on h1 gets the label a policy of a
//! server pod on h2 lets in (one merge patch of the pod), until its first UDP datagram
//! is answered, p50 of 15; h2's agent's work for that change; with 1,000 pods and 100
//! policies, then 10,000 pods and 1,000 policies (`CORVID_BENCH_PODS` caps it), every
//! pod a member of the group the server's policy names. Beside them the floors: the API
//! server's own round trip for the same patch, and the one-element member change bare
//! through corvid-net.
//!
//! Needs root and what scripts/test.sh installs. `cargo bench -p corvid --bench network_policy`.

#[path = "../tests/support/cluster.rs"]
mod cluster;
#[path = "../tests/support/kube.rs"]
mod kube_api;
#[path = "../tests/support/member_floor.rs"]
mod member_floor;

use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use cluster::ns::{median, spawn_with_input, wait_until, Ns};
use cluster::{agent_work, cni_result, epoch, prober, Cluster};
use corvid_api::Port;
use corvid_k8s::annotation::{PortAnnotation, KEY};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_api::{plugin_conf, start_watcher, KubeApi};
use member_floor::bare_member_change;
use serde_json::{json, Value};

const SAMPLES: usize = 15;
const METRICS: &str = "127.0.0.1:9697";

fn create_namespace(kube: &KubeApi, name: &str) {
    let name = name.to_string();
    kube.admin(|c| async move {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        Api::<Namespace>::all(c)
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    });
}

fn pod_body(name: &str, node: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "cvt-pause"}]},
    }))
    .unwrap()
}

/// A pod on node `host` plugged as its kubelet would: created, its annotation awaited, the
/// `corvid-k8s` plugin's ADD run in a namespace of its own. The namespace and address.
fn plugged(
    cluster: &Cluster,
    kube: &KubeApi,
    ns: &str,
    name: &str,
    host: usize,
    labels: Value,
) -> (Ns, String) {
    let node = format!("h{}", host + 1);
    let (n, nsn) = (name.to_string(), ns.to_string());
    let uid = kube.admin(|c| async move {
        let api = Api::<Pod>::namespaced(c, &nsn);
        let p = api
            .create(&PostParams::default(), &pod_body(&n, &node, labels))
            .await
            .unwrap();
        p.metadata.uid.unwrap()
    });
    let mut annotation = None;
    wait_until("the pod's annotation", Duration::from_secs(30), || {
        let (n, nsn) = (name.to_string(), ns.to_string());
        annotation = kube.admin(|c| async move {
            let p = Api::<Pod>::namespaced(c, &nsn).get(&n).await.unwrap();
            Some(PortAnnotation::parse(p.metadata.annotations?.get(KEY)?).unwrap())
        });
        annotation.is_some()
    });
    let netns = cluster.pod(&format!("{ns}{name}"));
    let sandbox = format!("sandbox-{uid}");
    let mut cmd = cluster.hosts[host].command(cluster.bin.path().join("corvid-k8s"));
    cmd.env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", &sandbox)
        .env("CNI_NETNS", &netns.path)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", cluster.bin.path())
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID={uid}"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = spawn_with_input(&mut cmd, &plugin_conf(host, 30).to_string())
        .wait_with_output()
        .unwrap();
    cni_result(&out);
    let ip = annotation.unwrap().addresses[0].addr().to_string();
    (netns, ip)
}

/// Merge-patches pod `ns/name`'s labels; the time the API server took.
fn label(kube: &KubeApi, ns: &str, name: &str, labels: Value) -> Duration {
    let (ns, name) = (ns.to_string(), name.to_string());
    kube.admin(|c| async move {
        let patch = json!({"metadata": {"labels": labels}});
        let start = Instant::now();
        Api::<Pod>::namespaced(c, &ns)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        start.elapsed()
    })
}

/// Grows namespace `bulk` to `pods` pods (on a node with no agent: members only) and
/// `policies` policies, each selecting its tenth of the pods and letting in another
/// tenth; every pod is a client the server's policy names.
fn grow(kube: &KubeApi, from: (usize, usize), to: (usize, usize)) {
    kube.admin(|c| async move {
        let policies = Api::<NetworkPolicy>::namespaced(c.clone(), "bulk");
        futures::stream::iter(from.1..to.1)
            .for_each_concurrent(16, |j| {
                let policies = policies.clone();
                async move {
                    let np: NetworkPolicy = serde_json::from_value(json!({
                        "metadata": {"name": format!("np-{j}")},
                        "spec": {"podSelector": {"matchLabels": {"app": format!("a-{j}")}},
                            "ingress": [{"from": [{"podSelector": {"matchLabels": {"r": format!("r-{j}")}}}],
                                "ports": [{"port": 80}]}]},
                    }))
                    .unwrap();
                    policies.create(&PostParams::default(), &np).await.unwrap();
                }
            })
            .await;
        let pods = Api::<Pod>::namespaced(c, "bulk");
        futures::stream::iter(from.0..to.0)
            .for_each_concurrent(32, |i| {
                let pods = pods.clone();
                let j = i % to.1;
                async move {
                    let labels = json!({"role": "client", "app": format!("a-{j}"), "r": format!("r-{}", (j + 1) % to.1)});
                    let p = pod_body(&format!("m-{i}"), "h9", labels);
                    pods.create(&PostParams::default(), &p).await.unwrap();
                }
            })
            .await;
    });
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let max: usize = std::env::var("CORVID_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut cluster = Cluster::new("bn");
    cluster.filtering_agents(Some(METRICS));
    let kube = KubeApi::start(&cluster.lan.path, "10.99.0.254");
    kube.apply_manifest(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/rbac.yaml"),
    );
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "1"]);
    for ns in ["cli", "srv", "bulk"] {
        create_namespace(&kube, ns);
    }
    let (a, _) = plugged(&cluster, &kube, "cli", "a", 0, json!({}));
    let (b, ip_b) = plugged(&cluster, &kube, "srv", "b", 1, json!({"app": "srv"}));
    let _server = b.serve_name("s", 5353);
    kube.admin(|c| async move {
        let np: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": "srv"},
            "spec": {"podSelector": {"matchLabels": {"app": "srv"}},
                "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "client"}}}],
                    "ports": [{"port": 5353, "protocol": "UDP"}]}]},
        }))
        .unwrap();
        Api::<NetworkPolicy>::namespaced(c, "srv")
            .create(&PostParams::default(), &np)
            .await
            .unwrap();
    });
    wait_until(
        "the server's policy to keep a out",
        Duration::from_secs(30),
        || a.connect(&ip_b, 5353, 1, true) == ["timeout"],
    );

    println!("a pod's label lets it in through a policy on another node (p50 of {SAMPLES})");
    println!(
        "{:>7} {:>9} {:>21} {:>20} {:>25} {:>20}",
        "pods",
        "policies",
        "label -> answered ms",
        "label patch ms",
        "h2 agent work/change ms",
        "bare element ms"
    );
    let mut have = (0, 0);
    for pods in [1_000, 10_000].into_iter().filter(|p| *p <= max) {
        let want = (pods, pods / 10);
        grow(&kube, have, want);
        have = want;
        wait_until("every pod's port", Duration::from_secs(900), || {
            let (ports, _) = cluster
                .api(|c| c.list::<Port>(&[("device_owner", corvid_k8s::ids::POD_OWNER)]))
                .unwrap();
            ports.len() >= pods + 2
        });
        // The members reach h2's filter through the watch: let them settle.
        std::thread::sleep(Duration::from_secs(5));
        let (mut latency, mut patch, mut work) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..SAMPLES {
            let before = agent_work(METRICS, &cluster.hosts[1]);
            let (_probe, mut out) = prober(&a, &ip_b);
            let asked = epoch();
            patch.push(label(&kube, "cli", "a", json!({"role": "client"})).as_secs_f64() * 1e3);
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            latency.push((line.trim().parse::<f64>().unwrap() - asked) * 1e3);
            let after = agent_work(METRICS, &cluster.hosts[1]);
            let passes = after.1 - before.1;
            if passes > 0.0 {
                work.push((after.0 - before.0) / passes * 1e3);
            }
            label(&kube, "cli", "a", json!({"role": null}));
            wait_until("a to be kept out again", Duration::from_secs(10), || {
                a.connect(&ip_b, 5353, 1, true) == ["timeout"]
            });
        }
        let bare = bare_member_change(&cluster.tag, pods, SAMPLES);
        println!(
            "{pods:>7} {:>9} {:>21.1} {:>20.1} {:>25.2} {:>20.2}",
            want.1,
            median(latency),
            median(patch),
            median(work),
            bare
        );
    }
    println!("targets: label -> enforced on a remote host p50 <= 50 ms; agent work per change <= 1 ms, flat");
}
