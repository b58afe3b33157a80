//! The agent killed in the middle of plugging ports, pod sides altered by hand, and pods
//! coming and going: every ADD that succeeds has a working pod side, every port the
//! controller shows ACTIVE answers from its gateway, the gateway's MAC never moves, and
//! a link made for a port the agent has not heard of yet is not taken for a stale one.
//! Runs as root, in the simulated cluster of `support/cluster.rs`.

#[path = "support/cluster.rs"]
mod cluster;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cluster::ns::{wait_until, Ns};
use cluster::{cni_result, result_ip, url, Cluster};
use corvid_api::{Port, Status, Subnet};
use corvid_net::link::LinkKind;
use serde_json::{json, Value};

/// The `corvid` plugin's configuration for host h1 on `subnet`.
fn plugin_conf(subnet: &Subnet) -> Value {
    json!({
        "cniVersion": "1.1.0", "name": "crash-h1", "type": "corvid", "mpurl": url(),
        "project": "corvid", "subnet": subnet.id, "hostId": "h1", "timeout": 30
    })
}

/// What is wrong with the pod side an ADD reported, if anything: eth0 up with the
/// result's MAC and address, a default route via the gateway, and the gateway answers.
fn pod_side_fault(pod: &Ns, result: &Value) -> Option<String> {
    let mut nl = pod.netlink();
    let Some(eth0) = nl.link_by_name("eth0").unwrap() else {
        return Some("no eth0".into());
    };
    if !eth0.up {
        return Some("eth0 is down".into());
    }
    if result["interfaces"][0]["mac"] != eth0.mac.as_str() {
        return Some(format!("eth0 has MAC {}", eth0.mac));
    }
    let want = result["ips"][0]["address"].as_str().unwrap();
    let addrs: Vec<String> = nl
        .addresses(Some(eth0.index))
        .unwrap()
        .into_iter()
        .map(|(_, a)| a.to_string())
        .collect();
    if !addrs.iter().any(|a| a == want) {
        return Some(format!("eth0 lacks {want}: it has {addrs:?}"));
    }
    let gw = result["ips"][0]["gateway"].as_str().unwrap();
    let default = nl
        .routes()
        .unwrap()
        .into_iter()
        .find(|r| r.dst.prefix_len() == 0 && r.dst.addr().is_ipv4());
    if default.as_ref().and_then(|r| r.gw).map(|g| g.to_string()) != Some(gw.to_string()) {
        return Some(format!("default route {default:?}, not via {gw}"));
    }
    (!pod.ping(gw)).then(|| format!("the gateway {gw} does not answer"))
}

/// True when the pod has its eth0 but not yet all of it: up, an IPv4 address, a
/// default route.
fn is_half_plugged(pod: &Ns) -> bool {
    let mut nl = pod.netlink();
    let Some(eth0) = nl.link_by_name("eth0").unwrap() else {
        return false;
    };
    let addressed = nl
        .addresses(Some(eth0.index))
        .unwrap()
        .iter()
        .any(|(_, a)| a.addr().is_ipv4());
    let routed = nl
        .routes()
        .unwrap()
        .iter()
        .any(|r| r.dst.prefix_len() == 0 && r.oif == eth0.index);
    !(eth0.up && addressed && routed)
}

/// The MAC of host h1's bridge for the network.
fn bridge_mac(cluster: &Cluster) -> String {
    let mut nl = cluster.hosts[0].netlink();
    let bridges: Vec<_> = nl
        .links()
        .unwrap()
        .into_iter()
        .filter(|l| l.kind == LinkKind::Bridge && l.name.starts_with("cvb"))
        .collect();
    assert_eq!(bridges.len(), 1, "one network, one bridge");
    bridges[0].mac.clone()
}

/// A small xorshift generator: the delays need spread, not quality.
struct Delays(u64);

impl Delays {
    fn new() -> Delays {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        eprintln!("delay seed {seed}");
        Delays(seed)
    }

    fn micros(&mut self, max: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_micros(self.0 % max)
    }
}

