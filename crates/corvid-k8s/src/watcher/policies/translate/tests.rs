use super::*;
use serde_json::{json, Value};

fn policy(ns: &str, name: &str, spec: Value) -> Policy {
    let np: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "uid": format!("{ns}-{name}")},
        "spec": spec,
    }))
    .unwrap();
    Policy::from_k8s(&np).unwrap()
}

fn pod(ns: &str, labels: Value, ports: Value) -> PodInfo {
    pod_on(ns, labels, ports, None)
}

fn pod_on(ns: &str, labels: Value, ports: Value, node: Option<&str>) -> PodInfo {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "c", "ports": ports}], "nodeName": node},
    }))
    .unwrap();
    PodInfo::of(&p)
}

fn labels(v: Value) -> Labels {
    serde_json::from_value(v).unwrap()
}

fn rule(
    direction: Direction,
    ethertype: Ethertype,
    proto: Option<Protocol>,
    ports: Option<(u16, u16)>,
    remote: Remote,
) -> Rule {
    Rule {
        direction,
        ethertype,
        protocol: proto,
        ports,
        remote,
    }
}

/// The groups of `uid` that are policies' groups.
fn policy_groups(e: &Engine, uid: &str) -> Vec<GroupId> {
    e.groups_of(uid)
        .unwrap()
        .into_iter()
        .filter(|g| e.variants.contains_key(g))
        .collect()
}

fn has(e: &Engine, uid: &str, g: &GroupId) -> bool {
    e.groups_of(uid).unwrap().contains(g)
}

#[test]
fn a_pod_no_policy_selects_is_open_both_ways_and_reached_by_its_node() {
    let mut e = Engine::new();
    e.set_namespace("a", Labels::new());
    e.set_pod("p1", pod_on("a", json!({}), json!([]), Some("h1")));
    e.set_pod("p2", pod_on("a", json!({}), json!([]), Some("h1")));
    let mut want = vec![open_ingress(), open_egress(), node("h1")];
    want.sort();
    assert_eq!(e.groups_of("p1").unwrap(), want);
    let open = e.group(&open_ingress()).unwrap();
    assert!(open
        .rules
        .iter()
        .all(|r| r.direction == Direction::Ingress && r.remote == Remote::Any));
    assert_eq!(open.rules.len(), 2, "IPv4 and IPv6");
    assert!(
        e.group(&node("h1")).unwrap().rules.is_empty(),
        "no address known yet"
    );
    e.take_dirty();
    e.set_hosts(BTreeMap::from([
        ("h1".into(), "192.0.2.1".parse().unwrap()),
        ("h2".into(), "192.0.2.2".parse().unwrap()),
    ]));
    let (groups, _) = e.take_dirty();
    assert_eq!(
        groups,
        BTreeSet::from([node("h1")]),
        "h2 has no pods: no group"
    );
    let host: IpNet = "192.0.2.1/32".parse().unwrap();
    assert_eq!(
        e.group(&node("h1")).unwrap().rules,
        BTreeSet::from([
            rule(
                Direction::Ingress,
                Ethertype::Ipv4,
                None,
                None,
                Remote::Prefix(host)
            ),
            rule(
                Direction::Egress,
                Ethertype::Ipv4,
                None,
                None,
                Remote::Prefix(host)
            ),
        ]),
        "its own node only"
    );
    assert!(e.knows_host("h1") && !e.knows_host("h3"));
    // The node's last pod gone, its group goes.
    e.remove_pod("p1");
    assert!(e.group(&node("h1")).is_some());
    e.remove_pod("p2");
    assert!(e.group(&node("h1")).is_none());
}

