//! The controller killed with SIGKILL at random moments under 16 clients creating,
//! updating and deleting ports, on redb and on etcd. After each restart: every
//! acknowledged write is there, every acknowledged delete is gone, what was in flight
//! either happened whole or not at all, no two ports share an address or a MAC, the
//! store reserves exactly the MACs and addresses of its ports (read from its keys, which
//! is what a restarted controller recovers from), and at the end the subnet's free
//! addresses are exactly those no port holds. And the same kills while clients add and
//! remove a router's interfaces: a subnet is on the router whole (its gateway address on
//! one interface port) or not at all.

#[path = "support/controller.rs"]
mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corvid_api::{
    ApiError, Client, Network, NetworkCreate, Port, Router, RouterCreate, RouterInterface, Subnet,
    SubnetCreate, ROUTER_INTERFACE,
};
use serde_json::json;
use support::{redb_store, ControllerProcess, Etcd, Stored};

const CLIENTS: usize = 16;
const KILLS: usize = 32;
/// Ports a client keeps at most, so the /24 never fills before the final check.
const OWNED: usize = 8;

/// What one client knows of its own ports.
#[derive(Default)]
struct Ledger {
    /// Port ID to the name last acknowledged.
    owned: BTreeMap<String, String>,
    deleted: HashSet<String>,
    in_flight: Option<Op>,
    seq: u64,
}

#[derive(Clone, Debug)]
enum Op {
    Create { name: String },
    Update { id: String, name: String },
    Delete { id: String },
}

impl Op {
    fn kind(&self) -> &'static str {
        match self {
            Op::Create { .. } => "create",
            Op::Update { .. } => "update",
            Op::Delete { .. } => "delete",
        }
    }
}

/// Runs one client until the controller stops answering: a random mix of creates,
/// updates, deletes and lists. Anything but a transport failure fails the test.
fn run_client(c: Client, net: String, i: usize, ledger: Arc<Mutex<Ledger>>, mut rng: u64) {
    loop {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let op = {
            let mut l = ledger.lock().unwrap();
            l.seq += 1;
            let pick = l
                .owned
                .keys()
                .nth(rng as usize % l.owned.len().max(1))
                .cloned();
            let op = match (rng % 10, pick) {
                (_, None) => Op::Create {
                    name: format!("c{i}-{}", l.seq),
                },
                (0..=3, _) if l.owned.len() < OWNED => Op::Create {
                    name: format!("c{i}-{}", l.seq),
                },
                (0..=5, Some(id)) => Op::Update {
                    name: format!("c{i}-{}-u", l.seq),
                    id,
                },
                (_, Some(id)) => Op::Delete { id },
            };
            l.in_flight = Some(op.clone());
            op
        };
        let outcome: Result<(), ApiError> = match &op {
            Op::Create { name } => c
                .create::<Port>(json!({"network_id": net, "name": name}))
                .map(|p| {
                    ledger.lock().unwrap().owned.insert(p.id, name.clone());
                }),
            Op::Update { id, name } => c.update::<Port>(id, json!({"name": name})).map(|p| {
                assert_eq!(&p.name, name);
                ledger
                    .lock()
                    .unwrap()
                    .owned
                    .insert(id.clone(), name.clone());
            }),
            Op::Delete { id } => c.delete::<Port>(id).map(|()| {
                let mut l = ledger.lock().unwrap();
                l.owned.remove(id);
                l.deleted.insert(id.clone());
            }),
        };
        match outcome {
            Ok(()) => ledger.lock().unwrap().in_flight = None,
            Err(ApiError::Neutron { status, kind, .. }) => {
                panic!("client {i}: {op:?} refused: {status} {kind}")
            }
            Err(_) => return,
        }
        if rng.is_multiple_of(7) && c.list::<Port>(&[("network_id", &net)]).is_err() {
            return;
        }
    }
}

