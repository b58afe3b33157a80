//! The distributed store failing under the controller: a real 3-member etcd cluster
//! (Debian's etcd, members on loopback ports, each in its own data directory) under two
//! controllers taking writes all along. A follower is killed, then the leader, then a
//! member is cut off (SIGSTOP): writes go on with quorum. Without quorum a write is
//! answered 503 in Neutron's shape within a bounded time and reads say they may be stale;
//! when quorum returns everything resumes by itself. No acknowledged write is lost, both
//! controllers end with the same view, and no two ports share an address or a MAC. An
//! agent follows one controller all along while pods are bound and unbound: at the end
//! its host holds exactly the ports bound to it, each ACTIVE and answering. Everything
//! runs in a private namespace of the test's (its loopback, its bridges).

#[path = "support/controller.rs"]
mod controller;
#[path = "support/ns.rs"]
mod ns;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use controller::{ControllerProcess, EtcdCluster};
use serde_json::{json, Value};

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build()
}

/// POSTs a port on `network` to `base`: its ID when acknowledged.
fn create_port(agent: &ureq::Agent, base: &str, network: &str) -> Result<String, String> {
    match agent
        .post(&format!("{base}/v2.0/ports"))
        .send_json(json!({"port": {"network_id": network}}))
    {
        Ok(r) => {
            let v: Value = r.into_json().map_err(|e| e.to_string())?;
            Ok(v["port"]["id"].as_str().unwrap_or_default().to_string())
        }
        Err(ureq::Error::Status(code, r)) => {
            Err(format!("{code} {}", r.into_string().unwrap_or_default()))
        }
        Err(e) => Err(e.to_string()),
    }
}