#[test]
fn deny_all_ingress_isolates_only_its_namespace_and_only_ingress() {
    let mut e = Engine::new();
    e.set_pod("a1", pod("a", json!({}), json!([])));
    e.set_pod("b1", pod("b", json!({}), json!([])));
    e.take_dirty();
    e.set_policy(
        "deny",
        policy(
            "a",
            "deny",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        ),
    );
    let (groups, pods) = e.take_dirty();
    assert_eq!(pods, BTreeSet::from(["a1".to_string()]), "b1 is untouched");
    let g = &policy_groups(&e, "a1")[0];
    assert!(groups.contains(g));
    assert!(e.group(g).unwrap().rules.is_empty(), "no rule: nothing in");
    assert!(!has(&e, "a1", &open_ingress()));
    assert!(has(&e, "a1", &open_egress()));
    assert!(has(&e, "b1", &open_ingress()));
    // Gone: the pod is open again and the policy's group goes.
    e.remove_policy("deny");
    let (groups, _) = e.take_dirty();
    assert!(groups.contains(g) && e.group(g).is_none());
    assert!(has(&e, "a1", &open_ingress()));
}

#[test]
fn a_pod_peer_is_a_group_its_pods_join_and_leave_with_their_labels() {
    let mut e = Engine::new();
    e.set_pod("web", pod("a", json!({"app": "web"}), json!([])));
    e.set_pod("c1", pod("a", json!({"role": "client"}), json!([])));
    e.set_pod("c2", pod("b", json!({"role": "client"}), json!([])));
    e.set_policy(
        "p",
        policy(
            "a",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                "ports": [{"port": 80}]}]}),
        ),
    );
    let g = &policy_groups(&e, "web")[0];
    let rules = e.group(g).unwrap().rules;
    assert_eq!(rules.len(), 2, "{rules:?}");
    let Remote::Group(peer) = &rules.first().unwrap().remote else {
        panic!("{rules:?}")
    };
    assert!(rules
        .iter()
        .all(|r| r.protocol == Some(Protocol::Tcp) && r.ports == Some((80, 80))));
    assert!(
        e.group(peer).unwrap().rules.is_empty(),
        "a peer group allows nothing itself"
    );
    assert!(has(&e, "c1", peer), "a client of the policy's namespace");
    assert!(!has(&e, "c2", peer), "a client of another namespace is not");
    assert!(!has(&e, "web", peer));
    assert!(
        policy_groups(&e, "c1").is_empty(),
        "the policy does not select c1"
    );
    e.take_dirty();
    e.set_pod("c1", pod("a", json!({"role": "other"}), json!([])));
    let (groups, pods) = e.take_dirty();
    assert!(!has(&e, "c1", peer));
    assert_eq!(pods, BTreeSet::from(["c1".to_string()]));
    assert!(
        groups.is_empty(),
        "a label change is a port change only: {groups:?}"
    );
}

#[test]
fn a_namespace_selector_follows_the_namespaces_labels() {
    let mut e = Engine::new();
    e.set_namespace("x", Labels::new());
    e.set_pod("x1", pod("x", json!({}), json!([])));
    e.set_policy(
        "p",
        policy(
            "a",
            "p",
            json!({"podSelector": {},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "x"}}}]}]}),
        ),
    );
    let peer = e.peers.keys().next().unwrap().clone();
    assert!(!has(&e, "x1", &peer));
    e.set_namespace("x", labels(json!({"team": "x"})));
    assert!(has(&e, "x1", &peer));
    e.set_namespace("x", Labels::new());
    assert!(!has(&e, "x1", &peer));
    // The name label the API server sets from 1.21, set here too.
    e.set_policy(
        "q",
        policy(
            "a",
            "q",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector":
            {"matchLabels": {"kubernetes.io/metadata.name": "x"}}}]}]}),
        ),
    );
    assert_eq!(policy_groups(&e, "x1").len(), 0);
    assert_eq!(
        e.groups_of("x1").unwrap().len(),
        3,
        "open both ways, q's peer"
    );
}

