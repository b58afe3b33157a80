//! Property-based fuzzing of what the Kubernetes side reads from the API server: corvid's
//! port annotation (any text, and real annotations with fields replaced), and
//! EndpointSlices and Services of any shape turned into endpoint groups and wanted load
//! balancers. Property: an error that says what is wrong, or a value that holds together
//! (an annotation reads back to itself; a load balancer's members are ready endpoints of
//! the service's slices, on a port they serve), never a panic.
//!
//! 2,000 cases by default; `CORVID_FUZZ_CASES` for a longer run.

#[path = "../../corvid/tests/support/fuzz.rs"]
#[macro_use]
mod fuzz;

use corvid_k8s::annotation::PortAnnotation;
use corvid_k8s::watcher::endpoints::{of_slice, EndpointGroup};
use corvid_k8s::watcher::load_balancer::wanted;
use k8s_openapi::api::core::v1::Service;
use kube::api::DynamicObject;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn config() -> ProptestConfig {
    fuzz_config!(2000)
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "10.0.0.5/24",
            "10.0.0.5",
            "fd00::5/64",
            "10.96.0.10",
            "None",
            "",
            "TCP",
            "UDP",
            "SCTP",
            "ClientIP",
            "LoadBalancer",
            "ClusterIP",
            "ExternalName",
            "web",
            "app",
            "default",
            "True",
            "False",
            "Ready",
            "http",
            "uid-1",
            "0a:58:0a:00:00:05",
        ])
        .prop_map(str::to_string),
        "\\PC{0,10}",
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "port_id", "network_id", "pod_uid", "mac", "addresses", "gateway", "routes", "mtu",
            "dst", "gw", "metadata", "spec", "status", "name", "namespace", "uid", "labels",
            "annotations", "selector", "ports", "port", "targetPort", "protocol", "nodePort",
            "clusterIP", "type", "sessionAffinity", "sessionAffinityConfig", "clientIP",
            "timeoutSeconds", "podIP", "conditions", "containers", "containerPort",
            "deletionTimestamp", "loadBalancerIP", "corvid.io/port", "app", "endpoints",
            "addressType", "ready", "kubernetes.io/service-name",
        ])
        .prop_map(str::to_string),
        1 => "[a-zA-Z./]{0,8}",
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-5i64..70000).prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 60, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A real annotation with some fields replaced by anything.
fn annotation() -> impl Strategy<Value = String> {
    prop::collection::vec((key(), value()), 0..3).prop_map(|changes| {
        let mut a = json!({"port_id": "p1", "network_id": "n1", "pod_uid": "uid-1",
            "mac": "0a:58:0a:00:00:05", "addresses": ["10.0.0.5/24"], "gateway": "10.0.0.1",
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}], "mtu": 1450});
        for (k, v) in changes {
            a.as_object_mut().unwrap().insert(k, v);
        }
        a.to_string()
    })
}

/// A Service near a real one, with fields replaced by anything.
fn service() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec((key(), value()), 0..3),
        prop::collection::vec((key(), value()), 0..3),
    )
        .prop_map(|(spec_changes, top_changes)| {
            let mut s = json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "web"},
                         "ports": [{"port": 80, "targetPort": "http", "protocol": "TCP"}]}});
            for (k, v) in spec_changes {
                s["spec"].as_object_mut().unwrap().insert(k, v);
            }
            for (k, v) in top_changes {
                s.as_object_mut().unwrap().insert(k, v);
            }
            s
        })
}

/// An EndpointSlice near a real one (of the service, an endpoint ready or not), with
/// fields replaced by anything, at the top or in its endpoint.
fn slice() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec((key(), value()), 0..3),
        prop::collection::vec((key(), value()), 0..2),
        any::<bool>(),
    )
        .prop_map(|(changes, endpoint_changes, ready)| {
            let mut s = json!({"apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice",
                "metadata": {"name": "web-x", "namespace": "default",
                    "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.0.0.5"], "conditions": {"ready": ready}}],
                "ports": [{"name": "", "port": 8080, "protocol": "TCP"}]});
            for (k, v) in endpoint_changes {
                s["endpoints"][0].as_object_mut().unwrap().insert(k, v);
            }
            for (k, v) in changes {
                s.as_object_mut().unwrap().insert(k, v);
            }
            s
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn annotations_read_back_or_say_what_is_wrong(raw in "\\PC{0,60}", near in annotation()) {
        for text in [raw, near] {
            match PortAnnotation::parse(&text) {
                Ok(a) => {
                    prop_assert!(!a.port_id.is_empty() && !a.addresses.is_empty());
                    prop_assert_eq!(PortAnnotation::parse(&a.to_text()).unwrap(), a);
                }
                Err(e) => prop_assert!(e.to_string().contains("corvid.io/port"), "{}", e),
            }
        }
    }
}

#[test]
fn services_and_slices_of_any_shape() {
    // Services that got members, so the run is known to reach past deserializing.
    let served = std::cell::Cell::new(0u32);
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let outcome = runner.run(
        &(service(), prop::collection::vec(slice(), 0..4)),
        |(svc, slices)| {
            let Ok(svc) = serde_json::from_value::<Service>(svc) else {
                return Ok(());
            };
            let groups: Vec<EndpointGroup> = slices
                .iter()
                .filter_map(|s| serde_json::from_value::<DynamicObject>(s.clone()).ok())
                .filter_map(|s| of_slice(&s))
                .map(|(_, g)| g)
                .collect();
            let ready = |ip: &std::net::IpAddr, port: u16| {
                slices.iter().any(|s| {
                    s["endpoints"].as_array().is_some_and(|e| {
                        e.iter().any(|e| {
                            e["addresses"][0].as_str() == Some(&ip.to_string())
                                && e["conditions"]["ready"] != json!(false)
                        })
                    }) && s["ports"].as_array().is_some_and(|p| {
                        p.iter()
                            .any(|p| p["port"].as_u64() == Some(u64::from(port)))
                    })
                })
            };
            if let Some(w) = wanted(&svc, groups.iter()) {
                for listener in w.listeners.values() {
                    if !listener.members.is_empty() {
                        served.set(served.get() + 1);
                    }
                    for (ip, port) in &listener.members {
                        prop_assert!(
                            ready(ip, *port),
                            "member {}:{} is no ready endpoint of a slice serving the port",
                            ip,
                            port
                        );
                    }
                }
            }
            Ok(())
        },
    );
    if let Err(e) = outcome {
        panic!("{e}");
    }
    assert!(
        served.get() > 0,
        "no service got a member: the objects never got far enough"
    );
}
