//! Property-based fuzzing of the Docker driver's request bodies, as root: any method of
//! the network and IPAM protocols with any body, shaped like libnetwork's or not, against
//! a real controller (redb in a temporary directory), the driver working inside a private
//! `cvt` namespace. Property: an answer, or an error with a message (the protocol's
//! `{"Err": ...}`), never a panic; a refused call leaves the controller and the namespace
//! as they were.
//!
//! 1,000 cases by default; `CORVID_FUZZ_CASES` for a longer run.

#[path = "../../corvid-controller/tests/support/in_process.rs"]
mod in_process;

#[path = "../../corvid/tests/support/fuzz.rs"]
#[macro_use]
mod fuzz;

use std::path::PathBuf;

use corvid_docker::{Config, Driver};
use corvid_net::{Netlink, Netns};
use in_process::InProcess;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn config() -> ProptestConfig {
    fuzz_config!(1000)
}

/// A controller, the driver, and the namespace they both work in; stopped and removed on
/// drop.
struct World {
    driver: Driver,
    controller: String,
    netns: Netns,
    path: PathBuf,
    _running: InProcess,
}

impl World {
    fn start() -> World {
        // Everything, the controller too, lives in the namespace: the driver reaches the
        // controller on its loopback.
        let name = format!("cvt{}-dfz", std::process::id());
        let path = Netns::create_named(&name).expect("a namespace (run as root)");
        let netns = Netns::open(&path).unwrap();
        let up = std::process::Command::new("ip")
            .args(["-n", &name, "link", "set", "lo", "up"])
            .status()
            .unwrap();
        assert!(up.success());
        let running = netns.run(InProcess::start).unwrap();
        let controller = running.url.clone();
        let driver = Driver::new(Config {
            controller: controller.clone(),
            credentials: Default::default(),
            host_id: "fuzz".into(),
            scope: "local".into(),
            default_range: "10.66.0.0/16".parse().unwrap(),
            default_prefix: 24,
            dst_prefix: "eth".into(),
        })
        .unwrap();
        World {
            driver,
            controller,
            netns,
            path,
            _running: running,
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = Netns::delete_path(&self.path);
    }
}

const METHODS: [&str; 22] = [
    "Plugin.Activate",
    "NetworkDriver.GetCapabilities",
    "NetworkDriver.CreateNetwork",
    "NetworkDriver.DeleteNetwork",
    "NetworkDriver.CreateEndpoint",
    "NetworkDriver.DeleteEndpoint",
    "NetworkDriver.EndpointOperInfo",
    "NetworkDriver.Join",
    "NetworkDriver.Leave",
    "NetworkDriver.AllocateNetwork",
    "NetworkDriver.FreeNetwork",
    "NetworkDriver.DiscoverNew",
    "NetworkDriver.ProgramExternalConnectivity",
    "NetworkDriver.RevokeExternalConnectivity",
    "IpamDriver.GetCapabilities",
    "IpamDriver.GetDefaultAddressSpaces",
    "IpamDriver.RequestPool",
    "IpamDriver.ReleasePool",
    "IpamDriver.RequestAddress",
    "IpamDriver.ReleaseAddress",
    "NetworkDriver.Nope",
    "",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "NetworkID", "EndpointID", "PoolID", "Address", "Pool", "SubPool", "Options",
            "IPv4Data", "IPv6Data", "Interface", "SandboxKey", "AddressSpace", "V6",
            "AddressIPv6", "MacAddress", "Gateway", "AuxAddresses",
            "com.docker.network.generic", "com.docker.network.bridge.name",
            "com.docker.network.enable_ipv6", "RequestAddressType",
        ])
        .prop_map(str::to_string),
        1 => "[A-Za-z.]{0,10}",
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        prop_oneof![
            prop::sample::select(vec![
                "net1",
                "ep1",
                "ep2",
                "10.66.1.0/24",
                "10.66.1.5/24",
                "10.66.1.1/24",
                "10.66.1.7",
                "fd00::/64",
                "corvid-local",
                "corvid-global",
                "",
                "zz",
                "/var/run/docker/netns/x",
                "02:42:ac:11:00:02",
                "999.1.1.1/24",
                "10.66.1.0/40",
            ])
            .prop_map(str::to_string),
            "\\PC{0,10}",
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 30, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Calls as libnetwork makes them, with a few fields replaced by anything.
fn near_valid() -> impl Strategy<Value = (&'static str, Vec<u8>)> {
    let pool = "corvid-local/10.66.1.0/24";
    let templates = vec![
        (
            "IpamDriver.RequestPool",
            json!({"AddressSpace": "corvid-local", "Pool": "10.66.1.0/24", "SubPool": "", "Options": {}, "V6": false}),
        ),
        (
            "IpamDriver.RequestPool",
            json!({"AddressSpace": "corvid-local", "Pool": "", "Options": {}, "V6": false}),
        ),
        (
            "IpamDriver.RequestAddress",
            json!({"PoolID": pool, "Address": "", "Options": {}}),
        ),
        (
            "IpamDriver.ReleaseAddress",
            json!({"PoolID": pool, "Address": "10.66.1.7"}),
        ),
        ("IpamDriver.ReleasePool", json!({"PoolID": pool})),
        (
            "NetworkDriver.CreateNetwork",
            json!({"NetworkID": "net1", "Options": {"com.docker.network.generic": {}},
               "IPv4Data": [{"AddressSpace": "corvid-local", "Pool": "10.66.1.0/24", "Gateway": "10.66.1.1/24"}],
               "IPv6Data": []}),
        ),
        (
            "NetworkDriver.CreateEndpoint",
            json!({"NetworkID": "net1", "EndpointID": "ep1",
               "Interface": {"Address": "10.66.1.5/24", "MacAddress": ""}, "Options": {}}),
        ),
        (
            "NetworkDriver.Join",
            json!({"NetworkID": "net1", "EndpointID": "ep1", "SandboxKey": "/var/run/docker/netns/x", "Options": {}}),
        ),
        (
            "NetworkDriver.Leave",
            json!({"NetworkID": "net1", "EndpointID": "ep1"}),
        ),
        (
            "NetworkDriver.DeleteEndpoint",
            json!({"NetworkID": "net1", "EndpointID": "ep1"}),
        ),
        ("NetworkDriver.DeleteNetwork", json!({"NetworkID": "net1"})),
    ];
    (
        prop::sample::select(templates),
        prop::collection::vec((key(), value()), 0..3),
    )
        .prop_map(|((method, mut t), changes)| {
            let obj = t.as_object_mut().unwrap();
            for (k, v) in changes {
                obj.insert(k, v);
            }
            (method, t.to_string().into_bytes())
        })
}

/// A call: as libnetwork makes it, slightly wrong, or any method with any body.
fn call() -> impl Strategy<Value = (&'static str, Vec<u8>)> {
    prop_oneof![
        near_valid(),
        (prop::sample::select(METHODS.to_vec()), body()),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        5 => prop::collection::btree_map(key(), value(), 0..6)
            .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>()).to_string().into_bytes()),
        1 => value().prop_map(|v| v.to_string().into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..30),
    ]
}