#[test]
fn ip_blocks_leave_out_their_exceptions() {
    let net = |s: &str| -> IpNet { s.parse().unwrap() };
    assert_eq!(
        subtract(net("10.0.0.0/24"), net("10.0.0.5/32")).len(),
        8,
        "a /24 without one address is eight prefixes"
    );
    assert_eq!(
        subtract(net("10.0.0.0/24"), net("10.1.0.0/16")),
        [net("10.0.0.0/24")]
    );
    assert!(subtract(net("10.0.0.0/24"), net("10.0.0.0/16")).is_empty());
    let mut e = Engine::new();
    e.set_pod("p1", pod("a", json!({}), json!([])));
    e.set_policy(
        "p",
        policy(
            "a",
            "p",
            json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock":
            {"cidr": "10.0.0.0/30", "except": ["10.0.0.1/32"]}}]}]}),
        ),
    );
    let g = &policy_groups(&e, "p1")[0];
    let remotes: Vec<Remote> = e
        .group(g)
        .unwrap()
        .rules
        .into_iter()
        .map(|r| r.remote)
        .collect();
    assert_eq!(
        remotes,
        [
            Remote::Prefix(net("10.0.0.0/32")),
            Remote::Prefix(net("10.0.0.2/31"))
        ]
    );
}

#[test]
fn a_named_port_is_each_selected_pods_own() {
    let mut e = Engine::new();
    e.set_pod(
        "p1",
        pod(
            "a",
            json!({}),
            json!([{"name": "http", "containerPort": 8080}]),
        ),
    );
    e.set_pod(
        "p2",
        pod(
            "a",
            json!({}),
            json!([{"name": "http", "containerPort": 9090}]),
        ),
    );
    e.set_pod(
        "p3",
        pod(
            "a",
            json!({}),
            json!([{"name": "http", "containerPort": 8080}]),
        ),
    );
    e.set_policy(
        "p",
        policy(
            "a",
            "p",
            json!({"podSelector": {}, "ingress": [{"ports": [{"port": "http"}]}]}),
        ),
    );
    let (g1, g2) = (&policy_groups(&e, "p1")[0], &policy_groups(&e, "p2")[0]);
    assert_ne!(g1, g2);
    assert_eq!(
        policy_groups(&e, "p3"),
        std::slice::from_ref(g1),
        "alike pods share a group"
    );
    let ports = |g| -> BTreeSet<_> { e.group(g).unwrap().rules.iter().map(|r| r.ports).collect() };
    assert_eq!(ports(g1), BTreeSet::from([Some((8080, 8080))]));
    assert_eq!(ports(g2), BTreeSet::from([Some((9090, 9090))]));
    // A pod without the name is isolated by the policy and let in on no port.
    e.set_pod("p4", pod("a", json!({}), json!([])));
    let g4 = &policy_groups(&e, "p4")[0];
    assert!(e.group(g4).unwrap().rules.is_empty());
    // Its last user gone, a group goes.
    e.take_dirty();
    e.remove_pod("p2");
    let (groups, _) = e.take_dirty();
    assert!(groups.contains(g2) && e.group(g2).is_none());
}

#[test]
fn an_egress_named_port_follows_the_pods_that_have_it() {
    let mut e = Engine::new();
    e.set_pod(
        "dns",
        pod(
            "kube-system",
            json!({}),
            json!([{"name": "dns", "containerPort": 5353, "protocol": "UDP"}]),
        ),
    );
    e.set_pod("c", pod("a", json!({}), json!([])));
    e.set_policy(
        "p",
        policy(
            "a",
            "p",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"ports": [{"port": "dns", "protocol": "UDP"}]}]}),
        ),
    );
    let g = &policy_groups(&e, "c")[0];
    assert!(has(&e, "c", &open_ingress()) && !has(&e, "c", &open_egress()));
    let ports = |e: &Engine| -> Vec<_> {
        e.group(g)
            .unwrap()
            .rules
            .iter()
            .map(|r| (r.direction, r.protocol, r.ports))
            .collect()
    };
    assert_eq!(
        ports(&e)[0],
        (Direction::Egress, Some(Protocol::Udp), Some((5353, 5353)))
    );
    e.take_dirty();
    e.set_pod(
        "dns2",
        pod(
            "kube-system",
            json!({}),
            json!([{"name": "dns", "containerPort": 53, "protocol": "UDP"}]),
        ),
    );
    let (groups, _) = e.take_dirty();
    assert!(
        groups.contains(g),
        "a new number for the name changes the rules"
    );
    assert_eq!(
        ports(&e).len(),
        4,
        "two numbers, two families: {:?}",
        ports(&e)
    );
}

