//! The controller through a real HTTP client against a spawned `corvid controller`, on
//! both stores: redb (embedded) and a real etcd started by the test.

#[path = "support/controller.rs"]
mod support;

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corvid_api::{
    Client, EventKind, FloatingIp, Network, Port, Status, Subnet, SubnetPool, WatchFilter, Watcher,
};
use serde_json::{json, Value};
use support::{redb_store, sample, ControllerProcess, Etcd};

/// Runs `f` against a controller on each backend.
fn on_both(f: impl Fn(&ControllerProcess)) {
    let (_dir, spec) = redb_store();
    f(&ControllerProcess::start(&spec, None));
    let etcd = Etcd::start();
    f(&ControllerProcess::start(
        &format!("etcd:{}", etcd.url),
        None,
    ));
}

fn network_with_subnet(c: &Client, cidr: &str, gateway: Value) -> (Network, Subnet) {
    let net: Network = c.create(json!({"name": "net"})).expect("network");
    let sub: Subnet = c
        .create(json!({"network_id": net.id, "cidr": cidr, "ip_version": 4, "gateway_ip": gateway}))
        .expect("subnet");
    (net, sub)
}

/// A router with its gateway on `ext` and an interface on `subnet`, which floating IPs
/// of `ext` need; the router and that interface.
fn edge_router(
    c: &Client,
    ext: &Network,
    subnet: &Subnet,
) -> (corvid_api::Router, corvid_api::RouterInterface) {
    let router: corvid_api::Router = c
        .create(json!({"name": "edge", "external_gateway_info": {"network_id": ext.id}}))
        .unwrap();
    let interface = corvid_api::RouterInterface {
        subnet_id: Some(subnet.id.clone()),
        port_id: None,
    };
    c.add_router_interface(&router.id, &interface).unwrap();
    (router, interface)
}

fn kind(r: Result<impl Sized, corvid_api::ApiError>) -> (u16, String) {
    match r {
        Err(corvid_api::ApiError::Neutron { status, kind, .. }) => (status, kind),
        Err(e) => panic!("transport error {e}"),
        Ok(_) => panic!("expected an error"),
    }
}

