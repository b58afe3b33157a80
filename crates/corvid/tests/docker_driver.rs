//! The Docker driver through its unix socket, against a real controller, inside a private
//! host namespace (as root): the exact call sequence a real Docker 20.10 sent
//! (`tests/data/docker-remote-driver-trace-2.jsonl`, two networks, two containers,
//! connect/disconnect, removal) replayed with corvid's own pool IDs and addresses, then
//! bad input. Nothing may be left in the controller (not even a reserved MAC or address,
//! read from its store) or on the host.

#[path = "support/ns.rs"]
mod ns;

#[path = "support/controller.rs"]
mod controller;

#[path = "support/docker.rs"]
mod docker;

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use controller::Stored;
use corvid_api::{Client, Network, Port, Status, Subnet};
use docker::{post, try_post};
use ns::{wait_until, Ns, Proc};
use serde_json::{json, Value};

/// Replaces every string equal to a key of `map` (recursively).
fn substitute(v: &mut Value, map: &HashMap<String, String>) {
    match v {
        Value::String(s) => {
            if let Some(new) = map.get(s.as_str()) {
                *s = new.clone();
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| substitute(x, map)),
        Value::Object(o) => o.values_mut().for_each(|x| substitute(x, map)),
        _ => {}
    }
}

/// Learns what the trace's answer meant in corvid's answer: pool IDs and addresses.
fn learn(trace: &Value, ours: &Value, map: &mut HashMap<String, String>) {
    for key in ["PoolID", "Pool", "Address"] {
        if let (Some(t), Some(o)) = (trace[key].as_str(), ours[key].as_str()) {
            map.insert(t.to_string(), o.to_string());
            if let (Some((t_ip, _)), Some((o_ip, _))) = (t.split_once('/'), o.split_once('/')) {
                map.insert(t_ip.to_string(), o_ip.to_string());
            }
        }
    }
}

struct Setup {
    host: Ns,
    socket: PathBuf,
    client_url: String,
    store: String,
    controller: Proc,
    plugin: Proc,
    _dir: tempfile::TempDir,
}

impl Setup {
    fn new(name: &str) -> Setup {
        let host = Ns::new(&format!("cvt{}{name}", std::process::id()), "host");
        host.ip("link set lo up");
        let dir = tempfile::Builder::new()
            .prefix("cvt-docker")
            .tempdir()
            .unwrap();
        let store = format!("redb:{}", dir.path().join("state.redb").display());
        let socket = dir.path().join("corvid.sock");
        let s = Setup {
            controller: start_controller(&host, &store),
            plugin: start_plugin(&host, &socket),
            host,
            socket,
            client_url: "http://127.0.0.1:9696".into(),
            store,
            _dir: dir,
        };
        s.wait_for_controller();
        s.wait_for_plugin();
        s
    }

    fn wait_for_controller(&self) {
        wait_until("the controller", Duration::from_secs(20), || {
            self.api(|c| c.request("GET", "/", None)).is_ok()
        });
    }

    fn wait_for_plugin(&self) {
        wait_until("the plugin socket", Duration::from_secs(20), || {
            UnixStream::connect(&self.socket).is_ok()
        });
    }

    /// SIGKILL to the driver, and a new one on the same socket.
    fn restart_plugin(&mut self) {
        self.plugin.kill9();
        self.plugin = start_plugin(&self.host, &self.socket);
        self.wait_for_plugin();
    }

    fn api<T>(&self, f: impl FnOnce(&Client) -> T) -> T {
        let c = Client::new(&self.client_url);
        self.host.open().run(|| f(&c)).unwrap()
    }

    /// Every key the controller's store holds but the cluster's identity: its objects
    /// and every reservation of a MAC or an address, which the API does not show. redb
    /// is read by one process at a time, so the controller stops for the reading and
    /// starts again.
    fn leftovers(&mut self) -> Vec<String> {
        self.controller.kill9();
        let stored = Stored::read(&self.store);
        self.controller = start_controller(&self.host, &self.store);
        self.wait_for_controller();
        // The project's default security group stays, as in Neutron: it was made for
        // the project, not for one port.
        let kept = ["security_groups", "security_group_rules"]
            .map(|c| corvid_controller::keys::resource(c, ""));
        stored
            .keys
            .into_iter()
            .filter(|k| k != corvid_controller::keys::CLUSTER_ID)
            .filter(|k| !kept.iter().any(|p| k.starts_with(p.as_str())))
            .collect()
    }
}

fn start_controller(host: &Ns, store: &str) -> Proc {
    Proc(
        host.command(env!("CARGO_BIN_EXE_corvid"))
            .args(["controller", "--listen", "127.0.0.1:9696", "--store", store])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn start_plugin(host: &Ns, socket: &std::path::Path) -> Proc {
    let _ = std::fs::remove_file(socket);
    Proc(
        host.command(env!("CARGO_BIN_EXE_corvid"))
            .args(["docker-plugin", "--host-id", "h1", "--socket"])
            .arg(socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

#[test]
fn dockers_own_call_sequence_replays_and_leaves_nothing() {
    let mut s = Setup::new("dr");
    let trace = include_str!("data/docker-remote-driver-trace-2.jsonl");
    let mut map = HashMap::new();
    let mut joined = 0;
    for line in trace.lines() {
        let call: Value = serde_json::from_str(line).unwrap();
        let method = call["path"].as_str().unwrap().trim_start_matches('/');
        let mut req = call["req"].clone();
        substitute(&mut req, &map);
        let (status, answer) = post(&s.socket, method, &req.to_string());
        // The first three releases name a network of an earlier Docker session that this
        // controller never saw: a stateless driver must let them pass.
        assert_eq!(status, 200, "{method} {req} -> {answer}");
        learn(&call["resp"], &answer, &mut map);
        match method {
            "IpamDriver.RequestAddress" => {
                let a = answer["Address"].as_str().unwrap();
                assert!(a.contains('/'), "addresses carry a prefix: {a}");
            }
            "NetworkDriver.CreateEndpoint" => {
                let mac = answer["Interface"]["MacAddress"].as_str().unwrap();
                assert!(mac.starts_with("fa:16:3e"), "{mac}");
            }
            "NetworkDriver.Join" => {
                joined += 1;
                let src = answer["InterfaceName"]["SrcName"].as_str().unwrap();
                assert_eq!(answer["InterfaceName"]["DstPrefix"], "eth");
                assert!(answer["Gateway"].as_str().unwrap().starts_with("10.213."));
                let mut nl = s.host.netlink();
                let link = nl
                    .link_by_name(src)
                    .unwrap()
                    .expect("the container end exists");
                let host_end = nl.link_by_index(link.peer_index.unwrap()).unwrap().unwrap();
                let bridge = nl.link_by_index(host_end.master.unwrap()).unwrap().unwrap();
                assert!(bridge.name.starts_with("cvb"), "{}", bridge.name);
                let port = s.api(|c| {
                    c.list::<Port>(&[("tags", req["EndpointID"].as_str().unwrap())])
                        .unwrap()
                        .0
                        .remove(0)
                });
                assert_eq!(port.mac_address, link.mac);
                assert_eq!(port.status, Status::Active);
                assert_eq!(port.binding_host_id, "h1");
            }
            _ => {}
        }
    }
    assert_eq!(joined, 3);
    assert_eq!(
        s.leftovers(),
        Vec::<String>::new(),
        "the controller holds nothing after the removals"
    );
    assert!(s.host.links("cvc").is_empty() && s.host.links("cvp").is_empty());
}

#[test]
fn bad_input_is_an_err_and_changes_nothing() {
    let mut s = Setup::new("db");
    let err = |method: &str, body: &str| {
        let (status, v) = post(&s.socket, method, body);
        assert_ne!(status, 200, "{method} {body} -> {v}");
        v["Err"].as_str().unwrap().to_string()
    };
    assert!(err("NetworkDriver.CreateNetwork", "{not json").contains("malformed JSON"));
    assert!(err("NetworkDriver.CreateNetwork", "[1]").contains("JSON object"));
    assert!(err("NetworkDriver.Nothing", "{}").contains("unknown method"));
    let net = "0cea0df0253027f487de2501d72190ee94c90cbe4599d65fe58ecb2a13a47f90";
    let ep = "cb33feb4acb5db0e7bc8e2e31e1ffd9f739b6e77e90d53b64ac04e644f32a6f5";
    let ids = json!({"NetworkID": net, "EndpointID": ep, "SandboxKey": "/var/run/docker/netns/x"});
    assert!(err("NetworkDriver.CreateEndpoint", &ids.to_string()).contains("unknown network"));
    assert!(err("NetworkDriver.Join", &ids.to_string()).contains("unknown network"));
    assert!(err("NetworkDriver.CreateNetwork", r#"{"NetworkID": "a/b"}"#).contains("Docker ID"));
    assert!(err("IpamDriver.RequestAddress", r#"{"PoolID": "nope"}"#).contains("unknown pool"));

    // Empty Pool requests get distinct pools every time.
    let empty = json!({"AddressSpace": "corvid-local", "Pool": "", "SubPool": "", "Options": {}, "V6": false});
    let (_, p1) = post(&s.socket, "IpamDriver.RequestPool", &empty.to_string());
    let (_, p2) = post(&s.socket, "IpamDriver.RequestPool", &empty.to_string());
    assert_ne!(p1["Pool"], p2["Pool"], "{p1} {p2}");
    // A pool that overlaps one in use is refused; the same pool, not yet used by a
    // network, is the one a killed driver left, and is given again.
    let wider = p1["Pool"].as_str().unwrap().replace("/24", "/23");
    let over = json!({"Pool": wider, "V6": false});
    assert!(err("IpamDriver.RequestPool", &over.to_string()).contains("overlaps"));
    let same = json!({"Pool": p1["Pool"], "V6": false});
    let (_, again) = post(&s.socket, "IpamDriver.RequestPool", &same.to_string());
    assert_eq!(again["PoolID"], p1["PoolID"]);

    // A /30: the gateway and one address, then exhaustion; an address outside is refused.
    let (_, pool) = post(
        &s.socket,
        "IpamDriver.RequestPool",
        r#"{"Pool": "10.214.0.0/30", "V6": false}"#,
    );
    let pool_id = pool["PoolID"].as_str().unwrap();
    let (_, gw) = post(
        &s.socket,
        "IpamDriver.RequestAddress",
        &json!({"PoolID": pool_id, "Address": "", "Options": {"RequestAddressType": "com.docker.network.gateway"}}).to_string(),
    );
    assert_eq!(gw["Address"], "10.214.0.1/30");
    let create = json!({"NetworkID": net, "Options": {"com.docker.network.generic": {}},
        "IPv4Data": [{"AddressSpace": "corvid-local", "Gateway": "10.214.0.1/30", "Pool": "10.214.0.0/30"}], "IPv6Data": []});
    assert_eq!(
        post(
            &s.socket,
            "NetworkDriver.CreateNetwork",
            &create.to_string()
        )
        .0,
        200
    );
    let addr = json!({"PoolID": pool_id, "Address": "", "Options": null}).to_string();
    let (status, a) = post(&s.socket, "IpamDriver.RequestAddress", &addr);
    assert_eq!(
        (status, a["Address"].as_str()),
        (200, Some("10.214.0.2/30"))
    );
    assert!(err("IpamDriver.RequestAddress", &addr).contains("IpAddressGenerationFailure"));
    let outside = json!({"PoolID": pool_id, "Address": "10.9.9.9"}).to_string();
    assert!(err("IpamDriver.RequestAddress", &outside).contains("outside the pool"));
    // Join of an endpoint never created: an error, and no interface made.
    assert!(err("NetworkDriver.Join", &ids.to_string()).contains("unknown endpoint"));
    assert!(s.host.links("cvc").is_empty() && s.host.links("cvp").is_empty());
    let ports = s.api(|c| c.list::<Port>(&[]).unwrap().0);
    assert_eq!(ports.len(), 1, "only the one address handed out");

    // Adopting: an unknown subnet, a --subnet that is not the subnet's, and a network
    // whose subnets are not Docker's pools are refused, and nothing is tagged.
    let subnet = s.api(|c| c.list::<Subnet>(&[]).unwrap().0.remove(0));
    let adopt = |pool: &str, subnet: &str| {
        json!({"Pool": pool, "V6": false, "Options": {"corvid.subnet.id": subnet}}).to_string()
    };
    let unknown = "00000000-0000-0000-0000-000000000000";
    assert!(err("IpamDriver.RequestPool", &adopt("", unknown)).contains("no such corvid subnet"));
    assert!(err(
        "IpamDriver.RequestPool",
        &adopt("10.215.0.0/24", &subnet.id)
    )
    .contains("is not subnet"));
    let (status, same) = post(&s.socket, "IpamDriver.RequestPool", &adopt("", &subnet.id));
    assert_eq!(
        (status, same["Pool"].as_str()),
        (200, Some("10.214.0.0/30"))
    );
    let other = "1cea0df0253027f487de2501d72190ee94c90cbe4599d65fe58ecb2a13a47f90";
    let wrong = json!({"NetworkID": other,
        "Options": {"com.docker.network.generic": {"corvid.net.id": subnet.network_id}},
        "IPv4Data": [{"Pool": "10.215.0.0/24"}]});
    assert!(err("NetworkDriver.CreateNetwork", &wrong.to_string()).contains("is not a subnet"));
    let untouched = s.api(|c| c.get::<Network>(&subnet.network_id).unwrap());
    assert!(!untouched
        .tags
        .iter()
        .any(|t| t == other || t == "docker-adopted"));

    // The controller gone: every call that needs it says so.
    s.controller.kill9();
    assert!(err("IpamDriver.RequestPool", &empty.to_string()).contains("corvid controller"));
    assert!(err("NetworkDriver.Join", &ids.to_string()).contains("corvid controller"));
    assert!(s.host.links("cvc").is_empty() && s.host.links("cvp").is_empty());
}

#[test]
fn a_join_repairs_what_an_interrupted_one_left() {
    let s = Setup::new("dj");
    let call = |method: &str, body: Value| {
        let (status, v) = post(&s.socket, method, &body.to_string());
        assert_eq!(status, 200, "{method} {body} -> {v}");
        v
    };
    let pool = call(
        "IpamDriver.RequestPool",
        json!({"Pool": "10.216.0.0/24", "V6": false}),
    );
    let pool_id = pool["PoolID"].as_str().unwrap();
    let gw = json!({"PoolID": pool_id, "Address": "",
        "Options": {"RequestAddressType": "com.docker.network.gateway"}});
    call("IpamDriver.RequestAddress", gw);
    let net = "2cea0df0253027f487de2501d72190ee94c90cbe4599d65fe58ecb2a13a47f90";
    let ep = "db33feb4acb5db0e7bc8e2e31e1ffd9f739b6e77e90d53b64ac04e644f32a6f5";
    call(
        "NetworkDriver.CreateNetwork",
        json!({"NetworkID": net, "Options": {"com.docker.network.generic": {}},
            "IPv4Data": [{"Gateway": "10.216.0.1/24", "Pool": "10.216.0.0/24"}], "IPv6Data": []}),
    );
    let addr = call(
        "IpamDriver.RequestAddress",
        json!({"PoolID": pool_id, "Address": "", "Options": null}),
    );
    let created = call(
        "NetworkDriver.CreateEndpoint",
        json!({"NetworkID": net, "EndpointID": ep,
            "Interface": {"Address": addr["Address"], "AddressIPv6": "", "MacAddress": ""}}),
    );
    let mac = created["Interface"]["MacAddress"]
        .as_str()
        .unwrap()
        .to_string();
    let join = json!({"NetworkID": net, "EndpointID": ep, "SandboxKey": "/var/run/docker/netns/x"});
    // The pair Docker gets: its end with the endpoint's MAC, up, the host end on the bridge.
    let whole = |what: &str| {
        let src = call("NetworkDriver.Join", join.clone())["InterfaceName"]["SrcName"]
            .as_str()
            .unwrap()
            .to_string();
        let mut nl = s.host.netlink();
        let end = nl.link_by_name(&src).unwrap().expect(what);
        assert_eq!(end.mac, mac, "{what}");
        assert!(end.up, "{what}");
        let host_end = nl.link_by_index(end.peer_index.unwrap()).unwrap().unwrap();
        let bridge = nl.link_by_index(host_end.master.expect(what)).unwrap();
        assert!(bridge.unwrap().name.starts_with("cvb"), "{what}");
        assert_eq!(s.host.links("cvp").len(), 1, "{what}");
        (src, host_end.name)
    };
    let (src, host_end) = whole("the first Join");
    // Interrupted states: the host end off the bridge; Docker's end with another MAC and
    // down; Docker's end gone (kept in a sandbox) with the host end left.
    s.host.ip(&format!("link set {host_end} nomaster"));
    whole("after the host end left the bridge");
    s.host.ip(&format!("link set {src} down"));
    s.host
        .ip(&format!("link set {src} address 02:42:00:00:00:99"));
    whole("after the MAC changed");
    let sandbox = Ns::new(&format!("cvt{}dj", std::process::id()), "sandbox");
    s.host
        .ip(&format!("link set {src} netns {}", sandbox.name()));
    whole("after the end went into a sandbox");
    assert!(
        sandbox.links(&src).is_empty(),
        "the old pair went as a whole"
    );

    call(
        "NetworkDriver.Leave",
        json!({"NetworkID": net, "EndpointID": ep}),
    );
    call(
        "NetworkDriver.DeleteEndpoint",
        json!({"NetworkID": net, "EndpointID": ep}),
    );
    assert!(s.host.links("cvc").is_empty() && s.host.links("cvp").is_empty());
}

/// The calls of one container's life on a network of its own, as Docker sends them; each
/// fills in what earlier answers gave (pool ID, addresses).
const LIFECYCLE: [&str; 12] = [
    "IpamDriver.RequestPool",
    "IpamDriver.RequestAddress gateway",
    "NetworkDriver.CreateNetwork",
    "IpamDriver.RequestAddress",
    "NetworkDriver.CreateEndpoint",
    "NetworkDriver.Join",
    "NetworkDriver.Leave",
    "NetworkDriver.DeleteEndpoint",
    "IpamDriver.ReleaseAddress",
    "IpamDriver.ReleaseAddress gateway",
    "NetworkDriver.DeleteNetwork",
    "IpamDriver.ReleasePool",
];

/// The request body of lifecycle step `step`, from what the earlier answers gave.
fn lifecycle_body(step: &str, round: usize, learned: &HashMap<&str, String>) -> Value {
    let net = format!("{round:064x}");
    let ep = format!("e{round:063x}");
    let pool = format!("10.230.{round}.0/24");
    let get = |k: &str| learned.get(k).cloned().unwrap_or_default();
    match step {
        "IpamDriver.RequestPool" => json!({"Pool": pool, "V6": false, "Options": {}}),
        "IpamDriver.RequestAddress gateway" => json!({"PoolID": get("pool"), "Address": "",
            "Options": {"RequestAddressType": "com.docker.network.gateway"}}),
        "NetworkDriver.CreateNetwork" => json!({"NetworkID": net,
            "Options": {"com.docker.network.generic": {}},
            "IPv4Data": [{"Gateway": get("gateway"), "Pool": pool}], "IPv6Data": []}),
        "IpamDriver.RequestAddress" => {
            json!({"PoolID": get("pool"), "Address": "", "Options": null})
        }
        "NetworkDriver.CreateEndpoint" => json!({"NetworkID": net, "EndpointID": ep,
            "Interface": {"Address": get("address"), "AddressIPv6": "", "MacAddress": ""}}),
        "NetworkDriver.Join" => json!({"NetworkID": net, "EndpointID": ep,
            "SandboxKey": "/var/run/docker/netns/x"}),
        "NetworkDriver.Leave" | "NetworkDriver.DeleteEndpoint" => {
            json!({"NetworkID": net, "EndpointID": ep})
        }
        "IpamDriver.ReleaseAddress" => json!({"PoolID": get("pool"), "Address": get("address")}),
        "IpamDriver.ReleaseAddress gateway" => {
            json!({"PoolID": get("pool"), "Address": get("gateway")})
        }
        "NetworkDriver.DeleteNetwork" => json!({"NetworkID": net}),
        "IpamDriver.ReleasePool" => json!({"PoolID": get("pool")}),
        _ => unreachable!("{step}"),
    }
}

/// Sends lifecycle step `step`, which must succeed (`context` says what came before, for
/// the failure message), and keeps what its answer gives the later steps.
fn lifecycle_call(
    s: &Setup,
    step: &'static str,
    round: usize,
    learned: &mut HashMap<&'static str, String>,
    context: &str,
) -> Value {
    let method = step.split(' ').next().unwrap();
    let body = lifecycle_body(step, round, learned).to_string();
    let (status, answer) = post(&s.socket, method, &body);
    assert_eq!(status, 200, "round {round}, {step} {context}: {answer}");
    let keep = match step {
        "IpamDriver.RequestPool" => Some(("pool", "PoolID")),
        "IpamDriver.RequestAddress gateway" => Some(("gateway", "Address")),
        "IpamDriver.RequestAddress" => Some(("address", "Address")),
        _ => None,
    };
    if let Some((name, field)) = keep {
        learned.insert(name, answer[field].as_str().unwrap().to_string());
    }
    answer
}

/// Leave unplugs the endpoint: its veth pair is gone before DeleteEndpoint, wherever
/// Docker left the container's end: given back to the host under its old name (as Docker
/// does when it takes a sandbox down) or still in the sandbox. DeleteEndpoint may never
/// come (a daemon that dies in between), and a pair left behind would stay on the bridge.
#[test]
fn leave_removes_the_pair_before_delete_endpoint() {
    let mut s = Setup::new("dl");
    let sandbox = Ns::new(&format!("cvt{}dl", std::process::id()), "sandbox");
    for (round, given_back) in [(0, true), (1, false)] {
        let mut learned = HashMap::new();
        for step in LIFECYCLE {
            let answer = lifecycle_call(&s, step, round, &mut learned, "");
            match step {
                "NetworkDriver.Join" => {
                    // What Docker does with the end Join names: into the sandbox as eth0.
                    let src = answer["InterfaceName"]["SrcName"].as_str().unwrap();
                    s.host
                        .ip(&format!("link set {src} netns {}", sandbox.name()));
                    sandbox.ip(&format!("link set {src} name eth0"));
                    if given_back {
                        sandbox.ip(&format!("link set eth0 name {src}"));
                        sandbox.ip(&format!("link set {src} netns {}", s.host.name()));
                    }
                }
                "NetworkDriver.Leave" => {
                    for (ns, prefix) in [(&s.host, "cvp"), (&s.host, "cvc"), (&sandbox, "eth")] {
                        assert_eq!(
                            ns.links(prefix),
                            Vec::<String>::new(),
                            "round {round} (end given back: {given_back}): after Leave"
                        );
                    }
                }
                _ => {}
            }
        }
        assert_eq!(s.leftovers(), Vec::<String>::new(), "round {round}");
    }
}

/// The driver killed in the middle of each call of a container's life, at three moments
/// per call, then restarted; the call is sent again, as Docker's user would run the
/// command again, and the life goes on. After each life the controller holds nothing and
/// the host no link of the driver's.
#[test]
fn a_driver_killed_mid_call_converges_with_the_next_call() {
    let mut s = Setup::new("dk");
    const DELAYS_US: [u64; 3] = [0, 1_500, 4_000];
    let mut interrupted = 0;
    let mut rounds = 0;
    for (round, (victim, delay)) in (0..LIFECYCLE.len())
        .flat_map(|v| DELAYS_US.iter().map(move |d| (v, *d)))
        .enumerate()
    {
        let mut learned = HashMap::new();
        for (i, step) in LIFECYCLE.iter().enumerate() {
            let method = step.split(' ').next().unwrap();
            let body = lifecycle_body(step, round, &learned).to_string();
            if i == victim {
                let (socket, b, m) = (s.socket.clone(), body.clone(), method.to_string());
                let call = std::thread::spawn(move || try_post(&socket, &m, &b));
                std::thread::sleep(Duration::from_micros(delay));
                let finished = call.is_finished();
                s.restart_plugin();
                let answered = call.join().unwrap();
                interrupted += usize::from(!finished && answered.is_none_or(|(st, _)| st != 200));
            }
            let after = format!("after a kill in {}", LIFECYCLE[victim]);
            lifecycle_call(&s, step, round, &mut learned, &after);
        }
        assert_eq!(
            s.leftovers(),
            Vec::<String>::new(),
            "round {round} (kill in {}): the controller keeps something",
            LIFECYCLE[victim]
        );
        for prefix in ["cvp", "cvc", "cvb"] {
            assert_eq!(
                s.host.links(prefix),
                Vec::<String>::new(),
                "round {round} (kill in {})",
                LIFECYCLE[victim]
            );
        }
        rounds += 1;
    }
    eprintln!("{rounds} kills, {interrupted} of them before the call was answered");
    assert!(
        interrupted >= rounds / 3,
        "too few kills landed inside a call: {interrupted}"
    );
}

/// A Join plugs with the MTU the host's underlay carries once encapsulated, as the agent
/// makes the network's devices: the network's 1450 before the host is registered (or
/// over an IPv4 underlay of 1500), 1430 once the agent has registered an IPv6 underlay
/// address on a 1500 device, whose VXLAN headers are 70 bytes.
#[test]
fn a_join_takes_the_mtu_the_hosts_underlay_carries() {
    let s = Setup::new("dm");
    s.host.ip("link add cvtul0 type veth peer name cvtul1");
    s.host.ip("link set cvtul0 mtu 1500 up");
    s.host.ip("addr add 10.98.0.1/24 dev cvtul0");
    s.host.ip("addr add fd98::1/64 dev cvtul0 nodad");
    let register = |underlay: &str| {
        s.api(|c| c.register_host("h1", underlay.parse().unwrap()))
            .unwrap();
    };
    let mut nl = s.host.netlink();
    let mut joined_mtu = |round: usize| {
        let mut learned = HashMap::new();
        let mut mtus = None;
        for step in LIFECYCLE {
            let answer = lifecycle_call(&s, step, round, &mut learned, "");
            if step == "NetworkDriver.Join" {
                let src = answer["InterfaceName"]["SrcName"].as_str().unwrap();
                let end = nl.link_by_name(src).unwrap().unwrap();
                let host_end = nl.link_by_index(end.peer_index.unwrap()).unwrap().unwrap();
                let bridge = nl.link_by_index(host_end.master.unwrap()).unwrap().unwrap();
                mtus = Some((end.mtu, host_end.mtu, bridge.mtu));
            }
        }
        mtus.unwrap()
    };
    assert_eq!(joined_mtu(0), (1450, 1450, 1450), "no host registered");
    register("10.98.0.1");
    assert_eq!(joined_mtu(1), (1450, 1450, 1450), "an IPv4 underlay");
    register("fd98::1");
    assert_eq!(joined_mtu(2), (1430, 1430, 1430), "an IPv6 underlay");
}
