//! Kubernetes end to end on a real kube-apiserver 1.20, `corvid kube-watch` and
//! containerd's CRI on a simulated node:
//! 1. pod created (with `spec.nodeName`) → `corvid.io/port` annotation seen on a watch, for
//!    N pods one at a time and N twenty at a time; beside each, the floor: a pod create
//!    and a bare merge patch of an annotation, timed the same way;
//! 2. CRI RunPodSandbox of an annotated pod with `corvid-k8s` (beside a resident pod of the
//!    same namespace, as on a busy node), taking turns with the same
//!    containerd build and configuration running the reference bridge + host-local;
//! 3. pod created → RunPodSandbox returned (the kubelet's view: the plugin waits for the
//!    watcher).
//!
//! Prints p50 and p99 of each and the ratios. With `CORVID_BENCH_BASELINE` naming another
//! build's `corvid` binary, its watcher and this build's then take turns on the same API
//! server, each turn beside its floor. Needs root and what scripts/test.sh installs.
//!
//! `cargo build --release --workspace && cargo bench -p corvid --bench kubernetes` (CORVID_BENCH_PODS
//! sets N, default 100).

#[path = "../tests/support/cluster.rs"]
mod cluster;
#[path = "../tests/support/cri.rs"]
mod cri;
#[path = "../tests/support/kube.rs"]
mod kube_api;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use cluster::Cluster;
use cri::Containerd;
use futures::StreamExt;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    PodSandboxConfig, RemovePodSandboxRequest, RunPodSandboxRequest, StopPodSandboxRequest,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube_api::{plugin_conf, start_watcher, KubeApi};
use serde_json::json;
use tokio::sync::mpsc;
use tonic::transport::Channel;

const NS: &str = "bench";

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn row(label: &str, mut d: Vec<Duration>) -> f64 {
    d.sort();
    let (p50, p99) = (pct(&d, 0.5), pct(&d, 0.99));
    println!("{label:<52} {:>4} {p50:>9.2} {p99:>9.2}", d.len());
    p50
}

fn pod_object(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "cvt-pause"}]},
    }))
    .unwrap()
}

/// Names of the pods seen with `key` annotated, and when, from one watch of the namespace.
fn watch_annotations(
    api: Api<Pod>,
    key: &'static str,
) -> mpsc::UnboundedReceiver<(String, Instant)> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut version = "0".to_string();
        loop {
            let params = WatchParams::default().timeout(290);
            let Ok(stream) = api.watch(&params, &version).await else {
                continue;
            };
            let mut stream = stream.boxed();
            while let Some(Ok(e)) = stream.next().await {
                if let WatchEvent::Added(p) | WatchEvent::Modified(p) = e {
                    version = p.metadata.resource_version.clone().unwrap_or(version);
                    let going = p.metadata.deletion_timestamp.is_some();
                    let annotated = p
                        .metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(key));
                    if annotated && !going {
                        let _ = tx.send((p.metadata.name.unwrap_or_default(), Instant::now()));
                    }
                }
            }
        }
    });
    rx
}

/// Creates `names` (all at once) and returns each one's time from its create to its
/// annotation.
async fn created_to_annotated(
    api: &Api<Pod>,
    seen: &mut mpsc::UnboundedReceiver<(String, Instant)>,
    names: &[String],
) -> Vec<Duration> {
    let mut started = HashMap::new();
    let creates = names.iter().map(|n| {
        let api = api.clone();
        let n = n.clone();
        async move {
            let t = Instant::now();
            api.create(&PostParams::default(), &pod_object(&n, "h1"))
                .await
                .unwrap();
            (n, t)
        }
    });
    for (n, t) in futures::future::join_all(creates).await {
        started.insert(n, t);
    }
    let mut out = Vec::new();
    while out.len() < names.len() {
        let (n, at) = seen.recv().await.unwrap();
        if let Some(t) = started.remove(&n) {
            out.push(at - t);
        }
    }
    out
}

/// RunPodSandbox; the sandbox's ID.
async fn run_sandbox(c: &mut RuntimeServiceClient<Channel>, config: PodSandboxConfig) -> String {
    c.run_pod_sandbox(RunPodSandboxRequest {
        config: Some(config),
        runtime_handler: String::new(),
    })
    .await
    .unwrap()
    .into_inner()
    .pod_sandbox_id
}

/// StopPodSandbox then RemovePodSandbox, as the kubelet ends a pod.
async fn remove_sandbox(c: &mut RuntimeServiceClient<Channel>, id: String) {
    c.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await
    .unwrap();
    c.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id })
        .await
        .unwrap();
}

/// The annotation the floor writes.
const BARE: &str = "cvt/bare";