#[test]
fn policy_types_default_from_the_rules_and_end_port_is_a_range() {
    let p = policy(
        "a",
        "p",
        json!({"podSelector": {}, "egress": [{"ports": [{"port": 1000, "endPort": 2000}]}]}),
    );
    assert!(p.ingress.is_some() && p.egress.is_some());
    let p = policy("a", "p", json!({"podSelector": {}}));
    assert!(p.ingress.is_some() && p.egress.is_none());
    let mut e = Engine::new();
    e.set_pod("c", pod("a", json!({}), json!([])));
    e.set_policy(
        "p",
        policy(
            "a",
            "p",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}],
                "ports": [{"port": 1000, "endPort": 2000, "protocol": "SCTP"}]}]}),
        ),
    );
    let g = &policy_groups(&e, "c")[0];
    let r = e.group(g).unwrap().rules.into_iter().next().unwrap();
    assert_eq!(
        (r.protocol, r.ports),
        (Some(Protocol::Sctp), Some((1000, 2000)))
    );
    assert_eq!(r.ethertype, Ethertype::Ipv4, "a prefix's own family only");
    for bad in [
        json!({"policyTypes": ["Sideways"]}),
        json!({"ingress": [{"ports": [{"port": 80, "protocol": "ICMP"}]}]}),
        json!({"ingress": [{"ports": [{"port": 90, "endPort": 80}]}]}),
        json!({"ingress": [{"from": [{"ipBlock": {"cidr": "nonsense"}}]}]}),
    ] {
        let np: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": "b", "namespace": "a"}, "spec": bad}))
        .unwrap();
        assert!(Policy::from_k8s(&np).is_err(), "{bad}");
    }
}

#[test]
fn rules_read_back_from_the_controller_compare_equal() {
    let mut e = Engine::new();
    e.set_pod("c", pod("a", json!({}), json!([])));
    e.set_policy(
        "p",
        policy(
            "a",
            "p",
            json!({"podSelector": {},
            "ingress": [{"from": [{"podSelector": {}}, {"ipBlock": {"cidr": "10.0.0.0/8"}}],
                "ports": [{"port": 80}, {"protocol": "UDP"}]}]}),
        ),
    );
    let g = &policy_groups(&e, "c")[0];
    for r in e.group(g).unwrap().rules {
        let c = r.create(g);
        let back: SecurityGroupRule = serde_json::from_value(json!({
            "id": "r", "security_group_id": g, "direction": c.direction,
            "ethertype": c.ethertype.unwrap(), "protocol": c.protocol.map(|p| match p.as_str() {
                "tcp" => "6".to_string(), other => other.to_string() }),
            "port_range_min": c.port_range_min, "port_range_max": c.port_range_max,
            "remote_ip_prefix": c.remote_ip_prefix, "normalized_cidr": c.remote_ip_prefix,
            "remote_group_id": c.remote_group_id, "description": "", "tenant_id": "",
            "project_id": "", "created_at": "", "updated_at": "", "revision_number": 0,
        }))
        .unwrap();
        assert_eq!(Rule::of(&back), Some(r));
    }
}