fn ports(base: &str) -> Vec<Value> {
    let v: Value = agent()
        .get(&format!("{base}/v2.0/ports"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    v["ports"].as_array().unwrap().clone()
}

/// Waits until `acked` has grown by `n`; answers how long that took.
fn grows(acked: &Mutex<Vec<String>>, n: usize, within: Duration, what: &str) -> Duration {
    let start = Instant::now();
    let from = acked.lock().unwrap().len();
    while acked.lock().unwrap().len() < from + n {
        assert!(
            start.elapsed() < within,
            "{what}: writes stopped ({from} acknowledged)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

/// The ports bound to h1 on `base`.
fn bound(base: &str) -> Vec<Value> {
    ports(base)
        .into_iter()
        .filter(|p| p["binding:host_id"] == "h1")
        .collect()
}

/// What differs between the host's plugged ports and the ports bound to it, both ways,
/// and any bound port not ACTIVE; None when they agree.
fn agent_gap(host: &ns::Ns, base: &str) -> Option<String> {
    let bound = bound(base);
    let want: BTreeSet<String> = bound
        .iter()
        .map(|p| corvid_net::names::host_veth(p["id"].as_str().unwrap()))
        .collect();
    let have: BTreeSet<String> = host
        .links(corvid_net::names::VETH_PREFIX)
        .into_iter()
        .collect();
    let mut gap = String::new();
    for l in have.difference(&want) {
        gap += &format!("link {l} has no port; ");
    }
    for l in want.difference(&have) {
        gap += &format!("link {l} is missing; ");
    }
    for p in &bound {
        if p["status"] != "ACTIVE" {
            gap += &format!("port {} is {}; ", p["id"], p["status"]);
        }
    }
    (!gap.is_empty()).then_some(gap)
}

#[test]
fn two_controllers_ride_out_member_failures_and_a_lost_quorum() {
    let tag = format!("cvt{}-ec", std::process::id());
    let host = ns::Ns::new(&tag, "host");
    host.ip("link set lo up");
    // An underlay address for the agent (this kernel has no dummy devices).
    host.ip("link add cvtund type veth peer name cvtunp");
    host.ip("addr add 10.250.0.1/24 dev cvtund");
    host.ip("link set cvtunp up");
    host.ip("link set cvtund up");
    // Members, controllers, the agent and every thread of the test inherit the namespace.
    host.open().run(|| ride_out(&host, &tag)).unwrap();
}

fn ride_out(host: &ns::Ns, tag: &str) {
    let mut etcd = EtcdCluster::start(3);
    let store = etcd.store();
    let a = ControllerProcess::start(&store, None);
    let b = ControllerProcess::start(&store, None);
    let network: Value = agent()
        .post(&format!("{}/v2.0/networks", a.url))
        .send_json(json!({"network": {"name": "cvt-etcd"}}))
        .unwrap()
        .into_json()
        .unwrap();
    let network = network["network"]["id"].as_str().unwrap().to_string();
    agent()
        .post(&format!("{}/v2.0/subnets", b.url))
        .send_json(
            json!({"subnet": {"network_id": network, "cidr": "10.77.0.0/16", "ip_version": 4}}),
        )
        .unwrap();

    // An agent following b, and pods bound on a (one every 300 ms, every fourth one
    // unbound again), all along.
    let _agent = ns::Proc(
        std::process::Command::new(env!("CARGO_BIN_EXE_corvid"))
            .args(["agent", "--host-id", "h1", "--controller", &b.url])
            .args(["--underlay-ip", "10.250.0.1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pods: Arc<Mutex<Vec<(ns::Ns, String)>>> = Arc::default();
    let (binds_acked, binds_refused) = (Arc::new(Mutex::new(0)), Arc::new(Mutex::new(0)));

    // Two writers, one per controller, all along.
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let failed = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = [a.url.clone(), b.url.clone()]
        .into_iter()
        .map(|base| {
            let (acked, failed, stop, network) =
                (acked.clone(), failed.clone(), stop.clone(), network.clone());
            std::thread::spawn(move || {
                let agent = agent();
                while !stop.load(Ordering::Relaxed) {
                    match create_port(&agent, &base, &network) {
                        Ok(id) => acked.lock().unwrap().push(id),
                        Err(e) => {
                            failed.lock().unwrap().push(e);
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })
        })
        .collect();
    let binder = {
        let (pods, stop, network, base, tag) = (
            pods.clone(),
            stop.clone(),
            network.clone(),
            a.url.clone(),
            tag.to_string(),
        );
        let (binds_acked, binds_refused) = (binds_acked.clone(), binds_refused.clone());
        std::thread::spawn(move || {
            let agent = agent();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let pod = ns::Ns::new(&tag, &format!("p{n}"));
                pod.ip("link set lo up");
                // A bind refused while quorum is lost may still have committed: its pod is
                // kept like the others, so the agent can plug it.
                let id = format!("{:08x}-0000-4000-8000-{n:012x}", std::process::id());
                let body = json!({"port": {"id": id, "network_id": network,
                    "binding:host_id": "h1", "veth_name": "eth0",
                    "network_ns": pod.path.display().to_string()}});
                match agent.post(&format!("{base}/v2.0/ports")).send_json(body) {
                    Ok(_) => *binds_acked.lock().unwrap() += 1,
                    Err(_) => *binds_refused.lock().unwrap() += 1,
                }
                pods.lock().unwrap().push((pod, id));
                if n % 4 == 0 {
                    let mut held = pods.lock().unwrap();
                    if !held.is_empty() {
                        let (pod, id) = held.remove(0);
                        // A delete refused now is sent again later.
                        let gone = agent.delete(&format!("{base}/v2.0/ports/{id}")).call();
                        if gone.is_err() {
                            held.push((pod, id));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    grows(&acked, 10, Duration::from_secs(20), "at the start");

    let leader = etcd.leader().expect("a leader");
    let follower = (leader + 1) % 3;
    etcd.kill9(follower);
    let t = grows(&acked, 10, Duration::from_secs(30), "a follower killed");
    println!("follower killed: 10 more writes in {t:?}");
    etcd.restart(follower);
    std::thread::sleep(Duration::from_secs(2));

    let leader = etcd.leader().expect("a leader");
    etcd.kill9(leader);
    let t = grows(&acked, 10, Duration::from_secs(40), "the leader killed");
    println!("leader killed: 10 more writes in {t:?}");
    etcd.restart(leader);
    std::thread::sleep(Duration::from_secs(2));

    let cut = etcd.leader().expect("a leader");
    etcd.freeze(cut, true);
    let t = grows(&acked, 10, Duration::from_secs(40), "the leader cut off");
    println!("leader cut off: 10 more writes in {t:?}");
    etcd.freeze(cut, false);
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    binder.join().unwrap();

    // Quorum lost: two of three members down.
    etcd.kill9(0);
    etcd.kill9(1);
    let start = Instant::now();
    let refused = create_port(&agent(), &a.url, &network).unwrap_err();
    let to_503 = start.elapsed();
    println!("no quorum: {refused} after {to_503:?}");
    assert!(
        refused.starts_with("503") && refused.contains("NeutronError"),
        "{refused}"
    );
    assert!(to_503 < Duration::from_secs(25), "503 took {to_503:?}");
    let read = agent()
        .get(&format!("{}/v2.0/networks", b.url))
        .call()
        .unwrap();
    assert_eq!(
        read.header("x-corvid-stale"),
        Some("true"),
        "a read without quorum"
    );

    // Quorum back: writes and the views resume by themselves.
    etcd.restart(0);
    etcd.restart(1);
    let start = Instant::now();
    loop {
        if create_port(&agent(), &b.url, &network).is_ok() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "writes did not resume"
        );
    }
    println!("quorum back: writes again after {:?}", start.elapsed());

    let start = Instant::now();
    let (seen_a, seen_b) = loop {
        let (pa, pb) = (ports(&a.url), ports(&b.url));
        let fresh = agent()
            .get(&format!("{}/v2.0/ports", a.url))
            .call()
            .unwrap();
        if pa == pb && fresh.header("x-corvid-stale") == Some("false") {
            break (pa, pb);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the views did not meet again"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(seen_a, seen_b);
    let ids: BTreeSet<&str> = seen_a.iter().map(|p| p["id"].as_str().unwrap()).collect();
    for id in acked.lock().unwrap().iter() {
        assert!(ids.contains(id.as_str()), "acknowledged port {id} is gone");
    }
    let addresses: Vec<&str> = seen_a
        .iter()
        .map(|p| p["fixed_ips"][0]["ip_address"].as_str().unwrap())
        .collect();
    let macs: Vec<&str> = seen_a
        .iter()
        .map(|p| p["mac_address"].as_str().unwrap())
        .collect();
    assert_eq!(
        addresses.iter().collect::<BTreeSet<_>>().len(),
        addresses.len(),
        "an address given twice"
    );
    assert_eq!(
        macs.iter().collect::<BTreeSet<_>>().len(),
        macs.len(),
        "a MAC given twice"
    );
    // A refused write may still have committed (its answer was lost with the member that
    // had it); such a port is whole, and there are never more of them than refusals.
    let (acked_n, refused_n) = (
        acked.lock().unwrap().len() + *binds_acked.lock().unwrap(),
        failed.lock().unwrap().len() + *binds_refused.lock().unwrap(),
    );
    assert!(
        seen_a.len() <= acked_n + refused_n + 1,
        "ports nobody asked for"
    );
    println!(
        "{} ports acknowledged, {} present, {} writes refused along the way",
        acked.lock().unwrap().len(),
        seen_a.len(),
        failed.lock().unwrap().len()
    );

    // The agent's host ends equal to what is bound to it, resumed by itself.
    let start = Instant::now();
    while let Some(gap) = agent_gap(host, &b.url) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the agent's host never matched the state: {gap}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let held = pods.lock().unwrap();
    for (pod, id) in held.iter() {
        if bound(&b.url).iter().any(|p| p["id"] == id.as_str()) {
            assert!(
                pod.ping("10.77.0.1"),
                "pod of port {id} cannot reach the gateway"
            );
        }
    }
    println!(
        "agent: {} pods bound ({} binds acknowledged, {} refused), host equal to the state after {:?}",
        bound(&b.url).len(),
        binds_acked.lock().unwrap(),
        binds_refused.lock().unwrap(),
        start.elapsed()
    );
}
