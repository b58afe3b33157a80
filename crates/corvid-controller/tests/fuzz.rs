//! Property-based fuzzing of the Neutron-shaped API over HTTP, on a real controller (redb
//! in a temporary directory): any method on any route with any query string and any body,
//! shaped like Neutron's or not. Property: a 2xx, or a 4xx in Neutron's error shape, never
//! a 5xx; and a refused write changes nothing anyone can list. (schemathesis drives the
//! API from its OpenAPI document in crates/corvid/tests/api_fuzz.rs; this covers what
//! the document does not describe.)
//!
//! 1,000 cases by default; `CORVID_FUZZ_CASES` for a longer run.

#[path = "support/in_process.rs"]
mod in_process;

#[path = "../../corvid/tests/support/fuzz.rs"]
#[macro_use]
mod fuzz;

use in_process::InProcess;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn config() -> ProptestConfig {
    fuzz_config!(1000)
}

/// A controller with a network, a subnet and a port to aim at.
struct Api {
    base: String,
    ids: Vec<String>,
    _controller: InProcess,
}

impl Api {
    fn start() -> Api {
        let controller = InProcess::start();
        let base = controller.url.clone();
        let post = |path: &str, body: Value| -> Value {
            ureq::post(&format!("{base}{path}"))
                .send_json(body)
                .unwrap()
                .into_json()
                .unwrap()
        };
        let net = post("/v2.0/networks", json!({"network": {"name": "fuzz"}}));
        let net_id = net["network"]["id"].as_str().unwrap().to_string();
        let subnet = post(
            "/v2.0/subnets",
            json!({"subnet": {"network_id": net_id, "cidr": "10.55.0.0/16", "ip_version": 4}}),
        );
        let port = post("/v2.0/ports", json!({"port": {"network_id": net_id}}));
        let group = post(
            "/v2.0/security-groups",
            json!({"security_group": {"name": "fuzz"}}),
        );
        let rule = &group["security_group"]["security_group_rules"][0]["id"];
        let ids = vec![
            net_id,
            subnet["subnet"]["id"].as_str().unwrap().to_string(),
            port["port"]["id"].as_str().unwrap().to_string(),
            group["security_group"]["id"].as_str().unwrap().to_string(),
            rule.as_str().unwrap().to_string(),
        ];
        Api {
            base,
            ids,
            _controller: controller,
        }
    }
}

const COLLECTIONS: [&str; 10] = [
    "/v2.0/networks",
    "/v2.0/subnets",
    "/v2.0/subnetpools",
    "/v2.0/ports",
    "/v2.0/floatingips",
    "/v2.0/security-groups",
    "/v2.0/security-group-rules",
    "/v2/lbaas/loadbalancers",
    "/v2/lbaas/listeners",
    "/v2/lbaas/pools",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "network", "subnet", "port", "floatingip", "loadbalancer", "listener", "pool",
            "member", "networks", "ports", "name", "id", "network_id", "subnet_id", "cidr",
            "ip_version", "fixed_ips", "ip_address", "mac_address", "admin_state_up",
            "tenant_id", "project_id", "allocation_pools", "start", "end", "gateway_ip",
            "binding:host_id", "device_owner", "tags", "protocol", "protocol_port",
            "vip_subnet_id", "loadbalancer_id", "lb_algorithm", "address", "weight",
            "floating_network_id", "port_id", "mtu", "shared", "enable_dhcp",
            "security_group", "security_group_rule", "security_group_rules", "security_groups",
            "security_group_id", "remote_group_id", "remote_ip_prefix", "direction",
            "ethertype", "port_range_min", "port_range_max", "stateful",
            "port_security_enabled", "allowed_address_pairs",
        ])
        .prop_map(str::to_string),
        1 => "[a-z_:]{0,10}",
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (0i64..70000).prop_map(|n| json!(n)),
        prop_oneof![
            prop::sample::select(vec![
                "10.55.0.9",
                "10.55.0.0/24",
                "10.55.0.0/16",
                "fd00::/64",
                "::1",
                "4",
                "6",
                "",
                "TCP",
                "HTTP",
                "ROUND_ROBIN",
                "fa:16:3e:00:00:01",
                "compute:nova",
                "x",
                "00000000-0000-0000-0000-000000000000",
                "256.1.1.1",
                "10.55.0.0/33",
                "ingress",
                "egress",
                "IPv4",
                "ipv6",
                "tcp",
                "icmp",
                "any",
                "default",
            ])
            .prop_map(str::to_string),
            "\\PC{0,12}",
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A path: a collection, one of its members (an ID that exists or not), or nonsense.
fn path(ids: Vec<String>) -> impl Strategy<Value = String> {
    (
        prop::sample::select(COLLECTIONS.to_vec()),
        prop_oneof![Just(None), (0usize..5).prop_map(Some), Just(Some(99)),],
        prop_oneof![
            Just(""),
            Just(".json"),
            Just("/tags"),
            Just("/tags/x"),
            Just("/members"),
            Just("/")
        ],
    )
        .prop_map(move |(c, id, tail)| match id {
            None => format!("{c}{tail}"),
            Some(99) => format!("{c}/no-such-thing{tail}"),
            Some(i) => format!("{c}/{}{tail}", ids[i]),
        })
}

fn query() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "(fields|name|id|limit|marker|sort_key|sort_dir|page_reverse|tags|tags-any|not-tags|network_id|fixed_ips|ip_version|cidr|[a-z]{1,4})=[a-zA-Z0-9%=._-]{0,10}(&(fields|limit|marker|sort_dir|tags)=[a-z0-9%._-]{0,8}){0,3}"
            .prop_map(|q| format!("?{q}")),
        "\\?\\PC{0,20}",
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => value().prop_map(|v| v.to_string().into_bytes()),
        2 => (key(), value()).prop_map(|(k, v)| json!({k: v}).to_string().into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..40),
    ]
}

/// Everything a client can list.
fn everything(base: &str) -> Vec<Value> {
    COLLECTIONS
        .iter()
        .map(|c| {
            ureq::get(&format!("{base}{c}"))
                .call()
                .unwrap()
                .into_json()
                .unwrap()
        })
        .collect()
}

#[test]
fn any_request_is_answered_in_neutrons_shape_and_a_refused_write_changes_nothing() {
    let api = Api::start();
    let methods = prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "PATCH"]);
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let outcome = runner.run(
        &(methods, path(api.ids.clone()), query(), body()),
        |(method, path, query, body)| {
            let write = method != "GET";
            let before = write.then(|| everything(&api.base));
            let url = format!("{}{path}{query}", api.base);
            let answer = ureq::request(method, &url)
                .set("Content-Type", "application/json")
                .send_bytes(&body);
            let (status, text) = match answer {
                Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
                Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
                Err(e) => return Err(TestCaseError::fail(format!("{method} {url}: {e}"))),
            };
            prop_assert!(status < 500, "{} {} -> {}: {}", method, url, status, text);
            if status >= 400 {
                let error: Value = serde_json::from_str(&text)
                    .map_err(|e| TestCaseError::fail(format!("{status} not JSON ({e}): {text}")))?;
                prop_assert!(
                    error["NeutronError"]["type"].is_string()
                        && error["NeutronError"]["message"].is_string(),
                    "{} {} -> {}: {}",
                    method,
                    url,
                    status,
                    text
                );
                if let Some(before) = before {
                    prop_assert_eq!(
                        everything(&api.base),
                        before,
                        "{} {} -> {} changed state",
                        method,
                        url,
                        status
                    );
                }
            }
            Ok(())
        },
    );
    if let Err(e) = outcome {
        panic!("{e}");
    }
}
