//! NetworkPolicies enforced by the nodes' security groups (agents run with
//! `--security-groups`): the well-known recipes, each checked by connections from pods on
//! both nodes that must be answered and connections that must be dropped. Deny all
//! ingress, and the union with what other policies let in: a labelled namespace, labelled
//! pods of the policy's namespace (through a service's cluster IP too), both together; an
//! address block with an exception; a named port; egress to DNS only (through its
//! service). A pod's own node always reaches it, the other node only as policies let it.
//! A restarted watcher enforces what it left, and what came and went while it was down.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

use super::*;
use kube::api::{Patch, PatchParams};
use support::cluster::ns::{Ns, Proc};

/// How long a policy change may take to reach the nodes' filters.
const ENFORCED: Duration = Duration::from_secs(20);
/// What a connection the filter drops gets (`connect.py`'s two-second timeout).
const DROPPED: &str = "timeout";
const OPEN: bool = true;
const SHUT: bool = false;

/// The cluster with agents that enforce security groups, the API server and the watcher
/// (which the returned process is).
fn enforcing(name: &str) -> (Cluster, KubeApi, Proc) {
    let (mut cluster, kube) = setup(name);
    cluster.filtering_agents(None);
    let watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "1"]);
    (cluster, kube, watcher)
}

/// Sets label `key` to `value` (removes it with None) on namespace `ns`, or on its pod
/// `pod`.
fn label(kube: &KubeApi, ns: &str, pod: Option<&str>, key: &str, value: Option<&str>) {
    let patch = json!({"metadata": {"labels": {key: value}}});
    let (ns, pod) = (ns.to_string(), pod.map(str::to_string));
    kube.admin(|c| async move {
        let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
        match pod {
            Some(pod) => drop(
                Api::<Pod>::namespaced(c, &ns)
                    .patch(&pod, &params, &patch)
                    .await
                    .unwrap(),
            ),
            None => drop(
                Api::<Namespace>::all(c)
                    .patch(&ns, &params, &patch)
                    .await
                    .unwrap(),
            ),
        }
    });
}

/// The cluster IP of the service `name` in `ns`, made with `spec`.
fn cluster_ip(kube: &KubeApi, ns: &str, name: &str, spec: Value) -> String {
    service(kube, ns, name, json!({ "spec": spec }), false)
        .spec
        .unwrap()
        .cluster_ip
        .unwrap()
}

/// One connection the test expects to be answered (`open`) or dropped.
#[derive(Clone, Copy)]
struct Probe {
    from: &'static str,
    to: &'static str,
    port: u16,
    udp: bool,
    open: bool,
}

/// A TCP connection to `to`:`port` (8080 and 5353 on a pod) from `from`.
fn tcp(from: &'static str, to: &'static str, port: u16, open: bool) -> Probe {
    Probe {
        from,
        to,
        port,
        udp: false,
        open,
    }
}

/// As [`tcp`], a UDP exchange.
fn udp(from: &'static str, to: &'static str, port: u16, open: bool) -> Probe {
    Probe {
        udp: true,
        ..tcp(from, to, port, open)
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let proto = if self.udp { "udp" } else { "tcp" };
        let want = if self.open { "answered" } else { "dropped" };
        write!(
            f,
            "{} -> {}:{}/{proto} {want}",
            self.from, self.to, self.port
        )
    }
}

/// Who probes and what is probed, by the names the probes use: pods, nodes (`h1`,
/// `h2`) and services.
struct Net<'a> {
    from: BTreeMap<String, &'a Ns>,
    /// An address, and who may answer there.
    to: BTreeMap<String, (String, Vec<String>)>,
}