#[test]
fn an_agent_killed_while_plugging_never_reports_a_half_plugged_port() {
    let mut cluster = Cluster::new("ak");
    let (_net, subnet) = cluster.network("crash", "10.61.0.0/24", false);
    let conf = plugin_conf(&subnet);
    let mut delays = Delays::new();
    let mut pods = Vec::new();
    let mut gateway_mac = None;
    const KILLS: usize = 60;
    let mut half_plugged = 0;
    for i in 0..KILLS {
        let pod = cluster.pod(&format!("k{i}"));
        let mut in_pod = pod.netlink();
        let add = cluster.plugin(0, "ADD", &format!("crash{i}"), &pod, &conf);
        if i % 2 == 0 {
            // 0-30 ms: before the agent hears of the port, while it plugs it, or after.
            std::thread::sleep(delays.micros(30_000));
        } else {
            // Aimed: once the pair exists, within the pod side's configuration.
            let deadline = Instant::now() + Duration::from_secs(10);
            while in_pod.link_by_name("eth0").unwrap().is_none() && Instant::now() < deadline {}
            let spin = Instant::now() + delays.micros(150);
            while Instant::now() < spin {}
        }
        cluster.agents[0].as_mut().unwrap().kill9();
        if is_half_plugged(&pod) {
            half_plugged += 1;
        }
        cluster.start_agent(0);
        let out = add.wait_with_output().unwrap();
        let result = cni_result(&out);
        if let Some(fault) = pod_side_fault(&pod, &result) {
            panic!("ADD {i} succeeded with a broken pod side: {fault}");
        }
        let mac = bridge_mac(&cluster);
        assert_eq!(
            *gateway_mac.get_or_insert(mac.clone()),
            mac,
            "after ADD {i}"
        );
        pods.push(pod);
    }
    eprintln!("{half_plugged} of {KILLS} kills left a half-plugged port");
    assert!(
        half_plugged > 0,
        "no kill landed inside a plug: the test tested nothing"
    );
    // Every port the controller shows ACTIVE answers from its gateway.
    let active: Vec<Port> = cluster
        .ports()
        .into_iter()
        .filter(|p| p.status == Status::Active)
        .collect();
    assert_eq!(active.len(), KILLS, "every port ACTIVE");
    for port in active {
        let pod = pods
            .iter()
            .find(|p| {
                p.netlink()
                    .link_by_name("eth0")
                    .unwrap()
                    .is_some_and(|l| l.mac == port.mac_address)
            })
            .unwrap_or_else(|| panic!("no pod has port {}'s MAC", port.id));
        assert!(pod.ping("10.61.0.1"), "ACTIVE port {} is cut off", port.id);
    }
}

#[test]
fn a_pod_side_altered_by_hand_is_repaired_by_a_restart_and_by_the_resync() {
    let mut cluster = Cluster::new("ar");
    let (_net, subnet) = cluster.network("fix", "10.62.0.0/24", false);
    let pod = cluster.pod("a");
    let result = cni_result(&cluster.add(0, "fix", &pod));
    assert_eq!(pod_side_fault(&pod, &result), None);
    let break_it = |pod: &Ns| {
        pod.ip("addr flush dev eth0");
        pod.ip("link set eth0 down");
        assert!(pod_side_fault(pod, &result).is_some());
    };
    let repaired = |pod: &Ns, how: &str| {
        let start = Instant::now();
        wait_until(how, Duration::from_secs(15), || {
            pod_side_fault(pod, &result).is_none()
        });
        eprintln!("{how}: {:?}", start.elapsed());
    };

    // A restart compares every pod side with the controller.
    break_it(&pod);
    cluster.agents[0].as_mut().unwrap().kill9();
    cluster.start_agent(0);
    repaired(&pod, "repair by a restart");

    // So does the periodic full pass, without a restart.
    cluster.agents[0].as_mut().unwrap().kill9();
    cluster.start_agent_with(0, &["--resync", "1"]);
    break_it(&pod);
    repaired(&pod, "repair by the resync");

    // A port given another address is re-addressed in place.
    let port = cluster
        .ports()
        .into_iter()
        .find(|p| p.mac_address == result["interfaces"][0]["mac"].as_str().unwrap())
        .unwrap();
    let old = result_ip(&result);
    cluster.api(|c| {
        c.update::<Port>(
            &port.id,
            json!({"fixed_ips": [{"subnet_id": subnet.id, "ip_address": "10.62.0.200"}]}),
        )
        .unwrap()
    });
    wait_until("the new address", Duration::from_secs(15), || {
        let addrs = pod.netlink().addresses(None).unwrap();
        let has = |ip: &str| addrs.iter().any(|(_, a)| a.addr().to_string() == ip);
        has("10.62.0.200") && !has(&old)
    });
    assert!(pod.ping("10.62.0.1"));
}