/// Checks the stored ports against every ledger and settles what was in flight; returns
/// the in-flight operations by kind and whether each took effect.
fn reconcile(
    c: &Client,
    net: &str,
    subnet: &Subnet,
    ledgers: &[Arc<Mutex<Ledger>>],
    round: usize,
) -> Vec<(&'static str, bool)> {
    let (ports, _) = c.list::<Port>(&[("network_id", net)]).unwrap();
    let mut stored: HashMap<String, Port> = ports.into_iter().map(|p| (p.id.clone(), p)).collect();
    let mut addrs = HashSet::new();
    let mut macs = HashSet::new();
    for p in stored.values() {
        assert_eq!(
            p.fixed_ips.len(),
            1,
            "round {round}: port {} has {:?}",
            p.id,
            p.fixed_ips
        );
        assert_eq!(p.fixed_ips[0].subnet_id, subnet.id);
        assert!(
            addrs.insert(p.fixed_ips[0].ip_address),
            "round {round}: address {} twice",
            p.fixed_ips[0].ip_address
        );
        assert!(
            macs.insert(p.mac_address.clone()),
            "round {round}: MAC {} twice",
            p.mac_address
        );
    }
    let mut settled = Vec::new();
    for (i, ledger) in ledgers.iter().enumerate() {
        let mut l = ledger.lock().unwrap();
        let in_flight = l.in_flight.take();
        if let Some(op) = &in_flight {
            let happened = match op {
                Op::Create { name } => {
                    let found: Vec<String> = stored
                        .values()
                        .filter(|p| &p.name == name)
                        .map(|p| p.id.clone())
                        .collect();
                    assert!(found.len() <= 1, "round {round}: {name} created twice");
                    if let Some(id) = found.first() {
                        l.owned.insert(id.clone(), name.clone());
                    }
                    !found.is_empty()
                }
                Op::Update { id, name } => {
                    let now = &stored[id].name;
                    assert!(
                        now == name || *now == l.owned[id],
                        "round {round}: port {id} is named {now}"
                    );
                    if now == name {
                        l.owned.insert(id.clone(), name.clone());
                    }
                    now == name
                }
                Op::Delete { id } => {
                    let gone = !stored.contains_key(id);
                    if gone {
                        l.owned.remove(id);
                        l.deleted.insert(id.clone());
                    }
                    gone
                }
            };
            settled.push((op.kind(), happened));
        }
        for (id, name) in &l.owned {
            let Some(p) = stored.remove(id) else {
                panic!("round {round}: client {i}'s acknowledged port {id} ({name}) is lost");
            };
            assert_eq!(&p.name, name, "round {round}: port {id}");
        }
        for id in &l.deleted {
            assert!(
                !stored.contains_key(id),
                "round {round}: deleted port {id} is back"
            );
        }
    }
    assert!(
        stored.is_empty(),
        "round {round}: ports nobody created: {:?}",
        stored.values().map(|p| &p.name).collect::<Vec<_>>()
    );
    settled
}

/// Kills the controller 20 to 320 ms into the clients' work (as `rng` picks), waits for
/// the clients to see it gone, and checks what the crash left in the store, which is what
/// the next controller recovers from: a reservation without its port would refuse that
/// MAC or address for good.
fn kill_at_random(
    ctl: &mut ControllerProcess,
    rng: &mut u64,
    clients: Vec<std::thread::JoinHandle<()>>,
    store: &str,
    when: &str,
) {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    std::thread::sleep(Duration::from_millis(20 + *rng % 300));
    ctl.kill9();
    for t in clients {
        t.join().expect("a client failed");
    }
    let mismatches = Stored::read(store).mismatches();
    assert!(mismatches.is_empty(), "{when}: {mismatches:#?}");
}