#[test]
fn resource_lifecycle_filters_tags_and_errors() {
    on_both(|ctl| {
        let c = ctl.client();
        let (net, sub) = network_with_subnet(&c, "10.0.0.0/24", json!("10.0.0.1"));
        assert_eq!(sub.allocation_pools[0].start.to_string(), "10.0.0.2");
        let net: Network = c.get(&net.id).unwrap();
        assert_eq!(net.subnets, vec![sub.id.clone()]);

        // The chosen address first: the picker starts at a random point and could take it.
        let fixed: Port = c
            .create(
                json!({"network_id": net.id, "name": "fixed", "mac_address": "fa:16:3e:11:22:33",
                           "fixed_ips": [{"subnet_id": sub.id, "ip_address": "10.0.0.50"}],
                           "device_owner": "kuryr:container", "binding:host_id": "node-1"}),
            )
            .unwrap();
        assert_eq!(fixed.binding_vif_type, "veth");
        let auto: Port = c
            .create(json!({"network_id": net.id, "name": "auto", "device_id": "dev-a"}))
            .unwrap();
        assert_eq!(auto.status, Status::Down);
        assert!(auto.mac_address.starts_with("fa:16:3e:"));
        assert!(sub.cidr.contains(&auto.fixed_ips[0].ip_address));

        // Errors, in Neutron's types and codes.
        let dup = c.create::<Port>(json!({"network_id": net.id, "fixed_ips": [{"subnet_id": sub.id, "ip_address": "10.0.0.50"}]}));
        assert_eq!(kind(dup), (409, "IpAddressAlreadyAllocated".into()));
        let outside = c.create::<Port>(json!({"network_id": net.id, "fixed_ips": [{"subnet_id": sub.id, "ip_address": "10.9.9.9"}]}));
        assert_eq!(kind(outside), (400, "InvalidIpForSubnet".into()));
        let mac =
            c.create::<Port>(json!({"network_id": net.id, "mac_address": "fa:16:3e:11:22:33"}));
        assert_eq!(kind(mac), (409, "MacAddressInUse".into()));
        // An unbound port's MAC may change, to a free one; the old one is free again.
        let moved: Port = c
            .update(&auto.id, json!({"mac_address": "02:42:0A:00:00:07"}))
            .unwrap();
        assert_eq!(moved.mac_address, "02:42:0a:00:00:07");
        let taken = c.update::<Port>(&auto.id, json!({"mac_address": "fa:16:3e:11:22:33"}));
        assert_eq!(kind(taken), (409, "MacAddressInUse".into()));
        let bound = c.update::<Port>(&fixed.id, json!({"mac_address": "02:42:0a:00:00:08"}));
        assert_eq!(kind(bound), (409, "PortBound".into()));
        let bad = c.update::<Port>(&auto.id, json!({"mac_address": "nope"}));
        assert_eq!(kind(bad).0, 400);
        let reuse: Port = c
            .create(json!({"network_id": net.id, "mac_address": auto.mac_address}))
            .unwrap();
        c.delete::<Port>(&reuse.id).unwrap();
        assert_eq!(
            kind(c.get::<Port>("00000000-0000-0000-0000-000000000000")),
            (404, "PortNotFound".into())
        );
        assert_eq!(
            kind(c.create::<Network>(json!({"name": "x", "bogus": 1}))),
            (400, "HTTPBadRequest".into())
        );
        let (status, body, _) = c.request("POST", "/v2.0/networks", None).unwrap();
        assert_eq!(status, 400, "{body}");
        assert_eq!(
            kind(c.delete::<Subnet>(&sub.id)),
            (409, "SubnetInUse".into())
        );
        assert_eq!(
            kind(c.delete::<Network>(&net.id)),
            (409, "NetworkInUse".into())
        );

        // Filters, fields, tags.
        let (found, revision) = c.list::<Port>(&[("device_id", "dev-a")]).unwrap();
        assert_eq!(found.iter().map(|p| &p.id).collect::<Vec<_>>(), [&auto.id]);
        assert!(revision > 0);
        let (found, _) = c
            .list::<Port>(&[("fixed_ips", "ip_address=10.0.0.50")])
            .unwrap();
        assert_eq!(found[0].id, fixed.id);
        let (found, _) = c
            .list::<Port>(&[("device_owner", "kuryr:container"), ("network_id", &net.id)])
            .unwrap();
        assert_eq!(found.len(), 1);
        let (_, v, _) = c
            .request("GET", "/v2.0/ports?name=auto&fields=id&fields=name", None)
            .unwrap();
        assert_eq!(v["ports"][0], json!({"id": auto.id, "name": "auto"}));
        c.add_tag::<Port>(&fixed.id, "k8s-pod").unwrap();
        c.add_tag::<Port>(&fixed.id, "k8s-pod").unwrap();
        c.add_tag::<Port>(&fixed.id, "kuryr.net.uuid.abc").unwrap();
        let (s, _, _) = c
            .request(
                "GET",
                &format!("/v2.0/ports/{}/tags/k8s-pod", fixed.id),
                None,
            )
            .unwrap();
        assert_eq!(s, 204);
        let (s, v, _) = c
            .request("GET", &format!("/v2.0/ports/{}/tags/nope", fixed.id), None)
            .unwrap();
        assert_eq!(
            (s, v["NeutronError"]["type"].as_str()),
            (404, Some("TagNotFound"))
        );
        let (s, v, _) = c
            .request(
                "PUT",
                &format!("/v2.0/ports/{}/tags", auto.id),
                Some(&json!({"tags": ["red", "blue"]})),
            )
            .unwrap();
        assert_eq!((s, v), (200, json!({"tags": ["red", "blue"]})));
        let ids = |q: &str| -> Vec<String> {
            let (_, v, _) = c.request("GET", &format!("/v2.0/ports?{q}"), None).unwrap();
            v["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["id"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            ids("tags=k8s-pod,kuryr.net.uuid.abc"),
            std::slice::from_ref(&fixed.id)
        );
        assert_eq!(ids("tags-any=red,k8s-pod").len(), 2);
        assert_eq!(
            ids(&format!("network_id={}&not-tags=red", net.id)),
            std::slice::from_ref(&fixed.id)
        );
        let (s, _, _) = c
            .request(
                "DELETE",
                &format!("/v2.0/ports/{}/tags/k8s-pod", fixed.id),
                None,
            )
            .unwrap();
        assert_eq!(s, 204);
        assert!(ids("tags=k8s-pod").is_empty());

        // Update, guarded update, status report.
        let renamed: Port = c
            .update(&auto.id, json!({"name": "renamed", "device_id": "dev-b"}))
            .unwrap();
        assert_eq!(
            (
                renamed.name.as_str(),
                renamed.revision_number > auto.revision_number
            ),
            ("renamed", true)
        );
        assert!(c
            .list::<Port>(&[("device_id", "dev-a")])
            .unwrap()
            .0
            .is_empty());
        let (s, v, _) = c
            .request(
                "PUT",
                &format!("/v2.0/ports/{}", auto.id),
                Some(&json!({"port": {"name": "x"}})),
            )
            .unwrap();
        assert_eq!(s, 200, "{v}");
        let stale = ureq::put(&format!("{}/v2.0/ports/{}", ctl.url, auto.id))
            .set("If-Match", "revision_number=999")
            .send_json(json!({"port": {"name": "y"}}));
        assert!(matches!(stale, Err(ureq::Error::Status(412, _))));
        assert_eq!(
            kind(c.update::<Port>(&auto.id, json!({"network_id": net.id}))).0,
            400
        );
        c.set_port_status(&fixed.id, Status::Active).unwrap();
        assert_eq!(c.get::<Port>(&fixed.id).unwrap().status, Status::Active);

        // Pagination walks every port exactly once.
        for i in 0..5 {
            c.create::<Port>(json!({"network_id": net.id, "name": format!("page-{i}")}))
                .unwrap();
        }
        let mut seen = Vec::new();
        let mut path = "/v2.0/ports?limit=2&sort_key=name&sort_dir=asc".to_string();
        loop {
            let (_, v, _) = c.request("GET", &path, None).unwrap();
            seen.extend(
                v["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p["name"].as_str().unwrap().to_string()),
            );
            match v["ports_links"]
                .as_array()
                .and_then(|l| l.iter().find(|l| l["rel"] == "next"))
            {
                Some(next) => path = next["href"].as_str().unwrap().to_string(),
                None => break,
            }
            if v["ports"].as_array().unwrap().len() < 2 {
                break;
            }
        }
        let mut sorted = seen.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(seen, sorted, "ascending, no repeats");
        assert_eq!(seen.len(), 7);

        // Bulk is all or nothing.
        let bulk = c.create_bulk::<Port>(vec![
            json!({"network_id": net.id, "name": "bulk-0"}),
            json!({"network_id": net.id, "name": "bulk-1", "fixed_ips": [{"ip_address": "10.0.0.50"}]}),
        ]);
        assert_eq!(kind(bulk).0, 409);
        assert!(
            c.list::<Port>(&[("name", "bulk-0")]).unwrap().0.is_empty(),
            "no half-made bulk"
        );
        let made = c
            .create_bulk::<Port>(vec![
                json!({"network_id": net.id, "name": "bulk-0"}),
                json!({"network_id": net.id, "name": "bulk-1"}),
            ])
            .unwrap();
        assert_eq!(made.len(), 2);
        for (path, body) in [
            ("/v2.0/ports", json!({"ports": []})),
            ("/v2.0/networks", json!({"networks": []})),
            ("/project/p1/ports", json!({"port": {}, "ports": []})),
        ] {
            let (s, v, _) = c.request("POST", path, Some(&body)).unwrap();
            assert_eq!(s, 400, "an empty bulk on {path} is refused at once: {v}");
        }

        // Subnet pools carve by prefix length.
        let pool: SubnetPool = c.create(json!({"name": "p", "prefixes": ["10.10.0.0/16"], "default_prefixlen": 24, "min_prefixlen": 16, "max_prefixlen": 28})).unwrap();
        let net2: Network = c.create(json!({"name": "net2"})).unwrap();
        let a: Subnet = c.create(json!({"network_id": net2.id, "subnetpool_id": pool.id, "prefixlen": 26, "ip_version": 4})).unwrap();
        let b: Subnet = c
            .create(json!({"network_id": net2.id, "subnetpool_id": pool.id, "ip_version": 4}))
            .unwrap();
        assert_eq!(a.cidr.to_string(), "10.10.0.0/26");
        assert_eq!(b.cidr.to_string(), "10.10.1.0/24");
        let mixed = c.create::<Subnet>(
            json!({"network_id": net.id, "subnetpool_id": pool.id, "prefixlen": 26}),
        );
        assert_eq!(kind(mixed).0, 400);
        assert_eq!(kind(c.delete::<SubnetPool>(&pool.id)).0, 409);

        // Floating IPs.
        let ext: Network = c
            .create(json!({"name": "public", "router:external": true}))
            .unwrap();
        c.create::<Subnet>(json!({"network_id": ext.id, "cidr": "172.24.4.0/24"}))
            .unwrap();
        // Only through a router with an interface on the port's subnet and its gateway
        // on the floating IP's network, as Neutron has it.
        let unreachable =
            c.create::<FloatingIp>(json!({"floating_network_id": ext.id, "port_id": fixed.id}));
        assert_eq!(
            kind(unreachable),
            (404, "ExternalGatewayForFloatingIPNotFound".into())
        );
        assert!(c.list::<FloatingIp>(&[]).unwrap().0.is_empty());
        let (router, on_sub) = edge_router(&c, &ext, &sub);
        let fip: FloatingIp = c
            .create(json!({"floating_network_id": ext.id, "port_id": fixed.id}))
            .unwrap();
        assert_eq!(fip.router_id.as_deref(), Some(router.id.as_str()));
        assert_eq!(
            kind(c.remove_router_interface(&router.id, &on_sub)),
            (409, "RouterInterfaceInUseByFloatingIP".into())
        );
        let ungated =
            c.update::<corvid_api::Router>(&router.id, json!({"external_gateway_info": null}));
        assert_eq!(
            kind(ungated),
            (409, "RouterExternalGatewayInUseByFloatingIp".into())
        );
        assert_eq!(
            fip.fixed_ip_address,
            Some("10.0.0.50".parse::<IpAddr>().unwrap())
        );
        assert_eq!(
            fip.port_details.as_ref().map(|d| d.mac_address.as_str()),
            Some("fa:16:3e:11:22:33")
        );
        let freed: FloatingIp = c.update(&fip.id, json!({"port_id": null})).unwrap();
        assert_eq!(freed.port_id, None);
        assert_eq!(freed.router_id, None);
        c.remove_router_interface(&router.id, &on_sub).unwrap();
        c.delete::<corvid_api::Router>(&router.id).unwrap();
        assert_eq!(
            kind(c.create::<FloatingIp>(json!({"floating_network_id": net.id}))).0,
            400
        );

        // Load balancers get a VIP port.
        let (s, lb, _) = c
            .request(
                "POST",
                "/v2/lbaas/loadbalancers",
                Some(&json!({"loadbalancer": {"name": "lb", "vip_subnet_id": sub.id}})),
            )
            .unwrap();
        assert_eq!(s, 201, "{lb}");
        let lb = &lb["loadbalancer"];
        let vip: Port = c.get(lb["vip_port_id"].as_str().unwrap()).unwrap();
        assert_eq!(
            vip.fixed_ips[0].ip_address.to_string(),
            lb["vip_address"].as_str().unwrap()
        );
        let (s, l, _) = c.request("POST", "/v2/lbaas/listeners", Some(&json!({"listener": {"loadbalancer_id": lb["id"], "protocol": "TCP", "protocol_port": 80}}))).unwrap();
        assert_eq!(s, 201, "{l}");
        let (s, p, _) = c.request("POST", "/v2/lbaas/pools", Some(&json!({"pool": {"listener_id": l["listener"]["id"], "loadbalancer_id": lb["id"], "protocol": "TCP", "lb_algorithm": "ROUND_ROBIN"}}))).unwrap();
        assert_eq!(s, 201, "{p}");
        let pool_id = p["pool"]["id"].as_str().unwrap();
        let (s, _, _) = c
            .request(
                "POST",
                &format!("/v2/lbaas/pools/{pool_id}/members"),
                Some(&json!({"member": {"address": "10.0.0.50", "protocol_port": 8080}})),
            )
            .unwrap();
        assert_eq!(s, 201);
        let (_, shown, _) = c
            .request("GET", &format!("/v2/lbaas/pools/{pool_id}"), None)
            .unwrap();
        assert_eq!(shown["pool"]["members"].as_array().unwrap().len(), 1);
        let (s, _, _) = c.request("POST", "/v2/lbaas/listeners", Some(&json!({"listener": {"loadbalancer_id": lb["id"], "protocol": "TCP", "protocol_port": 70000}}))).unwrap();
        assert_eq!(s, 400);

        // A client may name what it makes, and making it again says it exists; members
        // are listed flat too; a cascade delete takes the whole tree and the VIP port.
        let named = json!({"member": {"id": "0b6a3d8e-0000-4000-8000-0000000000aa", "pool_id": pool_id,
            "address": "10.0.0.51", "protocol_port": 8080}});
        let (s, m, _) = c
            .request("POST", "/v2/lbaas/members", Some(&named))
            .unwrap();
        assert_eq!(
            (s, m["member"]["id"].as_str()),
            (201, Some("0b6a3d8e-0000-4000-8000-0000000000aa"))
        );
        let (s, e, _) = c
            .request("POST", "/v2/lbaas/members", Some(&named))
            .unwrap();
        assert_eq!(
            (s, e["NeutronError"]["type"].as_str()),
            (409, Some("MemberExists")),
            "{e}"
        );
        let (s, e, _) = c
            .request(
                "POST",
                "/v2/lbaas/members",
                Some(&json!({"member": {"address": "10.0.0.52", "protocol_port": 1}})),
            )
            .unwrap();
        assert_eq!(s, 400, "{e}");
        let (_, all, _) = c.request("GET", "/v2/lbaas/members", None).unwrap();
        assert_eq!(all["members"].as_array().unwrap().len(), 2);
        let lb_path = format!("/v2/lbaas/loadbalancers/{}", lb["id"].as_str().unwrap());
        assert_eq!(c.request("DELETE", &lb_path, None).unwrap().0, 409);
        assert_eq!(
            c.request("DELETE", &format!("{lb_path}?cascade=true"), None)
                .unwrap()
                .0,
            204
        );
        for collection in ["loadbalancers", "listeners", "pools", "members"] {
            let (_, left, _) = c
                .request("GET", &format!("/v2/lbaas/{collection}"), None)
                .unwrap();
            assert_eq!(left[collection], json!([]), "{collection}");
        }
        assert!(c.get::<Port>(vip.id.as_str()).is_err());

        // The Mizar-MP route shape, with a subnet ID where the network ID goes.
        let (s, v, _) = c
            .request("POST", "/project/p1/ports", Some(&json!({"port": {"id": "0b6a3d8e-0000-4000-8000-000000000001", "network_id": sub.id,
                "veth_name": "eth0", "veth_namespace": "/var/run/netns/x", "fast_path": true, "binding:host_id": "node-1",
                "binding:profile": null, "allowed_address_pairs": [{}], "dns_name": "myport"}})))
            .unwrap();
        assert_eq!(s, 201, "{v}");
        assert_eq!(v["port"]["network_ns"], "/var/run/netns/x");
        c.set_port_status("0b6a3d8e-0000-4000-8000-000000000001", Status::Active)
            .unwrap();
        let (_, v, _) = c
            .request(
                "GET",
                "/project/p1/ports/0b6a3d8e-0000-4000-8000-000000000001",
                None,
            )
            .unwrap();
        assert_eq!(v["port"]["status"], "UP");
        let (_, v, _) = c
            .request("GET", &format!("/project/p1/subnets/{}", sub.id), None)
            .unwrap();
        assert_eq!(v["subnet"]["gateway_ip"], "10.0.0.1");
        let (s, _, _) = c
            .request(
                "DELETE",
                "/project/p1/ports/0b6a3d8e-0000-4000-8000-000000000001",
                None,
            )
            .unwrap();
        assert_eq!(s, 200);

        // The API describes itself.
        let (s, doc, _) = c.request("GET", "/openapi.json", None).unwrap();
        assert_eq!(s, 200);
        assert!(doc["paths"]["/v2.0/ports/{id}"]["put"].is_object());
        // What an update may set is what a show answers: the allow-list and the schema come
        // from one description, and this holds it to the model. Mizar-MP's optional port
        // attributes are shown only once set.
        for (path, singular, id) in [
            ("/v2.0/networks", "network", &net.id),
            ("/v2.0/subnets", "subnet", &sub.id),
            ("/v2.0/ports", "port", &auto.id),
        ] {
            let item = format!("{path}/{{id}}");
            let update = &doc["paths"][&item]["put"]["requestBody"]["content"]["application/json"]
                ["schema"]["properties"][singular]["properties"];
            let (_, shown, _) = c.request("GET", &format!("{path}/{id}"), None).unwrap();
            let names: Vec<&String> = update.as_object().expect(&item).keys().collect();
            assert!(names.len() > 3, "{item}: {names:?}");
            for name in names {
                let optional = ["veth_name", "network_ns", "fast_path"].contains(&name.as_str());
                assert!(
                    optional || shown[singular].get(name).is_some(),
                    "{singular} takes {name} but does not show it: {shown}"
                );
            }
        }
        // Clients probe extensions before they start (kuryr-libnetwork needs
        // subnet_allocation, and tags only with a tag extension listed).
        let (s, ext, _) = c
            .request("GET", "/v2.0/extensions/subnet_allocation", None)
            .unwrap();
        assert_eq!(
            (s, ext["extension"]["alias"].as_str()),
            (200, Some("subnet_allocation"))
        );
        let (s, ext, _) = c.request("GET", "/v2.0/extensions/router", None).unwrap();
        assert_eq!(
            (s, ext["extension"]["alias"].as_str()),
            (200, Some("router")),
            "routers are served, so the router extension is listed"
        );
        let (s, _, _) = c.request("GET", "/v2.0/extensions/qos", None).unwrap();
        assert_eq!(s, 404, "an extension not served is not listed");
        // python-neutronclient puts `.json` after every path, as Neutron allows.
        let (s, ext, _) = c
            .request("GET", "/v2.0/extensions/subnet_allocation.json", None)
            .unwrap();
        assert_eq!(
            (s, ext["extension"]["alias"].as_str()),
            (200, Some("subnet_allocation"))
        );
        let (s, v, _) = c
            .request("GET", "/v2.0/ports.json?device_id=dev-b&fields=id", None)
            .unwrap();
        assert_eq!(
            (s, v["ports"][0]["id"].as_str()),
            (200, Some(auto.id.as_str()))
        );
        let (s, v, _) = c
            .request(
                "POST",
                "/v2.0/networks.json",
                Some(&json!({"network": {"name": "suffixed"}})),
            )
            .unwrap();
        assert_eq!(s, 201, "{v}");
        let (s, _, _) = c
            .request(
                "PUT",
                &format!(
                    "/v2.0/networks/{}/tags/from-cli.json",
                    v["network"]["id"].as_str().unwrap()
                ),
                None,
            )
            .unwrap();
        assert_eq!(s, 201);
        let (s, v, _) = c
            .request(
                "GET",
                &format!(
                    "/v2.0/networks/{}.json",
                    v["network"]["id"].as_str().unwrap()
                ),
                None,
            )
            .unwrap();
        assert_eq!((s, &v["network"]["tags"]), (200, &json!(["from-cli"])));
        let (_, all, _) = c.request("GET", "/v2.0/extensions", None).unwrap();
        assert!(all["extensions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["alias"] == "standard-attr-tag"));
    });
}

/// The IDs of the ports a watch page's events name, in order.
fn port_ids(page: &corvid_api::WatchPage) -> Vec<&str> {
    page.events
        .iter()
        .filter(|e| e.resource == "ports")
        .map(|e| e.id.as_str())
        .collect()
}

/// The feed of the ports bound to host `node-1`.
const NODE1: WatchFilter<'static> = WatchFilter {
    host_id: Some("node-1"),
    resource: None,
};

#[test]
fn watch_feed_resumes_without_gaps_and_filters_by_host() {
    on_both(|ctl| {
        let c = ctl.client();
        let node1 = NODE1;
        let (net, _) = network_with_subnet(&c, "10.1.0.0/24", json!(null));
        let (_, start) = c.list::<Port>(&[]).unwrap();
        let mine: Port = c
            .create(json!({"network_id": net.id, "binding:host_id": "node-1"}))
            .unwrap();
        let _other: Port = c
            .create(json!({"network_id": net.id, "binding:host_id": "node-2"}))
            .unwrap();
        let page = c.watch(start, &node1, Duration::from_secs(1)).unwrap();
        assert_eq!(port_ids(&page), [mine.id.as_str()]);
        // A long poll wakes on the next change, and resuming repeats nothing.
        let waiter = {
            let c = c.clone();
            std::thread::spawn(move || c.watch(page.revision, &node1, Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(200));
        c.delete::<Port>(&mine.id).unwrap();
        let next = waiter.join().unwrap().unwrap();
        assert_eq!(next.events.len(), 1, "{next:?}");
        assert_eq!(
            (next.events[0].kind, next.events[0].id.as_str()),
            (EventKind::Delete, mine.id.as_str())
        );
        assert!(next.revision > page.revision);
        let empty = c
            .watch(next.revision, &node1, Duration::from_secs(0))
            .unwrap();
        assert!(empty.events.is_empty());
        assert_eq!(
            kind(c.watch(-5, &WatchFilter::default(), Duration::from_secs(0))).0,
            410
        );
    });
}

/// The streamed feed: one request carries a host's port changes, each once and in order, with
/// an empty page while nothing comes; a place the feed no longer holds is refused with
/// 410 before the stream starts, and a bad `stream` with 400.
#[test]
fn the_streamed_feed_carries_each_change_once_on_one_request() {
    on_both(|ctl| {
        let c = ctl.client();
        let node1 = NODE1;
        let watches = || {
            let text = ureq::get(&format!("{}/metrics", c.base()))
                .call()
                .unwrap()
                .into_string()
                .unwrap();
            let labels = [("route", "/v2.0/watch"), ("code", "200")];
            sample(&text, "corvid_controller_requests_total", &labels)
        };
        let (net, _) = network_with_subnet(&c, "10.1.0.0/24", json!(null));
        let (_, start) = c.list::<Port>(&[]).unwrap();
        let before = watches();
        let mut watcher = Watcher::new(c.clone());
        let quiet_since = std::time::Instant::now();
        let quiet = watcher.next(start, &node1, Duration::from_secs(1)).unwrap();
        assert!(quiet.events.is_empty(), "{quiet:?}");
        assert!(quiet_since.elapsed() >= Duration::from_millis(900));
        assert!(quiet.revision >= start);
        let writer = {
            let (c, net) = (c.clone(), net.id.clone());
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for _ in 0..5 {
                    let p: Port = c
                        .create(json!({"network_id": net, "binding:host_id": "node-1"}))
                        .unwrap();
                    let _: Port = c
                        .create(json!({"network_id": net, "binding:host_id": "node-2"}))
                        .unwrap();
                    mine.push(p.id);
                }
                c.delete::<Port>(&mine[0]).unwrap();
                mine
            })
        };
        let mut seen = Vec::new();
        let mut since = quiet.revision;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while seen.len() < 6 {
            assert!(std::time::Instant::now() < deadline, "saw only {seen:?}");
            let page = watcher.next(since, &node1, Duration::from_secs(1)).unwrap();
            assert!(page.revision >= since);
            for e in &page.events {
                assert!(
                    e.revision > since && e.revision <= page.revision,
                    "{page:?}"
                );
                // The project's default security group comes with its first port: other
                // collections pass a host's filter whole.
                if e.resource == "ports" {
                    seen.push((e.kind, e.id.clone(), e.revision));
                }
            }
            since = page.revision;
        }
        let mine = writer.join().unwrap();
        let mut want: Vec<(EventKind, String)> =
            mine.iter().map(|id| (EventKind::Put, id.clone())).collect();
        want.push((EventKind::Delete, mine[0].clone()));
        let got: Vec<(EventKind, String)> =
            seen.iter().map(|(k, id, _)| (*k, id.clone())).collect();
        assert_eq!(got, want);
        assert!(seen.windows(2).all(|w| w[0].2 < w[1].2), "{seen:?}");
        // Another quiet page, still on the same request.
        let quiet = watcher.next(since, &node1, Duration::from_secs(1)).unwrap();
        assert!(quiet.events.is_empty(), "{quiet:?}");
        assert_eq!(
            watches() - before,
            1.0,
            "one watch request carried every page"
        );
        let refused = Watcher::new(c.clone())
            .next(-5, &WatchFilter::default(), Duration::from_secs(1))
            .unwrap_err();
        assert_eq!(refused.status(), Some(410), "{refused}");
        let (status, body, _) = c
            .request("GET", "/v2.0/watch?since=0&stream=maybe", None)
            .unwrap();
        assert_eq!(status, 400);
        assert!(
            body["NeutronError"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("stream must be true or false")),
            "{body}"
        );
    });
}

#[test]
fn a_host_resumes_the_watch_across_a_restart_on_etcd() {
    let etcd = Etcd::start();
    let mut ctl = ControllerProcess::start(&format!("etcd:{}", etcd.url), None);
    let c = ctl.client();
    let node1 = NODE1;
    let (net, _) = network_with_subnet(&c, "10.1.0.0/24", json!(null));
    let (_, seen) = c.list::<Port>(&[]).unwrap();
    // Changes the host has not seen when the controller dies, and one made while it is
    // down (by another controller on the store).
    let before: Port = c
        .create(json!({"network_id": net.id, "binding:host_id": "node-1"}))
        .unwrap();
    ctl.kill9();
    let other = ControllerProcess::start(&format!("etcd:{}", etcd.url), None);
    let meanwhile: Port = other
        .client()
        .create(json!({"network_id": net.id, "binding:host_id": "node-1"}))
        .unwrap();
    drop(other);
    ctl.restart();
    let page = ctl
        .client()
        .watch(seen, &node1, Duration::from_secs(1))
        .unwrap();
    assert_eq!(port_ids(&page), [before.id.as_str(), meanwhile.id.as_str()]);
    // The view came back current: what was written last is there.
    let (listed, _) = ctl.client().list::<Port>(&[]).unwrap();
    assert!(listed.iter().any(|p| p.id == meanwhile.id));
}

/// A `GET` of `path` on `url` with a client that waits as long as it takes: the status
/// and the body, or the transport's error.
fn get(url: &str, path: &str) -> Result<(u16, String), String> {
    match ureq::get(&format!("{url}{path}")).call() {
        Ok(r) => Ok((r.status(), r.into_string().unwrap_or_default())),
        Err(ureq::Error::Status(code, r)) => Ok((code, r.into_string().unwrap_or_default())),
        Err(e) => Err(e.to_string()),
    }
}

/// A starting controller takes connections while it loads its view: `/healthz` answers,
/// `/readyz` says why it is not ready, and an API request waits and is answered from
/// the loaded view instead of being refused (so a thousand agents do not each sleep
/// their backoff after the load). One stopped during the load answers what waits 503
/// and ends. The load is held up by the test's own etcd, stopped with SIGSTOP.
#[test]
fn a_starting_controller_holds_requests_until_its_view_is_loaded() {
    let etcd = support::EtcdCluster::start(1);
    let store = etcd.store();
    let (net, _) = network_with_subnet(
        &ControllerProcess::start(&store, None).client(),
        "10.7.0.0/24",
        json!(null),
    );
    let shown = format!("/v2.0/networks/{}", net.id);

    etcd.freeze(0, true);
    let mut stopped = ControllerProcess::spawn(&store, None);
    let t = std::time::Instant::now();
    while get(&stopped.url, "/healthz").is_err() {
        assert!(t.elapsed() < Duration::from_secs(20), "never bound");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, why) = get(&stopped.url, "/readyz").unwrap();
    assert_eq!(code, 503);
    assert!(why.contains("loading its view"), "{why}");
    let url = stopped.url.clone();
    let path = shown.clone();
    let waiting = std::thread::spawn(move || get(&url, &path));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !waiting.is_finished(),
        "answered before the view was loaded"
    );
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &stopped.pid().to_string()])
        .status();
    let (code, body) = waiting.join().unwrap().expect("answered, not cut off");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("ServiceUnavailable"), "{body}");
    let t = std::time::Instant::now();
    while !stopped.exited() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "still running after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let starting = ControllerProcess::spawn(&store, None);
    let t = std::time::Instant::now();
    while get(&starting.url, "/healthz").is_err() {
        assert!(t.elapsed() < Duration::from_secs(20), "never bound");
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = starting.url.clone();
    let waiting = std::thread::spawn(move || get(&url, &shown));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !waiting.is_finished(),
        "answered before the view was loaded"
    );
    etcd.freeze(0, false);
    let (code, body) = waiting.join().unwrap().expect("answered, not refused");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(&net.id), "{body}");
    assert_eq!(get(&starting.url, "/readyz").unwrap().0, 200);
}