#[test]
fn the_agent_bridge_keeps_its_mac_while_pods_come_and_go() {
    let cluster = Cluster::new("am");
    cluster.network("churn", "10.63.0.0/24", false);
    let mut pods = Vec::new();
    let mut gateway_mac = None;
    for i in 0..5 {
        let pod = cluster.pod(&format!("m{i}"));
        cni_result(&cluster.add(0, "churn", &pod));
        let mac = bridge_mac(&cluster);
        assert_eq!(
            *gateway_mac.get_or_insert(mac.clone()),
            mac,
            "after ADD {i}"
        );
        pods.push(pod);
        for p in &pods {
            assert!(
                p.ping("10.63.0.1"),
                "after ADD {i}: {} lost the gateway",
                p.name()
            );
        }
    }
    // The pod behind the lowest MAC on the bridge leaves first, each time: the one an
    // unfixed bridge would have taken its MAC from.
    while !pods.is_empty() {
        let mut host = cluster.hosts[0].netlink();
        let pos = (0..pods.len())
            .min_by_key(|&i| {
                let eth0 = pods[i].netlink().link_by_name("eth0").unwrap().unwrap();
                host.link_by_index(eth0.peer_index.unwrap())
                    .unwrap()
                    .unwrap()
                    .mac
            })
            .unwrap();
        let gone = pods.remove(pos);
        let out = cluster.del(0, "churn", &gone);
        assert!(out.status.success(), "{out:?}");
        wait_until("the pod's veth to go", Duration::from_secs(15), || {
            gone.netlink().link_by_name("eth0").unwrap().is_none()
        });
        if !pods.is_empty() {
            assert_eq!(gateway_mac.as_deref(), Some(bridge_mac(&cluster).as_str()));
        }
        for p in &pods {
            assert!(p.ping("10.63.0.1"), "{} lost the gateway", p.name());
        }
    }
}

#[test]
fn an_agent_keeps_the_links_a_driver_made_for_ports_it_has_not_heard_of_yet() {
    let mut cluster = Cluster::new("ay");
    // Unknown links are looked for by the full passes: one every two seconds here.
    cluster.agents[0].as_mut().unwrap().kill9();
    cluster.start_agent_with(0, &["--resync", "2"]);
    let (net, _subnet) = cluster.network("young", "10.63.0.0/24", false);
    let h1 = &cluster.hosts[0];
    let agent = cluster.agents[0].as_ref().unwrap().0.id() as libc::pid_t;
    let create = |i: usize| -> Port {
        cluster.api(|c| {
            c.create(json!({
                "network_id": net.id, "binding:host_id": "h1", "device_owner": "docker",
                "device_id": format!("young{i}")
            }))
            .unwrap()
        })
    };
    let first = create(0);
    wait_until("the agent has the network", Duration::from_secs(20), || {
        !h1.links("cvb").is_empty()
    });
    const ROUNDS: usize = 5;
    let mut names = Vec::new();
    for i in 1..=ROUNDS {
        // The agent holds a page that ends just before a port is bound here, and only
        // reads it once the port's pair exists, as when a Docker Join follows at once.
        assert_eq!(unsafe { libc::kill(agent, libc::SIGSTOP) }, 0);
        std::thread::sleep(Duration::from_millis(50));
        cluster.api(|c| {
            c.set_port_status(
                &first.id,
                if i % 2 == 1 {
                    Status::Down
                } else {
                    Status::Active
                },
            )
            .unwrap()
        });
        std::thread::sleep(Duration::from_millis(50));
        let port = create(i);
        let name = corvid_net::names::host_veth(&port.id);
        h1.ip(&format!(
            "link add {name} type veth peer name cvc{}",
            &name[3..]
        ));
        names.push(name);
        assert_eq!(unsafe { libc::kill(agent, libc::SIGCONT) }, 0);
        std::thread::sleep(Duration::from_millis(200));
    }
    // A link for no port at all is the agent's to remove.
    let orphan = corvid_net::names::host_veth("not-a-port");
    h1.ip(&format!("link add {orphan} type veth peer name cvcorphan"));
    cluster.api(|c| c.set_port_status(&first.id, Status::Down).unwrap());
    wait_until("the orphan's link removed", Duration::from_secs(20), || {
        h1.links(&orphan).is_empty()
    });
    let kept = h1.links("cvp");
    let lost: Vec<&String> = names.iter().filter(|n| !kept.contains(n)).collect();
    assert!(lost.is_empty(), "the agent removed {lost:?}");
}