fn crash_matrix(store: &str, label: &str, seed: u64) {
    let mut ctl = ControllerProcess::start(store, None);
    let c = ctl.client();
    let net: Network = c.create(json!({"name": "crash"})).unwrap();
    let subnet: Subnet = c
        .create(
            json!({"network_id": net.id, "cidr": "10.44.0.0/24", "ip_version": 4,
            "gateway_ip": "10.44.0.1"}),
        )
        .unwrap();
    let ledgers: Vec<Arc<Mutex<Ledger>>> = (0..CLIENTS).map(|_| Arc::default()).collect();
    let mut rng = seed | 1;
    let mut by_kind: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    for round in 0..KILLS {
        let c = ctl.client();
        let clients: Vec<_> = ledgers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let (c, net, l) = (c.clone(), net.id.clone(), l.clone());
                let r = rng.wrapping_mul(i as u64 + 7) | 1;
                std::thread::spawn(move || run_client(c, net, i, l, r))
            })
            .collect();
        kill_at_random(
            &mut ctl,
            &mut rng,
            clients,
            store,
            &format!("{label} round {round}"),
        );
        let restarted = Instant::now();
        ctl.restart();
        let c = ctl.client();
        for (kind, happened) in reconcile(&c, &net.id, &subnet, &ledgers, round) {
            let e = by_kind.entry(kind).or_default();
            e.0 += 1;
            e.1 += u32::from(happened);
        }
        if round == 0 {
            eprintln!("{label}: restart and check took {:?}", restarted.elapsed());
        }
    }
    // Every address no port holds can still be allocated, and no more: an allocation
    // left without its port would show here as a missing address.
    let c = ctl.client();
    let (ports, _) = c.list::<Port>(&[("network_id", &net.id)]).unwrap();
    let mut filled = 0;
    loop {
        match c.create::<Port>(json!({"network_id": net.id})) {
            Ok(_) => filled += 1,
            Err(ApiError::Neutron { kind, .. }) => {
                assert_eq!(kind, "IpAddressGenerationFailure");
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        ports.len() + filled,
        253,
        "{label}: addresses lost to half-made ports"
    );
    println!(
        "{label}: {KILLS} kills under {CLIENTS} clients, {} ports at the end",
        ports.len()
    );
    for (kind, (n, happened)) in by_kind {
        println!("{label}: {kind:<6} in flight at a kill: {n:>4}, took effect: {happened:>4}, all consistent");
    }
}

#[test]
fn a_controller_on_redb_killed_under_sixteen_clients_keeps_exactly_what_it_acknowledged() {
    let (_dir, store) = redb_store();
    crash_matrix(&store, "redb", 0x9e37_79b9_7f4a_7c15);
}

#[test]
fn a_controller_on_etcd_killed_under_sixteen_clients_keeps_exactly_what_it_acknowledged() {
    let etcd = Etcd::start();
    crash_matrix(&format!("etcd:{}", etcd.url), "etcd", 0x2545_f491_4f6c_dd1d);
}

/// One subnet a client puts on the router and takes off again, as far as it knows.
#[derive(Default)]
struct Interface {
    /// On the router, as last acknowledged.
    attached: bool,
    /// Asked for and not answered when the controller died: on (true) or off.
    in_flight: Option<bool>,
}

/// Toggles `subnet` on `router` until the controller stops answering.
fn toggle_interface(c: Client, router: String, subnet: String, state: Arc<Mutex<Interface>>) {
    let which = RouterInterface {
        subnet_id: Some(subnet),
        port_id: None,
    };
    loop {
        let on = !state.lock().unwrap().attached;
        state.lock().unwrap().in_flight = Some(on);
        let r = if on {
            c.add_router_interface(&router, &which).map(drop)
        } else {
            c.remove_router_interface(&router, &which).map(drop)
        };
        match r {
            Ok(()) => {
                let mut s = state.lock().unwrap();
                s.attached = on;
                s.in_flight = None;
            }
            Err(ApiError::Transport(_)) => return,
            Err(e) => panic!("{} {which:?}: {e}", if on { "add" } else { "remove" }),
        }
    }
}

/// The router's interfaces after a restart: one port per subnet on it, holding the
/// subnet's gateway; each client's acknowledged state kept; what was in flight settled.
fn reconcile_interfaces(
    c: &Client,
    router: &str,
    subnets: &[Subnet],
    states: &[Arc<Mutex<Interface>>],
    round: usize,
) -> u32 {
    let (ports, _) = c.list::<Port>(&[("device_id", router)]).unwrap();
    let mut settled = 0;
    for (s, state) in subnets.iter().zip(states) {
        let on: Vec<&Port> = ports
            .iter()
            .filter(|p| p.fixed_ips.iter().any(|f| f.subnet_id == s.id))
            .collect();
        assert!(
            on.len() <= 1,
            "round {round}: subnet {} has {} interfaces",
            s.id,
            on.len()
        );
        for p in &on {
            assert_eq!(p.device_owner, ROUTER_INTERFACE, "round {round}");
            assert_eq!(
                Some(p.fixed_ips[0].ip_address),
                s.gateway_ip,
                "round {round}: an interface without the subnet's gateway"
            );
        }
        let mut st = state.lock().unwrap();
        let attached = !on.is_empty();
        match st.in_flight.take() {
            Some(_) => settled += 1,
            None => assert_eq!(
                attached, st.attached,
                "round {round}: subnet {}'s acknowledged state is lost",
                s.id
            ),
        }
        st.attached = attached;
    }
    settled
}

fn router_crash(store: &str, label: &str, seed: u64) {
    const SUBNETS: u8 = 8;
    const ROUNDS: usize = 12;
    let mut ctl = ControllerProcess::start(store, None);
    let c = ctl.client();
    let router: Router = c
        .create(RouterCreate {
            name: Some("crash".into()),
            ..Default::default()
        })
        .unwrap();
    let subnets: Vec<Subnet> = (0..SUBNETS)
        .map(|i| {
            let net: Network = c
                .create(NetworkCreate {
                    name: Some(format!("routed-{i}")),
                    ..Default::default()
                })
                .unwrap();
            c.create(SubnetCreate {
                network_id: net.id,
                cidr: Some(format!("10.45.{i}.0/24").parse().unwrap()),
                ..Default::default()
            })
            .unwrap()
        })
        .collect();
    let states: Vec<Arc<Mutex<Interface>>> = subnets.iter().map(|_| Arc::default()).collect();
    let mut rng = seed | 1;
    let mut settled = 0;
    for round in 0..ROUNDS {
        let c = ctl.client();
        let clients: Vec<_> = subnets
            .iter()
            .zip(&states)
            .map(|(s, st)| {
                let (c, r, s, st) = (c.clone(), router.id.clone(), s.id.clone(), st.clone());
                std::thread::spawn(move || toggle_interface(c, r, s, st))
            })
            .collect();
        kill_at_random(
            &mut ctl,
            &mut rng,
            clients,
            store,
            &format!("{label} round {round}"),
        );
        ctl.restart();
        settled += reconcile_interfaces(&ctl.client(), &router.id, &subnets, &states, round);
    }
    // Whatever the kills left, the router can be emptied and deleted, leaving no port.
    let c = ctl.client();
    for (s, st) in subnets.iter().zip(&states) {
        if st.lock().unwrap().attached {
            let which = RouterInterface {
                subnet_id: Some(s.id.clone()),
                port_id: None,
            };
            c.remove_router_interface(&router.id, &which).unwrap();
        }
    }
    c.delete::<Router>(&router.id).unwrap();
    let (left, _) = c.list::<Port>(&[]).unwrap();
    assert!(left.is_empty(), "{label}: ports left: {left:?}");
    println!(
        "{label}: {ROUNDS} kills under {SUBNETS} interface clients, {settled} in flight, all whole"
    );
}

#[test]
fn a_controller_killed_while_router_interfaces_come_and_go_leaves_none_half_made() {
    let (_dir, store) = redb_store();
    router_crash(&store, "redb", 0x51_7cc1_b727_220a);
    let etcd = Etcd::start();
    router_crash(&format!("etcd:{}", etcd.url), "etcd", 0x94d0_49bb_1331_11eb);
}