/// A snapshot on etcd reads every key of the prefixes asked exactly once across pages
/// (of three keys here), all as of one revision however the store moves on, and says
/// `Compacted` for a revision etcd no longer holds.
#[test]
fn an_etcd_snapshot_reads_every_key_once_across_pages_at_one_revision() {
    use base64::Engine;
    use corvid_controller::store::{etcd::EtcdStore, Store, StoreError};
    let etcd = Etcd::start();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let call = |path: &str, body: Value| -> Value {
        ureq::post(&format!("{}{path}", etcd.url))
            .send_json(body)
            .unwrap()
            .into_json()
            .unwrap()
    };
    let put = |k: &str, v: &str| {
        let answer = call("/v3/kv/put", json!({"key": b64(k), "value": b64(v)}));
        answer["header"]["revision"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .unwrap()
    };
    let mut want = Vec::new();
    for i in 0..10 {
        for prefix in ["/corvid/r/ports/", "/corvid/ip/s/", "/corvid/netuse/n/"] {
            let key = format!("{prefix}{i:02}");
            put(&key, "old");
            if !key.contains("netuse") {
                want.push(key);
            }
        }
    }
    // Neighbours of the prefixes, which no page may reach into.
    put("/corvid/r0", "x");
    let at = put("/corvid/ip", "x");
    let store = EtcdStore::connect(&etcd.url).unwrap().with_range_page(3);
    let prefixes = ["/corvid/r/", "/corvid/ip/"];
    // Both reads, whole and a page at a time, must give the same keys.
    let read = |revision| {
        let (kvs, at) = store.snapshot(&prefixes, revision).unwrap();
        let mut batches = Vec::new();
        let batched_at = store
            .snapshot_batches(&prefixes, revision, &mut |kvs| batches.push(kvs))
            .unwrap();
        assert_eq!(batched_at, at);
        assert!(batches.iter().all(|b| b.len() <= 3), "pages of three");
        let batched: Vec<(String, Vec<u8>)> = batches
            .into_iter()
            .flatten()
            .map(|kv| (kv.key, kv.value))
            .collect();
        let whole: Vec<(String, Vec<u8>)> = kvs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect();
        assert_eq!(batched, whole);
        let mut keys: Vec<String> = kvs.iter().map(|kv| kv.key.clone()).collect();
        keys.sort();
        let values: Vec<Vec<u8>> = kvs.into_iter().map(|kv| kv.value).collect();
        (keys, values)
    };
    want.sort();
    let (keys, values) = read(None);
    assert_eq!(keys, want);
    assert!(values.iter().all(|v| v == b"old"));
    // Changed, added and deleted since: a snapshot at `at` still reads the old store.
    put("/corvid/r/ports/05", "new");
    put("/corvid/ip/s/99", "new");
    call("/v3/kv/deleterange", json!({"key": b64("/corvid/ip/s/03")}));
    let (keys, values) = read(Some(at));
    assert_eq!(keys, want);
    assert!(values.iter().all(|v| v == b"old"));
    let (keys, _) = read(None);
    assert_eq!(keys.len(), want.len());
    assert!(keys.contains(&"/corvid/ip/s/99".to_string()));
    call(
        "/v3/kv/compaction",
        json!({"revision": (at + 2).to_string()}),
    );
    assert!(matches!(
        store.snapshot(&prefixes, Some(at)),
        Err(StoreError::Compacted(r)) if r == at
    ));
    assert!(matches!(
        store.snapshot_batches(&prefixes, Some(at), &mut |_| {}),
        Err(StoreError::Compacted(r)) if r == at
    ));
}

/// A controller starting on an etcd compacted past the history it would load from
/// reads the present instead, and holds every object.
#[test]
fn a_controller_starts_on_a_compacted_etcd() {
    let etcd = Etcd::start();
    let store = format!("etcd:{}", etcd.url);
    let mut ctl = ControllerProcess::start(&store, None);
    let (net, _) = network_with_subnet(&ctl.client(), "10.6.0.0/24", json!(null));
    let port: Port = ctl.client().create(json!({"network_id": net.id})).unwrap();
    ctl.kill9();
    let revision = ureq::post(&format!("{}/v3/kv/range", etcd.url))
        .send_json(json!({"key": "eA=="}))
        .unwrap()
        .into_json::<Value>()
        .unwrap()["header"]["revision"]
        .as_str()
        .unwrap()
        .to_string();
    ureq::post(&format!("{}/v3/kv/compaction", etcd.url))
        .send_json(json!({"revision": revision}))
        .unwrap();
    ctl.restart();
    let (ports, _) = ctl.client().list::<Port>(&[]).unwrap();
    assert_eq!(ports.iter().map(|p| &p.id).collect::<Vec<_>>(), [&port.id]);
    let (nets, _) = ctl.client().list::<Network>(&[]).unwrap();
    assert!(nets.iter().any(|n| n.id == net.id));
}

/// An etcd others write to as well (a cluster's own etcd, shared): their writes move the
/// store's revision with no event under corvid's prefix. A controller must not wait for
/// events that never come (at start, or before answering a 404), call its view stale,
/// or open its watch again and again.
#[test]
fn a_controller_shares_its_etcd_with_other_writers() {
    let etcd = Etcd::start();
    let mut ctl = ControllerProcess::start(&format!("etcd:{}", etcd.url), None);
    let (net, _) = network_with_subnet(&ctl.client(), "10.1.0.0/24", json!(null));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, put) = (stop.clone(), format!("{}/v3/kv/put", etcd.url));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // "/other/k", written by another user of the etcd.
                let _ = ureq::post(&put).send_json(json!({"key": "L290aGVyL2s=", "value": "eA=="}));
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // Answering within the harness's 20 s: the view is current once its own mark of
    // progress comes back, not once events reach a revision others made.
    ctl.restart();
    let networks = format!("{}/v2.0/networks", ctl.url);
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(500));
        let answer = ureq::get(&networks).call().unwrap();
        assert_eq!(answer.header("x-corvid-stale"), Some("false"));
    }
    let c = ctl.client();
    let started = std::time::Instant::now();
    let err = c
        .create::<Port>(json!({"network_id": "5f0a1e58-0000-4000-8000-000000000000"}))
        .unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a 404 waited {:?} for the view",
        started.elapsed()
    );
    c.create::<Port>(json!({"network_id": net.id})).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
}