impl<'a> Net<'a> {
    /// The cluster's nodes and the pods of `served`.
    fn new(cluster: &'a Cluster, served: &[&'a ServedPods]) -> Net<'a> {
        let mut net = Net {
            from: BTreeMap::new(),
            to: BTreeMap::new(),
        };
        for (i, host) in cluster.hosts.iter().enumerate() {
            net.from.insert(format!("h{}", i + 1), host);
        }
        for s in served {
            net.add(s);
        }
        net
    }

    /// The pods of `served`.
    fn add(&mut self, served: &'a ServedPods) {
        for (name, _, _, ns, addr) in &served.pods {
            self.from.insert(name.clone(), ns);
            self.to
                .insert(name.clone(), (addr.clone(), vec![name.clone()]));
        }
    }

    /// Service `name` at `vip`, answered by the pods `backends`.
    fn service(&mut self, name: &str, vip: String, backends: &[&str]) {
        let backends = backends.iter().map(|b| b.to_string()).collect();
        self.to.insert(name.to_string(), (vip, backends));
    }

    /// The address of pod `name`.
    fn addr(&self, name: &str) -> &str {
        &self.to[name].0
    }

    /// What the connection of `p` got: who answered, or `connect.py`'s failure.
    fn run(&self, p: &Probe) -> String {
        self.from[p.from]
            .connect(&self.to[p.to].0, p.port, 1, p.udp)
            .remove(0)
    }

    /// Waits until every probe, run together, gets what it expects: an open one an
    /// answer from its target, a shut one nothing. Filters change asynchronously, so
    /// until [`ENFORCED`]; then fails naming the probes that did not.
    fn expect(&self, what: &str, probes: &[Probe]) {
        let start = Instant::now();
        loop {
            let got: Vec<String> = std::thread::scope(|s| {
                let runs: Vec<_> = probes.iter().map(|p| s.spawn(|| self.run(p))).collect();
                runs.into_iter().map(|r| r.join().unwrap()).collect()
            });
            let wrong: Vec<String> = probes
                .iter()
                .zip(&got)
                .filter(|(p, got)| {
                    let fits = if p.open {
                        self.to[p.to].1.contains(got)
                    } else {
                        *got == DROPPED
                    };
                    !fits
                })
                .map(|(p, got)| format!("{p}, got {got}"))
                .collect();
            if wrong.is_empty() {
                return;
            }
            assert!(
                start.elapsed() < ENFORCED,
                "{what}, after {ENFORCED:?}: {}",
                wrong.join("; ")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// In namespace a, web pods w0 (h1) and w1 (h2) behind service `web` (80 to the port
/// named `http`) and other pods k0 (h1) and k1 (h2); in b, b0 (h1) and b1 (h2). Policies
/// on a, one recipe after the other, the earlier ones kept where they are the default
/// that later ones add to.
#[test]
fn ingress_policies_let_in_only_what_they_select() {
    let (cluster, kube, _watcher) = enforcing("np");
    namespace(&kube, "a");
    namespace(&kube, "b");
    let a = served_pods(
        &cluster,
        &kube,
        "a",
        &[
            ("w0", 0, "web"),
            ("w1", 1, "web"),
            ("k0", 0, "k"),
            ("k1", 1, "k"),
        ],
    );
    let b = served_pods(&cluster, &kube, "b", &[("b0", 0, "b"), ("b1", 1, "b")]);
    let vip = cluster_ip(
        &kube,
        "a",
        "web",
        json!({"selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http"}]}),
    );
    let mut net = Net::new(&cluster, &[&a, &b]);
    net.service("web", vip, &["w0", "w1"]);
    net.expect(
        "everyone to reach the web pods before any policy",
        &[
            tcp("b0", "w0", 8080, OPEN),
            tcp("b1", "w0", 8080, OPEN),
            tcp("k1", "w0", 8080, OPEN),
            tcp("k0", "web", 80, OPEN),
            udp("b1", "w1", 5353, OPEN),
            tcp("h1", "w0", 8080, OPEN),
            tcp("h1", "w1", 8080, OPEN),
        ],
    );

    // Deny all ingress in a: nobody gets in, from b or from a, on either node or
    // through the service; each pod's own node does, the other node not. What a's pods
    // start, and b, are not touched.
    network_policy(
        &kube,
        "a",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    net.expect(
        "a to be closed but to each pod's own node",
        &[
            tcp("b0", "w0", 8080, SHUT),
            tcp("b1", "w0", 8080, SHUT),
            tcp("b0", "w1", 8080, SHUT),
            udp("b1", "w1", 5353, SHUT),
            tcp("k0", "w0", 8080, SHUT),
            tcp("k1", "w0", 8080, SHUT),
            tcp("b1", "web", 80, SHUT),
            tcp("h1", "w0", 8080, OPEN),
            tcp("h2", "w1", 8080, OPEN),
            tcp("h1", "w1", 8080, SHUT),
            tcp("h2", "w0", 8080, SHUT),
            tcp("w0", "b1", 8080, OPEN),
            tcp("b0", "b1", 8080, OPEN),
        ],
    );

    // And from namespaces labelled team=x, on TCP 8080 only: b gets in while it
    // wears the label; a, unlabelled, does not.
    network_policy(
        &kube,
        "a",
        "team",
        json!({"podSelector": {}, "ingress": [{
            "from": [{"namespaceSelector": {"matchLabels": {"team": "x"}}}],
            "ports": [{"protocol": "TCP", "port": 8080}]}]}),
    );
    label(&kube, "b", None, "team", Some("x"));
    net.expect(
        "b, labelled, to get in on 8080",
        &[
            tcp("b0", "w0", 8080, OPEN),
            tcp("b1", "w0", 8080, OPEN),
            tcp("b0", "w1", 8080, OPEN),
            tcp("b1", "web", 80, OPEN),
            udp("b1", "w1", 5353, SHUT),
            tcp("b1", "w1", 5353, SHUT),
            tcp("k1", "w0", 8080, SHUT),
        ],
    );
    label(&kube, "b", None, "team", None);
    net.expect(
        "b, unlabelled, to be kept out again",
        &[
            tcp("b0", "w0", 8080, SHUT),
            tcp("b1", "w1", 8080, SHUT),
            tcp("h1", "w0", 8080, OPEN),
        ],
    );
    delete_network_policy(&kube, "a", "team");

    // And to the web pods from a's pods labelled role=client, or from b's so
    // labelled while b is labelled team=x: directly and through the service; access
    // follows the labels.
    network_policy(
        &kube,
        "a",
        "clients",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"from": [
            {"podSelector": {"matchLabels": {"role": "client"}}},
            {"namespaceSelector": {"matchLabels": {"team": "x"}},
             "podSelector": {"matchLabels": {"role": "client"}}}]}]}),
    );
    label(&kube, "a", Some("k0"), "role", Some("client"));
    label(&kube, "b", Some("b0"), "role", Some("client"));
    net.expect(
        "k0, a client, to get in",
        &[
            tcp("k0", "w1", 8080, OPEN),
            udp("k0", "w0", 5353, OPEN),
            tcp("k0", "web", 80, OPEN),
            tcp("k1", "w0", 8080, SHUT),
            tcp("k1", "web", 80, SHUT),
            tcp("b0", "w0", 8080, SHUT),
            tcp("b0", "web", 80, SHUT),
        ],
    );
    label(&kube, "b", None, "team", Some("x"));
    net.expect(
        "b0, a client in a team=x namespace, to get in",
        &[
            tcp("b0", "w0", 8080, OPEN),
            tcp("b0", "w1", 8080, OPEN),
            tcp("b1", "w0", 8080, SHUT),
            tcp("b1", "web", 80, SHUT),
        ],
    );
    label(&kube, "a", Some("k1"), "role", Some("client"));
    label(&kube, "a", Some("k0"), "role", None);
    net.expect(
        "the client label to move from k0 to k1",
        &[
            tcp("k1", "w0", 8080, OPEN),
            tcp("k1", "web", 80, OPEN),
            tcp("k0", "w1", 8080, SHUT),
            tcp("k0", "web", 80, SHUT),
        ],
    );
    delete_network_policy(&kube, "a", "clients");
    net.expect(
        "the clients to be kept out without their policy",
        &[tcp("k1", "w0", 8080, SHUT), tcp("b0", "w1", 8080, SHUT)],
    );
    delete_network_policy(&kube, "a", "deny");
    net.expect(
        "a to be open again without its policies",
        &[
            tcp("b1", "w0", 8080, OPEN),
            tcp("b0", "w1", 8080, OPEN),
            tcp("k0", "w0", 8080, OPEN),
            udp("b1", "w1", 5353, OPEN),
            tcp("b0", "web", 80, OPEN),
        ],
    );

    // From b's addresses but b0's: b1 gets in, b0 and a's own pods do not.
    let b_subnet = networks_of_namespace(&cluster, "b")[0].subnets[0].clone();
    let b_cidr = cluster
        .api(|c| c.get::<Subnet>(&b_subnet))
        .unwrap()
        .cidr
        .to_string();
    network_policy(
        &kube,
        "a",
        "block",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"from": [
            {"ipBlock": {"cidr": b_cidr, "except": [format!("{}/32", net.addr("b0"))]}}]}]}),
    );
    net.expect(
        "b1 only to get in by its address",
        &[
            tcp("b1", "w0", 8080, OPEN),
            tcp("b1", "w1", 8080, OPEN),
            tcp("b1", "web", 80, OPEN),
            tcp("b0", "w0", 8080, SHUT),
            tcp("b0", "w1", 8080, SHUT),
            tcp("b0", "web", 80, SHUT),
            tcp("k0", "w1", 8080, SHUT),
            tcp("h2", "w1", 8080, OPEN),
        ],
    );
    delete_network_policy(&kube, "a", "block");

    // To the port named http only, from anywhere: TCP 8080 answers, 5353 and UDP do
    // not; through the service too, its target port being that name.
    network_policy(
        &kube,
        "a",
        "http",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"ports": [{"port": "http"}]}]}),
    );
    net.expect(
        "only the http port to answer",
        &[
            tcp("b0", "w0", 8080, OPEN),
            tcp("k1", "w0", 8080, OPEN),
            tcp("b1", "web", 80, OPEN),
            tcp("b0", "w0", 5353, SHUT),
            udp("b1", "w0", 5353, SHUT),
            udp("k0", "w1", 8080, SHUT),
        ],
    );
    delete_network_policy(&kube, "a", "http");
    net.expect(
        "every port to answer again",
        &[tcp("b0", "w0", 5353, OPEN), udp("k0", "w1", 8080, OPEN)],
    );
}