/// What the controller holds and what links the namespace has.
fn state(w: &World) -> (Vec<Value>, Vec<String>) {
    let lists = w
        .netns
        .run(|| {
            ["networks", "subnets", "subnetpools", "ports"]
                .iter()
                .map(|c| {
                    ureq::get(&format!("{}/v2.0/{c}", w.controller))
                        .call()
                        .unwrap()
                        .into_json()
                        .unwrap()
                })
                .collect()
        })
        .unwrap();
    let mut links: Vec<String> = Netlink::open_in(&w.netns)
        .unwrap()
        .links()
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .collect();
    links.sort();
    (lists, links)
}

#[test]
fn any_call_is_answered_or_refused_and_a_refusal_changes_nothing() {
    let w = World::start();
    // Writes that went through, so the run is known to reach past the validation.
    let wrote = std::cell::Cell::new(0u32);
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let outcome = runner.run(&call(), |(method, body)| {
        let before = state(&w);
        let answer = w.netns.run(|| w.driver.call(method, &body)).unwrap();
        match answer {
            Ok(v) => {
                prop_assert!(v.is_object(), "{}: {}", method, v);
                if state(&w) != before {
                    wrote.set(wrote.get() + 1);
                }
            }
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                prop_assert_eq!(
                    state(&w),
                    before,
                    "{} refused ({}) but changed state",
                    method,
                    e
                );
            }
        }
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
    assert!(
        wrote.get() > 0,
        "no call changed anything: the bodies never got past validation"
    );
}