/// A start replays the store's recent history through the watch, up to 1,000 revisions
/// a message: more than gRPC's default 4 MB of it (here 1,200 writes of 6 KB, by another
/// user of the etcd) still brings the view to the present.
#[test]
fn a_controller_replays_more_than_four_megabytes_of_history_at_start() {
    let etcd = Etcd::start();
    let mut ctl = ControllerProcess::start(&format!("etcd:{}", etcd.url), None);
    let (net, _) = network_with_subnet(&ctl.client(), "10.1.0.0/24", json!(null));
    ctl.kill9();
    use base64::engine::general_purpose::STANDARD as B64;
    use base64::Engine;
    let agent = ureq::AgentBuilder::new().build();
    let value = B64.encode("x".repeat(6 << 10));
    for i in 0..1200 {
        let key = B64.encode(format!("/corvid/bulk/{i:04}"));
        agent
            .post(&format!("{}/v3/kv/put", etcd.url))
            .send_json(json!({"key": key, "value": value}))
            .unwrap();
    }
    ctl.restart();
    let answer = ureq::get(&format!("{}/v2.0/networks", ctl.url))
        .call()
        .unwrap();
    assert_eq!(answer.header("x-corvid-stale"), Some("false"));
    let started = std::time::Instant::now();
    ctl.client()
        .create::<Port>(json!({"network_id": net.id}))
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a create waited {:?} for the view",
        started.elapsed()
    );
}

