//! Property-based fuzzing of every CNI input an outsider controls: network configurations
//! and lists, results of every version and their conversions, CNI_ARGS, runtimeConfig in
//! either casing, prevResult, and the runtime's result cache files. Each property: a
//! clear error in CNI's shape or a valid value, never a panic.
//!
//! 2,000 cases per property by default; `CORVID_FUZZ_CASES=200000` for a longer run.
//! A failing input proptest finds is saved in `tests/regressions/fuzz.txt` and replayed
//! first on every later run: commit it.

#[path = "../../corvid/tests/support/fuzz.rs"]
#[macro_use]
mod fuzz;

use corvid_cni::args::CniArgs;
use corvid_cni::config::{validate_name, NetConf};
use corvid_cni::exec::{Runtime, RuntimeConf};
use corvid_cni::result::{CniResult, Dns, Interface, IpConfig, Route};
use corvid_cni::version::{Version, ALL};
use corvid_cni::{Error, NetConfList};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn config() -> ProptestConfig {
    fuzz_config!(2000)
}

/// Keys CNI documents use, and some that none does.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "cniVersion", "cniVersions", "name", "type", "ipam", "ips", "ip4", "ip6", "ip",
            "routes", "dns", "interfaces", "interface", "prevResult", "runtimeConfig",
            "RuntimeConfig", "args", "cni", "address", "gateway", "dst", "gw", "mac", "sandbox",
            "plugins", "subnet", "nameservers", "capabilities", "version", "mtu", "table",
            "disableCheck", "disableGC", "cni.dev/valid-attachments", "containerID", "ifname",
            "portMappings", "bandwidth", "kind", "config", "ifName", "networkName", "result",
        ])
        .prop_map(str::to_string),
        1 => "[a-zA-Z./_-]{0,10}",
    ]
}

/// Strings near what CNI fields hold: versions, addresses, names, and noise.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "0.1.0",
            "0.2.0",
            "0.3.0",
            "0.3.1",
            "0.4.0",
            "1.0.0",
            "1.1.0",
            "2.0.0",
            "",
            "bridge",
            "host-local",
            "../x",
            "10.0.0.5/24",
            "10.0.0.1",
            "fd00::5/64",
            "::/0",
            "0.0.0.0/0",
            "eth0",
            "0a:58:0a:01:00:05",
            "/run/netns/x",
            "net1",
            "-bad",
            "a/b",
        ])
        .prop_map(str::to_string),
        "\\PC{0,16}",
    ]
}