/// Changes in any order leave the same groups as the final objects given at once: the
/// incremental bookkeeping loses nothing.
#[test]
fn any_order_of_changes_ends_where_a_fresh_start_does() {
    let specs = [
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "c"}}}], "ports": [{"port": "http"}]}]}),
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": "x"}}}]}]}),
        json!({"podSelector": {"matchLabels": {"role": "c"}}, "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "web"}}}]}]}),
    ];
    let mut seed: u64 = 7;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut e = Engine::new();
    let mut pods: BTreeMap<String, PodInfo> = BTreeMap::new();
    let mut policies: BTreeMap<String, Policy> = BTreeMap::new();
    let mut nss: BTreeMap<String, Labels> = BTreeMap::new();
    let mut hosts: BTreeMap<String, IpAddr> = BTreeMap::new();
    for _ in 0..600 {
        let ns = ["a", "b"][next(2) as usize];
        match next(6) {
            0 | 1 => {
                let uid = format!("p{}", next(8));
                let app = ["web", "db"][next(2) as usize];
                let role = ["c", "s"][next(2) as usize];
                let port = [8080, 9090][next(2) as usize];
                let node = ["h1", "h2"][next(2) as usize];
                let info = pod_on(
                    ns,
                    json!({"app": app, "role": role}),
                    json!([{"name": "http", "containerPort": port}]),
                    Some(node),
                );
                e.set_pod(&uid, info.clone());
                pods.insert(uid, info);
            }
            2 => {
                let uid = format!("p{}", next(8));
                e.remove_pod(&uid);
                pods.remove(&uid);
            }
            3 => {
                let i = next(3) as usize;
                let uid = format!("np{}", next(4));
                let p = policy(ns, &uid, specs[i].clone());
                e.set_policy(&uid, p.clone());
                policies.insert(uid, p);
            }
            4 => {
                let uid = format!("np{}", next(4));
                e.remove_policy(&uid);
                policies.remove(&uid);
            }
            _ => {
                let l = if next(2) == 0 {
                    json!({"team": "x"})
                } else {
                    json!({})
                };
                e.set_namespace(ns, labels(l.clone()));
                nss.insert(ns.to_string(), labels(l));
                // A host comes, goes or moves.
                let last = 1 + next(250) as u8;
                hosts = (1..=2)
                    .filter(|_| next(3) > 0)
                    .map(|h| (format!("h{h}"), IpAddr::from([192, 0, 2, last])))
                    .collect();
                e.set_hosts(hosts.clone());
            }
        }
    }
    let mut fresh = Engine::new();
    fresh.set_hosts(hosts);
    for (n, l) in &nss {
        fresh.set_namespace(n, l.clone());
    }
    for (uid, p) in &policies {
        fresh.set_policy(uid, p.clone());
    }
    for (uid, p) in &pods {
        fresh.set_pod(uid, p.clone());
    }
    for uid in pods.keys() {
        assert_eq!(e.groups_of(uid), fresh.groups_of(uid), "{uid}");
    }
    let (mut a, mut b) = (e.groups(), fresh.groups());
    a.sort();
    b.sort();
    assert_eq!(a, b);
    for g in &a {
        assert_eq!(e.group(g), fresh.group(g), "{g}");
    }
}

/// The controller holds a /0 as no prefix, so the watcher does too: an ipBlock of
/// 0.0.0.0/0 and a rule from anyone on the same port are one IPv4 rule, not two that the
/// controller would refuse as duplicates.
#[test]
fn a_zero_prefix_is_anyone_of_its_family() {
    let mut e = Engine::new();
    e.set_pod("w", pod("a", json!({}), json!([])));
    e.set_policy(
        "p",
        policy(
            "a",
            "p",
            json!({"podSelector": {}, "ingress": [
            {"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 8080}]},
            {"ports": [{"port": 8080}]}]}),
        ),
    );
    let g = &policy_groups(&e, "w")[0];
    let tcp = Some(Protocol::Tcp);
    assert_eq!(
        e.group(g).unwrap().rules,
        BTreeSet::from([
            rule(
                Direction::Ingress,
                Ethertype::Ipv4,
                tcp,
                Some((8080, 8080)),
                Remote::Any
            ),
            rule(
                Direction::Ingress,
                Ethertype::Ipv6,
                tcp,
                Some((8080, 8080)),
                Remote::Any
            ),
        ])
    );
}

/// A sidecar (an init container that keeps running) names ports too.
#[test]
fn a_sidecars_named_port_is_the_pods() {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "a"},
        "spec": {"containers": [{"name": "app"}],
            "initContainers": [{"name": "proxy", "restartPolicy": "Always",
                "ports": [{"name": "http", "containerPort": 15001}]}]},
    }))
    .unwrap();
    let mut e = Engine::new();
    e.set_pod("p", PodInfo::of(&p));
    e.set_policy(
        "np",
        policy(
            "a",
            "np",
            json!({"podSelector": {}, "ingress": [{"ports": [{"port": "http"}]}]}),
        ),
    );
    let g = &policy_groups(&e, "p")[0];
    let ports: BTreeSet<_> = e.group(g).unwrap().rules.iter().map(|r| r.ports).collect();
    assert_eq!(ports, BTreeSet::from([Some((15001, 15001))]));
}