#[test]
fn a_quiet_host_is_not_sent_to_list_again_by_other_hosts_changes() {
    let (_dir, spec) = redb_store();
    let ctl = ControllerProcess::start(&spec, None);
    let c = ctl.client();
    let (net, _) = network_with_subnet(&c, "10.8.0.0/16", json!(null));
    let (_, seen) = c.list::<Port>(&[]).unwrap();
    // More changes of node-2's ports than the feed keeps.
    for _ in 0..11 {
        let ports = (0..1000)
            .map(|_| json!({"network_id": net.id, "binding:host_id": "node-2", "port_security_enabled": false}))
            .collect();
        c.create_bulk::<Port>(ports).unwrap();
    }
    let node = |h| WatchFilter {
        host_id: Some(h),
        ..WatchFilter::default()
    };
    // node-1 saw nothing of its own go: it resumes where it was.
    let page = c
        .watch(seen, &node("node-1"), Duration::from_secs(0))
        .unwrap();
    assert!(page.events.is_empty(), "{page:?}");
    assert!(page.revision > seen);
    // node-2, and an unfiltered follower, lost changes: they list again.
    for filter in [node("node-2"), WatchFilter::default()] {
        assert_eq!(kind(c.watch(seen, &filter, Duration::from_secs(0))).0, 410);
    }
}

/// Creates ports on `net` from `n` threads at once; returns the addresses handed out and
/// the errors.
fn concurrent_creates(
    clients: &[Client],
    net: &str,
    n: usize,
) -> (Vec<IpAddr>, Vec<(u16, String)>) {
    let ips = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (c, net, ips, errors) = (
                clients[i % clients.len()].clone(),
                net.to_string(),
                ips.clone(),
                errors.clone(),
            );
            std::thread::spawn(move || match c.create::<Port>(json!({"network_id": net})) {
                Ok(p) => ips.lock().unwrap().push(p.fixed_ips[0].ip_address),
                Err(e) => errors
                    .lock()
                    .unwrap()
                    .push((e.status().unwrap_or(0), e.to_string())),
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let ips = ips.lock().unwrap().clone();
    let errors = errors.lock().unwrap().clone();
    (ips, errors)
}

#[test]
fn concurrent_creates_get_distinct_addresses_until_exhausted() {
    on_both(|ctl| {
        let c = ctl.client();
        let (net, _) = network_with_subnet(&c, "10.2.0.0/24", json!(null));
        let (ips, errors) = concurrent_creates(std::slice::from_ref(&c), &net.id, 200);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            ips.iter().collect::<HashSet<_>>().len(),
            200,
            "200 distinct addresses"
        );
        let (more, errors) = concurrent_creates(std::slice::from_ref(&c), &net.id, 55);
        assert_eq!(more.len(), 54, "254 addresses in all");
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0, 409);
        assert!(
            errors[0].1.contains("IpAddressGenerationFailure"),
            "{errors:?}"
        );
        let all: HashSet<_> = ips.iter().chain(&more).collect();
        assert_eq!(all.len(), 254);
    });
}