/// What differs between host h1's plugged ports (the host ends of its veths) and the
/// controller's ports bound to h1, both ways, and any bound port not settled ACTIVE or
/// ERROR; None when they agree.
fn plan_gap(cluster: &Cluster) -> Option<String> {
    let bound: Vec<Port> = cluster
        .ports()
        .into_iter()
        .filter(|p| p.binding_host_id == "h1")
        .collect();
    let want: std::collections::BTreeSet<String> = bound
        .iter()
        .map(|p| corvid_net::names::host_veth(&p.id))
        .collect();
    let have: std::collections::BTreeSet<String> = cluster.hosts[0]
        .links(corvid_net::names::VETH_PREFIX)
        .into_iter()
        .collect();
    let mut gap = String::new();
    for l in have.difference(&want) {
        gap += &format!("link {l} has no port; ");
    }
    for l in want.difference(&have) {
        gap += &format!("port with link {l} is not plugged; ");
    }
    for p in &bound {
        if !matches!(p.status, Status::Active | Status::Error) {
            gap += &format!("port {} is {:?}; ", p.id, p.status);
        }
    }
    (!gap.is_empty()).then_some(gap)
}

#[test]
fn an_agent_killed_while_plugging_and_unplugging_ends_equal_to_the_plan() {
    let mut cluster = Cluster::new("au");
    let (_net, subnet) = cluster.network("churn", "10.63.0.0/24", false);
    let conf = plugin_conf(&subnet);
    let mut delays = Delays::new();
    let mut pods: std::collections::VecDeque<(String, Ns)> = Default::default();
    for i in 0..4 {
        let pod = cluster.pod(&format!("s{i}"));
        let id = format!("seed{i}");
        let out = cluster
            .plugin(0, "ADD", &id, &pod, &conf)
            .wait_with_output()
            .unwrap();
        cni_result(&out);
        pods.push_back((id, pod));
    }
    const KILLS: usize = 32;
    let (mut busy, mut errors) = (0, 0);
    for i in 0..KILLS {
        let pod = cluster.pod(&format!("u{i}"));
        let id = format!("churn{i}");
        let mut add = cluster.plugin(0, "ADD", &id, &pod, &conf);
        let (old_id, old_pod) = pods.pop_front().unwrap();
        let mut del = cluster.plugin(0, "DEL", &old_id, &old_pod, &conf);
        std::thread::sleep(delays.micros(40_000));
        let running = add.try_wait().unwrap().is_none() || del.try_wait().unwrap().is_none();
        cluster.agents[0].as_mut().unwrap().kill9();
        cluster.start_agent(0);
        let deleted = del.wait_with_output().unwrap();
        assert!(deleted.status.success(), "DEL {old_id}: {deleted:?}");
        let added = add.wait_with_output().unwrap();
        if added.status.success() {
            let result = cni_result(&added);
            if let Some(fault) = pod_side_fault(&pod, &result) {
                panic!("ADD {id} succeeded with a broken pod side: {fault}");
            }
            pods.push_back((id, pod));
        } else {
            errors += 1;
        }
        busy += usize::from(running);
        let start = Instant::now();
        while let Some(gap) = plan_gap(&cluster) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "kill {i}: the host never matched the plan: {gap}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Only now: the pod's namespace would take a veth left behind with it.
        drop(old_pod);
    }
    eprintln!(
        "{KILLS} kills, {busy} with an ADD or DEL under way, {errors} ADDs refused, host equal to the plan after each"
    );
    assert!(
        busy >= KILLS / 2,
        "too few kills landed during a call: {busy}"
    );
}