/// Any JSON of a bounded size, shaped like CNI's.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u32>().prop_map(|n| json!(n)),
        (-1e12f64..1e12).prop_map(|f| json!(f)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A valid configuration with some fields replaced by anything.
fn near_valid_config() -> impl Strategy<Value = Value> {
    (
        prop::collection::btree_map(key(), json_value(), 0..4),
        prop::option::of(json_value()),
    )
        .prop_map(|(extra, prev)| {
            let mut conf = json!({"cniVersion": "1.0.0", "name": "net", "type": "bridge",
                "ipam": {"type": "host-local", "subnet": "10.0.0.0/24"}});
            let obj = conf.as_object_mut().unwrap();
            obj.extend(extra);
            if let Some(p) = prev {
                obj.insert("prevResult".into(), p);
            }
            conf
        })
}

/// An error must carry a code and message and print as CNI's error JSON.
fn clear(e: &Error) {
    assert!(e.code > 0, "code 0: {e:?}");
    assert!(!e.msg.is_empty(), "no message: {e:?}");
    let shown = e.to_json("1.0.0");
    assert_eq!(shown["code"], json!(e.code));
    assert!(shown["msg"].is_string());
}

fn ip_net(v6: bool) -> impl Strategy<Value = ipnet::IpNet> {
    if v6 {
        (any::<u128>(), 0u8..=128)
            .prop_map(|(a, p)| ipnet::IpNet::new(std::net::Ipv6Addr::from(a).into(), p).unwrap())
            .boxed()
    } else {
        (any::<u32>(), 0u8..=32)
            .prop_map(|(a, p)| ipnet::IpNet::new(std::net::Ipv4Addr::from(a).into(), p).unwrap())
            .boxed()
    }
}

fn ip_config(interfaces: usize) -> impl Strategy<Value = IpConfig> {
    (
        any::<bool>(),
        any::<bool>(),
        prop::option::of(0..interfaces.max(1)),
    )
        .prop_flat_map(move |(v6, gw, iface)| {
            (ip_net(v6), ip_net(v6)).prop_map(move |(address, gateway)| IpConfig {
                address,
                gateway: gw.then(|| gateway.addr()),
                interface: if interfaces == 0 { None } else { iface },
            })
        })
}

/// A valid result of the newest version.
fn result() -> impl Strategy<Value = CniResult> {
    (0usize..3).prop_flat_map(|n| {
        (
            prop::collection::vec(("[a-z]{1,8}[0-9]?", prop::option::of(1u32..9000)), n..=n),
            prop::collection::vec(ip_config(n), 0..4),
            prop::collection::vec((any::<bool>(), prop::option::of(0u32..100)), 0..3),
            prop::collection::vec("[a-z.]{1,10}", 0..3),
        )
            .prop_flat_map(|(ifaces, ips, routes, search)| {
                let routes = routes
                    .into_iter()
                    .map(|(v6, prio)| {
                        (ip_net(v6), Just(prio)).prop_map(|(dst, priority)| Route {
                            dst,
                            priority,
                            ..Route::default()
                        })
                    })
                    .collect::<Vec<_>>();
                (Just(ifaces), Just(ips), routes, Just(search))
            })
            .prop_map(|(ifaces, ips, routes, search)| CniResult {
                interfaces: ifaces
                    .into_iter()
                    .map(|(name, mtu)| Interface {
                        name,
                        mac: "0a:58:0a:01:00:05".into(),
                        mtu,
                        ..Interface::default()
                    })
                    .collect(),
                ips,
                routes,
                dns: Dns {
                    search,
                    ..Dns::default()
                },
            })
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_bytes_as_a_configuration(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        for e in [NetConf::parse(&bytes).err(), NetConfList::parse(&bytes).err()].iter().flatten() {
            clear(e);
        }
    }

    #[test]
    fn any_json_as_a_configuration(v in json_value()) {
        let bytes = v.to_string().into_bytes();
        match NetConf::parse(&bytes) {
            Ok((conf, version)) => {
                prop_assert!(validate_name("network name", &conf.name).is_ok());
                prop_assert_eq!(Version::parse(&conf.cni_version).unwrap(), version);
                prop_assert!(!conf.plugin_type.contains('/'));
            }
            Err(e) => clear(&e),
        }
        if let Err(e) = NetConfList::parse(&bytes) {
            clear(&e);
        }
    }

    #[test]
    fn near_valid_configurations_and_their_prev_results(v in near_valid_config()) {
        match NetConf::parse(v.to_string().as_bytes()) {
            Ok((conf, version)) => {
                prop_assert!(!conf.plugin_type.is_empty() && !conf.plugin_type.contains('/'));
                if let Some(prev) = &conf.prev_result {
                    if let Err(e) = CniResult::parse(prev, version) {
                        clear(&e);
                    }
                }
            }
            Err(e) => clear(&e),
        }
        let list = json!({"cniVersion": "1.0.0", "name": "net", "plugins": [v.clone(), v]});
        match NetConfList::parse(list.to_string().as_bytes()) {
            Ok(l) => prop_assert!(!l.plugins.is_empty()),
            Err(e) => clear(&e),
        }
    }

    #[test]
    fn cni_args_parse_to_pairs_that_print_back(s in "\\PC{0,40}|([A-Za-z_]{0,6}=[^;]{0,6};){0,4}") {
        match CniArgs::parse(&s) {
            Ok(args) => {
                for (k, v) in &args.0 {
                    prop_assert!(!k.is_empty() && !k.contains(';') && !k.contains('='));
                    prop_assert!(!v.contains(';'));
                    prop_assert!(args.get(k).is_some());
                }
                let again: Vec<String> = args.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
                prop_assert_eq!(CniArgs::parse(&again.join(";")).unwrap(), args);
            }
            Err(e) => clear(&e),
        }
    }

    #[test]
    fn runtime_config_keys_match_in_either_casing(
        key in prop::sample::select(vec!["portMappings", "bandwidth", "ips", "mac", "ipRanges", "dns", "aliases"]),
        flips in prop::collection::vec(any::<bool>(), 12),
        value in json_value(),
    ) {
        let sent: String = key
            .chars()
            .zip(flips.iter().cycle())
            .map(|(c, f)| if *f { c.to_ascii_uppercase() } else { c.to_ascii_lowercase() })
            .collect();
        let conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "t",
            "runtimeConfig": {sent: value.clone()}});
        let (conf, _) = NetConf::parse(conf.to_string().as_bytes()).unwrap();
        // Compared with the value as read from text: the last digit of a float may move.
        let read: Value = serde_json::from_str(&value.to_string()).unwrap();
        prop_assert_eq!(conf.runtime_config_value(key), Some(&read));
    }

    #[test]
    fn any_json_as_a_result_of_any_version(v in json_value(), from in prop::sample::select(ALL.to_vec())) {
        match CniResult::parse(&v, from) {
            Ok((result, _)) => {
                for to in ALL {
                    if let Err(e) = result.to_value(to) {
                        clear(&e);
                    }
                }
            }
            Err(e) => clear(&e),
        }
    }

    #[test]
    fn results_survive_conversion_through_every_version(r in result()) {
        let newest = r.to_value(Version::CURRENT).unwrap();
        prop_assert_eq!(&CniResult::parse(&newest, Version::CURRENT).unwrap().0, &r);
        for to in ALL {
            let there = match CniResult::convert(&newest, Version::CURRENT, to) {
                Ok(v) => v,
                Err(e) => {
                    // Only the legacy form may refuse: it has no room for some results.
                    prop_assert!(to < Version::V0_3_0, "{:?} refused: {:?}", to, e);
                    clear(&e);
                    continue;
                }
            };
            let (back, _) = CniResult::parse(&there, to).unwrap();
            if to >= Version::V0_3_0 {
                let addrs = |r: &CniResult| r.ips.iter().map(|i| (i.address, i.gateway)).collect::<Vec<_>>();
                prop_assert_eq!(addrs(&back), addrs(&r), "addresses through {:?}", to);
                let dsts = |r: &CniResult| r.routes.iter().map(|x| x.dst).collect::<Vec<_>>();
                prop_assert_eq!(dsts(&back), dsts(&r), "routes through {:?}", to);
            } else {
                // The ip4/ip6 form keeps the first address of each family.
                for v6 in [false, true] {
                    let first = |r: &CniResult| r.ips.iter().find(|i| i.address.addr().is_ipv6() == v6).map(|i| i.address);
                    prop_assert_eq!(first(&back), first(&r), "first address through {:?}", to);
                }
            }
        }
    }

    #[test]
    fn torn_or_garbage_cache_files_never_block(bytes in prop::collection::vec(any::<u8>(), 0..300), cut in 0usize..400) {
        let dir = tempfile::tempdir().unwrap();
        let mut rt = Runtime::new(vec![]);
        rt.cache_dir = dir.path().to_path_buf();
        let conf = RuntimeConf {
            container_id: "c1".into(),
            netns: "/run/netns/x".into(),
            ifname: "eth0".into(),
            ..RuntimeConf::default()
        };
        // A real entry cut anywhere, and noise, where the entry would be.
        let entry = json!({"kind": "cniCacheV1", "containerId": "c1", "config": "e30=",
            "ifName": "eth0", "networkName": "net", "result": {"cniVersion": "1.0.0"}}).to_string();
        for body in [entry.as_bytes()[..cut.min(entry.len())].to_vec(), bytes] {
            std::fs::write(dir.path().join("net-c1-eth0"), &body).unwrap();
            let _ = rt.cached("net", &conf);
            let _ = rt.cached_attachments("net");
        }
    }
}