#[test]
fn two_controllers_on_one_etcd_never_share_an_address() {
    let etcd = Etcd::start();
    let spec = format!("etcd:{}", etcd.url);
    let (a, b) = (
        ControllerProcess::start(&spec, None),
        ControllerProcess::start(&spec, None),
    );
    let net: Network = a.client().create(json!({"name": "shared"})).unwrap();
    a.client()
        .create::<Subnet>(json!({"network_id": net.id, "cidr": "10.3.0.0/24", "gateway_ip": null}))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let (ips, errors) = concurrent_creates(&[a.client(), b.client()], &net.id, 240);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(ips.iter().collect::<HashSet<_>>().len(), 240);
    // Each controller reads its own writes at once; the other's arrive through its etcd
    // watch, a moment later on a loaded machine.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (seen_by_b, _) = b.client().list::<Port>(&[("network_id", &net.id)]).unwrap();
        if seen_by_b.len() == 240 || std::time::Instant::now() > deadline {
            assert_eq!(seen_by_b.len(), 240, "b's view of the ports");
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_write_on_one_controller_names_what_another_just_made() {
    // A network made on a is at once the network of a subnet asked of b, and a subnet
    // of b that of a port asked of a: a controller whose view has not caught up yet
    // asks the store before it answers "not found". The window is a few milliseconds on
    // an idle machine (the CI run that found it was loaded), so many rounds are tried.
    let etcd = Etcd::start();
    let spec = format!("etcd:{}", etcd.url);
    let (a, b) = (
        ControllerProcess::start(&spec, None),
        ControllerProcess::start(&spec, None),
    );
    for i in 0..120 {
        let net: Network = a.client().create(json!({"name": format!("n{i}")})).unwrap();
        let subnet: Subnet = b
            .client()
            .create(
                json!({"network_id": net.id, "cidr": format!("10.4.{i}.0/24"), "ip_version": 4}),
            )
            .unwrap_or_else(|e| panic!("round {i}: subnet on b: {e}"));
        a.client()
            .create::<Port>(json!({"network_id": net.id, "fixed_ips": [{"subnet_id": subnet.id}]}))
            .unwrap_or_else(|e| panic!("round {i}: port on a: {e}"));
    }
    // What exists nowhere is still "not found", once the store has been asked.
    let e = b
        .client()
        .create::<Subnet>(json!({"network_id": "0190e5a5-0000-7000-8000-000000000000", "cidr": "10.5.0.0/24", "ip_version": 4}))
        .unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");
}

#[test]
fn a_killed_controller_keeps_every_acknowledged_create() {
    let (_dir, spec) = redb_store();
    let etcd = Etcd::start();
    for spec in [spec, format!("etcd:{}", etcd.url)] {
        let mut ctl = ControllerProcess::start(&spec, None);
        let c = ctl.client();
        let (net, sub) = network_with_subnet(&c, "10.4.0.0/16", json!("10.4.0.1"));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let writers: Vec<_> = (0..4)
            .map(|_| {
                let (c, net, acked) = (c.clone(), net.id.clone(), acked.clone());
                std::thread::spawn(move || {
                    while let Ok(p) = c.create::<Port>(json!({"network_id": net})) {
                        acked.lock().unwrap().push(p);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(700));
        ctl.kill9();
        for w in writers {
            w.join().unwrap();
        }
        ctl.restart();
        let c = ctl.client();
        let acked = acked.lock().unwrap().clone();
        assert!(
            acked.len() > 10,
            "the stream made progress: {}",
            acked.len()
        );
        let (stored, _) = c.list::<Port>(&[("network_id", &net.id)]).unwrap();
        let stored_ids: HashSet<&str> = stored.iter().map(|p| p.id.as_str()).collect();
        for p in &acked {
            assert!(
                stored_ids.contains(p.id.as_str()),
                "acknowledged port {} lost",
                p.id
            );
            assert_eq!(c.get::<Port>(&p.id).unwrap(), *p);
        }
        // Nothing half-written: every stored port holds its address and MAC, so reusing
        // them conflicts, and a fresh create still works.
        let any = &stored[0];
        let reuse = c.create::<Port>(json!({"network_id": net.id, "fixed_ips": [{"subnet_id": sub.id, "ip_address": any.fixed_ips[0].ip_address}]}));
        assert_eq!(kind(reuse).1, "IpAddressAlreadyAllocated");
        assert_eq!(
            kind(c.create::<Port>(json!({"network_id": net.id, "mac_address": any.mac_address}))).1,
            "MacAddressInUse"
        );
        let addrs: HashSet<IpAddr> = stored.iter().map(|p| p.fixed_ips[0].ip_address).collect();
        assert_eq!(addrs.len(), stored.len());
        c.create::<Port>(json!({"network_id": net.id})).unwrap();
    }
}

/// The view works the taken addresses and MACs out of the objects it loads, not out of
/// the store's reservation keys: after a restart a port's address and MAC and a floating
/// IP's address (whose subnet is found through its network, which loads after it) are
/// still taken, new ones are picked around them, and their subnets are still in use.
#[test]
fn a_restarted_controller_knows_every_address_and_mac_taken() {
    let (_dir, spec) = redb_store();
    let etcd = Etcd::start();
    for spec in [spec, format!("etcd:{}", etcd.url)] {
        let mut ctl = ControllerProcess::start(&spec, None);
        let c = ctl.client();
        let ext: Network = c
            .create(json!({"name": "public", "router:external": true}))
            .unwrap();
        let public: Subnet = c
            .create(json!({"network_id": ext.id, "cidr": "172.26.0.0/29"}))
            .unwrap();
        let fip: FloatingIp = c
            .create(json!({"floating_network_id": ext.id, "floating_ip_address": "172.26.0.4"}))
            .unwrap();
        let (net, sub) = network_with_subnet(&c, "10.8.0.0/29", json!("10.8.0.1"));
        let port: Port = c
            .create(json!({"network_id": net.id, "fixed_ips": [{"subnet_id": sub.id, "ip_address": "10.8.0.3"}]}))
            .unwrap();
        ctl.kill9();
        ctl.restart();
        let c = ctl.client();

        let again = c.create::<FloatingIp>(
            json!({"floating_network_id": ext.id, "floating_ip_address": "172.26.0.4"}),
        );
        assert_eq!(kind(again), (409, "IpAddressAlreadyAllocated".into()));
        let again = c.create::<Port>(json!({"network_id": net.id, "fixed_ips": [{"subnet_id": sub.id, "ip_address": "10.8.0.3"}]}));
        assert_eq!(kind(again), (409, "IpAddressAlreadyAllocated".into()));
        let again =
            c.create::<Port>(json!({"network_id": net.id, "mac_address": port.mac_address}));
        assert_eq!(kind(again), (409, "MacAddressInUse".into()));
        assert_eq!(kind(c.delete::<Subnet>(&public.id)).0, 409);
        assert_eq!(kind(c.delete::<Subnet>(&sub.id)).0, 409);

        // The rest of each /29's pool (.2 to .6) goes to new ones, around the taken address.
        let fips: Vec<IpAddr> = std::iter::from_fn(|| {
            c.create::<FloatingIp>(json!({"floating_network_id": ext.id}))
                .ok()
                .map(|f| f.floating_ip_address)
        })
        .collect();
        let ports: Vec<IpAddr> = std::iter::from_fn(|| {
            c.create::<Port>(json!({"network_id": net.id}))
                .ok()
                .map(|p| p.fixed_ips[0].ip_address)
        })
        .collect();
        for (got, taken, prefix) in [(&fips, 4, "172.26.0"), (&ports, 3, "10.8.0")] {
            let want: HashSet<IpAddr> = (2..=6)
                .filter(|n| *n != taken)
                .map(|n| format!("{prefix}.{n}").parse().unwrap())
                .collect();
            assert_eq!(got.iter().copied().collect::<HashSet<_>>(), want);
            assert_eq!(got.len(), want.len(), "an address given twice: {got:?}");
        }
        c.delete::<FloatingIp>(&fip.id).unwrap();
        let freed = c.create::<FloatingIp>(
            json!({"floating_network_id": ext.id, "floating_ip_address": "172.26.0.4"}),
        );
        assert!(
            freed.is_ok(),
            "the deleted floating IP's address is free: {freed:?}"
        );
    }
}

/// A deleted port gives back its MAC with its address: a new port asking for the same
/// pair gets it. Docker derives a container's MAC from its address, so a reused address
/// comes back with the MAC it had; a leaked MAC would refuse it (409 MacAddressInUse).
#[test]
fn a_deleted_port_frees_its_mac_and_address_for_the_next_port() {
    on_both(|ctl| {
        let c = ctl.client();
        let (net, sub) = network_with_subnet(&c, "10.6.0.0/24", json!("10.6.0.1"));
        let asked = json!({"network_id": net.id, "mac_address": "02:42:0a:06:00:07",
            "fixed_ips": [{"subnet_id": sub.id, "ip_address": "10.6.0.7"}]});
        // Both delete routes: Neutron's and the Mizar-MP agreement's.
        for mizar in [false, true, false] {
            let p: Port = c
                .create(asked.clone())
                .unwrap_or_else(|e| panic!("after a delete (mizar: {mizar}): {e}"));
            assert_eq!(p.mac_address, "02:42:0a:06:00:07");
            assert_eq!(p.fixed_ips[0].ip_address.to_string(), "10.6.0.7");
            if mizar {
                let path = format!("/project/{}/ports/{}", p.project_id, p.id);
                let (status, body, _) = c.request("DELETE", &path, None).unwrap();
                assert_eq!(status, 200, "{body}");
            } else {
                c.delete::<Port>(&p.id).unwrap();
            }
        }
    });
}

#[test]
fn a_token_is_required_when_configured() {
    let (_dir, spec) = redb_store();
    let ctl = ControllerProcess::start(&spec, Some("s3cret"));
    assert!(ctl.client().list::<Network>(&[]).is_ok());
    let anonymous = Client::new(&ctl.url);
    assert_eq!(kind(anonymous.list::<Network>(&[])).0, 401);
    assert_eq!(
        kind(anonymous.clone().with_token("wrong").list::<Network>(&[])).0,
        401
    );
}

#[test]
fn updates_move_addresses_and_reshape_subnets_on_both_ip_versions() {
    on_both(|ctl| {
        let c = ctl.client();
        let (net, v4) = network_with_subnet(&c, "10.5.0.0/24", json!("10.5.0.1"));
        let v6: Subnet = c
            .create(json!({"network_id": net.id, "cidr": "fd05::/64", "ip_version": 6}))
            .unwrap();
        assert_eq!(
            (v6.ip_version, v6.gateway_ip.map(|g| g.to_string())),
            (6, Some("fd05::1".into()))
        );
        assert_eq!(v6.allocation_pools[0].start.to_string(), "fd05::2");
        let mismatch = c.create::<Subnet>(
            json!({"network_id": net.id, "cidr": "10.6.0.0/24", "ip_version": 6}),
        );
        assert_eq!(kind(mismatch).0, 400);

        // A port gets one address of each version.
        let port: Port = c.create(json!({"network_id": net.id})).unwrap();
        let by_version = |p: &Port, v6: bool| -> Vec<IpAddr> {
            p.fixed_ips
                .iter()
                .map(|f| f.ip_address)
                .filter(|a| a.is_ipv6() == v6)
                .collect()
        };
        let (old4, old6) = (by_version(&port, false), by_version(&port, true));
        assert_eq!((old4.len(), old6.len()), (1, 1), "{:?}", port.fixed_ips);
        assert!(v6.cidr.contains(&old6[0]));

        // fixed_ips on update is the whole new list: keep the IPv4 address, add a chosen
        // one (not the one the picker took), drop the IPv6 one.
        let chosen = if old4[0].to_string() == "10.5.0.200" {
            "10.5.0.201"
        } else {
            "10.5.0.200"
        };
        let moved: Port = c
            .update(
                &port.id,
                json!({"fixed_ips": [
                {"ip_address": old4[0]},
                {"subnet_id": v4.id, "ip_address": chosen}]}),
            )
            .unwrap();
        let addrs: Vec<String> = moved
            .fixed_ips
            .iter()
            .map(|f| f.ip_address.to_string())
            .collect();
        assert_eq!(addrs, [old4[0].to_string(), chosen.to_string()]);
        c.create::<Port>(json!({"network_id": net.id, "fixed_ips": [{"subnet_id": v6.id, "ip_address": old6[0]}]}))
            .expect("the dropped IPv6 address is free again");
        let taken = c.update::<Port>(&port.id, json!({"fixed_ips": [{"ip_address": old6[0]}]}));
        assert_eq!(kind(taken), (409, "IpAddressAlreadyAllocated".into()));
        let (_, other) = network_with_subnet(&c, "10.7.0.0/24", json!(null));
        let elsewhere = c.update::<Port>(&port.id, json!({"fixed_ips": [{"subnet_id": other.id}]}));
        assert_eq!(kind(elsewhere).0, 400);
        assert_eq!(c.get::<Port>(&port.id).unwrap().fixed_ips, moved.fixed_ips);

        // An address under a floating IP stays until the floating IP lets go.
        let ext: Network = c
            .create(json!({"name": "ext", "router:external": true}))
            .unwrap();
        c.create::<Subnet>(json!({"network_id": ext.id, "cidr": "172.25.0.0/24"}))
            .unwrap();
        edge_router(&c, &ext, &v4);
        let fip: FloatingIp = c
            .create(json!({"floating_network_id": ext.id, "port_id": port.id, "fixed_ip_address": chosen}))
            .unwrap();
        let lose = c.update::<Port>(&port.id, json!({"fixed_ips": [{"ip_address": old4[0]}]}));
        assert_eq!(kind(lose), (409, "IpAddressInUse".into()));
        c.update::<FloatingIp>(&fip.id, json!({"port_id": null}))
            .unwrap();
        let shrunk: Port = c
            .update(&port.id, json!({"fixed_ips": [{"ip_address": old4[0]}]}))
            .unwrap();
        assert_eq!(shrunk.fixed_ips.len(), 1);
        c.create::<Port>(json!({"network_id": net.id, "fixed_ips": [{"ip_address": chosen}]}))
            .expect("the chosen address is free again");

        // Subnet updates: the gateway stays out of the pools, the pools inside the cidr.
        let clash = c.update::<Subnet>(&v4.id, json!({"gateway_ip": "10.5.0.50"}));
        assert_eq!(
            kind(clash),
            (409, "GatewayConflictWithAllocationPools".into())
        );
        let outside = c.update::<Subnet>(
            &v4.id,
            json!({"allocation_pools": [{"start": "10.5.0.10", "end": "10.5.1.20"}]}),
        );
        assert_eq!(kind(outside).0, 400);
        let reshaped: Subnet = c
            .update(
                &v4.id,
                json!({"gateway_ip": "10.5.0.254",
                "allocation_pools": [{"start": "10.5.0.10", "end": "10.5.0.100"}],
                "dns_nameservers": ["10.5.0.53"],
                "host_routes": [{"destination": "192.0.2.0/24", "nexthop": "10.5.0.254"}]}),
            )
            .unwrap();
        assert_eq!(
            reshaped.gateway_ip.map(|g| g.to_string()),
            Some("10.5.0.254".into())
        );
        assert_eq!(reshaped.dns_nameservers, ["10.5.0.53"]);
        assert_eq!(
            reshaped.host_routes[0].destination.to_string(),
            "192.0.2.0/24"
        );
        let (ips, errors) = concurrent_creates(std::slice::from_ref(&c), &net.id, 20);
        assert!(errors.is_empty(), "{errors:?}");
        for ip in ips.iter().filter(|ip| ip.is_ipv4()) {
            let last = match ip {
                IpAddr::V4(a) => a.octets()[3],
                IpAddr::V6(_) => unreachable!(),
            };
            assert!((10..=100).contains(&last), "{ip} is outside the new pool");
        }
        let no_gateway: Subnet = c.update(&v4.id, json!({"gateway_ip": null})).unwrap();
        assert_eq!(no_gateway.gateway_ip, None);

        // The Mizar-MP route takes a bulk create too.
        let (s, v, _) = c
            .request(
                "POST",
                "/project/p1/ports",
                Some(
                    &json!({"ports": [{"network_id": net.id, "veth_name": "eth0"},
                                       {"network_id": net.id, "veth_name": "eth1"}]}),
                ),
            )
            .unwrap();
        assert_eq!(s, 201, "{v}");
        assert_eq!(v["ports"].as_array().map(Vec::len), Some(2));
    });
}

#[test]
fn a_bulk_too_large_for_etcd_is_refused_whole_and_redb_takes_it() {
    // A port with a security group takes one more key (its group's use of it) than one
    // without port security.
    let bulk = |c: &Client, net: &str, n: usize, secured: bool| {
        c.create_bulk::<Port>(
            (0..n)
                .map(|_| json!({"network_id": net, "port_security_enabled": secured}))
                .collect(),
        )
    };
    let (_dir, spec) = redb_store();
    let redb = ControllerProcess::start(&spec, None);
    let c = redb.client();
    let (net, _) = network_with_subnet(&c, "10.8.0.0/16", json!(null));
    assert_eq!(bulk(&c, &net.id, 300, true).unwrap().len(), 300);

    let etcd = Etcd::start();
    let ctl = ControllerProcess::start(&format!("etcd:{}", etcd.url), None);
    let c = ctl.client();
    let (net, _) = network_with_subnet(&c, "10.8.0.0/16", json!(null));
    assert_eq!(
        bulk(&c, &net.id, 24, true).unwrap().len(),
        24,
        "24 ports with the default group, made with them, fit etcd's default --max-txn-ops"
    );
    assert_eq!(
        bulk(&c, &net.id, 32, false).unwrap().len(),
        32,
        "32 ports without port security fit"
    );
    match bulk(&c, &net.id, 26, true) {
        Err(corvid_api::ApiError::Neutron {
            status,
            kind,
            message,
        }) => {
            assert_eq!((status, kind.as_str()), (400, "InvalidInput"));
            assert!(message.contains("--max-txn-ops"), "{message}");
        }
        other => panic!("expected a 400, got {other:?}"),
    }
    let (ports, _) = c.list::<Port>(&[("network_id", &net.id)]).unwrap();
    assert_eq!(ports.len(), 56, "nothing of the refused bulk was written");
}

#[test]
fn every_list_and_show_carries_the_revision_to_resume_the_watch_from() {
    // A client resumes the watch feed from a read's revision: a read without one once
    // resumed from 0, which a restarted controller's feed refuses for ever.
    on_both(|ctl| {
        let c = ctl.client();
        let (net, sub) = network_with_subnet(&c, "10.9.0.0/24", json!("10.9.0.1"));
        let port: Port = c.create(json!({"network_id": net.id})).unwrap();
        let pool: SubnetPool = c
            .create(json!({"name": "p", "prefixes": ["10.200.0.0/16"]}))
            .unwrap();
        c.register_host("h1", "10.0.0.1".parse().unwrap()).unwrap();
        let post = |path: &str, body: Value| -> Value {
            let (status, v, _) = c.request("POST", path, Some(&body)).unwrap();
            assert_eq!(status, 201, "{path}: {v}");
            v
        };
        let lb = post(
            "/v2/lbaas/loadbalancers",
            json!({"loadbalancer": {"vip_subnet_id": sub.id}}),
        )["loadbalancer"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let listener = post(
            "/v2/lbaas/listeners",
            json!({"listener": {"loadbalancer_id": lb, "protocol": "TCP", "protocol_port": 80}}),
        )["listener"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let lb_pool = post(
            "/v2/lbaas/pools",
            json!({"pool": {"loadbalancer_id": lb, "protocol": "TCP", "lb_algorithm": "ROUND_ROBIN"}}),
        )["pool"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let member = post(
            &format!("/v2/lbaas/pools/{lb_pool}/members"),
            json!({"member": {"address": "10.9.0.9", "protocol_port": 80}}),
        )["member"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let project = &port.project_id;
        let reads = [
            format!("/v2.0/networks/{}", net.id),
            format!("/v2.0/subnets/{}", sub.id),
            format!("/v2.0/subnetpools/{}", pool.id),
            format!("/v2.0/ports/{}", port.id),
            "/v2.0/hosts/h1".to_string(),
            format!("/v2/lbaas/loadbalancers/{lb}"),
            format!("/v2/lbaas/listeners/{listener}"),
            format!("/v2/lbaas/pools/{lb_pool}"),
            format!("/v2/lbaas/pools/{lb_pool}/members/{member}"),
            format!("/v2/lbaas/members/{member}"),
            format!("/project/{project}/ports/{}", port.id),
            format!("/project/{project}/subnets/{}", sub.id),
        ];
        let lists = [
            "/v2.0/networks",
            "/v2.0/subnets",
            "/v2.0/subnetpools",
            "/v2.0/ports",
            "/v2.0/ports?device_id=x",
            "/v2.0/hosts",
            "/v2.0/floatingips",
            "/v2/lbaas/loadbalancers",
            "/v2/lbaas/listeners",
            "/v2/lbaas/pools",
            "/v2/lbaas/members",
        ];
        let (_, _, now) = c.request("GET", "/v2.0/networks", None).unwrap();
        let now = now.unwrap();
        let mut paths: Vec<String> = reads.to_vec();
        paths.extend(lists.iter().map(|p| p.to_string()));
        paths.push(format!("/v2/lbaas/pools/{lb_pool}/members"));
        paths.push(format!("/project/{project}/ports"));
        for path in paths {
            let (status, v, revision) = c.request("GET", &path, None).unwrap();
            assert_eq!(status, 200, "{path}: {v}");
            assert_eq!(revision, Some(now), "{path} carries the view's revision");
        }
    });
}

#[test]
fn slaac_and_stateless_subnets_give_ports_their_eui64_address() {
    on_both(|ctl| {
        let c = ctl.client();
        let (net, _) = network_with_subnet(&c, "10.7.0.0/24", json!("10.7.0.1"));
        let subnet = |cidr: &str, extra: Value| {
            let mut body = json!({"network_id": net.id, "cidr": cidr, "ip_version": 6});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            c.create::<Subnet>(body)
        };
        // Neutron's rules: a /64, the same mode twice, IPv6 only, a mode it knows.
        let refused = [
            subnet("fd07:9::/80", json!({"ipv6_address_mode": "slaac"})),
            subnet(
                "fd07:9::/64",
                json!({"ipv6_address_mode": "slaac", "ipv6_ra_mode": "dhcpv6-stateful"}),
            ),
            subnet("fd07:9::/64", json!({"ipv6_address_mode": "stateful"})),
            subnet(
                "fd07:9::/64",
                json!({"ipv6_address_mode": "slaac", "enable_dhcp": false}),
            ),
            c.create::<Subnet>(json!({"network_id": net.id, "cidr": "10.8.0.0/24",
                "ip_version": 4, "ipv6_address_mode": "slaac"})),
        ];
        for r in refused {
            assert_eq!(kind(r).0, 400);
        }
        assert!(
            c.list::<Subnet>(&[]).unwrap().0.len() == 1,
            "nothing was made"
        );

        let slaac = subnet(
            "fd07:1::/64",
            json!({"ipv6_address_mode": "slaac", "ipv6_ra_mode": "slaac"}),
        )
        .unwrap();
        assert_eq!(slaac.ipv6_address_mode, Some(corvid_api::Ipv6Mode::Slaac));
        let stateless = subnet(
            "fd07:2::/64",
            json!({"ipv6_address_mode": "dhcpv6-stateless"}),
        )
        .unwrap();
        let stateful = subnet("fd07:3::/64", json!({})).unwrap();

        // Neutron's default: IPv4 once, the first allocating IPv6 subnet once, and
        // every automatic one, there at the MAC's EUI-64.
        let port: Port = c
            .create(json!({"network_id": net.id, "mac_address": "fa:16:3e:11:22:33"}))
            .unwrap();
        let on = |p: &Port, s: &Subnet| -> Vec<String> {
            p.fixed_ips
                .iter()
                .filter(|f| f.subnet_id == s.id)
                .map(|f| f.ip_address.to_string())
                .collect()
        };
        assert_eq!(port.fixed_ips.len(), 4, "{:?}", port.fixed_ips);
        assert_eq!(on(&port, &slaac), ["fd07:1::f816:3eff:fe11:2233"]);
        assert_eq!(on(&port, &stateless), ["fd07:2::f816:3eff:fe11:2233"]);
        assert_eq!(on(&port, &stateful).len(), 1);

        // Another address on an automatic subnet is refused; its own is fine.
        let other = c.create::<Port>(json!({"network_id": net.id, "fixed_ips": [
            {"subnet_id": slaac.id, "ip_address": "fd07:1::5"}]}));
        assert_eq!(kind(other).0, 400);
        let own: Port = c
            .create(
                json!({"network_id": net.id, "mac_address": "fa:16:3e:00:00:01",
                "fixed_ips": [{"subnet_id": slaac.id, "ip_address": "fd07:1::f816:3eff:fe00:1"}]}),
            )
            .unwrap();
        assert_eq!(on(&own, &slaac), ["fd07:1::f816:3eff:fe00:1"]);

        // A new MAC on an unbound port moves its automatic addresses and frees the old
        // ones; the others stay.
        let moved: Port = c
            .update(&port.id, json!({"mac_address": "fa:16:3e:44:55:66"}))
            .unwrap();
        assert_eq!(on(&moved, &slaac), ["fd07:1::f816:3eff:fe44:5566"]);
        assert_eq!(on(&moved, &stateless), ["fd07:2::f816:3eff:fe44:5566"]);
        assert_eq!(on(&moved, &stateful), on(&port, &stateful));
        let reuse: Port = c
            .create(
                json!({"network_id": net.id, "mac_address": "fa:16:3e:11:22:33",
                "fixed_ips": [{"subnet_id": slaac.id}]}),
            )
            .unwrap();
        assert_eq!(on(&reuse, &slaac), ["fd07:1::f816:3eff:fe11:2233"]);
        for p in [&port, &own, &reuse] {
            c.delete::<Port>(&p.id).unwrap();
        }
    });
}

#[test]
fn a_networks_subnets_share_a_pool_per_ip_version() {
    let (_dir, spec) = redb_store();
    let ctl = ControllerProcess::start(&spec, None);
    let c = ctl.client();
    let pool = |name: &str, prefix: &str, len: u8| -> SubnetPool {
        c.create(json!({"name": name, "prefixes": [prefix], "default_prefixlen": len}))
            .unwrap()
    };
    let (v4a, v4b, v6) = (
        pool("a", "10.90.0.0/16", 24),
        pool("b", "10.91.0.0/16", 24),
        pool("c", "fd90::/48", 64),
    );
    let net: Network = c.create(json!({"name": "duo"})).unwrap();
    let from = |p: &SubnetPool, version: u8| {
        c.create::<Subnet>(json!({"network_id": net.id, "subnetpool_id": p.id,
            "ip_version": version}))
    };
    from(&v4a, 4).unwrap();
    // Dual stack: the IPv6 subnet comes from a pool of its own.
    let s6 = from(&v6, 6).unwrap();
    assert!(s6.cidr.addr().is_ipv6() && s6.cidr.prefix_len() == 64);
    // A second IPv4 pool on the same network is refused, as Neutron refuses it.
    assert_eq!(kind(from(&v4b, 4)), (400, "HTTPBadRequest".into()));
}

/// The controller's threads, from `/proc`.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// Writes waiting on etcd wait for a place, not for a thread each: 200 hosts registering
/// while etcd is stopped leave the controller with a bounded set of threads, and every
/// one of them is registered once etcd goes on.
#[test]
fn writes_waiting_on_etcd_do_not_take_a_thread_each() {
    let etcd = support::EtcdCluster::start(1);
    let ctl = ControllerProcess::start(&etcd.store(), None);
    let before = threads(ctl.pid());
    etcd.freeze(0, true);
    let writers: Vec<_> = (0..200)
        .map(|i| {
            let c = ctl.client();
            std::thread::spawn(move || {
                let ip = std::net::Ipv4Addr::new(192, 0, 2, (i % 250) as u8 + 1);
                c.register_host(&format!("cvt-burst-{i}"), ip.into())
            })
        })
        .collect();
    let t = std::time::Instant::now();
    let mut most = 0;
    while t.elapsed() < Duration::from_secs(2) {
        most = most.max(threads(ctl.pid()));
        std::thread::sleep(Duration::from_millis(20));
    }
    etcd.freeze(0, false);
    for w in writers {
        w.join().unwrap().expect("registered once etcd went on");
    }
    assert!(
        most < before + 80,
        "{most} threads while 200 writes waited on etcd ({before} before)"
    );
    let (hosts, _): (Vec<corvid_api::Host>, _) = ctl.client().list(&[]).unwrap();
    assert_eq!(
        hosts
            .iter()
            .filter(|h| h.id.starts_with("cvt-burst-"))
            .count(),
        200
    );
}

/// Writes that queue while etcd is slow go out together, several to one commit, and each
/// still gets its own outcome: two controllers race for the same ten addresses while etcd
/// is stopped, amid other creates; each address goes to one port, the other create is
/// refused, and no create gets an address another port holds.
#[test]
fn queued_etcd_writes_share_commits_and_keep_their_own_outcomes() {
    let etcd = support::EtcdCluster::start(1);
    let ctls = [
        ControllerProcess::start(&etcd.store(), None),
        ControllerProcess::start(&etcd.store(), None),
    ];
    let c = ctls[0].client();
    let (shared, _) = network_with_subnet(&c, "10.9.0.0/24", json!(null));
    let own = [
        network_with_subnet(&c, "10.10.0.0/24", json!(null)).0,
        network_with_subnet(&c, "10.11.0.0/24", json!(null)).0,
    ];
    // The project's default security group, made by its first port: every create until
    // it exists writes it, and the creates could not share a commit.
    let first: Port = c.create(json!({"network_id": shared.id})).unwrap();
    c.delete::<Port>(&first.id).unwrap();
    // Writes and commits each controller has made so far.
    let commits = |ctl: &ControllerProcess| {
        let text = ureq::get(&format!("{}/metrics", ctl.url))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        let metric = "corvid_controller_store_commit_batch_size";
        (
            sample(&text, &format!("{metric}_sum"), &[]),
            sample(&text, &format!("{metric}_count"), &[]),
        )
    };
    let before: Vec<_> = ctls.iter().map(commits).collect();
    etcd.freeze(0, true);
    let creates: Vec<_> = ctls
        .iter()
        .zip(&own)
        .flat_map(|(ctl, own)| (0..40).map(move |i| (ctl.client(), own.id.clone(), i)))
        .map(|(c, own, i)| {
            let shared = shared.id.clone();
            std::thread::spawn(move || {
                let body = match i {
                    0..10 => json!({"network_id": shared,
                        "fixed_ips": [{"ip_address": format!("10.9.0.{}", 200 + i)}]}),
                    _ => json!({"network_id": own}),
                };
                (i < 10, c.create::<Port>(body))
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    etcd.freeze(0, false);
    let (mut fixed, mut other, mut refused) = (Vec::new(), Vec::new(), Vec::new());
    for t in creates {
        match t.join().unwrap() {
            (true, Ok(p)) => fixed.push(p.fixed_ips[0].ip_address),
            (false, Ok(p)) => other.push((p.network_id, p.fixed_ips[0].ip_address)),
            (_, Err(e)) => refused.push(e),
        }
    }
    assert_eq!(fixed.len(), 10, "{fixed:?}, refused {refused:?}");
    assert_eq!(fixed.iter().collect::<HashSet<_>>().len(), 10);
    assert_eq!(other.len(), 60, "refused {refused:?}");
    assert_eq!(other.iter().collect::<HashSet<_>>().len(), 60);
    assert_eq!(refused.len(), 10, "{refused:?}");
    for e in &refused {
        assert!(
            e.status() == Some(409) && e.to_string().contains("IpAddressAlreadyAllocated"),
            "{e}"
        );
    }
    for (net, n) in [(&shared, 10), (&own[0], 30), (&own[1], 30)] {
        let (ports, _) = c.list::<Port>(&[("network_id", &net.id)]).unwrap();
        assert_eq!(ports.len(), n);
    }
    // What queued behind the commits waiting on etcd went out a few to a commit.
    for (ctl, (writes0, commits0)) in ctls.iter().zip(before) {
        let (writes, commits) = commits(ctl);
        let (writes, commits) = (writes - writes0, commits - commits0);
        assert!(
            writes >= 2.0 * commits,
            "{writes} writes in {commits} commits"
        );
    }
}

/// On an etcd whose `--max-txn-ops` or `--max-request-bytes` is below its default, the
/// queued writes that do not fit one commit there still all commit (sent again one a
/// request), and the controller says it now sends smaller commits.
#[test]
fn queued_writes_fit_an_etcd_with_smaller_limits() {
    for (limit, smaller) in [
        (["--max-txn-ops", "12"], "transactions and operations"),
        (["--max-request-bytes", "16384"], "bytes"),
    ] {
        let etcd = Etcd::start_with(&limit);
        let ctl = ControllerProcess::start(&format!("etcd:{}", etcd.url), None);
        let c = ctl.client();
        let (net, _) = network_with_subnet(&c, "10.12.0.0/24", json!(null));
        // The default security group, which a project's first port makes.
        c.create::<Port>(json!({"network_id": net.id})).unwrap();
        // SAFETY: signals to a child this process started and still holds.
        unsafe { libc::kill(etcd.pid() as i32, libc::SIGSTOP) };
        let creates: Vec<_> = (0..40)
            .map(|_| {
                let (c, net) = (c.clone(), net.id.clone());
                std::thread::spawn(move || c.create::<Port>(json!({"network_id": net})))
            })
            .collect();
        std::thread::sleep(Duration::from_secs(1));
        // SAFETY: as above.
        unsafe { libc::kill(etcd.pid() as i32, libc::SIGCONT) };
        for t in creates {
            t.join().unwrap().expect("a create on the smaller etcd");
        }
        let (ports, _) = c.list::<Port>(&[("network_id", &net.id)]).unwrap();
        assert_eq!(ports.len(), 41, "{limit:?}");
        let log = ctl.log();
        assert!(
            log.contains("commits now carry at most") && log.contains(smaller),
            "{limit:?}: {log}"
        );
    }
}

/// A stored object the controller cannot read (written by hand, or by another version) is
/// left out of the view and said in the log with its key, instead of vanishing silently.
#[test]
fn an_unreadable_stored_port_is_logged_with_its_key() {
    use base64::Engine;
    let etcd = support::EtcdCluster::start(1);
    let url = &etcd.urls()[0];
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    ureq::post(&format!("{url}/v3/kv/put"))
        .send_json(
            json!({"key": b64("/corvid/r/ports/cvt-unreadable"), "value": b64("{\"id\": 7")}),
        )
        .unwrap();
    let ctl = ControllerProcess::start(&etcd.store(), None);
    let (ports, _): (Vec<Port>, _) = ctl.client().list(&[]).unwrap();
    assert!(ports.is_empty(), "{ports:?}");
    let log = ctl.log();
    assert!(
        log.lines()
            .any(|l| l.contains("/corvid/r/ports/cvt-unreadable") && l.contains("does not parse")),
        "{log}"
    );
}