/// The `corvid` plugin's ADD and DEL killed at 33 points each, spread over the
/// operation's fastest time, then DEL as a runtime sends it: the controller holds only
/// the live pod's port, the host only its veth, the pod no eth0; the live pod answers.
#[test]
fn corvid_plugin_calls_killed_at_any_point_are_recovered_by_del() {
    let cluster = Cluster::new("ap");
    let (_net, subnet) = cluster.network("kp", "10.65.0.0/24", false);
    let conf = plugin_conf(&subnet);
    let run = |op: &str, id: &str, pod: &Ns| {
        let out = cluster
            .plugin(0, op, id, pod, &conf)
            .wait_with_output()
            .unwrap();
        assert!(out.status.success(), "{op} {id}: {out:?}");
    };
    let live = cluster.pod("live");
    run("ADD", "live", &live);
    let settled = |what: &str, pod: &Ns| {
        let start = Instant::now();
        loop {
            let ports: Vec<String> = cluster.ports().into_iter().map(|p| p.device_id).collect();
            let links = cluster.hosts[0].links(corvid_net::names::VETH_PREFIX);
            let eth0 = pod.netlink().link_by_name("eth0").unwrap().is_some();
            if ports.len() == 1 && links.len() == 1 && !eth0 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{what}: ports of {ports:?}, host ends {links:?}, eth0 in the pod: {eth0}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            live.ping("10.65.0.1"),
            "{what}: the live pod lost its gateway"
        );
    };
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for i in 0..5 {
        let probe = cluster.pod(&format!("probe{i}"));
        let t = Instant::now();
        run("ADD", "probe", &probe);
        adds.push(t.elapsed());
        let t = Instant::now();
        run("DEL", "probe", &probe);
        dels.push(t.elapsed());
    }
    adds.sort();
    dels.sort();
    const POINTS: u32 = 33;
    let mut interrupted = [0u32; 2];
    for (k, op) in ["ADD", "DEL"].into_iter().enumerate() {
        // The fastest of the probes: spread over the median, the kill points of a call
        // that ran faster than that landed after it (14 of 33 DELs mid-call in one CI
        // run beside a release build).
        let op_time = [adds[0], dels[0]][k];
        for point in 0..POINTS {
            let pod = cluster.pod(&format!("{op}{point}"));
            let id = format!("{op}-{point}");
            if op == "DEL" {
                run("ADD", &id, &pod);
            }
            let mut child = cluster.plugin(0, op, &id, &pod, &conf);
            std::thread::sleep(op_time * 9 / 10 * point / POINTS);
            interrupted[k] += u32::from(child.try_wait().unwrap().is_none());
            let _ = child.kill();
            let _ = child.wait();
            run("DEL", &id, &pod);
            settled(&format!("{op} killed at point {point}"), &pod);
        }
    }
    eprintln!(
        "corvid plugin: ADD killed at {POINTS} points ({} mid-call), DEL at {POINTS} ({} mid-call), all recovered by DEL",
        interrupted[0], interrupted[1]
    );
    assert!(
        interrupted.iter().all(|&n| n >= POINTS / 2),
        "{interrupted:?}"
    );
}