/// In namespace a, e0 (h1, app e) and a1 (h2); in b, b0 (h1) and b1 (h2); in
/// kube-system, dns (h2) behind service `dns` (UDP 53 to 5353). e0 may send only to
/// kube-system's UDP 5353; then the watcher is killed, policies change while it is
/// down, and the restarted one enforces the old and the new.
#[test]
fn egress_to_dns_only_and_a_restarted_watcher_enforces_what_changed_meanwhile() {
    let (cluster, kube, mut watcher) = enforcing("ne");
    namespace(&kube, "a");
    namespace(&kube, "b");
    let a = served_pods(&cluster, &kube, "a", &[("e0", 0, "e"), ("a1", 1, "a")]);
    let b = served_pods(&cluster, &kube, "b", &[("b0", 0, "b"), ("b1", 1, "b")]);
    let dns = served_pods(&cluster, &kube, "kube-system", &[("dns", 1, "dns")]);
    let vip = cluster_ip(
        &kube,
        "kube-system",
        "dns",
        json!({"selector": {"app": "dns"}, "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}),
    );
    let mut net = Net::new(&cluster, &[&a, &b, &dns]);
    net.service("dns-svc", vip, &["dns"]);
    net.expect(
        "e0 to reach everyone before any policy",
        &[
            udp("e0", "dns-svc", 53, OPEN),
            tcp("e0", "b1", 8080, OPEN),
            tcp("e0", "a1", 8080, OPEN),
            tcp("a1", "b0", 8080, OPEN),
        ],
    );

    // e0 sends only UDP 5353 to kube-system (by the name label the watcher gives
    // namespaces): the DNS service answers, since the check is after its DNAT, and
    // nothing else; what comes to e0 is not touched, nor what a1 sends.
    network_policy(
        &kube,
        "a",
        "dns",
        json!({"podSelector": {"matchLabels": {"app": "e"}}, "policyTypes": ["Egress"],
            "egress": [{
                "to": [{"namespaceSelector": {"matchLabels":
                    {"kubernetes.io/metadata.name": "kube-system"}}}],
                "ports": [{"protocol": "UDP", "port": 5353}]}]}),
    );
    net.expect(
        "e0 to send to DNS only",
        &[
            udp("e0", "dns-svc", 53, OPEN),
            udp("e0", "dns", 5353, OPEN),
            tcp("e0", "dns", 5353, SHUT),
            tcp("e0", "dns", 8080, SHUT),
            udp("e0", "b1", 5353, SHUT),
            tcp("e0", "b1", 8080, SHUT),
            tcp("e0", "b0", 8080, SHUT),
            tcp("e0", "a1", 8080, SHUT),
            tcp("b0", "e0", 8080, OPEN),
            tcp("h2", "e0", 8080, OPEN),
            tcp("a1", "b0", 8080, OPEN),
            udp("a1", "dns-svc", 53, OPEN),
        ],
    );

    // a1 closed to ingress; then the watcher is killed: what it made stays enforced.
    network_policy(
        &kube,
        "a",
        "a1",
        json!({"podSelector": {"matchLabels": {"app": "a"}}, "policyTypes": ["Ingress"]}),
    );
    net.expect(
        "a1 to be closed",
        &[
            tcp("b0", "a1", 8080, SHUT),
            tcp("h2", "a1", 8080, OPEN),
            tcp("h1", "a1", 8080, SHUT),
        ],
    );
    watcher.kill9();
    net.expect(
        "the policies to hold without the watcher",
        &[
            tcp("e0", "b1", 8080, SHUT),
            udp("e0", "dns-svc", 53, OPEN),
            tcp("b1", "a1", 8080, SHUT),
        ],
    );
    // Meanwhile a1's policy goes and b closes.
    delete_network_policy(&kube, "a", "a1");
    network_policy(
        &kube,
        "b",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    let _watcher = start_watcher(&cluster, &kube, &["--lease-seconds", "1"]);
    net.expect(
        "the restarted watcher to open a1, close b and keep e0's egress",
        &[
            tcp("b0", "a1", 8080, OPEN),
            tcp("a1", "b0", 8080, SHUT),
            tcp("a1", "b1", 8080, SHUT),
            tcp("b0", "b1", 8080, SHUT),
            tcp("h1", "b0", 8080, OPEN),
            tcp("h2", "b0", 8080, SHUT),
            tcp("e0", "a1", 8080, SHUT),
            udp("e0", "dns-svc", 53, OPEN),
            tcp("b1", "e0", 8080, OPEN),
        ],
    );
    // A pod that comes under e0's policy afterwards is held to it.
    let late = served_pods(&cluster, &kube, "a", &[("e1", 1, "e")]);
    net.add(&late);
    net.expect(
        "e1, new, to send to DNS only",
        &[
            udp("e1", "dns-svc", 53, OPEN),
            tcp("e1", "a1", 8080, SHUT),
            tcp("e1", "e0", 8080, SHUT),
            tcp("a1", "e1", 8080, OPEN),
        ],
    );
    delete_network_policy(&kube, "a", "dns");
    net.expect(
        "e0 and e1 to send anywhere again",
        &[
            tcp("e0", "a1", 8080, OPEN),
            tcp("e1", "e0", 8080, OPEN),
            tcp("e0", "dns", 8080, OPEN),
        ],
    );
}

/// The same filter for pods run as the kubelet runs them, through containerd's CRI on
/// both nodes: a policy letting only labelled clients in keeps another pod out of the
/// web pods, by pod IP and through their service, across nodes.
#[test]
fn a_policy_holds_for_pods_run_through_containerds_cri() {
    use support::cluster::ns::serve_name_with;
    let (cluster, kube, _watcher) = enforcing("nc");
    namespace(&kube, "web");
    let nodes = cri_nodes(&cluster);
    let mut netns = BTreeMap::new();
    let mut sandboxes = Vec::new();
    let mut servers = Vec::new();
    let pods = [
        ("p0", 0, json!({"app": "web"})),
        ("p1", 1, json!({"app": "web"})),
        ("client", 1, json!({"role": "client"})),
        ("other", 0, json!({})),
    ];
    for (name, h, labels) in pods {
        let uid = pod_labelled(&kube, "web", name, &format!("h{}", h + 1), labels);
        let (id, status) = nodes[h]
            .sync_pod("web", name, &uid, 3)
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}"));
        sandboxes.push((h, id));
        let path = support::cri::sandbox_netns(&status);
        if name.starts_with('p') {
            servers.push(serve_name_with(in_netns(&path, "python3"), name, 8080));
            set_ready(&kube, "web", name, true);
        }
        netns.insert(name, path);
    }
    let ip = |name: &str| {
        wait_annotation(&kube, "web", name).addresses[0]
            .addr()
            .to_string()
    };
    let (ip0, ip1) = (ip("p0"), ip("p1"));
    let vip = cluster_ip(
        &kube,
        "web",
        "web",
        json!({"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}),
    );
    let connect =
        |from: &str, to: &str, port: u16, n: usize| connect_from(&netns[from], to, port, n);
    wait_until("other to reach p0 before any policy", ENFORCED, || {
        connect("other", &ip0, 8080, 1) == ["p0"]
    });
    network_policy(
        &kube,
        "web",
        "clients",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{
            "from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
            "ports": [{"port": 8080}]}]}),
    );
    wait_until("other to be kept out of p0 and p1", ENFORCED, || {
        connect("other", &ip0, 8080, 1) == [DROPPED] && connect("other", &ip1, 8080, 1) == [DROPPED]
    });
    assert_eq!(connect("client", &ip0, 8080, 1), ["p0"], "across nodes");
    assert_eq!(connect("client", &ip1, 8080, 1), ["p1"], "on its node");
    let both = std::collections::BTreeSet::from(["p0", "p1"]);
    wait_until(
        "the client to reach both through the service",
        ENFORCED,
        || answers_of(&connect("client", &vip, 80, 20)) == both,
    );
    assert_eq!(
        connect("other", &vip, 80, 1),
        [DROPPED],
        "nor through the service"
    );
    drop(servers);
    for (h, id) in sandboxes {
        nodes[h].remove_sandbox(id);
    }
}