/// The floor of an annotation: `names` created unscheduled (no watcher touches them) and
/// given an annotation by a bare merge patch, all at once; each one's time from its
/// create to the patch seen on the watch. The pods are deleted after.
async fn bare_patches(
    api: &Api<Pod>,
    bare: &mut mpsc::UnboundedReceiver<(String, Instant)>,
    names: &[String],
) -> Vec<Duration> {
    let work = names.iter().map(|name| {
        let api = api.clone();
        let name = name.clone();
        async move {
            let t = Instant::now();
            let mut p = pod_object(&name, "");
            p.spec.as_mut().unwrap().node_name = None;
            api.create(&PostParams::default(), &p).await.unwrap();
            let patch = json!({"metadata": {"annotations": {BARE: "x"}}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap();
            (name, t)
        }
    });
    let mut started: HashMap<String, Instant> =
        futures::future::join_all(work).await.into_iter().collect();
    let mut got = Vec::new();
    while got.len() < names.len() {
        let (seen, at) = bare.recv().await.unwrap();
        if let Some(t) = started.remove(&seen) {
            got.push(at - t);
        }
    }
    delete_all(api, names).await;
    got
}

async fn delete_all(api: &Api<Pod>, names: &[String]) {
    for n in names {
        let _ = api
            .delete(n, &DeleteParams::default().grace_period(0))
            .await;
    }
}

fn main() {
    let n: usize = std::env::var("CORVID_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let cluster = Cluster::new("kb");
    let kube = KubeApi::start(&cluster.lan.path, "10.99.0.254");
    kube.apply_manifest(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/rbac.yaml"),
    );
    let mut watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "1"]);
    let corvid = Containerd::start(
        &cluster.hosts[0],
        cluster.bin.path(),
        &json!({"cniVersion": "1.0.0", "name": "corvid",
                "plugins": [plugin_conf(0, 60)]}),
    );
    let leases = tempfile::Builder::new()
        .prefix("cvt-leases")
        .tempdir()
        .unwrap();
    let reference = Containerd::start(
        &cluster.hosts[0],
        Path::new("/usr/lib/cni"),
        &json!({"cniVersion": "1.0.0", "name": "reference", "plugins": [{
            "type": "bridge", "bridge": "cvtref0", "isGateway": true,
            "ipam": {"type": "host-local", "dataDir": leases.path(),
                     "ranges": [[{"subnet": "10.250.0.0/16"}]]},
        }]}),
    );
    println!("{:<52} {:>4} {:>9} {:>9}", "what (ms)", "n", "p50", "p99");
    let (one, twenty, floor, floor20, run_corvid, run_reference, ready) =
        kube.admin(|c| async move {
            let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
            Api::<Namespace>::all(c.clone())
                .create(&PostParams::default(), &ns)
                .await
                .unwrap();
            let api = Api::<Pod>::namespaced(c.clone(), NS);
            let mut seen = watch_annotations(api.clone(), corvid_k8s::annotation::KEY);
            // Warm up: the namespace's network is made with the first pod.
            let warm = vec!["warm".to_string()];
            created_to_annotated(&api, &mut seen, &warm).await;
            delete_all(&api, &warm).await;
            let mut one = Vec::new();
            for i in 0..n {
                let names = vec![format!("one-{i}")];
                one.extend(created_to_annotated(&api, &mut seen, &names).await);
                delete_all(&api, &names).await;
            }
            let mut twenty = Vec::new();
            for b in 0..n.div_ceil(20) {
                let names: Vec<String> = (0..20.min(n - b * 20))
                    .map(|i| format!("batch-{b}-{i}"))
                    .collect();
                twenty.extend(created_to_annotated(&api, &mut seen, &names).await);
                delete_all(&api, &names).await;
            }
            // The floor: the API server's own round trips for a create and a merge patch of
            // one annotation, seen on the same watch; one at a time and twenty at a time.
            let mut bare = watch_annotations(api.clone(), BARE);
            let mut floor = Vec::new();
            let mut floor20 = Vec::new();
            for (batch, size) in (0..n.min(50))
                .map(|b| (b, 1))
                .chain((0..n.div_ceil(20)).map(|b| (100 + b, 20)))
            {
                let names: Vec<String> = (0..size).map(|i| format!("bare-{batch}-{i}")).collect();
                let got = bare_patches(&api, &mut bare, &names).await;
                if size == 1 {
                    floor.extend(got)
                } else {
                    floor20.extend(got)
                }
            }
            // A pod that stays, as a namespace's pods do on a node: the node's overlay for the
            // namespace's network is up, so each new pod is plugged without waiting for it.
            let mut k8s = corvid.client().await;
            let resident = "resident".to_string();
            created_to_annotated(&api, &mut seen, std::slice::from_ref(&resident)).await;
            let uid = api.get(&resident).await.unwrap().metadata.uid.unwrap();
            run_sandbox(&mut k8s, corvid.sandbox_config(NS, &resident, &uid)).await;
            let mut refc = reference.client().await;
            let (mut run_corvid, mut run_reference, mut ready) =
                (Vec::new(), Vec::new(), Vec::new());
            for i in 0..n {
                // Reference: RunPodSandbox alone.
                let uid = format!("ref-{i}");
                let t = Instant::now();
                let id = run_sandbox(&mut refc, reference.sandbox_config(NS, &uid, &uid)).await;
                run_reference.push(t.elapsed());
                remove_sandbox(&mut refc, id).await;
                // corvid: an annotated pod, then RunPodSandbox alone.
                let name = format!("run-{i}");
                created_to_annotated(&api, &mut seen, std::slice::from_ref(&name)).await;
                let uid = api.get(&name).await.unwrap().metadata.uid.unwrap();
                let t = Instant::now();
                let id = run_sandbox(&mut k8s, corvid.sandbox_config(NS, &name, &uid)).await;
                run_corvid.push(t.elapsed());
                remove_sandbox(&mut k8s, id).await;
                delete_all(&api, &[name]).await;
                // corvid: the kubelet's view, from the pod's creation to its sandbox.
                let name = format!("ready-{i}");
                let t = Instant::now();
                let uid = api
                    .create(&PostParams::default(), &pod_object(&name, "h1"))
                    .await
                    .unwrap()
                    .metadata
                    .uid
                    .unwrap();
                let id = run_sandbox(&mut k8s, corvid.sandbox_config(NS, &name, &uid)).await;
                ready.push(t.elapsed());
                remove_sandbox(&mut k8s, id).await;
                delete_all(&api, &[name]).await;
            }
            (
                one,
                twenty,
                floor,
                floor20,
                run_corvid,
                run_reference,
                ready,
            )
        });
    let a1 = row("pod created -> annotated, one at a time", one);
    let f = row("floor: create + merge patch of an annotation", floor);
    let a20 = row("pod created -> annotated, twenty at a time", twenty);
    let f20 = row("floor: the same, twenty at a time", floor20);
    let rc = row("CRI RunPodSandbox, corvid-k8s", run_corvid);
    let rr = row(
        "CRI RunPodSandbox, reference bridge + host-local",
        run_reference,
    );
    row("pod created -> sandbox ready (corvid-k8s)", ready);
    println!();
    println!(
        "annotation p50 / floor p50: one at a time {:.2}, twenty at a time {:.2} (target: annotation p50 <= 20 ms)",
        a1 / f,
        a20 / f20
    );
    println!(
        "RunPodSandbox p50 corvid-k8s / reference: {:.3} (target <= 1.2)",
        rc / rr
    );
    if let Some(baseline) = std::env::var_os("CORVID_BENCH_BASELINE") {
        against_baseline(&cluster, &kube, &mut watcher, Path::new(&baseline));
    }
}

/// Rounds in which this build's watcher and the baseline's take turns.
const ROUNDS: usize = 5;
/// Pods per turn, one at a time, and as many floor samples.
const PER_TURN: usize = 20;

/// This build's watcher against another build's (`baseline`, a `corvid` binary), taking
/// turns on one API server and controller: pod created -> annotated, one at a time, and
/// the floor beside each turn.
fn against_baseline(
    cluster: &Cluster,
    kube: &KubeApi,
    watcher: &mut cluster::ns::Proc,
    baseline: &Path,
) {
    let this = Path::new(env!("CARGO_BIN_EXE_corvid"));
    let (annotated, floors) = kube.admin(|c| async move {
        let api = Api::<Pod>::namespaced(c, NS);
        let mut seen = watch_annotations(api.clone(), corvid_k8s::annotation::KEY);
        let mut bare = watch_annotations(api.clone(), BARE);
        let mut annotated = [Vec::new(), Vec::new()];
        let mut floors = [Vec::new(), Vec::new()];
        for round in 0..ROUNDS {
            for (k, binary) in [this, baseline].into_iter().enumerate() {
                watcher.kill9();
                *watcher =
                    kube_api::start_watcher_of(binary, cluster, kube, &["--lease-seconds", "1"]);
                // The new holder has the lease, listed everything and serves pods.
                let warm = vec![format!("warm-{round}-{k}")];
                created_to_annotated(&api, &mut seen, &warm).await;
                delete_all(&api, &warm).await;
                for i in 0..PER_TURN {
                    let names = vec![format!("turn-{round}-{k}-{i}")];
                    annotated[k].extend(created_to_annotated(&api, &mut seen, &names).await);
                    delete_all(&api, &names).await;
                    let names = vec![format!("bare-turn-{round}-{k}-{i}")];
                    floors[k].extend(bare_patches(&api, &mut bare, &names).await);
                }
            }
        }
        (annotated, floors)
    });
    println!(
        "\nthis build against {}, taking turns ({ROUNDS} x {PER_TURN} pods each)",
        baseline.display()
    );
    let [a_this, a_base] = annotated;
    let [f_this, f_base] = floors;
    let a_this = row("pod created -> annotated, this build", a_this);
    let f_this = row("floor beside it", f_this);
    let a_base = row("pod created -> annotated, baseline", a_base);
    let f_base = row("floor beside it", f_base);
    println!(
        "annotation p50 / floor p50: this build {:.2}, baseline {:.2}; this / baseline p50 {:.2}",
        a_this / f_this,
        a_base / f_base,
        a_this / a_base
    );
}
